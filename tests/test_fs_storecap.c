/* SPDX-License-Identifier: MIT */
/*
 * test_fs_storecap.c - -o store_capacity through a real mount: the store's
 * block bytes held at or under the bound by the collector (fs/storecap.c).
 *
 * Each test starts the daemon on a fresh posix store (tests/fsfixture.h),
 * fills the store past the bound (through the mount, or behind the daemon's
 * back as a rank or another host would) and waits for /stats and the store
 * itself to show at most the bound. Hot blocks (read through the mount, so
 * ranked by the usage counts) survive while cold ones go, also across an
 * unmount and a SIGKILL of the daemon; pinned and leased blocks never go;
 * readers that check every byte during it see whole shards or misses. Bad
 * values of the option and its watermarks are refused at start with one
 * line that names them. Two and three daemons on one store collect one at
 * a time, also when standbys race for a stale lease and the old collector
 * comes back late. A run shows its progress in /stats and in the log. The
 * collector's period is cut to 200 ms
 * (SHARDFS_TEST_STORE_PERIOD_MS, the test build's hook), and with it the
 * lease's ttl (three periods).
 */
#include "fsfixture.h"
#include "testutil.h"

#include <shardfs/cache.h>
#include <shardfs/rank.h>

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD (64u << 10)
#define CAP   (32ull * SHARD) /* the bound: 32 one-shard blocks */
/* The daemon: 64 slots of cache, the bound above. */
#define OPTS "hugepages=off,capacity=4M,shard_size=64K,store_capacity=2M"

static struct {
    char store[128];
    struct fsfx fx;
    struct fsfx more[2]; /* a third and second daemon, where a test starts them */
} S;

static void setup(void)
{
    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3");
    snprintf(S.store, sizeof(S.store), "%s", tu_path("store"));
    snprintf(S.fx.mnt, sizeof(S.fx.mnt), "%s", tu_path("mnt"));
    snprintf(S.fx.log, sizeof(S.fx.log), "%s", tu_path("log"));
    snprintf(S.fx.sock, sizeof(S.fx.sock), "%s", tu_path("sock"));
    cr_assert_eq(setenv("SHARDFS_TEST_STORE_PERIOD_MS", "200", 1), 0);
    S.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
    cr_assert_eq(tu_store_write(S.store, 1, 1, 1, SHARD, NULL, NULL, false), 0);
}

static void teardown(void)
{
    for (int i = 0; i < 2; i++) {
        if (S.more[i].pid) {
            kill(S.more[i].pid, SIGCONT);
            fsfx_stop(&S.more[i], true, 10.0);
        }
        if (S.more[i].bin)
            fsfx_cleanup(&S.more[i], NULL);
    }
    if (S.fx.pid) {
        kill(S.fx.pid, SIGCONT);
        fsfx_stop(&S.fx, true, 10.0);
    }
    fsfx_cleanup(&S.fx, S.store);
}

TestSuite(fs_storecap, .init = setup, .fini = teardown, .timeout = 120);

/* The daemon refuses opts at start, with a line of its log holding want. */
static void expect_refused(const char *opts, const char *want)
{
    char o[256];
    int st = 0;

    snprintf(o, sizeof(o), "hugepages=off,capacity=4M,shard_size=64K,%s", opts);
    cr_assert_eq(fsfx_start(&S.fx, S.store, o, 20.0, &st), -ECHILD, "%s: mounted", opts);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "%s: status %#x", opts, st);
    cr_assert_geq(fsfx_log_lines_with(&S.fx, want), 1, "%s: no line with '%s'", opts, want);
}

