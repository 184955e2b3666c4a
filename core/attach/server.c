/* SPDX-License-Identifier: MIT */
/*
 * server.c - the attach server: the creator's side of handing the cache to
 * other processes over a Unix domain socket (the wire format: attach_i.h).
 *
 * One thread runs one epoll loop that owns every connection: the listening
 * socket, each client from accept to close, and the stop eventfd. Sockets
 * are non-blocking and nothing in the loop waits on a client: a hello is
 * read as its bytes arrive, with a deadline of HELLO_TIMEOUT_NS per
 * connection, and a welcome that does not fit the socket's buffer at once
 * drops the client. So a silent or slow client delays no one else.
 *
 * A welcomed client keeps its connection for the life of its handle; the
 * server watches it (and the peer's pidfd, where the kernel gives one) and
 * learns of the process's exit or exec when it closes.
 *
 * Bounds: at most SERVER_MAX_CONNS connections at once; per uid at most
 * PENDING_PER_UID connections that have not finished their hello, and at
 * most max_per_uid welcomed ones; a peer over a bound is refused -EUSERS.
 *
 * A reaper thread frees the leases of the records the server declared dead,
 * off the epoll thread.
 */
#include "attach_i.h"
#include "cache_i.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <unistd.h>

#define HELLO_TIMEOUT_NS  (1000 * 1000 * 1000ll)
#define SERVER_MAX_CONNS  1024u
#define PENDING_PER_UID   64u
#define MAX_PER_PROC      16u /* attached handles of one process */
#define REAP_RETRY_NS     (200 * 1000 * 1000ll)
#define ACCEPT_BACKOFF_NS (100 * 1000 * 1000ll) /* out of fds: accept again after this */
#define EV_LISTEN         UINT64_MAX
#define EV_STOP           (UINT64_MAX - 1)
/* epoll data of a connection: its index and its seq (so an event queued for a
 * connection closed earlier in the same batch never reaches the next one in
 * its place), and a bit for its pidfd. */
#define EV_PIDFD        (1ull << 48)
#define EV_DATA(i, seq) ((uint64_t)(i) | (uint64_t)(seq) << 16)

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

enum conn_state {
    CONN_FREE = 0,
    CONN_HELLO,    /* reading the hello, under a deadline */
    CONN_ATTACHED, /* welcomed: held until the client closes */
};

/* One client connection. Owned by the server thread alone. */
struct conn {
    enum conn_state state;
    uint32_t seq; /* bumped at each accept into this entry */
    int fd;
    int pidfd; /* -1: the kernel gave none */
    pid_t pid; /* SO_PEERCRED, in the daemon's pid namespace: for logs */
    uint64_t proc; /* which process, for the per-process cap (peer_proc); 0: unknown */
    uid_t uid;
    int device_id;
    uint32_t rec, gen; /* CONN_ATTACHED: the process record claimed for it */
    int64_t deadline;  /* CONN_HELLO: the hello is complete by then */
    size_t got;        /* bytes of the hello received */
    struct hello h;
};

