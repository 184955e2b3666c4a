/* SPDX-License-Identifier: MIT */
/*
 * test_fs_limits.c - the mount under careless and hostile use: permissions
 * that hold for other users, a store that misbehaves (a FIFO in place of a
 * block file, symlinks leaving the store, a dump that never returns), and
 * options that would destroy what they name.
 *
 * Each test starts the daemon binary in the foreground on a fresh store and
 * mount point (tests/fsfixture.h) and drives the mount with
 * plain system calls, some of them from a forked child that has become
 * another user (uid/gid 65534). The suite's fini always unmounts.
 *
 * Needs /dev/fuse, fusermount3 and root (to become another user); skips
 * without them.
 */
#include "fsfixture.h"
#include "testutil.h"

#include <shardfs/backend.h>
#include <shardfs/cache.h>

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD  (64u << 10)
#define NOBODY 65534

struct mount {
    char store[128];
    struct fsfx fx; /* mnt, sock, log; pid while the daemon runs */
};

static struct mount M;

/* Write block b of nshards (tu_fill bytes) at path. */
static void write_block_at(const char *path, uint64_t b, unsigned nshards)
{
    uint8_t *buf = malloc(SHARD);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

    cr_assert_not_null(buf);
    cr_assert_geq(fd, 0, "create %s: %s", path, strerror(errno));
    for (uint32_t s = 0; s < nshards; s++) {
        struct sfs_key k = tu_key(b, s);

        tu_fill(&k, buf, SHARD);
        cr_assert_eq(pwrite(fd, buf, SHARD, (off_t)s * SHARD), (ssize_t)SHARD);
    }
    close(fd);
    free(buf);
}

static void store_block(uint64_t b, unsigned nshards)
{
    int r = tu_store_write(M.store, b, 1, nshards, SHARD, NULL, NULL, false);

    cr_assert_eq(r, 0, "store block %llu: %s", (unsigned long long)b, strerror(-r));
}

/* Start the daemon (tests/fsfixture.h) with backend spec (NULL: the store)
 * and extra -o options; wait for the mount. */
static void start_spec(const char *spec, const char *opts)
{
    char o[512];
    int st = 0, r;

    snprintf(o, sizeof(o), "hugepages=off,capacity=8M,shard_size=64K%s%s", opts && *opts ? "," : "",
             opts ? opts : "");
    r = fsfx_start(&M.fx, spec ? spec : M.store, o, 10.0, &st);
    cr_assert_eq(r, 0, "daemon did not mount (%s, status %d), see %s", strerror(-r), st, M.fx.log);
}

