/* SPDX-License-Identifier: MIT */
/*
 * test_attach_bounds.c - where the attach server may put its socket, and
 * the bounds it keeps on who attaches: a socket path too long for an
 * address, in a directory that does not exist, is a file, belongs to
 * another user or is writable by others without the sticky bit is refused
 * before anything is created, and a directory at the path is not replaced; a relative path serves
 * from the current directory; a group makes the socket 0660 and that group's. Attached processes
 * are bounded per uid (max_per_uid) and by the cache's process records (max_procs): a peer over a
 * bound is refused -EUSERS, and one that leaves frees its place; one process holds at most 16
 * handles. A server out of descriptors pauses its accepts, says so, and serves the waiting peer
 * once it has them again; one without descriptors to start is -EMFILE and leaves nothing behind.
 * Peers of other users (a forked child with other effective ids) attach by a listed uid or by the
 * allowed group, primary or supplementary, and are refused -EACCES otherwise.
 */
#include "testutil.h"
#include "attach_i.h" /* the descriptor transport */

#include <shardfs/cache.h>

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#define SHARD 4096u

static struct sfs_cache *cache_of(uint32_t max_procs)
{
    struct sfs_cache_config cfg = {
        .shard_size = SHARD,
        .nslots = 8,
        .no_reserved = true,
        .hugepages = SFS_HUGEPAGES_OFF,
        .max_procs = max_procs,
    };
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);

    cr_assert_not_null(c, "create: %s", strerror(-err));
    return c;
}

/* sfs_cache_serve(c, path) is refused with want and creates nothing. */
static void refused(struct sfs_cache *c, const char *path, int want, const char *what)
{
    struct stat st;
    int r = sfs_cache_serve(c, path);

    cr_assert_eq(r, want, "%s: %s, not %s", what, strerror(-r), strerror(-want));
    cr_assert(lstat(path, &st) < 0 || !S_ISSOCK(st.st_mode), "%s: a socket was created", what);
}

Test(attach_bounds, a_socket_path_the_server_cannot_own_is_refused, .timeout = 30)
{
    struct sfs_cache *c = cache_of(0);
    char dir[256], path[512], file[256], longp[200];

    snprintf(dir, sizeof(dir), "%s", tu_path("dir"));
    snprintf(file, sizeof(file), "%s", tu_path("file"));
    cr_assert_eq(mkdir(dir, 0755), 0);
    fclose(fopen(file, "we"));

    memset(longp, 'a', sizeof(longp) - 1);
    longp[0] = '/';
    longp[sizeof(longp) - 1] = '\0';
    refused(c, longp, -ENAMETOOLONG, "a path longer than an address");
    snprintf(path, sizeof(path), "%s/missing/sock", dir);
    refused(c, path, -ENOENT, "a directory that does not exist");
    snprintf(path, sizeof(path), "%s/sock", file);
    refused(c, path, -ENOTDIR, "a file as the directory");
    cr_assert_eq(chmod(dir, 0777), 0);
    snprintf(path, sizeof(path), "%s/sock", dir);
    refused(c, path, -EPERM, "a directory writable by others, not sticky");
    cr_assert_eq(chmod(dir, 0755), 0);
    if (geteuid() == 0) {
        cr_assert_eq(chown(dir, 12345, 12345), 0);
        refused(c, path, -EPERM, "a directory of another user");
        cr_assert_eq(chown(dir, 0, 0), 0);
    }
    /* A directory at the socket's path is not replaced. */
    snprintf(path, sizeof(path), "%s/taken", dir);
    cr_assert_eq(mkdir(path, 0755), 0);
    cr_assert_eq(sfs_cache_serve(c, path), -EADDRINUSE);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert(S_ISDIR(st.st_mode), "the directory was replaced");
    cr_assert_eq(rmdir(path), 0);
    /* The directory is fine again: served. */
    snprintf(path, sizeof(path), "%s/sock", dir);
    cr_assert_eq(sfs_cache_serve(c, path), 0);
    sfs_cache_close(c);
    unlink(path);
    rmdir(dir);
    unlink(file);
}

/* A name without a directory is served in the current one; a group makes
 * the socket 0660 and that group's; a peer attaches by the same name. */