struct sfs_server {
    struct sfs_cache *c;
    int listen_fd;
    int stop_fd; /* eventfd */
    int ep;      /* epoll */
    pthread_t thread;
    /* Who may attach, besides root and the server's euid. */
    uint32_t *uids;
    size_t nuids;
    gid_t gid;
    bool has_gid;
    unsigned max_per_uid;
    int64_t hello_timeout_ns; /* HELLO_TIMEOUT_NS (tests: SHARDFS_TEST_HELLO_TIMEOUT_MS) */
    int64_t accept_resume; /* server thread: accepts paused until then (0: not) */
    /* The reaper: frees the leases of records the server declared dead, off
     * the epoll thread (a reap takes bucket locks; attaches never wait on
     * them). */
    pthread_t reaper;
    pthread_mutex_t reap_mu;
    pthread_cond_t reap_cv;              /* CLOCK_MONOTONIC */
    bool reap_pending;                   /* reap_mu */
    bool reap_stop;                      /* reap_mu */
    struct conn conns[SERVER_MAX_CONNS]; /* the server thread's alone */
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

static void refuse(int sock, int status)
{
    struct welcome w = {.magic = WELCOME_MAGIC,
                        .proto = PROTO_VERSION,
                        .status = status,
                        .format = sfs_layout_format()};

    sfs_fds_send(sock, &w, sizeof(w), NULL, 0); /* best effort: the socket is non-blocking */
}

/* May this peer attach? Root and the server's own uid always may; others
 * only when named in the uid list, or in the allowed group (primary or
 * supplementary, as the peer's credentials at connect time say). */
static bool peer_allowed(const struct sfs_server *s, int sock, const struct ucred *cred)
{
    if (cred->uid == 0 || cred->uid == geteuid())
        return true;
    for (size_t i = 0; i < s->nuids; i++)
        if (s->uids[i] == cred->uid)
            return true;
    if (!s->has_gid)
        return false;
    if (cred->gid == s->gid)
        return true;
    gid_t groups[256];
    socklen_t len = sizeof(groups);
    if (getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0)
        return false; /* ERANGE (more than 256 groups) or an old kernel: no */
    for (size_t i = 0; i < len / sizeof(gid_t); i++)
        if (groups[i] == s->gid)
            return true;
    return false;
}

static void conn_close(struct sfs_server *s, struct conn *k)
{
    /* Out of the epoll set first: a copy of the fd in a forked child would
     * keep it there after the close. */
    epoll_ctl(s->ep, EPOLL_CTL_DEL, k->fd, NULL);
    close(k->fd);
    if (k->pidfd >= 0) {
        epoll_ctl(s->ep, EPOLL_CTL_DEL, k->pidfd, NULL);
        close(k->pidfd);
    }
    uint32_t seq = k->seq;

    memset(k, 0, sizeof(*k));
    k->seq = seq;
    k->state = CONN_FREE;
    k->fd = -1;
    k->pidfd = -1;
}

/* Connections of uid in a state (bounded by SERVER_MAX_CONNS). */
static unsigned count_uid(const struct sfs_server *s, uid_t uid, enum conn_state st)
{
    unsigned n = 0;

    for (unsigned i = 0; i < SERVER_MAX_CONNS; i++)
        n += s->conns[i].state == st && s->conns[i].uid == uid;
    return n;
}

/* Attached connections of one peer process (bounded by SERVER_MAX_CONNS);
 * none for a process we cannot tell apart (proc 0). */
static unsigned count_proc(const struct sfs_server *s, uint64_t proc)
{
    unsigned n = 0;

    for (unsigned i = 0; proc && i < SERVER_MAX_CONNS; i++)
        n += s->conns[i].state == CONN_ATTACHED && s->conns[i].proc == proc;
    return n;
}

/*
 * Which process a peer is. Its pid, where our pid namespace has one; but a
 * daemon in a pid namespace of its own (a pod without the host's) sees pid
 * 0 for every peer outside it, and those must not count as one process.
 * The pidfd's inode then: on pidfs (Linux 6.9+) it names one process for
 * the life of the system. 0 when neither is known: the per-process cap does
 * not apply, the per-uid cap still does.
 */
#define SFS_PIDFS_MAGIC 0x50494446u /* statfs f_type of a pidfd on pidfs */
static uint64_t peer_proc(pid_t pid, int pidfd)
{
    struct statfs fs;
    struct stat st;

    if (pid > 0)
        return (uint64_t)pid;
    if (pidfd >= 0 && fstatfs(pidfd, &fs) == 0 && (uint32_t)fs.f_type == SFS_PIDFS_MAGIC &&
        fstat(pidfd, &st) == 0)
        return (uint64_t)st.st_ino | 1ull << 63; /* never a pid */
    return 0;
}

static void detach_one(struct sfs_server *s, struct conn *k, const char *why);

static void accept_one(struct sfs_server *s, int sock)
{
    struct ucred cred;
    socklen_t clen = sizeof(cred);
    struct conn *k = NULL;

    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
        sfs_log(LOG_WARNING, "attach: no peer credentials: %s", strerror(errno));
        close(sock);
        return;
    }
    if (!peer_allowed(s, sock, &cred)) {
        sfs_log(LOG_WARNING, "attach: refused pid %d uid %u gid %u: not allowed to attach",
                cred.pid, cred.uid, cred.gid);
        refuse(sock, -EACCES);
        close(sock);
        return;
    }
    if (count_uid(s, cred.uid, CONN_HELLO) >= PENDING_PER_UID) {
        sfs_log(LOG_WARNING, "attach: refused pid %d uid %u: %u hellos of this uid pending",
                cred.pid, cred.uid, PENDING_PER_UID);
        refuse(sock, -EUSERS);
        close(sock);
        return;
    }
    for (unsigned i = 0; i < SERVER_MAX_CONNS && !k; i++)
        if (s->conns[i].state == CONN_FREE)
            k = &s->conns[i];
    if (!k) {
        sfs_log(LOG_WARNING, "attach: refused pid %d: %u connections open", cred.pid,
                SERVER_MAX_CONNS);
        refuse(sock, -EUSERS);
        close(sock);
        return;
    }
    uint32_t seq = (k->seq + 1) & 0xffffffffu;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP,
                             .data.u64 = EV_DATA(k - s->conns, seq)};
    if (epoll_ctl(s->ep, EPOLL_CTL_ADD, sock, &ev) < 0) {
        sfs_log(LOG_WARNING, "attach: refused pid %d: epoll: %s", cred.pid, strerror(errno));
        close(sock);
        return;
    }
    /* A pidfd of the peer (Linux 6.5+): from the welcome on it turns
     * readable when the process exits, even if a child it forked still holds
     * the connection; and it tells peers apart that have no pid here. */
    int pidfd = -1;
    socklen_t plen = sizeof(pidfd);
    if (getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &plen) < 0)
        pidfd = -1;
    memset(k, 0, sizeof(*k));
    k->seq = seq;
    k->state = CONN_HELLO;
    k->fd = sock;
    k->pidfd = pidfd;
    k->pid = cred.pid;
    k->proc = peer_proc(cred.pid, pidfd);
    k->uid = cred.uid;
    k->deadline = sfs_now_ns() + s->hello_timeout_ns;
}

