/* SPDX-License-Identifier: MIT */
/*
 * test_hung_store.c - a store on a file system that stops answering: every
 * backend call has a deadline (design.md, invariant 6).
 *
 * One prefix directory of a dir_prefix=2 posix store is the mount point of
 * a tiny FUSE file system this test runs in a forked child ("hungfs"): it
 * answers the root's attributes and an empty listing, and never answers a
 * LOOKUP (the name of the hung block file), as a hard-mounted network file
 * system that lost its server. It does answer the kernel's INTERRUPT of
 * such a request (EINTR), as NFS's killable waits do, so a killed process
 * waiting on it can exit. The other blocks live on the real disk. Through a
 * real shardfs mount (wait_timeout=2): a read of the hung shard fails
 * ETIMEDOUT at its deadline, resident shards and other shards are served
 * while such reads are pending, SIGTERM still exits promptly; a rank that
 * loads the hung key keeps serving its other tasks and fails that entry
 * with ETIMEDOUT at its key_timeout_ms, writing nothing late. Cleanup kills
 * hungfs (which fails every stuck request) and detaches both mounts lazily.
 */
#define FUSE_USE_VERSION 312
#include "fsfixture.h"
#include "testutil.h"

#include <shardfs/backend.h>
#include <shardfs/cache.h>
#include <shardfs/rank.h>

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD (64u << 10)
#define WAIT_S 2

static struct {
    char store[128];
    char hung_dir[160]; /* STORE/<2 hex>: the hungfs mount point */
    pid_t hungfs;
    struct fsfx fx;
    uint64_t hung, resident, other; /* block numbers */
    pid_t kids[16];                 /* children that may be stuck: reaped by teardown */
    int nkids;
} H;

static double now_s(void)
{
    return (double)sfs_now_ns() / 1e9;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Fork fn(arg) as a child that teardown reaps if the test does not. */
static pid_t kid(int (*fn)(void *), void *arg)
{
    pid_t pid = tu_fork(fn, arg);

    if (pid > 0 && H.nkids < (int)(sizeof(H.kids) / sizeof(H.kids[0])))
        H.kids[H.nkids++] = pid;
    return pid;
}

/* Wait up to timeout_s for a child: its exit status, or -1 when it is still
 * running (left to teardown: a process stuck in a FUSE request cannot be
 * killed until the request ends, which hungfs's death brings about). */
static int kid_wait(pid_t pid, double timeout_s)
{
    double t0 = now_s();
    int st;

    while (waitpid(pid, &st, WNOHANG) != pid) {
        if (now_s() - t0 > timeout_s)
            return -1;
        sleep_ms(10);
    }
    for (int i = 0; i < H.nkids; i++)
        if (H.kids[i] == pid)
            H.kids[i] = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- hungfs: answers the root, never a lookup (INTERRUPT: EINTR) ---- */

static void hung_interrupted(fuse_req_t req, void *data)
{
    (void)data;
    fuse_reply_err(req, EINTR);
}

/* NULL: every lookup hangs; else only those of names that start with it
 * (the others: ENOENT). Set before hungfs is forked. */
static const char *hung_only;

static void hung_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    (void)parent;
    if (hung_only && strncmp(name, hung_only, strlen(hung_only)) != 0) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    /* No reply: the request stays with the kernel's caller until it is
     * interrupted (then EINTR) or this process dies (then ENOTCONN). */
    fuse_req_interrupt_func(req, hung_interrupted, NULL);
}

static void hung_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct stat st = {.st_ino = 1, .st_mode = S_IFDIR | 0755, .st_nlink = 2};

    (void)fi;
    if (ino != FUSE_ROOT_ID) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    fuse_reply_attr(req, &st, 0);
}

static void hung_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                         struct fuse_file_info *fi)
{
    (void)ino;
    (void)size;
    (void)off;
    (void)fi;
    fuse_reply_buf(req, NULL, 0);
}

