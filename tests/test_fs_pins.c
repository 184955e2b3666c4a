/* SPDX-License-Identifier: MIT */
/*
 * test_fs_pins.c - pins and eviction domains through the FUSE view
 * (design.md, section 10): `setfattr -n user.shardfs.pin -v SECONDS MOUNT/block/<id>` pins a
 * block (0 unpins), `getfattr -n user.shardfs.state` of its shards reads
 * `ready,pinned`, /stats counts shardfs_pinned_bytes; a pinned block
 * survives a flood of reads, its pin expires by itself, a pin over
 * -o pin_budget is refused with EDQUOT; with -o partitions=2 a flood of one
 * domain's shards never evicts the other's, and /stats counts
 * shardfs_partition_evictions_total by domain.
 *
 * Real mounts (tests/fsfixture.h) on a posix store. Capacity 2M of 64K
 * shards: 32 slots, no reserved pool; pin budget 25 %: 8 slots.
 * Skips without FUSE.
 */
#include "fsfixture.h"
#include "testutil.h"

#include <shardfs/cache.h>

#include <criterion/criterion.h>
#include <errno.h>
#include <grp.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD   (64u << 10)
#define NSH     4  /* shards per block */
#define NBLOCKS 40 /* 160 shards: five times the cache */

static struct fsfx M;
static char store[128];

static void start(const char *opts)
{
    char o[256];
    int st = 0, r;

    snprintf(o, sizeof(o), "hugepages=off,capacity=2M,shard_size=64K,readahead=0,warm=0%s%s",
             opts ? "," : "", opts ? opts : "");
    r = fsfx_start(&M, store, o, 10.0, &st);
    cr_assert_eq(r, 0, "daemon did not mount (%s, status %d), see %s", strerror(-r), st, M.log);
}

static void read_shard(uint64_t b, uint32_t s)
{
    static uint8_t buf[SHARD];
    struct sfs_key k = tu_key(b, s);
    long n = fsfx_read_all(fsfx_shard_path(&M, b, s), buf, sizeof(buf));

    cr_assert_eq(n, (long)SHARD, "read (%llu,%u): %ld", (unsigned long long)b, s, n);
    cr_assert_eq(tu_check(&k, buf, SHARD), -1, "wrong bytes in (%llu,%u)", (unsigned long long)b,
                 s);
}

static void read_block(uint64_t b)
{
    for (uint32_t s = 0; s < NSH; s++)
        read_shard(b, s);
}

/* user.shardfs.state of shard (b, s), by getfattr(1). */
static const char *state(uint64_t b, uint32_t s)
{
    static char v[64];
    char cmd[512];
    FILE *p;

    snprintf(cmd, sizeof(cmd), "getfattr --only-values -n user.shardfs.state %s 2>/dev/null",
             fsfx_shard_path(&M, b, s));
    p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(v, 1, sizeof(v) - 1, p);
    pclose(p);
    v[n] = '\0';
    return v;
}

/* setfattr(1) -n user.shardfs.pin -v secs on block b: its exit status. */
static int pin(uint64_t b, const char *secs)
{
    return fsfx_sh("setfattr -n user.shardfs.pin -v %s %s 2>/dev/null", secs,
                   fsfx_block_dir(&M, b));
}

static void flood(uint64_t first, uint64_t last, uint32_t shard_mod, uint32_t shard_rem)
{
    for (uint64_t b = first; b < last; b++)
        for (uint32_t s = 0; s < NSH; s++)
            if (s % shard_mod == shard_rem)
                read_shard(b, s);
}

static void setup(void)
{
    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    memset(&M, 0, sizeof(M));
    M.bin = fsfx_daemon_bin(SHARDFS_BIN);
    snprintf(store, sizeof(store), "%s", tu_path("store"));
    snprintf(M.mnt, sizeof(M.mnt), "%s", tu_path("mnt"));
    snprintf(M.sock, sizeof(M.sock), "%s", tu_path("sock"));
    snprintf(M.log, sizeof(M.log), "%s", tu_path("log"));
    mkdir(store, 0755);
    cr_assert_eq(tu_store_write(store, 0, NBLOCKS, NSH, SHARD, NULL, NULL, false), 0);
}

static void teardown(void)
{
    if (M.pid > 0)
        fsfx_stop(&M, true, 10.0);
    fsfx_cleanup(&M, store);
}

