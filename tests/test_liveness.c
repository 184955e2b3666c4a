/* SPDX-License-Identifier: MIT */
/*
 * test_liveness.c - what an attached process can and cannot do to the others,
 * who may attach at all, and the attach server's own liveness.
 *
 * Real processes on a real served cache: an attached child that tries to
 * truncate the data plane or add seals to the control plane; children that
 * drop to another uid (root's setuid in a fork) and are refused or allowed
 * by the serve options; silent and slow clients that must not delay anyone;
 * socket directories that others could write to.
 */
#include "testutil.h"
#include "cache_i.h" /* a handle's memfds */

#include <shardfs/rank.h>

#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SHARD  4096u
#define NOBODY 65534u

static struct sfs_cache *served_opts(const char **path, const struct sfs_serve_opts *o)
{
    struct sfs_cache *c = tu_cache(8, 0, SHARD);

    cr_assert_not_null(c);
    *path = tu_path("live");
    cr_assert_eq(sfs_cache_serve_opts(c, *path, o), 0);
    return c;
}

static struct sfs_cache *served(const char **path)
{
    return served_opts(path, NULL);
}

/* ---------------------------------------------------------------------------
 * Seals: an attached process cannot change the planes' size or seals.
 */

static int truncating_child(struct sfs_cache *c, void *arg)
{
    (void)arg;
    for (uint32_t i = 0; i < c->nsegments; i++) {
        TU_CK(ftruncate(c->seg_fds[i], 0) < 0 && errno == EPERM);
        TU_CK(ftruncate(c->seg_fds[i], (off_t)c->seg_size * 2) < 0 && errno == EPERM);
        TU_CK(fcntl(c->seg_fds[i], F_ADD_SEALS, F_SEAL_WRITE) < 0 && errno == EPERM);
        int seals = fcntl(c->seg_fds[i], F_GET_SEALS);
        TU_CK(seals >= 0 && (seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) ==
                                (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
    }
    return 0;
}

/* An unsealed segment let a client truncate it, and the
 * next reader died of SIGBUS. */
Test(liveness, data_plane_cannot_be_truncated, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    struct sfs_key k = tu_key(1, 0);
    struct sfs_lease l;

    cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    cr_assert_eq(tu_wait(tu_fork_attached(path, 0, truncating_child, NULL)), 0,
                 "a client could resize or reseal a data segment");
    /* The reader is still alive to read its bytes (a SIGBUS would end the
     * test here). */
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &l), SFS_HIT);
    cr_assert_eq(tu_check(&k, sfs_cache_data(c, &l), SHARD), -1);
    sfs_cache_release(c, &l);
    sfs_cache_close(c);
}

static int resealing_child(struct sfs_cache *c, void *arg)
{
    (void)arg;
    TU_CK(fcntl(c->ctl_fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) < 0 && errno == EPERM);
    TU_CK(fcntl(c->ctl_fd, F_ADD_SEALS, F_SEAL_WRITE) < 0 && errno == EPERM);
    TU_CK(ftruncate(c->ctl_fd, 0) < 0 && errno == EPERM);
    return 0;
}

static int plain_child(struct sfs_cache *c, void *arg)
{
    struct sfs_key *k = arg;
    struct sfs_lease l;

    TU_CK(sfs_cache_get(c, k, 0, 0, &l) == SFS_HIT);
    TU_CK(tu_check(k, sfs_cache_data(c, &l), SHARD) == -1);
    TU_CK(sfs_cache_release(c, &l) == 0);
    return 0;
}

/* A client adding F_SEAL_FUTURE_WRITE to the control
 * plane made every later attach fail (no writable mapping). */
Test(liveness, control_plane_cannot_be_resealed, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    struct sfs_key k = tu_key(2, 0);

    cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    cr_assert_eq(tu_wait(tu_fork_attached(path, 0, resealing_child, &k)), 0,
                 "a client could add seals to the control plane");
    cr_assert_eq(tu_wait(tu_fork_attached(path, 1, plain_child, &k)), 0,
                 "an attach after the client's attempt failed");
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * The server: silent and slow clients delay no one.
 */

static int raw_connect(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    cr_assert_geq(s, 0);
    strcpy(addr.sun_path, path);
    cr_assert_eq(connect(s, (struct sockaddr *)&addr, sizeof(addr)), 0, "connect: %s",
                 strerror(errno));
    return s;
}

static int attach_and_close(void *arg)
{
    int err = 0;
    struct sfs_cache *c = sfs_cache_attach(arg, 0, &err);

    if (!c) {
        fprintf(stderr, "attach: %s\n", strerror(-err));
        return 1;
    }
    sfs_cache_close(c);
    return 0;
}

/* With 8 connections that said nothing, an attach failed
 * -EAGAIN after 5 s (one thread gave each silent client 1 s). */
Test(liveness, silent_clients_do_not_delay_attach, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    int silent[8];

    for (int i = 0; i < 8; i++)
        silent[i] = raw_connect(path);
    int64_t t0 = sfs_now_ns();
    cr_assert_eq(tu_wait(tu_fork(attach_and_close, (void *)path)), 0);
    int64_t dt = sfs_now_ns() - t0;
    /* Generous: one attach takes milliseconds; the old server took 5 s+. */
    cr_assert_lt(dt, 900 * 1000 * 1000ll, "8 silent clients delayed an attach by %lld ms",
                 (long long)(dt / 1000000));
    for (int i = 0; i < 8; i++)
        close(silent[i]);
    sfs_cache_close(c);
}

/* A client that sends half a hello and stops is answered -ETIMEDOUT after its
 * deadline; everyone else is served meanwhile. */
Test(liveness, slow_hello_times_out_alone, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    int s = raw_connect(path);
    char half[20] = {0};
    struct {
        uint64_t magic;
        uint32_t proto;
        int32_t status;
        char rest[24];
    } w;

    cr_assert_eq(send(s, half, sizeof(half), 0), (ssize_t)sizeof(half));
    int64_t t0 = sfs_now_ns();
    cr_assert_eq(tu_wait(tu_fork(attach_and_close, (void *)path)), 0);
    cr_assert_lt(sfs_now_ns() - t0, 900 * 1000 * 1000ll);
    cr_assert_eq(recv(s, &w, sizeof(w), MSG_WAITALL), (ssize_t)sizeof(w));
    cr_assert_eq(w.status, -ETIMEDOUT);
    int64_t dt = sfs_now_ns() - t0;
    cr_assert_lt(dt, 3000 * 1000 * 1000ll, "the slow client was answered after %lld ms",
                 (long long)(dt / 1000000));
    close(s);
    sfs_cache_close(c);
}

/* A server that ran late does not refuse a client that was on time: the
 * client's whole (here: short) hello and its EOF arrive while the server is
 * stopped, and its deadline passes before the server runs again. The server
 * reads what arrived before judging the deadline, so the answer is the
 * hello's own (-EBADMSG for a short one), not -ETIMEDOUT. (The long fuzz run
 * of attach_hello, on a loaded machine, stopped on that -ETIMEDOUT.) */
static int serve_and_wait(void *arg)
{
    struct sfs_cache *c = tu_cache(8, 0, SHARD);

    if (!c || sfs_cache_serve(c, arg) < 0)
        return 1;
    pause(); /* until the test kills us */
    return 0;
}

Test(liveness, late_server_reads_an_early_hello_before_its_deadline, .timeout = 30)
{
    const char *path = tu_path("late");
    pid_t srv = tu_fork(serve_and_wait, (void *)path);
    struct stat st;
    char half[20] = {0};
    struct {
        uint64_t magic;
        uint32_t proto;
        int32_t status;
        char rest[24];
    } w;

    for (int i = 0; i < 500 && stat(path, &st) < 0; i++)
        usleep(10000);
    int s = raw_connect(path);
    usleep(200000); /* accepted: its hello deadline runs from here */
    cr_assert_eq(kill(srv, SIGSTOP), 0);
    cr_assert_eq(send(s, half, sizeof(half), 0), (ssize_t)sizeof(half));
    cr_assert_eq(shutdown(s, SHUT_WR), 0);
    usleep(1500000); /* past the 1 s deadline, the server stopped */
    cr_assert_eq(kill(srv, SIGCONT), 0);
    cr_assert_eq(recv(s, &w, sizeof(w), MSG_WAITALL), (ssize_t)sizeof(w));
    close(s);
    kill(srv, SIGKILL);
    tu_wait(srv);
    cr_assert_eq(w.status, -EBADMSG, "a short hello sent on time was answered %d", w.status);
}

/* ---------------------------------------------------------------------------
 * Who may attach.
 */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[8192];

static void log_keep(int level, const char *msg, void *arg)
{
    (void)level;
    (void)arg;
    pthread_mutex_lock(&log_mu);
    size_t n = strlen(log_buf);
    snprintf(log_buf + n, sizeof(log_buf) - n, "%s\n", msg);
    pthread_mutex_unlock(&log_mu);
}

static bool logged(const char *what)
{
    pthread_mutex_lock(&log_mu);
    bool r = strstr(log_buf, what) != NULL;
    pthread_mutex_unlock(&log_mu);
    return r;
}

struct as_user {
    const char *path;
    uid_t uid;
    gid_t gid;
    gid_t group; /* a supplementary group, or 0 */
};

/* Drops to uid/gid, attaches; exits 0 when attached, 2 when refused with
 * EACCES, 1 otherwise. */
static int attach_as(void *arg)
{
    const struct as_user *u = arg;
    int err = 0;

    if (setgroups(u->group ? 1 : 0, &u->group) < 0 || setgid(u->gid) < 0 || setuid(u->uid) < 0) {
        fprintf(stderr, "cannot become uid %u: %s\n", u->uid, strerror(errno));
        return 1;
    }
    struct sfs_cache *c = sfs_cache_attach(u->path, 0, &err);
    if (!c) {
        if (err != -EACCES)
            fprintf(stderr, "uid %u: attach: %s\n", u->uid, strerror(-err));
        return err == -EACCES ? 2 : 1;
    }
    struct sfs_key k = tu_key(3, 0);
    int role = tu_load(c, &k);
    sfs_cache_close(c);
    return role >= 0 ? 0 : 1;
}

static void need_root(void)
{
    if (geteuid() != 0)
        cr_skip_test("needs root (setuid to another uid)");
}

Test(liveness, another_uid_is_refused_by_default, .timeout = 30)
{
    const char *path;
    struct stat st;

    need_root();
    struct sfs_cache *c = served(&path);
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600, "socket mode %o", st.st_mode & 0777);
    struct as_user u = {.path = path, .uid = NOBODY, .gid = NOBODY};
    cr_assert_eq(tu_wait(tu_fork(attach_as, &u)), 2, "uid %u was not refused", NOBODY);
    sfs_cache_close(c);
}

