/* SPDX-License-Identifier: MIT */
/*
 * test_fs_pagecache.c - the kernel page cache never serves stale bytes of a
 * shard: with -o page_cache (reads served by the kernel's cache, kept
 * across opens) and in the default mode (direct_io), through a real mount.
 *
 * Each case reads a shard through a descriptor it keeps open (so, in the
 * page-cache mode, the kernel holds its pages: checked with the daemon's
 * read counter, which a second read must not move), then changes the key
 * and reads again, through the descriptor kept open and through a new one:
 *
 *   - a write of a whole new shard through the mount: the new bytes (the
 *     descriptor kept open, in the page-cache mode: the whole old version
 *     it read, see "one read(2), one version" below);
 *   - a dump of new bytes by a rank process (libshardfs-rank, attached
 *     through the mount): likewise;
 *   - an unlink through the mount: the name is ENOENT, and the descriptor
 *     kept open never returns the old bytes (of that shard, or of a later
 *     one the unlink dropped with it).
 *
 * In the page-cache mode each case fails when the daemon does not
 * invalidate the inode's pages before the change (pagecache.c). Needs
 * /dev/fuse and fusermount3; skips without.
 */
#include "fsfixture.h"
#include "testutil.h"

#include <shardfs/cache.h>
#include <shardfs/rank.h>

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD (64u << 10)
#define NEW   1000000u /* new bytes of (b, n): tu_fill of (NEW + b, n) */
#define BLOCK 11u

static struct {
    char store[128];
    struct fsfx fx;
    bool pc; /* the page-cache mode is on */
} P;

/* The daemon under test: the build's, or SHARDFS_TEST_DAEMON (CI points it
 * at a TSan build). */
static const char *daemon_bin(void)
{
    const char *e = getenv("SHARDFS_TEST_DAEMON");

    return e && *e ? e : SHARDFS_BIN;
}

static void setup(void)
{
    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3");
    snprintf(P.store, sizeof(P.store), "%s", tu_path("store"));
}

static void teardown(void)
{
    char cmd[300];

    if (P.fx.pid)
        fsfx_stop(&P.fx, true, 10.0);
    rmdir(P.fx.mnt);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", P.store, P.fx.log);
    if (system(cmd) != 0) {
        /* best effort */
    }
}

TestSuite(fs_pagecache, .init = setup, .fini = teardown);

static const char *shard_path(uint64_t b, uint32_t n)
{
    static __thread char buf[2][256];
    static __thread int i;
    char hex[SFS_BLOCK_HEX_LEN + 1];
    char *p = buf[i++ & 1];

    tu_block_hex(b, hex);
    snprintf(p, 256, "%s/block/%s/shard/%u", P.fx.mnt, hex, n);
    return p;
}

static void old_bytes(uint64_t b, uint32_t s, void *buf, size_t len, void *arg)
{
    struct sfs_key k = tu_key(b, s);

    (void)arg;
    tu_fill(&k, buf, len);
}

/* Block BLOCK with 4 shards of old bytes; mount it (page_cache: the mode). */
static void start(bool page_cache)
{
    const char *opts = page_cache ? "hugepages=off,shard_size=64K,capacity=4M,readahead=0,"
                                    "page_cache=1M"
                                  : "hugepages=off,shard_size=64K,capacity=4M,readahead=0";
    int st = 0, r;

    P.pc = page_cache;
    cr_assert_eq(tu_store_write(P.store, BLOCK, 1, 4, SHARD, old_bytes, NULL, false), 0);
    snprintf(P.fx.mnt, sizeof(P.fx.mnt), "%s", tu_path("mnt"));
    snprintf(P.fx.sock, sizeof(P.fx.sock), "%s", tu_path("sock"));
    snprintf(P.fx.log, sizeof(P.fx.log), "%s", tu_path("log"));
    P.fx.bin = daemon_bin();
    r = fsfx_start(&P.fx, P.store, opts, 10.0, &st);
    if (r == -ECHILD)
        cr_assert_fail("daemon exited before mounting (status %d), see %s", st, P.fx.log);
    cr_assert_eq(r, 0, "mount did not appear: %s", strerror(-r));
}

