/* SPDX-License-Identifier: MIT */
/*
 * test_container.c - an engine in a container next to the daemon on the
 * host: a rank in its own user, pid, mount and network namespaces, with the
 * daemon's socket directory, its mount and the store bind-mounted in, as a
 * Kubernetes pod with hostPath volumes sees them.
 *
 * A pod here is what a container runtime makes of one: a process unshares
 * the four namespaces, the test (root outside) writes its uid and gid maps
 * (container 0..65535 are host POD_UID..), and the pod's init (pid 1 of the
 * new pid namespace) builds its root on a tmpfs (the volumes bound in, a
 * /proc of its own), chroots there and starts the workload. Killing the
 * init with SIGKILL ends the pid namespace and every process in it.
 *
 * Also the daemon in a pid namespace of its own (a DaemonSet pod without
 * hostPID), where every peer's pid reads as 0. Real daemons on real FUSE
 * mounts (tests/fsfixture.h); skips without FUSE or user namespaces.
 */
#include "fsfixture.h"
#include "testutil.h"

#include <shardfs/cache.h>
#include <shardfs/rank.h>

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD       (64u << 10)
#define NSH         2
#define NBLOCKS     8
#define POD_UID     100000u /* the host uid of the pod's uid 0 */
#define POD_SOCKDIR "/run/shardfs"

static struct {
    struct fsfx fx;
    char store[128];
    char run[96];   /* the socket directory */
    char pod[128];  /* an empty directory: the pod's root is a tmpfs on it */
    pid_t pod_init; /* a pod's init while it runs: teardown kills it */
} M;

static void setup(void)
{
    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    if (geteuid() != 0)
        cr_skip_test("not root: a pod's uid and gid maps name host ids only root may map");
    memset(&M, 0, sizeof(M));
    M.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
    snprintf(M.store, sizeof(M.store), "%s", tu_path("store"));
    snprintf(M.run, sizeof(M.run), "%s", tu_path("run"));
    snprintf(M.pod, sizeof(M.pod), "%s", tu_path("pod"));
    snprintf(M.fx.mnt, sizeof(M.fx.mnt), "%s", tu_path("mnt"));
    snprintf(M.fx.sock, sizeof(M.fx.sock), "%s/shardfs.sock", M.run);
    snprintf(M.fx.log, sizeof(M.fx.log), "%s", tu_path("log"));
    cr_assert_eq(mkdir(M.store, 0755), 0);
    cr_assert_eq(mkdir(M.run, 0755), 0);
    cr_assert_eq(mkdir(M.pod, 0755), 0);
    cr_assert_eq(tu_store_write(M.store, 0, NBLOCKS, NSH, SHARD, NULL, NULL, false), 0);
    /* The pod's user writes dumps into the store (a volume it may write). */
    cr_assert_eq(fsfx_sh("chmod -R a+rwX %s", M.store), 0);
}

static void teardown(void)
{
    if (M.pod_init > 0)
        kill(M.pod_init, SIGKILL); /* a failed test's pod: its shim is reaped below */
    if (M.fx.pid > 0)
        fsfx_stop(&M.fx, true, 10.0);
    fsfx_cleanup(&M.fx, M.store);
    rmdir(M.pod);
    unlink(M.fx.sock); /* where a server left it (the one in its own pid namespace) */
    rmdir(M.run);
}

TestSuite(container, .init = setup, .fini = teardown, .timeout = 120);

static void start(const char *opts)
{
    char o[256];
    int st = 0, r;

    snprintf(o, sizeof(o),
             "allow_other,hugepages=off,capacity=4M,shard_size=64K,readahead=0,warm=0%s%s",
             opts ? "," : "", opts ? opts : "");
    r = fsfx_start(&M.fx, M.store, o, 10.0, &st);
    cr_assert_eq(r, 0, "daemon did not mount (%s, status %d), see %s", strerror(-r), st, M.fx.log);
}

