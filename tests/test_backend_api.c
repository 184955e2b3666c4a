/* SPDX-License-Identifier: MIT */
/*
 * test_backend_api.c - the backend API's contract at its edges: every call
 * refuses a missing backend or array with -EINVAL and takes an empty batch
 * as done; a spec is refused with -EINVAL and a line naming what is wrong
 * (no spec, a shard size results cannot carry, fault wrappers nested too
 * deep, each posix, fault and peer option's bad values, a posix root that
 * is missing, a file or a symlink loop); a read-only open
 * stays read-only whatever its spec says; a fault wrapper passes touch
 * and listing through to the store it wraps; and names in a posix store
 * that are no block file (symlinks out or in a loop, a file where a block
 * directory should be) are absent, never followed nor an error.
 */
#include "testpoint_i.h"
#include "testutil.h"

#include <shardfs/backend.h>

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SHARD 4096u

static char g_store[128];

static void setup(void)
{
    snprintf(g_store, sizeof(g_store), "%s", tu_path("store"));
    cr_assert_eq(tu_store_write(g_store, 1, 3, 2, SHARD, NULL, NULL, false), 0);
}

static void teardown(void)
{
    char cmd[256];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_store);
    if (system(cmd) != 0) {
        /* a leftover in the test's own directory */
    }
}

TestSuite(backend_api, .init = setup, .fini = teardown, .timeout = 30);

static struct sfs_backend *open_ok(const char *spec, bool read_only)
{
    struct sfs_backend_params p = {.shard_size = SHARD, .read_only = read_only};
    char err[256] = "";
    int e = 0;
    struct sfs_backend *be = sfs_backend_open(spec, &p, err, sizeof(err), &e);

    cr_assert_not_null(be, "%s: %s (%d)", spec, err, e);
    return be;
}

/* spec (with shard_size) is refused with -EINVAL and a line naming want. */
static void refused(const char *spec, uint64_t shard_size, const char *want)
{
    struct sfs_backend_params p = {.shard_size = shard_size};
    char err[256] = "";
    int e = 0;

    cr_assert_null(sfs_backend_open(spec, &p, err, sizeof(err), &e), "%s was opened",
                   spec ? spec : "(null)");
    cr_assert_eq(e, -EINVAL, "%s: %s, not EINVAL", spec ? spec : "(null)", strerror(-e));
    cr_assert(strstr(err, want), "%s: the error '%s' does not name '%s'", spec ? spec : "(null)",
              err, want);
}

static int scan_none(const struct sfs_block_scan *b, void *arg)
{
    (void)b;
    (void)arg;
    return 0;
}