Test(fs_storecap, bad_values_are_refused_at_start)
{
    expect_refused("store_capacity=lots", "store_capacity=lots: not a size");
    expect_refused("store_capacity=4K", "store_capacity=4K: smaller than one shard");
    expect_refused("store_capacity=-1", "store_capacity=-1: not a size");
    expect_refused("store_high=90", "store_high, store_low: need -o store_capacity");
    expect_refused("store_capacity=1M,store_high=101", "store_high=101: out of range");
    expect_refused("store_capacity=1M,store_high=1", "store_high=1: out of range");
    expect_refused("store_capacity=1M,store_low=0", "store_low=0: out of range");
    expect_refused("store_capacity=1M,store_low=100", "store_low=100: out of range");
    expect_refused("store_capacity=1M,store_high=80,store_low=80",
                   "store_low=80: not below store_high=80");
    /* The default high watermark is 95: a low one above it is refused. */
    expect_refused("store_capacity=1M,store_low=96", "store_low=96: not below store_high=95");
    expect_refused("store_capacity=1M,ro", "a read-only daemon removes nothing");
    /* A store without block files has nothing to bound. */
    {
        int st = 0;

        cr_assert_eq(
            fsfx_start(&S.fx, "mem:", "hugepages=off,capacity=4M,shard_size=64K,store_capacity=1M",
                       20.0, &st),
            -ECHILD);
        cr_assert_geq(fsfx_log_lines_with(&S.fx, "has no block files to bound"), 1);
    }
}

Test(fs_storecap, the_bound_and_its_counters_are_in_stats)
{
    const char *names[] = {"shardfs_store_bytes", "shardfs_store_capacity_bytes",
                           "shardfs_store_evicted_blocks_total",
                           "shardfs_store_evicted_bytes_total"};

    cr_assert_eq(fsfx_start(&S.fx, S.store, "hugepages=off,capacity=4M,shard_size=64K", 20.0, NULL),
                 0);
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        cr_assert_geq(fsfx_stat(&S.fx, names[i]), 0, "%s missing", names[i]);
    cr_assert_eq(fsfx_stat(&S.fx, "shardfs_store_capacity_bytes"), 0, "off by default");
    cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
    cr_assert_eq(fsfx_start(&S.fx, S.store,
                            "hugepages=off,capacity=4M,shard_size=64K,store_capacity=3M", 20.0,
                            NULL),
                 0);
    cr_assert_eq(fsfx_stat(&S.fx, "shardfs_store_capacity_bytes"), 3ll << 20);
    cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
}

/* ---------------------------------------------------------------------------
 * The collector.
 */

static void start(const char *opts)
{
    int st = 0, r = fsfx_start(&S.fx, S.store, opts, 20.0, &st);

    cr_assert_eq(r, 0, "mount with %s: %s (status %#x), see %s", opts, strerror(-r), st, S.fx.log);
}