static const struct fuse_lowlevel_ops hung_ops = {
    .lookup = hung_lookup,
    .getattr = hung_getattr,
    .readdir = hung_readdir,
};

static int hungfs_main(void *arg)
{
    char *argv[] = {"hungfs", "-o", "fsname=hungfs", NULL};
    struct fuse_args args = FUSE_ARGS_INIT(3, argv);
    struct fuse_session *se;

    (void)arg;
    /* A test killed at its timeout (no .fini) takes hungfs with it, and its
     * death fails every request stuck in it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    se = fuse_session_new(&args, &hung_ops, sizeof(hung_ops), NULL);
    if (!se || fuse_session_mount(se, H.hung_dir) != 0)
        return 2;
    fuse_session_loop(se); /* single-threaded: no handler ever blocks */
    fuse_session_unmount(se);
    return 0;
}

static bool mounted_at(const char *dir)
{
    char line[1024], pat[300];
    FILE *f = fopen("/proc/self/mountinfo", "r");
    bool found = false;

    if (!f)
        return false;
    snprintf(pat, sizeof(pat), " %s ", dir);
    while (!found && fgets(line, sizeof(line), f))
        found = strstr(line, pat) != NULL;
    fclose(f);
    return found;
}

/* ---- the store ---- */

static void hex2(uint64_t b, char out[3])
{
    char hex[SFS_BLOCK_HEX_LEN + 1];

    tu_block_hex(b, hex);
    out[0] = hex[0];
    out[1] = hex[1];
    out[2] = '\0';
}

/* Block b of nshards in the dir_prefix=2 layout, on the disk. */
static void store_block(uint64_t b, unsigned nshards)
{
    char hex[SFS_BLOCK_HEX_LEN + 1], pre[3], path[300];
    uint8_t *buf = malloc(SHARD);
    int fd;

    tu_block_hex(b, hex);
    hex2(b, pre);
    snprintf(path, sizeof(path), "%s/%s", H.store, pre);
    mkdir(path, 0755);
    snprintf(path, sizeof(path), "%s/%s/%s", H.store, pre, hex);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    cr_assert(buf && fd >= 0, "create %s: %s", path, strerror(errno));
    for (uint32_t s = 0; s < nshards; s++) {
        struct sfs_key k = tu_key(b, s);

        tu_fill(&k, buf, SHARD);
        cr_assert_eq(pwrite(fd, buf, SHARD, (off_t)s * SHARD), (ssize_t)SHARD);
    }
    close(fd);
    free(buf);
}

static const char *shard_path(uint64_t b, long n)
{
    static __thread char buf[4][300];
    static __thread int i;
    char hex[SFS_BLOCK_HEX_LEN + 1], *p = buf[i++ & 3];

    tu_block_hex(b, hex);
    snprintf(p, 300, "%s/block/%s/shard/%ld", H.fx.mnt, hex, n);
    return p;
}

