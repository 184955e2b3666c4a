/* SPDX-License-Identifier: MIT */
/*
 * test_fs_revalidate.c - -o revalidate against a store another writer
 * rewrites behind the daemon's back: a block file replaced, grown, shrunk
 * or removed in the store directory stops being served from the cache, a
 * shard a reader holds stays until it lets go, a file old enough is
 * trusted without a reload, and the page-cache mode's pinned shards are
 * dropped with it (fs/revalidate.c, docs/shared-store.md).
 *
 * The other host is played by this process writing the posix store's
 * directory directly (tu_store_write), which is what a second host's commit
 * looks like to this one's stat. Each test waits on the daemon's counters
 * (MNT/stats: sweeps, invalidated blocks, removed shards), never on time,
 * except to age a file past the sweep's trust margin before the daemon
 * starts. Needs /dev/fuse and fusermount3; skips without.
 */
#include "fsfixture.h"
#include "testutil.h"

#include <shardfs/cache.h>

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD (64u << 10)
#define BLOCK 7u
/* The sweep trusts a block first seen whose file is this much older than
 * the sweep before (revalidate.c's REVAL_MARGIN_NS), plus slack. */
#define TRUST_AGE_MS 2300

static struct {
    char store[128];
    struct fsfx fx;
} R;

static void start(const char *opts)
{
    char o[512];
    int st = 0, r;

    snprintf(R.fx.mnt, sizeof(R.fx.mnt), "%s", tu_path("mnt"));
    snprintf(R.fx.sock, sizeof(R.fx.sock), "%s", tu_path("sock"));
    snprintf(R.fx.log, sizeof(R.fx.log), "%s", tu_path("log"));
    R.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
    snprintf(o, sizeof(o), "hugepages=off,capacity=4M,shard_size=64K,readahead=0,revalidate=50%s%s",
             opts ? "," : "", opts ? opts : "");
    r = fsfx_start(&R.fx, R.store, o, 10.0, &st);
    if (r == -ECHILD)
        cr_assert_fail("daemon exited before mounting (status %d), see %s", st, R.fx.log);
    cr_assert_eq(r, 0, "mount did not appear: %s", strerror(-r));
}

static void setup(void)
{
    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    memset(&R, 0, sizeof(R));
    snprintf(R.store, sizeof(R.store), "%s", tu_path("store"));
    mkdir(R.store, 0755);
}

static void teardown(void)
{
    if (R.fx.pid > 0)
        fsfx_stop(&R.fx, true, 10.0);
    fsfx_cleanup(&R.fx, R.store);
}

TestSuite(fs_revalidate, .init = setup, .fini = teardown, .timeout = 60);

/* The second version of a shard: tu_fill's bytes, inverted. */
static void fill_v2(uint64_t block, uint32_t shard, void *buf, size_t len, void *arg)
{
    struct sfs_key k = tu_key(block, shard);
    uint8_t *p = buf;

    (void)arg;
    tu_fill(&k, buf, len);
    for (size_t i = 0; i < len; i++)
        p[i] ^= 0xff;
}

/* The other host's commit: block b of nshards shards, version 1 or 2. */
static void store_write(uint64_t b, unsigned nshards, int version)
{
    int r =
        tu_store_write(R.store, b, 1, nshards, SHARD, version == 2 ? fill_v2 : NULL, NULL, true);

    cr_assert_eq(r, 0, "store block %llu: %s", (unsigned long long)b, strerror(-r));
}

/* Shard (b, s) read through the mount holds version `version`. */
static void assert_version(uint64_t b, uint32_t s, int version, const char *when)
{
    static uint8_t buf[SHARD], want[SHARD];
    long n = fsfx_read_all(fsfx_shard_path(&R.fx, b, s), buf, SHARD);

    cr_assert_eq(n, (long)SHARD, "%s: read shard %u: %ld", when, s, n);
    if (version == 2)
        fill_v2(b, s, want, SHARD, NULL);
    else {
        struct sfs_key k = tu_key(b, s);

        tu_fill(&k, want, SHARD);
    }
    cr_assert_eq(memcmp(buf, want, SHARD), 0, "%s: shard %u is not version %d", when, s, version);
}

static long long stat_of(const char *name)
{
    return fsfx_stat(&R.fx, name);
}

/* Wait (at most 20 s: the sweeps run every 50 ms) until counter `name` is
 * at least `want`; its value. */
static long long wait_stat(const char *name, long long want)
{
    long long v = stat_of(name);

    for (int i = 0; i < 2000 && v < want; i++) {
        fsfx_sleep_ms(10);
        v = stat_of(name);
    }
    cr_assert_geq(v, want, "%s stayed at %lld, below %lld", name, v, want);
    return v;
}

/* Wait for n more sweeps than now, each begun and ended after this call. */
static void wait_sweeps(int n)
{
    wait_stat("shardfs_revalidate_sweeps_total",
              stat_of("shardfs_revalidate_sweeps_total") + n + 1);
}