Test(backend_api, every_call_refuses_a_missing_backend_or_array)
{
    struct sfs_backend *be = open_ok("mem:", false);
    struct sfs_block_id id = tu_block(1);
    struct sfs_key k = tu_key(1, 0);
    struct sfs_block_stamp st;
    bool present;
    char buf[SHARD + 1];

    cr_assert_eq(sfs_backend_load(NULL, NULL, 0), -EINVAL);
    cr_assert_eq(sfs_backend_load(be, NULL, 1), -EINVAL);
    cr_assert_eq(sfs_backend_load(be, NULL, 0), 0, "an empty batch is done");
    cr_assert_eq(sfs_backend_dump(NULL, NULL, 0), -EINVAL);
    cr_assert_eq(sfs_backend_dump(be, NULL, 1), -EINVAL);
    cr_assert_eq(sfs_backend_dump(be, NULL, 0), 0);
    cr_assert_eq(sfs_backend_exists(NULL, &k, 1, &present), -EINVAL);
    cr_assert_eq(sfs_backend_exists(be, NULL, 1, &present), -EINVAL);
    cr_assert_eq(sfs_backend_exists(be, &k, 1, NULL), -EINVAL);
    cr_assert_eq(sfs_backend_exists(be, NULL, 0, NULL), 0);
    cr_assert_eq(sfs_backend_shard_count(NULL, &id), -EINVAL);
    cr_assert_eq(sfs_backend_shard_count(be, NULL), -EINVAL);
    cr_assert_eq(sfs_backend_stamp(NULL, &id, &st), -EINVAL);
    cr_assert_eq(sfs_backend_stamp(be, &id, NULL), -EINVAL);
    cr_assert_eq(sfs_backend_touch(NULL, &id, 1), -EINVAL);
    cr_assert_eq(sfs_backend_touch(be, NULL, 1), -EINVAL);
    cr_assert_eq(sfs_backend_touch(be, NULL, 0), 0);
    cr_assert_eq(sfs_backend_remove(NULL, &k), -EINVAL);
    cr_assert_eq(sfs_backend_remove(be, NULL), -EINVAL);
    cr_assert_eq(sfs_backend_list(NULL, NULL, NULL), -EINVAL);
    cr_assert_eq(sfs_backend_list(be, NULL, NULL), -EINVAL);
    cr_assert_eq(sfs_backend_load_sync(NULL, &k, buf, SHARD), -EINVAL);
    cr_assert_eq(sfs_backend_load_sync(be, NULL, buf, SHARD), -EINVAL);
    cr_assert_eq(sfs_backend_dump_sync(be, &k, NULL, SHARD), -EINVAL);
    cr_assert_eq(sfs_backend_scan(NULL, scan_none, NULL), -EINVAL);
    cr_assert_eq(sfs_backend_scan(be, NULL, NULL), -EINVAL);
    cr_assert_eq(sfs_backend_evict(NULL, &id, &st, NULL), -EINVAL);
    cr_assert_eq(sfs_backend_evict(be, NULL, &st, NULL), -EINVAL);
    cr_assert_eq(sfs_backend_evict(be, &id, NULL, NULL), -EINVAL);
    cr_assert_eq(sfs_backend_lease(NULL, "collector", 1000), -EINVAL);
    cr_assert_eq(sfs_backend_lease(be, NULL, 1000), -EINVAL);
    /* A buffer of no bytes, or of more than a shard: each io refused. */
    for (int dump = 0; dump < 2; dump++) {
        uint32_t lens[2] = {0, SHARD + 1};

        for (int i = 0; i < 2; i++) {
            int r = dump ? sfs_backend_dump_sync(be, &k, buf, lens[i])
                         : sfs_backend_load_sync(be, &k, buf, lens[i]);

            cr_assert_eq(r, -EINVAL, "%s of %u bytes: %d", dump ? "dump" : "load", lens[i], r);
        }
    }
    sfs_backend_close(NULL); /* nothing to close */
    sfs_backend_close(be);
}

Test(backend_api, a_bad_spec_is_refused_naming_what_is_wrong)
{
    char spec[512], nested[512] = "";

    refused(NULL, SHARD, "no backend spec");
    refused("mem:", (uint64_t)INT_MAX + 1, "2 GiB");
    for (int i = 0; i < 10; i++)
        strcat(nested, "fault::");
    strcat(nested, "mem:");
    refused(nested, SHARD, "nested too deeply");

    /* Roots that are no directory to open, each said as what it is. */
    {
        struct sfs_backend_params p = {.shard_size = SHARD};
        static const char *says[] = {"does not exist", "is not a directory",
                                     "cannot open directory"};
        char path[3][300], err[256];
        int e;

        snprintf(path[0], sizeof(path[0]), "%s/none", g_store);
        snprintf(path[1], sizeof(path[1]), "%s/file", g_store);
        snprintf(path[2], sizeof(path[2]), "%s/loop", g_store);
        close(open(path[1], O_WRONLY | O_CREAT, 0644));
        cr_assert_eq(symlink(path[2], path[2]), 0);
        for (int i = 0; i < 3; i++) {
            err[0] = '\0';
            e = 0;
            snprintf(spec, sizeof(spec), "posix:%.300s", path[i]);
            cr_assert_null(sfs_backend_open(spec, &p, err, sizeof(err), &e), "%s", path[i]);
            cr_assert_lt(e, 0);
            cr_assert(strstr(err, says[i]), "%s: '%s' does not say '%s'", path[i], err, says[i]);
        }
        unlink(path[1]);
        unlink(path[2]);
    }

    snprintf(spec, sizeof(spec), "posix:%s?dir_prefix=x", g_store);
    refused(spec, SHARD, "dir_prefix");
    snprintf(spec, sizeof(spec), "posix:%s?depth=99999999", g_store);
    refused(spec, SHARD, "depth");
    snprintf(spec, sizeof(spec), "posix:%s?sync=yes", g_store);
    refused(spec, SHARD, "sync");
    snprintf(spec, sizeof(spec), "posix:%s?read_only=2", g_store);
    refused(spec, SHARD, "read_only");

    refused("fault:eio:mem:", SHARD, "no '=value'");
    refused("fault:latency_us=x:mem:", SHARD, "latency_us");
    refused("fault:latency_us=99999999999999:mem:", SHARD, "latency_us");
    refused("fault:seed=1x:mem:", SHARD, "seed");
    refused("fault:stall_ms=999999999999:mem:", SHARD, "stall_ms");
    refused("fault:short=nan:mem:", SHARD, "short");

    /* The peer tier's options (sizes with a suffix; each value checked). */
    refused("peer:listen", SHARD, "expected key=value");
    refused("peer:listen=127.0.0.1:1,members=,capacity=1M:mem:", SHARD, "empty or too long");
    refused("peer:listen=127.0.0.1:1,capacity=1M,slot=0:mem:", SHARD, "'slot'");
    refused("peer:listen=127.0.0.1:1,capacity=1M,slot=x:mem:", SHARD, "'slot'");
    refused("peer:listen=127.0.0.1:1,capacity=1q:mem:", SHARD, "'capacity'");
    refused("peer:listen=127.0.0.1:1,capacity=1Kx:mem:", SHARD, "'capacity'");
    refused("peer:listen=127.0.0.1:1,capacity=99999999999999999999:mem:", SHARD, "'capacity'");
    refused("peer:listen=127.0.0.1:1,capacity=99999999999T:mem:", SHARD, "'capacity'");
    refused("peer:listen=127.0.0.1:1,capacity=1g,ways=0:mem:", SHARD, "'ways'");
    refused("peer:listen=127.0.0.1:1,capacity=1t,deadline_ms=0:mem:", SHARD, "'deadline_ms'");
}

