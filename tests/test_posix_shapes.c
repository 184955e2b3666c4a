/* SPDX-License-Identifier: MIT */
/*
 * test_posix_shapes.c - the posix store against the shapes a block file can
 * have besides "n whole shards of data": a tail of holes (a block file
 * extended by truncate), a partial last shard (a writer that stopped
 * mid-shard), a gap a dump past the end leaves. Each commit (dump or
 * remove) keeps every byte it does not replace, and keeps holes as holes;
 * a partial shard is a miss, never a short read passed on, and so is a
 * shard in a hole (never zeros).
 *
 * The store is a directory of this test (the UCM layout, shard n of block
 * b holding tu_fill's bytes of (b, n)); the checks read the block file
 * itself besides the backend's loads. A hole in the middle needs a file
 * system that punches holes; that test skips without.
 */
#include "testpoint_i.h"
#include "testutil.h"

#include <shardfs/backend.h>

#include <criterion/criterion.h>
#include <dirent.h>
#include <linux/falloc.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARD (16u << 10)
#define BLOCK 3u

static struct {
    char store[128], file[512];
    struct sfs_backend *be;
    uint8_t buf[SHARD], want[SHARD];
} P;

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(p);
    return 0;
}

static void rm_tree(const char *dir)
{
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void setup(void)
{
    struct sfs_backend_params prm = {.shard_size = SHARD};
    char spec[256], err[256] = "";
    int e = 0;

    memset(&P, 0, sizeof(P));
    snprintf(P.store, sizeof(P.store), "%s", tu_path("store"));
    cr_assert_eq(tu_store_write(P.store, BLOCK, 1, 2, SHARD, NULL, NULL, false), 0);
    tu_store_path(P.store, BLOCK, P.file, sizeof(P.file));
    snprintf(spec, sizeof(spec), "posix:%s?direct=0", P.store);
    P.be = sfs_backend_open(spec, &prm, err, sizeof(err), &e);
    cr_assert_not_null(P.be, "open %s: %s (%d)", spec, err, e);
}

static void teardown(void)
{
    if (P.be)
        sfs_backend_close(P.be);
    rm_tree(P.store);
}

TestSuite(posix_shapes, .init = setup, .fini = teardown, .timeout = 30);

static off_t file_size(void)
{
    struct stat st;

    cr_assert_eq(stat(P.file, &st), 0, "stat %s: %s", P.file, strerror(errno));
    return st.st_size;
}

/* The file holds a hole (no data) from off to its end: false where the file
 * system does not report holes (then nothing can be said). */
static bool hole_from(off_t off, bool *known)
{
    int fd = open(P.file, O_RDONLY | O_CLOEXEC);
    off_t d;

    cr_assert_geq(fd, 0);
    d = lseek(fd, off, SEEK_DATA);
    *known = lseek(fd, 0, SEEK_HOLE) < file_size(); /* the file has a hole at all */
    close(fd);
    return d < 0 && errno == ENXIO;
}

/* Shard s lies wholly in a hole of the file (SEEK_DATA finds no data in
 * it; never where the file system does not report holes). */
static bool shard_in_hole(uint32_t s)
{
    int fd = open(P.file, O_RDONLY | O_CLOEXEC);
    off_t d;

    cr_assert_geq(fd, 0);
    d = lseek(fd, (off_t)s * SHARD, SEEK_DATA);
    close(fd);
    return d < 0 ? errno == ENXIO : d >= ((off_t)s + 1) * SHARD;
}

/* Shard s loads as version `neu` (tu_fill of (BLOCK + 1000, s)), old
 * (tu_fill of (BLOCK, s)) or zeros (zero); GAP: shard s is in a gap of the
 * file, a miss where it is a hole (and zeros where the file system has
 * written zeros for it instead). */
enum ver { OLD, NEU, ZERO, GAP };

static void assert_shard(uint32_t s, enum ver v, const char *when)
{
    static const char *name[] = {"old", "new", "zeros"};
    struct sfs_key k = tu_key(BLOCK, s), n = tu_key(BLOCK + 1000, s);
    int r = sfs_backend_load_sync(P.be, &k, P.buf, SHARD);
    bool present = true;

    if (v == GAP && shard_in_hole(s)) {
        cr_assert_eq(r, -ENOENT, "%s: load of shard %u in a hole: %d", when, s, r);
        cr_assert_eq(sfs_backend_exists(P.be, &k, 1, &present), 0);
        cr_assert_not(present, "%s: shard %u in a hole exists", when, s);
        return;
    }
    if (v == GAP)
        v = ZERO;

    cr_assert_eq(r, (int)SHARD, "%s: load of shard %u: %d", when, s, r);
    if (v == ZERO)
        memset(P.want, 0, SHARD);
    else
        tu_fill(v == OLD ? &k : &n, P.want, SHARD);
    cr_assert_eq(memcmp(P.buf, P.want, SHARD), 0, "%s: shard %u is not %s", when, s, name[v]);
}

static void dump_new(uint32_t s)
{
    struct sfs_key k = tu_key(BLOCK, s), n = tu_key(BLOCK + 1000, s);
    int r;

    tu_fill(&n, P.buf, SHARD);
    r = sfs_backend_dump_sync(P.be, &k, P.buf, SHARD);
    cr_assert_eq(r, (int)SHARD, "dump of shard %u: %d", s, r);
}

/* Shards 2 and 3 a hole (the file extended by truncate): a dump of shard 0
 * keeps shard 1's bytes and leaves 2 and 3 holes, which are misses; a
 * remove of shard 2 cuts the file to two shards. */
Test(posix_shapes, a_tail_of_holes_stays_holes_across_a_commit)
{
    struct sfs_block_id id = tu_block(BLOCK);
    struct sfs_key k2 = tu_key(BLOCK, 2);
    bool known = false, hole;

    cr_assert_eq(truncate(P.file, 4 * (off_t)SHARD), 0);
    cr_assert_eq(sfs_backend_shard_count(P.be, &id), 4);
    dump_new(0);
    assert_shard(0, NEU, "after the dump");
    assert_shard(1, OLD, "after the dump");
    assert_shard(2, GAP, "after the dump");
    assert_shard(3, GAP, "after the dump");
    cr_assert_eq(file_size(), 4 * (off_t)SHARD, "the commit changed the file's size");
    hole = hole_from(2 * (off_t)SHARD, &known);
    cr_assert(hole || !known, "the commit filled the tail of holes with data");

    cr_assert_eq(sfs_backend_remove(P.be, &k2), 0);
    cr_assert_eq(sfs_backend_shard_count(P.be, &id), 2);
    cr_assert_eq(file_size(), 2 * (off_t)SHARD);
    assert_shard(0, NEU, "after the remove");
    assert_shard(1, OLD, "after the remove");
}

/* A partial last shard (2.5 shards): it is a miss, not counted; a dump of
 * shard 0 keeps shard 1 and the partial bytes as they were. */
Test(posix_shapes, a_partial_last_shard_is_a_miss_and_kept_by_a_commit)
{
    static uint8_t tail[SHARD / 2], got[SHARD / 2];
    struct sfs_block_id id = tu_block(BLOCK);
    struct sfs_key k2 = tu_key(BLOCK, 2);
    bool present = true;
    int fd;

    memset(tail, 0xa5, sizeof(tail));
    fd = open(P.file, O_WRONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pwrite(fd, tail, sizeof(tail), 2 * (off_t)SHARD), (ssize_t)sizeof(tail));
    close(fd);
    cr_assert_eq(sfs_backend_shard_count(P.be, &id), 2);
    cr_assert_eq(sfs_backend_exists(P.be, &k2, 1, &present), 0);
    cr_assert_not(present, "a partial shard exists");
    cr_assert_eq(sfs_backend_load_sync(P.be, &k2, P.buf, SHARD), -ENOENT);

    dump_new(0);
    assert_shard(0, NEU, "after the dump");
    assert_shard(1, OLD, "after the dump");
    cr_assert_eq(file_size(), 2 * (off_t)SHARD + (off_t)sizeof(tail));
    fd = open(P.file, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pread(fd, got, sizeof(got), 2 * (off_t)SHARD), (ssize_t)sizeof(got));
    close(fd);
    cr_assert_eq(memcmp(got, tail, sizeof(tail)), 0, "the commit changed the partial shard");
}

/* A dump past the end (shard 4 of a two-shard block) leaves shards 2 and 3
 * as a gap (holes where the file system has them: misses), and the block's
 * file spans five shards. */
Test(posix_shapes, a_dump_past_the_end_leaves_a_gap_of_misses)
{
    struct sfs_block_id id = tu_block(BLOCK);
    bool known = false, hole;

    dump_new(4);
    cr_assert_eq(sfs_backend_shard_count(P.be, &id), 5);
    assert_shard(0, OLD, "after the dump");
    assert_shard(1, OLD, "after the dump");
    assert_shard(2, GAP, "after the dump");
    assert_shard(3, GAP, "after the dump");
    assert_shard(4, NEU, "after the dump");
    hole = hole_from(4 * (off_t)SHARD, &known);
    cr_assert_not(hole, "the new shard 4 is not data");
}

/* A hole between two shards of data (shard 1 punched out): a remove of
 * shard 2 keeps shard 0 and the hole, and cuts the file to two shards. */
Test(posix_shapes, a_remove_keeps_a_hole_before_the_cut)
{
    struct sfs_block_id id = tu_block(BLOCK);
    struct sfs_key k2 = tu_key(BLOCK, 2);
    bool known = false, hole;
    int fd;

    dump_new(2);
    fd = open(P.file, O_WRONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, SHARD, SHARD) < 0) {
        close(fd);
        cr_skip_test("the store's file system cannot punch holes: %s", strerror(errno));
    }
    close(fd);
    assert_shard(1, GAP, "after the punch");
    cr_assert_eq(sfs_backend_remove(P.be, &k2), 0);
    cr_assert_eq(sfs_backend_shard_count(P.be, &id), 2);
    cr_assert_eq(file_size(), 2 * (off_t)SHARD);
    assert_shard(0, OLD, "after the remove");
    assert_shard(1, GAP, "after the remove");
    hole = hole_from(SHARD, &known);
    cr_assert(hole || !known, "the remove filled the hole with data");
}