/* A file older than the margin, first seen by a sweep, is trusted as it is:
 * nothing removed, nothing reloaded, sweep after sweep; once another writer
 * replaces it (and grows it), the next sweep drops every resident shard and
 * the reads see the new version, the new shard included. */
Test(fs_revalidate, an_old_file_is_trusted_and_a_replaced_one_reloaded)
{
    store_write(BLOCK, 2, 1);
    fsfx_sleep_ms(TRUST_AGE_MS); /* older than the margin when the daemon starts */
    start(NULL);
    assert_version(BLOCK, 0, 1, "first read");
    assert_version(BLOCK, 1, 1, "first read");
    wait_sweeps(3);
    cr_assert_eq(stat_of("shardfs_revalidate_invalidated_total"), 0, "an old file is trusted");
    cr_assert_eq(stat_of("shardfs_revalidate_removed_total"), 0);
    cr_assert_eq(stat_of("shardfs_backend_loads_total"), 2);
    assert_version(BLOCK, 0, 1, "a hit");
    cr_assert_eq(stat_of("shardfs_backend_loads_total"), 2, "served from the cache");

    store_write(BLOCK, 3, 2); /* the other host's commit, one shard more */
    wait_stat("shardfs_revalidate_invalidated_total", 1);
    cr_assert_eq(stat_of("shardfs_revalidate_removed_total"), 2, "both resident shards removed");
    assert_version(BLOCK, 0, 2, "after the commit");
    assert_version(BLOCK, 1, 2, "after the commit");
    assert_version(BLOCK, 2, 2, "after the commit");
    cr_assert_eq(stat_of("shardfs_backend_loads_total"), 5, "each shard loaded again");
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}

/* A file first seen younger than the margin is not trusted: its shards are
 * removed once (a spurious reload at worst), and the reload serves the same
 * bytes. */
Test(fs_revalidate, a_young_file_is_reloaded_once)
{
    store_write(BLOCK, 1, 1);
    start(NULL);
    wait_sweeps(1); /* of an empty cache: nothing to judge */
    cr_assert_eq(stat_of("shardfs_revalidate_invalidated_total"), 0);
    assert_version(BLOCK, 0, 1, "first read");
    wait_stat("shardfs_revalidate_removed_total", 1);
    assert_version(BLOCK, 0, 1, "after the reload");
    cr_assert_geq(stat_of("shardfs_backend_loads_total"), 2);
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}

/* A block file the other host removed, or shrank: every shard the old file
 * had is dropped (the ones it no longer has too), and a read of a removed
 * block's shard no longer answers the old bytes. */
Test(fs_revalidate, a_removed_or_shrunk_file_is_dropped)
{
    store_write(BLOCK, 3, 1);
    store_write(BLOCK + 1, 3, 1);
    fsfx_sleep_ms(TRUST_AGE_MS);
    start(NULL);
    /* Only shard 0 resident: the old file's size says how many to drop. */
    assert_version(BLOCK, 0, 1, "first read");
    assert_version(BLOCK + 1, 0, 1, "first read");
    assert_version(BLOCK + 1, 2, 1, "first read");
    wait_sweeps(2);
    cr_assert_eq(stat_of("shardfs_revalidate_invalidated_total"), 0);

    cr_assert_eq(unlink(fsfx_block_file(R.store, BLOCK)), 0);
    store_write(BLOCK + 1, 1, 2); /* shrunk to one shard */
    wait_stat("shardfs_revalidate_invalidated_total", 2);
    cr_assert_eq(stat_of("shardfs_revalidate_removed_total"), 3, "the 3 resident shards");
    assert_version(BLOCK + 1, 0, 2, "after the shrink");
    {
        static uint8_t buf[SHARD], old[SHARD];
        struct sfs_key k = tu_key(BLOCK, 0);
        long n = fsfx_read_all(fsfx_shard_path(&R.fx, BLOCK, 0), buf, SHARD);

        tu_fill(&k, old, SHARD);
        cr_assert(n < 0 || n < (long)SHARD || memcmp(buf, old, SHARD) != 0,
                  "a removed block's shard still answers its old bytes");
    }
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}

/* A shard a reader holds (a rank's lease on its slot) is not removed under
 * it: the sweep drops the block's other shards, keeps the block untrusted,
 * and drops the held one at the first sweep after the lease is released. */