static void setup(void)
{
    char pre[3], o[256], spec[300];
    double t0;
    int st = 0, r;

    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    memset(&H, 0, sizeof(H));
    snprintf(H.store, sizeof(H.store), "%s", tu_path("hstore"));
    snprintf(H.fx.mnt, sizeof(H.fx.mnt), "%s", tu_path("hmnt"));
    snprintf(H.fx.sock, sizeof(H.fx.sock), "%s", tu_path("hsock"));
    snprintf(H.fx.log, sizeof(H.fx.log), "%s", tu_path("hlog"));
    /* SHARDFS_TEST_DAEMON: another build of the daemon (CI's TSan one). */
    H.fx.bin = getenv("SHARDFS_TEST_DAEMON") && *getenv("SHARDFS_TEST_DAEMON")
                   ? getenv("SHARDFS_TEST_DAEMON")
                   : SHARDFS_BIN;
    mkdir(H.store, 0755);
    mkdir(H.fx.mnt, 0755);
    /* Three blocks in three different prefix directories. */
    H.hung = 1;
    hex2(H.hung, pre);
    for (H.resident = 2;; H.resident++) {
        char p2[3];

        hex2(H.resident, p2);
        if (strcmp(p2, pre) != 0)
            break;
    }
    for (H.other = H.resident + 1;; H.other++) {
        char p2[3], p3[3];

        hex2(H.other, p2);
        hex2(H.resident, p3);
        if (strcmp(p2, pre) != 0 && strcmp(p2, p3) != 0)
            break;
    }
    store_block(H.resident, 2);
    store_block(H.other, 2);
    snprintf(H.hung_dir, sizeof(H.hung_dir), "%s/%s", H.store, pre);
    mkdir(H.hung_dir, 0755);
    H.hungfs = tu_fork(hungfs_main, NULL);
    t0 = now_s();
    while (!mounted_at(H.hung_dir) && now_s() - t0 < 10)
        sleep_ms(20);
    cr_assert(mounted_at(H.hung_dir), "hungfs did not mount");

    snprintf(spec, sizeof(spec), "posix:%s?dir_prefix=2", H.store);
    /* revalidate: its sweep must hold neither a reader nor the stop. */
    snprintf(o, sizeof(o),
             "hugepages=off,capacity=8M,shard_size=64K,readahead=0,revalidate=100,wait_timeout=%d",
             WAIT_S);
    r = fsfx_start(&H.fx, spec, o, 10.0, &st);
    cr_assert_eq(r, 0, "daemon did not mount (%s, status %d), see %s", strerror(-r), st, H.fx.log);
}

static void teardown(void)
{
    /* hungfs first: its death fails every request stuck in it, so nothing
     * below waits on it. */
    if (H.hungfs > 0) {
        kill(H.hungfs, SIGKILL);
        waitpid(H.hungfs, NULL, 0);
        H.hungfs = 0;
    }
    if (H.hung_dir[0] && mounted_at(H.hung_dir))
        umount2(H.hung_dir, MNT_DETACH);
    for (int i = 0; i < H.nkids; i++) {
        if (H.kids[i] > 0) {
            kill(H.kids[i], SIGKILL);
            waitpid(H.kids[i], NULL, 0);
        }
    }
    if (H.fx.pid > 0) {
        kill(H.fx.pid, SIGTERM);
        fsfx_stop(&H.fx, true, 10.0);
    }
    if (H.fx.mnt[0] && mounted_at(H.fx.mnt))
        umount2(H.fx.mnt, MNT_DETACH);
    if (H.fx.mnt[0])
        rmdir(H.fx.mnt);
    if (H.store[0]) {
        char cmd[300];

        snprintf(cmd, sizeof(cmd), "rm -rf %s", H.store);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", H.store);
    }
    if (H.fx.log[0] && !getenv("SFS_TEST_KEEP_LOGS"))
        unlink(H.fx.log);
    if (H.fx.sock[0])
        unlink(H.fx.sock);
}

TestSuite(hung_store, .init = setup, .fini = teardown, .timeout = 120);

/* Open and read shard 0 of the hung block: 0 when it fails ETIMEDOUT. */
static int read_hung_body(void *arg)
{
    char buf[4096];
    int fd;

    (void)arg;
    fd = open(shard_path(H.hung, 0), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, buf, sizeof(buf));

        TU_CK(n < 0);
        close(fd);
    }
    if (errno != ETIMEDOUT)
        fprintf(stderr, "hung read: %s\n", strerror(errno));
    TU_CK(errno == ETIMEDOUT);
    return 0;
}

/* Open and read shard 0 of the hung block, whatever the answer (a stop
 * ends it with the connection's error). */
static int read_any_body(void *arg)
{
    char buf[4096];
    int fd;

    (void)arg;
    fd = open(shard_path(H.hung, 0), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, buf, sizeof(buf)) < 0)
            buf[0] = 0;
        close(fd);
    }
    return 0;
}

