/* SPDX-License-Identifier: MIT */
/*
 * test_posix_read_faults.c - what the posix backend's reaper makes of a
 * read that fails (posix_load.c): -ESTALE is read again from a new open,
 * and so are -EIO and -ENOENT on a remote store (GlusterFS's answers to a
 * file renamed over); a lasting one ends as a miss; -EAGAIN is retried; an
 * O_DIRECT read the file system refuses goes buffered, said once; on a
 * local store an -EIO is the load's error; ring mode's opens and stats of
 * a block file likewise.
 *
 * Key idea: a local file system never fails these reads, so the test build
 * replaces a read's result at the "load:read" result point
 * (sfs_testpoint_arm_fail; "load:open" and "load:stat" for the opens) and the store poses as remote
 * by the test hook SHARDFS_POSIX_REMOTE. Every load that succeeds is checked byte by byte against
 * the block file's contents; every one runs in ring mode and in sync-open mode
 * (SHARDFS_POSIX_SYNC_OPEN), whose reopens differ.
 */
#include "backendfx.h"
#include "testpoint_i.h"

#include <stdatomic.h>
#include <syslog.h>

TestSuite(posix_read_faults, .init = mkroot, .fini = rmroot, .timeout = 30);

#define NSHARDS 4u

static atomic_int direct_lines; /* log lines that name O_DIRECT */

static void count_log(int level, const char *msg, void *arg)
{
    (void)level;
    (void)arg;
    /* Relaxed: read after the backend is closed (its threads joined). */
    if (strstr(msg, "O_DIRECT"))
        atomic_fetch_add_explicit(&direct_lines, 1, memory_order_relaxed);
}

/* The posix backend on g_root, in sync-open mode or not, posing as remote
 * or not. */
static struct sfs_backend *open_posix(bool sync_open, bool remote)
{
    struct sfs_backend *be;

    if (sync_open)
        setenv("SHARDFS_POSIX_SYNC_OPEN", "1", 1);
    setenv("SHARDFS_POSIX_REMOTE", remote ? "1" : "0", 1);
    be = open_spec("posix:%s", g_root);
    unsetenv("SHARDFS_POSIX_SYNC_OPEN");
    unsetenv("SHARDFS_POSIX_REMOTE");
    return be;
}

/* Load shard `shard` of block `block`: the load's result, the bytes
 * checked when it is a whole shard. */
static int load_checked(struct sfs_backend *be, uint64_t block, uint32_t shard)
{
    struct sfs_key k = mkkey(block, shard);
    char *buf = xalloc(S_SMALL);
    int r;

    memset(buf, 0xee, S_SMALL);
    r = sfs_backend_load_sync(be, &k, buf, S_SMALL);
    if (r == (int)S_SMALL)
        cr_assert(matches(&k.block, shard, 0, buf, S_SMALL), "wrong bytes for %lu/%u",
                  (unsigned long)block, shard);
    free(buf);
    return r;
}

static unsigned last_hits; /* reads of the last load_failing() */

/* Arm the read's result point to fail n times with err, load, disarm;
 * returns the load's result and asserts the point was passed. */
static int load_failing(struct sfs_backend *be, uint64_t block, uint32_t shard, int err, unsigned n)
{
    int r;

    cr_assert_eq(sfs_testpoint_arm_fail("load:read", err, n), 0);
    r = load_checked(be, block, shard);
    last_hits = sfs_testpoint_hits("load:read");
    cr_assert_geq(last_hits, 1, "the read's result point was not passed");
    sfs_testpoint_disarm_all();
    return r;
}

static void stale_read_again(bool sync_open)
{
    write_block(0, 1, NSHARDS, S_SMALL);
    struct sfs_backend *be = open_posix(sync_open, false);

    /* A stale handle: read again from a new open, the bytes whole. */
    cr_assert_eq(load_failing(be, 1, 2, ESTALE, 1), (int)S_SMALL);
    cr_assert_eq(load_failing(be, 1, 0, ESTALE, 5), (int)S_SMALL);
    /* Stale at every try: a miss after the retries, never an error, and
     * never an endless reopen (IO_RETRY_MAX reads again, whatever the mode). */
    int r = load_failing(be, 1, 3, ESTALE, 1000);
    cr_assert_eq(r, -ENOENT, "stale at every read: %d, after %u reads", r, last_hits);
    cr_assert_leq(last_hits, 20, "%u reads of a shard stale at every one", last_hits);
    /* The backend is none the worse for it. */
    for (uint32_t s = 0; s < NSHARDS; s++)
        cr_assert_eq(load_checked(be, 1, s), (int)S_SMALL);
    sfs_backend_close(be);
}

Test(posix_read_faults, stale_read_is_read_again_ring)
{
    stale_read_again(false);
}

Test(posix_read_faults, stale_read_is_read_again_sync)
{
    stale_read_again(true);
}

static void remote_eio_read_again(bool sync_open)
{
    write_block(0, 2, NSHARDS, S_SMALL);
    struct sfs_backend *be = open_posix(sync_open, true);

    cr_assert_eq(load_failing(be, 2, 1, EIO, 1), (int)S_SMALL, "remote -EIO is a stale file");
    cr_assert_eq(load_failing(be, 2, 2, ENOENT, 2), (int)S_SMALL,
                 "remote -ENOENT at the read is a stale file");
    int r = load_failing(be, 2, 0, EIO, 1000);
    cr_assert_eq(r, -ENOENT, "a lasting one is a miss: %d, after %u reads", r, last_hits);
    cr_assert_leq(last_hits, 20, "%u reads of a shard failing at every one", last_hits);
    sfs_backend_close(be);
}

