/* SPDX-License-Identifier: MIT */
/*
 * test_fs_metrics.c - the operator's metrics in /stats: where each read was
 * served from (memory, peer, store, miss), in all and by requester class,
 * and the latency histograms in Prometheus form.
 *
 * A read from the store, the same read again (memory), a read of a shard
 * the store lacks (a miss), each through the mount: every tier moves by
 * exactly one, under the mount's class. Two readers of one slow load: the
 * owner counts the store, the parked reader memory, and the wait histogram
 * one wait. A rank that names its class ("vllm") is counted under it. The
 * histograms are cumulative with +Inf equal to _count. The warm restart's
 * progress reaches done = total with a log line at each 10 % step. The
 * Grafana dashboard in packaging/grafana queries only metrics /stats has.
 *
 * Real mounts (tests/fsfixture.h) on a posix store, readahead off so that
 * only the reads load. Skips without FUSE.
 */
#include "fsfixture.h"
#include "fswarm.h"
#include "testutil.h"

#include <shardfs/cache.h>
#include <shardfs/rank.h>

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD (64u << 10)
#define NSH   2

static struct {
    char store[128];
    struct fsfx fx;
} M;

static void start(const char *backend)
{
    int st = 0, r;

    r = fsfx_start(&M.fx, backend, "hugepages=off,capacity=4M,shard_size=64K,readahead=0", 10.0,
                   &st);
    cr_assert_eq(r, 0, "daemon did not mount (%s, status %d), see %s", strerror(-r), st, M.fx.log);
}

static long long served(const char *tier)
{
    char name[96];

    snprintf(name, sizeof(name), "shardfs_served_total{tier=\"%s\"}", tier);
    return fsfx_stat(&M.fx, name);
}

static long long class_served(const char *cls, const char *tier)
{
    char name[128];

    snprintf(name, sizeof(name), "shardfs_class_served_total{class=\"%s\",tier=\"%s\"}", cls, tier);
    return fsfx_stat(&M.fx, name);
}

/* Read shard (b, s) through the mount: 0 with the right bytes, or -errno. */
static int read_shard(uint64_t b, uint32_t s)
{
    uint8_t *buf = malloc(SHARD);
    struct sfs_key k = tu_key(b, s);
    long n;

    cr_assert_not_null(buf);
    n = fsfx_read_all(fsfx_shard_path(&M.fx, b, s), buf, SHARD);
    if (n == (long)SHARD)
        cr_assert_eq(tu_check(&k, buf, SHARD), -1, "wrong bytes in (%llu,%u)",
                     (unsigned long long)b, s);
    free(buf);
    return n < 0 ? (int)n : n == (long)SHARD ? 0 : -EIO;
}

/* Histogram `name`: its buckets never decrease, +Inf is _count; returns
 * _count. */
static long long hist_count(const char *name)
{
    char path[256], line[512], inf[160];
    long long prev = 0, last = -1;
    FILE *f;

    snprintf(path, sizeof(path), "%s/stats", M.fx.mnt);
    snprintf(inf, sizeof(inf), "%s_bucket{le=\"+Inf\"} ", name);
    f = fopen(path, "re");
    cr_assert_not_null(f);
    while (fgets(line, sizeof(line), f)) {
        size_t nl = strlen(name);

        if (strncmp(line, name, nl) != 0 || strncmp(line + nl, "_bucket{le=\"", 12) != 0)
            continue;
        long long v = atoll(strrchr(line, ' ') + 1);

        cr_assert_geq(v, prev, "%s: buckets not cumulative at %s", name, line);
        prev = v;
        if (strncmp(line, inf, strlen(inf)) == 0)
            last = v;
    }
    fclose(f);
    snprintf(path, sizeof(path), "%s_count", name);
    cr_assert_eq(fsfx_stat(&M.fx, path), last, "%s: +Inf bucket is not _count", name);
    snprintf(path, sizeof(path), "# TYPE %s histogram", name);
    cr_assert_eq(fsfx_sh("grep -qx '%s' %s/stats", path, M.fx.mnt), 0, "%s: no # TYPE", name);
    return last;
}

