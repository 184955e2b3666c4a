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
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define HELLO_MAGIC     0x6f6c6c6548534653ull /* "SFSHello" */
#define WELCOME_MAGIC   0x656d6f6c6557534full /* "OSWelcome" */
#define PROTO_VERSION   1u
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
    uint32_t nfds; /* fds that follow in this and later messages */
};

struct sfs_server {
    struct sfs_cache *c;
    int listen_fd;
    int stop_fd; /* eventfd */
    pthread_t thread;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

static struct sfs_cache *sfs_cache_attach_fds_into(struct sfs_cache *c, int *fds, uint32_t nfds,
                                                   uint64_t expect_size, int *err);

static struct sfs_cache *handle_alloc(void)
{
    struct sfs_cache *c = calloc(1, sizeof(*c));

    if (!c)
        return NULL;
    c->ctl_fd = -1;
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
        for (int i = 0; i < got; i++)
            close(fds[i]);
        return -EBADMSG;
    }
    return got;
}

/* ---------------------------------------------------------------------------
 * Server.
 */

static void refuse(int sock, int status)
{
    struct welcome w = {.magic = WELCOME_MAGIC,
                        .proto = PROTO_VERSION,
                        .status = status,
                        .format = sfs_layout_format()};

    send_fds(sock, &w, sizeof(w), NULL, 0);
}

static void serve_one(struct sfs_server *s, int sock)
{
    struct sfs_cache *c = s->c;
    struct timeval tv = {.tv_sec = 1};
    struct ucred cred;
    socklen_t clen = sizeof(cred);
    struct hello h;
    ssize_t n;

    setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
        sfs_log(LOG_WARNING, "attach: no peer credentials: %s", strerror(errno));
        return;
    }
    if (cred.uid != geteuid() && cred.uid != 0) {
        sfs_log(LOG_WARNING, "attach: refused pid %d uid %u: not our uid", cred.pid, cred.uid);
        refuse(sock, -EACCES);
        return;
    }
    n = recv(sock, &h, sizeof(h), MSG_WAITALL);
    if (n != (ssize_t)sizeof(h) || h.magic != HELLO_MAGIC) {
        sfs_log(LOG_WARNING, "attach: refused pid %d: bad hello (%zd bytes)", cred.pid, n);
        refuse(sock, -EBADMSG);
        return;
    }
    if (h.proto != PROTO_VERSION || h.format != sfs_layout_format()) {
        sfs_log(LOG_WARNING, "attach: refused pid %d: protocol %u format %016llx (ours %u %016llx)",
                cred.pid, h.proto, (unsigned long long)h.format, PROTO_VERSION,
                (unsigned long long)sfs_layout_format());
        refuse(sock, -EPROTO);
        return;
    }
    bool data = h.flags & HELLO_WANT_DATA;
    struct welcome w = {.magic = WELCOME_MAGIC,
                        .proto = PROTO_VERSION,
                        .status = 0,
                        .format = sfs_layout_format(),
                        .ctl_size = c->ctl_len,
                        .nsegments = c->nsegments,
                        .nfds = 1 + (data ? c->nsegments : 0)};
    if (send_fds(sock, &w, sizeof(w), &c->ctl_fd, 1) < 0)
        return;
    for (uint32_t i = 0; data && i < c->nsegments; i += FDS_PER_MSG) {
        uint32_t k = c->nsegments - i < FDS_PER_MSG ? c->nsegments - i : FDS_PER_MSG;
        uint32_t hdr = k;

        if (send_fds(sock, &hdr, sizeof(hdr), c->seg_fds + i, k) < 0)
            return;
    }
    sfs_log(LOG_INFO, "attach: pid %d device %d%s", cred.pid, h.device_id,
            data ? "" : " (query-only)");
}

static void *server_main(void *arg)
{
    struct sfs_server *s = arg;
    struct pollfd pf[2] = {{.fd = s->listen_fd, .events = POLLIN},
                           {.fd = s->stop_fd, .events = POLLIN}};

    for (;;) {
        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (pf[1].revents)
            break;
        if (pf[0].revents & POLLIN) {
            int sock = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);

            if (sock < 0)
                continue;
            serve_one(s, sock);
            close(sock);
        }
    }
    return NULL;
}

int sfs_cache_serve(struct sfs_cache *c, const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct sfs_server *s;
    int r;

    if (!c || !path || !c->creator || c->server)
        return -EINVAL;
    if (strlen(path) >= sizeof(addr.sun_path))
        return -ENAMETOOLONG;
    s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->c = c;
    s->stop_fd = -1;
    strcpy(s->path, path);
    strcpy(addr.sun_path, path);
    s->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
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
    chmod(path, 0660);
    s->stop_fd = eventfd(0, EFD_CLOEXEC);
    if (s->stop_fd < 0) {
        r = -errno;
        goto out_unlink;
    }
    r = -pthread_create(&s->thread, NULL, server_main, s);
    if (r < 0)
        goto out_unlink;
    c->server = s;
    return 0;

out_unlink:
    unlink(path);
out_close:
    close(s->listen_fd);
    if (s->stop_fd >= 0)
        close(s->stop_fd);
out_free:
    free(s);
    return r;
}

void sfs_server_stop(struct sfs_server *s)
{
    uint64_t one = 1;

    if (!s)
        return;
    if (write(s->stop_fd, &one, sizeof(one)) < 0)
        sfs_log(LOG_ERR, "attach: cannot stop server: %s", strerror(errno));
    pthread_join(s->thread, NULL);
    unlink(s->path);
    close(s->listen_fd);
    close(s->stop_fd);
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
    r = send_fds(sock, &h, sizeof(h), NULL, 0);
    if (r < 0)
        goto out_sock;
    r = recv_fds(sock, &w, sizeof(w), &c->ctl_fd, 1);
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
    close(sock);
    return sfs_cache_attach_fds_into(c, fds, (uint32_t)nseg, w.ctl_size, err);

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
                                                   uint64_t expect_size, int *err)
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
    r = sfs_proc_register(c, c->device_id);
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
    return sfs_cache_attach_fds_into(c, fds, nseg, 0, err);
}

void sfs_cache_close(struct sfs_cache *c)
{
    if (!c)
        return;
    sfs_server_stop(c->server);
    c->server = NULL;
    sfs_cache_free_handle(c);
}