Test(liveness, listed_uid_may_attach_others_are_refused_and_logged, .timeout = 30)
{
    const char *path;
    uint32_t allowed[] = {NOBODY - 1, NOBODY};
    struct sfs_serve_opts o = {.uids = allowed, .nuids = 1, .gid = -1};

    need_root();
    sfs_set_log(log_keep, NULL, LOG_DEBUG);
    log_buf[0] = '\0';
    /* Only NOBODY - 1 listed: NOBODY passes the file mode, not the server. */
    struct sfs_cache *c = served_opts(&path, &o);
    struct as_user u = {.path = path, .uid = NOBODY, .gid = NOBODY};
    cr_assert_eq(tu_wait(tu_fork(attach_as, &u)), 2, "an unlisted uid was not refused");
    cr_assert(logged("refused pid"), "the refusal was not logged: %s", log_buf);
    cr_assert(logged("uid 65534"), "the refusal does not name the uid: %s", log_buf);
    sfs_cache_close(c);

    o.nuids = 2;
    c = served_opts(&path, &o);
    cr_assert_eq(tu_wait(tu_fork(attach_as, &u)), 0, "a listed uid was refused");
    sfs_cache_close(c);
    sfs_set_log(NULL, NULL, 0);
}

Test(liveness, group_member_may_attach, .timeout = 30)
{
    const char *path;
    struct sfs_serve_opts o = {.gid = 4242};
    struct stat st;

    need_root();
    struct sfs_cache *c = served_opts(&path, &o);
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0660);
    cr_assert_eq(st.st_gid, 4242u);
    struct as_user member = {.path = path, .uid = NOBODY, .gid = NOBODY, .group = 4242};
    struct as_user other = {.path = path, .uid = NOBODY, .gid = NOBODY};
    cr_assert_eq(tu_wait(tu_fork(attach_as, &member)), 0, "a member of the group was refused");
    cr_assert_eq(tu_wait(tu_fork(attach_as, &other)), 2, "a non-member was not refused");
    sfs_cache_close(c);
}

/* The socket's directory: nobody else may replace the socket in it. */
Test(liveness, socket_directory_writable_by_others_is_refused, .timeout = 30)
{
    const char *dir = tu_path("dir");
    char sock[108];
    struct sfs_cache *c = tu_cache(8, 0, SHARD);

    cr_assert_not_null(c);
    cr_assert_eq(mkdir(dir, 0700), 0);
    snprintf(sock, sizeof(sock), "%s/s.sock", dir);
    cr_assert_eq(chmod(dir, 0777), 0);
    cr_assert_eq(sfs_cache_serve(c, sock), -EPERM, "served from a world-writable directory");
    cr_assert_eq(chmod(dir, 0770), 0);
    cr_assert_eq(sfs_cache_serve(c, sock), -EPERM, "served from a group-writable directory");
    if (geteuid() == 0) {
        cr_assert_eq(chmod(dir, 0755), 0);
        cr_assert_eq(chown(dir, NOBODY, NOBODY), 0);
        cr_assert_eq(sfs_cache_serve(c, sock), -EPERM, "served from another user's directory");
        cr_assert_eq(chown(dir, 0, 0), 0);
    }
    /* Sticky (as /tmp): others cannot remove or rename our socket. */
    cr_assert_eq(chmod(dir, 01777), 0);
    cr_assert_eq(sfs_cache_serve(c, sock), 0);
    sfs_cache_close(c);
    cr_assert_eq(chmod(dir, 0755), 0);
    cr_assert_eq(sfs_cache_serve(c = tu_cache(8, 0, SHARD), sock), 0);
    sfs_cache_close(c);
    rmdir(dir);
}

