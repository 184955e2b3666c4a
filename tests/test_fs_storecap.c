/* SPDX-License-Identifier: MIT */
/*
 * test_fs_storecap.c - -o store_capacity through a real mount: the store's
 * block bytes held at or under the bound by the collector (fs/storecap.c).
 *
 * Each test starts the daemon on a fresh posix store (tests/fsfixture.h)
 * and reads the bound back from /stats. Bad values of the option and its
 * watermarks are refused at start with one line that names them.
 */
#include "fsfixture.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD (64u << 10)

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
    S.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
    cr_assert_eq(tu_store_write(S.store, 1, 1, 1, SHARD, NULL, NULL, false), 0);
}

static void teardown(void)
{
    if (S.fx.pid)
        fsfx_stop(&S.fx, true, 10.0);
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