TestSuite(fs_pins, .init = setup, .fini = teardown, .timeout = 120);

Test(fs_pins, pinned_block_survives_a_flood_and_unpins)
{
    start(NULL);
    read_block(0);
    cr_assert_str_eq(state(0, 0), "ready");
    cr_assert_eq(pin(0, "600"), 0, "setfattr user.shardfs.pin failed");
    for (uint32_t s = 0; s < NSH; s++)
        cr_assert_str_eq(state(0, s), "ready,pinned");
    cr_assert_eq(fsfx_stat(&M, "shardfs_pinned_bytes"), (long long)NSH * SHARD);
    flood(1, NBLOCKS, 1, 0);
    for (uint32_t s = 0; s < NSH; s++)
        cr_assert_str_eq(state(0, s), "ready,pinned", "pinned shard %u after the flood", s);
    cr_assert_eq(pin(0, "0"), 0);
    cr_assert_str_eq(state(0, 0), "ready");
    cr_assert_eq(fsfx_stat(&M, "shardfs_pinned_bytes"), 0);
    flood(1, NBLOCKS, 1, 0);
    cr_assert_str_eq(state(0, 0), "absent", "unpinned block survived a flood");
    /* Bad values are EINVAL. */
    cr_assert_neq(pin(0, "soon"), 0);
    cr_assert_eq(setxattr(fsfx_block_dir(&M, 0), SFS_XATTR_PIN, "-1", 2, 0), -1);
    cr_assert_eq(errno, EINVAL);
}

Test(fs_pins, a_pin_expires_by_itself)
{
    start(NULL);
    read_block(3);
    cr_assert_eq(pin(3, "1"), 0);
    cr_assert_str_eq(state(3, 0), "ready,pinned");
    fsfx_sleep_ms(1600);
    cr_assert_str_eq(state(3, 0), "ready");
    cr_assert_eq(fsfx_stat(&M, "shardfs_pinned_bytes"), 0);
    flood(4, NBLOCKS, 1, 0);
    cr_assert_str_eq(state(3, 0), "absent");
}

Test(fs_pins, over_budget_is_edquot)
{
    start("pin_budget=25"); /* 8 slots: two blocks */
    read_block(0);
    read_block(1);
    read_block(2);
    cr_assert_eq(pin(0, "600"), 0);
    cr_assert_eq(pin(1, "600"), 0);
    cr_assert_eq(setxattr(fsfx_block_dir(&M, 2), SFS_XATTR_PIN, "600", 3, 0), -1);
    cr_assert_eq(errno, EDQUOT, "over budget: %s", strerror(errno));
    cr_assert_str_eq(state(2, 0), "ready");
    cr_assert_eq(fsfx_stat(&M, "shardfs_pinned_bytes"), 8ll * SHARD);
    flood(3, NBLOCKS, 1, 0);
    cr_assert_str_eq(state(0, 3), "ready,pinned");
    cr_assert_str_eq(state(1, 3), "ready,pinned");
    /* Unpinning one makes room. */
    cr_assert_eq(pin(1, "0"), 0);
    read_block(2);
    cr_assert_eq(pin(2, "600"), 0);
}

Test(fs_pins, pins_off)
{
    start("pin_budget=0");
    read_block(0);
    cr_assert_eq(setxattr(fsfx_block_dir(&M, 0), SFS_XATTR_PIN, "60", 2, 0), -1);
    cr_assert_eq(errno, EPERM);
}

Test(fs_pins, partitions_isolate_domains)
{
    start("partitions=2");
    /* Domain 1 (odd shards): 16 slots, 8 blocks' shards 1 and 3. */
    flood(0, 8, 2, 1);
    /* Domain 0 (even shards) floods: 64 shards over its 16 slots. */
    flood(8, NBLOCKS, 2, 0);
    for (uint64_t b = 0; b < 8; b++) {
        cr_assert_str_eq(state(b, 1), "ready", "domain 1's (%llu,1) evicted",
                         (unsigned long long)b);
        cr_assert_str_eq(state(b, 3), "ready");
    }
    cr_assert_gt(fsfx_stat(&M, "shardfs_partition_evictions_total{partition=\"0\"}"), 0);
    cr_assert_eq(fsfx_stat(&M, "shardfs_partition_evictions_total{partition=\"1\"}"), 0);
}