static void accept_all(struct sfs_server *s)
{
    /* Bounded by the listen backlog: accept4 says EAGAIN once it is empty. */
    for (;;) {
        int sock = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

        if (sock < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* The pending connection stays queued and the listening
                 * socket readable: stop watching it for a while rather than
                 * spin on it. */
                struct epoll_event ev = {.events = 0, .data.u64 = EV_LISTEN};

                sfs_log(LOG_ERR, "attach: accept: %s: pausing %lld ms", strerror(errno),
                        ACCEPT_BACKOFF_NS / 1000000);
                epoll_ctl(s->ep, EPOLL_CTL_MOD, s->listen_fd, &ev);
                s->accept_resume = sfs_now_ns() + ACCEPT_BACKOFF_NS;
            } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
                sfs_log(LOG_WARNING, "attach: accept: %s", strerror(errno));
            }
            return;
        }
        accept_one(s, sock);
    }
}

/* A complete hello: check it, welcome with the fds, keep the connection. */
static void welcome_one(struct sfs_server *s, struct conn *k)
{
    struct sfs_cache *c = s->c;
    const struct hello *h = &k->h;

    if (h->magic != HELLO_MAGIC) {
        sfs_log(LOG_WARNING, "attach: refused pid %d: bad hello", k->pid);
        refuse(k->fd, -EBADMSG);
        conn_close(s, k);
        return;
    }
    if (h->proto != PROTO_VERSION || h->format != sfs_layout_format()) {
        sfs_log(LOG_WARNING, "attach: refused pid %d: protocol %u format %016llx (ours %u %016llx)",
                k->pid, h->proto, (unsigned long long)h->format, PROTO_VERSION,
                (unsigned long long)sfs_layout_format());
        refuse(k->fd, -EPROTO);
        conn_close(s, k);
        return;
    }
    if (count_uid(s, k->uid, CONN_ATTACHED) >= s->max_per_uid ||
        count_proc(s, k->proc) >= MAX_PER_PROC) {
        sfs_log(LOG_WARNING,
                "attach: refused pid %d uid %u: at most %u handles a process, %u a uid", k->pid,
                k->uid, MAX_PER_PROC, s->max_per_uid);
        refuse(k->fd, -EUSERS);
        conn_close(s, k);
        return;
    }
    /* The record is claimed here, for this connection, and reaped when it
     * closes: one record per connection, none without one. */
    int r = sfs_proc_claim_for(c, k->pid, k->uid, h->device_id, &k->rec, &k->gen);
    if (r < 0) {
        sfs_log(LOG_WARNING, "attach: refused pid %d: no free process record (%u in use)", k->pid,
                c->max_procs);
        refuse(k->fd, r);
        conn_close(s, k);
        return;
    }
    bool data = h->flags & HELLO_WANT_DATA;
    struct welcome w = {.magic = WELCOME_MAGIC,
                        .proto = PROTO_VERSION,
                        .status = 0,
                        .format = sfs_layout_format(),
                        .ctl_size = c->ctl_len,
                        .nsegments = c->nsegments,
                        .nfds = 1 + (data ? c->nsegments : 0),
                        .proc = k->rec,
                        .proc_gen = k->gen};
    k->state = CONN_ATTACHED; /* from here a close reaps the record */
    k->device_id = h->device_id;
    r = sfs_fds_send(k->fd, &w, sizeof(w), &c->ctl_fd, 1);
    for (uint32_t i = 0; r == 0 && data && i < c->nsegments; i += FDS_PER_MSG) {
        uint32_t n = c->nsegments - i < FDS_PER_MSG ? c->nsegments - i : FDS_PER_MSG;
        uint32_t hdr = n;

        r = sfs_fds_send(k->fd, &hdr, sizeof(hdr), c->seg_fds + i, n);
    }
    if (r < 0) {
        /* EAGAIN included: a client that does not read its welcome is not
         * waited for. */
        sfs_log(LOG_WARNING, "attach: pid %d: welcome not sent: %s", k->pid, strerror(-r));
        detach_one(s, k, "welcome not sent");
        return;
    }
    /* The peer's pidfd (taken at accept) now watches for its exit. */
    if (k->pidfd >= 0) {
        struct epoll_event ev = {.events = EPOLLIN,
                                 .data.u64 = EV_PIDFD | EV_DATA(k - s->conns, k->seq)};

        if (epoll_ctl(s->ep, EPOLL_CTL_ADD, k->pidfd, &ev) < 0) {
            close(k->pidfd);
            k->pidfd = -1;
        }
    }
    sfs_log(LOG_INFO, "attach: pid %d uid %u device %d%s", k->pid, k->uid, h->device_id,
            data ? "" : " (query-only)");
}