static void setup(void)
{
    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    memset(&M, 0, sizeof(M));
    {
        const char *e = getenv("SHARDFS_TEST_DAEMON");

        M.fx.bin = e && *e ? e : SHARDFS_BIN;
    }
    snprintf(M.store, sizeof(M.store), "%s", tu_path("store"));
    snprintf(M.fx.mnt, sizeof(M.fx.mnt), "%s", tu_path("mnt"));
    snprintf(M.fx.sock, sizeof(M.fx.sock), "%s", tu_path("sock"));
    snprintf(M.fx.log, sizeof(M.fx.log), "%s", tu_path("log"));
    mkdir(M.store, 0755);
    mkdir(M.fx.mnt, 0755);
    cr_assert_eq(tu_store_write(M.store, 0, 4, NSH, SHARD, NULL, NULL, false), 0);
}

static void teardown(void)
{
    fswarm_teardown(&M.fx, M.store);
}

TestSuite(fs_metrics, .init = setup, .fini = teardown, .timeout = 120);

Test(fs_metrics, each_tier_counts_the_reads_served_from_it)
{
    start(M.store);
    cr_assert_eq(served("memory"), 0);
    cr_assert_eq(served("store"), 0);
    cr_assert_eq(served("miss"), 0);
    cr_assert_eq(served("peer"), 0);

    cr_assert_eq(read_shard(1, 0), 0); /* from the store */
    cr_assert_eq(served("store"), 1);
    cr_assert_eq(served("memory"), 0);
    cr_assert_eq(served("miss"), 0);

    cr_assert_eq(read_shard(1, 0), 0); /* now resident: memory */
    cr_assert_eq(served("memory"), 1);
    cr_assert_eq(served("store"), 1);

    cr_assert_eq(read_shard(9, 0), -ENOENT); /* no such block in the store: a miss */
    cr_assert_eq(served("miss"), 1);
    cr_assert_eq(served("store"), 1);
    cr_assert_eq(served("memory"), 1);
    cr_assert_eq(served("peer"), 0, "no peer tier configured");

    /* The hot set's hottest block is the one read twice. */
    {
        char hex[SFS_BLOCK_HEX_LEN + 1], name[128];

        tu_block_hex(1, hex);
        snprintf(name, sizeof(name), "shardfs_hot_block_uses{block=\"%s\"}", hex);
        cr_assert_geq(fsfx_stat(&M.fx, name), 2, "%s", name); /* the sampler may add */
        cr_assert_eq(fsfx_sh("grep -c '^shardfs_hot_block_uses{' %s/stats | grep -qx 1", M.fx.mnt),
                     0, "one block was read");
    }
    /* The mount's class holds them all. */
    cr_assert_eq(class_served("mount", "store"), 1);
    cr_assert_eq(class_served("mount", "memory"), 1);
    cr_assert_eq(class_served("mount", "miss"), 1);
    /* One load went to the store: the miss was the lookup's (the store
     * has no such name), no load. */
    cr_assert_eq(hist_count("shardfs_load_duration_seconds"), 1);
    cr_assert_eq(hist_count("shardfs_wait_duration_seconds"), 0);
    cr_assert_eq(fswarm_stop_term(&M.fx, 10.0), 0);
}

static bool is_loading(uint64_t b, uint32_t s)
{
    char v[64];
    ssize_t n = getxattr(fsfx_shard_path(&M.fx, b, s), SFS_XATTR_STATE, v, sizeof(v) - 1);

    if (n < 0)
        return false;
    v[n] = '\0';
    return strncmp(v, "loading", 7) == 0;
}

