/* SPDX-License-Identifier: MIT */
/*
 * test_store_holes.c - shards in holes of a posix block file are misses.
 *
 * A block file has one place per shard and no mark of a shard's absence:
 * a commit that finds no block file (removed by the collector, or by an
 * unlink through the mount) and writes one shard alone leaves the shards
 * before it as a hole. Every way of asking answers a miss for a shard in
 * a hole, consistently: a load (in ring mode and in sync mode, where the
 * submitter opens), exists, and the stamp says the file has holes. A
 * shard written as zeros is data, also after a later commit copied it
 * (the in-kernel copy, and the read/write fallback). A file system
 * without SEEK_DATA (the test point posix:seek_data) reads as before:
 * zeros. The lease's leftovers (.tmp and .brk files of killed takers) are
 * swept by the next holder once older than the lease's ttl; young ones,
 * and other files, stay.
 */
#include <shardfs/backend.h>

#include "backendfx.h"
#include "testpoint_i.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void init(void)
{
    mkroot();
}

static void fini(void)
{
    sfs_testpoint_disarm_all();
    unsetenv("SHARDFS_POSIX_SYNC_OPEN");
    rmroot();
}

TestSuite(store_holes, .init = init, .fini = fini, .timeout = 60);

#define B 42u

static void dump(struct sfs_backend *be, uint32_t shard, bool zeros)
{
    char *buf = xalloc(S_SMALL);
    struct sfs_key k = mkkey(B, shard);

    if (zeros)
        memset(buf, 0, S_SMALL);
    else
        fill(&k.block, shard, 0, buf, S_SMALL);
    cr_assert_eq(sfs_backend_dump_sync(be, &k, buf, S_SMALL), (int)S_SMALL, "dump of shard %u",
                 shard);
    free(buf);
}

/* The load of shard: its length (the bytes checked against fill, or
 * zeros), or -errno. */
static int load(struct sfs_backend *be, uint32_t shard, bool zeros)
{
    char *buf = xalloc(S_SMALL);
    struct sfs_key k = mkkey(B, shard);
    int r;

    memset(buf, 0x5a, S_SMALL);
    r = sfs_backend_load_sync(be, &k, buf, S_SMALL);
    if (r == (int)S_SMALL && zeros) {
        for (size_t i = 0; i < S_SMALL; i++)
            cr_assert_eq(buf[i], 0, "shard %u: byte %zu is %#x", shard, i, buf[i]);
    } else if (r == (int)S_SMALL) {
        cr_assert(matches(&k.block, shard, 0, buf, S_SMALL), "shard %u: wrong bytes", shard);
    }
    free(buf);
    return r;
}

static bool exists(struct sfs_backend *be, uint32_t shard)
{
    struct sfs_key k = mkkey(B, shard);
    bool present = false;

    cr_assert_eq(sfs_backend_exists(be, &k, 1, &present), 0);
    return present;
}

/* Shards 0..3 stored, the block removed (unlink of shard 0), then shard 3
 * written alone: 0..2 are a hole. */
static void holes_are_misses(bool sync_open)
{
    struct sfs_backend *be;
    struct sfs_block_stamp st;
    struct sfs_block_id id = mkid(B);
    struct sfs_key keys[5];
    bool present[5];

    if (sync_open)
        cr_assert_eq(setenv("SHARDFS_POSIX_SYNC_OPEN", "1", 1), 0);
    be = open_spec("%s", g_root);
    for (uint32_t s = 0; s < 4; s++)
        dump(be, s, false);
    cr_assert_eq(sfs_backend_remove(be, &(struct sfs_key){id, 0}), 0);
    cr_assert_eq(file_size(0, B), -1, "the block file stayed");
    dump(be, 3, false);
    cr_assert_eq(file_size(0, B), 4 * (off_t)S_SMALL);
    cr_assert_eq(sfs_backend_stamp(be, &id, &st), 0);
    cr_assert(st.flags & SFS_STAMP_HOLES, "no holes in the stamp: flags %#x", st.flags);
    for (uint32_t s = 0; s < 3; s++) {
        cr_assert_eq(load(be, s, false), -ENOENT, "shard %u in a hole was not a miss", s);
        cr_assert(!exists(be, s), "shard %u in a hole exists", s);
    }
    cr_assert_eq(load(be, 3, false), (int)S_SMALL);
    cr_assert(exists(be, 3));
    cr_assert_eq(sfs_backend_shard_count(be, &id), 4, "the file spans 4 shards");
    /* One exists of a run (a listing's): the same answers. */
    for (uint32_t s = 0; s < 5; s++)
        keys[s] = mkkey(B, s);
    cr_assert_eq(sfs_backend_exists(be, keys, 5, present), 0);
    for (uint32_t s = 0; s < 5; s++)
        cr_assert_eq(present[s], s == 3, "shard %u in a run: %d", s, present[s]);
    /* The shards written again fill the hole. */
    dump(be, 1, false);
    cr_assert_eq(load(be, 1, false), (int)S_SMALL);
    cr_assert_eq(load(be, 0, false), -ENOENT);
    cr_assert_eq(load(be, 2, false), -ENOENT);
    cr_assert_eq(load(be, 3, false), (int)S_SMALL);
    sfs_backend_close(be);
}