/* ---------------------------------------------------------------------------
 * Liveness by connection (design.md, section 9): nobody judges a process by its
 * pid. A rank in its own pid namespace is not reaped while alive and is
 * reaped when it dies; a rank that execs, or that drops its connection while
 * it lives on, is reaped at once.
 */

#define MS  (1000 * 1000ll)
#define SEC (1000 * MS)

struct live_shm {
    char path[108];
    struct sfs_key key;
    _Atomic int step;  /* child -> parent */
    _Atomic int go;    /* parent -> child */
    _Atomic pid_t pid; /* the owner's pid in the parent's namespace */
    _Atomic int rc;
};

static struct live_shm *live_shm(const char *path, struct sfs_key key)
{
    struct live_shm *m =
        mmap(NULL, sizeof(*m), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    cr_assert(m != MAP_FAILED);
    memset(m, 0, sizeof(*m));
    snprintf(m->path, sizeof(m->path), "%s", path);
    m->key = key;
    return m;
}

static bool wait_for(_Atomic int *word, int at_least, int64_t timeout_ns)
{
    int64_t end = sfs_now_ns() + timeout_ns;

    while (atomic_load(word) < at_least) {
        if (sfs_now_ns() > end)
            return false;
        usleep(200);
    }
    return true;
}

/* Attach, become the owner of m->key (Loading, never published), step 1, and
 * then do what `then` says. */
enum then { THEN_PARK, THEN_EXEC, THEN_DROP_CONNECTION, THEN_FORK_EXEC, THEN_RAW_FORK_PARK };

static int own_then(struct live_shm *m, enum then then)
{
    int err = 0;
    struct sfs_lease l;
    struct sfs_cache *c = sfs_cache_attach(m->path, 1, &err);

    if (!c) {
        fprintf(stderr, "owner: attach: %s\n", strerror(-err));
        return 10;
    }
    if (sfs_cache_get(c, &m->key, 0, sfs_deadline_after(SEC), &l) != SFS_OWNER)
        return 11;
    if (then == THEN_DROP_CONNECTION) {
        /* Close every socket this process holds (the attach connection among
         * them), and live on: the record goes with the connection. */
        char link[64], fdpath[64];
        for (int fd = 3; fd < 1024; fd++) {
            snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", fd);
            ssize_t n = readlink(fdpath, link, sizeof(link) - 1);
            if (n > 0 && (link[n] = '\0', strncmp(link, "socket:", 7) == 0))
                close(fd);
        }
    }
    if (then == THEN_RAW_FORK_PARK) {
        /* A raw fork runs no atfork handler: the child keeps a copy of the
         * connection, and only the pidfd tells the server the owner died. */
        pid_t helper = (pid_t)syscall(SYS_fork);
        if (helper == 0) {
            sleep(20);
            tu_exit(0);
        }
        atomic_store(&m->pid, helper);
    }
    if (then == THEN_FORK_EXEC) {
        /* A child (a helper, say) that outlives the exec below. */
        pid_t helper = fork();
        if (helper == 0) {
            sleep(20);
            tu_exit(0);
        }
        atomic_store(&m->pid, helper);
    }
    atomic_store(&m->step, 1);
    if (then == THEN_EXEC || then == THEN_FORK_EXEC) {
        /* pid and start time survive the exec; the connection does not. */
        execl("/bin/sleep", "sleep", "30", (char *)NULL);
        return 12;
    }
    /* Parked until killed; a failed test's orphan still ends on its own. */
    sleep(20);
    return 13;
}

/* In a new pid namespace with its own /proc (as `unshare -p -f
 * --mount-proc`): the owner is pid 1 there, and its /proc/self is not the
 * parent's /proc/1. */
static int own_in_pid_namespace(void *arg)
{
    struct live_shm *m = arg;

    if (unshare(CLONE_NEWPID | CLONE_NEWNS) < 0) {
        atomic_store(&m->rc, -errno);
        atomic_store(&m->step, -1);
        return 0;
    }
    pid_t pid = fork();
    if (pid < 0)
        return 2;
    if (pid == 0) {
        if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) {
            fprintf(stderr, "mount proc: %s\n", strerror(errno));
            tu_exit(3);
        }
        if (getpid() != 1)
            tu_exit(4);
        tu_exit(own_then(m, THEN_PARK));
    }
    atomic_store(&m->pid, pid); /* as this (the parent's) namespace sees it */
    int st;
    waitpid(pid, &st, 0);
    return 0;
}

/* Get m->key from the creator and wait: -ETIMEDOUT while the owner lives,
 * SFS_WAIT_OWNER once it is gone. */
static int wait_on_key(struct sfs_cache *c, const struct sfs_key *k, int64_t ns)
{
    struct sfs_lease l;
    int role = sfs_cache_get(c, k, 0, sfs_deadline_after(SEC), &l);

    if (role != SFS_WAITER) {
        if (role >= 0)
            sfs_cache_release(c, &l);
        return role == SFS_OWNER ? SFS_WAIT_OWNER : role;
    }
    int r = sfs_cache_wait(c, &l, sfs_deadline_after(ns));
    if (r == SFS_WAIT_OWNER)
        sfs_cache_fail(c, &l, -EIO); /* hand it on: the test only asks who */
    sfs_cache_release(c, &l);
    return r;
}

Test(liveness, rank_in_own_pid_namespace_lives_and_dies_by_its_connection, .timeout = 30)
{
    const char *path;

    need_root();
    struct sfs_cache *c = served(&path);
    struct live_shm *m = live_shm(path, tu_key(7, 0));
    pid_t mid = tu_fork(own_in_pid_namespace, m);

    cr_assert(wait_for(&m->step, 1, 5 * SEC) || atomic_load(&m->step) < 0, "owner never ran");
    if (atomic_load(&m->step) < 0) {
        tu_wait(mid);
        cr_skip_test("no pid namespace here: %s", strerror(-atomic_load(&m->rc)));
    }
    /* Alive in its namespace: no reap, no takeover, whatever pid 1 is here. */
    cr_assert_eq(sfs_cache_reap(c), 0, "a live rank in a pid namespace was reaped");
    cr_assert_eq(wait_on_key(c, &m->key, 500 * MS), -ETIMEDOUT,
                 "a waiter took over from a live owner in another pid namespace");
    cr_assert_eq(sfs_cache_state(c, &m->key), SFS_STATE_LOADING);
    /* Dead: taken over within 1 s (3 s of margin). */
    cr_assert_gt(atomic_load(&m->pid), 0);
    int64_t t0 = sfs_now_ns();
    kill(atomic_load(&m->pid), SIGKILL);
    cr_assert_eq(wait_on_key(c, &m->key, 3 * SEC), SFS_WAIT_OWNER,
                 "a dead rank in a pid namespace wedged its key");
    int64_t dt = sfs_now_ns() - t0;
    fprintf(stderr, "pid namespace: taken over %.1f ms after the kill\n", dt / 1e6);
    cr_assert_lt(dt, SEC);
    cr_assert_eq(tu_wait(mid), 0);
    sfs_cache_close(c);
}

static int own_and_exec(void *arg)
{
    return own_then(arg, THEN_EXEC);
}