/* Store block b (one shard, tu_fill's bytes) through the mount. */
static void write_mount(uint64_t b)
{
    struct sfs_key k = tu_key(b, 0);
    static _Thread_local uint8_t buf[SHARD];
    int fd = open(fsfx_shard_path(&S.fx, b, 0), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

    cr_assert_geq(fd, 0, "create block %llu: %s", (unsigned long long)b, strerror(errno));
    tu_fill(&k, buf, SHARD);
    cr_assert_eq(write(fd, buf, SHARD), (ssize_t)SHARD, "write block %llu: %s",
                 (unsigned long long)b, strerror(errno));
    cr_assert_eq(close(fd), 0, "close block %llu: %s", (unsigned long long)b, strerror(errno));
}

/* Read block b's shard through the mount n times (each read counts a use). */
static void read_mount(uint64_t b, int n)
{
    static _Thread_local uint8_t buf[SHARD + 1];
    struct sfs_key k = tu_key(b, 0);

    for (int i = 0; i < n; i++) {
        cr_assert_eq(fsfx_read_all(fsfx_shard_path(&S.fx, b, 0), buf, SHARD + 1), (long)SHARD);
        cr_assert_eq(tu_check(&k, buf, SHARD), -1);
    }
}

static bool in_store(uint64_t b)
{
    char path[256];
    struct stat st;

    tu_store_path(S.store, b, path, sizeof(path));
    return stat(path, &st) == 0;
}

/* The block files' bytes on disk, as the collector counts them; every file
 * left holds its whole block (checked). */
static uint64_t store_bytes(void)
{
    char dir[192];
    struct dirent *de;
    uint64_t sum = 0;
    DIR *d;

    snprintf(dir, sizeof(dir), "%s/data", S.store);
    d = opendir(dir);
    cr_assert_not_null(d);
    while ((de = readdir(d)) != NULL) {
        struct stat st;

        if (strlen(de->d_name) != SFS_BLOCK_HEX_LEN)
            continue;
        if (fstatat(dirfd(d), de->d_name, &st, 0) == 0)
            sum += (uint64_t)st.st_blocks * 512;
    }
    closedir(d);
    return sum;
}

/* Wait up to 30 s for /stats and the store to show at most the bound. */
static void wait_bound(void)
{
    double t0 = fsfx_now_s();
    long long st = -1;
    uint64_t disk = 0;

    while (fsfx_now_s() - t0 < 30.0) {
        st = fsfx_stat(&S.fx, "shardfs_store_bytes");
        disk = store_bytes();
        if (st >= 0 && (uint64_t)st <= CAP && disk <= CAP)
            return;
        fsfx_sleep_ms(50);
    }
    cr_assert_fail("store above its bound 30 s on: stats %lld, disk %llu, bound %llu (see %s)", st,
                   (unsigned long long)disk, (unsigned long long)CAP, S.fx.log);
}

Test(fs_storecap, a_store_filled_through_the_mount_ends_within_its_bound)
{
    start(OPTS);
    for (uint64_t b = 1; b <= 80; b++)
        write_mount(b);
    wait_bound();
    cr_assert_geq(fsfx_stat(&S.fx, "shardfs_store_evicted_blocks_total"), 48 - 2);
    cr_assert_geq(fsfx_stat(&S.fx, "shardfs_store_evicted_bytes_total"), (48 - 2) * SHARD);
    /* Every block file left is whole: a removal takes a whole file. */
    for (uint64_t b = 1; b <= 80; b++) {
        static uint8_t buf[SHARD + 1];
        char path[256];
        long n;

        tu_store_path(S.store, b, path, sizeof(path));
        n = fsfx_read_all(path, buf, sizeof(buf));
        cr_assert(n == -ENOENT || (n == (long)SHARD &&
                                   tu_check(&(struct sfs_key){tu_block(b), 0}, buf, SHARD) == -1),
                  "block %llu: %ld", (unsigned long long)b, n);
    }
    cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
}

Test(fs_storecap, writes_behind_the_daemon_are_bound_at_its_next_pass)
{
    start(OPTS);
    /* A rank's commits, or another host's: the daemon sees none of them. */
    cr_assert_eq(tu_store_write(S.store, 100, 80, 1, SHARD, NULL, NULL, false), 0);
    wait_bound();
    cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
}

/* The log holds exactly one line with s. */
static void log_once(const char *s)
{
    int n = fsfx_log_lines_with(&S.fx, s);

    cr_assert_eq(n, 1, "%d lines with '%s' in %s", n, s, S.fx.log);
}

/* A run shows its progress: a gauge while it runs and the bytes it removed
 * of those it set out to remove, in /stats; a line as it starts, one at
 * each 10 % step, one with its totals. Each removal waits 50 ms (the test
 * build's hook), so a look at /stats finds the run under way. */
Test(fs_storecap, a_run_shows_its_progress_in_stats_and_the_log)
{
    long long run = 0, goal = 0, done = 0;
    char line[96];

    cr_assert_eq(tu_store_write(S.store, 100, 80, 1, SHARD, NULL, NULL, false), 0);
    cr_assert_eq(setenv("SHARDFS_TEST_STORE_REMOVE_MS", "50", 1), 0);
    start(OPTS);
    for (int i = 0; i < 3000; i++) {
        run = fsfx_stat(&S.fx, "shardfs_store_collector_pass_running");
        goal = fsfx_stat(&S.fx, "shardfs_store_collector_to_remove_bytes");
        done = fsfx_stat(&S.fx, "shardfs_store_collector_removed_bytes");
        if (run == 1 && done > 0 && done < goal)
            break;
        fsfx_sleep_ms(10);
    }
    cr_assert(run == 1 && done > 0 && done < goal,
              "no run seen under way: running %lld, %lld of %lld bytes (see %s)", run, done, goal,
              S.fx.log);
    /* 81 blocks of 64 KiB on disk, low = 90 % of 2 MiB. */
    cr_assert_eq(goal, 81 * (long long)SHARD - (long long)(CAP / 100 * 90 + CAP % 100 * 90 / 100));
    wait_bound();
    for (int i = 0; i < 3000 && fsfx_stat(&S.fx, "shardfs_store_collector_pass_running") != 0; i++)
        fsfx_sleep_ms(10);
    cr_assert_eq(fsfx_stat(&S.fx, "shardfs_store_collector_pass_running"), 0,
                 "the run never ended");
    /* One run: its removals are all the collector's. */
    done = fsfx_stat(&S.fx, "shardfs_store_collector_removed_bytes");
    cr_assert_eq(fsfx_stat(&S.fx, "shardfs_store_collector_to_remove_bytes"), goal);
    cr_assert_geq(done, goal);
    cr_assert_eq(done, fsfx_stat(&S.fx, "shardfs_store_evicted_bytes_total"));
    log_once("above store_high");
    /* Each removal is under 10 % of the goal: every step is logged once, in
     * order, the last at 100 %. */
    {
        FILE *f = fopen(S.fx.log, "re");
        char l[512];
        unsigned step = 0, pct;

        cr_assert_not_null(f);
        while (fgets(l, sizeof(l), f)) {
            char *p = strstr(l, "store_capacity: ");

            if (!p || sscanf(p, "store_capacity: %u %% (", &pct) != 1)
                continue;
            cr_assert_eq(pct / 10, step + 1, "a step missed or twice: %s(see %s)", l, S.fx.log);
            step = pct / 10;
        }
        fclose(f);
        cr_assert_eq(step, 10, "the last step logged is %u0 %% (see %s)", step, S.fx.log);
    }
    snprintf(line, sizeof(line), "store_capacity: removed %lld blocks, %lld of %lld bytes",
             fsfx_stat(&S.fx, "shardfs_store_evicted_blocks_total"), done, goal);
    log_once(line);
    cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
}

Test(fs_storecap, a_store_filled_by_a_rank_ends_within_its_bound)
{
    static uint8_t bufs[8][SHARD];
    struct sfs_rank_config cfg;
    struct sfs_rank *rk;
    char spec[256];
    int err = 0;

    start(OPTS);
    sfs_rank_config_init(&cfg);
    snprintf(spec, sizeof(spec), "posix:%s", S.store);
    cfg.mount_point = S.fx.mnt;
    cfg.backend = spec;
    cfg.copier = SFS_COPIER_HOST;
    rk = sfs_rank_open(&cfg, &err);
    cr_assert_not_null(rk, "sfs_rank_open: %s", strerror(-err));
    /* 80 one-shard blocks, 8 a task: the rank commits them itself. */
    for (uint64_t b0 = 300; b0 < 380; b0 += 8) {
        struct sfs_rank_entry e[8];
        struct sfs_task *t;
        int st[8];

        for (int i = 0; i < 8; i++) {
            struct sfs_key k = tu_key(b0 + (uint64_t)i, 0);

            tu_fill(&k, bufs[i], SHARD);
            e[i] = (struct sfs_rank_entry){.block = k.block, .shard = 0, .addr = bufs[i]};
        }
        cr_assert_eq(sfs_rank_dump(rk, e, 8, &t), 0);
        cr_assert_eq(sfs_rank_wait(t, 30000, st), 0);
        sfs_rank_task_free(t);
        for (int i = 0; i < 8; i++)
            cr_assert_eq(st[i], 0, "dump of block %llu: %d", (unsigned long long)b0 + i, st[i]);
    }
    sfs_rank_close(rk);
    wait_bound();
    cr_assert_geq(fsfx_stat(&S.fx, "shardfs_store_evicted_blocks_total"), 80 + 1 - 32);
    cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
}

#define HOT0 1000u /* hot blocks [HOT0, HOT0 + NHOT) */
#define NHOT 8u

/* Hot blocks written first (the oldest), read 4 times each. */
static void make_hot(void)
{
    for (uint64_t b = HOT0; b < HOT0 + NHOT; b++)
        write_mount(b);
    for (uint64_t b = HOT0; b < HOT0 + NHOT; b++)
        read_mount(b, 4);
}

static void check_hot_survived(void)
{
    for (uint64_t b = HOT0; b < HOT0 + NHOT; b++)
        cr_assert(in_store(b), "hot block %llu was removed (see %s)", (unsigned long long)b,
                  S.fx.log);
}

Test(fs_storecap, hot_blocks_survive_cold_ones_go)
{
    start(OPTS);
    make_hot();
    for (uint64_t b = 1; b <= 80; b++)
        write_mount(b);
    wait_bound();
    check_hot_survived();
    cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
}

Test(fs_storecap, pinned_and_leased_blocks_never_go)
{
    struct sfs_key lk = tu_key(2000, 0);
    struct sfs_lease l;
    struct sfs_cache *c;
    int err = 0;

    start(OPTS);
    /* The oldest two, never read: the coldest of all. */
    write_mount(2001);
    cr_assert_eq(setxattr(fsfx_block_dir(&S.fx, 2001), SFS_XATTR_PIN, "3600", 4, 0), 0, "pin: %s",
                 strerror(errno));
    write_mount(2000);
    c = sfs_cache_attach(S.fx.sock, 0, &err);
    cr_assert_not_null(c, "attach: %s", strerror(-err));
    cr_assert_eq(sfs_cache_get(c, &lk, 0, 0, &l), SFS_HIT, "block 2000 not resident");
    /* Every other block read more often than the sampler can count the
     * lease as a use in this test's time (once a second): the two stay
     * the coldest, kept only for their pin and their lease. */
    for (uint64_t b = 1; b <= 80; b++) {
        write_mount(b);
        read_mount(b, 8);
    }
    wait_bound();
    cr_assert(in_store(2001), "the pinned block was removed");
    cr_assert(in_store(2000), "the leased block was removed");
    /* Released: an ordinary block again, ranked by its uses (the sampler
     * counted the lease as use), so nothing here says when it goes. */
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    sfs_cache_close(c);
    cr_assert(in_store(2001), "the pinned block was removed");
    cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
}

/* Readers checking every byte of blocks [1, 64] while the collector removes
 * most of them: each read is a whole shard of the right bytes or a miss.
 * Two read through the mount; two read the block files themselves, as
 * another host's loads do (open, then pread of the whole shard), and
 * count no use, so the blocks they read stay the coldest. */
struct reader {
    pthread_t t;
    _Atomic bool *stop;
    bool direct;
    unsigned whole, misses, bad;
    long bad_n;
};

static long read_direct(uint64_t b, uint8_t *buf)
{
    char path[256];
    long n;
    int fd;

    tu_store_path(S.store, b, path, sizeof(path));
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    n = (long)pread(fd, buf, SHARD + 1, 0);
    if (n < 0)
        n = -errno;
    close(fd);
    return n;
}

static void *reader_main(void *arg)
{
    struct reader *r = arg;
    uint8_t *buf = malloc(SHARD + 1);
    uint64_t b = 1, reads = 0;

    /* At least one lap, however the threads are scheduled. */
    while (buf && (reads++ < 64 || !atomic_load(r->stop))) {
        struct sfs_key k = tu_key(b, 0);
        long n = r->direct ? read_direct(b, buf)
                           : fsfx_read_all(fsfx_shard_path(&S.fx, b, 0), buf, SHARD + 1);

        if (n == (long)SHARD && tu_check(&k, buf, SHARD) == -1)
            r->whole++;
        else if (n == -ENOENT)
            r->misses++;
        else if (r->bad++ == 0)
            r->bad_n = n;
        b = b % 64 + 1;
    }
    free(buf);
    return NULL;
}

Test(fs_storecap, readers_see_whole_shards_or_misses_while_it_removes)
{
    _Atomic bool stop = false;
    struct reader rd[4] = {
        {.stop = &stop, .direct = true},
        {.stop = &stop, .direct = true},
        {.stop = &stop},
        {.stop = &stop},
    };

    cr_assert_eq(tu_store_write(S.store, 1, 64, 1, SHARD, NULL, NULL, false), 0);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&rd[i].t, NULL, reader_main, &rd[i]), 0);
    start(OPTS); /* its first pass removes about half of them */
    for (int i = 2; i < 4; i++)
        cr_assert_eq(pthread_create(&rd[i].t, NULL, reader_main, &rd[i]), 0);
    for (uint64_t b = 100; b < 200; b++)
        write_mount(b);
    wait_bound();
    atomic_store(&stop, true);
    for (int i = 0; i < 4; i++) {
        pthread_join(rd[i].t, NULL);
        cr_assert_eq(rd[i].bad, 0,
                     "%s reader %d: %u reads neither whole nor a miss (the first gave %ld)",
                     rd[i].direct ? "store" : "mount", i, rd[i].bad, rd[i].bad_n);
        cr_assert_gt(rd[i].whole, 0);
    }
    cr_assert_gt(rd[0].misses + rd[1].misses, 0, "the store's readers saw no removal");
    cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
}