/* ---------------------------------------------------------------------------
 * A pod.
 */

struct pod {
    pid_t shim; /* outside the pod: unshared the namespaces, waits for init */
    pid_t init; /* the pod's pid 1, as the host sees it */
    int report; /* reads the workload's one int */
    int hold;   /* the workload lives until this closes (or the pod is killed) */
};

struct pod_spec {
    /* Where the socket directory is bound in the pod: POD_SOCKDIR, or
     * (same_path) the host's own path, as a hostPath volume with the same
     * mountPath gives it. */
    bool same_path;
    int (*body)(void *arg); /* the workload: returns what it reports */
    void *arg;
};

static int pod_spec_body_fd = -1; /* the workload's report pipe */
static int pod_hold_fd = -1;      /* and its hold pipe */
static int pod_hold_wr = -1;      /* the test's end of it: the pod closes its copy */

/* The workload reports its result (once) and waits for the hold pipe. */
static void pod_report(int v)
{
    if (write(pod_spec_body_fd, &v, sizeof(v)) != sizeof(v))
        tu_exit(99);
}

static void pod_wait_hold(void)
{
    char ch;

    while (read(pod_hold_fd, &ch, 1) < 0 && errno == EINTR)
        ;
}

static int bind_dir(const char *src, const char *dst)
{
    if (fsfx_sh("mkdir -p %s", dst) != 0)
        return -1;
    return mount(src, dst, NULL, MS_BIND, NULL);
}