Test(liveness, rank_that_execs_while_owning_a_load_does_not_wedge_it, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    struct live_shm *m = live_shm(path, tu_key(8, 0));
    pid_t child = tu_fork(own_and_exec, m);

    cr_assert(wait_for(&m->step, 1, 5 * SEC), "owner never ran");
    int64_t t0 = sfs_now_ns();
    int r = wait_on_key(c, &m->key, 3 * SEC);
    int64_t dt = sfs_now_ns() - t0;
    fprintf(stderr, "exec: taken over %.1f ms after the owner's exec\n", dt / 1e6);
    kill(child, SIGKILL);
    tu_wait(child);
    cr_assert_eq(r, SFS_WAIT_OWNER, "the exec'd owner still holds its load (wait %d)", r);
    cr_assert_lt(dt, SEC);
    sfs_cache_close(c);
}

/* A pid that comes back means nothing. In a new pid
 * namespace (so the pid can be forced), owner A (pid 2 there) dies holding a
 * load; then B is forked with A's pid (ns_last_pid), attaches, and asks for
 * the same key. B must take the load over, and nobody may treat B as A. */
static int reuse_owner(struct live_shm *m)
{
    int r = own_then(m, THEN_PARK);

    return r;
}

static int reuse_successor(struct live_shm *m)
{
    int err = 0;
    struct sfs_lease l;
    struct sfs_cache *c = sfs_cache_attach(m->path, 1, &err);

    if (!c)
        return 20;
    atomic_store(&m->step, 2); /* attached, with the dead owner's pid */
    int role = sfs_cache_get(c, &m->key, 0, sfs_deadline_after(3 * SEC), &l);
    if (role == SFS_WAITER) {
        int w = sfs_cache_wait(c, &l, sfs_deadline_after(3 * SEC));
        role = w == SFS_WAIT_OWNER ? SFS_OWNER : -100 - w;
    }
    if (role != SFS_OWNER) {
        atomic_store(&m->rc, role);
        return 21;
    }
    uint8_t *data = sfs_cache_data(c, &l);
    tu_fill(&m->key, data, SHARD);
    int s = sfs_cache_settle(c, &l, SHARD, SHARD, 0);
    sfs_cache_release(c, &l);
    atomic_store(&m->rc, s);
    atomic_store(&m->step, 3);
    while (atomic_load(&m->go) < 2) /* stay attached until the parent looked */
        usleep(1000);
    sfs_cache_close(c);
    return s == 0 ? 0 : 22;
}

static int reuse_in_pid_namespace(void *arg)
{
    struct live_shm *m = arg;

    if (unshare(CLONE_NEWPID) < 0) {
        atomic_store(&m->rc, -errno);
        atomic_store(&m->step, -1);
        return 0;
    }
    pid_t init = fork();
    if (init < 0)
        return 2;
    if (init == 0) { /* pid 1 of the new namespace */
        pid_t a = fork();
        if (a == 0)
            tu_exit(reuse_owner(m));
        while (atomic_load(&m->go) < 1)
            usleep(1000);
        kill(a, SIGKILL);
        waitpid(a, NULL, 0);
        /* The next fork gets a's pid again. */
        int fd = open("/proc/sys/kernel/ns_last_pid", O_WRONLY | O_CLOEXEC);
        char num[16];
        int n = snprintf(num, sizeof(num), "%d", (int)a - 1);
        if (fd < 0 || write(fd, num, (size_t)n) != n) {
            atomic_store(&m->rc, -errno);
            atomic_store(&m->step, -2);
            tu_exit(0);
        }
        close(fd);
        pid_t b = fork();
        if (b == 0) {
            if (getpid() != a)
                tu_exit(30);
            tu_exit(reuse_successor(m));
        }
        int st = 0;
        waitpid(b, &st, 0);
        tu_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 40);
    }
    int st = 0;
    waitpid(init, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 50;
}

Test(liveness, a_reused_pid_is_not_the_dead_owner, .timeout = 30)
{
    const char *path;

    need_root();
    struct sfs_cache *c = served(&path);
    struct live_shm *m = live_shm(path, tu_key(13, 0));
    pid_t mid = tu_fork(reuse_in_pid_namespace, m);

    cr_assert(wait_for(&m->step, 1, 5 * SEC) || atomic_load(&m->step) < 0, "owner never ran");
    if (atomic_load(&m->step) == -1) {
        tu_wait(mid);
        cr_skip_test("no pid namespace here: %s", strerror(-atomic_load(&m->rc)));
    }
    cr_assert_eq(sfs_cache_state(c, &m->key), SFS_STATE_LOADING);
    atomic_store(&m->go, 1); /* kill the owner, fork its successor */
    cr_assert(wait_for(&m->step, 3, 5 * SEC), "the successor with the owner's pid never got the key (step %d, rc %d)",
              atomic_load(&m->step), atomic_load(&m->rc));
    cr_assert_eq(atomic_load(&m->rc), 0, "the successor could not publish");
    /* The successor is alive and attached under the dead owner's pid: its
     * record is not reaped, and what it published is served. */
    cr_assert_eq(sfs_cache_reap(c), 0, "the live successor was reaped");
    struct sfs_lease l;
    cr_assert_eq(sfs_cache_get(c, &m->key, 0, sfs_deadline_after(SEC), &l), SFS_HIT);
    cr_assert_eq(tu_check(&m->key, sfs_cache_data(c, &l), SHARD), -1);
    sfs_cache_release(c, &l);
    atomic_store(&m->go, 2);
    cr_assert_eq(tu_wait(mid), 0);
    sfs_cache_close(c);
}

static int own_raw_fork_and_park(void *arg)
{
    return own_then(arg, THEN_RAW_FORK_PARK);
}

/* The owner dies while a child still holds its connection: the peer's pidfd
 * (Linux 6.5+) tells the server. */
Test(liveness, owner_death_seen_by_pidfd_while_a_child_holds_the_connection, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    struct live_shm *m = live_shm(path, tu_key(12, 0));
    pid_t child = tu_fork(own_raw_fork_and_park, m);
    int pidfd = -1;
    socklen_t len = sizeof(pidfd);
    int probe[2];

    /* Does this kernel give a peer pidfd at all? */
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, probe), 0);
    bool have = getsockopt(probe[0], SOL_SOCKET, 77 /* SO_PEERPIDFD */, &pidfd, &len) == 0;
    if (pidfd >= 0)
        close(pidfd);
    close(probe[0]);
    close(probe[1]);
    cr_assert(wait_for(&m->step, 1, 5 * SEC), "owner never ran");
    int64_t t0 = sfs_now_ns();
    kill(child, SIGKILL);
    int r = wait_on_key(c, &m->key, 3 * SEC);
    int64_t dt = sfs_now_ns() - t0;
    tu_wait(child);
    if (atomic_load(&m->pid) > 0)
        kill(atomic_load(&m->pid), SIGKILL);
    if (!have) {
        sfs_cache_close(c);
        cr_skip_test("no SO_PEERPIDFD on this kernel: only the connection's close is seen");
    }
    cr_assert_eq(r, SFS_WAIT_OWNER, "a dead owner stayed attached through its child (wait %d)", r);
    cr_assert_lt(dt, SEC);
    sfs_cache_close(c);
}

static int own_fork_and_exec(void *arg)
{
    return own_then(arg, THEN_FORK_EXEC);
}

/* The owner forks a helper that lives on, then execs: the helper's copy of
 * the connection must not keep the owner's attachment alive. */
