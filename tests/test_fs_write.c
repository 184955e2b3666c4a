/* SPDX-License-Identifier: MIT */
/*
 * test_fs_write.c - writing shards through a real mount: a shard is replaced
 * only by a whole new shard, a reported error is final, and a commit keeps
 * the holes of a sparse block file.
 *
 * Every test writes a store (UCM layout, shard n of block b holds tu_fill's
 * bytes of (b, n): the "old" version), mounts it with the daemon binary and
 * writes through the mount with plain system calls and the tools an operator
 * uses, from forked processes where the case needs one (a child holding the
 * descriptor, a writer killed mid-copy). "New" bytes are tu_fill's of
 * (NEW + b, n). Each shard is checked both through the mount and in the
 * block file on disk.
 *
 * The last test dumps one key from several rank processes (libshardfs-rank,
 * attached through the mount) while a writer writes it through the mount.
 *
 * Needs /dev/fuse and fusermount3; the sparse-store test also needs to mount
 * a tmpfs (root). Each skips without.
 */
#include "fsfixture.h"
#include "testutil.h"

#include <shardfs/backend.h>
#include <shardfs/cache.h>
#include <shardfs/rank.h>

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD (64u << 10)
#define NEW   1000000u /* new bytes of (b, n): tu_fill of (NEW + b, n) */
#define BLOCK 7u
#define HALF  (SHARD / 2)

static struct {
    char store[128];
    char tmpfs[128]; /* a tmpfs this test mounted (unmounted at teardown) */
    struct fsfx fx;
} W;

/* Block b with shards 0..nshards-1 of old bytes. */
static void store_write(uint64_t b, unsigned nshards)
{
    int r = tu_store_write(W.store, b, 1, nshards, SHARD, NULL, NULL, false);

    cr_assert_eq(r, 0, "store block %llu: %s", (unsigned long long)b, strerror(-r));
}

static void fill_new(uint64_t b, uint32_t s, void *buf)
{
    struct sfs_key k = tu_key(NEW + b, s);

    tu_fill(&k, buf, SHARD);
}

enum version { V_OLD, V_NEW, V_OTHER, V_ERR };

static enum version version_of(uint64_t b, uint32_t s, const uint8_t *buf)
{
    struct sfs_key o = tu_key(b, s), n = tu_key(NEW + b, s);

    if (tu_check(&o, buf, SHARD) == -1)
        return V_OLD;
    if (tu_check(&n, buf, SHARD) == -1)
        return V_NEW;
    return V_OTHER;
}

/* Read exactly SHARD bytes at off of path with pread; V_ERR on any error. */
static enum version read_version(const char *path, off_t off, uint64_t b, uint32_t s)
{
    static __thread uint8_t buf[SHARD];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    size_t got = 0;