Test(fs_pins, bad_partitions_refused)
{
    int st = 0;

    cr_assert_eq(
        fsfx_start(&M, store, "hugepages=off,capacity=2M,shard_size=64K,partitions=65", 10.0, &st),
        -ECHILD);
    cr_assert_eq(fsfx_log_lines_with(&M, "partitions=65: out of range"), 1);
}

/* -o partition_budget=3:1: of the 32 slots, domain 0 (even shards) owns 24
 * and domain 1 (odd) 8. Flooded, each holds exactly its budget, and the
 * even flood evicts no odd shard. */
static int count_ready(uint64_t first, uint64_t last, uint32_t shard_mod, uint32_t shard_rem)
{
    int n = 0;

    for (uint64_t b = first; b < last; b++)
        for (uint32_t s = 0; s < NSH; s++)
            if (s % shard_mod == shard_rem)
                n += strcmp(state(b, s), "ready") == 0;
    return n;
}

Test(fs_pins, partition_budget_holds_at_the_given_sizes)
{
    start("partitions=2,partition_budget=3:1");
    flood(0, 8, 2, 1);       /* 16 odd shards over domain 1's 8 slots */
    flood(8, NBLOCKS, 2, 0); /* 64 even shards over domain 0's 24 */
    cr_assert_eq(count_ready(0, 8, 2, 1), 8, "domain 1 (budget 1 of 4) is not at 8");
    cr_assert_eq(count_ready(8, NBLOCKS, 2, 0), 24, "domain 0 (budget 3 of 4) is not at 24");
    cr_assert_eq(fsfx_stat(&M, "shardfs_partition_evictions_total{partition=\"0\"}"), 64 - 24);
    cr_assert_eq(fsfx_stat(&M, "shardfs_partition_evictions_total{partition=\"1\"}"), 16 - 8);
}

/* The weights alone set P (three domains of 16, 8 and 8 slots). */
Test(fs_pins, partition_budget_sets_the_domains)
{
    start("partition_budget=2:1:1");
    flood(0, 4, 4, 1);       /* domain 1: shard 1 of 4 blocks */
    flood(4, NBLOCKS, 4, 0); /* domain 0: 36 shards 0 over its 16 slots */
    cr_assert_eq(count_ready(0, 4, 4, 1), 4);
    cr_assert_eq(count_ready(4, NBLOCKS, 4, 0), 16);
    cr_assert_eq(fsfx_stat(&M, "shardfs_partition_evictions_total{partition=\"2\"}"), 0);
}

Test(fs_pins, bad_partition_budgets_refused)
{
    static const char *const bad[][2] = {
        {"partition_budget=3:0", "partition_budget=3:0: weight '0' out of range"},
        {"partition_budget=3:x", "partition_budget=3:x: weight 'x' out of range"},
        {"partition_budget=3::1", "partition_budget=3::1: not a list of weights"},
        {"partitions=3,partition_budget=1:1", "partition_budget=1:1: 2 weights for partitions=3"},
        {"partition_budget=4", "partition_budget=4: one weight"},
        {"partition_budget=31:1", "partition_budget=31:1: domain 1's share (1/32 of 32 slots)"},
    };
    char o[256];
    int st = 0;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(o, sizeof(o), "hugepages=off,capacity=2M,shard_size=64K,%s", bad[i][0]);
        cr_assert_eq(fsfx_start(&M, store, o, 10.0, &st), -ECHILD, "%s was accepted", bad[i][0]);
        cr_assert_eq(fsfx_log_lines_with(&M, bad[i][1]), 1, "%s: no line '%s'", bad[i][0],
                     bad[i][1]);
    }
}

