/* SPDX-License-Identifier: MIT */
/*
 * test_peer_members.c - the peer tier's members file
 * (core/peer/peer_members.c), through a peer backend on loopback: one
 * host:port a line, with blanks, comments, indentation and CRLF line ends,
 * at most PEER_MEMBERS_MAX members (the lines after them ignored); a file
 * that is missing at the start refuses the open with its reason; and the
 * file is read again when asked (sfs_backend_peer_reload) or when its
 * mtime changes, while a re-read that cannot open the file keeps the
 * members the tier had. The ring is looked at in the backend's state.
 */
#include "peer_backend_i.h"
#include "peer_fixture.h"
#include "testutil.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static struct sfs_backend *open_peer(const char *listen, const char *members, char *err,
                                     size_t errlen, int *e)
{
    struct sfs_backend_params p = {.shard_size = PAY};
    char spec[512];

    if (members)
        snprintf(spec, sizeof(spec), "peer:listen=%s,members=%s,ways=4,capacity=1M:mem:", listen,
                 members);
    else
        snprintf(spec, sizeof(spec), "peer:listen=%s,ways=4,capacity=1M:mem:", listen);
    return sfs_backend_open(spec, &p, err, errlen, e);
}

/* The ring's members now, joined by ' ' into out; their count. */
static size_t ring_now(struct sfs_backend *be, char *out, size_t cap, int *self)
{
    struct peer_backend *pb = (struct peer_backend *)be;
    size_t n, off = 0;

    out[0] = '\0';
    pthread_rwlock_rdlock(&pb->ring_lock);
    n = pb->ring.nmembers;
    for (size_t i = 0; i < n && off < cap; i++)
        off += (size_t)snprintf(out + off, cap - off, "%s%s", i ? " " : "", pb->ring.members[i]);
    if (self)
        *self = pb->self;
    pthread_rwlock_unlock(&pb->ring_lock);
    return n;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    cr_assert(f);
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
}

Test(peer_members, the_members_file_is_read_line_by_line, .timeout = 30)
{
    const char *path = tu_path("members");
    char listen[64], err[256] = "", ring[64 * 300], want[128];
    static char text[64 * 300];
    struct sfs_backend *be;
    size_t off;
    int e = 0, self = -2;

    snprintf(listen, sizeof(listen), "127.0.0.1:%u", free_port());
    off = (size_t)snprintf(text, sizeof(text),
                           "# the members\n"
                           "   %s   # this host, indented, a comment after\n"
                           "\t\n"
                           "127.0.0.1:7001\r\n"
                           "   \n"
                           "#127.0.0.1:7002\n",
                           listen);
    /* 300 more: the ring takes the first PEER_MEMBERS_MAX members. */
    for (unsigned i = 0; i < 300; i++)
        off += (size_t)snprintf(text + off, sizeof(text) - off, "127.0.0.1:%u\n", 10000 + i);
    write_file(path, text);
    be = open_peer(listen, path, err, sizeof(err), &e);
    cr_assert(be, "%s", err);
    cr_assert_eq(ring_now(be, ring, sizeof(ring), &self), PEER_MEMBERS_MAX);
    snprintf(want, sizeof(want), "%s 127.0.0.1:7001 127.0.0.1:10000 ", listen);
    cr_assert_eq(strncmp(ring, want, strlen(want)), 0, "%.80s", ring);
    snprintf(want, sizeof(want), " 127.0.0.1:%u", 10000 + PEER_MEMBERS_MAX - 3);
    cr_assert_str_eq(ring + strlen(ring) - strlen(want), want);
    cr_assert_eq(self, 0, "this host is the member equal to listen");
    sfs_backend_close(be);
    /* Comments and blanks only: no members, not this host either. */
    write_file(path, "# nobody yet\n\n   \n");
    be = open_peer(listen, path, err, sizeof(err), &e);
    cr_assert(be, "%s", err);
    cr_assert_eq(ring_now(be, ring, sizeof(ring), &self), 0);
    cr_assert_eq(self, -1);
    sfs_backend_close(be);
    /* No file: the open is refused, and says why. */
    unlink(path);
    err[0] = '\0';
    cr_assert_null(open_peer(listen, path, err, sizeof(err), &e));
    cr_assert_eq(e, -ENOENT);
    cr_assert(strstr(err, "members file") && strstr(err, strerror(ENOENT)), "%s", err);
}

/* The tier's next use (an exists; the idle publisher does it too within
 * a second) until the ring has n members. */
static void until_members(struct sfs_backend *be, size_t n, char *ring, size_t cap)
{
    struct sfs_key k = tu_key(1, 0);
    int64_t end = now_ns() + 20000000000ll;
    bool present;

    while (ring_now(be, ring, cap, NULL) != n) {
        cr_assert_lt(now_ns(), end, "the ring still has %zu members, not %zu",
                     ring_now(be, ring, cap, NULL), n);
        sfs_backend_exists(be, &k, 1, &present);
        usleep(20000);
    }
}

