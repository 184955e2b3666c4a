/* SPDX-License-Identifier: MIT */
/*
 * test_fs_fullcache.c - stores and removes through a mount hold the key's
 * slot: with a cache that has no slot to give (every slot leased by another
 * process until wait_timeout) they change nothing and fail.
 *
 * A store takes the key's slot (the cache's per-key writer lock) or stores
 * nothing: it never writes around the cache, where a reader taking a slot
 * released meanwhile would load the previous block file and publish it after
 * the commit (the cache serving an older version than the store). So a
 * whole shard written then is refused at close(2) with EAGAIN (as a read is),
 * the error is final for that open file, the store keeps the old bytes, and
 * the same write succeeds once a slot is free. An unlink holds the key's
 * slot the same way, so no reader loads the shard from the block file being
 * removed and publishes it after the unlink (it fails EAGAIN too when no
 * slot can be had).
 *
 * The daemon binary runs on a real mount (tests/fsfixture.h) with a 2-slot
 * cache; a forked process attached to it holds both slots. Needs /dev/fuse
 * and fusermount3; skips without.
 */
#include "fsfixture.h"
#include "testutil.h"

#include <shardfs/cache.h>

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
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
    pid_t holder;
    int ready[2], go[2]; /* the holder's pipes */
} F;

static void setup(void)
{
    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    memset(&F, 0, sizeof(F));
    F.ready[0] = F.ready[1] = F.go[0] = F.go[1] = -1;
    snprintf(F.store, sizeof(F.store), "%s", tu_path("store"));
    snprintf(F.fx.mnt, sizeof(F.fx.mnt), "%s", tu_path("mnt"));
    snprintf(F.fx.sock, sizeof(F.fx.sock), "%s", tu_path("sock"));
    snprintf(F.fx.log, sizeof(F.fx.log), "%s", tu_path("log"));
    F.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
    mkdir(F.store, 0755);
}

static void teardown(void)
{
    if (F.go[1] >= 0)
        close(F.go[1]); /* a holder still waiting lets go */
    if (F.holder > 0)
        tu_wait_for(F.holder, 10ll * 1000000000);
    if (F.go[0] >= 0)
        close(F.go[0]);
    for (int i = 0; i < 2; i++)
        if (F.ready[i] >= 0)
            close(F.ready[i]);
    if (F.fx.pid > 0)
        fsfx_stop(&F.fx, true, 10.0);
    fsfx_cleanup(&F.fx, F.store);
}

TestSuite(fs_fullcache, .init = setup, .fini = teardown, .timeout = 120);

/* The daemon on the store: 2 slots, none reserved, the given wait_timeout. */
static void start(const char *wait_timeout)
{
    char o[256];
    int st = 0, r;

    snprintf(o, sizeof(o),
             "hugepages=off,shard_size=64K,capacity=128K,reserved=0,readahead=0,wait_timeout=%s",
             wait_timeout);
    r = fsfx_start(&F.fx, F.store, o, 10.0, &st);
    cr_assert_eq(r, 0, "daemon did not mount (%s, status %d), see %s", strerror(-r), st, F.fx.log);
}

/* In a process attached to the daemon's cache: fill two keys no test reads
 * and keep their leases (every slot of the cache) until told to let go. */
static int hold_every_slot(struct sfs_cache *c, void *arg)
{
    struct sfs_key k[2] = {tu_key(200, 0), tu_key(201, 0)};
    struct sfs_lease l[2];
    char ch = 0;

    (void)arg;
    /* With a deadline: the daemon releases a read's lease after its reply,
     * so the test's last read through the mount may hold a slot still. */
    for (int i = 0; i < 2; i++) {
        TU_CK(sfs_cache_get(c, &k[i], 0, sfs_now_ns() + 5000000000ll, &l[i]) == SFS_OWNER);
        TU_CK(tu_publish(c, &k[i], &l[i]) == 0);
    }
    TU_CK(write(F.ready[1], &ch, 1) == 1);
    (void)!read(F.go[0], &ch, 1); /* a byte, or EOF when the test ends */
    for (int i = 0; i < 2; i++)
        sfs_cache_release(c, &l[i]);
    return 0;
}