/* The value of the metric whose line starts with name (its trailing space
 * included) in /stats. */
static long long stat_named(const char *name)
{
    char path[256], line[512];
    long long v = -1;
    FILE *f;

    snprintf(path, sizeof(path), "%s/stats", P.fx.mnt);
    f = fopen(path, "re");
    cr_assert_not_null(f);
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, name, strlen(name)) == 0)
            v = atoll(line + strlen(name));
    fclose(f);
    return v;
}

/* shardfs_fs_reads_total: FUSE reads the daemon answered. */
static long long fs_reads(void)
{
    return stat_named("shardfs_fs_reads_total ");
}

enum version { V_OLD, V_NEW, V_OTHER, V_ERR };
static const char *vname[] = {"old", "new", "neither old nor new", "unreadable"};

/* A whole shard from fd at 0 (pread, in pieces if it must be). */
static enum version read_fd(int fd, uint64_t b, uint32_t s)
{
    static uint8_t buf[SHARD];
    struct sfs_key o = tu_key(b, s), n = tu_key(NEW + b, s);
    size_t got = 0;

    while (got < SHARD) {
        ssize_t r = pread(fd, buf + got, SHARD - got, (off_t)got);

        if (r <= 0)
            break;
        got += (size_t)r;
    }
    if (got != SHARD)
        return V_ERR;
    if (tu_check(&o, buf, SHARD) == -1)
        return V_OLD;
    if (tu_check(&n, buf, SHARD) == -1)
        return V_NEW;
    return V_OTHER;
}

static enum version read_path(uint64_t b, uint32_t s)
{
    int fd = open(shard_path(b, s), O_RDONLY | O_CLOEXEC);
    enum version v;

    if (fd < 0)
        return V_ERR;
    v = read_fd(fd, b, s);
    close(fd);
    return v;
}

/* Open shard s, read the old bytes and keep the descriptor. In the
 * page-cache mode, a second read must come from the kernel's cache (the
 * daemon answers no read): else the case would prove nothing. */
static int open_cached(uint32_t s)
{
    int fd = open(shard_path(BLOCK, s), O_RDONLY | O_CLOEXEC);
    long long before;
    enum version v;

    cr_assert_geq(fd, 0, "open %s: %s", shard_path(BLOCK, s), strerror(errno));
    v = read_fd(fd, BLOCK, s);
    cr_assert_eq(v, V_OLD, "first read of shard %u: %s", s, vname[v]);
    before = fs_reads();
    v = read_fd(fd, BLOCK, s);
    cr_assert_eq(v, V_OLD, "second read of shard %u: %s", s, vname[v]);
    v = read_path(BLOCK, s);
    cr_assert_eq(v, V_OLD, "read of shard %u through a new descriptor: %s", s, vname[v]);
    if (P.pc)
        cr_assert_eq(fs_reads(), before,
                     "page_cache: the kernel's cache did not serve the reads again");
    return fd;
}

/* Shard s reads as v through a new descriptor, and through the descriptor
 * kept open as v in the default mode, as the whole old version it read
 * (not the new bytes, nor a mix) in the page-cache mode. */
static void assert_reads(int fd, uint32_t s, enum version v, const char *when)
{
    enum version kept = read_fd(fd, BLOCK, s), fresh = read_path(BLOCK, s);
    enum version kv = P.pc ? V_OLD : v;

    cr_assert_eq(kept, kv, "%s: shard %u through the descriptor kept open: %s, not %s", when, s,
                 vname[kept], vname[kv]);
    cr_assert_eq(fresh, v, "%s: shard %u through a new descriptor: %s, not %s", when, s,
                 vname[fresh], vname[v]);
}