/* The attached process is gone (its connection closed, or its pidfd says it
 * exited). */
static void detach_one(struct sfs_server *s, struct conn *k, const char *why)
{
    sfs_log(LOG_INFO, "attach: pid %d device %d detached (%s)", k->pid, k->device_id, why);
    /* Dead from this store on: every process's owner_alive_rec says so, and
     * its Gets and waiters take its loads over; the reaper frees its leases
     * and wakes its waiters. */
    if (sfs_proc_mark_dead(s->c, k->rec, k->gen)) {
        pthread_mutex_lock(&s->reap_mu);
        s->reap_pending = true;
        pthread_cond_signal(&s->reap_cv);
        pthread_mutex_unlock(&s->reap_mu);
    }
    conn_close(s, k);
}

/* Reaps what the server declared dead, at once when told and every
 * REAP_RETRY_NS besides: a reap that a busy lock stopped part-way left its
 * record DEAD, and no connection closes to say so again. */
static void *reaper_main(void *arg)
{
    struct sfs_server *s = arg;

    pthread_mutex_lock(&s->reap_mu);
    while (!s->reap_stop) {
        if (!s->reap_pending) {
            struct timespec ts;
            int64_t t = sfs_now_ns() + REAP_RETRY_NS;

            ts.tv_sec = t / 1000000000;
            ts.tv_nsec = t % 1000000000;
            /* Woken (told, or stopping): look at the flags again; timed
             * out: a pass over the DEAD records. */
            if (pthread_cond_timedwait(&s->reap_cv, &s->reap_mu, &ts) != ETIMEDOUT || s->reap_stop)
                continue;
        }
        s->reap_pending = false;
        pthread_mutex_unlock(&s->reap_mu);
        sfs_cache_reap(s->c);
        pthread_mutex_lock(&s->reap_mu);
    }
    pthread_mutex_unlock(&s->reap_mu);
    return NULL;
}