/* Read shard s of block b whole and check its bytes: 0 when right. */
static int read_ok_body(void *arg)
{
    uint64_t b = (uint64_t)(uintptr_t)arg;
    uint8_t *buf = malloc(SHARD), *want = malloc(SHARD);
    struct sfs_key k = tu_key(b, 0);
    int fd = open(shard_path(b, 0), O_RDONLY | O_CLOEXEC);

    TU_CK(buf && want && fd >= 0);
    TU_CK(read(fd, buf, SHARD) == (ssize_t)SHARD);
    tu_fill(&k, want, SHARD);
    TU_CK(memcmp(buf, want, SHARD) == 0);
    close(fd);
    return 0;
}

static int stat_ok_body(void *arg)
{
    struct stat st;

    (void)arg;
    TU_CK(stat(shard_path(H.other, 1), &st) == 0 && st.st_size == SHARD);
    return 0;
}

/* A read of the hung shard ends ETIMEDOUT near wait_timeout; while several
 * are pending, a resident shard is read at once and another shard stats. */
Test(hung_store, reads_of_a_hung_shard_time_out_and_the_rest_is_served)
{
    enum { NREADERS = 3 };
    pid_t kids[NREADERS];
    double t0;
    int r;

    r = kid_wait(kid(read_ok_body, (void *)(uintptr_t)H.resident), 10.0);
    cr_assert_eq(r, 0, "the resident shard could not be read first");

    t0 = now_s();
    r = kid_wait(kid(read_hung_body, NULL), WAIT_S + 8.0);
    cr_expect_eq(r, 0, "the read of the hung shard %s", r == -1 ? "hung" : "was not ETIMEDOUT");
    cr_expect_lt(now_s() - t0, WAIT_S + 5.0, "it took %.1f s", now_s() - t0);

    for (int i = 0; i < NREADERS; i++)
        kids[i] = kid(read_hung_body, NULL);
    sleep_ms(300);
    t0 = now_s();
    r = kid_wait(kid(read_ok_body, (void *)(uintptr_t)H.resident), 10.0);
    cr_expect_eq(r, 0, "the resident read %s behind the hung ones", r == -1 ? "hung" : "failed");
    cr_expect_lt(now_s() - t0, 1.5, "the resident read took %.1f s", now_s() - t0);
    t0 = now_s();
    r = kid_wait(kid(stat_ok_body, NULL), 10.0);
    cr_expect_eq(r, 0, "the stat of another shard %s", r == -1 ? "hung" : "failed");
    cr_expect_lt(now_s() - t0, 1.5, "the stat took %.1f s", now_s() - t0);
    /* The kernel lets one lookup of a name run at a time: the readers end
     * one deadline after another. */
    t0 = now_s();
    for (int i = 0; i < NREADERS; i++) {
        r = kid_wait(kids[i], NREADERS * WAIT_S + 10.0 - (now_s() - t0));
        cr_expect_eq(r, 0, "hung reader %d %s", i, r == -1 ? "hung" : "was not ETIMEDOUT");
    }
}

/* SIGTERM with readers of the hung shard pending: the daemon exits 0 within
 * the documented ~2 s (5 s here: loaded and sanitized CI runs). */
Test(hung_store, sigterm_exits_promptly_with_calls_stuck_in_the_store)
{
    pid_t kids[2];
    double t0;
    int st = 0;

    for (int i = 0; i < 2; i++)
        kids[i] = kid(read_any_body, NULL);
    sleep_ms(500);
    t0 = now_s();
    kill(H.fx.pid, SIGTERM);
    while (waitpid(H.fx.pid, &st, WNOHANG) != H.fx.pid && now_s() - t0 < 15)
        sleep_ms(10);
    cr_expect_lt(now_s() - t0, 5.0, "SIGTERM took %.1f s", now_s() - t0);
    if (now_s() - t0 >= 15) {
        kill(H.fx.pid, SIGKILL);
        waitpid(H.fx.pid, &st, 0);
    }
    H.fx.pid = 0;
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "daemon status 0x%x", st);
    for (int i = 0; i < 2; i++)
        kid_wait(kids[i], 10.0);
}