Test(fs_revalidate, a_leased_shard_stays_until_released)
{
    struct sfs_key k0 = tu_key(BLOCK, 0);
    struct sfs_lease l;
    struct sfs_cache *c;
    int err = 0;

    store_write(BLOCK, 2, 1);
    fsfx_sleep_ms(TRUST_AGE_MS);
    start(NULL);
    assert_version(BLOCK, 0, 1, "first read");
    assert_version(BLOCK, 1, 1, "first read");
    wait_sweeps(2);
    cr_assert_eq(stat_of("shardfs_revalidate_invalidated_total"), 0);

    c = sfs_cache_attach(R.fx.sock, 0, &err);
    cr_assert_not_null(c, "attach %s: %s", R.fx.sock, strerror(-err));
    cr_assert_eq(sfs_cache_get(c, &k0, 0, 0, &l), SFS_HIT);
    store_write(BLOCK, 2, 2);
    /* Two sweeps invalidate it: the held shard stays through both. */
    wait_stat("shardfs_revalidate_invalidated_total", 2);
    cr_assert_eq(stat_of("shardfs_revalidate_removed_total"), 1, "only the unleased shard");
    assert_version(BLOCK, 1, 2, "the unleased shard");
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    wait_stat("shardfs_revalidate_removed_total", 2);
    assert_version(BLOCK, 0, 2, "after the release");
    sfs_cache_close(c);
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}

/* In the page-cache mode the kernel's pages of a shard are dropped with
 * it: a read after the other host's commit sees the new bytes, not pages
 * the kernel kept. */
Test(fs_revalidate, page_cached_shards_are_dropped_too)
{
    store_write(BLOCK, 1, 1);
    fsfx_sleep_ms(TRUST_AGE_MS);
    start("page_cache=1M");
    assert_version(BLOCK, 0, 1, "first read");
    assert_version(BLOCK, 0, 1, "from the page cache");
    wait_sweeps(2);
    cr_assert_eq(stat_of("shardfs_revalidate_invalidated_total"), 0);
    store_write(BLOCK, 1, 2);
    wait_stat("shardfs_revalidate_removed_total", 1);
    assert_version(BLOCK, 0, 2, "after the commit");
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}

/* A shard loading (a rank owns its load) when its block is invalidated may
 * be filled from the old version: the block stays untrusted while only that
 * load is resident (nothing judged: its owner holds it), and the first sweep
 * after it is published drops it, so the mount then serves the new
 * version. */
Test(fs_revalidate, a_shard_loading_through_an_invalidation_is_dropped_once_loaded)
{
    struct sfs_key k1 = tu_key(BLOCK, 1);
    struct sfs_lease l;
    struct sfs_cache *c;
    int err = 0;

    store_write(BLOCK, 2, 1);
    fsfx_sleep_ms(TRUST_AGE_MS);
    start(NULL);
    assert_version(BLOCK, 0, 1, "first read");
    wait_sweeps(2);
    cr_assert_eq(stat_of("shardfs_revalidate_invalidated_total"), 0);

    c = sfs_cache_attach(R.fx.sock, 0, &err);
    cr_assert_not_null(c, "attach %s: %s", R.fx.sock, strerror(-err));
    cr_assert_eq(sfs_cache_get(c, &k1, 0, 0, &l), SFS_OWNER);
    store_write(BLOCK, 2, 2);
    wait_stat("shardfs_revalidate_invalidated_total", 1);
    cr_assert_eq(stat_of("shardfs_revalidate_removed_total"), 1, "only the Ready shard");
    wait_sweeps(2); /* only the load is resident: carried, not judged */
    cr_assert_eq(stat_of("shardfs_revalidate_invalidated_total"), 1);

    /* The owner's load read the old version. */
    cr_assert_eq(tu_publish(c, &k1, &l), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    wait_stat("shardfs_revalidate_removed_total", 2);
    assert_version(BLOCK, 1, 2, "after the load was dropped");
    assert_version(BLOCK, 0, 2, "after the commit");
    sfs_cache_close(c);
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}

/* A block first seen while its only shard is loading is judged once the
 * load is published, by when its shards were claimed: an old file is then
 * trusted as it is (nothing removed), a file the other host replaces after
 * that is reloaded. */
Test(fs_revalidate, a_block_first_seen_loading_is_judged_once_loaded)
{
    struct sfs_key k0 = tu_key(BLOCK, 0);
    struct sfs_lease l;
    struct sfs_cache *c;
    int err = 0;

    store_write(BLOCK, 1, 1);
    fsfx_sleep_ms(TRUST_AGE_MS);
    start(NULL);
    c = sfs_cache_attach(R.fx.sock, 0, &err);
    cr_assert_not_null(c, "attach %s: %s", R.fx.sock, strerror(-err));
    cr_assert_eq(sfs_cache_get(c, &k0, 0, 0, &l), SFS_OWNER);
    wait_sweeps(2); /* seen loading only: not judged */
    cr_assert_eq(tu_publish(c, &k0, &l), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    wait_sweeps(2);
    cr_assert_eq(stat_of("shardfs_revalidate_invalidated_total"), 0, "an old file is trusted");
    cr_assert_eq(stat_of("shardfs_revalidate_removed_total"), 0);
    store_write(BLOCK, 1, 2);
    wait_stat("shardfs_revalidate_removed_total", 1);
    assert_version(BLOCK, 0, 2, "after the commit");
    sfs_cache_close(c);
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}