Test(attach_bounds, a_relative_socket_serves_from_the_current_directory, .timeout = 30)
{
    struct sfs_cache *c = cache_of(0), *a;
    struct sfs_serve_opts o = {.gid = (int64_t)getegid()};
    char dir[256];
    struct stat st;
    int err = 0;

    snprintf(dir, sizeof(dir), "%s", tu_path("cwd"));
    cr_assert_eq(mkdir(dir, 0755), 0);
    cr_assert_eq(chdir(dir), 0);
    cr_assert_eq(sfs_cache_serve_opts(c, "rel.sock", &o), 0);
    cr_assert_eq(stat("rel.sock", &st), 0);
    cr_assert(S_ISSOCK(st.st_mode));
    cr_assert_eq(st.st_mode & 0777, 0660, "mode %o, not 660 for a group", st.st_mode & 0777);
    cr_assert_eq(st.st_gid, getegid());
    a = sfs_cache_attach("rel.sock", 0, &err);
    cr_assert_not_null(a, "attach by the relative name: %s", strerror(-err));
    sfs_cache_close(a);
    sfs_cache_close(c);
    cr_assert_eq(stat("rel.sock", &st), -1, "the close left the socket");
    cr_assert_eq(chdir("/"), 0);
    rmdir(dir);
}

/* max_per_uid = 2: a third attach of the same uid is -EUSERS until one of
 * the two closes. */
Test(attach_bounds, attaches_of_one_uid_are_bounded_by_max_per_uid, .timeout = 30)
{
    struct sfs_cache *c = cache_of(0), *a[3];
    struct sfs_serve_opts o = {.gid = -1, .max_per_uid = 2};
    const char *path = tu_path("sock");
    int err = 0;

    cr_assert_eq(sfs_cache_serve_opts(c, path, &o), 0);
    for (int i = 0; i < 2; i++) {
        a[i] = sfs_cache_attach(path, 0, &err);
        cr_assert_not_null(a[i], "attach %d: %s", i, strerror(-err));
    }
    a[2] = sfs_cache_attach(path, -1, &err);
    cr_assert_null(a[2], "a third attach of the uid was let in");
    cr_assert_eq(err, -EUSERS, "%s, not EUSERS", strerror(-err));
    sfs_cache_close(a[0]);
    /* The server sees the close when its connection ends: retry until then
     * (bounded by the test's timeout; no pass/fail timing). */
    do {
        a[2] = sfs_cache_attach(path, -1, &err);
        if (!a[2]) {
            cr_assert_eq(err, -EUSERS, "%s, not EUSERS", strerror(-err));
            usleep(10000);
        }
    } while (!a[2]);
    sfs_cache_close(a[2]);
    sfs_cache_close(a[1]);
    sfs_cache_close(c);
}

/* A cache of two process records: the creator's and one attach; the next
 * attach finds no free record and is -EUSERS, until the first leaves and
 * the server reaps its record. */
Test(attach_bounds, attaches_are_bounded_by_the_process_records, .timeout = 30)
{
    struct sfs_cache *c = cache_of(2), *a, *b;
    const char *path = tu_path("sock");
    int err = 0;

    cr_assert_eq(sfs_cache_serve(c, path), 0);
    a = sfs_cache_attach(path, 0, &err);
    cr_assert_not_null(a, "attach: %s", strerror(-err));
    b = sfs_cache_attach(path, 0, &err);
    cr_assert_null(b, "an attach without a free process record was let in");
    cr_assert_eq(err, -EUSERS, "%s, not EUSERS", strerror(-err));
    sfs_cache_close(a);
    do {
        b = sfs_cache_attach(path, 0, &err);
        if (!b) {
            cr_assert_eq(err, -EUSERS, "%s, not EUSERS", strerror(-err));
            usleep(10000);
        }
    } while (!b);
    sfs_cache_close(b);
    sfs_cache_close(c);
}

/* The server of the next test, in a child: its descriptors capped at the
 * ones it holds (no accept can succeed) until it has said it pauses. */
struct no_fds {
    const char *path;
    int ready[2], done[2];
};

static atomic_int pausing;

static void count_pause(int level, const char *msg, void *arg)
{
    (void)level;
    (void)arg;
    if (strstr(msg, "accept") && strstr(msg, "pausing"))
        atomic_fetch_add(&pausing, 1);
}