/* A rank that loads the hung key through its own posix backend: its
 * dispatcher does not wait on the store (the open is an op of the ring), so
 * a later task of a good key completes while the hung load is pending, and
 * the hung entry itself fails with -ETIMEDOUT at key_timeout_ms, its task
 * complete and its destination untouched (docs/rank.md, "A store that stops
 * answering"); the rank then still loads. Once the store answers (hungfs
 * killed: the stuck open fails), the late answer is let go, close returns,
 * and the destination is still untouched. */
static int rank_body(void *arg)
{
    struct sfs_rank_config cfg;
    struct sfs_rank_entry e[3];
    struct sfs_task *hung, *good, *later;
    char spec[300];
    uint8_t *bufs = malloc(3 * SHARD), *want = malloc(SHARD);
    struct sfs_key k = tu_key(H.other, 0), k1 = tu_key(H.other, 1);
    int err = 0, st = 1, r;
    struct sfs_rank *rk;
    double t0;

    (void)arg;
    TU_CK(bufs && want);
    memset(bufs, 0xa5, 3 * SHARD);
    snprintf(spec, sizeof(spec), "posix:%s?dir_prefix=2", H.store);
    sfs_rank_config_init(&cfg);
    cfg.socket_path = H.fx.sock;
    cfg.backend = spec;
    cfg.copier = SFS_COPIER_HOST;
    cfg.key_timeout_ms = WAIT_S * 1000;
    rk = sfs_rank_open(&cfg, &err);
    TU_CK(rk);
    e[0] = (struct sfs_rank_entry){.block = tu_block(H.hung), .shard = 0, .addr = bufs};
    e[1] = (struct sfs_rank_entry){.block = tu_block(H.other), .shard = 0, .addr = bufs + SHARD};
    e[2] = (struct sfs_rank_entry){.block = tu_block(H.other), .shard = 1, .addr = bufs + 2 * SHARD};
    TU_CK(sfs_rank_load(rk, &e[0], 1, &hung) == 0);
    TU_CK(sfs_rank_load(rk, &e[1], 1, &good) == 0);
    TU_CK(sfs_rank_wait(good, 5000, &st) == 0 && st == 0);
    tu_fill(&k, want, SHARD);
    TU_CK(memcmp(bufs + SHARD, want, SHARD) == 0);

    /* The hung entry's own deadline: the task completes, with -ETIMEDOUT. */
    t0 = now_s();
    st = 1;
    r = sfs_rank_wait(hung, (WAIT_S + 8) * 1000, &st);
    if (r != 0 || st != -ETIMEDOUT)
        fprintf(stderr, "hung entry: wait %d (%s), status %d\n", r, strerror(-r), st);
    TU_CK(r == 0 && st == -ETIMEDOUT);
    TU_CK(now_s() - t0 < WAIT_S + 5.0);
    TU_CK(tu_all_bytes(bufs, SHARD, 0xa5));

    /* The rank goes on. */
    TU_CK(sfs_rank_load(rk, &e[2], 1, &later) == 0);
    TU_CK(sfs_rank_wait(later, 5000, &st) == 0 && st == 0);
    tu_fill(&k1, want, SHARD);
    TU_CK(memcmp(bufs + 2 * SHARD, want, SHARD) == 0);
    sfs_rank_task_free(good);
    sfs_rank_task_free(hung);
    sfs_rank_task_free(later);

    /* The store answers (the stuck open fails): the late answer is let go,
     * so close, which waits for it, returns. */
    kill(H.hungfs, SIGKILL);
    t0 = now_s();
    while (mounted_at(H.hung_dir) && now_s() - t0 < 10) {
        umount2(H.hung_dir, MNT_DETACH);
        sleep_ms(20);
    }
    sfs_rank_close(rk);
    TU_CK(tu_all_bytes(bufs, SHARD, 0xa5));
    free(bufs);
    free(want);
    return 0;
}