static void hold_start(void)
{
    char ch;

    cr_assert_eq(pipe(F.ready), 0);
    cr_assert_eq(pipe(F.go), 0);
    F.holder = tu_fork_attached(F.fx.sock, 0, hold_every_slot, NULL);
    cr_assert_gt(F.holder, 0);
    close(F.ready[1]); /* the holder's alone: its failure reads as EOF, not a hang */
    F.ready[1] = -1;
    cr_assert_eq(read(F.ready[0], &ch, 1), 1, "the lease holder failed (status %d)",
                 tu_wait(F.holder));
}

static void hold_stop(void)
{
    char ch = 1;

    cr_assert_eq(write(F.go[1], &ch, 1), 1);
    cr_assert_eq(tu_wait(F.holder), 0, "the lease holder failed");
    F.holder = 0;
}

/* Shard (BLOCK, 0) holds the old bytes (new: false) or the new ones (true):
 * through the mount, when `mount`, and in the block file. */
static void assert_shard(bool new_bytes, bool mount, const char *when)
{
    uint8_t *buf = malloc(SHARD);
    struct sfs_key k = tu_key(new_bytes ? NEW + BLOCK : BLOCK, 0);
    const char *what = new_bytes ? "new" : "old";
    int fd;
    long n;

    cr_assert_not_null(buf);
    fd = open(fsfx_block_file(F.store, BLOCK), O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "%s", strerror(errno));
    cr_assert_eq(pread(fd, buf, SHARD, 0), (ssize_t)SHARD);
    close(fd);
    cr_assert_eq(tu_check(&k, buf, SHARD), -1, "%s: the block file does not hold the %s bytes",
                 when, what);
    if (mount) {
        n = fsfx_read_all(fsfx_shard_path(&F.fx, BLOCK, 0), buf, SHARD);
        cr_assert_eq(n, (long)SHARD, "%s: read through the mount: %ld", when, n);
        cr_assert_eq(tu_check(&k, buf, SHARD), -1, "%s: the mount does not serve the %s bytes",
                     when, what);
    }
    free(buf);
}