static int serve_without_fds(void *arg)
{
    struct no_fds *x = arg;
    struct sfs_cache_config cfg = {
        .shard_size = SHARD, .nslots = 8, .no_reserved = true, .hugepages = SFS_HUGEPAGES_OFF};
    struct rlimit old, low;
    int err = 0, probe;
    char b = 1;

    struct sfs_cache *c = sfs_cache_create(&cfg, &err);
    TU_CK(c);
    sfs_set_log(count_pause, NULL, LOG_DEBUG);
    TU_CK(sfs_cache_serve(c, x->path) == 0);
    /* The lowest free descriptor: every one below it is taken, so a limit
     * there leaves the process none to make. */
    probe = dup(0);
    TU_CK(probe >= 0);
    close(probe);
    TU_CK(getrlimit(RLIMIT_NOFILE, &old) == 0);
    low = old;
    low.rlim_cur = (rlim_t)probe;
    TU_CK(setrlimit(RLIMIT_NOFILE, &low) == 0);
    TU_CK(write(x->ready[1], &b, 1) == 1);
    for (int i = 0; !atomic_load(&pausing); i++) {
        TU_CK(i < 10000); /* 10 s: the accept never failed */
        usleep(1000);
    }
    TU_CK(setrlimit(RLIMIT_NOFILE, &old) == 0);
    TU_CK(read(x->done[0], &b, 1) == 1);
    sfs_set_log(NULL, NULL, 0);
    sfs_cache_close(c);
    return atomic_load(&pausing) >= 1 ? 0 : 3;
}

Test(attach_bounds, a_server_out_of_descriptors_pauses_then_serves, .timeout = 30)
{
    struct no_fds x = {.path = tu_path("sock")};
    struct sfs_cache *a;
    int err = 0;
    char b;

    cr_assert_eq(pipe(x.ready), 0);
    cr_assert_eq(pipe(x.done), 0);
    pid_t pid = tu_fork(serve_without_fds, &x);
    cr_assert_gt(pid, 0);
    close(x.ready[1]);
    close(x.done[0]);
    cr_assert_eq(read(x.ready[0], &b, 1), 1, "the server did not start");
    /* Queued in the backlog while the server has no descriptor for it. */
    a = sfs_cache_attach(x.path, 0, &err);
    cr_assert_not_null(a, "the attach waiting for the server's descriptors: %s", strerror(-err));
    struct sfs_key k = tu_key(3, 1);
    cr_assert_eq(tu_load(a, &k), SFS_OWNER);
    sfs_cache_close(a);
    cr_assert_eq(write(x.done[1], &b, 1), 1);
    cr_assert_eq(tu_wait_for(pid, 10ll * 1000 * 1000 * 1000), 0, "the server child failed");
    close(x.ready[0]);
    close(x.done[1]);
}

/* ---------------------------------------------------------------------------
 * Peers of other users. A forked child takes another uid and gids as its
 * effective ones (the credentials the server reads at connect), keeps root
 * as its saved uid, attaches, and takes root back before it exits.
 */

struct peer {
    const char *path;
    uid_t uid;
    gid_t gid;
    gid_t groups[2];
    int ngroups;
    int want; /* 0: attaches; else the attach's -errno */
};

static int peer_attach(void *arg)
{
    const struct peer *p = arg;
    int err = 0;

    TU_CK(setgroups((size_t)p->ngroups, p->groups) == 0);
    TU_CK(setresgid(p->gid, p->gid, 0) == 0);
    TU_CK(setresuid(p->uid, p->uid, 0) == 0);
    struct sfs_cache *a = sfs_cache_attach(p->path, -1, &err);
    int got = a ? 0 : err;

    if (a)
        sfs_cache_close(a);
    TU_CK(setresuid(0, 0, 0) == 0);
    TU_CK(setresgid(0, 0, 0) == 0);
    if (got != p->want)
        fprintf(stderr, "uid %u gid %u: %s, not %s\n", p->uid, p->gid, strerror(-got),
                strerror(-p->want));
    TU_CK(got == p->want);
    return 0;
}

static void peer_check(const char *path, uid_t uid, gid_t gid, gid_t group, int want)
{
    struct peer p = {.path = path, .uid = uid, .gid = gid, .want = want};

    if (group) {
        p.groups[0] = group;
        p.ngroups = 1;
    }
    cr_assert_eq(tu_wait(tu_fork(peer_attach, &p)), 0, "uid %u gid %u group %u", uid, gid, group);
}

/* Root and the server's uid always attach; others when their uid is
 * listed, or their group (primary, or supplementary as SO_PEERGROUPS
 * says) is the allowed one; anyone else is refused -EACCES by the server
 * (the listed uids make the socket 0666: the server alone decides). */