    if (fd < 0)
        return V_ERR;
    while (got < SHARD) {
        ssize_t n = pread(fd, buf + got, SHARD - got, off + (off_t)got);

        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    return got == SHARD ? version_of(b, s, buf) : V_ERR;
}

/* Shard (b, s) is version v through the mount and in the block file. */
static void assert_version(uint64_t b, uint32_t s, enum version v, const char *when)
{
    static const char *name[] = {"old", "new", "neither old nor new", "unreadable"};
    enum version m = read_version(fsfx_shard_path(&W.fx, b, s), 0, b, s);
    enum version d = read_version(fsfx_block_file(W.store, b), (off_t)s * SHARD, b, s);

    cr_assert_eq(m, v, "%s: shard %u through the mount is %s, not %s", when, s, name[m], name[v]);
    cr_assert_eq(d, v, "%s: shard %u on disk is %s, not %s", when, s, name[d], name[v]);
}

/* The shard stays version v for a while: a RELEASE comes after close(2)
 * returns, asynchronously, and must not store anything either. */
static void assert_stays(uint64_t b, uint32_t s, enum version v, const char *when)
{
    for (int i = 0; i < 5; i++) {
        assert_version(b, s, v, when);
        fsfx_sleep_ms(40);
    }
}

static void start_spec(const char *spec, const char *opts)
{
    char o[512];
    int st = 0, r;

    snprintf(W.fx.mnt, sizeof(W.fx.mnt), "%s", tu_path("mnt"));
    snprintf(W.fx.sock, sizeof(W.fx.sock), "%s", tu_path("sock"));
    snprintf(W.fx.log, sizeof(W.fx.log), "%s", tu_path("log"));
    W.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
    snprintf(o, sizeof(o), "hugepages=off,shard_size=64K,capacity=2M%s%s", opts && *opts ? "," : "",
             opts ? opts : "");
    r = fsfx_start(&W.fx, spec && *spec ? spec : W.store, o, 10.0, &st);
    if (r == -ECHILD)
        cr_assert_fail("daemon exited before mounting (status %d), see %s", st, W.fx.log);
    cr_assert_eq(r, 0, "mount did not appear: %s", strerror(-r));
}

static void setup(void)
{
    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    memset(&W, 0, sizeof(W));
    snprintf(W.store, sizeof(W.store), "%s", tu_path("store"));
    mkdir(W.store, 0755);
}

static void teardown(void)
{
    if (W.fx.pid > 0)
        fsfx_stop(&W.fx, true, 10.0);
    /* A tmpfs store goes with its tmpfs. */
    fsfx_cleanup(&W.fx, W.tmpfs[0] ? NULL : W.store);
    if (W.tmpfs[0]) {
        umount2(W.tmpfs, MNT_DETACH);
        rmdir(W.tmpfs);
    }
}

TestSuite(fs_write, .init = setup, .fini = teardown, .timeout = 120);

static int open_shard(uint64_t b, uint32_t s, int flags)
{
    int fd = open(fsfx_shard_path(&W.fx, b, s), flags | O_CLOEXEC, 0644);

    cr_assert_geq(fd, 0, "open %s: %s", fsfx_shard_path(&W.fx, b, s), strerror(errno));
    return fd;
}

static void write_at(int fd, const uint8_t *buf, size_t from, size_t to)
{
    cr_assert_eq(pwrite(fd, buf + from, to - from, (off_t)from), (ssize_t)(to - from), "write: %s",
                 strerror(errno));
}

/* ---------------------------------------------------------------------------
 * Finding 1: a FLUSH of an unfinished buffer stores nothing.
 */

/* A child that inherited the descriptor (no O_CLOEXEC) exits, or execs: the
 * kernel sends a FLUSH for its copy. The half-written shard is not stored;
 * the writer then finishes and its close commits the whole new shard. */
Test(fs_write, child_closing_an_inherited_fd_stores_nothing, .timeout = 60)
{
    static uint8_t buf[SHARD];
    int fd;

    store_write(BLOCK, 2);
    start_spec(NULL, NULL);
    for (uint32_t s = 0; s < 2; s++) {
        fill_new(BLOCK, s, buf);
        fd = open(fsfx_shard_path(&W.fx, BLOCK, s), O_WRONLY | O_TRUNC); /* inherited by children */
        cr_assert_geq(fd, 0);
        write_at(fd, buf, 0, HALF);
        pid_t kid = fork();

        cr_assert_geq(kid, 0);
        if (kid == 0) {
            if (s == 1)
                execl("/bin/true", "true", (char *)NULL); /* closes nothing: fd is inherited */
            tu_exit(0);
        }
        cr_assert_eq(tu_wait(kid), 0);
        assert_stays(BLOCK, s, V_OLD, s ? "after a child's exec" : "after a child's exit");
        write_at(fd, buf, HALF, SHARD);
        cr_assert_eq(close(fd), 0, "close: %s", strerror(errno));
        assert_version(BLOCK, s, V_NEW, "after the writer's close");
    }
    cr_assert_eq(fsfx_stop(&W.fx, false, 10.0), 0);
}

/* close(dup(fd)) after half a shard stores nothing and says so (ENODATA);
 * the bytes stay: finishing the write and closing commits the new whole
 * shard. */
Test(fs_write, close_of_a_dup_stores_nothing_until_whole, .timeout = 60)
{
    static uint8_t buf[SHARD];
    int fd;

    store_write(BLOCK, 1);
    start_spec(NULL, NULL);
    fill_new(BLOCK, 0, buf);
    fd = open_shard(BLOCK, 0, O_WRONLY | O_TRUNC);
    write_at(fd, buf, 0, HALF);
    errno = 0;
    cr_assert_eq(close(dup(fd)), -1, "close(dup(fd)) of an unfinished shard returned 0");
    cr_assert_eq(errno, ENODATA, "close(dup(fd)) of an unfinished shard: %s, not ENODATA",
                 strerror(errno));
    assert_stays(BLOCK, 0, V_OLD, "after close(dup(fd)) at half");
    /* Out of order, with an overlap: every byte counts once. */
    write_at(fd, buf, SHARD - 100, SHARD);
    write_at(fd, buf, HALF - 10, SHARD - 50);
    cr_assert_eq(fsync(fd), 0);
    cr_assert_eq(close(fd), 0);
    assert_version(BLOCK, 0, V_NEW, "after the whole shard was written");
    cr_assert_eq(fsfx_stop(&W.fx, false, 10.0), 0);
}

/* A writer killed mid-copy: its partial bytes are discarded, with one line
 * in the daemon's log. */
Test(fs_write, writer_killed_mid_copy_stores_nothing, .timeout = 60)
{
    static uint8_t buf[SHARD];
    int pipefd[2];
    char c;

    store_write(BLOCK, 1);
    start_spec(NULL, NULL);
    fill_new(BLOCK, 0, buf);
    cr_assert_eq(pipe(pipefd), 0);
    pid_t kid = fork();

    cr_assert_geq(kid, 0);
    if (kid == 0) {
        int fd = open(fsfx_shard_path(&W.fx, BLOCK, 0), O_WRONLY | O_TRUNC);

        if (fd < 0 || pwrite(fd, buf, SHARD - 4096, 0) != (ssize_t)(SHARD - 4096))
            tu_exit(1);
        if (write(pipefd[1], "x", 1) != 1)
            tu_exit(1);
        pause();
        tu_exit(2);
    }
    close(pipefd[1]);
    cr_assert_eq(read(pipefd[0], &c, 1), 1, "the writer did not get going");
    close(pipefd[0]);
    kill(kid, SIGKILL);
    cr_assert_eq(tu_wait(kid), 128 + SIGKILL);
    assert_stays(BLOCK, 0, V_OLD, "after the writer was killed");
    for (double t0 = fsfx_now_s();
         fsfx_log_lines_with(&W.fx, "not a whole shard, discarded") == 0;) {
        cr_assert_lt(fsfx_now_s() - t0, 3.0, "no log line for the discarded bytes");
        fsfx_sleep_ms(10);
    }
    cr_assert_eq(fsfx_log_lines_with(&W.fx, "not a whole shard, discarded"), 1);
    cr_assert_eq(fsfx_stop(&W.fx, false, 10.0), 0);
}

/* Truncating opens with no data: `cat /nonexistent > shard`, `exec 3> shard;
 * /bin/true`, a Python-style open(..., 'wb') closed at once. */
Test(fs_write, truncating_open_with_no_data_stores_nothing, .timeout = 60)
{
    store_write(BLOCK, 1);
    start_spec(NULL, NULL);
    cr_assert_neq(
        fsfx_sh("cat /nonexistent-shardfs-test > %s 2>/dev/null", fsfx_shard_path(&W.fx, BLOCK, 0)),
        0);
    assert_stays(BLOCK, 0, V_OLD, "after cat /nonexistent > shard");
    cr_assert_eq(fsfx_sh("sh -c 'exec 3> %s; /bin/true'", fsfx_shard_path(&W.fx, BLOCK, 0)), 0);
    assert_stays(BLOCK, 0, V_OLD, "after exec 3> shard; /bin/true");
    cr_assert_eq(close(open_shard(BLOCK, 0, O_WRONLY | O_TRUNC)), 0);
    assert_stays(BLOCK, 0, V_OLD, "after open(O_TRUNC) + close");
    /* Nothing was written: nothing to report either. */
    cr_assert_eq(fsfx_log_lines_with(&W.fx, "discarded"), 0);
    cr_assert_eq(fsfx_stop(&W.fx, false, 10.0), 0);
}

/* Readers of a shard that a slow writer rewrites again and again, with a
 * close(dup(fd)) and a forked child's exit after every chunk, see the old
 * whole shard or the new whole shard, never anything else. */
struct readers_arg {
    volatile int *stop;
    volatile long *counts; /* per reader: [old, new, other, error] */
    int id;
};

static int reader_main(void *p)
{
    struct readers_arg *a = p;
    volatile long *c = a->counts + 4 * a->id;

    while (!*a->stop)
        c[read_version(fsfx_shard_path(&W.fx, BLOCK, 0), 0, BLOCK, 0)]++;
    return 0;
}

Test(fs_write, readers_see_the_old_or_the_new_whole_shard, .timeout = 120)
{
    enum { READERS = 3, ROUNDS = 6, CHUNK = 4096 };
    static uint8_t bufs[2][SHARD];
    volatile int *stop;
    volatile long *counts;
    pid_t kids[READERS];
    struct readers_arg a[READERS];
    long total[4] = {0};

    store_write(BLOCK, 1);
    start_spec(NULL, NULL);
    stop = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq((void *)stop, MAP_FAILED);
    counts = (volatile long *)((char *)stop + 64);
    *stop = 0;
    {
        struct sfs_key k = tu_key(BLOCK, 0);

        tu_fill(&k, bufs[0], SHARD);
    }
    fill_new(BLOCK, 0, bufs[1]);
    for (int i = 0; i < READERS; i++) {
        a[i] = (struct readers_arg){.stop = stop, .counts = counts, .id = i};
        kids[i] = tu_fork(reader_main, &a[i]);
    }
    for (int r = 0; r < ROUNDS; r++) {
        const uint8_t *buf = bufs[(r + 1) & 1]; /* new, old, new, ... */
        int fd = open(fsfx_shard_path(&W.fx, BLOCK, 0), O_WRONLY | O_TRUNC);

        cr_assert_geq(fd, 0);
        for (size_t off = 0; off < SHARD; off += CHUNK) {
            write_at(fd, buf, off, off + CHUNK);
            errno = 0;
            if (off + CHUNK < SHARD)
                cr_assert(close(dup(fd)) == -1 && errno == ENODATA, "an unfinished close: %s",
                          strerror(errno));
            else
                cr_assert_eq(close(dup(fd)), 0, "the completing close: %s", strerror(errno));
            if ((off / CHUNK) % 4 == 0) {
                pid_t kid = fork();

                if (kid == 0)
                    tu_exit(0);
                cr_assert_eq(tu_wait(kid), 0);
            }
            fsfx_sleep_ms(1);
        }
        cr_assert_eq(close(fd), 0);
        assert_version(BLOCK, 0, (r & 1) ? V_OLD : V_NEW, "after a whole rewrite");
    }
    *stop = 1;
    for (int i = 0; i < READERS; i++)
        cr_assert_eq(tu_wait(kids[i]), 0);
    for (int i = 0; i < READERS; i++)
        for (int v = 0; v < 4; v++)
            total[v] += counts[4 * i + v];
    cr_assert_gt(total[V_OLD] + total[V_NEW], 0, "the readers read nothing");
    cr_assert_eq(total[V_OTHER], 0, "%ld of %ld reads saw neither the old nor the new shard",
                 total[V_OTHER], total[V_OLD] + total[V_NEW] + total[V_OTHER]);
    cr_assert_eq(total[V_ERR], 0, "%ld reads failed", total[V_ERR]);
    munmap((void *)stop, 4096);
    cr_assert_eq(fsfx_stop(&W.fx, false, 10.0), 0);
}

/* ---------------------------------------------------------------------------
 * Finding 2: an error reported to close() is the outcome.
 */

/* The store fails (the fault backend's eio) and close(dup(fd)) reports it;
 * with the backend healthy again, the last close must not store the rejected
 * bytes: it answers the same error, and so does a write. */
Test(fs_write, a_failed_close_is_final, .timeout = 60)
{
    static uint8_t buf[SHARD];
    char spec[512];
    int fd, fd2;

    store_write(BLOCK, 1);
    snprintf(spec, sizeof(spec), "fault:seed=1:%s", W.store);
    start_spec(spec, "readahead=0");
    fill_new(BLOCK, 0, buf);
    fd = open_shard(BLOCK, 0, O_WRONLY | O_TRUNC);
    write_at(fd, buf, 0, SHARD);
    fd2 = dup(fd);
    cr_assert_eq(setxattr(W.fx.mnt, "user.shardfs.fault", "eio=1", 5, 0), 0);
    cr_assert_eq(close(fd2), -1, "the failed store was not reported");
    cr_assert_eq(errno, EIO);
    cr_assert_eq(setxattr(W.fx.mnt, "user.shardfs.fault", "off", 3, 0), 0);
    cr_assert_eq(pwrite(fd, buf, 10, 0), -1, "a write after the reported error");
    cr_assert_eq(errno, EIO);
    cr_assert_eq(close(fd), -1, "the last close stored the rejected bytes");
    cr_assert_eq(errno, EIO);
    assert_stays(BLOCK, 0, V_OLD, "after the failed close");
    /* A new open starts over. */
    fd = open_shard(BLOCK, 0, O_WRONLY | O_TRUNC);
    write_at(fd, buf, 0, SHARD);
    cr_assert_eq(close(fd), 0);
    assert_version(BLOCK, 0, V_NEW, "after a new open wrote it whole");
    cr_assert_eq(fsfx_stop(&W.fx, false, 10.0), 0);
}

/* A read that came while a store was in flight and parked on the key. */
struct parked_read {
    enum version got;
    long long waits_before;
};

static void *read_behind_the_store(void *arg)
{
    struct parked_read *p = arg;

    fsfx_sleep_ms(200); /* the close's store is in the backend now */
    /* The store keeps the verdict it was submitted with (eio, after 1 s);
     * this read's own load must not fail. */
    cr_assert_eq(setxattr(W.fx.mnt, "user.shardfs.fault", "off", 3, 0), 0);
    p->waits_before = fsfx_stat(&W.fx, "shardfs_waits_total");
    p->got = read_version(fsfx_shard_path(&W.fx, BLOCK, 0), 0, BLOCK, 0);
    return NULL;
}

/* A store that fails is the writer's error, not its readers': a read parked
 * on the key while the store was in flight gets the bytes the store still
 * has (the old version), and the writer's close gets EIO. */
Test(fs_write, a_failed_store_hands_a_parked_read_the_old_bytes, .timeout = 60)
{
    static uint8_t buf[SHARD];
    char spec[512];
    struct parked_read p = {.got = V_ERR};
    pthread_t t;
    int fd;

    store_write(BLOCK, 1);
    snprintf(spec, sizeof(spec), "fault:seed=1:%s", W.store);
    start_spec(spec, "readahead=0");
    assert_version(BLOCK, 0, V_OLD, "before"); /* resident */
    fill_new(BLOCK, 0, buf);
    fd = open_shard(BLOCK, 0, O_WRONLY | O_TRUNC);
    write_at(fd, buf, 0, SHARD);
    static const char fault[] = "eio=1,latency_us=1000000";
    cr_assert_eq(setxattr(W.fx.mnt, "user.shardfs.fault", fault, sizeof(fault) - 1, 0), 0);
    cr_assert_eq(pthread_create(&t, NULL, read_behind_the_store, &p), 0);
    cr_assert_eq(close(fd), -1, "the failed store was not reported");
    cr_assert_eq(errno, EIO);
    pthread_join(t, NULL);
    cr_assert_geq(fsfx_stat(&W.fx, "shardfs_waits_total"), p.waits_before + 1,
                  "the read did not wait on the store");
    cr_assert_eq(p.got, V_OLD, "the parked read got %s, not the old bytes",
                 p.got == V_ERR ? "an error" : "other bytes");
    assert_stays(BLOCK, 0, V_OLD, "after the failed store");
    cr_assert_eq(fsfx_stop(&W.fx, false, 10.0), 0);
}

/* ---------------------------------------------------------------------------
 * Finding 3: a commit keeps the holes of a sparse block file.
 */

/* Shard 16384 of a 64 KiB-shard block sits at 1 GiB: writing shard 0 must
 * not copy the hole in between (on a 64 MiB tmpfs that is ENOSPC). */
Test(fs_write, commit_keeps_the_holes_of_a_sparse_block, .timeout = 120)
{
    static uint8_t buf[SHARD];
    const uint32_t far = 16384;
    struct sfs_key k = tu_key(BLOCK, far);
    struct stat st;
    int fd;

    snprintf(W.tmpfs, sizeof(W.tmpfs), "%s", W.store);
    if (mount("shardfs-test", W.tmpfs, "tmpfs", 0, "size=64m") < 0) {
        W.tmpfs[0] = '\0';
        cr_skip_test("cannot mount a tmpfs here (%s): needs root", strerror(errno));
    }
    {
        char dir[256];

        snprintf(dir, sizeof(dir), "%s/data", W.store);
        cr_assert_eq(mkdir(dir, 0755), 0);
    }
    fd = open(fsfx_block_file(W.store, BLOCK), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_geq(fd, 0);
    tu_fill(&k, buf, SHARD);
    cr_assert_eq(pwrite(fd, buf, SHARD, (off_t)far * SHARD), (ssize_t)SHARD);
    close(fd);
    start_spec(NULL, NULL);

    /* Shard 0 lies in the hole: absent, so created. */
    fill_new(BLOCK, 0, buf);
    fd = open_shard(BLOCK, 0, O_WRONLY | O_CREAT | O_TRUNC);
    write_at(fd, buf, 0, SHARD);
    cr_assert_eq(close(fd), 0, "storing shard 0: %s", strerror(errno));
    assert_version(BLOCK, 0, V_NEW, "shard 0");
    cr_assert_eq(stat(fsfx_block_file(W.store, BLOCK), &st), 0);
    cr_assert_eq(st.st_size, (off_t)(far + 1) * SHARD);
    cr_assert_lt(st.st_blocks * 512, 4 * SHARD, "the commit allocated %lld bytes",
                 (long long)st.st_blocks * 512);
    /* The far shard is intact, and so is a hole in between (zeros). */
    {
        static uint8_t got[SHARD];

        fd = open(fsfx_block_file(W.store, BLOCK), O_RDONLY);
        cr_assert_eq(pread(fd, got, SHARD, (off_t)far * SHARD), (ssize_t)SHARD);
        cr_assert_eq(tu_check(&k, got, SHARD), -1);
        cr_assert_eq(pread(fd, got, SHARD, (off_t)100 * SHARD), (ssize_t)SHARD);
        for (size_t i = 0; i < SHARD; i++)
            cr_assert_eq(got[i], 0);
        close(fd);
    }
    cr_assert_eq(fsfx_stop(&W.fx, false, 10.0), 0);
}

/* ---------------------------------------------------------------------------
 * Finding 4: the cache and the store agree on the version that won.
 */

enum { DUMPERS = 3, DUPS = 4, DUMP_ROUNDS = 25 };

struct dump_shared {
    _Atomic int ready[DUMP_ROUNDS];
};

struct dumper {
    struct dump_shared *sh;
    int round, id;
};

/* Version v of shard (BLOCK, 0): a pattern no other version has. */
static void fill_version(uint32_t v, void *buf)
{
    struct sfs_key k = tu_key(2 * NEW + v, 0);

    tu_fill(&k, buf, SHARD);
}

static void go_together(_Atomic int *ready, int n)
{
    int64_t end = sfs_deadline_after(20ll * 1000 * 1000 * 1000);

    atomic_fetch_add(ready, 1);
    while (atomic_load(ready) < n && sfs_now_ns() < end)
        ;
}

/* A rank process: dump DUPS versions of one key in one task. */
static int dumper_main(void *p)
{
    struct dumper *d = p;
    struct sfs_rank_config cfg;
    struct sfs_rank_entry e[DUPS];
    struct sfs_task *t;
    struct sfs_rank *rk;
    static uint8_t bufs[DUPS][SHARD];
    char spec[256];
    int st[DUPS], err = 0;

    sfs_rank_config_init(&cfg);
    snprintf(spec, sizeof(spec), "posix:%s", W.store);
    cfg.mount_point = W.fx.mnt;
    cfg.backend = spec;
    cfg.copier = SFS_COPIER_HOST;
    cfg.key_timeout_ms = 20000;
    rk = sfs_rank_open(&cfg, &err);
    TU_CK(rk);
    for (int j = 0; j < DUPS; j++) {
        fill_version((uint32_t)((d->round * (DUMPERS + 1) + d->id) * DUPS + j), bufs[j]);
        e[j] = (struct sfs_rank_entry){.block = tu_block(BLOCK), .shard = 0, .addr = bufs[j]};
    }
    go_together(&d->sh->ready[d->round], DUMPERS + 1);
    TU_CK(sfs_rank_dump(rk, e, DUPS, &t) == 0);
    TU_CK(sfs_rank_wait(t, 30000, st) == 0);
    for (int j = 0; j < DUPS; j++)
        TU_CK(st[j] == 0);
    sfs_rank_task_free(t);
    sfs_rank_close(rk);
    return 0;
}

/* A writer through the mount, at the same time. */
static int mount_writer_main(void *p)
{
    struct dumper *d = p;
    static uint8_t buf[SHARD];
    int fd;

    fill_version((uint32_t)((d->round * (DUMPERS + 1) + d->id) * DUPS), buf);
    go_together(&d->sh->ready[d->round], DUMPERS + 1);
    fd = open(fsfx_shard_path(&W.fx, BLOCK, 0), O_WRONLY | O_TRUNC | O_CLOEXEC);
    TU_CK(fd >= 0);
    TU_CK(write(fd, buf, SHARD) == (ssize_t)SHARD);
    TU_CK(close(fd) == 0);
    return 0;
}

/* Rank processes dump one key concurrently (several versions each, in one
 * task), and a writer writes it through the mount: afterwards the cache
 * (a read through the mount, a hit) and the block file hold the same whole
 * version, every round. */
Test(fs_write, concurrent_dumps_of_one_key_leave_cache_and_store_agreeing, .timeout = 300)
{
    struct dump_shared *sh;
    int disagree = 0;

    store_write(BLOCK, 1);
    start_spec(NULL, "readahead=0");
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq((void *)sh, MAP_FAILED);
    memset(sh, 0, sizeof(*sh));
    for (int r = 0; r < DUMP_ROUNDS; r++) {
        static uint8_t cached[SHARD], stored[SHARD];
        struct dumper d[DUMPERS + 1];
        pid_t kids[DUMPERS + 1];
        int fd;

        for (int i = 0; i <= DUMPERS; i++) {
            d[i] = (struct dumper){.sh = sh, .round = r, .id = i};
            kids[i] = tu_fork(i < DUMPERS ? dumper_main : mount_writer_main, &d[i]);
        }
        for (int i = 0; i <= DUMPERS; i++)
            cr_assert_eq(tu_wait(kids[i]), 0, "round %d: %s %d failed", r,
                         i < DUMPERS ? "rank" : "mount writer", i);
        fd = open(fsfx_shard_path(&W.fx, BLOCK, 0), O_RDONLY);
        cr_assert_geq(fd, 0);
        cr_assert_eq(pread(fd, cached, SHARD, 0), (ssize_t)SHARD);
        close(fd);
        fd = open(fsfx_block_file(W.store, BLOCK), O_RDONLY);
        cr_assert_geq(fd, 0);
        cr_assert_eq(pread(fd, stored, SHARD, 0), (ssize_t)SHARD);
        close(fd);
        disagree += memcmp(cached, stored, SHARD) != 0;
    }
    cr_assert_eq(disagree, 0,
                 "in %d of %d rounds the cache served another version than the store's", disagree,
                 DUMP_ROUNDS);
    munmap(sh, sizeof(*sh));
    cr_assert_eq(fsfx_stop(&W.fx, false, 10.0), 0);
}

/* Another process holds the key (a reader's lease on the Ready shard) past
 * the rank's key deadline: the bounced dump fails -ETIMEDOUT and stores
 * nothing, in the store or the cache. */
struct holder {
    int ready[2], go[2];
};

static int holder_main(struct sfs_cache *c, void *p)
{
    struct holder *h = p;
    struct sfs_key k = tu_key(BLOCK, 0);
    struct sfs_lease l;
    char ch = 0;

    close(h->ready[0]);
    close(h->go[1]);
    TU_CK(sfs_cache_get(c, &k, 0, sfs_deadline_after(5ll * 1000 * 1000 * 1000), &l) == SFS_HIT);
    TU_CK(write(h->ready[1], &ch, 1) == 1);
    TU_CK(read(h->go[0], &ch, 1) == 1);
    sfs_cache_release(c, &l);
    return 0;
}

Test(fs_write, a_dump_of_a_key_held_past_its_deadline_stores_nothing, .timeout = 60)
{
    static uint8_t buf[SHARD];
    struct sfs_rank_config cfg;
    struct sfs_rank_entry e;
    struct sfs_task *t;
    struct sfs_rank *rk;
    struct holder h;
    char spec[256], ch = 0;
    int st = 0, err = 0;
    pid_t kid;

    store_write(BLOCK, 1);
    start_spec(NULL, "readahead=0");
    assert_version(BLOCK, 0, V_OLD, "before"); /* now Ready in the cache */
    cr_assert_eq(pipe(h.ready), 0);
    cr_assert_eq(pipe(h.go), 0);
    kid = tu_fork_attached(W.fx.sock, 0, holder_main, &h);
    close(h.ready[1]);
    close(h.go[0]);
    cr_assert_eq(read(h.ready[0], &ch, 1), 1, "the holder did not get the key");

    sfs_rank_config_init(&cfg);
    snprintf(spec, sizeof(spec), "posix:%s", W.store);
    cfg.mount_point = W.fx.mnt;
    cfg.backend = spec;
    cfg.copier = SFS_COPIER_HOST;
    cfg.key_timeout_ms = 300;
    rk = sfs_rank_open(&cfg, &err);
    cr_assert_not_null(rk, "sfs_rank_open: %s", strerror(-err));
    fill_new(BLOCK, 0, buf);
    e = (struct sfs_rank_entry){.block = tu_block(BLOCK), .shard = 0, .addr = buf};
    cr_assert_eq(sfs_rank_dump(rk, &e, 1, &t), 0);
    cr_assert_eq(sfs_rank_wait(t, 10000, &st), 0);
    sfs_rank_task_free(t);
    cr_assert_eq(st, -ETIMEDOUT, "the dump of a held key: %d", st);

    cr_assert_eq(write(h.go[1], &ch, 1), 1);
    cr_assert_eq(tu_wait(kid), 0);
    assert_version(BLOCK, 0, V_OLD, "after the dump timed out");
    /* Once the key is free, a dump goes through and both agree. */
    cr_assert_eq(sfs_rank_dump(rk, &e, 1, &t), 0);
    cr_assert_eq(sfs_rank_wait(t, 10000, &st), 0);
    sfs_rank_task_free(t);
    cr_assert_eq(st, 0);
    assert_version(BLOCK, 0, V_NEW, "after a dump of the free key");
    sfs_rank_close(rk);
    close(h.ready[0]);
    close(h.go[1]);
    cr_assert_eq(fsfx_stop(&W.fx, false, 10.0), 0);
}

/* A truncate is a whole shard of its own: `truncate -s N` rewrites the shard
 * with its bytes from N on zeroed; `dd seek=K` (which truncates to K blocks,
 * then writes the rest) commits the kept bytes plus the new ones. */
Test(fs_write, truncate_and_dd_seek_are_whole_shards, .timeout = 60)
{
    static uint8_t want[SHARD], got[SHARD], neu[SHARD];
    struct sfs_key k = tu_key(BLOCK, 0);
    char src[256];
    int fd;

    store_write(BLOCK, 1);
    start_spec(NULL, NULL);
    cr_assert_eq(fsfx_sh("truncate -s 1000 %s", fsfx_shard_path(&W.fx, BLOCK, 0)), 0);
    tu_fill(&k, want, SHARD);
    memset(want + 1000, 0, SHARD - 1000);
    for (int i = 0; i < 2; i++) {
        fd = open(i ? fsfx_block_file(W.store, BLOCK) : fsfx_shard_path(&W.fx, BLOCK, 0), O_RDONLY);
        cr_assert_geq(fd, 0);
        cr_assert_eq(pread(fd, got, SHARD, 0), (ssize_t)SHARD);
        close(fd);
        cr_assert_eq(memcmp(got, want, SHARD), 0, "truncate -s 1000 (%s)", i ? "disk" : "mount");
    }

    fill_new(BLOCK, 0, neu);
    snprintf(src, sizeof(src), "%s", tu_path("src"));
    fd = open(src, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_eq(write(fd, neu + 4096, SHARD - 4096), (ssize_t)(SHARD - 4096));
    close(fd);
    cr_assert_eq(
        fsfx_sh("dd if=%s of=%s bs=4096 seek=1 status=none", src, fsfx_shard_path(&W.fx, BLOCK, 0)),
        0);
    memcpy(want + 4096, neu + 4096, SHARD - 4096);
    for (int i = 0; i < 2; i++) {
        fd = open(i ? fsfx_block_file(W.store, BLOCK) : fsfx_shard_path(&W.fx, BLOCK, 0), O_RDONLY);
        cr_assert_geq(fd, 0);
        cr_assert_eq(pread(fd, got, SHARD, 0), (ssize_t)SHARD);
        close(fd);
        cr_assert_eq(memcmp(got, want, SHARD), 0, "dd seek=1 (%s)", i ? "disk" : "mount");
    }
    unlink(src);
    cr_assert_eq(fsfx_log_lines_with(&W.fx, "discarded"), 0);
    cr_assert_eq(fsfx_stop(&W.fx, false, 10.0), 0);
}

/* Tools that write less than a shard learn it from close(2): cp of a small
 * file onto a stored shard and onto a new name, dd conv=notrunc of one
 * block, dd seek= of one block past the start, each exits non-zero with
 * ENODATA's message, and the store is unchanged. The new name does not
 * show in stat right after cp failed (no entry the kernel kept for a
 * second), and each release still logs its discard. */
Test(fs_write, an_incomplete_shard_fails_close_with_enodata, .timeout = 60)
{
    const char *msg = strerror(ENODATA);
    char small[256], out[256], cmd[1024];
    struct stat st;
    int fd;

    store_write(BLOCK, 2);
    start_spec(NULL, NULL);
    snprintf(small, sizeof(small), "%s", tu_path("small"));
    snprintf(out, sizeof(out), "%s", tu_path("out"));
    fd = open(small, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_eq(write(fd, "abc", 3), 3);
    close(fd);

    snprintf(cmd, sizeof(cmd), "cp %s %s 2>%s", small, fsfx_shard_path(&W.fx, BLOCK, 1), out);
    cr_assert_neq(fsfx_sh("%s", cmd), 0, "cp of 3 bytes onto a stored shard exited 0");
    cr_assert_eq(fsfx_sh("grep -q '%s' %s", msg, out), 0, "cp did not say '%s'", msg);
    assert_stays(BLOCK, 1, V_OLD, "after cp of 3 bytes");

    snprintf(cmd, sizeof(cmd), "cp %s %s 2>%s", small, fsfx_shard_path(&W.fx, BLOCK, 5), out);
    cr_assert_neq(fsfx_sh("%s", cmd), 0, "cp of 3 bytes to a new name exited 0");
    cr_assert_eq(stat(fsfx_shard_path(&W.fx, BLOCK, 5), &st), -1,
                 "a name never stored shows in stat after cp failed");
    cr_assert_eq(errno, ENOENT);
    cr_assert_eq(fsfx_sh("ls %s | grep -qx 5", fsfx_shard_path(&W.fx, BLOCK, -1)), 1,
                 "a name never stored is listed");

    snprintf(cmd, sizeof(cmd), "dd if=%s of=%s bs=4096 count=1 conv=notrunc status=none 2>%s",
             fsfx_block_file(W.store, BLOCK), fsfx_shard_path(&W.fx, BLOCK, 0), out);
    cr_assert_neq(fsfx_sh("%s", cmd), 0, "dd conv=notrunc of one block exited 0");
    cr_assert_eq(fsfx_sh("grep -q '%s' %s", msg, out), 0, "dd did not say '%s'", msg);
    snprintf(cmd, sizeof(cmd),
             "dd if=%s of=%s bs=4096 count=1 seek=3 conv=notrunc status=none 2>%s",
             fsfx_block_file(W.store, BLOCK), fsfx_shard_path(&W.fx, BLOCK, 0), out);
    cr_assert_neq(fsfx_sh("%s", cmd), 0, "dd seek=3 conv=notrunc of one block exited 0");
    assert_stays(BLOCK, 0, V_OLD, "after dd of one block");

    /* Each of the four releases logged its discard. */
    for (double t0 = fsfx_now_s(); fsfx_log_lines_with(&W.fx, "not a whole shard, discarded") < 4;) {
        cr_assert_lt(fsfx_now_s() - t0, 3.0, "%d discard lines, not 4",
                     fsfx_log_lines_with(&W.fx, "not a whole shard, discarded"));
        fsfx_sleep_ms(10);
    }
    unlink(small);
    unlink(out);
    cr_assert_eq(fsfx_stop(&W.fx, false, 10.0), 0);
}

/* A block file whose name leads out of the store (an absolute symlink): the
 * store refuses it, and the writer learns it from close(2) as EXDEV; the
 * file the link names is never written. */
Test(fs_write, a_block_file_leading_out_of_the_store_fails_close_with_exdev, .timeout = 60)
{
    static uint8_t buf[SHARD], outside[SHARD];
    char target[256];
    int fd, r, e;

    snprintf(target, sizeof(target), "%s", tu_path("outside"));
    memset(outside, 0x5a, sizeof(outside));
    fd = open(target, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_eq(write(fd, outside, SHARD), (ssize_t)SHARD);
    close(fd);
    store_write(BLOCK, 1);
    cr_assert_eq(unlink(fsfx_block_file(W.store, BLOCK)), 0);
    cr_assert_eq(symlink(target, fsfx_block_file(W.store, BLOCK)), 0);
    start_spec(NULL, NULL);
    fill_new(BLOCK, 0, buf);
    fd = open_shard(BLOCK, 0, O_WRONLY | O_CREAT | O_TRUNC);
    write_at(fd, buf, 0, SHARD);
    errno = 0;
    r = close(fd);
    e = errno;
    cr_assert_eq(r, -1, "close() of a store through a link out of the store returned 0");
    cr_assert_eq(e, EXDEV, "close(): %s, not EXDEV", strerror(e));
    fd = open(target, O_RDONLY);
    cr_assert_eq(read(fd, buf, SHARD), (ssize_t)SHARD);
    close(fd);
    cr_assert_eq(memcmp(buf, outside, SHARD), 0, "the file outside the store was written");
    unlink(target);
    cr_assert_eq(fsfx_stop(&W.fx, false, 10.0), 0);
}

/* cp of a sparse file writes its data, seeks over its holes and then sets
 * the size: on a file that started empty the bytes never written are the
 * zeros of a gap, so the copy is a whole shard. */
Test(fs_write, cp_of_a_sparse_file_is_a_whole_shard, .timeout = 60)
{
    static uint8_t want[SHARD], got[SHARD];
    char src[256];

    store_write(BLOCK, 1);
    start_spec(NULL, NULL);
    snprintf(src, sizeof(src), "%s", tu_path("sparse"));
    cr_assert_eq(fsfx_sh("printf 'DATA' > %s && truncate -s %u %s", src, SHARD, src), 0);
    cr_assert_eq(fsfx_sh("cp --sparse=always %s %s", src, fsfx_shard_path(&W.fx, BLOCK, 0)), 0);
    memcpy(want, "DATA", 4);
    for (int i = 0; i < 2; i++) {
        int fd =
            open(i ? fsfx_block_file(W.store, BLOCK) : fsfx_shard_path(&W.fx, BLOCK, 0), O_RDONLY);

        cr_assert_geq(fd, 0);
        cr_assert_eq(pread(fd, got, SHARD, 0), (ssize_t)SHARD);
        close(fd);
        cr_assert_eq(memcmp(got, want, SHARD), 0, "cp of a sparse file (%s)", i ? "disk" : "mount");
    }
    unlink(src);
    cr_assert_eq(fsfx_log_lines_with(&W.fx, "discarded"), 0);
    cr_assert_eq(fsfx_stop(&W.fx, false, 10.0), 0);
}

/* ---------------------------------------------------------------------------
 * Concurrent writers and readers of the same shards: every byte read is
 * one whole version.
 *
 * WS_WRITERS forked writers replace the same WS_BLOCKS x WS_SHARDS shards,
 * over and over, each time with a whole new version (one open, one write of
 * the whole shard, one close), while WS_READERS forked readers read them
 * whole (open, read shard_size bytes, close). The cache holds fewer slots
 * than there are shards, so loads, evictions and stores interleave. A
 * version's shard is 16-byte records {tag of the shard, writer, version,
 * record index}: every record tells which version it belongs to, and a read
 * is whole when every record names the same (writer, version) and sits at
 * its own index. The original shard (tu_fill of its key) is a version too.
 * Each writer publishes the number of versions it has begun before it opens
 * the shard, so a reader can tell a version some writer wrote from garbage.
 */
enum {
    WS_WRITERS = 4,
    WS_READERS = 4,
    WS_BLOCKS = 2,
    WS_SHARDS = 3,
    WS_NSHARDS = WS_BLOCKS * WS_SHARDS,
    WS_BLOCK0 = 20,        /* blocks WS_BLOCK0 .. WS_BLOCK0 + WS_BLOCKS - 1 */
    WS_ACTIVE_MS = 5000,   /* how long writers and readers run */
    WS_MAX_OPS = 1000000,  /* a bound on each process's iterations */
    WS_REC = 16,           /* bytes of one record */
    WS_WORDS = WS_REC / 4, /* words of one record */
};

struct ws_shared {
    /* Set by the parent to end the run; read by every child. Relaxed: it
     * orders nothing, a child only needs to see it eventually. */
    atomic_int stop;
    /* started[w]: versions writer w has begun (its next version number).
     * Release by the writer before it opens the shard, acquire by a reader
     * after its read, so a version read is always one already counted. */
    atomic_uint started[WS_WRITERS];
    /* Per child, written by that child only and read by the parent after
     * waitpid (which orders them). */
    long writes[WS_WRITERS], write_errs[WS_WRITERS];
    long reads[WS_READERS], olds[WS_READERS], bad[WS_READERS], read_errs[WS_READERS];
    /* The first violation a reader saw (first_bad set by a CAS). */
    atomic_int first_bad;
    char what[320];
};

static uint64_t ws_block(unsigned i)
{
    return WS_BLOCK0 + (uint64_t)(i / WS_SHARDS);
}

static uint32_t ws_shard(unsigned i)
{
    return (uint32_t)(i % WS_SHARDS);
}

static uint32_t ws_tag(unsigned i)
{
    return 0x5ea70000u | i;
}

/* Version (w, v) of shard i. */
static void ws_fill(unsigned i, uint32_t w, uint32_t v, uint8_t *buf)
{
    for (uint32_t r = 0; r < SHARD / WS_REC; r++) {
        uint32_t rec[WS_WORDS] = {ws_tag(i), w, v, r};

        memcpy(buf + (size_t)r * WS_REC, rec, WS_REC);
    }
}

/* 0: buf is the original shard i; 1: a whole version (*w, *v) of shard i
 * with *w < WS_WRITERS; -1: neither, described in what. */
static int ws_classify(unsigned i, const uint8_t *buf, uint32_t *w, uint32_t *v, char *what,
                       size_t len)
{
    struct sfs_key k = tu_key(ws_block(i), ws_shard(i));
    uint32_t first[WS_WORDS];

    if (tu_check(&k, buf, SHARD) == -1)
        return 0;
    memcpy(first, buf, WS_REC);
    if (first[0] != ws_tag(i) || first[1] >= WS_WRITERS || first[3] != 0) {
        snprintf(what, len, "shard %u: first record {%08x %u %u %u} is no version of it", i,
                 first[0], first[1], first[2], first[3]);
        return -1;
    }
    for (uint32_t r = 1; r < SHARD / WS_REC; r++) {
        uint32_t rec[WS_WORDS];

        memcpy(rec, buf + (size_t)r * WS_REC, WS_REC);
        if (rec[0] != first[0] || rec[1] != first[1] || rec[2] != first[2] || rec[3] != r) {
            snprintf(what, len,
                     "shard %u: record %u (byte %u) is {%08x w%u v%u #%u}, record 0 is w%u v%u", i,
                     r, r * WS_REC, rec[0], rec[1], rec[2], rec[3], first[1], first[2]);
            return -1;
        }
    }
    *w = first[1];
    *v = first[2];
    return 1;
}

/* Read shard i whole through the mount (or, disk: from its block file). */
static long ws_read(unsigned i, bool disk, uint8_t *buf)
{
    const char *path = disk ? fsfx_block_file(W.store, ws_block(i))
                            : fsfx_shard_path(&W.fx, ws_block(i), ws_shard(i));
    off_t off = disk ? (off_t)ws_shard(i) * SHARD : 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    size_t got = 0;

    if (fd < 0)
        return -errno;
    while (got < SHARD) {
        ssize_t n = pread(fd, buf + got, SHARD - got, off + (off_t)got);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    return (long)got;
}

struct ws_arg {
    struct ws_shared *sh;
    int id;
};

static int ws_writer_main(void *p)
{
    struct ws_arg *a = p;
    struct ws_shared *sh = a->sh;
    uint8_t *buf = malloc(SHARD);

    TU_CK(buf != NULL);
    /* Relaxed: see struct ws_shared. */
    for (long n = 0; n < WS_MAX_OPS && !atomic_load_explicit(&sh->stop, memory_order_relaxed);
         n++) {
        unsigned i = (unsigned)((n + a->id) % WS_NSHARDS);
        /* Release: count version v before any of its bytes can be read. */
        uint32_t v = atomic_fetch_add_explicit(&sh->started[a->id], 1, memory_order_release);
        int fd;

        ws_fill(i, (uint32_t)a->id, v, buf);
        fd = open(fsfx_shard_path(&W.fx, ws_block(i), ws_shard(i)), O_WRONLY | O_TRUNC | O_CLOEXEC);
        if (fd < 0) {
            sh->write_errs[a->id]++;
            fprintf(stderr, "writer %d: open shard %u: %s\n", a->id, i, strerror(errno));
            continue;
        }
        if (write(fd, buf, SHARD) != (ssize_t)SHARD) {
            sh->write_errs[a->id]++;
            fprintf(stderr, "writer %d: write shard %u: %s\n", a->id, i, strerror(errno));
        }
        if (close(fd) != 0) {
            sh->write_errs[a->id]++;
            fprintf(stderr, "writer %d: close shard %u: %s\n", a->id, i, strerror(errno));
        } else {
            sh->writes[a->id]++;
        }
    }
    free(buf);
    return 0;
}

static int ws_reader_main(void *p)
{
    struct ws_arg *a = p;
    struct ws_shared *sh = a->sh;
    uint8_t *buf = malloc(SHARD);
    char what[256];

    TU_CK(buf != NULL);
    /* Relaxed: see struct ws_shared. */
    for (long n = 0; n < WS_MAX_OPS && !atomic_load_explicit(&sh->stop, memory_order_relaxed);
         n++) {
        unsigned i = (unsigned)((n * 5 + a->id) % WS_NSHARDS);
        long got = ws_read(i, false, buf);
        uint32_t w = 0, v = 0;
        int c;

        if (got != (long)SHARD) {
            sh->read_errs[a->id]++;
            fprintf(stderr, "reader %d: shard %u: read %ld of %u bytes\n", a->id, i, got, SHARD);
            continue;
        }
        sh->reads[a->id]++;
        c = ws_classify(i, buf, &w, &v, what, sizeof(what));
        /* Acquire: pairs with the writer's release (a version read is
         * counted by now). */
        if (c == 1 && v >= atomic_load_explicit(&sh->started[w], memory_order_acquire)) {
            snprintf(what, sizeof(what), "shard %u: version w%u v%u was never begun", i, w, v);
            c = -1;
        }
        if (c == 0)
            sh->olds[a->id]++;
        if (c < 0) {
            int none = 0;

            sh->bad[a->id]++;
            fprintf(stderr, "reader %d: %s\n", a->id, what);
            /* Relaxed: the parent reads what after waitpid. */
            if (atomic_compare_exchange_strong_explicit(&sh->first_bad, &none, 1,
                                                        memory_order_relaxed,
                                                        memory_order_relaxed))
                snprintf(sh->what, sizeof(sh->what), "reader %d, read %ld: %s", a->id,
                         sh->reads[a->id], what);
        }
    }
    free(buf);
    return 0;
}

Test(fs_write, writers_and_readers_of_the_same_shards_see_whole_versions, .timeout = 180)
{
    struct ws_shared *sh;
    struct ws_arg args[WS_WRITERS + WS_READERS];
    pid_t kids[WS_WRITERS + WS_READERS];
    long writes = 0, write_errs = 0, reads = 0, olds = 0, bad = 0, read_errs = 0;
    static uint8_t cached[SHARD], stored[SHARD];
    char what[256];

    for (unsigned b = 0; b < WS_BLOCKS; b++)
        store_write(WS_BLOCK0 + b, WS_SHARDS);
    /* 4 slots for 6 shards: loads and stores evict each other. */
    start_spec(NULL, "capacity=256K,reserved=0");
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq((void *)sh, MAP_FAILED);
    memset(sh, 0, sizeof(*sh));
    for (int i = 0; i < WS_WRITERS + WS_READERS; i++) {
        bool writer = i < WS_WRITERS;

        args[i] = (struct ws_arg){.sh = sh, .id = writer ? i : i - WS_WRITERS};
        kids[i] = tu_fork(writer ? ws_writer_main : ws_reader_main, &args[i]);
    }
    fsfx_sleep_ms(WS_ACTIVE_MS);
    /* Relaxed: see struct ws_shared. */
    atomic_store_explicit(&sh->stop, 1, memory_order_relaxed);
    for (int i = 0; i < WS_WRITERS + WS_READERS; i++)
        cr_assert_eq(tu_wait(kids[i]), 0, "%s %d failed", i < WS_WRITERS ? "writer" : "reader",
                     args[i].id);
    for (int w = 0; w < WS_WRITERS; w++) {
        writes += sh->writes[w];
        write_errs += sh->write_errs[w];
    }
    for (int r = 0; r < WS_READERS; r++) {
        reads += sh->reads[r];
        olds += sh->olds[r];
        bad += sh->bad[r];
        read_errs += sh->read_errs[r];
    }
    cr_log_info("%d writers: %ld whole shards written, %ld errors; %d readers: %ld whole reads "
                "(%ld of the original), %ld not one whole version, %ld failed",
                WS_WRITERS, writes, write_errs, WS_READERS, reads, olds, bad, read_errs);
    cr_log_info("cache: %lld evictions, %lld misses, %lld backend loads",
                fsfx_stat(&W.fx, "shardfs_evictions_total"),
                fsfx_stat(&W.fx, "shardfs_misses_total"),
                fsfx_stat(&W.fx, "shardfs_backend_loads_total"));
    cr_assert_gt(fsfx_stat(&W.fx, "shardfs_evictions_total"), 0,
                 "the cache never evicted: no stress");
    cr_assert_eq(bad, 0, "%ld of %ld reads were not one whole version; first: %s", bad, reads,
                 sh->what);
    cr_assert_eq(read_errs, 0, "%ld reads failed", read_errs);
    cr_assert_eq(write_errs, 0, "%ld writes failed", write_errs);
    for (int w = 0; w < WS_WRITERS; w++)
        cr_assert_gt(sh->writes[w], 0, "writer %d wrote nothing", w);
    for (int r = 0; r < WS_READERS; r++)
        cr_assert_gt(sh->reads[r], 0, "reader %d read nothing", r);

    /* The writers are done: the cache and the store agree on each shard's
     * last committed version. */
    for (unsigned i = 0; i < WS_NSHARDS; i++) {
        uint32_t w, v;

        cr_assert_eq(ws_read(i, false, cached), (long)SHARD, "shard %u through the mount", i);
        cr_assert_eq(ws_read(i, true, stored), (long)SHARD, "shard %u on disk", i);
        cr_assert_geq(ws_classify(i, stored, &w, &v, what, sizeof(what)), 0, "on disk: %s", what);
        cr_assert_geq(ws_classify(i, cached, &w, &v, what, sizeof(what)), 0, "mount: %s", what);
        cr_assert_eq(memcmp(cached, stored, SHARD), 0,
                     "shard %u: the mount serves another version than the store's", i);
    }
    munmap(sh, sizeof(*sh));
    cr_assert_eq(fsfx_stop(&W.fx, false, 10.0), 0);
}