Test(liveness, forked_helper_does_not_keep_an_execd_owner_attached, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    struct live_shm *m = live_shm(path, tu_key(11, 0));
    pid_t child = tu_fork(own_fork_and_exec, m);

    cr_assert(wait_for(&m->step, 1, 5 * SEC), "owner never ran");
    int64_t t0 = sfs_now_ns();
    int r = wait_on_key(c, &m->key, 3 * SEC);
    int64_t dt = sfs_now_ns() - t0;
    kill(child, SIGKILL);
    tu_wait(child);
    if (atomic_load(&m->pid) > 0)
        kill(atomic_load(&m->pid), SIGKILL);
    cr_assert_eq(r, SFS_WAIT_OWNER, "the helper kept the exec'd owner attached (wait %d)", r);
    cr_assert_lt(dt, SEC);
    sfs_cache_close(c);
}

static int own_and_drop_connection(void *arg)
{
    return own_then(arg, THEN_DROP_CONNECTION);
}

/* The record lives exactly as long as the connection: a process that closes
 * it is reaped while it lives on (and its pid says nothing). */
Test(liveness, record_is_reaped_when_its_connection_closes, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    struct live_shm *m = live_shm(path, tu_key(9, 0));
    pid_t child = tu_fork(own_and_drop_connection, m);
    struct sfs_stats s;

    cr_assert(wait_for(&m->step, 1, 5 * SEC), "owner never ran");
    int r = wait_on_key(c, &m->key, 3 * SEC);
    cr_assert_eq(kill(child, 0), 0, "the owner should still be alive");
    kill(child, SIGKILL);
    tu_wait(child);
    cr_assert_eq(r, SFS_WAIT_OWNER, "a record outlived its connection (wait %d)", r);
    /* The reaper wakes the waiter (slot Idle) before it counts the record
     * reaped: wait for the count, then check it is exactly one. */
    tu_wait_reaped(c, 1);
    sfs_cache_stats(c, &s);
    cr_assert_eq(s.reaped, 1);
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Process records are bounded per process and come back with the connection
 * (once one process took all 63 free records).
 */

static int attach_until_refused(void *arg)
{
    struct live_shm *m = arg;
    struct sfs_cache *h[64];
    int n = 0, err = 0;

    while (n < 64 && (h[n] = sfs_cache_attach(m->path, -1, &err)))
        n++;
    atomic_store(&m->rc, err);
    atomic_store(&m->pid, n);
    atomic_store(&m->step, 1);
    for (int64_t end = sfs_now_ns() + 20 * SEC; !atomic_load(&m->go) && sfs_now_ns() < end;)
        usleep(1000);
    if (atomic_load(&m->go) == 2) /* leave the clean way */
        while (n > 0)
            sfs_cache_close(h[--n]);
    return 0; /* else: exit holding them all */
}

static unsigned free_records(struct sfs_cache *c)
{
    unsigned n = 0;

    for (uint32_t i = 0; i < c->max_procs; i++)
        n += atomic_load(&c->procs[i].state) == PROC_FREE;
    return n;
}

static void wait_free_records(struct sfs_cache *c, unsigned n)
{
    int64_t end = sfs_now_ns() + 3 * SEC;

    while (free_records(c) < n) {
        cr_assert_lt(sfs_now_ns(), end, "%u records free, %u expected", free_records(c), n);
        usleep(1000);
    }
}

Test(liveness, one_process_cannot_take_every_record, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    unsigned free0 = free_records(c);

    for (int how = 1; how <= 2; how++) {
        struct live_shm *m = live_shm(path, tu_key(10, 0));
        pid_t greedy = tu_fork(attach_until_refused, m);

        cr_assert(wait_for(&m->step, 1, 10 * SEC));
        fprintf(stderr, "one process attached %d times, then %s\n", atomic_load(&m->pid),
                strerror(-atomic_load(&m->rc)));
        cr_assert_eq(atomic_load(&m->rc), -EUSERS);
        cr_assert_lt(atomic_load(&m->pid), (int)c->max_procs / 2,
                     "one process took %d of %u records", atomic_load(&m->pid), c->max_procs);
        /* Another process still gets one. */
        cr_assert_eq(tu_wait(tu_fork(attach_and_close, (void *)path)), 0);
        /* Exit holding them (how 1) or close them (how 2): all come back. */
        atomic_store(&m->go, how);
        cr_assert_eq(tu_wait(greedy), 0);
        wait_free_records(c, free0);
        munmap(m, sizeof(*m));
    }
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Daemon restart: a rank mid-task sees the daemon go within 1 s, fails what
 * waited on the old cache with -ESHUTDOWN, and its next task runs on the new
 * daemon, attached again on the same socket path.
 */

struct daemon_shm {
    char path[108];
    _Atomic int step;
    _Atomic uint64_t requests; /* the daemon's cache: Gets served */
};

/* A stand-in daemon: creates a cache, serves path; `own_first` makes it the
 * owner of block 0's shard 0, never published (a rank that needs it waits on
 * the daemon). Reports its Gets until killed. */
static int run_daemon(struct daemon_shm *d, bool own_first)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    struct sfs_lease l;
    struct sfs_stats s;

    int r = c ? sfs_cache_serve(c, d->path) : -ENOMEM;

    if (r < 0) {
        fprintf(stderr, "daemon: serve %s: %s\n", d->path, strerror(-r));
        return 10;
    }
    if (own_first) {
        struct sfs_key k = tu_key(0, 0);
        if (sfs_cache_get(c, &k, 0, 0, &l) != SFS_OWNER)
            return 11;
    }
    atomic_store(&d->step, 1);
    for (int i = 0; i < 2000; i++) { /* 20 s at most: a failed test's orphan ends */
        sfs_cache_stats(c, &s);
        atomic_store(&d->requests, s.requests);
        usleep(10 * 1000);
    }
    return 0;
}

static int daemon_owning(void *arg)
{
    return run_daemon(arg, true);
}

static int daemon_plain(void *arg)
{
    return run_daemon(arg, false);
}

static void write_blocks(const char *dir, unsigned n)
{
    char p[512], hex[SFS_BLOCK_HEX_LEN + 1];
    uint8_t buf[SHARD];

    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(p, sizeof(p), "%s/data", dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    for (unsigned b = 0; b < n; b++) {
        struct sfs_block_id id = tu_block(b);
        struct sfs_key k = tu_key(b, 0);

        sfs_block_to_hex(&id, hex);
        snprintf(p, sizeof(p), "%s/data/%s", dir, hex);
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        cr_assert_geq(fd, 0);
        tu_fill(&k, buf, SHARD);
        cr_assert_eq(write(fd, buf, SHARD), (ssize_t)SHARD);
        close(fd);
    }
}

#define NBLK 4

static struct sfs_task *load_all(struct sfs_rank *rk, uint8_t (*bufs)[SHARD])
{
    struct sfs_rank_entry e[NBLK];
    struct sfs_task *t = NULL;

    for (unsigned i = 0; i < NBLK; i++)
        e[i] = (struct sfs_rank_entry){.block = tu_block(i), .shard = 0, .addr = bufs[i]};
    int r = sfs_rank_load(rk, e, NBLK, &t);
    cr_assert_eq(r, 0, "load: %s", strerror(-r));
    return t;
}

Test(liveness, rank_survives_a_daemon_restart, .timeout = 60)
{
    char store[128];
    struct daemon_shm *d =
        mmap(NULL, sizeof(*d), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    static uint8_t bufs[NBLK][SHARD];
    char spec[256];
    int st[NBLK], err = 0;

    cr_assert(d != MAP_FAILED);
    memset(d, 0, sizeof(*d));
    snprintf(store, sizeof(store), "%s", tu_path("store"));
    snprintf(d->path, sizeof(d->path), "%s", tu_path("daemon"));
    write_blocks(store, NBLK);
    snprintf(spec, sizeof(spec), "posix:%s", store);

    pid_t d1 = tu_fork(daemon_owning, d);
    cr_assert(wait_for(&d->step, 1, 5 * SEC), "daemon 1 never served (%d)", tu_wait_for(d1, 0));
    struct sfs_rank_config cfg;
    sfs_rank_config_init(&cfg);
    cfg.socket_path = d->path;
    cfg.device_id = 0;
    cfg.backend = spec;
    cfg.copier = SFS_COPIER_HOST;
    cfg.key_timeout_ms = 20000;
    struct sfs_rank *rk = sfs_rank_open(&cfg, &err);
    cr_assert_not_null(rk, "rank open: %s", strerror(-err));

    /* Mid-task: block 0 waits on the daemon's own load. */
    struct sfs_task *t = load_all(rk, bufs);
    usleep(200 * 1000);
    cr_assert_not(sfs_rank_task_done(t), "the task should wait on the daemon's load");
    int64_t t0 = sfs_now_ns();
    kill(d1, SIGKILL);
    int r = sfs_rank_wait(t, 5000, st);
    int64_t dt = sfs_now_ns() - t0;
    fprintf(stderr, "daemon killed: the task ended %.1f ms later, block 0: %s\n", dt / 1e6,
            strerror(-st[0]));
    cr_assert_eq(r, 0, "the task hung after the daemon died");
    cr_assert_lt(dt, SEC, "the task took %lld ms to notice", (long long)(dt / MS));
    cr_assert_eq(st[0], -ESHUTDOWN, "block 0: %d", st[0]);
    for (unsigned i = 1; i < NBLK; i++)
        cr_assert(st[i] == 0 || st[i] == -ESHUTDOWN, "block %u: %d", i, st[i]);
    sfs_rank_task_free(t);
    cr_assert_eq(tu_wait(d1), 128 + SIGKILL);

    /* A fresh daemon on the same path: the next task attaches to it. */
    atomic_store(&d->step, 0);
    pid_t d2 = tu_fork(daemon_plain, d);
    cr_assert(wait_for(&d->step, 1, 5 * SEC), "daemon 2 never served");
    memset(bufs, 0, sizeof(bufs));
    t = load_all(rk, bufs);
    r = sfs_rank_wait(t, 5000, st);
    cr_assert_eq(r, 0);
    for (unsigned i = 0; i < NBLK; i++) {
        struct sfs_key k = tu_key(i, 0);

        cr_assert_eq(st[i], 0, "block %u after the restart: %s", i, strerror(-st[i]));
        cr_assert_eq(tu_check(&k, bufs[i], SHARD), -1, "block %u: wrong bytes", i);
    }
    sfs_rank_task_free(t);
    /* Through the new daemon's cache, not the orphaned one. */
    int64_t end = sfs_now_ns() + 2 * SEC;
    while (atomic_load(&d->requests) < NBLK && sfs_now_ns() < end)
        usleep(1000);
    cr_assert_geq(atomic_load(&d->requests), NBLK, "the rank did not attach to the new daemon");
    sfs_rank_close(rk);
    kill(d2, SIGKILL);
    tu_wait(d2);
}

/* ---------------------------------------------------------------------------
 * The same with the real daemon: kill -9 of a mounted shardfs while a rank
 * waits on a load the daemon itself serves (a shell's read), then a fresh
 * mount on the same mount point and socket.
 */

/* The daemon next to this test program (build/tests/.. -> build/fs/shardfs). */
static bool daemon_bin(char *out, size_t len)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

    if (n <= 0)
        return false;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (!slash)
        return false;
    *slash = '\0';
    snprintf(out, len, "%s/../fs/shardfs", self);
    return access(out, X_OK) == 0;
}

static bool mounted(const char *mnt)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    char line[4096], pat[300];
    bool found = false;

    if (!f)
        return false;
    snprintf(pat, sizeof(pat), " %s ", mnt);
    while (!found && fgets(line, sizeof(line), f))
        found = strstr(line, pat) && strstr(line, "fuse.shardfs");
    fclose(f);
    return found;
}

static pid_t mount_daemon(const char *bin, const char *spec, const char *mnt, const char *sock)
{
    char o[512];
    pid_t pid;

    snprintf(o, sizeof(o), "socket=%s,hugepages=off,capacity=16M,shard_size=4K,readahead=0", sock);
    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(bin, "shardfs", "-f", "-o", o, spec, mnt, (char *)NULL);
        tu_exit(127);
    }
    for (int64_t end = sfs_now_ns() + 10 * SEC; !mounted(mnt);) {
        int st;

        cr_assert_neq(waitpid(pid, &st, WNOHANG), pid, "the daemon exited before mounting");
        cr_assert_lt(sfs_now_ns(), end, "the mount did not appear");
        usleep(10 * 1000);
    }
    return pid;
}

