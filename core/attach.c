/* SPDX-License-Identifier: MIT */
/*
 * attach.c - creating a cache, and handing it to other processes over a Unix
 * domain socket.
 *
 * The protocol is one round trip. The client sends a fixed-size hello (magic,
 * protocol version, the layout format word of its build, device id, whether
 * it wants the data plane). The server checks the peer's credentials (same
 * uid, or root) and the hello, then answers with a welcome carrying the
 * control-plane memfd, followed by the data-plane memfds in batches, all with
 * SCM_RIGHTS. A bad or incompatible hello gets a welcome with a negative
 * status, is logged, and the server goes on serving. Every client socket has
 * a receive timeout, so a silent client cannot stall the server.
 *
 * After attach the client validates the region itself (magic, format,
 * geometry against the memfd's real size): the socket is input too.
 */
#include "cache_i.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define HELLO_MAGIC     0x6f6c6c6548534653ull /* "SFSHello" */
#define WELCOME_MAGIC   0x656d6f6c6557534full /* "OSWelcome" */
#define PROTO_VERSION   2u /* 2: the welcome names the record; the connection is held */
#define FDS_PER_MSG     128u
#define HELLO_WANT_DATA 1u

struct hello {
    uint64_t magic;
    uint32_t proto;
    uint32_t flags;
    uint64_t format;
    int32_t device_id;
    uint32_t pad;
};

struct welcome {
    uint64_t magic;
    uint32_t proto;
    int32_t status; /* 0 or -errno */
    uint64_t format;
    uint64_t ctl_size;
    uint32_t nsegments;
    uint32_t nfds;     /* fds that follow in this and later messages */
    uint32_t proc;     /* the process record the server claimed for this client */
    uint32_t proc_gen; /* its generation */
};

static struct sfs_cache *sfs_cache_attach_fds_into(struct sfs_cache *c, int *fds, uint32_t nfds,
                                                   uint64_t expect_size, const struct welcome *w,
                                                   int *err);

static struct sfs_cache *handle_alloc(void)
{
    struct sfs_cache *c = calloc(1, sizeof(*c));

    if (!c)
        return NULL;
    c->ctl_fd = -1;
    c->conn_fd = -1;
    c->me = SFS_NIL;
    return c;
}

struct sfs_cache *sfs_cache_create(const struct sfs_cache_config *cfg, int *err)
{
    struct sfs_cache_config def = {0};
    struct sfs_cache *c;
    int r;

    if (!cfg)
        cfg = &def;
    if (cfg->hugepages < SFS_HUGEPAGES_AUTO || cfg->hugepages > SFS_HUGEPAGES_OFF) {
        r = -EINVAL;
        goto out_err;
    }
    c = handle_alloc();
    if (!c) {
        r = -ENOMEM;
        goto out_err;
    }
    c->creator = true;
    c->device_id = 0;
    r = sfs_ctl_init(c, cfg);
    if (r < 0)
        goto out_free;
    /* sfs_ctl_init sealed its size; close the seal set too, or an attached
     * process could add F_SEAL_FUTURE_WRITE and every later attach would
     * fail to map the region writable. */
    if (fcntl(c->ctl_fd, F_ADD_SEALS, F_SEAL_SEAL) < 0) {
        r = -errno;
        goto out_free;
    }
    c->hdr->hugepages = 0;
    r = sfs_dp_create(c, cfg->hugepages, cfg->numa_bind ? cfg->numa_node : -1, cfg->populate);
    if (r < 0)
        goto out_free;
    c->hdr->hugepages = c->hugepages;
    r = sfs_lease_table_init(c);
    if (r < 0)
        goto out_free;
    r = sfs_proc_register(c, 0);
    if (r < 0)
        goto out_free;
    return c;

out_free:
    sfs_cache_free_handle(c);
out_err:
    if (err)
        *err = r;
    return NULL;
}

/* ---------------------------------------------------------------------------
 * fd passing.
 */

static int send_fds(int sock, const void *buf, size_t len, const int *fds, unsigned nfds)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * FDS_PER_MSG)];
        struct cmsghdr align;
    } u;
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    ssize_t n;

    if (nfds > FDS_PER_MSG)
        return -EINVAL;
    if (nfds) {
        memset(&u, 0, sizeof(u));
        msg.msg_control = u.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
    }
    do
        n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    return (size_t)n == len ? 0 : -EIO;
}