Test(attach_bounds, other_users_attach_by_their_uid_or_their_group, .timeout = 30)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to take other uids");
    struct sfs_cache *c = cache_of(0);
    const uint32_t uids[] = {65501};
    struct sfs_serve_opts o = {.uids = uids, .nuids = 1, .gid = 65510};
    const char *path = tu_path("sock");
    struct stat st;

    cr_assert_eq(sfs_cache_serve_opts(c, path, &o), 0);
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0666, "mode %o, not 666 with uids listed", st.st_mode & 0777);
    cr_assert_eq(st.st_gid, 65510);
    peer_check(path, 65501, 65502, 0, 0);           /* a listed uid */
    peer_check(path, 65503, 65510, 0, 0);           /* the group, primary */
    peer_check(path, 65503, 65502, 65510, 0);       /* the group, supplementary */
    peer_check(path, 65503, 65502, 65511, -EACCES); /* neither */
    peer_check(path, 65503, 65502, 0, -EACCES);     /* no group at all */
    sfs_cache_close(c);

    /* Listed uids without a group: only they. */
    struct sfs_serve_opts u = {.uids = uids, .nuids = 1, .gid = -1};

    c = cache_of(0);
    cr_assert_eq(sfs_cache_serve_opts(c, path, &u), 0);
    peer_check(path, 65501, 65502, 0, 0);
    peer_check(path, 65503, 65510, 65510, -EACCES);
    sfs_cache_close(c);
}

/* One process holds at most 16 attached handles, whatever its uid may. */
Test(attach_bounds, one_process_attaches_at_most_16_handles, .timeout = 30)
{
    struct sfs_cache *c = cache_of(24), *a[17];
    const char *path = tu_path("sock");
    int err = 0;

    cr_assert_eq(sfs_cache_serve(c, path), 0);
    for (int i = 0; i < 16; i++) {
        a[i] = sfs_cache_attach(path, -1, &err);
        cr_assert_not_null(a[i], "attach %d: %s", i, strerror(-err));
    }
    a[16] = sfs_cache_attach(path, -1, &err);
    cr_assert_null(a[16], "a 17th handle of one process was let in");
    cr_assert_eq(err, -EUSERS, "%s, not EUSERS", strerror(-err));
    sfs_cache_close(a[0]);
    do {
        a[16] = sfs_cache_attach(path, -1, &err);
        if (!a[16]) {
            cr_assert_eq(err, -EUSERS, "%s, not EUSERS", strerror(-err));
            usleep(10000);
        }
    } while (!a[16]);
    for (int i = 1; i < 17; i++)
        sfs_cache_close(a[i]);
    sfs_cache_close(c);
}

Test(attach_bounds, serve_arguments_refused, .timeout = 30)
{
    struct sfs_cache *c = cache_of(0);
    struct sfs_serve_opts o = {.uids = NULL, .nuids = 2, .gid = -1};
    const char *path = tu_path("sock");

    cr_assert_eq(sfs_cache_serve(NULL, path), -EINVAL);
    cr_assert_eq(sfs_cache_serve(c, NULL), -EINVAL);
    cr_assert_eq(sfs_cache_serve_opts(c, path, &o), -EINVAL, "uids counted but not given");
    cr_assert_eq(access(path, F_OK), -1);
    cr_assert_eq(sfs_cache_serve(c, path), 0);
    cr_assert_eq(sfs_cache_serve(c, tu_path("second")), -EINVAL, "a second server");
    sfs_cache_close(c);
}

/* A server that cannot make its socket, its stop event or its epoll set
 * (no descriptor left for it) is refused with -EMFILE, leaves no socket
 * file and no descriptor behind, and serves once it has them. In a child:
 * the limit is the process's. */
