/* SPDX-License-Identifier: MIT */
/*
 * peer_fixture.h - what the peer tier's tests share: free ports, regions
 * and a server on loopback, "hosts" (peer backends over their own inner
 * stores) on 127.0.0.1 with one members file and one members' key, the
 * owner of a key as every host computes it, and versioned payloads a
 * reader checks byte for byte.
 */
#ifndef SHARDFS_PEER_FIXTURE_H
#define SHARDFS_PEER_FIXTURE_H

#include "peer_i.h"
#include "testutil.h"

#include <shardfs/backend.h>

#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/random.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PAY 4096u

static inline int64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* A free TCP port on 127.0.0.1 (the kernel's choice, released). */
static inline unsigned free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    cr_assert(fd >= 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* A region of exactly buckets x ways slots of PAY bytes. */
static inline void fx_region(struct peer_region *r, uint64_t buckets, uint32_t ways)
{
    struct peer_geometry g;
    uint64_t stride = (PEER_HDR_SIZE + PAY + 63) & ~63ull;

    cr_assert_eq(peer_geometry_make(buckets * ways * stride, ways, PAY, &g), 0);
    cr_assert_eq(g.num_buckets, buckets);
    cr_assert_eq(peer_region_create(r, &g), 0);
}

static inline void fx_key_unlink(void);

/* The members' key file of this test process: 32 random bytes, mode 0600,
 * written on first use and removed at exit. */
static inline const char *fx_key_file(void)
{
    static char path[128];

    if (!path[0]) {
        uint8_t k[32];
        int fd;

        /* Not tu_path: its buffer may hold the caller's path (members). */
        snprintf(path, sizeof(path), "/tmp/sfs-test-%d-%llx-peerkey", getpid(),
                 (unsigned long long)now_ns());
        cr_assert_eq(getrandom(k, sizeof(k), 0), (ssize_t)sizeof(k));
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        cr_assert_geq(fd, 0, "%s", path);
        cr_assert_eq(write(fd, k, sizeof(k)), (ssize_t)sizeof(k));
        close(fd);
        atexit(fx_key_unlink);
    }
    return path;
}

static inline void fx_key_unlink(void)
{
    unlink(fx_key_file());
}

/* The key of fx_key_file(), loaded (the caller frees it). */
static inline struct peer_key *fx_key(void)
{
    struct peer_key *k = NULL;
    char err[256] = "";

    cr_assert_eq(peer_key_load(fx_key_file(), &k, err, sizeof(err)), 0, "%s", err);
    return k;
}

/* A peer server on 127.0.0.1 over a region of its own. */
struct srv {
    struct peer_region r;
    struct peer_server *s;
    char addr[64];
    unsigned port;
};

/* With key (the caller's, kept until srv_stop) or none. */
static inline void srv_start_key(struct srv *x, uint64_t buckets, uint32_t ways,
                                 const struct peer_key *key)
{
    char err[256] = "";

    fx_region(&x->r, buckets, ways);
    for (int tries = 0;; tries++) {
        x->port = free_port();
        snprintf(x->addr, sizeof(x->addr), "127.0.0.1:%u", x->port);
        if (peer_server_start(&x->s, &x->r, x->addr, key, err, sizeof(err)) == 0)
            break;
        cr_assert(tries < 10, "%s", err);
    }
}

static inline void srv_start(struct srv *x, uint64_t buckets, uint32_t ways)
{
    srv_start_key(x, buckets, ways, NULL);
}

static inline void srv_stop(struct srv *x)
{
    peer_server_stop(x->s);
    peer_region_destroy(&x->r);
}

/* The member index owning k on the ring of members[0..n), as every host
 * computes it. */
static inline int fx_owner(char *const *members, size_t n, const struct sfs_key *k)
{
    struct peer_ring r;
    struct peer_hash h = peer_key_hash(k);
    int o;

    cr_assert_eq(peer_ring_build(&r, members, n), 0);
    o = peer_ring_owner(&r, &h);
    peer_ring_free(&r);
    return o;
}

/* A versioned payload: version v in its first 8 bytes, the rest a function
 * of (key, v), so a load can be checked to be one whole version. */
static inline void fx_vfill(const struct sfs_key *k, uint64_t v, uint8_t *buf, size_t len)
{
    uint64_t st = v * 0x9e3779b97f4a7c15ull ^ k->block.b[0] ^ ((uint64_t)k->shard << 32);

    memcpy(buf, &v, 8);
    for (size_t i = 8; i + 8 <= len; i += 8) {
        uint64_t w = tu_rng_next(&st);

        memcpy(buf + i, &w, 8);
    }
}

/* Whether buf (len bytes) is one whole version of k's payload; scratch holds
 * len bytes. */
static inline bool fx_vcheck(const struct sfs_key *k, const uint8_t *buf, size_t len,
                             uint8_t *scratch)
{
    uint64_t v;

    memcpy(&v, buf, 8);
    fx_vfill(k, v, scratch, len);
    return memcmp(buf, scratch, len) == 0;
}

struct host {
    struct sfs_backend *be;
    char addr[64];
};

static inline void write_members(const char *path, struct host *h, int n)
{
    FILE *f = fopen(path, "w");

    cr_assert(f);
    fprintf(f, "# members\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s\n", h[i].addr);
    fclose(f);
}

static inline void open_hosts_geom(struct host *h, int n, const char *members, const char *inner,
                                   const char *geom)
{
    struct sfs_backend_params p = {.shard_size = PAY};
    char spec[512], err[256] = "";
    int e;

    for (int i = 0; i < n; i++)
        snprintf(h[i].addr, sizeof(h[i].addr), "127.0.0.1:%u", free_port());
    write_members(members, h, n);
    for (int i = 0; i < n; i++) {
        snprintf(spec, sizeof(spec), "peer:listen=%s,members=%s,key=%s,%s:%s", h[i].addr, members,
                 fx_key_file(), geom, inner);
        h[i].be = sfs_backend_open(spec, &p, err, sizeof(err), &e);
        cr_assert(h[i].be, "%s: %s", spec, err);
    }
}

static inline void open_hosts(struct host *h, int n, const char *members, const char *inner)
{
    open_hosts_geom(h, n, members, inner, "ways=4,capacity=4M");
}

static inline void wait_writes(struct sfs_backend *be, uint64_t n)
{
    struct sfs_peer_stats st;
    int64_t end = now_ns() + 20000000000ll;

    do {
        cr_assert_eq(sfs_backend_peer_stats(be, &st), 0);
        if (st.writes >= n)
            return;
        usleep(2000);
    } while (now_ns() < end);
    cr_assert_fail("only %llu of %llu writes published", (unsigned long long)st.writes,
                   (unsigned long long)n);
}

#endif /* SHARDFS_PEER_FIXTURE_H */
