/* SPDX-License-Identifier: MIT */
/*
 * test_posix_direct.c - the posix backend's default read mode: O_DIRECT where
 * the store's file system allows it (detected at the first open), buffered
 * otherwise with exactly one logged line per backend; direct=0 stays
 * buffered.
 *
 * Whether a load went O_DIRECT is seen from outside: a block file dropped
 * from the page cache (fsync + POSIX_FADV_DONTNEED) and then read O_DIRECT
 * has no page resident afterwards (mincore), while a buffered read leaves
 * its pages in the cache. That needs a disk file system (tmpfs pages are
 * always resident): the store goes under /var/tmp, and the test is skipped
 * where /var/tmp is tmpfs or cannot drop its pages. The fallback needs a file
 * system without O_DIRECT: ramfs (tmpfs has O_DIRECT since Linux 6.6),
 * mounted here (root); skipped where mount is not allowed. A touch (the
 * readahead hint) reads nothing while loads are O_DIRECT: they would read
 * the device a second time; for buffered loads (direct=0) it reads ahead.
 * Both ring mode and sync mode (SHARDFS_POSIX_SYNC_OPEN=1) are covered.
 */
#include "testutil.h"

#include <shardfs/backend.h>

#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/magic.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <syslog.h>
#include <unistd.h>

#define SHARD   (64u * 1024)
#define NSHARDS 4u
#define NBLOCKS 6u

static atomic_int direct_lines; /* log lines that name O_DIRECT */
static atomic_int all_lines;

static void count_log(int level, const char *msg, void *arg)
{
    (void)level;
    (void)arg;
    /* Relaxed: read after the backend is closed (its threads joined). */
    atomic_fetch_add_explicit(&all_lines, 1, memory_order_relaxed);
    if (strstr(msg, "O_DIRECT"))
        atomic_fetch_add_explicit(&direct_lines, 1, memory_order_relaxed);
}

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

/* Pages of the block file resident in the page cache, or -1. */
static long resident_pages(const char *file)
{
    struct stat st;
    long n = 0;
    unsigned char *vec;
    size_t pages;
    void *m;
    int fd = open(file, O_RDONLY | O_CLOEXEC);

    if (fd < 0 || fstat(fd, &st) < 0 || st.st_size == 0)
        return -1;
    m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return -1;
    pages = ((size_t)st.st_size + 4095) / 4096;
    vec = calloc(pages, 1);
    if (vec && mincore(m, (size_t)st.st_size, vec) == 0)
        for (size_t i = 0; i < pages; i++)
            n += vec[i] & 1;
    else
        n = -1;
    free(vec);
    munmap(m, (size_t)st.st_size);
    return n;
}

