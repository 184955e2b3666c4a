/* SPDX-License-Identifier: MIT */
/*
 * test_fs_refusals.c - what the mount refuses, and with which errno: the
 * tree changes that are not a shard's (mkdir, rmdir, rename, link, symlink,
 * unlink of /stats), the writes a shard file cannot take (past its end, an
 * open of /stats for writing, a fifo), truncate(2) and mknod(2) as whole
 * shards of their own, a store that cannot take the key's slot (a rank holds
 * it: EBUSY; every slot leased: EAGAIN), a load that fails an open for
 * update, and a stop with a shard half written (its bytes are lost, and the
 * log says so); and what it answers at its edges (one name per block and
 * shard, reads at a shard's end, the attributes' names).
 *
 * Each test mounts a small posix store (UCM layout, shard n of block b holds
 * tu_fill's bytes of (b, n)) with the daemon binary and checks every answer
 * through the mount with plain system calls, and the stored bytes in the
 * block file on disk. Needs /dev/fuse and fusermount3; skips without.
 */
#include "fsfixture.h"
#include "testutil.h"

#include <shardfs/cache.h>

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD (64u << 10)
#define BLOCK 7u
#define OTHER 9u

static struct {
    char store[128];
    struct fsfx fx;
} R;

static void start(const char *opts, const char *spec)
{
    char o[512];
    int st = 0, r;

    snprintf(R.fx.mnt, sizeof(R.fx.mnt), "%s", tu_path("mnt"));
    snprintf(R.fx.sock, sizeof(R.fx.sock), "%s", tu_path("sock"));
    snprintf(R.fx.log, sizeof(R.fx.log), "%s", tu_path("log"));
    R.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
    snprintf(o, sizeof(o), "hugepages=off,shard_size=64K,readahead=0%s%s", opts ? "," : "",
             opts ? opts : "");
    r = fsfx_start(&R.fx, spec ? spec : R.store, o, 10.0, &st);
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

TestSuite(fs_refusals, .init = setup, .fini = teardown, .timeout = 60);

static void store_write(uint64_t b, unsigned nshards)
{
    int r = tu_store_write(R.store, b, 1, nshards, SHARD, NULL, NULL, false);

    cr_assert_eq(r, 0, "store block %llu: %s", (unsigned long long)b, strerror(-r));
}

/* MNT/<rel>. */
static const char *at(const char *rel)
{
    static __thread char p[4][1024];
    static __thread unsigned i;
    char *s = p[i++ % 4];

    snprintf(s, sizeof(p[0]), "%s/%s", R.fx.mnt, rel);
    return s;
}

/* The call's result was -1 with errno e. */
#define REFUSED(call, e)                                                                           \
    do {                                                                                           \
        errno = 0;                                                                                 \
        int r_ = (call);                                                                           \
        int e_ = errno;                                                                            \
        cr_assert_eq(r_, -1, "%s succeeded", #call);                                               \
        cr_assert_eq(e_, (e), "%s: %s, not %s", #call, strerror(e_), strerror(e));                 \
    } while (0)

/* The bytes of shard s of block b, read through the mount (disk: false) or
 * from the block file (disk: true); exactly SHARD of them. */
static void read_shard(uint64_t b, uint32_t s, bool disk, uint8_t *buf)
{
    const char *path = disk ? fsfx_block_file(R.store, b) : fsfx_shard_path(&R.fx, b, s);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    size_t got = 0;

    cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
    while (got < SHARD) {
        ssize_t n = pread(fd, buf + got, SHARD - got, (disk ? (off_t)s * SHARD : 0) + (off_t)got);

        cr_assert_gt(n, 0, "read %s: %s", path, n < 0 ? strerror(errno) : "end of file");
        got += (size_t)n;
    }
    close(fd);
}

/* Shard (b, s) holds its old bytes up to `kept`, zeros after, through the
 * mount and on disk. */
static void assert_kept_then_zeros(uint64_t b, uint32_t s, size_t kept, const char *when)
{
    static uint8_t buf[SHARD], want[SHARD];
    struct sfs_key k = tu_key(b, s);

    tu_fill(&k, want, SHARD);
    memset(want + kept, 0, SHARD - kept);
    for (int disk = 0; disk < 2; disk++) {
        read_shard(b, s, disk, buf);
        cr_assert_eq(memcmp(buf, want, SHARD), 0, "%s: shard %u %s is not %zu old bytes then zeros",
                     when, s, disk ? "on disk" : "through the mount", kept);
    }
}

/* ---------------------------------------------------------------------------
 * The tree: only shards change.
 */

/* Each block and shard has one name: the block's lowercase hex and the
 * shard's decimal number without leading zeros. Another spelling of an
 * existing one (uppercase, a leading zero), a number past 32 bits or ten
 * digits, and names with other characters are ENOENT. */
Test(fs_refusals, a_block_or_shard_has_one_name)
{
    static const char *const shards[] = {"01", "00", "1x", "-1", "4294967296", "12345678901"};
    char hex[SFS_BLOCK_HEX_LEN + 1], p[256];
    struct stat st;

    store_write(BLOCK, 2);
    start(NULL, NULL);
    tu_block_hex(BLOCK, hex);
    snprintf(p, sizeof(p), "block/%s", hex);
    cr_assert_eq(stat(at(p), &st), 0, "the block's name: %s", strerror(errno));
    cr_assert_eq(stat(fsfx_shard_path(&R.fx, BLOCK, 1), &st), 0, "shard 1: %s", strerror(errno));
    {
        size_t l = strcspn(hex, "abcdef"); /* a letter: its uppercase is another name */
        const char other[] = {(char)(hex[l] - 'a' + 'A'), 'g', '-'};

        cr_assert_lt(l, (size_t)SFS_BLOCK_HEX_LEN, "no letter in %s", hex);
        for (size_t j = 0; j < sizeof(other); j++) {
            char alt[SFS_BLOCK_HEX_LEN + 1];

            memcpy(alt, hex, sizeof(alt));
            alt[l] = other[j];
            snprintf(p, sizeof(p), "block/%s", alt);
            REFUSED(stat(at(p), &st), ENOENT);
        }
    }
    for (size_t i = 0; i < sizeof(shards) / sizeof(shards[0]); i++) {
        snprintf(p, sizeof(p), "block/%s/shard/%s", hex, shards[i]);
        REFUSED(stat(at(p), &st), ENOENT);
    }
}

/* Directories exist by name alone (mkdir is EEXIST or ENOENT), /block is
 * not removable, a block directory with shards is not empty and one with
 * none "removes" (so rm -r works); names are keys (rename, link and symlink
 * are EPERM); /stats is not removable. /block lists the resident blocks,
 * sorted. Nothing changes in the store. */
Test(fs_refusals, tree_changes_other_than_a_shards_are_refused)
{
    char hex[SFS_BLOCK_HEX_LEN + 1], hex9[SFS_BLOCK_HEX_LEN + 1], hex8[SFS_BLOCK_HEX_LEN + 1];
    char blk[256], blk8[256], cmd[1024], out[256];
    static uint8_t buf[SHARD];

    store_write(BLOCK, 2);
    store_write(OTHER, 1);
    start("capacity=2M", NULL);
    tu_block_hex(BLOCK, hex);
    tu_block_hex(OTHER, hex9);
    tu_block_hex(8, hex8);
    snprintf(blk, sizeof(blk), "block/%s", hex);
    snprintf(blk8, sizeof(blk8), "block/%s", hex8);

    REFUSED(mkdir(at(blk), 0755), EEXIST);
    REFUSED(mkdir(at("block/not-a-block"), 0755), ENOENT);
    REFUSED(mkdir(at("elsewhere"), 0755), ENOENT);
    REFUSED(mkdir(fsfx_shard_path(&R.fx, BLOCK, 9), 0755), ENOENT);

    REFUSED(rmdir(at("block")), EBUSY);
    REFUSED(rmdir(at(blk)), ENOTEMPTY);
    REFUSED(rmdir(fsfx_shard_path(&R.fx, BLOCK, -1)), ENOTEMPTY);
    REFUSED(rmdir(at("stats")), ENOTDIR);
    /* A block with no shard: its directories "remove", and still exist. */
    cr_assert_eq(rmdir(fsfx_shard_path(&R.fx, 8, -1)), 0, "rmdir of an empty shard dir: %s",
                 strerror(errno));
    cr_assert_eq(rmdir(at(blk8)), 0, "rmdir of an empty block dir: %s", strerror(errno));

    REFUSED(rename(fsfx_shard_path(&R.fx, BLOCK, 0), fsfx_shard_path(&R.fx, BLOCK, 5)), EPERM);
    REFUSED(rename(fsfx_shard_path(&R.fx, BLOCK, 1), fsfx_shard_path(&R.fx, BLOCK, 0)), EPERM);
    REFUSED(link(fsfx_shard_path(&R.fx, BLOCK, 0), fsfx_shard_path(&R.fx, BLOCK, 5)), EPERM);
    REFUSED(symlink("0", fsfx_shard_path(&R.fx, BLOCK, 5)), EPERM);
    REFUSED(unlink(at("stats")), EACCES);

    /* Both blocks resident: /block lists them, sorted. */
    read_shard(OTHER, 0, false, buf);
    read_shard(BLOCK, 1, false, buf);
    read_shard(BLOCK, 0, false, buf);
    snprintf(out, sizeof(out), "%s", tu_path("ls"));
    snprintf(cmd, sizeof(cmd), "ls -f %s | grep -v '^\\.' > %s", at("block"), out);
    cr_assert_eq(fsfx_sh("%s", cmd), 0);
    snprintf(cmd, sizeof(cmd), "printf '%%s\\n%%s\\n' %s %s | sort | cmp -s - %s", hex, hex9, out);
    cr_assert_eq(fsfx_sh("%s", cmd), 0, "/block does not list the two resident blocks, sorted");
    unlink(out);

    assert_kept_then_zeros(BLOCK, 0, SHARD, "after the refusals");
    assert_kept_then_zeros(BLOCK, 1, SHARD, "after the refusals");
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}

/* Another host shrank the block file (its remove of shards 2 and 3): the
 * shards still resident are listed past the store's count, and unlinking
 * one drops it from the cache (the store has nothing to remove). A name the
 * kernel still knows whose shard is neither resident nor stored is
 * ENOENT. */
Test(fs_refusals, a_shard_dir_lists_resident_shards_the_store_lost)
{
    static uint8_t buf[SHARD];
    char out[256], cmd[1024];
    struct stat st;

    store_write(BLOCK, 4);
    store_write(OTHER, 1);
    start("capacity=2M,revalidate=0", NULL); /* the resident shards stay */
    for (uint32_t s = 0; s < 4; s++)
        read_shard(BLOCK, s, false, buf);
    cr_assert_eq(truncate(fsfx_block_file(R.store, BLOCK), 2 * (off_t)SHARD), 0);
    snprintf(out, sizeof(out), "%s", tu_path("ls"));
    snprintf(cmd, sizeof(cmd), "ls -f %s | grep -v '^\\.' | sort -n | tr '\\n' ' ' > %s",
             fsfx_shard_path(&R.fx, BLOCK, -1), out);
    cr_assert_eq(fsfx_sh("%s", cmd), 0);
    cr_assert_eq(fsfx_sh("grep -qx '0 1 2 3 ' %s", out), 0, "the listing is not 0 1 2 3");

    cr_assert_eq(unlink(fsfx_shard_path(&R.fx, BLOCK, 3)), 0, "unlink of a resident shard: %s",
                 strerror(errno));
    cr_assert_eq(fsfx_sh("%s", cmd), 0);
    cr_assert_eq(fsfx_sh("grep -qx '0 1 2 ' %s", out), 0, "the listing is not 0 1 2");
    cr_assert_eq(stat(fsfx_shard_path(&R.fx, BLOCK, 3), &st), -1, "shard 3 is still there");

    /* Known to the kernel (stat), then gone from the store, never resident. */
    cr_assert_eq(stat(fsfx_shard_path(&R.fx, OTHER, 0), &st), 0);
    cr_assert_eq(unlink(fsfx_block_file(R.store, OTHER)), 0);
    REFUSED(unlink(fsfx_shard_path(&R.fx, OTHER, 0)), ENOENT);
    unlink(out);
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}

/* ---------------------------------------------------------------------------
 * truncate(2) and mknod(2): whole shards of their own.
 */

/* truncate(2) with no open file rewrites the shard: its bytes up to the size
 * kept, zeros after (0: all zeros; the shard's size: unchanged); past the
 * shard's size is EFBIG, /stats is EACCES. mknod(2) of a regular file stores
 * a shard of zeros; of a fifo is EINVAL; outside a shard directory, ENOENT;
 * an open of /stats for writing is EACCES. */
Test(fs_refusals, truncate_and_mknod_store_whole_shards)
{
    static uint8_t buf[SHARD], zeros[SHARD];
    struct stat st;
    char hex[SFS_BLOCK_HEX_LEN + 1], p[512];

    store_write(BLOCK, 3);
    start("capacity=2M", NULL);
    REFUSED(truncate(at("stats"), 0), EACCES);
    REFUSED(open(at("stats"), O_WRONLY | O_CLOEXEC), EACCES);
    REFUSED(truncate(fsfx_shard_path(&R.fx, BLOCK, 0), SHARD + 1), EFBIG);
    cr_assert_eq(truncate(fsfx_shard_path(&R.fx, BLOCK, 0), SHARD), 0);
    assert_kept_then_zeros(BLOCK, 0, SHARD, "after truncate to the shard's size");
    cr_assert_eq(truncate(fsfx_shard_path(&R.fx, BLOCK, 0), 100), 0, "truncate: %s",
                 strerror(errno));
    assert_kept_then_zeros(BLOCK, 0, 100, "after truncate -s 100");
    cr_assert_eq(truncate(fsfx_shard_path(&R.fx, BLOCK, 1), 0), 0, "truncate: %s", strerror(errno));
    assert_kept_then_zeros(BLOCK, 1, 0, "after truncate -s 0");
    assert_kept_then_zeros(BLOCK, 2, SHARD, "a shard after the truncated ones");

    cr_assert_eq(mknod(fsfx_shard_path(&R.fx, BLOCK, 3), S_IFREG | 0644, 0), 0, "mknod: %s",
                 strerror(errno));
    cr_assert_eq(stat(fsfx_block_file(R.store, BLOCK), &st), 0);
    cr_assert_eq(st.st_size, 4 * (off_t)SHARD, "the block file holds %lld bytes, not 4 shards",
                 (long long)st.st_size);
    read_shard(BLOCK, 3, false, buf);
    cr_assert_eq(memcmp(buf, zeros, SHARD), 0, "mknod's shard is not zeros");
    read_shard(BLOCK, 3, true, buf);
    cr_assert_eq(memcmp(buf, zeros, SHARD), 0, "mknod's shard on disk is not zeros");
    REFUSED(mknod(fsfx_shard_path(&R.fx, BLOCK, 3), S_IFREG | 0644, 0), EEXIST);
    REFUSED(mknod(fsfx_shard_path(&R.fx, BLOCK, 4), S_IFIFO | 0644, 0), EINVAL);
    tu_block_hex(BLOCK, hex);
    snprintf(p, sizeof(p), "block/%s/file", hex);
    REFUSED(mknod(at(p), S_IFREG | 0644, 0), ENOENT);
    REFUSED(open(at(p), O_WRONLY | O_CREAT | O_CLOEXEC, 0644), ENOENT);
    cr_assert_eq(stat(fsfx_block_file(R.store, BLOCK), &st), 0);
    cr_assert_eq(st.st_size, 4 * (off_t)SHARD, "a refused mknod changed the store");
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}

/* ---------------------------------------------------------------------------
 * Writes through an open file.
 */

/* A write at the shard's end is EFBIG, one across it is short; fsync of a
 * part is ENODATA and stores nothing, of the whole shard stores it (on disk
 * before close); fsync of a reader has nothing to store. ftruncate after
 * writes zeroes the cut bytes and counts them written: the first half
 * written and the file cut there is a whole shard. */
Test(fs_refusals, writes_past_the_end_fsync_and_ftruncate)
{
    static uint8_t neu[SHARD], buf[SHARD], want[SHARD];
    struct sfs_key nk = tu_key(1000, 0);
    int fd, rd;

    store_write(BLOCK, 2);
    start("capacity=2M", NULL);
    tu_fill(&nk, neu, SHARD);
    fd = open(fsfx_shard_path(&R.fx, BLOCK, 0), O_WRONLY | O_TRUNC | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open: %s", strerror(errno));
    REFUSED((int)pwrite(fd, neu, 10, SHARD), EFBIG);
    memcpy(buf, neu + SHARD - 50, 50);
    cr_assert_eq(pwrite(fd, buf, 100, SHARD - 50), 50, "a write across the end");
    REFUSED(fsync(fd), ENODATA);
    assert_kept_then_zeros(BLOCK, 0, SHARD, "after fsync of a part");
    cr_assert_eq(pwrite(fd, neu, SHARD - 50, 0), (ssize_t)(SHARD - 50));
    cr_assert_eq(fsync(fd), 0, "fsync of a whole shard: %s", strerror(errno));
    read_shard(BLOCK, 0, true, buf);
    cr_assert_eq(memcmp(buf, neu, SHARD), 0, "fsync did not store the shard");
    cr_assert_eq(close(fd), 0);
    read_shard(BLOCK, 0, false, buf);
    cr_assert_eq(memcmp(buf, neu, SHARD), 0, "the mount does not serve the stored shard");

    rd = open(fsfx_shard_path(&R.fx, BLOCK, 1), O_RDONLY | O_CLOEXEC);
    cr_assert_geq(rd, 0);
    cr_assert_eq(fsync(rd), 0, "fsync of a reader: %s", strerror(errno));
    close(rd);

    fd = open(fsfx_shard_path(&R.fx, BLOCK, 1), O_WRONLY | O_TRUNC | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open: %s", strerror(errno));
    cr_assert_eq(pwrite(fd, neu, SHARD / 2, 0), (ssize_t)(SHARD / 2));
    cr_assert_eq(ftruncate(fd, SHARD / 4), 0, "ftruncate after writes: %s", strerror(errno));
    cr_assert_eq(close(fd), 0, "close after ftruncate: %s", strerror(errno));
    memcpy(want, neu, SHARD / 4);
    memset(want + SHARD / 4, 0, SHARD - SHARD / 4);
    read_shard(BLOCK, 1, true, buf);
    cr_assert_eq(memcmp(buf, want, SHARD), 0, "not the written quarter then zeros, on disk");
    read_shard(BLOCK, 1, false, buf);
    cr_assert_eq(memcmp(buf, want, SHARD), 0, "not the written quarter then zeros, mounted");
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}

/* ftruncate(2) of a file open for update before any write: below the
 * shard's size it is a whole shard of its own, stored at once (the kept
 * bytes, zeros after; a second cut stored at close); at the shard's size it
 * changes nothing. After writes
 * to a file that started empty (O_TRUNC), setting the shard's size makes
 * the bytes never written zeros (cp of a sparse file). Modes and times are
 * accepted and change nothing (touch, chmod; /stats too). */
Test(fs_refusals, ftruncate_before_writes_and_attributes_that_change_nothing)
{
    static uint8_t buf[SHARD], want[SHARD];
    struct sfs_key k2 = tu_key(BLOCK, 2);
    struct stat st;
    int fd;

    store_write(BLOCK, 3);
    start("capacity=2M", NULL);
    fd = open(fsfx_shard_path(&R.fx, BLOCK, 0), O_WRONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open: %s", strerror(errno));
    cr_assert_eq(ftruncate(fd, 100), 0, "ftruncate before writes: %s", strerror(errno));
    assert_kept_then_zeros(BLOCK, 0, 100, "ftruncate before writes, before close");
    /* A second cut is one after writes: the cut bytes are written zeros. */
    cr_assert_eq(ftruncate(fd, 50), 0, "a second ftruncate: %s", strerror(errno));
    cr_assert_eq(close(fd), 0, "close: %s", strerror(errno));
    assert_kept_then_zeros(BLOCK, 0, 50, "two ftruncates before writes");

    fd = open(fsfx_shard_path(&R.fx, BLOCK, 1), O_WRONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open: %s", strerror(errno));
    cr_assert_eq(ftruncate(fd, SHARD), 0, "ftruncate to the shard's size: %s", strerror(errno));
    cr_assert_eq(close(fd), 0, "close: %s", strerror(errno));
    assert_kept_then_zeros(BLOCK, 1, SHARD, "ftruncate to the shard's size");

    fd = open(fsfx_shard_path(&R.fx, BLOCK, 2), O_WRONLY | O_TRUNC | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open: %s", strerror(errno));
    tu_fill(&k2, want, 10);
    cr_assert_eq(pwrite(fd, want, 10, 0), 10);
    cr_assert_eq(ftruncate(fd, SHARD), 0, "ftruncate after writes: %s", strerror(errno));
    cr_assert_eq(close(fd), 0, "close after a sparse write: %s", strerror(errno));
    assert_kept_then_zeros(BLOCK, 2, 10, "a sparse write");

    cr_assert_eq(utimensat(AT_FDCWD, fsfx_shard_path(&R.fx, BLOCK, 2), NULL, 0), 0, "touch: %s",
                 strerror(errno));
    cr_assert_eq(chmod(fsfx_shard_path(&R.fx, BLOCK, 2), 0600), 0, "chmod: %s", strerror(errno));
    cr_assert_eq(stat(fsfx_shard_path(&R.fx, BLOCK, 2), &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0644, "a mode changed: %o", st.st_mode & 07777);
    cr_assert_eq(utimensat(AT_FDCWD, at("stats"), NULL, 0), 0, "touch /stats: %s", strerror(errno));
    read_shard(BLOCK, 2, true, buf);
    cr_assert(tu_all_bytes(buf + 10, SHARD - 10, 0), "touch or chmod changed the bytes");
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}

/* An open for update starts from the stored bytes: a load that fails fails
 * the open (EIO). A store that failed is final for ftruncate too. */
Test(fs_refusals, a_failed_load_or_store_fails_open_and_ftruncate)
{
    static uint8_t neu[SHARD];
    char spec[256];
    int fd, fd2;

    store_write(BLOCK, 2);
    snprintf(spec, sizeof(spec), "fault:seed=1:%s", R.store);
    start("capacity=2M", spec);
    cr_assert_eq(setxattr(R.fx.mnt, "user.shardfs.fault", "eio=1", 5, 0), 0);
    REFUSED(open(fsfx_shard_path(&R.fx, BLOCK, 0), O_WRONLY | O_CLOEXEC), EIO);
    REFUSED(open(fsfx_shard_path(&R.fx, BLOCK, 0), O_RDWR | O_CLOEXEC), EIO);

    memset(neu, 0x3c, sizeof(neu));
    fd = open(fsfx_shard_path(&R.fx, BLOCK, 1), O_WRONLY | O_TRUNC | O_CLOEXEC);
    cr_assert_geq(fd, 0, "a truncating open loads nothing: %s", strerror(errno));
    cr_assert_eq(pwrite(fd, neu, SHARD, 0), (ssize_t)SHARD);
    fd2 = dup(fd);
    REFUSED(close(fd2), EIO);
    cr_assert_eq(setxattr(R.fx.mnt, "user.shardfs.fault", "off", 3, 0), 0);
    REFUSED(ftruncate(fd, 10), EIO);
    REFUSED(close(fd), EIO);
    assert_kept_then_zeros(BLOCK, 1, SHARD, "after the failed store");
    assert_kept_then_zeros(BLOCK, 0, SHARD, "after the failed opens");
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}

/* ---------------------------------------------------------------------------
 * A store that cannot take the key's slot stores nothing.
 */

struct holder {
    int ready[2], go[2];
    bool fill_others; /* take two other keys as owner (the whole cache) */
};

/* A rank that holds a lease (on shard 0 of BLOCK, or on two other keys it
 * fills) until told. */
static int holder_main(struct sfs_cache *c, void *p)
{
    struct holder *h = p;
    struct sfs_key k[2] = {tu_key(BLOCK, 0), tu_key(200, 0)};
    struct sfs_lease l[2];
    int n = h->fill_others ? 2 : 1;
    char ch = 0;

    close(h->ready[0]);
    close(h->go[1]);
    if (h->fill_others) {
        k[0] = tu_key(201, 0);
        for (int i = 0; i < n; i++) {
            TU_CK(sfs_cache_get(c, &k[i], 0, 0, &l[i]) == SFS_OWNER);
            TU_CK(tu_publish(c, &k[i], &l[i]) == 0);
        }
    } else {
        TU_CK(sfs_cache_get(c, &k[0], 0, sfs_deadline_after(20ll * 1000 * 1000 * 1000), &l[0]) ==
              SFS_HIT);
    }
    TU_CK(write(h->ready[1], &ch, 1) == 1);
    TU_CK(read(h->go[0], &ch, 1) == 1);
    for (int i = 0; i < n; i++)
        sfs_cache_release(c, &l[i]);
    return 0;
}

static pid_t hold(struct holder *h, bool fill_others)
{
    char ch;
    pid_t kid;

    h->fill_others = fill_others;
    cr_assert_eq(pipe(h->ready), 0);
    cr_assert_eq(pipe(h->go), 0);
    kid = tu_fork_attached(R.fx.sock, 0, holder_main, h);
    close(h->ready[1]);
    close(h->go[0]);
    cr_assert_eq(read(h->ready[0], &ch, 1), 1, "the holder did not get its leases");
    return kid;
}

static void let_go(struct holder *h, pid_t kid)
{
    char ch = 0;

    cr_assert_eq(write(h->go[1], &ch, 1), 1);
    cr_assert_eq(tu_wait(kid), 0, "the holder failed");
    close(h->ready[0]);
    close(h->go[1]);
}

/* Write shard 0 of BLOCK whole with new bytes; close(2)'s errno (0: it
 * stored). */
static int write_whole(void)
{
    static uint8_t neu[SHARD];
    int fd = open(fsfx_shard_path(&R.fx, BLOCK, 0), O_WRONLY | O_TRUNC | O_CLOEXEC);

    cr_assert_geq(fd, 0, "open: %s", strerror(errno));
    memset(neu, 0x5e, sizeof(neu));
    cr_assert_eq(pwrite(fd, neu, SHARD, 0), (ssize_t)SHARD);
    errno = 0;
    return close(fd) == 0 ? 0 : errno;
}

/* A rank holds the shard's slot (a reader's lease) past the mount's
 * wait_timeout: the writer's close is EBUSY, and so are unlink and
 * truncate(2); nothing is stored. Once it lets go, the write stores. */
Test(fs_refusals, a_store_of_a_shard_a_rank_holds_is_ebusy)
{
    static uint8_t buf[SHARD];
    struct holder h;
    pid_t kid;
    int e;

    store_write(BLOCK, 1);
    start("capacity=2M,wait_timeout=1", NULL);
    read_shard(BLOCK, 0, false, buf); /* resident */
    kid = hold(&h, false);
    e = write_whole();
    cr_assert_eq(e, EBUSY, "close while a rank holds the shard: %s", strerror(e));
    REFUSED(unlink(fsfx_shard_path(&R.fx, BLOCK, 0)), EBUSY);
    REFUSED(truncate(fsfx_shard_path(&R.fx, BLOCK, 0), 0), EBUSY);
    assert_kept_then_zeros(BLOCK, 0, SHARD, "while a rank holds it");
    let_go(&h, kid);
    cr_assert_eq(write_whole(), 0, "close once the rank let go");
    read_shard(BLOCK, 0, true, buf);
    cr_assert(tu_all_bytes(buf, SHARD, 0x5e), "the store did not get the new bytes");
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}

/* Every slot leased (two slots, both held by a rank) past wait_timeout: a
 * store has no slot to take and is EAGAIN, as a read is; nothing is stored
 * around the cache. An open for update reads its starting bytes around
 * it. */
Test(fs_refusals, a_store_with_every_slot_leased_is_eagain)
{
    struct holder h;
    pid_t kid;
    int e;

    store_write(BLOCK, 1);
    start("capacity=128K,reserved=0,wait_timeout=1", NULL);
    kid = hold(&h, true);
    e = write_whole();
    cr_assert_eq(e, EAGAIN, "close with every slot leased: %s", strerror(e));
    REFUSED(mknod(fsfx_shard_path(&R.fx, BLOCK, 1), S_IFREG | 0644, 0), EAGAIN);
    /* An open for update still starts from the stored bytes, read around
     * the cache (only into its own buffer); closed unwritten, it stores
     * nothing. */
    {
        static uint8_t got[SHARD], want[SHARD];
        struct sfs_key k = tu_key(BLOCK, 0);
        int fd = open(fsfx_shard_path(&R.fx, BLOCK, 0), O_RDWR | O_CLOEXEC);

        cr_assert_geq(fd, 0, "an open for update with every slot leased: %s", strerror(errno));
        tu_fill(&k, want, SHARD);
        cr_assert_eq(pread(fd, got, SHARD, 0), (ssize_t)SHARD);
        cr_assert_eq(memcmp(got, want, SHARD), 0, "the open did not start from the stored bytes");
        cr_assert_eq(close(fd), 0, "close of an unwritten file: %s", strerror(errno));
    }
    let_go(&h, kid);
    assert_kept_then_zeros(BLOCK, 0, SHARD, "after the refused store");
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}

/* ---------------------------------------------------------------------------
 * A stop with a shard half written.
 */

/* The daemon is stopped (SIGTERM) while a file holds half a shard, never
 * flushed: nothing is stored, and the log says the bytes are lost. */
Test(fs_refusals, a_stop_with_a_shard_half_written_says_its_bytes_are_lost)
{
    static uint8_t neu[SHARD];
    int fd;

    store_write(BLOCK, 1);
    start("capacity=2M", NULL);
    fd = open(fsfx_shard_path(&R.fx, BLOCK, 0), O_WRONLY | O_TRUNC | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open: %s", strerror(errno));
    memset(neu, 0x11, sizeof(neu));
    cr_assert_eq(pwrite(fd, neu, SHARD / 2, 0), (ssize_t)(SHARD / 2));
    /* SIGTERM, not an unmount first: fusermount3 would inherit the
     * descriptor, and its close (a FLUSH) tells the writer ENODATA. */
    cr_assert_eq(kill(R.fx.pid, SIGTERM), 0);
    cr_assert_eq(tu_wait_for(R.fx.pid, 10ll * 1000 * 1000 * 1000), 0, "the daemon's exit status");
    R.fx.pid = 0;
    cr_assert_eq(fsfx_log_lines_with(&R.fx, "bytes not yet stored are lost"), 1,
                 "the log does not say the half-written shard was lost");
    close(fd);
    {
        static uint8_t buf[SHARD], want[SHARD];
        struct sfs_key k = tu_key(BLOCK, 0);

        tu_fill(&k, want, SHARD);
        read_shard(BLOCK, 0, true, buf);
        cr_assert_eq(memcmp(buf, want, SHARD), 0, "the half-written shard reached the store");
    }
}

/* ---------------------------------------------------------------------------
 * The edges: reads at a shard's end, the attributes' names.
 */

/* A read past a shard's end answers nothing, one across it the bytes up to
 * the end: through a reader's file and through one open for update (which
 * reads what it holds). A read of /stats past its text answers nothing. */
Test(fs_refusals, reads_at_the_end_of_a_shard)
{
    static uint8_t buf[256], want[SHARD];
    struct sfs_key k = tu_key(BLOCK, 0);
    int fd;

    store_write(BLOCK, 1);
    start("capacity=2M", NULL);
    tu_fill(&k, want, SHARD);
    for (int rw = 0; rw < 2; rw++) {
        fd = open(fsfx_shard_path(&R.fx, BLOCK, 0), (rw ? O_RDWR : O_RDONLY) | O_CLOEXEC);
        cr_assert_geq(fd, 0, "open: %s", strerror(errno));
        cr_assert_eq(pread(fd, buf, sizeof(buf), SHARD + 10), 0, "a read past the end");
        cr_assert_eq(pread(fd, buf, sizeof(buf), SHARD - 10), 10, "a read across the end");
        cr_assert_eq(memcmp(buf, want + SHARD - 10, 10), 0, "the last 10 bytes");
        cr_assert_eq(close(fd), 0, "close: %s", strerror(errno));
    }
    fd = open(at("stats"), O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pread(fd, buf, sizeof(buf), 1 << 20), 0, "a read of /stats past its text");
    close(fd);
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}

/* listxattr names what getxattr answers (the root's socket, a shard's
 * state; nothing for a block), and is ERANGE for a buffer too small; the
 * mount's own attributes cannot be removed (ENOTSUP), others are absent
 * (ENODATA); a bad pin value, touch or prefetch value, a fault spec too long
 * or on a store without faults, are EINVAL; an attribute set where it is
 * not one is ENOTSUP. */
Test(fs_refusals, the_attributes_names_and_their_refusals)
{
    char names[256], blk[256], hex[SFS_BLOCK_HEX_LEN + 1], big[300];
    const char *shard;

    store_write(BLOCK, 1);
    start("capacity=2M", NULL);
    tu_block_hex(BLOCK, hex);
    snprintf(blk, sizeof(blk), "block/%s", hex);
    shard = fsfx_shard_path(&R.fx, BLOCK, 0);

    cr_assert_eq(listxattr(R.fx.mnt, NULL, 0), (ssize_t)sizeof(SFS_XATTR_SOCKET));
    cr_assert_eq(listxattr(R.fx.mnt, names, sizeof(names)), (ssize_t)sizeof(SFS_XATTR_SOCKET));
    cr_assert_str_eq(names, SFS_XATTR_SOCKET);
    REFUSED((int)listxattr(R.fx.mnt, names, 4), ERANGE);
    cr_assert_eq(listxattr(shard, names, sizeof(names)), (ssize_t)sizeof(SFS_XATTR_STATE));
    cr_assert_str_eq(names, SFS_XATTR_STATE);
    cr_assert_eq(listxattr(at(blk), names, sizeof(names)), 0, "a block lists attributes");

    REFUSED(removexattr(at(blk), SFS_XATTR_PIN), ENOTSUP);
    REFUSED(removexattr(shard, SFS_XATTR_STATE), ENOTSUP);
    REFUSED(removexattr(shard, "user.other"), ENODATA);

    REFUSED(setxattr(at(blk), SFS_XATTR_PIN, "", 0, 0), EINVAL);
    REFUSED(setxattr(at(blk), SFS_XATTR_PIN, "1x", 2, 0), EINVAL);
    REFUSED(setxattr(at(blk), SFS_XATTR_PIN, "\n", 1, 0), EINVAL);
    REFUSED(setxattr(at(blk), SFS_XATTR_PIN, "12345678901", 11, 0), EINVAL);
    cr_assert_eq(setxattr(at(blk), SFS_XATTR_PIN, "0\n", 2, 0), 0, "unpin with a newline: %s",
                 strerror(errno));
    REFUSED(setxattr(at(blk), SFS_XATTR_PIN, "9999999999", 10, 0), EINVAL); /* past the most */
    memset(big, 'x', sizeof(big));
    REFUSED(setxattr(R.fx.mnt, "user.shardfs.fault", big, sizeof(big), 0), EINVAL);
    /* Not a fault store: its spec is refused, "off" with a newline too. */
    REFUSED(setxattr(R.fx.mnt, "user.shardfs.fault", "off\n", 4, 0), EINVAL);

    /* touch and prefetch take "1", with an optional newline, only. */
    cr_assert_eq(setxattr(at(blk), SFS_XATTR_TOUCH, "1\n", 2, 0), 0, "%s", strerror(errno));
    cr_assert_eq(setxattr(at(blk), SFS_XATTR_PREFETCH, "1\n", 2, 0), 0, "%s", strerror(errno));
    REFUSED(setxattr(at(blk), SFS_XATTR_TOUCH, "2", 1, 0), EINVAL);
    REFUSED(setxattr(at(blk), SFS_XATTR_TOUCH, "1x", 2, 0), EINVAL);
    REFUSED(setxattr(at(blk), SFS_XATTR_PREFETCH, "0\n", 2, 0), EINVAL);
    REFUSED(setxattr(at(blk), SFS_XATTR_PREFETCH, "11\n", 3, 0), EINVAL);
    /* Each name where it is not one: not supported there. */
    REFUSED(setxattr(shard, SFS_XATTR_TOUCH, "1", 1, 0), ENOTSUP);
    REFUSED(setxattr(at(blk), "user.shardfs.fault", "off", 3, 0), ENOTSUP);
    REFUSED(setxattr(shard, "user.other", "1", 1, 0), ENOTSUP);
    REFUSED((int)getxattr(at(blk), SFS_XATTR_SOCKET, names, sizeof(names)), ENODATA);
    for (size_t i = 0; i < 4; i++) {
        static const char *const ours[] = {SFS_XATTR_TOUCH, SFS_XATTR_PREFETCH, SFS_XATTR_PIN,
                                           SFS_XATTR_SOCKET};

        REFUSED(removexattr(i == 3 ? R.fx.mnt : at(blk), ours[i]), ENOTSUP);
    }
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}

static int cmp_ino(const void *a, const void *b)
{
    ino_t x = *(const ino_t *)a, y = *(const ino_t *)b;

    return x < y ? -1 : x > y;
}

/* More names than the inode table's first size (2048 nodes): every shard
 * of a block of 2600 gets an inode number of its own, and keeps it while
 * the table grows under it. */
Test(fs_refusals, thousands_of_names_keep_distinct_inode_numbers)
{
    enum { N = 2600 };
    static ino_t ino[N], sorted[N];
    struct stat st;
    int r;

    r = tu_store_write(R.store, BLOCK, 1, N, 512, NULL, NULL, false);
    cr_assert_eq(r, 0, "store: %s", strerror(-r));
    start("shard_size=512,capacity=2M", NULL);
    for (uint32_t s = 0; s < N; s++) {
        cr_assert_eq(stat(fsfx_shard_path(&R.fx, BLOCK, s), &st), 0, "stat shard %u: %s", s,
                     strerror(errno));
        ino[s] = st.st_ino;
    }
    memcpy(sorted, ino, sizeof(ino));
    qsort(sorted, N, sizeof(sorted[0]), cmp_ino);
    for (int i = 1; i < N; i++)
        cr_assert_neq(sorted[i], sorted[i - 1], "two shards share inode %llu",
                      (unsigned long long)sorted[i]);
    for (uint32_t s = 0; s < N; s++) {
        cr_assert_eq(stat(fsfx_shard_path(&R.fx, BLOCK, s), &st), 0);
        cr_assert_eq(st.st_ino, ino[s], "shard %u changed inode number", s);
    }
    cr_assert_eq(fsfx_stop(&R.fx, false, 10.0), 0);
}
