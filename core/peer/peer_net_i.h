/* SPDX-License-Identifier: MIT */
/*
 * peer_net_i.h - what the peer tier's server (peer_server.c) and client
 * (peer_client.c) share (peer_net.c): addresses, and blocking socket I/O
 * under a deadline.
 */
#ifndef SHARDFS_PEER_NET_I_H
#define SHARDFS_PEER_NET_I_H

#include "peer_i.h"

#include <netdb.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PEER_CONNS_MAX      64 /* live connections a server serves */
#define PEER_CONNS_PER_HOST 8  /* ... from one address */
#define PEER_DOWN_MS        1000

int64_t peer_net_mono_ns(void);
/* Resolve "host:port" ([v6]:port accepted): 0 or -EINVAL / -EHOSTUNREACH. */
int peer_resolve(const char *addr, bool passive, struct addrinfo **res);
/* poll fd for ev until deadline_ns (CLOCK_MONOTONIC; 0: return at once):
 * 0, -ETIMEDOUT or -errno. */
int peer_wait_fd(int fd, short ev, int64_t deadline_ns);
/* All n bytes, under deadline_ns; with deadline 0 (the server) under the
 * socket timeouts, giving up on *stop or a stalled message. 0 or -errno. */
int peer_send_all(int fd, const void *buf, size_t n, int64_t deadline_ns, const _Atomic bool *stop);
int peer_recv_all(int fd, void *buf, size_t n, int64_t deadline_ns, const _Atomic bool *stop,
                  bool started);

#endif /* SHARDFS_PEER_NET_I_H */