static void write_then_read(bool page_cache)
{
    static uint8_t buf[SHARD];
    struct sfs_key n = tu_key(NEW + BLOCK, 0);
    enum version v;
    int fd, wfd;

    start(page_cache);
    fd = open_cached(0);
    tu_fill(&n, buf, SHARD);
    wfd = open(shard_path(BLOCK, 0), O_WRONLY | O_TRUNC | O_CLOEXEC);
    cr_assert_geq(wfd, 0, "open for writing: %s", strerror(errno));
    cr_assert_eq(write(wfd, buf, SHARD), (ssize_t)SHARD);
    /* The open for writing may have dropped the kernel's pages (O_TRUNC
     * does): read the old bytes into it again before the store. */
    v = read_fd(fd, BLOCK, 0);
    cr_assert_eq(v, V_OLD, "before the store: %s", vname[v]);
    cr_assert_eq(close(wfd), 0, "the store: %s", strerror(errno));
    assert_reads(fd, 0, V_NEW, "after a write through the mount");
    close(fd);
    cr_assert_eq(fsfx_stop(&P.fx, false, 10.0), 0);
}

/* The rank process: attach through the mount, dump new bytes of (BLOCK, s). */
static int rank_dump_main(void *arg)
{
    static uint8_t buf[SHARD];
    uint32_t s = (uint32_t)(uintptr_t)arg;
    struct sfs_key n = tu_key(NEW + BLOCK, s);
    struct sfs_rank_config cfg;
    struct sfs_rank_entry e;
    struct sfs_task *t;
    struct sfs_rank *rk;
    char spec[256];
    int err = 0, st = -1;

    sfs_rank_config_init(&cfg);
    snprintf(spec, sizeof(spec), "posix:%s", P.store);
    cfg.mount_point = P.fx.mnt;
    cfg.backend = spec;
    cfg.copier = SFS_COPIER_HOST;
    cfg.key_timeout_ms = 5000;
    rk = sfs_rank_open(&cfg, &err);
    if (!rk)
        return 10;
    tu_fill(&n, buf, SHARD);
    e = (struct sfs_rank_entry){.block = tu_block(BLOCK), .shard = s, .addr = buf};
    if (sfs_rank_dump(rk, &e, 1, &t) != 0)
        return 11;
    if (sfs_rank_wait(t, 10000, &st) != 0)
        return 12;
    sfs_rank_task_free(t);
    sfs_rank_close(rk);
    return st == 0 ? 0 : 13;
}

static void dump_then_read(bool page_cache)
{
    int fd, r;

    start(page_cache);
    fd = open_cached(1);
    r = tu_wait(tu_fork(rank_dump_main, (void *)(uintptr_t)1));
    cr_assert_eq(r, 0, "the rank's dump failed (step %d)", r);
    assert_reads(fd, 1, V_NEW, "after a rank's dump");
    close(fd);
    cr_assert_eq(fsfx_stop(&P.fx, false, 10.0), 0);
}

static void unlink_then_lookup(bool page_cache)
{
    struct stat st;
    enum version v;
    int fd2, fd3;

    start(page_cache);
    fd2 = open_cached(2);
    fd3 = open_cached(3); /* a later shard: the unlink drops it too */
    cr_assert_eq(unlink(shard_path(BLOCK, 2)), 0, "unlink: %s", strerror(errno));
    cr_assert_eq(stat(shard_path(BLOCK, 2), &st), -1, "the unlinked name still exists");
    cr_assert_eq(errno, ENOENT);
    v = read_fd(fd2, BLOCK, 2);
    cr_assert_eq(v, V_ERR, "the unlinked shard, through the descriptor kept open: %s", vname[v]);
    v = read_fd(fd3, BLOCK, 3);
    cr_assert_eq(v, V_ERR, "the later shard unlink dropped, through its descriptor: %s", vname[v]);
    cr_assert_eq(read_path(BLOCK, 3), V_ERR, "the later shard still reads");
    close(fd2);
    close(fd3);
    cr_assert_eq(fsfx_stop(&P.fx, false, 10.0), 0);
}