/* A file system without an in-kernel copy (copy_file_range answers -EXDEV,
 * -EOPNOTSUPP, ...: failed on demand at the "commit:copy" result point):
 * a commit copies the shards it keeps by read and write, every byte kept;
 * a copy that fails otherwise is not a commit. */
Test(posix_shapes, a_commit_without_an_in_kernel_copy_keeps_every_byte)
{
    static const int no_copy[] = {EXDEV, EOPNOTSUPP, ENOSYS, EINVAL};

    for (size_t i = 0; i < sizeof(no_copy) / sizeof(no_copy[0]); i++) {
        cr_assert_eq(sfs_testpoint_arm_fail("commit:copy", no_copy[i], 1000), 0);
        dump_new(i % 2);
        cr_assert_geq(sfs_testpoint_hits("commit:copy"), 1, "the commit copied nothing");
        sfs_testpoint_disarm_all();
        assert_shard(i % 2, NEU, "after a commit copied by hand");
        assert_shard((i + 1) % 2, i == 0 ? OLD : NEU, "the shard the commit kept");
    }
    cr_assert_eq(file_size(), 2 * (off_t)SHARD);
}

/* The copy of the committed file fails (-EIO: read as the file replaced
 * under the commit by another host): nothing was changed yet, so the
 * commit starts again; one that fails at every try is given up after the
 * stale-handle budget (3 s) with -EIO, the block file as it was and no
 * temporary left beside it. */