static uint64_t stats_requests(const char *mnt)
{
    char p[512], line[512];
    unsigned long long v = 0;

    snprintf(p, sizeof(p), "%s/stats", mnt);
    FILE *f = fopen(p, "re");
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "shardfs_requests_total %llu", &v) == 1)
            break;
    fclose(f);
    return v;
}

/* A shell's read of block 0's shard 0 through the mount: the daemon owns
 * that load (its backend is slow). */
static int read_shard0(void *arg)
{
    char p[512], hex[SFS_BLOCK_HEX_LEN + 1], buf[SHARD];
    struct sfs_block_id id = tu_block(0);

    sfs_block_to_hex(&id, hex);
    snprintf(p, sizeof(p), "%s/block/%s/shard/0", (const char *)arg, hex);
    int fd = open(p, O_RDONLY);
    if (fd >= 0) {
        (void)!read(fd, buf, sizeof(buf));
        close(fd);
    }
    return 0;
}

/* A failed assertion must not leave a mount or a daemon behind. */
static char fini_mnt[128];
static pid_t fini_pids[3];

static void unmount_all(void)
{
    char cmd[256];

    for (int i = 0; i < 3; i++)
        if (fini_pids[i] > 0)
            kill(fini_pids[i], SIGKILL);
    if (fini_mnt[0]) {
        snprintf(cmd, sizeof(cmd), "fusermount3 -uz %s 2>/dev/null", fini_mnt);
        (void)!system(cmd);
    }
}