Test(fs_pagecache, page_cache_write_then_read_gives_the_new_bytes, .timeout = 60)
{
    write_then_read(true);
}

Test(fs_pagecache, page_cache_dump_by_a_rank_then_read_gives_the_new_bytes, .timeout = 60)
{
    dump_then_read(true);
}

Test(fs_pagecache, page_cache_unlink_then_lookup_is_enoent_and_no_stale_bytes, .timeout = 60)
{
    unlink_then_lookup(true);
}

Test(fs_pagecache, default_write_then_read_gives_the_new_bytes, .timeout = 60)
{
    write_then_read(false);
}

Test(fs_pagecache, default_dump_by_a_rank_then_read_gives_the_new_bytes, .timeout = 60)
{
    dump_then_read(false);
}

Test(fs_pagecache, default_unlink_then_lookup_is_enoent_and_no_stale_bytes, .timeout = 60)
{
    unlink_then_lookup(false);
}

/* ---------------------------------------------------------------------------
 * One read(2), one version: readers of a shard read its first TORN_READ
 * bytes in a loop while a writer rewrites the whole shard through the mount;
 * every read must be of one version (each version is one byte value
 * throughout). The readers keep the shard open throughout (the case that
 * tore reads in the page-cache mode: 5 to 7 of 70,000-90,000 reads, page 0
 * old and the rest new, when a change invalidated the inode's pages in the
 * middle of a read(2)); in the page-cache mode half of them reopen it every
 * TORN_REOPEN reads and so read every version. The default mode keeps it with one FUSE request per
 * read (at most max_read bytes), answered from one slot under one lease; the page-cache mode by
 * versions (pagecache.c): a change retires the inode its open files read, and they go on reading
 * the version they read.
 */
#define TORN_SHARD   (256u << 10)
#define TORN_READ    (64u << 10)
#define TORN_READERS 6
#define TORN_WRITES  400
#define TORN_REOPEN  8

static struct {
    atomic_bool done;
    atomic_long reads, torn, errors, moved, ends;
    bool reopen; /* the odd readers reopen (the page-cache mode's case) */
    char path[256];
} T;

static void *torn_reader(void *arg)
{
    static __thread uint8_t buf[TORN_READ];
    bool reopen = T.reopen && (uintptr_t)arg % 2;
    int fd = -1, last = -1;
    long n = 0;

    while (!atomic_load(&T.done)) {
        ssize_t r;

        /* Half the readers keep the file open throughout, half reopen it
         * every TORN_REOPEN reads: in the page-cache mode a file kept open
         * reads the version it read first, and new opens meet every
         * version. */
        if (fd < 0 || (reopen && n++ % TORN_REOPEN == 0)) {
            if (fd >= 0)
                close(fd);
            fd = open(T.path, O_RDONLY | O_CLOEXEC);
            if (fd < 0) {
                if (atomic_fetch_add(&T.errors, 1) == 0)
                    fprintf(stderr, "open: %s\n", strerror(errno));
                return NULL;
            }
        }
        r = pread(fd, buf, TORN_READ, 0);
        if (r == 0) {
            /* Opened (cached) before a writer's O_TRUNC: the end of file
             * comes early while the rewrite is under way (docs/fs.md). */
            atomic_fetch_add(&T.ends, 1);
            continue;
        }
        if (r < 0) {
            if (atomic_fetch_add(&T.errors, 1) == 0)
                fprintf(stderr, "pread: %s\n", strerror(errno));
            continue;
        }
        if (buf[0] != last) {
            last = buf[0];
            atomic_fetch_add(&T.moved, 1);
        }
        for (ssize_t i = 1; i < r; i++) {
            if (buf[i] != buf[0]) {
                if (atomic_fetch_add(&T.torn, 1) == 0)
                    fprintf(stderr, "a read of %zd bytes: version %d up to byte %zd, then %d\n",
                            r, buf[0], i, buf[i]);
                break;
            }
        }
        atomic_fetch_add(&T.reads, 1);
    }
    close(fd);
    return NULL;
}