/* The pod's init: its root, then the workload. Returns an exit status. */
static int pod_init(const struct pod_spec *sp)
{
    char p[512];
    pid_t w;
    int st;

    /* Mounts of the host propagate in (HostToContainer), none go out. */
    if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
        return 20;
    if (mount("tmpfs", M.pod, "tmpfs", 0, "mode=0755") < 0)
        return 21;
    snprintf(p, sizeof(p), "%s%s", M.pod, sp->same_path ? M.run : POD_SOCKDIR);
    if (bind_dir(M.run, p) < 0)
        return 22;
    snprintf(p, sizeof(p), "%s/mnt", M.pod);
    if (bind_dir(M.fx.mnt, p) < 0)
        return 23;
    snprintf(p, sizeof(p), "%s/store", M.pod);
    if (bind_dir(M.store, p) < 0)
        return 24;
    snprintf(p, sizeof(p), "%s/proc", M.pod);
    if (fsfx_sh("mkdir -p %s", p) != 0 ||
        mount("proc", p, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        return 25;
    if (chroot(M.pod) < 0 || chdir("/") < 0)
        return 26;
    w = fork();
    if (w < 0)
        return 27;
    if (w == 0)
        tu_exit(sp->body(sp->arg));
    while (waitpid(w, &st, 0) < 0)
        if (errno != EINTR)
            return 28;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

struct shim_arg {
    const struct pod_spec *sp;
    int up, down; /* to the test: 'u' (unshared), then init's pid; from it: 'm' (mapped) */
};

static int pod_shim(void *arg)
{
    const struct shim_arg *a = arg;
    pid_t init;
    char ch = 'u';
    int st;

    close(pod_hold_wr);
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID) < 0)
        return 10;
    if (write(a->up, &ch, 1) != 1 || read(a->down, &ch, 1) != 1 || ch != 'm')
        return 11;
    /* Mapped: become the pod's root (host POD_UID). */
    if (setresgid(0, 0, 0) < 0 || setgroups(0, NULL) < 0 || setresuid(0, 0, 0) < 0)
        return 12;
    init = fork();
    if (init < 0)
        return 13;
    if (init == 0)
        tu_exit(pod_init(a->sp));
    if (write(a->up, &init, sizeof(init)) != sizeof(init))
        return 14;
    while (waitpid(init, &st, 0) < 0)
        if (errno != EINTR)
            return 15;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int write_file(const char *path, const char *s)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    ssize_t n;

    if (fd < 0)
        return -errno;
    n = write(fd, s, strlen(s));
    close(fd);
    return n == (ssize_t)strlen(s) ? 0 : -EIO;
}

/* Start a pod running sp->body; returns once its init runs (the workload
 * reports through p->report). Skips when user namespaces are off. */
static void pod_start(struct pod *p, struct pod_spec *sp)
{
    int up[2], down[2], rep[2], hold[2];
    char path[64], map[64], ch;

    cr_assert_eq(pipe2(up, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(down, O_CLOEXEC), 0);
    cr_assert_eq(pipe(rep), 0);
    cr_assert_eq(pipe(hold), 0);
    pod_spec_body_fd = rep[1];
    pod_hold_fd = hold[0];
    pod_hold_wr = hold[1];
    struct shim_arg a = {.sp = sp, .up = up[1], .down = down[0]};
    p->shim = tu_fork(pod_shim, &a);
    cr_assert_gt(p->shim, 0);
    close(up[1]);
    close(down[0]);
    close(rep[1]);
    close(hold[0]);
    if (read(up[0], &ch, 1) != 1) {
        int st = tu_wait(p->shim);
        if (st == 10)
            cr_skip_test("cannot unshare user, pid, mount and network namespaces");
        cr_assert_fail("the pod's shim exited with %d", st);
    }
    snprintf(map, sizeof(map), "0 %u 65536\n", POD_UID);
    snprintf(path, sizeof(path), "/proc/%d/uid_map", (int)p->shim);
    cr_assert_eq(write_file(path, map), 0);
    snprintf(path, sizeof(path), "/proc/%d/gid_map", (int)p->shim);
    cr_assert_eq(write_file(path, map), 0);
    ch = 'm';
    cr_assert_eq(write(down[1], &ch, 1), 1);
    close(down[1]);
    cr_assert_eq(read(up[0], &p->init, sizeof(p->init)), (ssize_t)sizeof(p->init),
                 "the pod's shim exited early: %d", tu_wait(p->shim));
    close(up[0]);
    M.pod_init = p->init;
    p->report = rep[0];
    p->hold = hold[1];
}

/* The workload's report; INT32_MIN when the pod ended without one (its
 * status is then in the message). */
static int pod_result(struct pod *p)
{
    int v;
    ssize_t n;

    while ((n = read(p->report, &v, sizeof(v))) < 0 && errno == EINTR)
        ;
    return n == sizeof(v) ? v : INT32_MIN;
}

/* SIGKILL the pod's init: the whole pid namespace goes. */
static void pod_kill(struct pod *p)
{
    cr_assert_eq(kill(p->init, SIGKILL), 0);
    tu_wait_for(p->shim, 30ll * 1000000000);
    M.pod_init = 0;
    close(p->report);
    close(p->hold);
}

/* Let the workload return, and the pod end; its exit status. */
static int pod_end(struct pod *p)
{
    close(p->hold);
    int st = tu_wait_for(p->shim, 30ll * 1000000000);
    M.pod_init = 0;
    close(p->report);
    return st;
}

/* ---------------------------------------------------------------------------
 * What runs in the pods.
 */

static const char *pod_sock(void)
{
    static char s[256];

    snprintf(s, sizeof(s), POD_SOCKDIR "/%s", strrchr(M.fx.sock, '/') + 1);
    return s;
}

static struct sfs_rank *pod_rank(const char *sock, const char *mnt, int *err)
{
    struct sfs_rank_config cfg;

    sfs_rank_config_init(&cfg);
    cfg.socket_path = sock;
    cfg.mount_point = mnt;
    cfg.backend = "posix:/store";
    cfg.copier = SFS_COPIER_HOST;
    return sfs_rank_open(&cfg, err);
}

/* Load shard s of blocks [first, first + n) and check every byte. */
static int pod_load(struct sfs_rank *rk, uint64_t first, uint32_t n, uint32_t s)
{
    struct sfs_rank_entry e[NBLOCKS];
    uint8_t *buf = malloc((size_t)n * SHARD);
    struct sfs_task *t;
    int st[NBLOCKS], r;

    if (!buf)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++)
        e[i] = (struct sfs_rank_entry){
            .block = tu_block(first + i), .shard = s, .addr = buf + (size_t)i * SHARD};
    r = sfs_rank_load(rk, e, n, &t);
    if (r == 0) {
        r = sfs_rank_wait(t, 20000, st);
        sfs_rank_task_free(t);
    }
    for (uint32_t i = 0; r == 0 && i < n; i++) {
        struct sfs_key k = tu_key(first + i, s);

        if (st[i] != 0)
            r = st[i];
        else if (tu_check(&k, buf + (size_t)i * SHARD, SHARD) != -1)
            r = -EBADMSG;
    }
    free(buf);
    return r;
}

/* Dump shard s of block b with its tu_fill bytes (write-through). */
static int pod_dump(struct sfs_rank *rk, uint64_t b, uint32_t s)
{
    struct sfs_key k = tu_key(b, s);
    uint8_t *buf = malloc(SHARD);
    struct sfs_rank_entry e = {.block = tu_block(b), .shard = s, .addr = buf};
    struct sfs_task *t;
    int st = 0, r;

    if (!buf)
        return -ENOMEM;
    tu_fill(&k, buf, SHARD);
    r = sfs_rank_dump(rk, &e, 1, &t);
    if (r == 0) {
        r = sfs_rank_wait(t, 20000, &st);
        sfs_rank_task_free(t);
    }
    free(buf);
    return r < 0 ? r : st;
}

/* Attach through the bound socket directory, load, dump, then hold a
 * rank and an owner's lease of a Loading key (block 3, shard 1)
 * until killed. Reports 0, or the step (1..) that failed, times 1000,
 * minus its errno. */
static int body_attach_load_dump(void *arg)
{
    struct sfs_key held = tu_key(3, 1);
    struct sfs_lease l;
    struct sfs_cache *c;
    struct sfs_rank *rk;
    int err = 0, r;

    (void)arg;
    rk = pod_rank(pod_sock(), NULL, &err);
    if (!rk) {
        pod_report(1000 - err);
        return 1;
    }
    r = pod_load(rk, 0, NBLOCKS, 0);
    if (r == 0 && (r = pod_load(rk, 0, NBLOCKS, 0)) != 0) /* from memory */
        r -= 1000;
    if (r == 0 && (r = pod_dump(rk, NBLOCKS, 0)) != 0)
        r -= 2000;
    c = r == 0 ? sfs_cache_attach(pod_sock(), 0, &err) : NULL;
    if (r == 0 && !c)
        r = -3000 + err;
    if (c) {
        sfs_cache_set_class(c, "rank");
        r = sfs_cache_get(c, &held, 0, 0, &l);
        r = r == SFS_OWNER ? 0 : -4000 + (r < 0 ? r : -1);
    }
    pod_report(-r);
    pod_wait_hold();
    return 0;
}

/* ---------------------------------------------------------------------------
 * The tests.
 */

static long long attached(const char *cls)
{
    char name[96];

    snprintf(name, sizeof(name), "shardfs_attached_processes{class=\"%s\"}", cls);
    return fsfx_stat(&M.fx, name);
}

/* Read shard (b, s) through the mount and check every byte. */
static void read_check(uint64_t b, uint32_t s)
{
    uint8_t *buf = malloc(SHARD);
    struct sfs_key k = tu_key(b, s);
    long n;

    cr_assert_not_null(buf);
    n = fsfx_read_all(fsfx_shard_path(&M.fx, b, s), buf, SHARD);
    cr_assert_eq(n, (long)SHARD, "read (%llu,%u): %ld", (unsigned long long)b, s, n);
    cr_assert_eq(tu_check(&k, buf, SHARD), -1, "wrong bytes in (%llu,%u)", (unsigned long long)b,
                 s);
    free(buf);
}

/* The pod's root maps to POD_UID on the host, and SO_PEERCRED says so: the
 * daemon allows it by that uid. The rank loads and dumps byte-exact; killed
 * with its pod, it is reaped: its records go, and the key it was loading is
 * taken over by the next reader. */
Test(container, a_rank_in_a_pod_attaches_loads_dumps_and_is_reaped_with_it)
{
    struct pod p;
    struct pod_spec sp = {.body = body_attach_load_dump};
    char opt[64];

    snprintf(opt, sizeof(opt), "attach_uids=%u", POD_UID);
    start(opt);
    pod_start(&p, &sp);
    int v = pod_result(&p);
    cr_assert_eq(v, 0, "the pod's workload reported %d (see the daemon's log %s)", v, M.fx.log);
    cr_assert_eq(attached("rank"), 2, "the rank and the bare handle");
    read_check(NBLOCKS, 0); /* the dump, from the cache */
    pod_kill(&p);
    /* The connections closed with the pod: reaped within the reaper's pass. */
    double until = fsfx_now_s() + 10.0;
    while (attached("rank") != 0 && fsfx_now_s() < until)
        fsfx_sleep_ms(20);
    cr_assert_eq(attached("rank"), 0, "the pod's processes are still attached");
    /* Its owner lease is gone: the next reader loads the key. */
    read_check(3, 1);
    read_check(0, 1);
}

/* Open a rank and close it; report the errno (0: it attached). */
static int body_refused(void *arg)
{
    int err = 0;
    struct sfs_rank *rk = pod_rank(pod_sock(), NULL, &err);

    (void)arg;
    if (rk)
        sfs_rank_close(rk);
    pod_report(rk ? 0 : -err);
    return 0;
}

/* Not allowed: the pod's host uid is neither root nor listed, whatever it
 * is inside (uid 0); the socket's mode (0600) keeps it out. */
Test(container, a_pods_root_is_not_the_hosts_root)
{
    struct pod p;
    struct pod_spec sp = {.body = body_refused};

    start(NULL);
    pod_start(&p, &sp);
    cr_assert_eq(pod_result(&p), EACCES);
    cr_assert_eq(pod_end(&p), 0);
}

/* Load block 0 and pin it for 600 s; report sfs_rank_pin's result (or
 * another step's error) and hold the rank. */
static int body_pin(void *arg)
{
    struct sfs_block_id b = tu_block(0);
    struct sfs_rank *rk;
    int err = 0, r;

    (void)arg;
    rk = pod_rank(pod_sock(), NULL, &err);
    if (!rk) {
        pod_report(-1000 + err);
        return 1;
    }
    r = pod_load(rk, 0, 1, 0);
    if (r == 0)
        r = pod_load(rk, 0, 1, 1);
    pod_report(r < 0 ? r - 2000 : sfs_rank_pin(rk, &b, 1, 600));
    pod_wait_hold();
    sfs_rank_close(rk);
    return 0;
}

/* The child becomes uid (and gid) and sets user.shardfs.pin on block b
 * through the mount; its exit status is the errno (0: set). */
struct as_user {
    uid_t uid;
    uint64_t b;
    const char *secs;
};

static int pin_as_body(void *arg)
{
    const struct as_user *a = arg;

    if (setgroups(0, NULL) < 0 || setgid(a->uid) < 0 || setuid(a->uid) < 0)
        return 100;
    if (setxattr(fsfx_block_dir(&M.fx, a->b), SFS_XATTR_PIN, a->secs, strlen(a->secs), 0) == 0)
        return 0;
    return errno;
}

static int pin_as(uid_t uid, uint64_t b, const char *secs)
{
    struct as_user a = {uid, b, secs};

    return tu_wait_for(tu_fork(pin_as_body, &a), 30ll * 1000000000);
}

/* user.shardfs.state of shard (b, s). */
static const char *state(uint64_t b, uint32_t s)
{
    static char v[64];
    ssize_t n = getxattr(fsfx_shard_path(&M.fx, b, s), "user.shardfs.state", v, sizeof(v) - 1);

    v[n < 0 ? 0 : n] = '\0';
    return v;
}

/* A pin the pod's rank makes is its host user's (POD_UID), as a pin that
 * user sets through the mount is: that user may change it, another may
 * not. Not root's, though the rank's euid in the pod is 0. */
Test(container, a_pods_pin_belongs_to_its_host_uid)
{
    struct pod p;
    struct pod_spec sp = {.body = body_pin};
    char opt[96];

    snprintf(opt, sizeof(opt), "attach_uids=%u,pin_budget=50,pin_user_share=25", POD_UID);
    start(opt);
    pod_start(&p, &sp);
    int v = pod_result(&p);
    cr_assert_eq(v, NSH, "the pod's rank pinned: %d", v);
    cr_assert_str_eq(state(0, 0), "ready,pinned");
    cr_assert_eq(pin_as(POD_UID + 1, 0, "0"), EPERM, "another user removed the pod's pin");
    cr_assert_eq(pin_as(POD_UID, 0, "0"), 0, "the pod's host user cannot remove its pin");
    cr_assert_str_eq(state(0, 0), "ready");
    cr_assert_eq(pod_end(&p), 0);
}

/* ---------------------------------------------------------------------------
 * The daemon in a pod of its own: a pid namespace where no peer's pid
 * exists, so SO_PEERCRED gives every peer pid 0.
 */

#define MANY 17 /* one more than a process's handles (the server's MAX_PER_PROC) */

struct ns_server {
    const char *sock;
    int ready, hold; /* writes one byte once serving; serves until hold closes */
    int hold_wr;     /* the test's end of hold */
};

static int ns_server_init(void *arg)
{
    const struct ns_server *a = arg;
    struct sfs_cache *c = tu_cache(64, 0, SHARD);
    char ch = 'r';

    if (!c || sfs_cache_serve(c, a->sock) < 0 || write(a->ready, &ch, 1) != 1)
        return 1;
    while (read(a->hold, &ch, 1) < 0 && errno == EINTR)
        ;
    sfs_cache_close(c);
    return 0;
}

static int ns_server_shim(void *arg)
{
    close(((const struct ns_server *)arg)->hold_wr);
    if (unshare(CLONE_NEWPID) < 0)
        return 10;
    return tu_wait(tu_fork(ns_server_init, arg));
}

struct attacher {
    const char *sock;
    int handles; /* how many to attach */
    int report, hold, hold_wr;
};

/* Attach a->handles handles; report how many attached, then the error of
 * the first that did not (0: none), and hold them. */
static int attacher_body(void *arg)
{
    const struct attacher *a = arg;
    int v[2] = {0, 0};
    char ch;

    close(a->hold_wr);
    for (int i = 0; i < a->handles; i++) {
        int err = 0;

        if (sfs_cache_attach(a->sock, 0, &err))
            v[0]++;
        else if (!v[1])
            v[1] = err;
    }
    if (write(a->report, v, sizeof(v)) != sizeof(v))
        return 1;
    while (read(a->hold, &ch, 1) < 0 && errno == EINTR)
        ;
    return 0;
}

/* Processes the daemon cannot see by pid are still told apart: MANY of
 * them attach (before, all were "pid 0", one process to the per-process
 * cap, and the 17th was refused -EUSERS), and one process still gets at
 * most its cap of handles. */
Test(container, a_daemon_in_its_own_pid_namespace_tells_processes_apart)
{
    int ready[2], hold[2], rep[2], v[2];
    pid_t srv, kids[MANY + 1];
    char ch;

    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(hold), 0);
    cr_assert_eq(pipe(rep), 0);
    struct ns_server s = {
        .sock = M.fx.sock, .ready = ready[1], .hold = hold[0], .hold_wr = hold[1]};
    srv = tu_fork(ns_server_shim, &s);
    close(ready[1]);
    if (read(ready[0], &ch, 1) != 1) {
        int st = tu_wait(srv);
        if (st == 10)
            cr_skip_test("cannot unshare a pid namespace");
        cr_assert_fail("the server in its pid namespace exited with %d", st);
    }
    struct attacher a = {
        .sock = M.fx.sock, .handles = 1, .report = rep[1], .hold = hold[0], .hold_wr = hold[1]};
    for (int i = 0; i < MANY; i++) {
        kids[i] = tu_fork(attacher_body, &a);
        cr_assert_eq(read(rep[0], v, sizeof(v)), (ssize_t)sizeof(v));
        cr_assert_eq(v[0], 1, "process %d of %d was refused: %s", i + 1, MANY, strerror(-v[1]));
    }
    a.handles = MANY;
    kids[MANY] = tu_fork(attacher_body, &a);
    cr_assert_eq(read(rep[0], v, sizeof(v)), (ssize_t)sizeof(v));
    /* Others of uid 0 hold MANY handles, under the cache's max_procs (64). */
    cr_assert_eq(v[0], 16, "one process attached %d handles", v[0]);
    cr_assert_eq(v[1], -EUSERS);
    close(hold[1]);
    for (int i = 0; i <= MANY; i++)
        cr_assert_eq(tu_wait_for(kids[i], 30ll * 1000000000), 0);
    cr_assert_eq(tu_wait_for(srv, 30ll * 1000000000), 0);
    close(hold[0]);
    close(rep[0]);
    close(rep[1]);
    close(ready[0]);
}

