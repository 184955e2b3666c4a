/* SPDX-License-Identifier: MIT */
/*
 * test_fs_holes.c - what a removed block leaves for a later partial write,
 * through a real mount: a shard in a hole of its block file is a miss.
 *
 * A block file has one place per shard. When the block is removed (an
 * unlink through the mount, or the collector of -o store_capacity) and one
 * shard of it is written again alone (through the mount, or by a rank's
 * dump of the shards it lacks), the shards before it lie in a hole of the
 * new file. The mount (stat, read, the shard directory's listing) and a
 * rank (lookup, load) answer a miss for them, never zeros; the shard
 * written, zeros or not, reads back. The collector's race with a rank is
 * made deterministic by its order: the rank looks the block up, the
 * collector removes it (waited for), then the rank dumps the shard it
 * lacked. The collector also sweeps, at its start, the .tmp and .brk
 * files that takers of its lease killed mid-step left at the store's root.
 */
#include "fsfixture.h"
#include "testutil.h"

#include <shardfs/rank.h>

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD (64u << 10)
#define OPTS  "hugepages=off,capacity=4M,shard_size=64K"

static struct {
    char store[128];
    struct fsfx fx;
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
    cr_assert_eq(mkdir(S.store, 0755), 0);
}

static void teardown(void)
{
    if (S.fx.pid)
        fsfx_stop(&S.fx, true, 10.0);
    fsfx_cleanup(&S.fx, S.store);
}

TestSuite(fs_holes, .init = setup, .fini = teardown, .timeout = 120);

static void start(const char *opts)
{
    int st = 0, r = fsfx_start(&S.fx, S.store, opts, 20.0, &st);

    cr_assert_eq(r, 0, "mount with %s: %s (status %#x), see %s", opts, strerror(-r), st, S.fx.log);
}