/* Store version v (every byte v) as the whole shard, through the mount. */
static int write_version(uint8_t v)
{
    static uint8_t buf[TORN_SHARD];
    int fd = open(T.path, O_WRONLY | O_TRUNC | O_CLOEXEC), r = 0;

    if (fd < 0)
        return -errno;
    memset(buf, v, sizeof(buf));
    if (write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf))
        r = -EIO;
    if (close(fd) < 0 && r == 0)
        r = -errno;
    return r;
}

static void version_1(uint64_t b, uint32_t s, void *buf, size_t len, void *arg)
{
    (void)b, (void)s, (void)arg;
    memset(buf, 1, len);
}

static void one_version_per_read(bool page_cache)
{
    const char *opts = page_cache ? "hugepages=off,shard_size=256K,capacity=8M,readahead=0,"
                                    "page_cache=2M"
                                  : "hugepages=off,shard_size=256K,capacity=8M,readahead=0";
    pthread_t th[TORN_READERS];
    int st = 0, r;

    /* Version 1 in the store: the readers open the shard before any
     * write through the mount (one opened while a write handle is open is
     * read direct, the page cache out of the case). */
    cr_assert_eq(tu_store_write(P.store, BLOCK, 1, 1, TORN_SHARD, version_1, NULL, false), 0);
    snprintf(P.fx.mnt, sizeof(P.fx.mnt), "%s", tu_path("mnt"));
    snprintf(P.fx.sock, sizeof(P.fx.sock), "%s", tu_path("sock"));
    snprintf(P.fx.log, sizeof(P.fx.log), "%s", tu_path("log"));
    P.fx.bin = daemon_bin();
    r = fsfx_start(&P.fx, P.store, opts, 10.0, &st);
    cr_assert_eq(r, 0, "mount: %s (status %d)", strerror(-r), st);
    snprintf(T.path, sizeof(T.path), "%s", shard_path(BLOCK, 0));
    atomic_store(&T.done, false);
    atomic_store(&T.reads, 0);
    atomic_store(&T.torn, 0);
    atomic_store(&T.errors, 0);
    atomic_store(&T.moved, 0);
    atomic_store(&T.ends, 0);
    T.reopen = page_cache; /* the default mode has one inode: as before */
    for (int i = 0; i < TORN_READERS; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, torn_reader, (void *)(uintptr_t)i), 0);
    while (atomic_load(&T.reads) < TORN_READERS) /* every reader open and reading */
        fsfx_sleep_ms(1);
    for (int w = 0; w < TORN_WRITES; w++) {
        r = write_version((uint8_t)(2 + w % 250));
        if (r < 0)
            break;
    }
    atomic_store(&T.done, true);
    for (int i = 0; i < TORN_READERS; i++)
        pthread_join(th[i], NULL);
    cr_assert_eq(r, 0, "a rewrite failed: %s", strerror(-r));
    cr_assert_eq(atomic_load(&T.errors), 0, "reads failed");
    if (!page_cache) /* direct_io: the size is the daemon's, never the kernel's */
        cr_assert_eq(atomic_load(&T.ends), 0, "reads found the end of file at 0");
    fprintf(stderr, "%s: %ld reads, %ld version changes, %ld early ends, %ld torn\n",
            page_cache ? "page cache" : "default", atomic_load(&T.reads), atomic_load(&T.moved),
            atomic_load(&T.ends), atomic_load(&T.torn));
    cr_assert_eq(atomic_load(&T.torn), 0, "%ld of %ld reads returned bytes of two versions",
                 atomic_load(&T.torn), atomic_load(&T.reads));
    cr_assert_gt(atomic_load(&T.reads), TORN_WRITES, "too few reads to tell");
    /* The readers went from version to version: they read while the
     * rewrites happened, not only before or after. */
    cr_assert_gt(atomic_load(&T.moved), TORN_WRITES / 4, "the readers saw %ld versions",
                 atomic_load(&T.moved));
    cr_assert_eq(fsfx_stop(&P.fx, false, 10.0), 0);
}

