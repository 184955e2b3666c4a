/* SPDX-License-Identifier: MIT */
/*
 * peer_fixture.h - what the peer tier's loopback tests share: free ports,
 * and "hosts" (peer backends over their own inner stores) on 127.0.0.1
 * with one members file.
 */
#ifndef SHARDFS_PEER_FIXTURE_H
#define SHARDFS_PEER_FIXTURE_H

#include "testutil.h"

#include <shardfs/backend.h>

#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
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
        snprintf(spec, sizeof(spec), "peer:listen=%s,members=%s,%s:%s", h[i].addr, members, geom,
                 inner);
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