Test(posix_read_faults, remote_eio_is_read_again_ring)
{
    remote_eio_read_again(false);
}

Test(posix_read_faults, remote_eio_is_read_again_sync)
{
    remote_eio_read_again(true);
}

/* On a local store a read's -EIO is the load's, -EAGAIN is retried (a
 * bounded number of times, then -EIO). */
Test(posix_read_faults, local_errors_and_retries)
{
    write_block(0, 3, NSHARDS, S_SMALL);
    struct sfs_backend *be = open_posix(false, false);

    cr_assert_eq(load_failing(be, 3, 0, EIO, 1), -EIO);
    cr_assert_eq(load_failing(be, 3, 1, ENOENT, 1), -ENOENT);
    cr_assert_eq(load_failing(be, 3, 1, EAGAIN, 3), (int)S_SMALL, "-EAGAIN is retried");
    cr_assert_eq(load_failing(be, 3, 2, EINTR, 1), (int)S_SMALL, "-EINTR is retried");
    cr_assert_eq(load_failing(be, 3, 3, EAGAIN, 1000), -EIO, "retries are bounded");
    cr_assert_eq(load_checked(be, 3, 3), (int)S_SMALL);
    sfs_backend_close(be);
}

/* An O_DIRECT read refused at the read (not at the open): that load and
 * every later one read buffered, said once. Needs a store where O_DIRECT
 * opens succeed (checked first: no line says otherwise). */
static void direct_refused_at_read(bool sync_open)
{
    write_block(0, 4, NSHARDS, S_SMALL);
    atomic_store(&direct_lines, 0);
    sfs_set_log(count_log, NULL, LOG_DEBUG);
    struct sfs_backend *be = open_posix(sync_open, false);

    cr_assert_eq(load_checked(be, 4, 0), (int)S_SMALL);
    if (atomic_load(&direct_lines) != 0) {
        sfs_backend_close(be);
        sfs_set_log(NULL, NULL, 0);
        cr_skip_test("%s refuses O_DIRECT at the open", g_root);
    }
    cr_assert_eq(load_failing(be, 4, 1, EINVAL, 1), (int)S_SMALL, "refused: read buffered");
    cr_assert_eq(atomic_load(&direct_lines), 1, "the fallback is said once");
    for (uint32_t s = 0; s < NSHARDS; s++)
        cr_assert_eq(load_checked(be, 4, s), (int)S_SMALL);
    /* Buffered now: an -EINVAL is an error like any other. */
    cr_assert_eq(load_failing(be, 4, 2, EINVAL, 1), -EINVAL);
    sfs_backend_close(be);
    sfs_set_log(NULL, NULL, 0);
    cr_assert_eq(atomic_load(&direct_lines), 1);
}

Test(posix_read_faults, direct_refused_at_the_read_ring)
{
    direct_refused_at_read(false);
}

Test(posix_read_faults, direct_refused_at_the_read_sync)
{
    direct_refused_at_read(true);
}

/* Ring mode's open of a block file (its OPENAT2 and STATX, failed on
 * demand at "load:open" and "load:stat"): a stale open is looked up again,
 * a lasting one (or a remote store's -EIO) a miss within the bound; a
 * stale stat a miss; a local -EIO at either the load's error. */
static int load_open_failing(struct sfs_backend *be, const char *point, uint32_t shard, int err,
                             unsigned n)
{
    int r;

    cr_assert_eq(sfs_testpoint_arm_fail(point, err, n), 0);
    r = load_checked(be, 5, shard);
    last_hits = sfs_testpoint_hits(point);
    cr_assert_geq(last_hits, 1, "%s was not passed", point);
    sfs_testpoint_disarm_all();
    return r;
}

Test(posix_read_faults, failed_opens_ring)
{
    write_block(0, 5, NSHARDS, S_SMALL);
    struct sfs_backend *be = open_posix(false, false);

    cr_assert_eq(load_open_failing(be, "load:open", 0, ESTALE, 2), (int)S_SMALL);
    cr_assert_eq(load_open_failing(be, "load:open", 1, ESTALE, 1000), -ENOENT);
    cr_assert_leq(last_hits, 20, "%u opens of a name stale at every one", last_hits);
    cr_assert_eq(load_open_failing(be, "load:open", 2, EIO, 1), -EIO);
    cr_assert_eq(load_open_failing(be, "load:open", 2, EACCES, 1), -EACCES);
    cr_assert_eq(load_open_failing(be, "load:stat", 3, ESTALE, 1), -ENOENT);
    cr_assert_eq(load_open_failing(be, "load:stat", 3, EIO, 1), -EIO);
    for (uint32_t s = 0; s < NSHARDS; s++)
        cr_assert_eq(load_checked(be, 5, s), (int)S_SMALL);
    sfs_backend_close(be);

    be = open_posix(false, true);
    cr_assert_eq(load_open_failing(be, "load:open", 0, EIO, 3), (int)S_SMALL,
                 "a remote store's -EIO at the open is a stale name");
    cr_assert_eq(load_open_failing(be, "load:open", 1, EIO, 1000), -ENOENT);
    cr_assert_eq(load_open_failing(be, "load:stat", 2, EIO, 1), -ENOENT);
    sfs_backend_close(be);
}