Test(fs_pagecache, page_cache_one_read_returns_one_version_under_rewrites, .timeout = 120)
{
    one_version_per_read(true);
}

Test(fs_pagecache, default_one_read_returns_one_version_under_rewrites, .timeout = 120)
{
    one_version_per_read(false);
}

/* More pins than the budget: the oldest are dropped (their pages with
 * them), and every shard still reads right. */
Test(fs_pagecache, page_cache_beyond_its_budget_still_reads_right, .timeout = 60)
{
    int st = 0, r;

    cr_assert_eq(tu_store_write(P.store, BLOCK, 1, 40, SHARD, old_bytes, NULL, false), 0);
    snprintf(P.fx.mnt, sizeof(P.fx.mnt), "%s", tu_path("mnt"));
    snprintf(P.fx.sock, sizeof(P.fx.sock), "%s", tu_path("sock"));
    snprintf(P.fx.log, sizeof(P.fx.log), "%s", tu_path("log"));
    P.fx.bin = daemon_bin();
    r = fsfx_start(&P.fx, P.store, "hugepages=off,shard_size=64K,capacity=4M,page_cache=256K", 10.0,
                   &st);
    cr_assert_eq(r, 0, "mount: %s (status %d)", strerror(-r), st);
    for (int pass = 0; pass < 3; pass++)
        for (uint32_t s = 0; s < 40; s++)
            cr_assert_eq(read_path(BLOCK, s), V_OLD, "pass %d shard %u", pass, s);
    /* 256K of 64K shards: the watcher brings the pins back to 4. */
    for (int i = 0; i < 300 && stat_named("shardfs_fs_page_cache_pinned_shards ") > 4; i++)
        usleep(10000);
    cr_assert_leq(stat_named("shardfs_fs_page_cache_pinned_shards "), 4, "pins above the budget");
    /* A rank's dump of the last one read is not held up for long. */
    r = tu_wait(tu_fork(rank_dump_main, (void *)(uintptr_t)39));
    cr_assert_eq(r, 0, "the rank's dump failed (step %d)", r);
    cr_assert_eq(read_path(BLOCK, 39), V_NEW);
    cr_assert_eq(fsfx_stop(&P.fx, false, 10.0), 0);
}

Test(fs_pagecache, page_cache_options_out_of_range_exit_1, .timeout = 30)
{
    static const char *bad[] = {"page_cache=lots", "page_cache=1K", "page_cache=3M"};

    cr_assert_eq(tu_store_write(P.store, BLOCK, 1, 1, SHARD, old_bytes, NULL, false), 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char o[256];
        int st = 0, r;

        snprintf(P.fx.mnt, sizeof(P.fx.mnt), "%s", tu_path("mnt"));
        snprintf(P.fx.sock, sizeof(P.fx.sock), "%s", tu_path("sock"));
        snprintf(P.fx.log, sizeof(P.fx.log), "%s", tu_path("log"));
        P.fx.bin = daemon_bin();
        snprintf(o, sizeof(o), "hugepages=off,shard_size=64K,capacity=4M,%s", bad[i]);
        r = fsfx_start(&P.fx, P.store, o, 10.0, &st);
        cr_assert_eq(r, -ECHILD, "%s: mounted", bad[i]);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "%s: status %d", bad[i], st);
    }
}