/* Open shard (BLOCK, 0) with O_TRUNC and write the whole new shard. */
static int write_new(void)
{
    uint8_t *buf = malloc(SHARD);
    struct sfs_key k = tu_key(NEW + BLOCK, 0);
    int fd;

    cr_assert_not_null(buf);
    tu_fill(&k, buf, SHARD);
    fd = open(fsfx_shard_path(&F.fx, BLOCK, 0), O_WRONLY | O_TRUNC | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open for writing: %s", strerror(errno));
    cr_assert_eq(write(fd, buf, SHARD), (ssize_t)SHARD, "write: %s", strerror(errno));
    free(buf);
    return fd;
}

/* A whole shard written while no slot can be had: close(2) fails EAGAIN and
 * nothing is stored, then or after (the error is final for that open file,
 * its RELEASE stores nothing either); with a slot free again the same write
 * commits and every read serves it. */
Test(fs_fullcache, a_store_with_no_slot_fails_eagain_and_stores_nothing, .timeout = 60)
{
    int fd, fd2, r, e;

    cr_assert_eq(tu_store_write(F.store, BLOCK, 1, 1, SHARD, NULL, NULL, false), 0);
    start("1");
    assert_shard(false, true, "before");
    hold_start();

    fd = write_new();
    fd2 = dup(fd);
    cr_assert_geq(fd2, 0);
    errno = 0;
    r = close(fd2); /* a FLUSH of a whole shard: the store */
    e = errno;
    cr_assert_eq(r, -1, "close() of a store with no slot to be had returned 0");
    cr_assert_eq(e, EAGAIN, "close(): %s, not EAGAIN", strerror(e));
    assert_shard(false, false, "after the refused store");

    /* Slots free now: the refusal was final, the last close stores nothing. */
    hold_stop();
    errno = 0;
    r = close(fd);
    e = errno;
    cr_assert(r == -1 && e == EAGAIN, "the last close after a refused store: %d (%s)", r,
              strerror(e));
    for (int i = 0; i < 5; i++) {
        assert_shard(false, true, "after the last close of the refused write");
        fsfx_sleep_ms(40); /* the RELEASE comes after close(2) returns */
    }

    /* The same write with a slot to be had commits. */
    fd = write_new();
    cr_assert_eq(close(fd), 0, "close() with free slots: %s", strerror(errno));
    assert_shard(true, true, "after the write with free slots");
    assert_shard(true, true, "read again (a hit)");
    cr_assert_eq(fsfx_stop(&F.fx, false, 10.0), 0);
}

/* An unlink while no slot can be had removes nothing and fails EAGAIN (a
 * remove takes the key's slot as a store does); once a slot is free it
 * removes the shard. */
Test(fs_fullcache, an_unlink_with_no_slot_fails_eagain_and_removes_nothing, .timeout = 60)
{
    struct stat st;
    int r, e;

    cr_assert_eq(tu_store_write(F.store, BLOCK, 1, 1, SHARD, NULL, NULL, false), 0);
    start("1");
    hold_start();
    errno = 0;
    r = unlink(fsfx_shard_path(&F.fx, BLOCK, 0));
    e = errno;
    cr_assert(r == -1 && e == EAGAIN, "unlink with no slot to be had: %d (%s)", r, strerror(e));
    hold_stop();
    assert_shard(false, true, "after the refused unlink");
    cr_assert_eq(unlink(fsfx_shard_path(&F.fx, BLOCK, 0)), 0, "%s", strerror(errno));
    cr_assert_eq(stat(fsfx_block_file(F.store, BLOCK), &st), -1, "the block file is still there");
    cr_assert_eq(fsfx_read_all(fsfx_shard_path(&F.fx, BLOCK, 0), &st, 1), -ENOENT);
    cr_assert_eq(fsfx_stop(&F.fx, false, 10.0), 0);
}

/* Readers hammering a shard while it is unlinked. */
struct hammer {
    const struct fsfx *fx;
    _Atomic int stop;
};

static void *hammer_main(void *p)
{
    struct hammer *h = p;
    uint8_t *buf = malloc(SHARD);

    while (buf && !atomic_load_explicit(&h->stop, memory_order_relaxed))
        (void)fsfx_read_all(fsfx_shard_path(h->fx, BLOCK, 0), buf, SHARD);
    free(buf);
    return NULL;
}

/* The unlink's window: a reader that loaded the shard from the block file
 * between the cache's remove and the backend's would publish the removed
 * bytes after the unlink, and the cache would serve them until evicted.
 * Readers hammer the shard while it is unlinked, many rounds: once unlink
 * returned 0, no read may return bytes. (Not deterministic: the window is
 * microseconds wide, so the rounds make it likely, not certain, that a
 * broken remove is caught.) */
#define ROUNDS  300
#define HAMMERS 3
Test(fs_fullcache, no_read_serves_a_shard_after_its_unlink_returned, .timeout = 120)
{
    uint8_t *buf = malloc(SHARD);
    int stale = 0, rounds = 0;

    cr_assert_not_null(buf);
    cr_assert_eq(tu_store_write(F.store, BLOCK, 1, 1, SHARD, NULL, NULL, false), 0);
    {
        char o[256];
        int st = 0, r;

        /* Room for the shard whatever the readers lease. */
        snprintf(o, sizeof(o), "hugepages=off,shard_size=64K,capacity=1M,readahead=0");
        r = fsfx_start(&F.fx, F.store, o, 10.0, &st);
        cr_assert_eq(r, 0, "daemon did not mount (%s), see %s", strerror(-r), F.fx.log);
    }
    for (int i = 0; i < ROUNDS; i++) {
        struct hammer h = {.fx = &F.fx};
        pthread_t t[HAMMERS];
        int r = -1;
        long n;

        if (i)
            cr_assert_eq(tu_store_write(F.store, BLOCK, 1, 1, SHARD, NULL, NULL, false), 0);
        for (int j = 0; j < HAMMERS; j++)
            cr_assert_eq(pthread_create(&t[j], NULL, hammer_main, &h), 0);
        fsfx_sleep_ms(1 + i % 3);
        /* EBUSY: a reader's lease outlived the grace; try again. */
        for (int k = 0; k < 50 && r != 0; k++) {
            r = unlink(fsfx_shard_path(&F.fx, BLOCK, 0));
            cr_assert(r == 0 || errno == EBUSY, "unlink: %s", strerror(errno));
        }
        atomic_store_explicit(&h.stop, 1, memory_order_relaxed);
        for (int j = 0; j < HAMMERS; j++)
            pthread_join(t[j], NULL);
        if (r != 0)
            continue;
        rounds++;
        n = fsfx_read_all(fsfx_shard_path(&F.fx, BLOCK, 0), buf, SHARD);
        if (n >= 0)
            stale++;
    }
    free(buf);
    cr_assert_eq(stale, 0, "%d of %d unlinked shards were still served", stale, rounds);
    cr_assert_gt(rounds, ROUNDS / 2, "only %d of %d unlinks went through", rounds, ROUNDS);
    cr_assert_eq(fsfx_stop(&F.fx, false, 10.0), 0);
}

/* ---------------------------------------------------------------------------
 * The write-around window, staged: a store that could not take a slot and
 * wrote around the cache is held inside its dump (the test holds the flock
 * of the block's <file>.tmp, which every posix commit takes first); the
 * leases are released meanwhile and a reader loads the shard from the block
 * file, still the old one; then the dump goes on and commits.
 */

struct writer {
    const char *path;
    int result, err; /* close(2)'s result and errno; -2: open or write failed */
    _Atomic int done;
};

/* The whole new shard through one open file, then close(2); no asserts
 * here (a thread of the test): the test checks w->result. */
static void *writer_main(void *p)
{
    struct writer *w = p;
    uint8_t *buf = malloc(SHARD);
    struct sfs_key k = tu_key(NEW + BLOCK, 0);
    int fd = open(w->path, O_WRONLY | O_TRUNC | O_CLOEXEC);

    w->result = -2;
    if (buf && fd >= 0) {
        tu_fill(&k, buf, SHARD);
        if (write(fd, buf, SHARD) == (ssize_t)SHARD) {
            errno = 0;
            w->result = close(fd);
            w->err = errno;
            fd = -1;
        }
    }
    if (fd >= 0)
        close(fd);
    free(buf);
    atomic_store_explicit(&w->done, 1, memory_order_release); /* publishes result, err */
    return NULL;
}

/* Some process waits for a flock on inode ino (a "->" line of /proc/locks). */
static bool flock_waited_on(ino_t ino)
{
    char line[256], pat[64];
    bool found = false;
    FILE *f = fopen("/proc/locks", "re");

    if (!f)
        return false;
    snprintf(pat, sizeof(pat), ":%llu ", (unsigned long long)ino);
    while (!found && fgets(line, sizeof(line), f))
        found = strstr(line, "->") && strstr(line, "FLOCK") && strstr(line, pat);
    fclose(f);
    return found;
}

Test(fs_fullcache, a_store_never_commits_behind_a_reader_of_the_previous_bytes, .timeout = 60)
{
    struct writer w = {0};
    char tmp[300];
    struct stat st;
    pthread_t t;
    bool in_dump = false;
    double t0;
    int fd;

    cr_assert_eq(tu_store_write(F.store, BLOCK, 1, 1, SHARD, NULL, NULL, false), 0);
    start("1");
    hold_start();
    snprintf(tmp, sizeof(tmp), "%s.lock", fsfx_block_file(F.store, BLOCK));
    fd = open(tmp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0, "%s: %s", tmp, strerror(errno));
    cr_assert_eq(flock(fd, LOCK_EX), 0);
    cr_assert_eq(fstat(fd, &st), 0);

    w.path = fsfx_shard_path(&F.fx, BLOCK, 0);
    cr_assert_eq(pthread_create(&t, NULL, writer_main, &w), 0);
    /* Either the store gives up (nothing written), or it went around the
     * cache and waits for the tmp's lock inside its dump. */
    t0 = fsfx_now_s();
    while (!atomic_load_explicit(&w.done, memory_order_acquire) && fsfx_now_s() - t0 < 20.0) {
        if (flock_waited_on(st.st_ino)) {
            in_dump = true;
            break;
        }
        fsfx_sleep_ms(2);
    }
    if (in_dump) {
        /* A lease goes away while the store is writing; a reader takes the
         * slot and loads the shard from the block file (not committed yet:
         * the old bytes are what it may read now). */
        hold_stop();
        assert_shard(false, true, "read during the store");
    }
    flock(fd, LOCK_UN);
    close(fd);
    pthread_join(t, NULL);
    cr_assert_neq(w.result, -2, "the writer could not open or write the shard");
    if (w.result == 0) {
        /* Committed: every read from now on serves the new bytes. */
        assert_shard(true, true, "after a close() that returned 0");
        assert_shard(true, true, "read again");
    } else {
        cr_assert_eq(w.err, EAGAIN, "close(): %s", strerror(w.err));
        cr_assert(!in_dump, "the store wrote around the cache and failed: %s", strerror(w.err));
        if (F.holder)
            hold_stop();
        assert_shard(false, true, "after the refused store");
    }
    cr_assert_eq(fsfx_stop(&F.fx, false, 10.0), 0);
}

/* A reader of the shard, in a thread: the bytes read or -errno. */
struct reader {
    const char *path;
    long n;
};

static void *reader_main(void *p)
{
    struct reader *r = p;
    uint8_t *buf = malloc(SHARD);

    r->n = buf ? fsfx_read_all(r->path, buf, SHARD) : -ENOMEM;
    free(buf);
    return NULL;
}

struct unlinker {
    const char *path;
    int result, err;
    _Atomic int done;
};

static void *unlinker_main(void *p)
{
    struct unlinker *u = p;

    errno = 0;
    u->result = unlink(u->path);
    u->err = errno;
    atomic_store_explicit(&u->done, 1, memory_order_release); /* publishes result, err */
    return NULL;
}

/* The unlink's window, staged as the store's above: the remove is held
 * inside the backend (the test holds the tmp's flock) while a reader reads
 * the shard; once unlink returned 0, no read serves it. On a remove that
 * drops the key from the cache first, the reader loads the block file, not
 * removed yet, and publishes it: the cache serves the removed shard. */
Test(fs_fullcache, an_unlink_never_returns_behind_a_reader_of_the_removed_bytes, .timeout = 60)
{
    struct unlinker u = {0};
    struct reader rd = {0};
    uint8_t one;
    char tmp[300];
    struct stat st;
    pthread_t tu, tr;
    bool in_remove = false;
    double t0;
    int fd;

    cr_assert_eq(tu_store_write(F.store, BLOCK, 1, 1, SHARD, NULL, NULL, false), 0);
    start("5");
    snprintf(tmp, sizeof(tmp), "%s.lock", fsfx_block_file(F.store, BLOCK));
    fd = open(tmp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0, "%s: %s", tmp, strerror(errno));
    cr_assert_eq(flock(fd, LOCK_EX), 0);
    cr_assert_eq(fstat(fd, &st), 0);

    u.path = rd.path = fsfx_shard_path(&F.fx, BLOCK, 0);
    cr_assert_eq(pthread_create(&tu, NULL, unlinker_main, &u), 0);
    t0 = fsfx_now_s();
    while (!in_remove && !atomic_load_explicit(&u.done, memory_order_acquire) &&
           fsfx_now_s() - t0 < 20.0) {
        in_remove = flock_waited_on(st.st_ino);
        fsfx_sleep_ms(2);
    }
    cr_assert(in_remove, "the unlink never reached the backend's remove (%d: %s)", u.result,
              strerror(u.err));
    /* A reader meanwhile: it may wait for the remove, or read the old bytes
     * now; either way what it got must not outlive the unlink. Given a
     * moment to get there (not a pass/fail bound: a slower reader only
     * makes the check weaker). */
    cr_assert_eq(pthread_create(&tr, NULL, reader_main, &rd), 0);
    fsfx_sleep_ms(300);
    flock(fd, LOCK_UN);
    close(fd);
    pthread_join(tu, NULL);
    pthread_join(tr, NULL);
    cr_assert_eq(u.result, 0, "unlink: %s", strerror(u.err));
    cr_assert(rd.n == (long)SHARD || rd.n == -ENOENT, "the reader during the unlink: %ld", rd.n);
    cr_assert_eq(stat(fsfx_block_file(F.store, BLOCK), &st), -1, "the block file is still there");
    for (int i = 0; i < 3; i++)
        cr_assert_eq(fsfx_read_all(fsfx_shard_path(&F.fx, BLOCK, 0), &one, 1), -ENOENT,
                     "a read after the unlink returned did not fail ENOENT");
    cr_assert_eq(fsfx_stop(&F.fx, false, 10.0), 0);
}