Test(hung_store, a_rank_load_of_a_hung_key_fails_at_its_deadline)
{
    double t0 = now_s();
    int r = kid_wait(kid(rank_body, NULL), WAIT_S + 20.0);

    cr_expect_eq(r, 0, "the rank %s", r == -1 ? "hung" : "did not answer as expected");
    cr_expect_lt(now_s() - t0, WAIT_S + 12.0, "it took %.1f s", now_s() - t0);
}

/* The backend's synchronous calls on the hung block, directly: each answers
 * -ETIMEDOUT at the backend's timeout, and the calls on other blocks work
 * meanwhile. A dump that timed out stores nothing, even once the store
 * answers again (here: once hungfs is gone, the block reads as absent).
 * In a child, so that a call that hangs (the old code) fails the test at
 * its bound instead of holding the test process. */
static int sync_calls_body(void *arg)
{
    struct sfs_backend_params bp = {.shard_size = SHARD, .dir_prefix = 2, .timeout_ms = 1000};
    struct sfs_key hk = tu_key(H.hung, 0), ok = tu_key(H.other, 1);
    char spec[300], err[200] = "";
    struct sfs_backend *be;
    uint8_t *buf = calloc(1, SHARD);
    bool present = false;
    double t0;
    int e = 0;

    (void)arg;
    TU_CK(buf);
    snprintf(spec, sizeof(spec), "posix:%s", H.store);
    be = sfs_backend_open(spec, &bp, err, sizeof(err), &e);
    TU_CK(be);

    t0 = now_s();
    TU_CK(sfs_backend_exists(be, &hk, 1, &present) == -ETIMEDOUT);
    TU_CK(sfs_backend_shard_count(be, &hk.block) == -ETIMEDOUT);
    TU_CK(sfs_backend_dump_sync(be, &hk, buf, SHARD) == -ETIMEDOUT);
    TU_CK(sfs_backend_remove(be, &hk) == -ETIMEDOUT);
    TU_CK(now_s() - t0 < 4 * 1.0 + 4.0);

    t0 = now_s();
    TU_CK(sfs_backend_exists(be, &ok, 1, &present) == 0 && present);
    TU_CK(sfs_backend_shard_count(be, &ok.block) == 2);
    TU_CK(sfs_backend_load_sync(be, &ok, buf, SHARD) == (int)SHARD);
    TU_CK(now_s() - t0 < 2.0);

    /* The store answers again (ENOTCONN, then an empty directory): the
     * abandoned dump did not commit. */
    kill(H.hungfs, SIGKILL);
    t0 = now_s();
    while (mounted_at(H.hung_dir) && now_s() - t0 < 10) {
        umount2(H.hung_dir, MNT_DETACH);
        sleep_ms(20);
    }
    t0 = now_s();
    while (sfs_backend_shard_count(be, &hk.block) != -ENOENT && now_s() - t0 < 10)
        sleep_ms(50);
    sleep_ms(300);
    TU_CK(sfs_backend_shard_count(be, &hk.block) == -ENOENT);
    sfs_backend_close(be);
    free(buf);
    return 0;
}

Test(hung_store, synchronous_backend_calls_have_a_deadline)
{
    int r = kid_wait(kid(sync_calls_body, NULL), 30.0);

    cr_expect_eq(r, 0, "the backend calls %s", r == -1 ? "hung" : "did not answer as expected");
}

/* ---- a store whose usage file does not answer ---- */

/* The store's root is hungfs itself, which hangs the lookups of the usage
 * file's names (.shardfs_usage, .shardfs_usage.tmp) and answers ENOENT to
 * the rest: the daemon's read of the file at start and its write at stop
 * each wait for the store at most 5 s (fs/storefile.c), then go on without
 * it. Without that bound the mount never answered, or the stop never
 * ended. */