/* A read-only open (the daemon's -o ro) stays read-only whatever its spec
 * says (read_only=0), and a spec's read_only=1 makes any open read-only:
 * dumps and removes are -EROFS, loads work. */
Test(backend_api, a_read_only_open_stays_read_only)
{
    struct sfs_key k = tu_key(1, 0);
    char spec[512], buf[SHARD];
    struct sfs_backend *be;

    snprintf(spec, sizeof(spec), "posix:%s?read_only=0", g_store);
    be = open_ok(spec, true);
    memset(buf, 1, sizeof(buf));
    cr_assert_eq(sfs_backend_dump_sync(be, &k, buf, SHARD), -EROFS);
    cr_assert_eq(sfs_backend_remove(be, &k), -EROFS);
    cr_assert_eq(sfs_backend_load_sync(be, &k, buf, SHARD), (int)SHARD);
    cr_assert_eq(tu_check(&k, buf, SHARD), -1, "a load through a read-only open");
    sfs_backend_close(be);
    snprintf(spec, sizeof(spec), "posix:%s?read_only=1", g_store);
    be = open_ok(spec, false);
    cr_assert_eq(sfs_backend_dump_sync(be, &k, buf, SHARD), -EROFS);
    sfs_backend_close(be);
}

static int count_block(const struct sfs_block_id *b, void *arg)
{
    (void)b;
    (*(int *)arg)++;
    return 0;
}

/* A fault wrapper lists the blocks of the store it wraps, and passes a
 * touch through (0, as the store answers). */
Test(backend_api, a_fault_wrapper_passes_touch_and_listing_through)
{
    struct sfs_block_id ids[2] = {tu_block(1), tu_block(2)};
    char spec[512];
    struct sfs_backend *be;
    int n = 0;

    snprintf(spec, sizeof(spec), "fault:seed=3:posix:%s?direct=0", g_store);
    be = open_ok(spec, false);
    cr_assert_eq(sfs_backend_list(be, count_block, &n), 0);
    cr_assert_eq(n, 3, "listed %d blocks through the wrapper, not 3", n);
    cr_assert_eq(sfs_backend_touch(be, ids, 2), 0);
    sfs_backend_close(be);
}

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    cr_assert_not_null(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* The posix backend's start failing at each of its steps (failed on demand
 * at result points of the test build: io_uring refused by the kernel, the
 * helpers or the completion thread that cannot start): the open fails with
 * that errno and says which step, and leaves no descriptor behind, on a
 * FUSE store (its host lock directory open) too. */