/* Wait up to limit_s for the daemon to exit; its status, or -1 (killed). */
static int reap_daemon(double limit_s)
{
    double t0 = fsfx_now_s();
    int st = 0;

    while (waitpid(M.fx.pid, &st, WNOHANG) != M.fx.pid) {
        if (fsfx_now_s() - t0 > limit_s) {
            kill(M.fx.pid, SIGKILL);
            waitpid(M.fx.pid, &st, 0);
            M.fx.pid = 0;
            return -1;
        }
        fsfx_sleep_ms(10);
    }
    M.fx.pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void setup(void)
{
    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    if (geteuid() != 0)
        cr_skip_test("not root: cannot become another user; skipped");
    memset(&M, 0, sizeof(M));
    M.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
    snprintf(M.store, sizeof(M.store), "%s", tu_path("store"));
    snprintf(M.fx.mnt, sizeof(M.fx.mnt), "%s", tu_path("mnt"));
    snprintf(M.fx.sock, sizeof(M.fx.sock), "%s", tu_path("sock"));
    snprintf(M.fx.log, sizeof(M.fx.log), "%s", tu_path("log"));
    mkdir(M.store, 0755);
    mkdir(M.fx.mnt, 0755);
}

static void teardown(void)
{
    /* SIGTERM first: an unmount of a daemon stuck in the backend (what a
     * failing test here leaves) can wait as long as it does. */
    if (M.fx.pid > 0) {
        kill(M.fx.pid, SIGTERM);
        fsfx_stop(&M.fx, true, 10.0);
    }
    fsfx_cleanup(&M.fx, M.store);
    if (M.fx.sock[0])
        unlink(M.fx.sock);
}

TestSuite(fs_limits, .init = setup, .fini = teardown, .timeout = 120);

/* Become uid/gid NOBODY, with the supplementary groups given. */
static int become_nobody(const gid_t *groups, size_t ngroups)
{
    if (setgroups(ngroups, groups) < 0 || setgid(NOBODY) < 0 || setuid(NOBODY) < 0)
        return -1;
    return 0;
}

/* Open + read a whole shard; 0 when it holds tu_fill's bytes of (b, s). */
static int read_shard_ok(uint64_t b, uint32_t s)
{
    uint8_t *buf = malloc(SHARD);
    struct sfs_key k = tu_key(b, s);
    int fd = open(fsfx_shard_path(&M.fx, b, s), O_RDONLY | O_CLOEXEC), ret = -1;

    if (buf && fd >= 0 && read(fd, buf, SHARD) == (ssize_t)SHARD && tu_check(&k, buf, SHARD) < 0)
        ret = 0;
    if (fd >= 0)
        close(fd);
    free(buf);
    return ret;
}

/* A refusal of another user: EACCES or EPERM. */
static bool refused(int r)
{
    return r < 0 && (errno == EACCES || errno == EPERM);
}

/* As another user: reads work, every change is refused. */
static int other_user_body(void *arg)
{
    int fd;

    (void)arg;
    TU_CK(become_nobody(NULL, 0) == 0);
    TU_CK(read_shard_ok(1, 0) == 0);
    TU_CK(read_shard_ok(1, 1) == 0);
    fd = open(fsfx_shard_path(&M.fx, 1, 0), O_WRONLY | O_CLOEXEC);
    TU_CK(refused(fd));
    fd = open(fsfx_shard_path(&M.fx, 1, 1), O_RDWR | O_TRUNC | O_CLOEXEC);
    TU_CK(refused(fd));
    fd = open(fsfx_shard_path(&M.fx, 1, 7), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    TU_CK(refused(fd));
    fd = open(fsfx_shard_path(&M.fx, 2, 0), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    TU_CK(refused(fd));
    TU_CK(refused(unlink(fsfx_shard_path(&M.fx, 1, 1))));
    TU_CK(refused(truncate(fsfx_shard_path(&M.fx, 1, 0), 0)));
    TU_CK(refused(setxattr(fsfx_block_dir(&M.fx, 1), "user.shardfs.prefetch", "1", 1, 0)));
    TU_CK(refused(chmod(fsfx_shard_path(&M.fx, 1, 0), 0666)));
    return 0;
}

Test(fs_limits, another_user_reads_but_cannot_change_a_root_store, .timeout = 60)
{
    uint8_t *buf = malloc(SHARD);
    struct sfs_key k = tu_key(1, 1);
    struct stat st;
    int fd;

    store_block(1, 2);
    start_spec(NULL, "allow_other");
    cr_assert_eq(stat(fsfx_shard_path(&M.fx, 1, 0), &st), 0);
    cr_expect_eq(st.st_uid, 0);
    cr_expect_eq(st.st_mode & 0777, 0644, "mode %o", st.st_mode & 0777);
    cr_assert_eq(tu_wait_for(tu_fork(other_user_body, NULL), 30ll * 1000000000), 0,
                 "another user changed the store (see the child's line above)");
    /* Nothing changed on disk. */
    fd = open(fsfx_block_file(M.store, 1), O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(fstat(fd, &st), 0);
    cr_expect_eq(st.st_size, 2 * SHARD);
    cr_assert_eq(pread(fd, buf, SHARD, SHARD), (ssize_t)SHARD);
    cr_expect_lt(tu_check(&k, buf, SHARD), 0, "shard 1 was changed");
    close(fd);
    free(buf);
}

/* -o socket= names something that is not a socket: refused, left alone. */
Test(fs_limits, socket_option_never_replaces_a_file, .timeout = 60)
{
    char out[1024] = "", path[200];
    int fd, st;
    FILE *f;

    store_block(1, 1);
    snprintf(path, sizeof(path), "%s/precious", M.store);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "keep me\n", 8), 8);
    close(fd);
    /* Bounded: a daemon that takes the path mounts and stays. */
    st = fsfx_sh(
        "timeout -s KILL 10 %s -f -o socket=%s,hugepages=off,capacity=8M,shard_size=64K %s %s "
        ">%s 2>&1",
        fsfx_daemon_bin(SHARDFS_BIN), path, M.store, M.fx.mnt, M.fx.log);
    cr_expect_eq(st, 1, "daemon status %d", st);
    cr_expect(!fsfx_is_mounted(M.fx.mnt));
    f = fopen(M.fx.log, "re");
    cr_assert_not_null(f);
    cr_expect_not_null(fgets(out, sizeof(out), f));
    cr_expect_null(fgets(out + strlen(out), (int)(sizeof(out) - strlen(out)), f),
                   "more than one line: %s", out);
    fclose(f);
    cr_expect_not_null(strstr(out, "not a socket"), "error: %s", out);
    cr_expect_not_null(strstr(out, path), "error: %s", out);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "the file named by socket= is gone");
    memset(out, 0, sizeof(out));
    cr_expect_eq(read(fd, out, sizeof(out)), 8);
    cr_expect_str_eq(out, "keep me\n");
    close(fd);
}

/* Replace block b's file by a FIFO (no writer ever comes). */
static void fifo_in_place(uint64_t b)
{
    cr_assert_eq(unlink(fsfx_block_file(M.store, b)), 0);
    cr_assert_eq(mkfifo(fsfx_block_file(M.store, b), 0644), 0, "mkfifo: %s", strerror(errno));
}

struct read_arg {
    int fd;
};

/* Read from an inherited fd: 0 when the read fails with EIO. */
static int read_eio_body(void *arg)
{
    struct read_arg *a = arg;
    char buf[4096];
    ssize_t n = read(a->fd, buf, sizeof(buf));

    TU_CK(n < 0 && errno == EIO);
    return 0;
}

/* A FIFO in place of a block file: the read is answered EIO at once; the
 * daemon does not sit in open() waiting for a writer. */
Test(fs_limits, fifo_in_place_of_a_block_answers_eio, .timeout = 60)
{
    struct read_arg a;
    double t0;
    int r;

    store_block(3, 4);
    start_spec(NULL, "readahead=0");
    a.fd = open(fsfx_shard_path(&M.fx, 3, 1), O_RDONLY | O_CLOEXEC);
    cr_assert_geq(a.fd, 0, "open: %s", strerror(errno));
    fifo_in_place(3);
    t0 = fsfx_now_s();
    r = tu_wait_for(tu_fork(read_eio_body, &a), 10ll * 1000000000);
    close(a.fd);
    cr_assert_eq(r, 0, "the read %s", r == -1 ? "hung (killed after 10 s)" : "was not EIO");
    cr_expect_lt(fsfx_now_s() - t0, 5.0);
    /* The daemon still serves. */
    store_block(4, 1);
    cr_expect_eq(read_shard_ok(4, 0), 0);
    /* The touch hint and listing do not wait on it either. */
    t0 = fsfx_now_s();
    setxattr(fsfx_block_dir(&M.fx, 3), "user.shardfs.touch", "1", 1, 0);
    cr_expect_lt(fsfx_now_s() - t0, 5.0);
}

/* SIGTERM while a reader of a FIFO block was started: the daemon exits
 * within the documented ~2 s (5 s here), status 0, and unmounts. */
Test(fs_limits, sigterm_exits_promptly_with_a_fifo_in_the_store, .timeout = 60)
{
    struct read_arg a;
    pid_t kid;
    double t0;
    int st;

    store_block(3, 4);
    start_spec(NULL, "readahead=0");
    a.fd = open(fsfx_shard_path(&M.fx, 3, 1), O_RDONLY | O_CLOEXEC);
    cr_assert_geq(a.fd, 0, "open: %s", strerror(errno));
    fifo_in_place(3);
    kid = tu_fork(read_eio_body, &a);
    close(a.fd);
    fsfx_sleep_ms(300);
    t0 = fsfx_now_s();
    kill(M.fx.pid, SIGTERM);
    st = reap_daemon(8.0);
    cr_expect_lt(fsfx_now_s() - t0, 5.0, "SIGTERM took %.1f s", fsfx_now_s() - t0);
    cr_expect_eq(st, 0, "daemon status %d (-1: killed after 8 s)", st);
    cr_expect(!fsfx_is_mounted(M.fx.mnt));
    cr_expect_geq(tu_wait_for(kid, 10ll * 1000000000), 0, "the reader hung after the stop");
}

/* Write one whole shard through the mount and close it. */
static int writer_body(void *arg)
{
    uint8_t *buf = calloc(1, SHARD);
    int fd = open(fsfx_shard_path(&M.fx, 5, 0), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

    (void)arg;
    TU_CK(buf && fd >= 0);
    TU_CK(write(fd, buf, SHARD) == (ssize_t)SHARD);
    close(fd); /* the dump behind it never completes: an error or a hang */
    free(buf);
    return 0;
}

/* A handler stuck in the backend (a dump that does not come back for a
 * minute) does not hold the stop: SIGTERM exits within ~2 s (5 s here). */
Test(fs_limits, sigterm_exits_promptly_with_a_handler_stuck_in_the_backend, .timeout = 90)
{
    char spec[300];
    pid_t kid;
    double t0;
    int st;

    snprintf(spec, sizeof(spec), "fault:stall_ms=60000:%s", M.store);
    store_block(1, 1);
    start_spec(spec, "readahead=0");
    kid = tu_fork(writer_body, NULL);
    fsfx_sleep_ms(500);
    cr_assert_eq(waitpid(kid, &st, WNOHANG), 0, "the writer did not get stuck in the dump");
    t0 = fsfx_now_s();
    kill(M.fx.pid, SIGTERM);
    st = reap_daemon(20.0);
    cr_expect_lt(fsfx_now_s() - t0, 5.0, "SIGTERM took %.1f s", fsfx_now_s() - t0);
    cr_expect_eq(st, 0, "daemon status %d (-1: killed after 20 s)", st);
    cr_expect(!fsfx_is_mounted(M.fx.mnt));
    cr_expect(access(M.fx.sock, F_OK) < 0, "the socket was left behind");
    cr_expect_geq(tu_wait_for(kid, 10ll * 1000000000), 0, "the writer hung after the stop");
}

/* A block file that is a symlink: followed while it stays in the store
 * (a relative link to another file of it), refused when it leaves. */
Test(fs_limits, symlinks_are_followed_only_inside_the_store, .timeout = 60)
{
    char outside[200], target[300], inside[200];
    long n;
    int fd;
    uint8_t *buf = malloc(SHARD);

    cr_assert_not_null(buf);
    store_block(1, 1);
    /* Block 6: a file outside the store holding block 6's bytes. */
    snprintf(outside, sizeof(outside), "%s", tu_path("outside"));
    write_block_at(outside, 6, 1);
    cr_assert_eq(symlink(outside, fsfx_block_file(M.store, 6)), 0);
    /* Block 7: the same, through a relative link that climbs out. */
    snprintf(target, sizeof(target), "../..%s", outside);
    cr_assert_eq(symlink(target, fsfx_block_file(M.store, 7)), 0);
    /* Block 8: a relative link to a file inside the store. */
    snprintf(inside, sizeof(inside), "%s/other", M.store);
    mkdir(inside, 0755);
    snprintf(inside, sizeof(inside), "%s/other/eight", M.store);
    write_block_at(inside, 8, 1);
    cr_assert_eq(symlink("../other/eight", fsfx_block_file(M.store, 8)), 0);
    start_spec(NULL, "readahead=0");

    cr_expect_eq(read_shard_ok(8, 0), 0, "a link inside the store is not followed");
    for (uint64_t b = 6; b <= 7; b++) {
        fd = open(fsfx_shard_path(&M.fx, b, 0), O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            n = read(fd, buf, SHARD);
            cr_expect_lt(n, 0, "block %d: %ld bytes read from outside the store", (int)b, n);
            close(fd);
        } else {
            cr_expect_eq(errno, ENOENT, "block %d: %s", (int)b, strerror(errno));
        }
    }
    unlink(outside);
    free(buf);
}

struct slow_reader {
    uint64_t b;
    uint32_t s;
    bool ok;
};

static void *slow_reader_main(void *arg)
{
    struct slow_reader *r = arg;

    r->ok = read_shard_ok(r->b, r->s) == 0;
    return NULL;
}

#define SLOW_READERS 80

/* Eighty readers of one shard behind a 3 s backend park, not sleep in
 * workers: a read of a resident shard meanwhile is answered at once. */
Test(fs_limits, readers_of_a_slow_shard_do_not_stall_resident_reads, .timeout = 90)
{
    static struct slow_reader r[SLOW_READERS];
    pthread_t t[SLOW_READERS];
    const char *lat = "latency_us=3000000";
    char spec[300];
    double t0, dt, total;

    snprintf(spec, sizeof(spec), "fault:seed=1:%s", M.store);
    store_block(1, 1);
    store_block(2, 1);
    start_spec(spec, "readahead=0");
    cr_assert_eq(read_shard_ok(2, 0), 0); /* resident from here on */
    cr_assert_eq(setxattr(M.fx.mnt, "user.shardfs.fault", lat, strlen(lat), 0), 0, "%s",
                 strerror(errno));
    t0 = fsfx_now_s();
    for (int i = 0; i < SLOW_READERS; i++) {
        r[i] = (struct slow_reader){.b = 1, .s = 0};
        cr_assert_eq(pthread_create(&t[i], NULL, slow_reader_main, &r[i]), 0);
    }
    fsfx_sleep_ms(500);
    dt = fsfx_now_s();
    cr_expect_eq(read_shard_ok(2, 0), 0);
    dt = fsfx_now_s() - dt;
    for (int i = 0; i < SLOW_READERS; i++)
        pthread_join(t[i], NULL);
    total = fsfx_now_s() - t0;
    for (int i = 0; i < SLOW_READERS; i++)
        cr_expect(r[i].ok, "slow reader %d read wrong bytes or failed", i);
    cr_expect_gt(total, 2.5, "the slow shard was not slow (%.1f s): the test proves nothing",
                 total);
    cr_expect_lt(dt, 1.0, "a resident read took %.2f s behind %d readers of a slow shard", dt,
                 SLOW_READERS);
}

/* Block b as a file of 2^20 shards of zeros: a sparse file, on a store
 * whose file system does not report holes (SHARDFS_TEST_NO_SEEK_DATA, the
 * test build's hook: where it does, a shard in a hole is a miss and this
 * block would hold none). Set before the daemon starts. */
static void store_huge_block(uint64_t b)
{
    char data[200];

    cr_assert_eq(setenv("SHARDFS_TEST_NO_SEEK_DATA", "1", 1), 0);
    snprintf(data, sizeof(data), "%s/data", M.store);
    mkdir(data, 0755);
    cr_assert_eq(truncate(fsfx_block_file(M.store, b), 0) == 0 || errno == ENOENT, true);
    close(open(fsfx_block_file(M.store, b), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    cr_assert_eq(truncate(fsfx_block_file(M.store, b), (off_t)SHARD << 20), 0, "%s",
                 strerror(errno));
}

static bool shard_ready(uint64_t b, uint32_t s)
{
    char v[32] = "";
    ssize_t n = getxattr(fsfx_shard_path(&M.fx, b, s), "user.shardfs.state", v, sizeof(v) - 1);

    return n > 0 && strncmp(v, "ready", 5) == 0;
}

/* The prefetch xattr on a block of 2^20 shards with a 128-slot cache:
 * returns at once, starts at most nslots/4 = 32 loads, and evicts nothing
 * (least of all what it loaded itself). */
Test(fs_limits, prefetch_of_a_huge_block_is_bounded, .timeout = 120)
{
    long long started, evicted;
    double t0, dt;

    store_huge_block(9);
    start_spec(NULL, "readahead=0"); /* capacity=8M: 128 slots of 64K */
    t0 = fsfx_now_s();
    cr_assert_eq(setxattr(fsfx_block_dir(&M.fx, 9), "user.shardfs.prefetch", "1", 1, 0), 0, "%s",
                 strerror(errno));
    dt = fsfx_now_s() - t0;
    cr_expect_lt(dt, 1.0, "the prefetch xattr took %.2f s", dt);
    started = fsfx_stat(&M.fx, "shardfs_fs_prefetch_started_total");
    cr_expect(started > 0 && started <= 32, "prefetch started %lld loads (bound: 32)", started);
    for (t0 = fsfx_now_s(); fsfx_now_s() - t0 < 10.0 && !shard_ready(9, (uint32_t)started - 1);)
        fsfx_sleep_ms(10);
    for (long long s = 0; s < started; s++)
        cr_expect(shard_ready(9, (uint32_t)s), "prefetched shard %lld is not ready", s);
    evicted = fsfx_stat(&M.fx, "shardfs_evictions_total");
    cr_expect_eq(evicted, 0, "prefetch evicted %lld slots", evicted);
    /* A second request goes on where the first stopped, as bounded. */
    cr_assert_eq(setxattr(fsfx_block_dir(&M.fx, 9), "user.shardfs.prefetch", "1", 1, 0), 0);
    cr_expect_leq(fsfx_stat(&M.fx, "shardfs_fs_prefetch_started_total"), 2 * started);
    cr_expect_eq(fsfx_stat(&M.fx, "shardfs_evictions_total"), 0);
}

/* VmRSS of pid in KiB; -1 if unknown. */
static long rss_kib(pid_t pid)
{
    char path[64], line[256];
    long v = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "re");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            v = atol(line + 6);
    fclose(f);
    return v;
}

#define HANDLES 40

/* Forty open directory handles on a block of 2^20 shards: the daemon's RSS
 * stays within 64 MiB of where it was (it grew by ~34 MiB per handle when a
 * handle held every name), and a full listing still names every shard. */
Test(fs_limits, listing_a_huge_block_costs_bounded_memory, .timeout = 120)
{
    DIR *dirs[HANDLES];
    long before, after;
    char dir[256];
    struct dirent *de;
    size_t n = 0;
    uint32_t last = 0;

    store_huge_block(9);
    {
        /* The bound is on what the daemon keeps: in a sanitizer build, the
         * freed memory ASan holds back (its quarantine, 256 MiB) is not
         * (each listing's probes of 2^20 shards free as they go). No effect
         * on another build. */
        const char *was = getenv("ASAN_OPTIONS");
        char opts[512], *saved = was ? strdup(was) : NULL;

        snprintf(opts, sizeof(opts), "%s%squarantine_size_mb=0:thread_local_quarantine_size_kb=0",
                 was ? was : "", was && *was ? ":" : "");
        setenv("ASAN_OPTIONS", opts, 1);
        start_spec(NULL, "readahead=0");
        if (saved)
            setenv("ASAN_OPTIONS", saved, 1);
        else
            unsetenv("ASAN_OPTIONS");
        free(saved);
    }
    snprintf(dir, sizeof(dir), "%s/shard", fsfx_block_dir(&M.fx, 9));
    before = rss_kib(M.fx.pid);
    cr_assert_gt(before, 0);
    for (int i = 0; i < HANDLES; i++) {
        dirs[i] = opendir(dir);
        cr_assert_not_null(dirs[i], "opendir: %s", strerror(errno));
        cr_assert_not_null(readdir(dirs[i]));
    }
    after = rss_kib(M.fx.pid);
    cr_expect_lt(after - before, 64 * 1024, "%d handles grew the daemon by %ld MiB", HANDLES,
                 (after - before) / 1024);
    for (int i = 1; i < HANDLES; i++)
        closedir(dirs[i]);
    /* The first handle, read to the end: every shard, in order. */
    while ((de = readdir(dirs[0])) != NULL) {
        uint32_t s;

        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        s = (uint32_t)strtoul(de->d_name, NULL, 10);
        cr_assert(n == 0 || s == last + 1, "listing jumps from %u to %u", last, s);
        last = s;
        n++;
    }
    closedir(dirs[0]);
    cr_expect_eq(n, (size_t)1 << 20, "listed %zu shards", n);
    cr_expect_eq(last, (1u << 20) - 1);
}

#define KV_GROUP 4242 /* a group no one here is in but the test's child */

/* In KV_GROUP: write a new shard and replace one, read them back, unlink. */
static int group_member_body(void *arg)
{
    gid_t g = KV_GROUP;
    uint8_t *buf = malloc(SHARD);
    struct sfs_key k = tu_key(1, 3);
    int fd;

    (void)arg;
    TU_CK(buf && become_nobody(&g, 1) == 0);
    TU_CK(read_shard_ok(1, 0) == 0);
    tu_fill(&k, buf, SHARD);
    fd = open(fsfx_shard_path(&M.fx, 1, 3), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    TU_CK(fd >= 0);
    TU_CK(write(fd, buf, SHARD) == (ssize_t)SHARD);
    TU_CK(close(fd) == 0);
    TU_CK(read_shard_ok(1, 3) == 0);
    TU_CK(unlink(fsfx_shard_path(&M.fx, 1, 3)) == 0);
    free(buf);
    return 0;
}

/* Not in KV_GROUP: reads (the store is o+r), never writes. */
static int outsider_body(void *arg)
{
    (void)arg;
    TU_CK(become_nobody(NULL, 0) == 0);
    TU_CK(read_shard_ok(1, 0) == 0);
    TU_CK(refused(open(fsfx_shard_path(&M.fx, 1, 0), O_WRONLY | O_CLOEXEC)));
    TU_CK(refused(open(fsfx_shard_path(&M.fx, 1, 4), O_WRONLY | O_CREAT | O_CLOEXEC, 0644)));
    return 0;
}

/* Group access, as docs/fs.md says to grant it: chgrp and chmod g+w the
 * backend directory; the mount shows that group and mode, its members may
 * write, everyone else only reads. */
Test(fs_limits, a_group_granted_on_the_store_may_write, .timeout = 60)
{
    struct stat st;

    store_block(1, 2);
    cr_assert_eq(chown(M.store, 0, KV_GROUP), 0);
    cr_assert_eq(chmod(M.store, 02775), 0);
    start_spec(NULL, "allow_other,readahead=0");
    cr_assert_eq(stat(fsfx_shard_path(&M.fx, 1, 0), &st), 0);
    cr_expect_eq(st.st_gid, KV_GROUP);
    cr_expect_eq(st.st_mode & 0777, 0664, "shard mode %o", st.st_mode & 0777);
    cr_assert_eq(stat(M.fx.mnt, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0775, "root mode %o", st.st_mode & 0777);
    cr_expect_eq(tu_wait_for(tu_fork(group_member_body, NULL), 30ll * 1000000000), 0,
                 "a member of the store's group could not write");
    cr_expect_eq(tu_wait_for(tu_fork(outsider_body, NULL), 30ll * 1000000000), 0,
                 "someone outside the store's group could write");
}

/* A store only its owner may enter: so is the mount. */
static int locked_out_body(void *arg)
{
    (void)arg;
    TU_CK(become_nobody(NULL, 0) == 0);
    TU_CK(refused(open(fsfx_shard_path(&M.fx, 1, 0), O_RDONLY | O_CLOEXEC)));
    return 0;
}

Test(fs_limits, a_private_store_makes_a_private_mount, .timeout = 60)
{
    store_block(1, 1);
    cr_assert_eq(chmod(M.store, 0700), 0);
    start_spec(NULL, "allow_other,readahead=0");
    cr_expect_eq(read_shard_ok(1, 0), 0);
    cr_expect_eq(tu_wait_for(tu_fork(locked_out_body, NULL), 30ll * 1000000000), 0,
                 "another user read a 0700 store through the mount");
}

/* A read whose own load the backend does not answer gives up at
 * wait_timeout (ETIMEDOUT), as a waiter does; the load goes on, and a later
 * read gets the shard. */
Test(fs_limits, a_read_behind_a_silent_backend_ends_at_wait_timeout, .timeout = 60)
{
    uint8_t *buf = malloc(SHARD);
    char spec[300];
    double t0, dt;
    int fd;
    ssize_t n;

    cr_assert_not_null(buf);
    snprintf(spec, sizeof(spec), "fault:latency_us=5000000:%s", M.store);
    store_block(1, 1);
    start_spec(spec, "readahead=0,wait_timeout=1");
    fd = open(fsfx_shard_path(&M.fx, 1, 0), O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    t0 = fsfx_now_s();
    n = read(fd, buf, SHARD);
    dt = fsfx_now_s() - t0;
    cr_expect(n < 0 && errno == ETIMEDOUT, "read: %zd (%s) after %.1f s", n,
              n < 0 ? strerror(errno) : "bytes", dt);
    cr_expect_lt(dt, 3.0, "the read waited %.1f s with wait_timeout=1", dt);
    close(fd);
    /* The load finishes (5 s) and publishes for the next reader. */
    t0 = fsfx_now_s();
    while (fsfx_now_s() - t0 < 10.0 && !shard_ready(1, 0))
        fsfx_sleep_ms(50);
    cr_expect_eq(read_shard_ok(1, 0), 0);
    free(buf);
}

struct shard_writer {
    uint64_t b;
    uint32_t s;
};

/* Write shard (b, s) whole through the mount (bytes of key (b + 1000, s))
 * and close it: 0 when that finished, whatever the outcome. */
static int shard_writer_body(void *arg)
{
    struct shard_writer *w = arg;
    struct sfs_key k = tu_key(w->b + 1000, w->s);
    uint8_t *buf = malloc(SHARD);
    int fd =
        open(fsfx_shard_path(&M.fx, w->b, w->s), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

    TU_CK(buf && fd >= 0);
    tu_fill(&k, buf, SHARD);
    (void)!write(fd, buf, SHARD);
    close(fd);
    free(buf);
    return 0;
}

/* A commit reads the block it rewrites as a load does: a block file that
 * is a link out of the store never has the outside bytes copied into the
 * committed block, and one that is a FIFO never holds the writer. */
Test(fs_limits, a_commit_never_reads_outside_the_store_nor_waits_on_a_fifo, .timeout = 60)
{
    struct shard_writer w6 = {6, 1}, w9 = {9, 0};
    char outside[200];
    uint8_t *buf = malloc(SHARD);
    struct sfs_key k6 = tu_key(6, 0);
    struct stat st;
    int fd, r;

    cr_assert_not_null(buf);
    store_block(1, 1);
    snprintf(outside, sizeof(outside), "%s", tu_path("outside"));
    write_block_at(outside, 6, 2);
    cr_assert_eq(symlink(outside, fsfx_block_file(M.store, 6)), 0);
    store_block(9, 1);
    fifo_in_place(9);
    start_spec(NULL, "readahead=0");

    r = tu_wait_for(tu_fork(shard_writer_body, &w6), 10ll * 1000000000);
    cr_expect_geq(r, 0, "the writer of the linked block hung");
    cr_assert_eq(lstat(fsfx_block_file(M.store, 6), &st), 0);
    if (S_ISREG(st.st_mode)) {
        fd = open(fsfx_block_file(M.store, 6), O_RDONLY | O_CLOEXEC);
        cr_assert_geq(fd, 0);
        cr_expect(pread(fd, buf, SHARD, 0) != (ssize_t)SHARD || tu_check(&k6, buf, SHARD) >= 0,
                  "the commit copied bytes from outside the store into the block");
        close(fd);
    }
    r = tu_wait_for(tu_fork(shard_writer_body, &w9), 10ll * 1000000000);
    cr_expect_geq(r, 0, "the writer of a FIFO block hung (killed after 10 s)");
    unlink(outside);
    free(buf);
}

/* A reader's lease outlives its reply by a moment (the worker releases it
 * once fuse_reply_buf returns, and the reader wakes inside that call): an
 * unlink right after a whole read is not EBUSY. */
Test(fs_limits, unlink_right_after_a_read_is_not_ebusy, .timeout = 120)
{
    uint8_t *buf = malloc(SHARD);
    int busy = 0, fd;

    cr_assert_not_null(buf);
    store_block(1, 1);
    start_spec(NULL, "readahead=0");
    for (int i = 0; i < 300; i++) {
        struct sfs_key k = tu_key(1, 3);

        tu_fill(&k, buf, SHARD);
        fd = open(fsfx_shard_path(&M.fx, 1, 3), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        cr_assert_geq(fd, 0, "round %d: create: %s", i, strerror(errno));
        cr_assert_eq(write(fd, buf, SHARD), (ssize_t)SHARD);
        cr_assert_eq(close(fd), 0);
        cr_assert_eq(read_shard_ok(1, 3), 0, "round %d: read back", i);
        if (unlink(fsfx_shard_path(&M.fx, 1, 3)) != 0) {
            cr_assert_eq(errno, EBUSY, "round %d: unlink: %s", i, strerror(errno));
            busy++;
            while (unlink(fsfx_shard_path(&M.fx, 1, 3)) != 0 && errno == EBUSY)
                fsfx_sleep_ms(10);
        }
    }
    cr_expect_eq(busy, 0, "%d of 300 unlinks right after a read were EBUSY", busy);
    free(buf);
}