/* The ranking across a restart: hot blocks read before it, then more cold
 * blocks than the bound holds written while the daemon is down (newer than
 * the hot ones); the next mount's first pass keeps the hot ones. */
static void restart_keeps_the_ranking(bool kill9)
{
    char usage[192];
    double t0;
    int st;

    snprintf(usage, sizeof(usage), "%s/.shardfs_usage", S.store);
    if (kill9)
        cr_assert_eq(setenv("SHARDFS_TEST_USAGE_SAVE_S", "1", 1), 0);
    start(OPTS);
    make_hot();
    if (kill9) {
        /* The periodic write of the usage file, then no write at stop: wait
         * for a write after every read (one more read makes the table
         * dirty again after `after`). */
        struct timespec after;
        struct stat us;

        clock_gettime(CLOCK_REALTIME, &after);
        fsfx_sleep_ms(20);
        read_mount(HOT0, 1);
        for (t0 = fsfx_now_s(); fsfx_now_s() - t0 < 15.0; fsfx_sleep_ms(50))
            if (stat(usage, &us) == 0 &&
                (us.st_mtim.tv_sec > after.tv_sec ||
                 (us.st_mtim.tv_sec == after.tv_sec && us.st_mtim.tv_nsec > after.tv_nsec)))
                break;
        cr_assert(fsfx_now_s() - t0 < 15.0, "no usage file written 15 s after the reads");
        kill(S.fx.pid, SIGKILL);
        cr_assert_eq(waitpid(S.fx.pid, &st, 0), S.fx.pid);
        S.fx.pid = 0;
        fsfx_sh("fusermount3 -uz %s 2>/dev/null", S.fx.mnt);
    } else {
        cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
    }
    cr_assert_eq(tu_store_write(S.store, 1, 80, 1, SHARD, NULL, NULL, false), 0);
    start(OPTS);
    wait_bound();
    check_hot_survived();
    cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
}

