/* SPDX-License-Identifier: MIT */
/*
 * peer_backend_i.h - the peer backend's state, shared by its rooms:
 * backend_peer.c (the chain: load/dump queues, publish, open/close),
 * peer_tier.c (get, set and exists against a key's owner), peer_members.c
 * (the members file and the ring) and peer_spec.c (the spec's options).
 */
#ifndef SHARDFS_PEER_BACKEND_I_H
#define SHARDFS_PEER_BACKEND_I_H

#include "backend_i.h"
#include "peer_i.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#define PEER_WORKERS     4
#define PEER_PUBLISH_MAX 64
#define PEER_DEADLINE_MS 200u
#define PEER_SHARD_PROBE 4096u /* shard_count: most shards probed in the peer tier */

struct peer_member {
    pthread_mutex_t lock; /* one call at a time on conn */
    struct peer_conn conn;
};

struct pub {
    struct pub *next;
    struct sfs_key key;
    uint32_t len;
    uint8_t data[];
};

struct peer_backend {
    struct sfs_backend be;
    struct sfs_backend *inner;
    struct sfs_peer_opts o;
    struct peer_region region;
    struct peer_server *srv;
    struct peer_key *key; /* the members' (NULL: none, loopback only); read at open */

    /* Membership: ring, self and members are replaced whole under ring_lock
     * (write) and read under it (read). */
    pthread_rwlock_t ring_lock;
    struct peer_ring ring;
    struct peer_member *mem; /* ring.nmembers entries */
    int self;                /* index of listen in the ring, or -1 */
    struct timespec members_mtime;
    int64_t members_checked_ns;
    pthread_mutex_t reload_lock;
    _Atomic bool reload_asked; /* sfs_backend_peer_reload: re-read, mtime or not */

    /* Load queue and publish queue, one lock. */
    pthread_mutex_t qlock;
    pthread_cond_t qcond, pcond;
    struct sfs_io *qhead, *qtail; /* via priv[0] */
    struct pub *phead, *ptail;
    unsigned npub;
    bool stop;
    pthread_t workers[PEER_WORKERS], publisher;

    struct peer_ctrs {
        _Atomic uint64_t hits, misses, clean_torn, clean_other_key, clean_length, clean_unreachable,
            bytes_read, bytes_written, writes, lost_writes, round_trips;
    } st; /* relaxed counters (CTR_ADD) */
    /* Get latency: bucket counts, then the sum in ns (relaxed fetch_adds). */
    _Atomic uint64_t get_hist[SFS_HIST_BUCKETS + 1];
};

/* Relaxed: counters read by /stats, no ordering with anything. */
#define CTR_ADD(pb, f, n) atomic_fetch_add_explicit(&(pb)->st.f, (n), memory_order_relaxed)

static inline int64_t peer_mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline uint64_t peer_realtime_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* --- peer_members.c --- */

/* Read the members file, build the ring, and swap it in (with fresh
 * connections) under ring_lock; renews the server's allowed hosts. */
int peer_members_load(struct peer_backend *pb);
/* Re-read the members file when its mtime changed (at most once a second). */
void peer_members_maybe_reload(struct peer_backend *pb);
void peer_members_free(struct peer_member *m, size_t n);

/* --- peer_tier.c --- */

void peer_count_miss(struct peer_backend *pb, enum peer_miss m);
/* Read each key from its owner into bufs[i] (lens[i] bytes): res[i] is
 * PEER_HIT or why not (bufs[i] then holds no promised bytes). One round
 * trip per owner host, all owners at once. Not counted as hits/misses. */
void peer_tier_get_batch(struct peer_backend *pb, const struct sfs_key *keys, size_t n,
                         void *const *bufs, const uint32_t *lens, enum peer_miss *res);
enum peer_miss peer_tier_get(struct peer_backend *pb, const struct sfs_key *key, void *buf,
                             uint32_t len);
/* Publish each key to its owner: res[i] 0, -EAGAIN (lost twice to other
 * writers), -EHOSTUNREACH, -EMSGSIZE or -ENOMEM. Counted: writes,
 * bytes_written, lost_writes. */
void peer_tier_set_batch(struct peer_backend *pb, const struct sfs_key *keys, size_t n,
                         const void *const *bufs, const uint32_t *lens, int *res);
void peer_tier_set(struct peer_backend *pb, const struct sfs_key *key, const void *buf,
                   uint32_t len);
/* For each key with present[i] false, whether the peer tier has it with
 * length len (headers only). */
void peer_tier_has(struct peer_backend *pb, const struct sfs_key *keys, size_t n, uint32_t len,
                   bool *present);

#endif /* SHARDFS_PEER_BACKEND_I_H */