Test(fs_pins, warm_restart_pins_what_it_warms)
{
    char usage[192];
    struct stat st;

    /* A skewed workload: blocks 0 and 1 (8 shards: a quarter of the
     * cache) read ten times, blocks 10..19 once. */
    start(NULL);
    for (int i = 0; i < 10; i++) {
        read_block(0);
        read_block(1);
    }
    flood(10, 20, 1, 0);
    cr_assert_geq(fsfx_stop(&M, true, 10.0), 0);
    snprintf(usage, sizeof(usage), "%s/.shardfs_usage", store);
    cr_assert_eq(stat(usage, &st), 0, "no usage file after the unmount");
    /* Warm a quarter (the two hot blocks) and pin them. */
    start("warm=25,warm_pin=600");
    double t0 = fsfx_now_s();
    bool all = false;
    while (!all && fsfx_now_s() - t0 < 15.0) {
        all = true;
        for (uint64_t b = 0; b < 2 && all; b++)
            for (uint32_t s = 0; s < NSH && all; s++)
                all = strcmp(state(b, s), "ready,pinned") == 0;
        if (!all)
            fsfx_sleep_ms(50);
    }
    cr_assert(all, "the warmed hot blocks are not ready,pinned within 15 s");
    cr_assert_eq(fsfx_stat(&M, "shardfs_pinned_bytes"), 8ll * SHARD);
    flood(20, NBLOCKS, 1, 0);
    cr_assert_str_eq(state(0, 0), "ready,pinned");
    cr_assert_str_eq(state(1, 3), "ready,pinned");
}

/* A pin as another, unprivileged user: the child becomes uid (and gid) and
 * sets user.shardfs.pin on block b; its exit status is the errno (0: set). */
struct as_user {
    uid_t uid;
    uint64_t b;
    const char *secs;
};

static int pin_as_body(void *arg)
{
    const struct as_user *a = arg;

    if (setgroups(0, NULL) < 0 || setgid(a->uid) < 0 || setuid(a->uid) < 0)
        return 100;
    if (setxattr(fsfx_block_dir(&M, a->b), SFS_XATTR_PIN, a->secs, strlen(a->secs), 0) == 0)
        return 0;
    return errno;
}

static int pin_as(uid_t uid, uint64_t b, const char *secs)
{
    struct as_user a = {uid, b, secs};

    return tu_wait_for(tu_fork(pin_as_body, &a), 30ll * 1000000000);
}

/* Pins belong to the user who made them: another user can neither remove
 * nor change one (root can); one user holds at most pin_user_share of the
 * budget, so root's pin still has room; no pin is longer than pin_max.
 * Real users through the mount (allow_other, a store others may write). */
Test(fs_pins, pins_have_owners_shares_and_a_maximum)
{
    cr_assert_eq(chmod(store, 0777), 0);
    /* 32 slots, pin budget 16, a user's share 25 %: 4 slots, one block. */
    start("allow_other,pin_budget=50,pin_user_share=25,pin_max=3600");
    for (uint64_t b = 0; b < 4; b++)
        read_block(b);
    cr_assert_eq(pin_as(65534, 0, "600"), 0, "nobody's pin");
    cr_assert_str_eq(state(0, 0), "ready,pinned");
    cr_assert_eq(pin_as(65534, 1, "600"), EDQUOT, "nobody past their share");
    cr_assert_eq(pin_as(65534, 1, "7200"), EINVAL, "a pin past pin_max");
    /* Another user: not nobody's pin to remove or change. */
    cr_assert_eq(pin_as(65533, 0, "0"), EPERM);
    cr_assert_eq(pin_as(65533, 0, "1"), EPERM);
    cr_assert_str_eq(state(0, 0), "ready,pinned");
    cr_assert_eq(pin_as(65533, 1, "600"), 0, "a share of their own");
    /* Root has no share, and may remove anyone's pin. */
    cr_assert_eq(pin(2, "600"), 0);
    cr_assert_eq(pin(3, "600"), 0);
    cr_assert_eq(pin(0, "0"), 0);
    cr_assert_str_eq(state(0, 0), "ready");
    cr_assert_eq(fsfx_stat(&M, "shardfs_pinned_bytes"), 12ll * SHARD);
}

Test(fs_pins, bad_pin_max_and_share_refused)
{
    const char *bad[] = {"pin_max=0", "pin_max=99999999999", "pin_user_share=0",
                         "pin_user_share=101", "pin_user_share=x"};

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char o[256];
        int st = 0;

        snprintf(o, sizeof(o), "hugepages=off,capacity=2M,shard_size=64K,%s", bad[i]);
        cr_assert_eq(fsfx_start(&M, store, o, 10.0, &st), -ECHILD, "%s was accepted", bad[i]);
        snprintf(o, sizeof(o), "%s: out of range", bad[i]);
        cr_assert_eq(fsfx_log_lines_with(&M, o), 1, "no line '%s'", o);
    }
}