static void drop_file(const char *file)
{
    int fd = open(file, O_RDONLY | O_CLOEXEC);

    cr_assert(fd >= 0, "open %s: %s", file, strerror(errno));
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* Load every shard of the store with spec, check its bytes. */
static void load_all(const char *spec)
{
    struct sfs_backend_params prm = {.shard_size = SHARD};
    char err[256] = "";
    int e = 0;
    struct sfs_backend *be = sfs_backend_open(spec, &prm, err, sizeof(err), &e);
    void *buf = aligned_alloc(4096, SHARD);

    cr_assert(be, "open %s: %s (%d)", spec, err, e);
    cr_assert(buf);
    for (uint64_t b = 0; b < NBLOCKS; b++)
        for (uint32_t s = 0; s < NSHARDS; s++) {
            struct sfs_key k = tu_key(b, s);

            memset(buf, 0, SHARD);
            cr_assert_eq(sfs_backend_load_sync(be, &k, buf, SHARD), (int)SHARD,
                         "block %llu shard %u", (unsigned long long)b, s);
            cr_assert_eq(tu_check(&k, buf, SHARD), -1, "block %llu shard %u: wrong bytes",
                         (unsigned long long)b, s);
        }
    sfs_backend_close(be);
    free(buf);
}

/* The store under /var/tmp, dropped from the page cache; NULL (skipped) where
 * that cannot show whether a read was O_DIRECT. */
static const char *disk_store(char *dir, size_t len)
{
    struct statfs sf;
    char file[512];

    snprintf(dir, len, "/var/tmp/sfs-posix-direct-%d-%x", getpid(), (unsigned)sfs_now_ns());
    if (statfs("/var/tmp", &sf) < 0 || sf.f_type == TMPFS_MAGIC || sf.f_type == RAMFS_MAGIC)
        return NULL;
    cr_assert_eq(tu_store_write(dir, 0, NBLOCKS, NSHARDS, SHARD, NULL, NULL, true), 0);
    for (uint64_t b = 0; b < NBLOCKS; b++) {
        tu_store_path(dir, b, file, sizeof(file));
        drop_file(file);
        if (resident_pages(file) != 0) {
            rm_tree(dir);
            return NULL;
        }
    }
    return dir;
}

static long resident_total(const char *dir)
{
    char file[512];
    long n = 0;

    for (uint64_t b = 0; b < NBLOCKS; b++) {
        tu_store_path(dir, b, file, sizeof(file));
        n += resident_pages(file);
    }
    return n;
}

static void default_direct_on_disk(bool sync_open)
{
    char dir[256], spec[300];

    if (sync_open)
        setenv("SHARDFS_POSIX_SYNC_OPEN", "1", 1);
    if (!disk_store(dir, sizeof(dir)))
        cr_skip_test("/var/tmp cannot show a read's page-cache footprint (tmpfs?)");
    atomic_store(&direct_lines, 0);
    sfs_set_log(count_log, NULL, LOG_DEBUG);
    snprintf(spec, sizeof(spec), "posix:%s", dir);
    load_all(spec);
    sfs_set_log(NULL, NULL, 0);
    cr_expect_eq(resident_total(dir), 0, "the default spec read through the page cache");
    cr_expect_eq(atomic_load(&direct_lines), 0, "a fallback was logged on a disk");

    /* direct=0 still reads buffered: its pages stay in the cache. */
    snprintf(spec, sizeof(spec), "posix:%s?direct=0", dir);
    load_all(spec);
    cr_expect_gt(resident_total(dir), 0, "direct=0 did not read through the page cache");
    rm_tree(dir);
    unsetenv("SHARDFS_POSIX_SYNC_OPEN");
}

Test(posix_direct, default_is_o_direct_on_disk_ring, .timeout = 60)
{
    default_direct_on_disk(false);
}

Test(posix_direct, default_is_o_direct_on_disk_sync, .timeout = 60)
{
    default_direct_on_disk(true);
}

static void fallback_on_ramfs(bool sync_open)
{
    char mnt[256], spec[300];

    snprintf(mnt, sizeof(mnt), "%s", tu_path("ramfs"));
    cr_assert_eq(mkdir(mnt, 0700), 0);
    if (mount("sfs-test", mnt, "ramfs", 0, NULL) < 0) {
        rmdir(mnt);
        cr_skip_test("cannot mount ramfs: %s", strerror(errno));
    }
    if (sync_open)
        setenv("SHARDFS_POSIX_SYNC_OPEN", "1", 1);
    cr_assert_eq(tu_store_write(mnt, 0, NBLOCKS, NSHARDS, SHARD, NULL, NULL, false), 0);
    atomic_store(&direct_lines, 0);
    atomic_store(&all_lines, 0);
    sfs_set_log(count_log, NULL, LOG_DEBUG);
    snprintf(spec, sizeof(spec), "posix:%s", mnt);
    load_all(spec); /* NBLOCKS block files, each opened O_DIRECT first */
    cr_expect_eq(atomic_load(&direct_lines), 1, "the fallback was logged %d times, not once",
                 atomic_load(&direct_lines));
    cr_expect_eq(atomic_load(&all_lines), 1);

    /* direct=0 never tries, so never logs. */
    atomic_store(&direct_lines, 0);
    snprintf(spec, sizeof(spec), "posix:%s?direct=0", mnt);
    load_all(spec);
    sfs_set_log(NULL, NULL, 0);
    cr_expect_eq(atomic_load(&direct_lines), 0);
    unsetenv("SHARDFS_POSIX_SYNC_OPEN");
    umount2(mnt, MNT_DETACH);
    rmdir(mnt);
}

Test(posix_direct, fallback_logged_once_ring, .timeout = 60)
{
    fallback_on_ramfs(false);
}

Test(posix_direct, fallback_logged_once_sync, .timeout = 60)
{
    fallback_on_ramfs(true);
}

/* Touch every block with spec, close (the ring's ops drained), count the
 * pages the touch brought into the page cache. */
static long touch_footprint(const char *dir, const char *spec)
{
    struct sfs_backend_params prm = {.shard_size = SHARD};
    struct sfs_block_id ids[NBLOCKS];
    char err[256] = "";
    int e = 0;
    struct sfs_backend *be = sfs_backend_open(spec, &prm, err, sizeof(err), &e);

    cr_assert(be, "open %s: %s (%d)", spec, err, e);
    for (uint64_t b = 0; b < NBLOCKS; b++)
        ids[b] = tu_block(b);
    cr_assert_eq(sfs_backend_touch(be, ids, NBLOCKS), 0);
    sfs_backend_close(be);
    /* FADVISE(WILLNEED) starts readahead, which may bring its pages in a
     * little later: look for them for up to a second (a touch that reads
     * nothing waits the whole second). */
    for (int i = 0; i < 50; i++) {
        long n = resident_total(dir);

        if (n != 0)
            return n;
        usleep(20000);
    }
    return 0;
}

static void touch_direct(bool sync_open)
{
    char dir[256], spec[300];

    if (sync_open)
        setenv("SHARDFS_POSIX_SYNC_OPEN", "1", 1);
    if (!disk_store(dir, sizeof(dir)))
        cr_skip_test("/var/tmp cannot show a read's page-cache footprint (tmpfs?)");
    snprintf(spec, sizeof(spec), "posix:%s", dir);
    cr_expect_eq(touch_footprint(dir, spec), 0, "a touch read ahead for O_DIRECT loads");

    rm_tree(dir);
    unsetenv("SHARDFS_POSIX_SYNC_OPEN");
}

Test(posix_direct, touch_reads_nothing_for_o_direct_ring, .timeout = 60)
{
    touch_direct(false);
}

Test(posix_direct, touch_reads_nothing_for_o_direct_sync, .timeout = 60)
{
    touch_direct(true);
}

/* Buffered loads (direct=0) are what a touch is for: it reads the blocks
 * ahead into the page cache (the ring's open, check, FADVISE and close).
 * A block that is absent, or a FIFO in a block file's place, is skipped:
 * the touch still answers 0 at once, and the backend's close does not wait
 * on the FIFO (opened non-blocking, refused at the check). */
Test(posix_direct, touch_reads_ahead_for_buffered_loads, .timeout = 60)
{
    struct sfs_backend_params prm = {.shard_size = SHARD};
    struct sfs_block_id ids[2] = {tu_block(NBLOCKS), tu_block(NBLOCKS + 1)};
    char dir[256], spec[300], fifo[512], err[256] = "";
    struct sfs_backend *be;
    struct stat st;
    int e = 0;

    if (!disk_store(dir, sizeof(dir)))
        cr_skip_test("/var/tmp cannot show a read's page-cache footprint (tmpfs?)");
    snprintf(spec, sizeof(spec), "posix:%s?direct=0", dir);
    cr_expect_gt(touch_footprint(dir, spec), 0, "a touch read nothing ahead for buffered loads");

    tu_store_path(dir, NBLOCKS, fifo, sizeof(fifo));
    cr_assert_eq(mkfifo(fifo, 0644), 0, "mkfifo %s: %s", fifo, strerror(errno));
    be = sfs_backend_open(spec, &prm, err, sizeof(err), &e);
    cr_assert(be, "open %s: %s (%d)", spec, err, e);
    cr_assert_eq(sfs_backend_touch(be, ids, 2), 0, "a touch of a FIFO and an absent block");
    sfs_backend_close(be);
    cr_assert_eq(lstat(fifo, &st), 0);
    cr_assert(S_ISFIFO(st.st_mode), "the FIFO was replaced");
    rm_tree(dir);
}