static void conn_event(struct sfs_server *s, struct conn *k, uint32_t events)
{
    if (k->state == CONN_HELLO) {
        ssize_t n;

        do
            n = recv(k->fd, (char *)&k->h + k->got, sizeof(k->h) - k->got, MSG_DONTWAIT);
        while (n < 0 && errno == EINTR);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            sfs_log(LOG_WARNING, "attach: refused pid %d: bad hello (%zu bytes)", k->pid, k->got);
            refuse(k->fd, -EBADMSG);
            conn_close(s, k);
            return;
        }
        k->got += (size_t)n;
        if (k->got == sizeof(k->h))
            welcome_one(s, k);
        return;
    }
    /* Attached: the client sends nothing more; EOF or an error is its
     * close (exit, exec, or detach), and bytes are a protocol breach that
     * ends the attachment as well. */
    char junk[64];
    ssize_t n;
    do
        n = recv(k->fd, junk, sizeof(junk), MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !(events & (EPOLLHUP | EPOLLERR)))
        return;
    detach_one(s, k, n > 0 ? "sent bytes after its hello" : "connection closed");
}

/* Milliseconds until the earliest hello deadline (or the end of an accept
 * pause), or -1; expired hellos are refused first (one pass over the table). */
static int expire_hellos(struct sfs_server *s)
{
    int64_t now = sfs_now_ns(), next = INT64_MAX;

    for (unsigned i = 0; i < SERVER_MAX_CONNS; i++) {
        struct conn *k = &s->conns[i];

        if (k->state != CONN_HELLO)
            continue;
        if (k->deadline <= now) {
            /* Read what arrived first: a server that ran late (stopped,
             * starved of CPU) must not refuse a client that was on time.
             * A whole hello is answered, a short one ended by EOF is
             * -EBADMSG; only a hello still incomplete is late. */
            size_t got;

            do {
                got = k->got;
                conn_event(s, k, EPOLLIN);
            } while (k->state == CONN_HELLO && k->got != got);
            if (k->state != CONN_HELLO)
                continue;
            sfs_log(LOG_WARNING, "attach: refused pid %d: no hello within %lld ms (%zu bytes)",
                    k->pid, (long long)(s->hello_timeout_ns / 1000000), k->got);
            refuse(k->fd, -ETIMEDOUT);
            conn_close(s, k);
        } else if (k->deadline < next) {
            next = k->deadline;
        }
    }
    if (s->accept_resume) {
        if (s->accept_resume <= now) {
            struct epoll_event ev = {.events = EPOLLIN, .data.u64 = EV_LISTEN};

            epoll_ctl(s->ep, EPOLL_CTL_MOD, s->listen_fd, &ev);
            s->accept_resume = 0;
        } else if (s->accept_resume < next) {
            next = s->accept_resume;
        }
    }
    if (next == INT64_MAX)
        return -1;
    return (int)((next - now + 999999) / 1000000);
}