Test(fs_metrics, a_reader_waiting_on_anothers_load_is_served_from_memory)
{
    char spec[256];
    pid_t owner, waiter;

    /* Every load takes 3 s: the second reader finds the slot Loading. */
    snprintf(spec, sizeof(spec), "fault:latency_us=3000000,seed=1:%s", M.store);
    start(spec);
    owner = fork();
    cr_assert_geq(owner, 0);
    if (owner == 0)
        _exit(read_shard(2, 1) == 0 ? 0 : 1);
    while (!is_loading(2, 1))
        fsfx_sleep_ms(5);
    waiter = fork();
    cr_assert_geq(waiter, 0);
    if (waiter == 0)
        _exit(read_shard(2, 1) == 0 ? 0 : 1);
    cr_assert_eq(tu_wait(owner), 0);
    cr_assert_eq(tu_wait(waiter), 0);
    cr_assert_eq(served("store"), 1);
    cr_assert_eq(served("memory"), 1, "the waiter was served from memory");
    cr_assert_eq(hist_count("shardfs_wait_duration_seconds"), 1);
    cr_assert_eq(hist_count("shardfs_load_duration_seconds"), 1);
    /* The injected latency is a lower bound of the load's time. */
    double sum = 0;
    {
        FILE *f;
        char path[256], line[256];

        snprintf(path, sizeof(path), "%s/stats", M.fx.mnt);
        f = fopen(path, "re");
        cr_assert_not_null(f);
        while (fgets(line, sizeof(line), f))
            if (strncmp(line, "shardfs_load_duration_seconds_sum ", 34) == 0)
                sum = strtod(line + 34, NULL);
        fclose(f);
    }
    cr_assert_geq(sum, 3.0, "load sum %.3f s below the injected 3 s", sum);
    cr_assert_eq(fswarm_stop_term(&M.fx, 10.0), 0);
}

Test(fs_metrics, a_rank_is_counted_under_the_class_it_names)
{
    struct sfs_rank_config cfg;
    struct sfs_rank_entry e[1];
    struct sfs_task *t;
    struct sfs_rank *rk;
    uint8_t *buf = malloc(SHARD);
    char spec[200];
    int st[1], err = 0;

    cr_assert_not_null(buf);
    start(M.store);
    sfs_rank_config_init(&cfg);
    snprintf(spec, sizeof(spec), "posix:%s", M.store);
    cfg.mount_point = M.fx.mnt;
    cfg.backend = spec;
    cfg.copier = SFS_COPIER_HOST;
    rk = sfs_rank_open(&cfg, &err);
    cr_assert_not_null(rk, "sfs_rank_open: %s", strerror(-err));
    cr_assert_eq(sfs_rank_set_class(rk, "bad name"), -EINVAL);
    cr_assert_eq(sfs_rank_set_class(rk, "0123456789abcdef"), -EINVAL, "16 chars: too long");
    cr_assert_eq(sfs_rank_set_class(rk, "vllm"), 0);
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_attached_processes{class=\"vllm\"}"), 1);
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_attached_processes{class=\"mount\"}"), 1);
    for (int round = 0; round < 2; round++) {
        e[0] = (struct sfs_rank_entry){.block = tu_block(3), .shard = 0, .addr = buf};
        cr_assert_eq(sfs_rank_load(rk, e, 1, &t), 0);
        cr_assert_eq(sfs_rank_wait(t, 20000, st), 0);
        sfs_rank_task_free(t);
        cr_assert_eq(st[0], 0);
    }
    e[0] = (struct sfs_rank_entry){.block = tu_block(12), .shard = 0, .addr = buf};
    cr_assert_eq(sfs_rank_load(rk, e, 1, &t), 0);
    sfs_rank_wait(t, 20000, st);
    sfs_rank_task_free(t);
    cr_assert_eq(st[0], -ENOENT);
    cr_assert_eq(class_served("vllm", "store"), 1);
    cr_assert_eq(class_served("vllm", "memory"), 1);
    cr_assert_eq(class_served("vllm", "miss"), 1);
    cr_assert_eq(class_served("mount", "store"), 0, "the mount read nothing");
    sfs_rank_close(rk);
    /* Its counts outlive its detach (folded into the header's classes). */
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_attached_processes{class=\"vllm\"}"), 0);
    cr_assert_eq(class_served("vllm", "store"), 1);
    cr_assert_eq(served("store"), 1);
    cr_assert_eq(served("memory"), 1);
    cr_assert_eq(served("miss"), 1);
    free(buf);
    cr_assert_eq(fswarm_stop_term(&M.fx, 10.0), 0);
}