Test(fs_storecap, an_unmount_keeps_the_bound_and_the_ranking)
{
    restart_keeps_the_ranking(false);
}

Test(fs_storecap, a_sigkill_keeps_the_bound_and_the_ranking)
{
    restart_keeps_the_ranking(true);
}

/* ---------------------------------------------------------------------------
 * Two daemons on one store, both with the bound (two hosts on a shared
 * store in miniature; test_shared_store.c has the real thing): one collects
 * at a time, and the other takes over when the first is killed.
 */

static struct fsfx second(void)
{
    struct fsfx f;

    memset(&f, 0, sizeof(f));
    f.bin = S.fx.bin;
    snprintf(f.mnt, sizeof(f.mnt), "%s", tu_path("mnt2"));
    snprintf(f.sock, sizeof(f.sock), "%s", tu_path("sock2"));
    snprintf(f.log, sizeof(f.log), "%s", tu_path("log2"));
    return f;
}

/* Wait up to 30 s for exactly one of a, b to say it collects: 0 (a) or 1 (b). */
static int the_collector(struct fsfx *a, struct fsfx *b)
{
    double t0 = fsfx_now_s();
    long long x = -1, y = -1;

    while (fsfx_now_s() - t0 < 30.0) {
        x = a ? fsfx_stat(a, "shardfs_store_collector") : 0;
        y = b ? fsfx_stat(b, "shardfs_store_collector") : 0;
        if (x + y == 1)
            return x == 1 ? 0 : 1;
        fsfx_sleep_ms(50);
    }
    cr_assert_fail("collectors: %lld and %lld 30 s on", x, y);
    return -1;
}