/* Receive exactly len bytes and up to max_fds fds; returns the fd count. */
static int recv_fds(int sock, void *buf, size_t len, int *fds, unsigned max_fds)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * FDS_PER_MSG)];
        struct cmsghdr align;
    } u;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
    ssize_t n;
    int got = 0;

    do
        n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        int *in = (int *)CMSG_DATA(cm);
        for (int i = 0; i < k; i++) {
            if ((unsigned)got < max_fds)
                fds[got++] = in[i];
            else
                close(in[i]); /* more than announced: never leak */
        }
    }
    if ((size_t)n != len || (msg.msg_flags & MSG_CTRUNC)) {
        /* Closed here, so never again by the caller: the welcome's slot is
         * the handle's ctl_fd, which the handle's free would close too. */
        for (int i = 0; i < got; i++) {
            close(fds[i]);
            fds[i] = -1;
        }
        return -EBADMSG;
    }
    return got;
}

/* ---------------------------------------------------------------------------
 * Server.
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
 */

#define HELLO_TIMEOUT_NS (1000 * 1000 * 1000ll)
#define SERVER_MAX_CONNS 1024u
#define PENDING_PER_UID  64u
#define MAX_PER_PROC     16u /* attached handles of one process */
#define REAP_RETRY_NS    (200 * 1000 * 1000ll)
#define EV_LISTEN        UINT64_MAX
#define EV_STOP          (UINT64_MAX - 1)
/* epoll data of a connection: its index and its seq (so an event queued for a
 * connection closed earlier in the same batch never reaches the next one in
 * its place), and a bit for its pidfd. */
#define EV_PIDFD         (1ull << 48)
#define EV_DATA(i, seq)  ((uint64_t)(i) | (uint64_t)(seq) << 16)

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
    uid_t uid;
    int device_id;
    uint32_t rec, gen; /* CONN_ATTACHED: the process record claimed for it */
    int64_t deadline;  /* CONN_HELLO: the hello is complete by then */
    size_t got;       /* bytes of the hello received */
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
    /* The reaper: frees the leases of records the server declared dead, off
     * the epoll thread (a reap takes bucket locks; attaches never wait on
     * them). */
    pthread_t reaper;
    pthread_mutex_t reap_mu;
    pthread_cond_t reap_cv; /* CLOCK_MONOTONIC */
    bool reap_pending;      /* reap_mu */
    bool reap_stop;         /* reap_mu */
    struct conn conns[SERVER_MAX_CONNS]; /* the server thread's alone */
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

static void refuse(int sock, int status)
{
    struct welcome w = {.magic = WELCOME_MAGIC,
                        .proto = PROTO_VERSION,
                        .status = status,
                        .format = sfs_layout_format()};

    send_fds(sock, &w, sizeof(w), NULL, 0); /* best effort: the socket is non-blocking */
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
    /* Closing an fd removes it from the epoll set. */
    close(k->fd);
    if (k->pidfd >= 0)
        close(k->pidfd);
    uint32_t seq = k->seq;

    memset(k, 0, sizeof(*k));
    k->seq = seq;
    k->state = CONN_FREE;
    k->fd = -1;
    k->pidfd = -1;
    (void)s;
}

/* Connections of uid in a state (bounded by SERVER_MAX_CONNS). */
static unsigned count_uid(const struct sfs_server *s, uid_t uid, enum conn_state st)
{
    unsigned n = 0;

    for (unsigned i = 0; i < SERVER_MAX_CONNS; i++)
        n += s->conns[i].state == st && s->conns[i].uid == uid;
    return n;
}

/* Attached connections of one peer pid (bounded by SERVER_MAX_CONNS). */
static unsigned count_pid(const struct sfs_server *s, pid_t pid)
{
    unsigned n = 0;

    for (unsigned i = 0; i < SERVER_MAX_CONNS; i++)
        n += s->conns[i].state == CONN_ATTACHED && s->conns[i].pid == pid;
    return n;
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
    memset(k, 0, sizeof(*k));
    k->seq = seq;
    k->state = CONN_HELLO;
    k->fd = sock;
    k->pidfd = -1;
    k->pid = cred.pid;
    k->uid = cred.uid;
    k->deadline = sfs_now_ns() + HELLO_TIMEOUT_NS;
}

