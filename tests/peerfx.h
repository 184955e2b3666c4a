/* SPDX-License-Identifier: MIT */
/*
 * peerfx.h - "hosts" for the peer tier's tests through real daemons: NHOST
 * network namespaces (10.77.0.1..3), each with a veth pair to a bridge in a
 * fourth, "switch" namespace, each host running its own shardfs daemon (the
 * real binary, through fsfixture) with its own posix store and -o
 * peer_listen on its own address. Shared by test_peer_hosts.c and
 * test_peer_gate_hosts.c.
 *
 * The namespaces, veth pairs and bridge are created by peerfx_setup() and
 * removed by peerfx_teardown() (ip netns del takes the veth ends with it).
 * Traffic stays inside them. Setup needs root and the `ip` tool; without
 * them the test is skipped with a message saying which is missing. The
 * daemons' mounts live in the test's mount namespace; only their network is
 * the namespace's (the fixture enters it with setns() around the fork of
 * each daemon). The functions assert (Criterion) rather than return errors.
 */
#ifndef SHARDFS_PEERFX_H
#define SHARDFS_PEERFX_H

#include "fsfixture.h"

#include <stdbool.h>
#include <stdint.h>

#define SHARD (64u * 1024)
#define NHOST 3

/* The hosts of the running test (one test at a time: Criterion's --jobs=1). */
struct peerfx {
    bool up;
    char ns[NHOST][32], sw[32], members[128], store[NHOST][128], key[128];
    struct fsfx fx[NHOST];
};
extern struct peerfx H;

/* The suite's .init and .fini: the namespaces, the members file (the first
 * two hosts), an empty store, mount point and log path per host. */
void peerfx_setup(void);
void peerfx_teardown(void);

/* Enter network namespace ns (*saved: the caller's, for peerfx_back_to());
 * 0 or -errno. */
int peerfx_in_netns(const char *ns, int *saved);
void peerfx_back_to(int saved);

/* The members' peer key file (root's, mode 0600), or NULL for none. */
const char *peerfx_key_path(void);

/* The members file: the first n hosts. */
void peerfx_members_first(int n);
/* The members file becomes the first n hosts with its mtime kept (only
 * SIGHUP, not the mtime check, makes a daemon re-read it), and every
 * running daemon is sent SIGHUP; they take it within a second. */
void peerfx_members_change(int n);

/* Host i's daemon with the cache and peer region `sizes` (capacity,
 * peer_capacity, peer_ways). */
void peerfx_start_host_with(int i, const char *sizes);
/* capacity=16M, peer_capacity=8M, peer_ways=4. */
void peerfx_start_host(int i);

/* Shard s of block b (tu_fill: the key's bytes) written through host's
 * mount. */
void peerfx_write_shard(int host, uint64_t b, uint32_t s);
/* Shard s of block b read through host's mount: SHARD bytes, the key's. */
void peerfx_read_exact(int host, uint64_t b, uint32_t s);
/* Blocks b0 .. b0 + n - 1, one shard each, written through host A's mount;
 * returns once A has published them all (the publish is asynchronous). */
void peerfx_publish_blocks(uint64_t b0, unsigned n);
/* The owner of a key among the first nmembers hosts, as every host
 * computes it. */
int peerfx_owner_of(uint64_t b, uint32_t s, int nmembers);

#endif /* SHARDFS_PEERFX_H */