static void usage_setup(void)
{
    double t0;

    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    memset(&H, 0, sizeof(H));
    snprintf(H.store, sizeof(H.store), "%s", tu_path("ustore"));
    snprintf(H.fx.mnt, sizeof(H.fx.mnt), "%s", tu_path("umnt"));
    snprintf(H.fx.sock, sizeof(H.fx.sock), "%s", tu_path("usock"));
    snprintf(H.fx.log, sizeof(H.fx.log), "%s", tu_path("ulog"));
    H.fx.bin = getenv("SHARDFS_TEST_DAEMON") && *getenv("SHARDFS_TEST_DAEMON")
                   ? getenv("SHARDFS_TEST_DAEMON")
                   : SHARDFS_BIN;
    mkdir(H.store, 0755);
    mkdir(H.fx.mnt, 0755);
    snprintf(H.hung_dir, sizeof(H.hung_dir), "%s", H.store);
    hung_only = ".shardfs_usage";
    H.hungfs = tu_fork(hungfs_main, NULL);
    t0 = now_s();
    while (!mounted_at(H.hung_dir) && now_s() - t0 < 10)
        sleep_ms(20);
    cr_assert(mounted_at(H.hung_dir), "hungfs did not mount");
}

TestSuite(hung_usage, .init = usage_setup, .fini = teardown, .timeout = 90);

static int stat_root_body(void *arg)
{
    struct stat st;

    (void)arg;
    return stat(H.fx.mnt, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : 1;
}

Test(hung_usage, a_usage_file_that_does_not_answer_holds_neither_start_nor_stop)
{
    char spec[300];
    struct sfs_cache *c;
    struct sfs_key k = tu_key(7, 0);
    struct sfs_lease l;
    double t0;
    pid_t pid;
    int st = 0, r;

    snprintf(spec, sizeof(spec), "posix:%s", H.store);
    t0 = now_s();
    /* revalidate=0: no sweep of the hung store (its own bound: the suite
     * above). */
    r = fsfx_start(&H.fx, spec, "hugepages=off,capacity=8M,shard_size=64K,readahead=0,revalidate=0",
                   20.0, &st);
    cr_assert_eq(r, 0, "daemon did not mount (%s, status %d), see %s", strerror(-r), st, H.fx.log);
    /* The mount answers (in a child: without the bound it never would). */
    pid = kid(stat_root_body, NULL);
    cr_assert_eq(kid_wait(pid, 20.0), 0, "the mount did not answer %.1f s after the start",
                 now_s() - t0);
    cr_expect_geq(fsfx_log_lines_with(&H.fx, "the store did not answer in time"), 1);

    /* A key the sampler counts (a slot leased across a tick), so the stop
     * has a table to write. */
    c = sfs_cache_attach(H.fx.sock, 0, &r);
    cr_assert_not_null(c, "attach %s: %s", H.fx.sock, strerror(-r));
    cr_assert_eq(sfs_cache_get(c, &k, 0, sfs_deadline_after(5000000000ll), &l), SFS_OWNER);
    tu_fill(&k, sfs_cache_data(c, &l), SHARD);
    cr_assert_eq(sfs_cache_publish(c, &l, SHARD, 0), 0);
    sleep_ms(2500); /* the lease stays held across two sampler ticks */
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    sfs_cache_close(c);

    t0 = now_s();
    kill(H.fx.pid, SIGTERM);
    while (waitpid(H.fx.pid, &st, WNOHANG) != H.fx.pid && now_s() - t0 < 30)
        sleep_ms(10);
    if (now_s() - t0 >= 30) {
        kill(H.fx.pid, SIGKILL);
        waitpid(H.fx.pid, &st, 0);
    }
    H.fx.pid = 0;
    cr_expect_lt(now_s() - t0, 15.0, "SIGTERM took %.1f s", now_s() - t0);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "daemon status 0x%x", st);
    cr_expect_geq(fsfx_log_lines_with(&H.fx, "not written: the store did not answer in time"), 1);
}