static void *server_main(void *arg)
{
    struct sfs_server *s = arg;
    struct epoll_event evs[64];

    for (;;) {
        int timeout = expire_hellos(s);
        int n = epoll_wait(s->ep, evs, 64, timeout);

        if (n < 0) {
            if (errno == EINTR)
                continue;
            sfs_log(LOG_ERR, "attach: epoll_wait: %s: the server stops", strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            uint64_t d = evs[i].data.u64;

            if (d == EV_STOP)
                return NULL;
            if (d == EV_LISTEN) {
                accept_all(s);
                continue;
            }
            struct conn *k = &s->conns[(uint16_t)d % SERVER_MAX_CONNS];
            if (k->state == CONN_FREE || k->seq != (uint32_t)(d >> 16))
                continue; /* closed earlier in this batch */
            if (d & EV_PIDFD)
                detach_one(s, k, "process exited");
            else
                conn_event(s, k, evs[i].events);
        }
    }
    return NULL;
}

/* The socket's directory: nobody but root and us may replace what is in it
 * (writable by others only with the sticky bit, which stops them removing or
 * renaming our socket; that case is logged, as another user can still take
 * the path while no server holds it). */
static int check_socket_dir(const char *path)
{
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
    const char *slash = strrchr(path, '/');
    struct stat st;

    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == path)
        snprintf(dir, sizeof(dir), "/");
    else
        snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    if (stat(dir, &st) < 0)
        return -errno;
    if (!S_ISDIR(st.st_mode))
        return -ENOTDIR;
    if (st.st_uid != 0 && st.st_uid != geteuid()) {
        sfs_log(LOG_ERR, "attach: socket directory %s belongs to uid %u: refused", dir, st.st_uid);
        return -EPERM;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        if (!(st.st_mode & S_ISVTX)) {
            sfs_log(LOG_ERR, "attach: socket directory %s is writable by others: refused", dir);
            return -EPERM;
        }
        sfs_log(LOG_WARNING,
                "attach: socket directory %s is writable by others (sticky): another user can "
                "take the socket's path while no daemon serves it",
                dir);
    }
    return 0;
}

static void stop_reaper(struct sfs_server *s)
{
    pthread_mutex_lock(&s->reap_mu);
    s->reap_stop = true;
    pthread_cond_signal(&s->reap_cv);
    pthread_mutex_unlock(&s->reap_mu);
    pthread_join(s->reaper, NULL);
}

int sfs_cache_serve_opts(struct sfs_cache *c, const char *path, const struct sfs_serve_opts *o)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct sfs_server *s;
    mode_t mode = 0600;
    int r;

    if (!c || !path || !c->creator || c->server || (o && o->nuids && !o->uids))
        return -EINVAL;
    if (strlen(path) >= sizeof(addr.sun_path))
        return -ENAMETOOLONG;
    r = check_socket_dir(path);
    if (r < 0)
        return r;
    s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->c = c;
    s->stop_fd = -1;
    s->ep = -1;
    s->max_per_uid = c->max_procs;
    s->hello_timeout_ns = HELLO_TIMEOUT_NS;
#ifdef SFS_TEST_HOOKS
    /* Tests only: a longer hello deadline, so that a test can hold many
     * hellos pending without racing it. */
    if (getenv("SHARDFS_TEST_HELLO_TIMEOUT_MS"))
        s->hello_timeout_ns = atoll(getenv("SHARDFS_TEST_HELLO_TIMEOUT_MS")) * 1000000;