Test(posix_shapes, a_copy_that_fails_is_tried_again_then_given_up)
{
    char dir[600];
    DIR *d;
    struct dirent *de;
    int n = 0;

    cr_assert_eq(sfs_testpoint_arm_fail("commit:copy", EIO, 2), 0);
    dump_new(0);
    cr_assert_geq(sfs_testpoint_hits("commit:copy"), 3, "the commit was not tried again");
    sfs_testpoint_disarm_all();
    assert_shard(0, NEU, "after a copy that failed twice");
    assert_shard(1, OLD, "the shard that commit kept");

    cr_assert_eq(sfs_testpoint_arm_fail("commit:copy", EIO, 1u << 30), 0);
    struct sfs_key k = tu_key(BLOCK, 1), nk = tu_key(BLOCK + 1000, 1);
    tu_fill(&nk, P.buf, SHARD);
    cr_assert_eq(sfs_backend_dump_sync(P.be, &k, P.buf, SHARD), -EIO);
    sfs_testpoint_disarm_all();
    assert_shard(0, NEU, "after a commit given up");
    assert_shard(1, OLD, "the shard of the commit given up");
    cr_assert_eq(file_size(), 2 * (off_t)SHARD);
    snprintf(dir, sizeof(dir), "%s/data", P.store);
    d = opendir(dir);
    cr_assert_not_null(d);
    while ((de = readdir(d)))
        n += de->d_name[0] != '.';
    closedir(d);
    cr_assert_eq(n, 1, "%d files in the store's directory: a temporary was left", n);
}