static int serve_short_of_fds(void *arg)
{
    const char *path = arg;
    struct sfs_cache_config cfg = {
        .shard_size = SHARD, .nslots = 8, .no_reserved = true, .hugepages = SFS_HUGEPAGES_OFF};
    struct rlimit old, low;
    struct stat st;
    int err = 0, probe;

    struct sfs_cache *c = sfs_cache_create(&cfg, &err);
    TU_CK(c);
    probe = dup(0);
    TU_CK(probe >= 0);
    close(probe);
    TU_CK(getrlimit(RLIMIT_NOFILE, &old) == 0);
    /* The socket, the stop eventfd, the epoll set: 0, 1, 2 to spare. */
    for (int spare = 0; spare < 3; spare++) {
        low = old;
        low.rlim_cur = (rlim_t)(probe + spare);
        TU_CK(setrlimit(RLIMIT_NOFILE, &low) == 0);
        int r = sfs_cache_serve(c, path);
        TU_CK(setrlimit(RLIMIT_NOFILE, &old) == 0);
        if (r != -EMFILE)
            fprintf(stderr, "%d to spare: %s\n", spare, strerror(-r));
        TU_CK(r == -EMFILE);
        TU_CK(lstat(path, &st) < 0);
        int again = dup(0);
        TU_CK(again == probe); /* nothing left open */
        close(again);
    }
    TU_CK(sfs_cache_serve(c, path) == 0);
    /* An attach with no descriptor for its socket. */
    low = old;
    low.rlim_cur = (rlim_t)probe;
    TU_CK(setrlimit(RLIMIT_NOFILE, &low) == 0);
    struct sfs_cache *a = sfs_cache_attach(path, 0, &err);
    TU_CK(setrlimit(RLIMIT_NOFILE, &old) == 0);
    TU_CK(!a && err == -EMFILE);
    a = sfs_cache_attach(path, 0, &err);
    TU_CK(a);
    sfs_cache_close(a);
    sfs_cache_close(c);
    return 0;
}

Test(attach_bounds, a_server_without_descriptors_to_start_is_emfile, .timeout = 30)
{
    cr_assert_eq(tu_wait(tu_fork(serve_short_of_fds, (void *)tu_path("sock"))), 0);
}

/* ---------------------------------------------------------------------------
 * The descriptor transport itself (fdpass.c): at most FDS_PER_MSG a
 * message; a receiver keeps what it asked for and closes the rest; a
 * message cut short, or with more descriptors than its buffer holds, is
 * -EBADMSG and leaves nothing open.
 */

/* Descriptors open in this process. */
static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    cr_assert_not_null(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* Send len bytes and n copies of fd in one message (n up to 200). */
static void send_copies(int s, const void *buf, size_t len, int fd, int n)
{
    static union {
        char buf[CMSG_SPACE(sizeof(int) * 200)];
        struct cmsghdr align;
    } u;
    int fds[200];
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = u.buf,
                         .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);

    for (int i = 0; i < n; i++)
        fds[i] = fd;
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
    memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)n);
    cr_assert_eq(sendmsg(s, &msg, MSG_NOSIGNAL), (ssize_t)len);
}

Test(attach_bounds, the_descriptor_transport_keeps_what_it_asked_for, .timeout = 30)
{
    int sp[2], fd = memfd_create("test-fdpass", MFD_CLOEXEC), got[FDS_PER_MSG], p[2];
    char buf[4];
    int many[FDS_PER_MSG + 1];

    cr_assert_geq(fd, 0);
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    for (unsigned i = 0; i <= FDS_PER_MSG; i++)
        many[i] = fd;
    cr_assert_eq(sfs_fds_send(sp[0], "abcd", 4, many, FDS_PER_MSG + 1), -EINVAL);
    int before = open_fds();

    /* Three sent, one asked for: one kept, two closed. */
    send_copies(sp[0], "abcd", 4, fd, 3);
    cr_assert_eq(sfs_fds_recv(sp[1], buf, 4, got, 1), 1);
    cr_assert_eq(open_fds(), before + 1);
    close(got[0]);
    /* More than the receiver's buffer holds: -EBADMSG, none kept. */
    send_copies(sp[0], "abcd", 4, fd, 150);
    cr_assert_eq(sfs_fds_recv(sp[1], buf, 4, got, FDS_PER_MSG), -EBADMSG);
    cr_assert_eq(open_fds(), before);
    /* A message cut short by the sender's close: -EBADMSG, none kept. */
    send_copies(sp[0], "ab", 2, fd, 2);
    cr_assert_eq(shutdown(sp[0], SHUT_WR), 0);
    cr_assert_eq(sfs_fds_recv(sp[1], buf, 4, got, FDS_PER_MSG), -EBADMSG);
    cr_assert_eq(open_fds(), before);
    /* Not a socket; a peer gone. */
    cr_assert_eq(pipe(p), 0);
    cr_assert_eq(sfs_fds_recv(p[0], buf, 4, got, 1), -ENOTSOCK);
    cr_assert_eq(sfs_fds_send(p[1], "abcd", 4, NULL, 0), -ENOTSOCK);
    close(sp[1]);
    cr_assert_eq(sfs_fds_send(sp[0], "abcd", 4, &fd, 1), -EPIPE);
    close(p[0]);
    close(p[1]);
    close(sp[0]);
    close(fd);
}