Test(liveness, rank_survives_kill_9_of_the_mounted_daemon, .timeout = 90, .fini = unmount_all)
{
    char bin[4200], store[128], mnt[128], sock[108], slow[256], spec[256], cmd[512];
    static uint8_t bufs[NBLK][SHARD];
    int st[NBLK], err = 0;

    if (!daemon_bin(bin, sizeof(bin)))
        cr_skip_test("no shardfs daemon next to the tests");
    int fuse = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fuse < 0 || system("command -v fusermount3 >/dev/null") != 0)
        cr_skip_test("no usable /dev/fuse or fusermount3");
    close(fuse);
    snprintf(store, sizeof(store), "%s", tu_path("store"));
    snprintf(mnt, sizeof(mnt), "%s", tu_path("mnt"));
    snprintf(sock, sizeof(sock), "%s", tu_path("sock"));
    write_blocks(store, NBLK);
    cr_assert_eq(mkdir(mnt, 0755), 0);
    snprintf(slow, sizeof(slow), "fault:latency_us=20000000:posix:%s", store);
    snprintf(spec, sizeof(spec), "posix:%s", store);

    snprintf(fini_mnt, sizeof(fini_mnt), "%s", mnt);
    pid_t d1 = fini_pids[0] = mount_daemon(bin, slow, mnt, sock);
    struct sfs_rank_config cfg;
    sfs_rank_config_init(&cfg);
    cfg.mount_point = mnt;
    cfg.device_id = 0;
    cfg.backend = spec;
    cfg.copier = SFS_COPIER_HOST;
    cfg.key_timeout_ms = 20000;
    struct sfs_rank *rk = sfs_rank_open(&cfg, &err);
    cr_assert_not_null(rk, "rank open: %s", strerror(-err));

    /* The daemon owns block 0 (a read waits 20 s on its backend); the rank
     * waits on it mid-task. */
    pid_t reader = fini_pids[1] = tu_fork(read_shard0, mnt);
    usleep(300 * 1000);
    struct sfs_task *t = load_all(rk, bufs);
    usleep(300 * 1000);
    cr_assert_not(sfs_rank_task_done(t), "the task should wait on the daemon's load");
    int64_t t0 = sfs_now_ns();
    kill(d1, SIGKILL);
    int r = sfs_rank_wait(t, 5000, st);
    int64_t dt = sfs_now_ns() - t0;
    fprintf(stderr, "mounted daemon killed: the task ended %.1f ms later, block 0: %s\n", dt / 1e6,
            strerror(-st[0]));
    cr_assert_eq(r, 0, "the task hung after the daemon died");
    cr_assert_lt(dt, SEC);
    cr_assert_eq(st[0], -ESHUTDOWN, "block 0: %d", st[0]);
    sfs_rank_task_free(t);
    waitpid(d1, NULL, 0);
    fini_pids[0] = 0; /* reaped: its pid is no longer ours to kill */
    tu_wait_for(reader, 5 * SEC);
    fini_pids[1] = 0;
    snprintf(cmd, sizeof(cmd), "fusermount3 -uz %s 2>/dev/null", mnt);
    (void)!system(cmd);

    /* A fresh mount (a fast backend this time): the next task goes there. */
    pid_t d2 = fini_pids[2] = mount_daemon(bin, store, mnt, sock);
    memset(bufs, 0, sizeof(bufs));
    t = load_all(rk, bufs);
    r = sfs_rank_wait(t, 5000, st);
    cr_assert_eq(r, 0);
    for (unsigned i = 0; i < NBLK; i++) {
        struct sfs_key k = tu_key(i, 0);

        cr_assert_eq(st[i], 0, "block %u after the restart: %s", i, strerror(-st[i]));
        cr_assert_eq(tu_check(&k, bufs[i], SHARD), -1, "block %u: wrong bytes", i);
    }
    sfs_rank_task_free(t);
    cr_assert_geq(stats_requests(mnt), NBLK, "the rank's Gets are not in the new daemon's stats");
    sfs_rank_close(rk);
    (void)!system(cmd);
    waitpid(d2, NULL, 0);
    fini_pids[0] = fini_pids[1] = fini_pids[2] = 0;
    fini_mnt[0] = '\0';
    rmdir(mnt);
}

/* ---------------------------------------------------------------------------
 * A server out of file descriptors pauses accepting instead of spinning on a
 * listening socket that stays readable.
 */

struct fd_shm {
    char path[108];
    _Atomic int step;
    _Atomic long cpu_us; /* the server process's CPU time over the busy second */
};

static long cpu_us_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int server_with_few_fds(void *arg)
{
    struct fd_shm *f = arg;
    struct sfs_cache *c = tu_cache(8, 0, SHARD);
    struct rlimit rl;

    if (!c || sfs_cache_serve(c, f->path) < 0)
        return 10;
    /* A few fds above what is open now: the server soon runs out. */
    int top = 0;
    for (int fd = 0; fd < 4096; fd++)
        if (fcntl(fd, F_GETFD) >= 0)
            top = fd;
    rl.rlim_cur = rl.rlim_max = (rlim_t)top + 4;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
        return 11;
    atomic_store(&f->step, 1);
    while (atomic_load(&f->step) < 2)
        usleep(1000);
    long t0 = cpu_us_now();
    sleep(1);
    atomic_store(&f->cpu_us, cpu_us_now() - t0);
    atomic_store(&f->step, 3);
    sleep(20); /* until killed */
    return 0;
}

Test(liveness, server_out_of_fds_does_not_spin, .timeout = 30)
{
    struct fd_shm *f =
        mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int socks[16];

    cr_assert(f != MAP_FAILED);
    memset(f, 0, sizeof(*f));
    snprintf(f->path, sizeof(f->path), "%s", tu_path("fds"));
    pid_t srv = tu_fork(server_with_few_fds, f);
    cr_assert(wait_for(&f->step, 1, 5 * SEC), "the server never served");
    /* More silent clients than it has fds for: the rest wait in the backlog. */
    for (int i = 0; i < 16; i++)
        socks[i] = raw_connect(f->path);
    atomic_store(&f->step, 2);
    cr_assert(wait_for(&f->step, 3, 10 * SEC));
    long cpu = atomic_load(&f->cpu_us);
    fprintf(stderr, "out of fds: the server used %ld us of CPU in 1 s\n", cpu);
    kill(srv, SIGKILL);
    tu_wait(srv);
    for (int i = 0; i < 16; i++)
        close(socks[i]);
    /* Spinning on accept takes the whole second; a paused server, almost
     * nothing (generous: a quarter). */
    cr_assert_lt(cpu, 250000, "the server spun on accept: %ld us of CPU in 1 s", cpu);
}

/* ---------------------------------------------------------------------------
 * Random kills of the daemon under ranks that keep loading: never a wrong
 * byte or a hang, every key served again after the last restart, and no
 * lease left in the last daemon's cache.
 */

#define DK_BLOCKS 32
#define DK_RANKS  2
#define DK_ROUNDS 8

struct dk_shm {
    char path[108];
    char spec[256];
    _Atomic int daemon_step; /* 1: serving; parent sets 2: report leases */
    _Atomic int leases, entries;
    _Atomic long requests; /* the last daemon's Gets */
    _Atomic int stop;      /* parent -> ranks: do the final pass and leave */
    _Atomic int done;      /* ranks that finished */
    _Atomic long wrong, hangs, other, ok, shutdown, final_bad, tasks;
    _Atomic int last_other; /* the last unexpected error, for the message */
};