Test(fs_storecap, two_daemons_on_one_store_collect_one_at_a_time)
{
    struct fsfx b = second();
    struct fsfx *d[2] = {&S.fx, &b};
    int st, who, r;

    start(OPTS);
    r = fsfx_start(&b, S.store, OPTS, 20.0, &st);
    cr_assert_eq(r, 0, "second mount: %s (status %#x), see %s", strerror(-r), st, b.log);
    who = the_collector(&S.fx, &b);
    for (uint64_t n = 1; n <= 80; n++)
        write_mount(n);
    wait_bound();
    cr_assert_eq(fsfx_stat(d[1 - who], "shardfs_store_evicted_blocks_total"), 0,
                 "the standby removed blocks");
    cr_assert_eq(fsfx_stat(d[1 - who], "shardfs_store_collector"), 0, "two collectors");
    /* The collector killed: the other takes over within the lease's ttl. */
    kill(d[who]->pid, SIGKILL);
    cr_assert_eq(waitpid(d[who]->pid, &st, 0), d[who]->pid);
    d[who]->pid = 0;
    fsfx_sh("fusermount3 -uz %s 2>/dev/null", d[who]->mnt);
    cr_assert_eq(the_collector(who == 0 ? NULL : &S.fx, who == 1 ? NULL : &b), 1 - who);
    cr_assert_eq(tu_store_write(S.store, 500, 40, 1, SHARD, NULL, NULL, false), 0);
    {
        double t0 = fsfx_now_s();

        while (store_bytes() > CAP && fsfx_now_s() - t0 < 30.0)
            fsfx_sleep_ms(50);
    }
    cr_assert_leq(store_bytes(), CAP, "the survivor did not keep the bound");
    cr_assert_gt(fsfx_stat(d[1 - who], "shardfs_store_evicted_blocks_total"), 0);
    if (b.pid)
        cr_assert_eq(fsfx_stop(&b, false, 10.0), 0);
    fsfx_cleanup(&b, NULL);
}