Test(backend_api, a_posix_start_that_fails_unwinds_every_step)
{
    static const struct {
        const char *point, *says;
        int err;
    } steps[] = {
        {"posix:ring_init", "io_uring setup", EPERM},
        {"posix:call_init", "helpers", ENOMEM},
        {"posix:reaper", "completion thread", EAGAIN},
    };
    struct sfs_backend_params prm = {.shard_size = SHARD};
    char spec[256], locks[300];

    snprintf(spec, sizeof(spec), "posix:%s", g_store);
    snprintf(locks, sizeof(locks), "%s.locks", g_store);
    /* Each step as a plain store, then as a FUSE store (its host lock
     * directory held open too). */
    for (size_t n = 0; n < 2 * sizeof(steps) / sizeof(steps[0]); n++) {
        char err[256] = "";
        int e = 0, before = open_fds();
        bool fuse = n >= sizeof(steps) / sizeof(steps[0]);
        size_t i = n % (sizeof(steps) / sizeof(steps[0]));

        if (fuse) {
            setenv("SHARDFS_POSIX_REMOTE", "1", 1);
            setenv("SHARDFS_POSIX_HOST_LOCKS", "1", 1);
            setenv("SHARDFS_LOCK_DIR", locks, 1);
        }

        cr_assert_eq(sfs_testpoint_arm_fail(steps[i].point, steps[i].err, 1), 0);
        cr_assert_null(sfs_backend_open(spec, &prm, err, sizeof(err), &e), "%s", steps[i].point);
        cr_assert_eq(sfs_testpoint_hits(steps[i].point), 1, "%s was not passed", steps[i].point);
        sfs_testpoint_disarm_all();
        unsetenv("SHARDFS_POSIX_REMOTE");
        unsetenv("SHARDFS_POSIX_HOST_LOCKS");
        unsetenv("SHARDFS_LOCK_DIR");
        cr_assert_eq(e, -steps[i].err, "%s: %d", steps[i].point, e);
        cr_assert(strstr(err, steps[i].says), "%s: the reason does not say the step: %s",
                  steps[i].point, err);
        cr_assert_eq(open_fds(), before, "%s: %d descriptors left behind", steps[i].point,
                     open_fds() - before);
    }
    rmdir(locks);
    struct sfs_backend *be = sfs_backend_open(spec, &prm, NULL, 0, &(int){0});
    cr_assert_not_null(be, "the start after the failures");
    struct sfs_key k = tu_key(1, 1);
    uint8_t buf[SHARD];
    cr_assert_eq(sfs_backend_load_sync(be, &k, buf, SHARD), (int)SHARD);
    cr_assert_eq(tu_check(&k, buf, SHARD), -1);
    sfs_backend_close(be);
}

static int stop_at_first(const struct sfs_block_id *b, void *arg)
{
    (void)b;
    (*(int *)arg)++;
    return 7;
}

/* Sync-open mode (no ring: the caller's thread asks the file system): a
 * listing skips what is not a block file (a directory with a block's name)
 * and stops where fn says, with fn's value; stamps of a block present and
 * of one absent; an eviction; a store with no data directory lists
 * nothing. */
Test(backend_api, sync_open_lists_and_stamps)
{
    struct sfs_block_id one = tu_block(1), none = tu_block(99);
    struct sfs_block_stamp st;
    char spec[512], dir[400], hex[SFS_BLOCK_HEX_LEN + 1];
    struct sfs_backend *be;
    int n = 0;

    tu_block_hex(77, hex);
    snprintf(dir, sizeof(dir), "%s/data/%s", g_store, hex);
    cr_assert_eq(mkdir(dir, 0755), 0, "mkdir %s: %s", dir, strerror(errno));
    setenv("SHARDFS_POSIX_SYNC_OPEN", "1", 1);
    snprintf(spec, sizeof(spec), "posix:%s?direct=0", g_store);
    be = open_ok(spec, false);
    unsetenv("SHARDFS_POSIX_SYNC_OPEN");
    cr_assert_eq(sfs_backend_list(be, count_block, &n), 0);
    cr_assert_eq(n, 3, "listed %d, not the 3 block files", n);
    n = 0;
    cr_assert_eq(sfs_backend_list(be, stop_at_first, &n), 7);
    cr_assert_eq(n, 1, "the listing went on after fn said stop");
    cr_assert_eq(sfs_backend_stamp(be, &one, &st), 0);
    cr_assert_not(st.flags & SFS_STAMP_ABSENT);
    cr_assert_eq(st.size, 2 * SHARD);
    cr_assert_eq(sfs_backend_stamp(be, &none, &st), 0);
    cr_assert(st.flags & SFS_STAMP_ABSENT);
    /* An eviction, in the caller's thread; a dump of less than a shard
     * and a load of nothing, refused. */
    cr_assert_eq(sfs_backend_stamp(be, &one, &st), 0);
    cr_assert_eq(sfs_backend_evict(be, &one, &st, NULL), 0);
    cr_assert_eq(sfs_backend_stamp(be, &one, &st), 0);
    cr_assert(st.flags & SFS_STAMP_ABSENT, "the evicted block is there");
    {
        struct sfs_key k = tu_key(2, 0);
        uint8_t buf[SHARD];

        cr_assert_eq(sfs_backend_dump_sync(be, &k, buf, SHARD - 1), -EINVAL);
        cr_assert_eq(sfs_backend_load_sync(be, &k, buf, 0), -EINVAL);
    }
    sfs_backend_close(be);

    /* No data directory at all: an empty store. */
    snprintf(dir, sizeof(dir), "%s", tu_path("empty"));
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(spec, sizeof(spec), "posix:%s?direct=0", dir);
    be = open_ok(spec, false);
    n = 0;
    cr_assert_eq(sfs_backend_list(be, count_block, &n), 0);
    cr_assert_eq(n, 0);
    sfs_backend_close(be);
    snprintf(spec, sizeof(spec), "rm -rf '%s'", dir);
    cr_assert_eq(system(spec), 0);
}