static int dk_daemon(void *arg)
{
    struct dk_shm *m = arg;
    struct sfs_cache *c = tu_cache(16, 0, SHARD); /* half the keys: eviction */

    if (!c || sfs_cache_serve(c, m->path) < 0)
        return 10;
    atomic_store(&m->daemon_step, 1);
    for (int i = 0; i < 3000 && atomic_load(&m->daemon_step) != 2; i++)
        usleep(10 * 1000);
    unsigned entries = 0;
    atomic_store(&m->leases, (int)tu_leases_left(c, &entries));
    atomic_store(&m->entries, (int)entries);
    struct sfs_stats st;
    sfs_cache_stats(c, &st);
    atomic_store(&m->requests, (long)st.requests);
    atomic_store(&m->daemon_step, 3);
    sleep(20); /* until killed */
    return 0;
}

/* Load blocks `first`.. (n of them, wrapping); count what came back. */
static void dk_pass(struct dk_shm *m, struct sfs_rank *rk, unsigned first, unsigned n, bool final)
{
    static uint8_t bufs[DK_BLOCKS][SHARD];
    struct sfs_rank_entry e[DK_BLOCKS];
    int st[DK_BLOCKS];
    struct sfs_task *t = NULL;
    int r;

    for (unsigned i = 0; i < n; i++) {
        unsigned b = (first + i) % DK_BLOCKS;
        e[i] = (struct sfs_rank_entry){.block = tu_block(b), .shard = 0, .addr = bufs[i]};
        memset(bufs[i], 0xee, SHARD);
    }
    /* No daemon serving right now: the call says so; try again shortly. */
    for (int64_t end = sfs_now_ns() + 5 * SEC; (r = sfs_rank_load(rk, e, n, &t)) < 0;) {
        /* No socket, nobody listening, or a daemon killed mid-attach. */
        bool none = r == -ENOENT || r == -ECONNREFUSED || r == -ECONNRESET || r == -EPIPE;

        if (sfs_now_ns() > end || !none) {
            atomic_fetch_add(final ? &m->final_bad : &m->other, 1);
            atomic_store(&m->last_other, r);
            return;
        }
        usleep(5 * 1000);
    }
    atomic_fetch_add(&m->tasks, 1);
    if (sfs_rank_wait(t, 5000, st) < 0) {
        atomic_fetch_add(&m->hangs, 1);
        sfs_rank_task_free(t);
        return;
    }
    for (unsigned i = 0; i < n; i++) {
        unsigned b = (first + i) % DK_BLOCKS;
        struct sfs_key k = tu_key(b, 0);

        if (st[i] == 0) {
            if (tu_check(&k, bufs[i], SHARD) != -1)
                atomic_fetch_add(&m->wrong, 1);
            else
                atomic_fetch_add(&m->ok, 1);
        } else if (final) {
            atomic_fetch_add(&m->final_bad, 1);
            atomic_store(&m->last_other, st[i]);
        } else if (st[i] == -ESHUTDOWN) {
            atomic_fetch_add(&m->shutdown, 1);
        } else {
            atomic_fetch_add(&m->other, 1);
            atomic_store(&m->last_other, st[i]);
        }
    }
    sfs_rank_task_free(t);
}

static int dk_rank(void *arg)
{
    struct dk_shm *m = arg;
    struct sfs_rank_config cfg;
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    int err = 0;

    sfs_rank_config_init(&cfg);
    cfg.socket_path = m->path;
    cfg.device_id = getpid() % 8;
    cfg.backend = m->spec;
    cfg.copier = SFS_COPIER_HOST;
    cfg.key_timeout_ms = 3000;
    struct sfs_rank *rk = sfs_rank_open(&cfg, &err);
    if (!rk)
        return 10;
    for (int64_t end = sfs_now_ns() + 20 * SEC; !atomic_load(&m->stop) && sfs_now_ns() < end;)
        dk_pass(m, rk, (unsigned)(tu_rng_next(&rng) % DK_BLOCKS), 8, false);
    dk_pass(m, rk, 0, DK_BLOCKS, true); /* after the last restart: everything */
    sfs_rank_close(rk);
    atomic_fetch_add(&m->done, 1);
    return 0;
}

Test(liveness, daemon_killed_at_random_instants_under_loading_ranks, .timeout = 90)
{
    struct dk_shm *m =
        mmap(NULL, sizeof(*m), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    char store[128];
    pid_t ranks[DK_RANKS], d;
    uint64_t rng = 0x5eedull ^ (uint64_t)getpid();

    cr_assert(m != MAP_FAILED);
    memset(m, 0, sizeof(*m));
    snprintf(store, sizeof(store), "%s", tu_path("dkstore"));
    snprintf(m->path, sizeof(m->path), "%s", tu_path("dk"));
    write_blocks(store, DK_BLOCKS);
    snprintf(m->spec, sizeof(m->spec), "fault:latency_us=10000,jitter_us=10000:posix:%s", store);

    d = tu_fork(dk_daemon, m);
    cr_assert(wait_for(&m->daemon_step, 1, 5 * SEC));
    for (int i = 0; i < DK_RANKS; i++)
        ranks[i] = tu_fork(dk_rank, m);
    for (int round = 0; round < DK_ROUNDS; round++) {
        usleep((useconds_t)(100000 + tu_rng_next(&rng) % 300000));
        kill(d, SIGKILL);
        tu_wait(d);
        usleep((useconds_t)(tu_rng_next(&rng) % 100000));
        atomic_store(&m->daemon_step, 0);
        d = tu_fork(dk_daemon, m);
        cr_assert(wait_for(&m->daemon_step, 1, 5 * SEC), "daemon %d never served", round + 2);
    }
    atomic_store(&m->stop, 1);
    for (int i = 0; i < DK_RANKS; i++)
        cr_assert_eq(tu_wait_for(ranks[i], 30 * SEC), 0, "rank %d", i);
    atomic_store(&m->daemon_step, 2);
    cr_assert(wait_for(&m->daemon_step, 3, 5 * SEC));
    kill(d, SIGKILL);
    tu_wait(d);
    fprintf(stderr,
            "daemon kills: %d; tasks %ld, entries ok %ld, ESHUTDOWN %ld, other %ld, wrong %ld, "
            "hangs %ld, final misses %ld, leases left %d (entries %d)\n",
            DK_ROUNDS, atomic_load(&m->tasks), atomic_load(&m->ok), atomic_load(&m->shutdown),
            atomic_load(&m->other), atomic_load(&m->wrong), atomic_load(&m->hangs),
            atomic_load(&m->final_bad), atomic_load(&m->leases), atomic_load(&m->entries));
    cr_assert_eq(atomic_load(&m->done), DK_RANKS);
    cr_assert_eq(atomic_load(&m->wrong), 0, "wrong bytes");
    cr_assert_eq(atomic_load(&m->hangs), 0, "a task hung");
    cr_assert_eq(atomic_load(&m->other), 0, "errors other than ESHUTDOWN: the last %s",
                 strerror(-atomic_load(&m->last_other)));
    cr_assert_eq(atomic_load(&m->final_bad), 0, "keys not served after the last restart");
    cr_assert_eq(atomic_load(&m->leases), 0, "slots leased in the last cache");
    cr_assert_eq(atomic_load(&m->entries), 0, "lease entries in the last cache");
    cr_assert_gt(atomic_load(&m->tasks), DK_ROUNDS);
    /* The final passes went through the last daemon, not an orphaned cache. */
    cr_assert_geq(atomic_load(&m->requests), DK_RANKS * DK_BLOCKS,
                  "the ranks did not attach to the last daemon");
}