/* Files in the store's block directory, the block file included. */
static int files_in_store(void)
{
    char dir[600];
    struct dirent *de;
    DIR *d;
    int n = 0;

    snprintf(dir, sizeof(dir), "%s/data", P.store);
    d = opendir(dir);
    cr_assert_not_null(d);
    while ((de = readdir(d)))
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

/* The rename of a commit fails: a stale handle (another host's rename
 * meanwhile) is renamed again and commits; any other error fails the dump
 * with it, the block file as it was and no temporary left; on a remote
 * store, nor the second name the commit linked for its record. */
Test(posix_shapes, a_rename_that_fails_is_tried_again_or_fails_the_dump)
{
    struct sfs_backend_params prm = {.shard_size = SHARD};
    char spec[256], err[256] = "";
    int e = 0;

    cr_assert_eq(sfs_testpoint_arm_fail("commit:rename", ESTALE, 2), 0);
    dump_new(0);
    cr_assert_eq(sfs_testpoint_hits("commit:rename"), 3, "a stale rename was not tried again");
    sfs_testpoint_disarm_all();
    assert_shard(0, NEU, "after a stale rename");
    assert_shard(1, OLD, "the shard that commit kept");

    for (int remote = 0; remote < 2; remote++) {
        struct sfs_key k = tu_key(BLOCK, 1), nk = tu_key(BLOCK + 1000, 1);

        if (remote) {
            sfs_backend_close(P.be);
            setenv("SHARDFS_POSIX_REMOTE", "1", 1);
            snprintf(spec, sizeof(spec), "posix:%s?direct=0", P.store);
            P.be = sfs_backend_open(spec, &prm, err, sizeof(err), &e);
            unsetenv("SHARDFS_POSIX_REMOTE");
            cr_assert_not_null(P.be, "open %s: %s (%d)", spec, err, e);
        }
        tu_fill(&nk, P.buf, SHARD);
        cr_assert_eq(sfs_testpoint_arm_fail("commit:rename", EIO, 1), 0);
        cr_assert_eq(sfs_backend_dump_sync(P.be, &k, P.buf, SHARD), -EIO);
        sfs_testpoint_disarm_all();
        assert_shard(1, OLD, "after a failed rename");
        cr_assert_eq(file_size(), 2 * (off_t)SHARD);
        /* The block file; on a remote store its lock file too (it stays). */
        cr_assert_eq(files_in_store(), 1 + remote, "a failed commit left files beside the block");
    }
}

/* A remove of a shard the store does not hold: past the block file's end,
 * or of a block with no file; -ENOENT, and the file as it was. A commit
 * in sync-open mode (no ring: the caller's thread commits) stores alike. */
Test(posix_shapes, a_remove_of_nothing_and_a_sync_commit)
{
    struct sfs_key k5 = tu_key(BLOCK, 5), other = tu_key(BLOCK + 7, 0);
    struct sfs_backend_params prm = {.shard_size = SHARD};
    char spec[256], err[256] = "";
    int e = 0;

    cr_assert_eq(sfs_backend_remove(P.be, &k5), -ENOENT);
    cr_assert_eq(sfs_backend_remove(P.be, &other), -ENOENT);
    cr_assert_eq(file_size(), 2 * (off_t)SHARD);
    assert_shard(0, OLD, "after a remove of nothing");
    assert_shard(1, OLD, "after a remove of nothing");

    sfs_backend_close(P.be);
    setenv("SHARDFS_POSIX_SYNC_OPEN", "1", 1);
    snprintf(spec, sizeof(spec), "posix:%s?direct=0", P.store);
    P.be = sfs_backend_open(spec, &prm, err, sizeof(err), &e);
    unsetenv("SHARDFS_POSIX_SYNC_OPEN");
    cr_assert_not_null(P.be, "open %s: %s (%d)", spec, err, e);
    dump_new(1);
    assert_shard(0, OLD, "the shard a sync commit kept");
    assert_shard(1, NEU, "after a sync commit");
}