/* Warm restart's progress: the daemon learns 4 hot blocks of 2 shards,
 * stops (the usage file), and mounts with a budget of exactly those 8
 * shards (13 % of 64 slots): /stats counts the warm-up to done = total = 8,
 * and the log has one line at each 10 % step it crossed, up to 100 %. */
Test(fs_metrics, warm_up_progress_is_in_stats_and_logged_by_tens)
{
    int st = 0, r;

    start(M.store);
    for (int round = 0; round < 5; round++)
        for (uint64_t b = 0; b < 4; b++)
            for (uint32_t s = 0; s < NSH; s++)
                cr_assert_eq(read_shard(b, s), 0);
    cr_assert_eq(fswarm_stop_term(&M.fx, 10.0), 0);
    r = fsfx_start(&M.fx, M.store, "hugepages=off,capacity=4M,shard_size=64K,readahead=0,warm=13",
                   10.0, &st);
    cr_assert_eq(r, 0, "daemon did not mount (%s, status %d), see %s", strerror(-r), st, M.fx.log);
    for (int i = 0; i < 1500 && fsfx_log_lines_with(&M.fx, "warm restart: 100 %") == 0; i++)
        fsfx_sleep_ms(10);
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_warm_shards_done"), 4 * NSH);
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_warm_shards_total"), 4 * NSH);
    /* 8 shards, 12.5 % each: the steps 10, 20, 30, 50, 60, 70, 80, 100. */
    cr_assert_eq(fsfx_log_lines_with(&M.fx, " shards started)"), 8, "see %s", M.fx.log);
    cr_assert_eq(fsfx_log_lines_with(&M.fx, "warm restart: 100 % (8 of 8 shards started)"), 1,
                 "see %s", M.fx.log);
    cr_assert_eq(fsfx_log_lines_with(&M.fx, "warm restart: 50 % (4 of 8 shards started)"), 1,
                 "see %s", M.fx.log);
    cr_assert_eq(fswarm_stop_term(&M.fx, 10.0), 0);
}

/* packaging/grafana/shardfs.json queries only metrics a daemon shows: every
 * shardfs_ name in it has a sample line in a fresh mount's /stats. */
Test(fs_metrics, every_metric_the_grafana_dashboard_queries_is_in_stats)
{
    static char json[64 << 10], stats[64 << 10];
    char path[512];
    long nj, ns;
    int checked = 0;

    snprintf(path, sizeof(path), "%s/packaging/grafana/shardfs.json", SHARDFS_SOURCE_DIR);
    nj = fsfx_read_all(path, json, sizeof(json) - 1);
    cr_assert_gt(nj, 0, "%s: %s", path, strerror((int)-nj));
    json[nj] = '\0';
    start(M.store);
    snprintf(path, sizeof(path), "%s/stats", M.fx.mnt);
    ns = fsfx_read_all(path, stats + 1, sizeof(stats) - 2);
    cr_assert_gt(ns, 0);
    stats[0] = '\n'; /* every sample line starts after a newline */
    stats[ns + 1] = '\0';
    for (const char *p = strstr(json, "shardfs_"); p; p = strstr(p, "shardfs_")) {
        char name[96], line[100];
        size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789_");

        cr_assert_lt(n, sizeof(name));
        memcpy(name, p, n);
        name[n] = '\0';
        p += n;
        snprintf(line, sizeof(line), "\n%s ", name);
        bool plain = strstr(stats, line) != NULL;
        snprintf(line, sizeof(line), "\n%s{", name);
        cr_assert(plain || strstr(stats, line), "the dashboard queries %s, not in /stats", name);
        checked++;
    }
    cr_assert_gt(checked, 10, "the dashboard names %d metrics", checked);
    cr_assert_eq(fswarm_stop_term(&M.fx, 10.0), 0);
}
