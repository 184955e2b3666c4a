/* SPDX-License-Identifier: MIT */
/*
 * test_fs_listing.c - what the mount's directories list (fs/dir.c): /block
 * lists each resident block once, sorted, however its shards lie in the
 * cache and however many blocks there are; a shard directory lists the
 * store's shards and, once each, the resident ones past the store's count
 * (a block file shrunk behind the daemon's back).
 *
 * A small posix store of 512-byte shards, read through the mount with
 * plain system calls, listed with opendir/readdir. Needs /dev/fuse and
 * fusermount3; skips without.
 */
#include "fsfixture.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD   512u
#define NBLOCKS 300u /* more than the listing's first allocation (256 blocks) */

static struct {
    char store[128];
    struct fsfx fx;
} L;

static void setup(void)
{
    int st = 0, r;

    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    memset(&L, 0, sizeof(L));
    snprintf(L.store, sizeof(L.store), "%s", tu_path("store"));
    snprintf(L.fx.mnt, sizeof(L.fx.mnt), "%s", tu_path("mnt"));
    snprintf(L.fx.sock, sizeof(L.fx.sock), "%s", tu_path("sock"));
    snprintf(L.fx.log, sizeof(L.fx.log), "%s", tu_path("log"));
    L.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
    cr_assert_eq(tu_store_write(L.store, 0, NBLOCKS, 2, SHARD, NULL, NULL, false), 0);
    cr_assert_eq(tu_store_write(L.store, NBLOCKS, 1, 20, SHARD, NULL, NULL, false), 0);
    r = fsfx_start(&L.fx, L.store, "hugepages=off,shard_size=512,capacity=1M,readahead=0", 10.0,
                   &st);
    cr_assert_eq(r, 0, "mount (%s, status %d), see %s", strerror(-r), st, L.fx.log);
}

static void teardown(void)
{
    if (L.fx.pid > 0)
        fsfx_stop(&L.fx, true, 10.0);
    fsfx_cleanup(&L.fx, L.store);
}

TestSuite(fs_listing, .init = setup, .fini = teardown, .timeout = 60);

static void read_ok(uint64_t b, uint32_t s)
{
    static char buf[SHARD];

    cr_assert_eq(fsfx_read_all(fsfx_shard_path(&L.fx, b, s), buf, SHARD), (long)SHARD,
                 "read of block %llu shard %u", (unsigned long long)b, s);
}

/* The names dir lists (without . and ..), in readdir's order, into
 * names[max][256]; how many. */
static size_t list(const char *dir, char (*names)[256], size_t max)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    size_t n = 0;

    cr_assert_not_null(d, "opendir %s: %s", dir, strerror(errno));
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        cr_assert_lt(n, max, "%s lists more than %zu names", dir, max);
        snprintf(names[n++], sizeof(names[0]), "%s", e->d_name);
    }
    closedir(d);
    return n;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(a, b);
}

/* Every shard of NBLOCKS blocks resident (two each, their slots spread over
 * the cache): /block lists each block once, in order. */
Test(fs_listing, the_block_directory_lists_each_resident_block_once)
{
    static char names[2 * NBLOCKS][256], want[NBLOCKS][256];
    char dir[256];
    size_t n;

    for (uint32_t s = 0; s < 2; s++)
        for (uint64_t b = 0; b < NBLOCKS; b++)
            read_ok(b, s);
    for (uint64_t b = 0; b < NBLOCKS; b++)
        tu_block_hex(b, want[b]);
    qsort(want, NBLOCKS, sizeof(want[0]), cmp_name);
    snprintf(dir, sizeof(dir), "%s/block", L.fx.mnt);
    n = list(dir, names, 2 * NBLOCKS);
    cr_assert_eq(n, NBLOCKS, "/block lists %zu names for %u resident blocks", n, NBLOCKS);
    for (size_t i = 0; i < n; i++)
        cr_assert_str_eq(names[i], want[i], "entry %zu", i);
}

/* A block file the store shrank from 20 shards to 5 after all 20 were read:
 * the shard directory lists 0..19 once each (the store's 5, then the
 * resident ones past them), and each still reads. */
Test(fs_listing, a_shard_directory_lists_resident_shards_past_the_store_once)
{
    static char names[64][256];
    char want[24];
    size_t n;

    for (uint32_t s = 0; s < 20; s++)
        read_ok(NBLOCKS, s);
    cr_assert_eq(truncate(fsfx_block_file(L.store, NBLOCKS), 5 * (off_t)SHARD), 0);
    n = list(fsfx_shard_path(&L.fx, NBLOCKS, -1), names, 64);
    cr_assert_eq(n, 20, "the shard directory lists %zu names", n);
    for (size_t i = 0; i < n; i++) {
        snprintf(want, sizeof(want), "%zu", i);
        cr_assert_str_eq(names[i], want, "entry %zu", i);
    }
    read_ok(NBLOCKS, 19);
}