/* The rank finds the daemon by its mount point, whose xattr names the
 * socket by the daemon's path: found where the pod binds the socket
 * directory at that same path, -ENOENT where it binds it elsewhere (the
 * rank then names the socket itself). */
static int body_by_mount(void *arg)
{
    bool same_path = *(const bool *)arg;
    struct sfs_rank *rk;
    int err = 0, r;

    rk = pod_rank(NULL, "/mnt", &err);
    if (!rk) {
        pod_report(err);
        return 0;
    }
    r = pod_load(rk, 0, NBLOCKS, 1);
    sfs_rank_close(rk);
    if (r == 0 && !same_path)
        r = 1; /* attached: should not have */
    pod_report(r);
    return 0;
}

Test(container, a_pod_finds_the_socket_by_the_mount_where_bound_at_the_same_path)
{
    struct pod p;
    bool same = true;
    struct pod_spec sp = {.same_path = true, .body = body_by_mount, .arg = &same};
    char opt[64];

    snprintf(opt, sizeof(opt), "attach_uids=%u", POD_UID);
    start(opt);
    pod_start(&p, &sp);
    cr_assert_eq(pod_result(&p), 0, "by the mount, with the socket directory at its path");
    cr_assert_eq(pod_end(&p), 0);
    same = false;
    sp.same_path = false;
    pod_start(&p, &sp);
    cr_assert_eq(pod_result(&p), -ENOENT, "by the mount, with the socket directory elsewhere");
    cr_assert_eq(pod_end(&p), 0);
}

/* attach_gid is a host gid too: the pod's gid 0 is host gid POD_UID. */
Test(container, a_pods_group_is_its_host_gid)
{
    struct pod p;
    struct pod_spec sp = {.body = body_refused};
    char opt[64];

    snprintf(opt, sizeof(opt), "attach_gid=%u", POD_UID);
    start(opt);
    pod_start(&p, &sp);
    cr_assert_eq(pod_result(&p), 0, "the pod's group was refused");
    cr_assert_eq(pod_end(&p), 0);
}