/* Write shard n of block b through the mount: tu_fill's bytes, or zeros. */
static void write_mount(uint64_t b, uint32_t n, bool zeros)
{
    static uint8_t buf[SHARD];
    struct sfs_key k = tu_key(b, n);
    int fd = open(fsfx_shard_path(&S.fx, b, n), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

    cr_assert_geq(fd, 0, "create %llu/%u: %s", (unsigned long long)b, n, strerror(errno));
    if (zeros)
        memset(buf, 0, SHARD);
    else
        tu_fill(&k, buf, SHARD);
    cr_assert_eq(write(fd, buf, SHARD), (ssize_t)SHARD);
    cr_assert_eq(close(fd), 0, "close %llu/%u: %s", (unsigned long long)b, n, strerror(errno));
}

/* Shard n of block b through the mount: absent (stat and read say
 * ENOENT), or its whole bytes (tu_fill's, or zeros). */
static void expect_mount(uint64_t b, uint32_t n, int want)
{
    static uint8_t buf[SHARD + 1];
    struct sfs_key k = tu_key(b, n);
    const char *path = fsfx_shard_path(&S.fx, b, n);
    struct stat st;
    long r;

    if (want == -ENOENT) {
        cr_assert_eq(stat(path, &st), -1, "shard %u in a hole: stat found it", n);
        cr_assert_eq(errno, ENOENT);
        cr_assert_eq(fsfx_read_all(path, buf, sizeof(buf)), -ENOENT, "shard %u read", n);
        return;
    }
    cr_assert_eq(stat(path, &st), 0, "shard %u: %s", n, strerror(errno));
    r = fsfx_read_all(path, buf, sizeof(buf));
    cr_assert_eq(r, (long)SHARD, "shard %u: %ld", n, r);
    if (want == 0) {
        for (size_t i = 0; i < SHARD; i++)
            cr_assert_eq(buf[i], 0, "shard %u: byte %zu", n, i);
    } else {
        cr_assert_eq(tu_check(&k, buf, SHARD), -1, "shard %u: wrong bytes", n);
    }
}

/* The names the shard directory of block b lists, as a bit set. */
static unsigned listed(uint64_t b)
{
    DIR *d = opendir(fsfx_shard_path(&S.fx, b, -1));
    struct dirent *de;
    unsigned set = 0;

    cr_assert_not_null(d, "opendir: %s", strerror(errno));
    while ((de = readdir(d)) != NULL)
        if (de->d_name[0] != '.')
            set |= 1u << atoi(de->d_name);
    closedir(d);
    return set;
}

Test(fs_holes, a_shard_written_after_an_unlink_leaves_misses_not_zeros)
{
    /* Shards 0..3 of block 1 in the store (behind the daemon's back: the
     * kernel has looked none of them up). */
    cr_assert_eq(tu_store_write(S.store, 1, 1, 4, SHARD, NULL, NULL, false), 0);
    start(OPTS);
    cr_assert_eq(unlink(fsfx_shard_path(&S.fx, 1, 0)), 0, "unlink: %s", strerror(errno));
    write_mount(1, 2, false);
    expect_mount(1, 0, -ENOENT);
    expect_mount(1, 1, -ENOENT);
    expect_mount(1, 2, 1);
    expect_mount(1, 3, -ENOENT);
    cr_assert_eq(listed(1), 1u << 2, "listed %#x", listed(1));
    /* The directory with a shard left is not empty. */
    cr_assert_eq(rmdir(fsfx_shard_path(&S.fx, 1, -1)), -1);
    cr_assert_eq(errno, ENOTEMPTY);
    /* A shard written as zeros alone is data. */
    write_mount(2, 3, true);
    expect_mount(2, 3, 0);
    expect_mount(2, 1, -ENOENT);
    cr_assert_eq(listed(2), 1u << 3, "listed %#x", listed(2));
    cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
}

Test(fs_holes, a_ranks_partial_dump_after_the_collector_removed_the_block)
{
    static uint8_t buf[SHARD];
    struct sfs_block_id id = tu_block(7);
    struct sfs_key k2 = tu_key(7, 2);
    struct sfs_rank_config cfg;
    struct sfs_rank_entry e;
    struct sfs_rank *rk;
    struct sfs_task *t;
    bool present[1];
    char spec[256];
    double t0;
    int err = 0, st[1];

    /* Block 7, three shards (192 KiB): over a bound of 128 KiB. */
    cr_assert_eq(tu_store_write(S.store, 7, 1, 3, SHARD, NULL, NULL, false), 0);
    start(OPTS ",store_capacity=128K");
    sfs_rank_config_init(&cfg);
    snprintf(spec, sizeof(spec), "posix:%s", S.store);
    cfg.mount_point = S.fx.mnt;
    cfg.backend = spec;
    cfg.copier = SFS_COPIER_HOST;
    rk = sfs_rank_open(&cfg, &err);
    cr_assert_not_null(rk, "sfs_rank_open: %s", strerror(-err));
    /* The rank's view: shards 0 and 1 are stored, 2 is its to dump. The
     * collector removes the block now (waited for, so the race goes this
     * way every run). */
    cr_assert_eq(sfs_rank_lookup(rk, &id, 1, 0, present), 0);
    t0 = fsfx_now_s();
    while (access(fsfx_block_file(S.store, 7), F_OK) == 0 && fsfx_now_s() - t0 < 30.0)
        fsfx_sleep_ms(50);
    cr_assert_neq(access(fsfx_block_file(S.store, 7), F_OK), 0, "the collector kept block 7");
    tu_fill(&k2, buf, SHARD);
    e = (struct sfs_rank_entry){.block = id, .shard = 2, .addr = buf};
    cr_assert_eq(sfs_rank_dump(rk, &e, 1, &t), 0);
    cr_assert_eq(sfs_rank_wait(t, 30000, st), 0);
    sfs_rank_task_free(t);
    cr_assert_eq(st[0], 0, "dump: %d", st[0]);
    /* Shards 0 and 1 lie in a hole of the new file: misses everywhere. */
    for (uint32_t n = 0; n < 2; n++) {
        cr_assert_eq(sfs_rank_lookup(rk, &id, 1, n, present), 0);
        cr_assert(!present[0], "the rank's lookup found shard %u in a hole", n);
        memset(buf, 0x5a, SHARD);
        e = (struct sfs_rank_entry){.block = id, .shard = n, .addr = buf};
        cr_assert_eq(sfs_rank_load(rk, &e, 1, &t), 0);
        cr_assert_eq(sfs_rank_wait(t, 30000, st), 0);
        sfs_rank_task_free(t);
        cr_assert_eq(st[0], -ENOENT, "the rank's load of shard %u in a hole: %d", n, st[0]);
        expect_mount(7, n, -ENOENT);
    }
    cr_assert_eq(sfs_rank_lookup(rk, &id, 1, 2, present), 0);
    cr_assert(present[0]);
    expect_mount(7, 2, 1);
    sfs_rank_close(rk);
    cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
}

/* A name at the store's root. */
static const char *at_root(const char *name)
{
    static char path[256];

    snprintf(path, sizeof(path), "%s/%s", S.store, name);
    return path;
}

Test(fs_holes, the_collector_sweeps_its_leases_leftovers_at_start)
{
    static const char *const left[] = {
        ".shardfs_lease.collector.deadhost.4242.00000000deadbeef.tmp",
        ".shardfs_lease.collector.deadhost.4243.00000000deadbeef.brk",
    };
    const char *keep = ".shardfs_lease.collector.notatoken.brk";
    double t0;

    for (size_t i = 0; i < 2; i++)
        close(open(at_root(left[i]), O_WRONLY | O_CREAT, 0644));
    close(open(at_root(keep), O_WRONLY | O_CREAT, 0644));
    /* Past the lease's ttl (three 200 ms periods) by the time it starts:
     * their ctimes age, they cannot be set back. */
    fsfx_sleep_ms(1000);
    start(OPTS ",store_capacity=1M");
    t0 = fsfx_now_s();
    while ((access(at_root(left[0]), F_OK) == 0 || access(at_root(left[1]), F_OK) == 0) &&
           fsfx_now_s() - t0 < 30.0)
        fsfx_sleep_ms(50);
    cr_assert_neq(access(at_root(left[0]), F_OK), 0, "a killed taker's .tmp stayed");
    cr_assert_neq(access(at_root(left[1]), F_OK), 0, "a killed taker's .brk stayed");
    cr_assert_eq(access(at_root(keep), F_OK), 0, "a file not named by a token went");
    cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
}