Test(store_holes, a_shard_in_a_hole_is_a_miss_ring_mode)
{
    holes_are_misses(false);
}

Test(store_holes, a_shard_in_a_hole_is_a_miss_sync_mode)
{
    holes_are_misses(true);
}

/* Shard 3 written as zeros alone (0..2 a hole), then shard 1: the commit
 * copies shard 3 (copy_file_range, or with fallback the read/write copy). */
static void zeros_are_data(bool fallback)
{
    struct sfs_backend *be = open_spec("%s", g_root);

    dump(be, 3, true);
    cr_assert_eq(load(be, 3, true), (int)S_SMALL, "written zeros were not read back");
    cr_assert(exists(be, 3));
    cr_assert_eq(load(be, 0, false), -ENOENT);
    if (fallback)
        cr_assert_eq(sfs_testpoint_arm_fail("commit:copy", EXDEV, 1000), 0);
    dump(be, 1, false);
    cr_assert_eq(load(be, 3, true), (int)S_SMALL, "zeros copied by a commit became a hole");
    cr_assert(exists(be, 3));
    cr_assert_eq(load(be, 1, false), (int)S_SMALL);
    cr_assert_eq(load(be, 2, false), -ENOENT);
    cr_assert(!exists(be, 2));
    sfs_backend_close(be);
}

Test(store_holes, a_shard_written_as_zeros_reads_as_zeros)
{
    zeros_are_data(false);
}

Test(store_holes, zeros_copied_without_the_in_kernel_copy_stay_data)
{
    zeros_are_data(true);
}

Test(store_holes, without_seek_data_a_hole_reads_as_zeros_as_before)
{
    struct sfs_backend *be = open_spec("%s", g_root);

    dump(be, 2, false);
    cr_assert_eq(sfs_testpoint_arm_fail("posix:seek_data", EINVAL, 1000), 0);
    cr_assert_eq(load(be, 0, true), (int)S_SMALL);
    cr_assert(exists(be, 1));
    cr_assert_eq(load(be, 2, false), (int)S_SMALL);
    sfs_backend_close(be);
}

/* ------------------------------------------------------------------------
 * The lease's leftovers.
 */

static void plant(const char *name)
{
    char path[512];
    int fd;

    snprintf(path, sizeof(path), "%s/%s", g_root, name);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
    cr_assert_eq(write(fd, "x", 1), 1);
    close(fd);
}

static bool there(const char *name)
{
    char path[512];

    snprintf(path, sizeof(path), "%s/%s", g_root, name);
    return access(path, F_OK) == 0;
}

#define LEFT_TMP   ".shardfs_lease.collector.deadhost.4242.00000000deadbeef.tmp"
#define LEFT_BRK   ".shardfs_lease.collector.deadhost.4243.00000000deadbeef.brk"
#define YOUNG_TMP  ".shardfs_lease.collector.livehost.4244.00000000feedf00d.tmp"
#define OTHER_ROLE ".shardfs_lease.other.deadhost.4245.00000000deadbeef.brk"
#define STRANGER   ".shardfs_lease.collector.notatoken.tmp"

Test(store_holes, a_new_holder_sweeps_the_leases_stale_leftovers)
{
    struct sfs_backend *a = open_spec("%s", g_root), *b = open_spec("%s", g_root);

    plant(LEFT_TMP);
    plant(LEFT_BRK);
    plant(OTHER_ROLE);
    plant(STRANGER);
    /* Older than b's ttl below (1 s) by then: their ctimes cannot be set
     * back, so they age. */
    usleep(1500 * 1000);
    plant(YOUNG_TMP);
    /* a's ttl is a minute: nothing is that old, nothing goes. */
    cr_assert_eq(sfs_backend_lease(a, "collector", 60000), 1);
    cr_assert(there(LEFT_TMP) && there(LEFT_BRK) && there(YOUNG_TMP), "swept too young");
    cr_assert_eq(sfs_backend_lease(a, "collector", 0), 0);
    /* b takes it with a ttl of 1 s: the two that old go. */
    cr_assert_eq(sfs_backend_lease(b, "collector", 1000), 1);
    cr_assert(!there(LEFT_TMP), "a killed taker's .tmp stayed");
    cr_assert(!there(LEFT_BRK), "a killed taker's .brk stayed");
    cr_assert(there(OTHER_ROLE), "another role's file went");
    cr_assert(there(STRANGER), "a file not named by a token went");
    cr_assert_eq(sfs_backend_lease(b, "collector", 0), 0);
    sfs_backend_close(a);
    sfs_backend_close(b);
}