/* Names in the store that are no block file we may read: a symlink out of
 * the store, a symlink loop, a block directory that is a file (dir_prefix
 * layout). Each is absent to a stamp, exists and shard_count, never an
 * error and never followed; a listing of that layout skips the file where
 * a directory should be, and a block file in another prefix's directory. */
Test(backend_api, names_that_are_no_block_file_are_absent)
{
    struct sfs_block_id out = tu_block(201), loop = tu_block(202), under = tu_block(203);
    char spec[512], path[400], hex[SFS_BLOCK_HEX_LEN + 1], other[SFS_BLOCK_HEX_LEN + 1];
    struct sfs_block_stamp st;
    struct sfs_backend *be;
    struct sfs_key k;
    bool present = true;
    int n = 0;

    tu_block_hex(201, hex);
    snprintf(path, sizeof(path), "%s/data/%s", g_store, hex);
    cr_assert_eq(symlink("/etc/hostname", path), 0);
    tu_block_hex(202, hex);
    snprintf(path, sizeof(path), "%s/data/%s", g_store, hex);
    cr_assert_eq(symlink(path, path), 0);
    snprintf(spec, sizeof(spec), "posix:%s?direct=0", g_store);
    be = open_ok(spec, false);
    for (int i = 0; i < 2; i++) {
        const struct sfs_block_id *b = i ? &loop : &out;

        cr_assert_eq(sfs_backend_stamp(be, b, &st), 0);
        cr_assert(st.flags & SFS_STAMP_ABSENT, "a symlink %s is a block", i ? "loop" : "out");
        k = (struct sfs_key){*b, 0};
        cr_assert_eq(sfs_backend_exists(be, &k, 1, &present), 0);
        cr_assert_not(present);
        cr_assert_eq(sfs_backend_shard_count(be, b), -ENOENT);
    }
    sfs_backend_close(be);

    /* dir_prefix=2: block 203's directory is a file; a block file of
     * block 1 put in block 203's prefix directory is no block there. */
    tu_block_hex(203, hex);
    tu_block_hex(1, other);
    snprintf(path, sizeof(path), "%s/%.2s", g_store, hex);
    close(open(path, O_WRONLY | O_CREAT, 0644));
    if (strncmp(hex, other, 2) != 0) {
        snprintf(path, sizeof(path), "%s/%.2s", g_store, other);
        cr_assert_eq(mkdir(path, 0755), 0);
        snprintf(path, sizeof(path), "%s/%.2s/%s", g_store, other, hex);
        close(open(path, O_WRONLY | O_CREAT, 0644));
    }
    snprintf(spec, sizeof(spec), "posix:%s?direct=0&dir_prefix=2", g_store);
    be = open_ok(spec, false);
    cr_assert_eq(sfs_backend_stamp(be, &under, &st), 0);
    cr_assert(st.flags & SFS_STAMP_ABSENT);
    k = (struct sfs_key){under, 0};
    cr_assert_eq(sfs_backend_exists(be, &k, 1, &present), 0);
    cr_assert_not(present);
    cr_assert_eq(sfs_backend_list(be, count_block, &n), 0);
    cr_assert_eq(n, 0, "listed %d blocks of a store with none in its layout", n);
    sfs_backend_close(be);
}