#endif
    for (unsigned i = 0; i < SERVER_MAX_CONNS; i++) {
        s->conns[i].fd = -1;
        s->conns[i].pidfd = -1;
    }
    if (o) {
        if (o->nuids) {
            s->uids = malloc(sizeof(*s->uids) * o->nuids);
            if (!s->uids) {
                r = -ENOMEM;
                goto out_free;
            }
            memcpy(s->uids, o->uids, sizeof(*s->uids) * o->nuids);
            s->nuids = o->nuids;
            mode = 0666; /* the uid list is checked here, not by the file mode */
        }
        if (o->gid >= 0) {
            s->gid = (gid_t)o->gid;
            s->has_gid = true;
            if (mode == 0600)
                mode = 0660;
        }
        if (o->max_per_uid)
            s->max_per_uid = o->max_per_uid;
    }
    strcpy(s->path, path);
    strcpy(addr.sun_path, path);
    s->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s->listen_fd < 0) {
        r = -errno;
        goto out_free;
    }
    unlink(path);
    if (bind(s->listen_fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
        listen(s->listen_fd, 64) < 0) {
        r = -errno;
        goto out_close;
    }
    if ((s->has_gid && chown(path, (uid_t)-1, s->gid) < 0) || chmod(path, mode) < 0) {
        r = -errno;
        goto out_unlink;
    }
    s->stop_fd = eventfd(0, EFD_CLOEXEC);
    s->ep = epoll_create1(EPOLL_CLOEXEC);
    if (s->stop_fd < 0 || s->ep < 0) {
        r = -errno;
        goto out_unlink;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = EV_LISTEN};
    struct epoll_event evs = {.events = EPOLLIN, .data.u64 = EV_STOP};
    if (epoll_ctl(s->ep, EPOLL_CTL_ADD, s->listen_fd, &ev) < 0 ||
        epoll_ctl(s->ep, EPOLL_CTL_ADD, s->stop_fd, &evs) < 0) {
        r = -errno;
        goto out_unlink;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->reap_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&s->reap_mu, NULL);
    r = -pthread_create(&s->reaper, NULL, reaper_main, s);
    if (r < 0)
        goto out_cond;
    r = -pthread_create(&s->thread, NULL, server_main, s);
    if (r < 0) {
        stop_reaper(s);
        goto out_cond;
    }
    c->server = s;
    return 0;

out_cond:
    pthread_cond_destroy(&s->reap_cv);
    pthread_mutex_destroy(&s->reap_mu);

out_unlink:
    unlink(path);
out_close:
    close(s->listen_fd);
    if (s->stop_fd >= 0)
        close(s->stop_fd);
    if (s->ep >= 0)
        close(s->ep);
out_free:
    free(s->uids);
    free(s);
    return r;
}

int sfs_cache_serve(struct sfs_cache *c, const char *path)
{
    return sfs_cache_serve_opts(c, path, NULL);
}

void sfs_server_stop(struct sfs_server *s)
{
    uint64_t one = 1;

    if (!s)
        return;
    if (write(s->stop_fd, &one, sizeof(one)) < 0)
        sfs_log(LOG_ERR, "attach: cannot stop server: %s", strerror(errno));
    pthread_join(s->thread, NULL);
    stop_reaper(s);
    pthread_cond_destroy(&s->reap_cv);
    pthread_mutex_destroy(&s->reap_mu);
    unlink(s->path);
    /* Every client's connection closes here: attached processes learn that
     * this server is gone (their records go with the cache). */
    for (unsigned i = 0; i < SERVER_MAX_CONNS; i++)
        if (s->conns[i].state != CONN_FREE)
            conn_close(s, &s->conns[i]);
    close(s->listen_fd);
    close(s->stop_fd);
    close(s->ep);
    free(s->uids);
    free(s);
}
