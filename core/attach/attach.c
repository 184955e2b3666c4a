/* SPDX-License-Identifier: MIT */
/*
 * attach.c - creating a cache, attaching to one that a server hands out over
 * a Unix domain socket (the client side of attach_i.h's protocol), and
 * closing a handle. The server is server.c.
 *
 * After attach the client validates the region itself (magic, format,
 * geometry against the memfd's real size): the socket is input too. The
 * connection stays open for the handle's life: the server knows this process
 * by it, and reads its close as the process leaving.
 */
#include "attach_i.h"
#include "cache_i.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

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
#ifdef SFS_TEST_HOOKS
    /* Tests only (never the daemon or the rank library): run the suite with
     * SHARDFS_TEST_ADMISSION=scan to create every default cache that way. */
    struct sfs_cache_config adm;
    const char *ae = getenv("SHARDFS_TEST_ADMISSION");

    if (ae && strcmp(ae, "scan") == 0 && cfg->admission == SFS_ADMIT_CLOCK) {
        adm = *cfg;
        adm.admission = SFS_ADMIT_SCAN;
        cfg = &adm;
    }
#endif
    if (cfg->hugepages < SFS_HUGEPAGES_AUTO || cfg->hugepages > SFS_HUGEPAGES_OFF ||
        (cfg->admission != SFS_ADMIT_CLOCK && cfg->admission != SFS_ADMIT_SCAN)) {
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
    /* Written before any other process can attach, like the geometry. */
    c->hdr->admission = (uint32_t)cfg->admission;
    c->admit_scan = cfg->admission == SFS_ADMIT_SCAN;
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
 * Client.
 */

/*
 * Connections of this process's handles, so that a fork()ed child closes its
 * copies at once (pthread_atfork): otherwise a child that outlives its
 * parent's exec would keep the parent's attachment alive. Lock-free (the
 * child handler runs where another thread may have held any lock): slots
 * hold fd + 1, 0 when free. Bound: CONN_TABLE handles; a further one still
 * works, but a child keeps its copy until it exits or execs.
 */
#define CONN_TABLE 64
static _Atomic int conn_table[CONN_TABLE];
static pthread_once_t conn_once = PTHREAD_ONCE_INIT;

static void conn_table_child(void)
{
    for (int i = 0; i < CONN_TABLE; i++) {
        /* Relaxed: the child is single-threaded here. */
        int v = atomic_exchange_explicit(&conn_table[i], 0, memory_order_relaxed);

        if (v > 0)
            close(v - 1);
    }
}

static void conn_table_init(void)
{
    pthread_atfork(NULL, NULL, conn_table_child);
}

static void conn_table_add(int fd)
{
    pthread_once(&conn_once, conn_table_init);
    for (int i = 0; i < CONN_TABLE; i++) {
        int expect = 0;

        /* Relaxed: only fork() reads the table, in the child. */
        if (atomic_compare_exchange_strong_explicit(&conn_table[i], &expect, fd + 1,
                                                    memory_order_relaxed, memory_order_relaxed))
            return;
    }
}

static void conn_table_remove(int fd)
{
    for (int i = 0; i < CONN_TABLE; i++) {
        int expect = fd + 1;

        /* Relaxed: as in conn_table_add. */
        if (atomic_compare_exchange_strong_explicit(&conn_table[i], &expect, 0,
                                                    memory_order_relaxed, memory_order_relaxed))
            return;
    }
}

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
    int sent = sfs_fds_send(sock, &h, sizeof(h), NULL, 0);
    r = sfs_fds_recv(sock, &w, sizeof(w), &c->ctl_fd, 1);
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
            r = sfs_fds_recv(sock, &k, sizeof(k), fds + nseg, w.nsegments - (uint32_t)nseg);
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
    else
        conn_table_add(sock);
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
    /* Any other value is input we do not know: plain CLOCK (a policy, not
     * a correctness matter: see admit.c). */
    c->admit_scan = c->hdr->admission == SFS_ADMIT_SCAN;
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

int sfs_cache_conn_fd(const struct sfs_cache *c)
{
    return c ? c->conn_fd : -1;
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
    if (conn >= 0) {
        conn_table_remove(conn);
        close(conn);
    }
}
