/* SPDX-License-Identifier: MIT */
/*
 * attach_i.h - the attach protocol's wire format, shared by the server
 * (server.c) and the client (attach.c), and the fd passing both speak it with
 * (fdpass.c).
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
 * Private to those three files: cache_i.h does not include it (the tests and
 * fuzz targets restate the wire format on purpose, so a drift fails them).
 */
#ifndef SHARDFS_ATTACH_I_H
#define SHARDFS_ATTACH_I_H

#include <stddef.h>
#include <stdint.h>

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

/* Send len bytes of buf and nfds (at most FDS_PER_MSG, else -EINVAL) fds in
 * one message. Returns 0, -EIO on a short send, or -errno. */
int sfs_fds_send(int sock, const void *buf, size_t len, const int *fds, unsigned nfds);
/* Receive exactly len bytes and up to max_fds fds (more are closed, never
 * leaked); returns the fd count, -EBADMSG on a short or truncated message
 * (closing what came), or -errno. */
int sfs_fds_recv(int sock, void *buf, size_t len, int *fds, unsigned max_fds);

#endif /* SHARDFS_ATTACH_I_H */