Test(peer_members, the_file_is_read_again_when_asked_or_changed, .timeout = 60)
{
    struct peer_backend *pb;
    char path[128], away[128], listen[64], err[256] = "", ring[512], text[256];
    struct sfs_backend *be;
    struct sfs_key k = tu_key(2, 0);
    struct timespec ts[2];
    bool present;
    int e = 0;

    /* Copies: tu_path's buffer is its next call's. */
    snprintf(path, sizeof(path), "%s", tu_path("members"));
    snprintf(away, sizeof(away), "%s", tu_path("away"));
    snprintf(listen, sizeof(listen), "127.0.0.1:%u", free_port());
    snprintf(text, sizeof(text), "%s\n", listen);
    write_file(path, text);
    be = open_peer(listen, path, err, sizeof(err), &e);
    cr_assert(be, "%s", err);
    pb = (struct peer_backend *)be;
    cr_assert_eq(ring_now(be, ring, sizeof(ring), NULL), 1);
    /* Asked: the file is read again, mtime or not. */
    snprintf(text, sizeof(text), "%s\n127.0.0.1:7001\n", listen);
    write_file(path, text);
    cr_assert_eq(sfs_backend_peer_reload(be), 0);
    until_members(be, 2, ring, sizeof(ring));
    /* Asked, but the file is gone: the members stay. */
    cr_assert_eq(rename(path, away), 0);
    cr_assert_eq(sfs_backend_peer_reload(be), 0);
    /* Acquire: the flag's clear comes after the attempt it asks for. */
    while (atomic_load_explicit(&pb->reload_asked, memory_order_acquire))
        sfs_backend_exists(be, &k, 1, &present);
    pthread_mutex_lock(&pb->reload_lock); /* the attempt is over */
    pthread_mutex_unlock(&pb->reload_lock);
    cr_assert_eq(ring_now(be, ring, sizeof(ring), NULL), 2);
    snprintf(text, sizeof(text), "%s 127.0.0.1:7001", listen);
    cr_assert_str_eq(ring, text);
    /* Changed (its mtime moved), not asked: read again within a second or
     * so of the change. */
    snprintf(text, sizeof(text), "%s\n", listen);
    write_file(path, text);
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec += 100;
    ts[1] = ts[0];
    cr_assert_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
    until_members(be, 1, ring, sizeof(ring));
    cr_assert_str_eq(ring, listen);
    /* Changed within the same second of mtime (the nanoseconds moved). */
    snprintf(text, sizeof(text), "%s\n127.0.0.1:7002\n", listen);
    write_file(path, text);
    ts[0].tv_nsec = ts[0].tv_nsec == 0 ? 1 : ts[0].tv_nsec - 1;
    ts[1] = ts[0];
    cr_assert_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
    until_members(be, 2, ring, sizeof(ring));
    /* Gone for longer than the once-a-second look, not asked: the
     * members stay (the look finds no file, not a change). */
    cr_assert_eq(rename(path, away), 0);
    usleep(1200000);
    cr_assert_eq(sfs_backend_exists(be, &k, 1, &present), 0);
    cr_assert_eq(ring_now(be, ring, sizeof(ring), NULL), 2);
    snprintf(text, sizeof(text), "%s 127.0.0.1:7002", listen);
    cr_assert_str_eq(ring, text);
    sfs_backend_close(be);
    unlink(path);
    unlink(away);
}

/* Without a members file every key is this host's: nothing to re-read. */
Test(peer_members, without_a_members_file_the_tier_is_this_hosts, .timeout = 30)
{
    char listen[64], err[256] = "", ring[64];
    struct sfs_backend *be;
    struct sfs_key k = tu_key(3, 0);
    uint8_t in[PAY], out[PAY];
    bool present = false;
    int e = 0;

    snprintf(listen, sizeof(listen), "127.0.0.1:%u", free_port());
    be = open_peer(listen, NULL, err, sizeof(err), &e);
    cr_assert(be, "%s", err);
    cr_assert_eq(sfs_backend_peer_reload(be), 0);
    tu_fill(&k, in, PAY);
    cr_assert_eq(sfs_backend_dump_sync(be, &k, in, PAY), PAY);
    cr_assert_eq(sfs_backend_exists(be, &k, 1, &present), 0);
    cr_assert(present);
    cr_assert_eq(sfs_backend_load_sync(be, &k, out, PAY), PAY);
    cr_assert_eq(memcmp(in, out, PAY), 0);
    cr_assert_eq(ring_now(be, ring, sizeof(ring), NULL), 0);
    sfs_backend_close(be);
}
