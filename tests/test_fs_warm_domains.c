/* SPDX-License-Identifier: MIT */
/*
 * test_fs_warm_domains.c - warm restart with eviction domains
 * (-o partitions): the warm budget is each domain's share, so the warm-up
 * never loads more into a domain than it holds and never evicts a block it
 * warmed.
 *
 * Key idea: blocks of one shard each all fall in domain 0 (a key's domain
 * is its shard index mod P). With partitions=4 and warm=50, a budget of half
 * the whole cache is twice domain 0: the colder blocks, warmed after the hot
 * ones, evicted them (a prewarmed slot gets no second chance). A real
 * mount learns a skewed workload, stops with SIGTERM (the usage file), and
 * mounts again with the domains; once every warm load has landed
 * (prefetched_total reaches warmed_total) all hot keys must be resident and
 * the warm-up must have evicted nothing. Capacity 8M of 64K shards: 128
 * slots, 126 regular, 31 or 32 a domain. Skips without FUSE.
 */
#include "fsfixture.h"
#include "fswarm.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <errno.h>
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

#define SHARD    (64u << 10)
#define NHOT     8   /* blocks 0..7, one shard each: read HOTREADS times */
#define COLD0    100 /* blocks COLD0..COLD0+NCOLD-1, one shard each: read once */
#define NCOLD    60
#define HOTREADS 10

static struct {
    char store[128];
    struct fsfx fx;
} M;

static void start(const char *opts)
{
    char o[256];
    int st = 0, r;

    snprintf(o, sizeof(o), "hugepages=off,capacity=8M,shard_size=64K,%s", opts);
    r = fsfx_start(&M.fx, M.store, o, 10.0, &st);
    cr_assert_eq(r, 0, "daemon did not mount (%s, status %d), see %s", strerror(-r), st, M.fx.log);
}

static void stop_term(void)
{
    int r = fswarm_stop_term(&M.fx, 10.0);

    cr_assert_eq(r, 0, "daemon status %d, see %s", r, M.fx.log);
}

static void read_ok(uint64_t b)
{
    uint8_t *buf = malloc(SHARD);
    struct sfs_key k = tu_key(b, 0);
    int fd = open(fsfx_shard_path(&M.fx, b, 0), O_RDONLY | O_CLOEXEC);
    ssize_t n;

    cr_assert_not_null(buf);
    cr_assert_geq(fd, 0, "open %s: %s", fsfx_shard_path(&M.fx, b, 0), strerror(errno));
    n = pread(fd, buf, SHARD, 0);
    close(fd);
    cr_assert_eq(n, (ssize_t)SHARD);
    cr_assert_eq(tu_check(&k, buf, SHARD), -1, "wrong bytes in block %llu", (unsigned long long)b);
    free(buf);
}

static bool is_ready(uint64_t b)
{
    char v[64];
    ssize_t n = getxattr(fsfx_shard_path(&M.fx, b, 0), "user.shardfs.state", v, sizeof(v) - 1);

    if (n < 0)
        return false;
    v[n] = '\0';
    return strncmp(v, "ready", 5) == 0;
}

static void setup(void)
{
    const char *e = getenv("SHARDFS_TEST_DAEMON");

    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    memset(&M, 0, sizeof(M));
    M.fx.bin = e && *e ? e : SHARDFS_BIN;
    snprintf(M.store, sizeof(M.store), "%s", tu_path("store"));
    snprintf(M.fx.mnt, sizeof(M.fx.mnt), "%s", tu_path("mnt"));
    snprintf(M.fx.sock, sizeof(M.fx.sock), "%s", tu_path("sock"));
    snprintf(M.fx.log, sizeof(M.fx.log), "%s", tu_path("log"));
    mkdir(M.store, 0755);
    mkdir(M.fx.mnt, 0755);
    cr_assert_eq(tu_store_write(M.store, 0, NHOT, 1, SHARD, NULL, NULL, false), 0);
    cr_assert_eq(tu_store_write(M.store, COLD0, NCOLD, 1, SHARD, NULL, NULL, false), 0);
}

static void teardown(void)
{
    fswarm_teardown(&M.fx, M.store);
}

TestSuite(fs_warm_domains, .init = setup, .fini = teardown, .timeout = 120);

Test(fs_warm_domains, the_warm_up_never_evicts_a_block_it_warmed, .timeout = 90)
{
    double t0;
    int hot = 0;

    start("warm=0");
    for (int r = 0; r < HOTREADS; r++)
        for (uint64_t b = 0; b < NHOT; b++)
            read_ok(b);
    for (uint64_t b = COLD0; b < COLD0 + NCOLD; b++)
        read_ok(b);
    stop_term();

    start("partitions=4,warm=50");
    /* The warm thread has started every load it will (its log line), and
     * each has landed. */
    t0 = fsfx_now_s();
    while (fsfx_log_lines_with(&M.fx, "warm restart:") == 0 ||
           fsfx_stat(&M.fx, "shardfs_prefetched_total") <
               fsfx_stat(&M.fx, "shardfs_warmed_total")) {
        cr_assert_lt(fsfx_now_s() - t0, 30.0, "the warm-up did not end within 30 s, see %s",
                     M.fx.log);
        fsfx_sleep_ms(20);
    }
    cr_assert_geq(fsfx_stat(&M.fx, "shardfs_warmed_total"), NHOT);
    for (uint64_t b = 0; b < NHOT; b++)
        hot += is_ready(b);
    cr_expect_eq(hot, NHOT, "%d of %d hot keys resident after the warm-up", hot, NHOT);
    cr_expect_eq(fsfx_stat(&M.fx, "shardfs_evictions_total"), 0,
                 "the warm-up evicted blocks it warmed");
    /* Half of domain 0's 31 or 32 slots, not half the cache. */
    cr_expect_leq(fsfx_stat(&M.fx, "shardfs_warmed_total"), 16);
    stop_term();
}