/* ---------------------------------------------------------------------------
 * Three daemons on one store: the collector stopped (SIGSTOP, not killed)
 * mid-pass past the lease's ttl, so that both standbys find the lease stale
 * at once (the test build's SHARDFS_TEST_LEASE_BREAK_MS holds each between
 * finding it stale and breaking it); then the old collector continued while
 * the new one still collects. Each removal appends the remover's pid to one
 * file (SHARDFS_TEST_STORE_REMOVALS; SHARDFS_TEST_STORE_REMOVE_MS makes a
 * pass last): from the stop on, one daemon alone removes, and the old
 * collector nothing.
 */

static struct fsfx nth(int i)
{
    struct fsfx f;

    memset(&f, 0, sizeof(f));
    f.bin = S.fx.bin;
    snprintf(f.mnt, sizeof(f.mnt), "%s", tu_path(i == 1 ? "mnt2" : "mnt3"));
    snprintf(f.sock, sizeof(f.sock), "%s", tu_path(i == 1 ? "sock2" : "sock3"));
    snprintf(f.log, sizeof(f.log), "%s", tu_path(i == 1 ? "log2" : "log3"));
    return f;
}

/* The pids of the removals file, in its order, from line `from` on. */
static int removals(const char *path, int from, int *pids, int max)
{
    FILE *f = fopen(path, "r");
    int n = 0, line = 0, pid;

    if (!f)
        return 0;
    while (fscanf(f, "%d", &pid) == 1)
        if (line++ >= from && n < max)
            pids[n++] = pid;
    fclose(f);
    return n;
}