static void accept_all(struct sfs_server *s)
{
    /* Bounded by the listen backlog: accept4 says EAGAIN once it is empty. */
    for (;;) {
        int sock = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

        if (sock < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                sfs_log(LOG_WARNING, "attach: accept: %s", strerror(errno));
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
        count_pid(s, k->pid) >= MAX_PER_PROC) {
        sfs_log(LOG_WARNING,
                "attach: refused pid %d uid %u: at most %u handles a process, %u a uid",
                k->pid, k->uid, MAX_PER_PROC, s->max_per_uid);
        refuse(k->fd, -EUSERS);
        conn_close(s, k);
        return;
    }
    /* The record is claimed here, for this connection, and reaped when it
     * closes: one record per connection, none without one. */
    int r = sfs_proc_claim_for(c, k->pid, h->device_id, &k->rec, &k->gen);
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
    r = send_fds(k->fd, &w, sizeof(w), &c->ctl_fd, 1);
    for (uint32_t i = 0; r == 0 && data && i < c->nsegments; i += FDS_PER_MSG) {
        uint32_t n = c->nsegments - i < FDS_PER_MSG ? c->nsegments - i : FDS_PER_MSG;
        uint32_t hdr = n;

        r = send_fds(k->fd, &hdr, sizeof(hdr), c->seg_fds + i, n);
    }
    if (r < 0) {
        /* EAGAIN included: a client that does not read its welcome is not
         * waited for. */
        sfs_log(LOG_WARNING, "attach: pid %d: welcome not sent: %s", k->pid, strerror(-r));
        detach_one(s, k, "welcome not sent");
        return;
    }
    /* A pidfd of the peer (Linux 6.5+): it turns readable when the process
     * exits, even if a child it forked still holds the connection. */
    int pidfd = -1;
    socklen_t plen = sizeof(pidfd);
    if (getsockopt(k->fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &plen) == 0 && pidfd >= 0) {
        struct epoll_event ev = {.events = EPOLLIN,
                                 .data.u64 = EV_PIDFD | EV_DATA(k - s->conns, k->seq)};

        if (epoll_ctl(s->ep, EPOLL_CTL_ADD, pidfd, &ev) == 0)
            k->pidfd = pidfd;
        else
            close(pidfd);
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
 * REAP_RETRY_NS besides. */
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
            pthread_cond_timedwait(&s->reap_cv, &s->reap_mu, &ts);
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

/* Milliseconds until the earliest hello deadline, or -1; expired hellos are
 * refused first (one pass over the table). */
static int expire_hellos(struct sfs_server *s)
{
    int64_t now = sfs_now_ns(), next = INT64_MAX;

    for (unsigned i = 0; i < SERVER_MAX_CONNS; i++) {
        struct conn *k = &s->conns[i];

        if (k->state != CONN_HELLO)
            continue;
        if (k->deadline <= now) {
            sfs_log(LOG_WARNING, "attach: refused pid %d: no hello within %lld ms (%zu bytes)",
                    k->pid, HELLO_TIMEOUT_NS / 1000000, k->got);
            refuse(k->fd, -ETIMEDOUT);
            conn_close(s, k);
        } else if (k->deadline < next) {
            next = k->deadline;
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
        sfs_log(LOG_ERR, "attach: socket directory %s belongs to uid %u: refused", dir,
                st.st_uid);
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

/* ---------------------------------------------------------------------------
 * Client.
 */

static int connect_to(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct timeval tv = {.tv_sec = 5};
    int sock, r;

    if (strlen(path) >= sizeof(addr.sun_path))
        return -ENAMETOOLONG;
    strcpy(addr.sun_path, path);
    sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return -errno;
    setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(sock, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        r = -errno;
        close(sock);
        return r;
    }
    return sock;
}

struct sfs_cache *sfs_cache_attach(const char *path, int device_id, int *err)
{
    struct hello h = {.magic = HELLO_MAGIC,
                      .proto = PROTO_VERSION,
                      .flags = device_id >= 0 ? HELLO_WANT_DATA : 0,
                      .format = sfs_layout_format(),
                      .device_id = device_id};
    struct welcome w;
    struct sfs_cache *c = NULL;
    int sock, r, *fds = NULL, nseg = 0;

    if (!path) {
        r = -EINVAL;
        goto out_err;
    }
    sock = connect_to(path);
    if (sock < 0) {
        r = sock;
        goto out_err;
    }
    c = handle_alloc();
    if (!c) {
        r = -ENOMEM;
        goto out_sock;
    }
    c->query_only = device_id < 0;
    c->device_id = device_id;
    /* A server may refuse at accept, before reading the hello: then the
     * send fails (EPIPE) but its welcome, with the reason, is there to read. */
    int sent = send_fds(sock, &h, sizeof(h), NULL, 0);
    r = recv_fds(sock, &w, sizeof(w), &c->ctl_fd, 1);
    if (sent < 0 && (r < 0 || w.magic != WELCOME_MAGIC || w.status >= 0))
        r = sent; /* no refusal to report: the send's error */
    if (r < 0)
        goto out_sock;
    if (w.magic != WELCOME_MAGIC) {
        r = -EBADMSG;
        goto out_sock;
    }
    if (w.status < 0) {
        r = w.status;
        goto out_sock;
    }
    if (w.proto != PROTO_VERSION || w.format != sfs_layout_format()) {
        r = -EPROTO;
        goto out_sock;
    }
    if (r != 1 || w.nsegments == 0 || w.nsegments > (1u << 20) ||
        w.nfds != 1 + (c->query_only ? 0 : w.nsegments)) {
        r = -EBADMSG;
        goto out_sock;
    }
    if (!c->query_only) {
        fds = malloc(sizeof(int) * w.nsegments);
        if (!fds) {
            r = -ENOMEM;
            goto out_sock;
        }
        while ((uint32_t)nseg < w.nsegments) {
            uint32_t k;
            r = recv_fds(sock, &k, sizeof(k), fds + nseg, w.nsegments - (uint32_t)nseg);
            if (r < 0)
                goto out_fds;
            if (r == 0 || (uint32_t)r != k) {
                nseg += r;
                r = -EBADMSG;
                goto out_fds;
            }
            nseg += r;
        }
    }
    /* The connection stays open for the handle's life (close-on-exec: an
     * exec ends the attachment as death does): the server knows this
     * process by it. */
    c->conn_fd = sock;
    c = sfs_cache_attach_fds_into(c, fds, (uint32_t)nseg, w.ctl_size, &w, err);
    if (!c)
        close(sock);
    return c;

out_fds:
    for (int i = 0; i < nseg; i++)
        close(fds[i]);
    free(fds);
out_sock:
    close(sock);
    sfs_cache_free_handle(c);
out_err:
    if (err)
        *err = r;
    return NULL;
}

/*
 * Map a control plane and data plane received as fds, validate, register.
 * Takes ownership of every fd, on success and on failure. expect_size is the
 * size the server announced (0: any).
 */
static struct sfs_cache *sfs_cache_attach_fds_into(struct sfs_cache *c, int *fds, uint32_t nfds,
                                                   uint64_t expect_size, const struct welcome *w,
                                                   int *err)
{
    struct stat st;
    int r;

    if (fstat(c->ctl_fd, &st) < 0) {
        r = -errno;
        goto out_fds;
    }
    if ((expect_size && (uint64_t)st.st_size != expect_size) ||
        st.st_size < (off_t)sizeof(struct sfs_header)) {
        r = -EBADMSG;
        goto out_fds;
    }
    c->ctl_len = (size_t)st.st_size;
    c->ctl = mmap(NULL, c->ctl_len, PROT_READ | PROT_WRITE, MAP_SHARED, c->ctl_fd, 0);
    if (c->ctl == MAP_FAILED) {
        c->ctl = NULL;
        r = -errno;
        goto out_fds;
    }
    r = sfs_ctl_validate(c);
    if (r < 0)
        goto out_fds;
    c->hugepages = c->hdr->hugepages != 0;
    if (!c->query_only) {
        r = sfs_dp_map(c, fds, nfds); /* owns the fds from here */
        free(fds);
        fds = NULL;
        nfds = 0;
        if (r < 0)
            goto out_handle;
    }
    r = sfs_lease_table_init(c);
    if (r < 0)
        goto out_fds;
    /* Through a server: the record it claimed for our connection (it reaps
     * it when the connection closes). Without one: a record of our own,
     * freed only by our own detach. */
    r = w ? sfs_proc_adopt(c, w->proc, w->proc_gen) : sfs_proc_register(c, c->device_id);
    if (r < 0)
        goto out_fds;
    for (uint32_t i = 0; i < nfds; i++)
        close(fds[i]);
    free(fds);
    return c;

out_fds:
    for (uint32_t i = 0; i < nfds; i++)
        close(fds[i]);
    free(fds);
out_handle:
    sfs_cache_free_handle(c);
    if (err)
        *err = r;
    return NULL;
}

struct sfs_cache *sfs_cache_attach_fds(int ctl_fd, const int *seg_fds, uint32_t nseg, int device_id,
                                       int *err)
{
    struct sfs_cache *c = handle_alloc();
    int *fds = NULL;

    if (!c || (nseg && !(fds = malloc(sizeof(int) * nseg)))) {
        free(c);
        if (err)
            *err = -ENOMEM;
        return NULL;
    }
    for (uint32_t i = 0; i < nseg; i++)
        fds[i] = seg_fds[i];
    c->ctl_fd = ctl_fd;
    c->query_only = device_id < 0;
    c->device_id = device_id;
    return sfs_cache_attach_fds_into(c, fds, nseg, 0, NULL, err);
}

void sfs_cache_close(struct sfs_cache *c)
{
    int conn;

    if (!c)
        return;
    sfs_server_stop(c->server);
    c->server = NULL;
    /* Leases first, connection last: the server reads the close as this
     * process leaving. */
    conn = c->conn_fd;
    sfs_cache_free_handle(c);
    if (conn >= 0)
        close(conn);
}
