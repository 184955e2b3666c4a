/* SPDX-License-Identifier: MIT */
/*
 * peer_members.c - the peer tier's membership: the members file (one
 * host:port a line, '#' comments) read at start and re-read when its mtime
 * changes, the consistent-hash ring built from it, one connection per
 * member, and the server's list of hosts it serves. A re-read is also asked
 * for (sfs_backend_peer_reload: the daemon's SIGHUP) and happens at the
 * next use or within a second. The ring, members and
 * self are replaced whole under ring_lock (write); readers hold it for reading.
 */
#include "peer_backend_i.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void peer_members_free(struct peer_member *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        peer_conn_close(&m[i].conn);
        pthread_mutex_destroy(&m[i].lock);
    }
    free(m);
}

/* Read the members file: one host:port a line, '#' comments, blanks. */
static int members_read(const char *path, char ***out, size_t *n, struct timespec *mtime)
{
    FILE *f = fopen(path, "re");
    char line[512], **v = NULL;
    struct stat st;
    size_t k = 0;

    *out = NULL;
    *n = 0;
    if (!f)
        return -errno;
    if (fstat(fileno(f), &st) == 0)
        *mtime = st.st_mtim;
    while (fgets(line, sizeof(line), f)) {
        char *s = line, *e;

        while (isspace((unsigned char)*s))
            s++;
        e = s + strcspn(s, "#\r\n");
        while (e > s && isspace((unsigned char)e[-1]))
            e--;
        *e = '\0';
        if (!*s)
            continue;
        if (k == PEER_MEMBERS_MAX)
            break;
        char **nv = realloc(v, (k + 1) * sizeof(*v));

        if (!nv || !(nv[k] = strdup(s))) {
            v = nv ? nv : v;
            break;
        }
        v = nv;
        k++;
    }
    fclose(f);
    *out = v;
    *n = k;
    return 0;
}

int peer_members_load(struct peer_backend *pb)
{
    char **names;
    size_t n;
    struct peer_ring ring;
    struct peer_member *mem;
    struct timespec mt = {0};
    int ret = members_read(pb->o.members, &names, &n, &mt), self = -1;

    if (ret < 0)
        return ret;
    ret = peer_ring_build(&ring, names, n);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (ret < 0)
        return ret;
    mem = calloc(ring.nmembers ? ring.nmembers : 1, sizeof(*mem));
    if (!mem) {
        peer_ring_free(&ring);
        return -ENOMEM;
    }
    for (size_t i = 0; i < ring.nmembers; i++) {
        pthread_mutex_init(&mem[i].lock, NULL);
        peer_conn_init(&mem[i].conn);
        mem[i].conn.key = pb->key;
        if (strcmp(ring.members[i], pb->o.listen) == 0)
            self = (int)i;
    }
    pthread_rwlock_wrlock(&pb->ring_lock);
    peer_members_free(pb->mem, pb->ring.nmembers);
    peer_ring_free(&pb->ring);
    pb->ring = ring;
    pb->mem = mem;
    pb->self = self;
    pb->members_mtime = mt;
    /* Only members may read or write our region. */
    if (pb->srv)
        peer_server_allow(pb->srv, pb->ring.members, pb->ring.nmembers);
    pthread_rwlock_unlock(&pb->ring_lock);
    return 0;
}

void peer_members_maybe_reload(struct peer_backend *pb)
{
    struct stat st;
    int64_t now = peer_mono_ns();

    if (!pb->o.members[0] || pthread_mutex_trylock(&pb->reload_lock) != 0)
        return;
    /* Acquire: pairs with sfs_backend_peer_reload's release (a flag only). */
    if (atomic_exchange_explicit(&pb->reload_asked, false, memory_order_acquire)) {
        pb->members_checked_ns = now;
        peer_members_load(pb);
    } else if (now - pb->members_checked_ns >= 1000000000) {
        pb->members_checked_ns = now;
        if (stat(pb->o.members, &st) == 0 && (st.st_mtim.tv_sec != pb->members_mtime.tv_sec ||
                                              st.st_mtim.tv_nsec != pb->members_mtime.tv_nsec))
            peer_members_load(pb);
    }
    pthread_mutex_unlock(&pb->reload_lock);
}