Test(fs_storecap, a_stale_lease_goes_to_one_standby_and_its_old_holder_stops)
{
    struct fsfx *f[3] = {&S.fx, &S.more[0], &S.more[1]};
    static int pids[4096];
    char log[128], brk[128];
    int st, who = -1, n, at_stop, r;
    double t0;

    snprintf(log, sizeof(log), "%s", tu_path("removals"));
    snprintf(brk, sizeof(brk), "%s", tu_path("breaks"));
    cr_assert_eq(setenv("SHARDFS_TEST_STORE_REMOVALS", log, 1), 0);
    cr_assert_eq(setenv("SHARDFS_TEST_LEASE_LOG", brk, 1), 0);
    cr_assert_eq(setenv("SHARDFS_TEST_STORE_REMOVE_MS", "20", 1), 0);
    cr_assert_eq(setenv("SHARDFS_TEST_LEASE_BREAK_MS", "1500", 1), 0);
    S.more[0] = nth(1);
    S.more[1] = nth(2);
    for (int i = 0; i < 3; i++) {
        r = fsfx_start(f[i], S.store, OPTS, 20.0, &st);
        cr_assert_eq(r, 0, "mount %d: %s (status %#x), see %s", i, strerror(-r), st, f[i]->log);
    }
    /* The collector: the one that removes the first of 100 blocks over. */
    cr_assert_eq(tu_store_write(S.store, 1000, 132, 1, SHARD, NULL, NULL, false), 0);
    for (t0 = fsfx_now_s(); who < 0 && fsfx_now_s() - t0 < 30.0; fsfx_sleep_ms(10))
        if (removals(log, 0, pids, 4) >= 4)
            for (int i = 0; i < 3; i++)
                if (f[i]->pid == pids[3])
                    who = i;
    cr_assert_geq(who, 0, "nobody collects (see %s)", f[0]->log);
    cr_assert_eq(kill(f[who]->pid, SIGSTOP), 0);
    cr_assert_eq(waitpid(f[who]->pid, &st, WUNTRACED), f[who]->pid);
    cr_assert(WIFSTOPPED(st));
    at_stop = removals(log, 0, pids, 4096);
    /* More above the bound, for the new collector's whole pass. */
    cr_assert_eq(tu_store_write(S.store, 2000, 100, 1, SHARD, NULL, NULL, false), 0);
    /* Past the ttl (3 periods of 200 ms) and the standbys' break: a new
     * collector removes; then the old one continues, mid-pass. */
    for (t0 = fsfx_now_s(); removals(log, at_stop, pids, 1) == 0 && fsfx_now_s() - t0 < 30.0;)
        fsfx_sleep_ms(10);
    cr_assert_gt(removals(log, at_stop, pids, 1), 0, "no standby took over");
    cr_assert_eq(kill(f[who]->pid, SIGCONT), 0);
    for (t0 = fsfx_now_s(); store_bytes() > CAP && fsfx_now_s() - t0 < 60.0;)
        fsfx_sleep_ms(50);
    cr_assert_leq(store_bytes(), CAP, "the store was not brought within its bound");
    fsfx_sleep_ms(1000);
    n = removals(log, at_stop, pids, 4096);
    {
        /* The old holder may finish the one removal it had checked its
         * lease for when it was stopped (a lease cannot fence a paused
         * process; docs/eviction.md): at most that one, and nothing after
         * it looked again. Every other removal is the one new collector's. */
        int old = 0, next = -1;

        for (int i = 0; i < n; i++) {
            if (pids[i] == f[who]->pid) {
                old++;
                continue;
            }
            if (next < 0)
                next = pids[i];
            cr_assert_eq(pids[i], next, "two new collectors: %d and %d (removal %d after the stop)",
                         next, pids[i], i);
        }
        cr_assert_leq(old, 1, "the old collector removed %d blocks after its stop", old);
    }
    cr_assert_eq(fsfx_stat(f[who], "shardfs_store_collector"), 0,
                 "the old collector still says it collects");
    /* The race was run: one standby broke the lease, the other found it
     * taken (held 1.5 s between its look and its break, within which the
     * other's look, every 200 ms, found it stale too). */
    {
        FILE *lf = fopen(brk, "r");
        char what[16];
        int pid, broke = 0, late = 0;

        cr_assert_not_null(lf, "no takeover logged in %s", brk);
        while (fscanf(lf, "%15s %d", what, &pid) == 2) {
            cr_assert_neq(pid, f[who]->pid);
            broke += strcmp(what, "broke") == 0;
            late += strcmp(what, "late") == 0 && pid != f[who]->pid;
        }
        fclose(lf);
        cr_assert_eq(broke, 1, "standbys that broke the lease: %d", broke);
        cr_assert_geq(late, 1, "the standbys did not race for the lease");
    }
    for (int i = 0; i < 3; i++) {
        r = fsfx_stop(f[i], false, 10.0);
        if (r != 0)
            fsfx_sh("echo '--- daemon %d (pid was %d) log:' >&2; tail -40 %s >&2", i, f[i]->pid, f[i]->log);
        cr_assert_eq(r, 0, "daemon %d's unmount: %d (-1: not within 10 s; see %s)", i, r, f[i]->log);
    }
}
