/* SPDX-License-Identifier: MIT */
/*
 * attach_wire.h - the attach protocol's messages as docs/attach.md
 * documents them, for the tests that speak it (test_attach.c, and the
 * fuzz targets fuzz_attach_hello.c and fuzz_attach_welcome.c). Restated
 * here on purpose, not taken from core/attach/attach_i.h: the tests hold the
 * server and the client to the documented format, and a core that drifts
 * from it fails them.
 */
#ifndef SHARDFS_TESTS_ATTACH_WIRE_H
#define SHARDFS_TESTS_ATTACH_WIRE_H

#include <stdint.h>

#define HELLO_MAGIC   0x6f6c6c6548534653ull /* "SFSHello" */
#define WELCOME_MAGIC 0x656d6f6c6557534full
#define PROTO_VERSION 2u

struct hello {
    uint64_t magic;
    uint32_t proto;
    uint32_t flags; /* 1: the data plane too */
    uint64_t format;
    int32_t device_id;
    uint32_t pad;
};

struct welcome {
    uint64_t magic;
    uint32_t proto;
    int32_t status;
    uint64_t format;
    uint64_t ctl_size;
    uint32_t nsegments;
    uint32_t nfds;
    uint32_t proc;
    uint32_t proc_gen;
};

_Static_assert(sizeof(struct hello) == 32, "hello is 32 bytes on the wire");
_Static_assert(sizeof(struct welcome) == 48, "welcome is 48 bytes on the wire");

#endif /* SHARDFS_TESTS_ATTACH_WIRE_H */
