/* SPDX-License-Identifier: MIT */
/*
 * peer_tier.c - get, set and exists against a key's owner host: the local
 * region when the owner is this host (or no members are listed), else the
 * owner's region over the wire (peer_net.c), every answer judged here by
 * peer_slot_matches. Callers hold no lock; these take ring_lock for reading
 * and the member's connection lock for the calls.
 */
#include "peer_backend_i.h"

#include <errno.h>
#include <stdlib.h>

/* --- get / set against the owner (caller holds ring_lock for reading) --- */

void peer_count_miss(struct peer_backend *pb, enum peer_miss m)
{
    CTR_ADD(pb, misses, 1);
    switch (m) {
    case PEER_MISS_TORN:
    case PEER_MISS_CHECKSUM:
        CTR_ADD(pb, clean_torn, 1);
        break;
    case PEER_MISS_OTHER_KEY:
        CTR_ADD(pb, clean_other_key, 1);
        break;
    case PEER_MISS_LENGTH:
        CTR_ADD(pb, clean_length, 1);
        break;
    case PEER_MISS_UNREACHABLE:
        CTR_ADD(pb, clean_unreachable, 1);
        break;
    default:
        break;
    }
}

static enum peer_miss remote_get(struct peer_backend *pb, struct peer_member *m, const char *name,
                                 const struct peer_hash *h, void *buf, uint32_t len)
{
    struct peer_slot_hdr hdrs[PEER_WAYS_MAX];
    uint64_t after[PEER_WAYS_MAX];
    enum peer_miss best = PEER_MISS_EMPTY;
    struct peer_conn *c = &m->conn;
    uint64_t bucket;

    pthread_mutex_lock(&m->lock);
    if (peer_conn_open(c, name, pb->o.deadline_ms) < 0 || len > c->g.max_payload) {
        enum peer_miss r = c->fd < 0 ? PEER_MISS_UNREACHABLE : PEER_MISS_LENGTH;

        pthread_mutex_unlock(&m->lock);
        return r;
    }
    bucket = peer_bucket_of(h, c->g.num_buckets);
    CTR_ADD(pb, round_trips, 1);
    if (peer_conn_read_hdrs(c, name, pb->o.deadline_ms, bucket, hdrs, after) < 0) {
        pthread_mutex_unlock(&m->lock);
        return PEER_MISS_UNREACHABLE;
    }
    CTR_ADD(pb, bytes_read, (uint64_t)c->g.ways * (PEER_HDR_SIZE + 8));
    for (uint32_t w = 0; w < c->g.ways; w++) {
        /* Relaxed: hdrs are a private copy off the wire. */
        uint64_t before = atomic_load_explicit(&hdrs[w].seq, memory_order_relaxed);
        enum peer_miss r = peer_slot_matches(&hdrs[w], before, after[w], h, len, NULL);
        struct peer_slot_hdr hdr;
        uint64_t a2;

        if (r == PEER_MISS_EMPTY || r == PEER_MISS_OTHER_KEY) {
            if (best == PEER_MISS_EMPTY)
                best = r;
            continue;
        }
        if (r == PEER_HIT && !buf) {
            pthread_mutex_unlock(&m->lock);
            return PEER_HIT; /* exists: the header names the key and length */
        }
        if (r == PEER_HIT) {
            CTR_ADD(pb, round_trips, 1);
            if (peer_conn_read_slot(c, name, pb->o.deadline_ms, bucket, w, len, &hdr, &a2, buf) <
                0) {
                pthread_mutex_unlock(&m->lock);
                return PEER_MISS_UNREACHABLE;
            }
            CTR_ADD(pb, bytes_read, PEER_HDR_SIZE + 8 + (uint64_t)len);
            /* Relaxed: a private copy. */
            before = atomic_load_explicit(&hdr.seq, memory_order_relaxed);
            r = peer_slot_matches(&hdr, before, a2, h, len, buf);
            if (r == PEER_HIT) {
                pthread_mutex_unlock(&m->lock);
                return PEER_HIT;
            }
        }
        best = r;
    }
    pthread_mutex_unlock(&m->lock);
    return best;
}

enum peer_miss peer_tier_get(struct peer_backend *pb, const struct sfs_key *key, void *buf,
                             uint32_t len)
{
    struct peer_hash h = peer_key_hash(key);
    enum peer_miss r;
    int owner;

    peer_members_maybe_reload(pb);
    pthread_rwlock_rdlock(&pb->ring_lock);
    owner = peer_ring_owner(&pb->ring, &h);
    if (owner < 0 || owner == pb->self)
        r = peer_local_get(&pb->region, &h, buf, len);
    else
        r = remote_get(pb, &pb->mem[owner], pb->ring.members[owner], &h, buf, len);
    pthread_rwlock_unlock(&pb->ring_lock);
    return r;
}

static int remote_set(struct peer_backend *pb, struct peer_member *m, const char *name,
                      const struct peer_hash *h, const void *buf, uint32_t len)
{
    struct peer_slot_hdr hdrs[PEER_WAYS_MAX];
    uint64_t after[PEER_WAYS_MAX], found;
    struct peer_conn *c = &m->conn;
    int ret = -EAGAIN;

    pthread_mutex_lock(&m->lock);
    if ((ret = peer_conn_open(c, name, pb->o.deadline_ms)) < 0)
        goto out;
    if (len > c->g.max_payload) {
        ret = -EMSGSIZE;
        goto out;
    }
    /* Read, choose, write conditionally on the seq read; once more if
     * another writer moved it; then report (lost_writes). */
    for (int attempt = 0; attempt < 2; attempt++) {
        uint64_t bucket = peer_bucket_of(h, c->g.num_buckets);
        int w;

        CTR_ADD(pb, round_trips, 1);
        if ((ret = peer_conn_read_hdrs(c, name, pb->o.deadline_ms, bucket, hdrs, after)) < 0)
            goto out;
        for (uint32_t i = 0; i < c->g.ways; i++)
            /* Relaxed: private copies. */
            if (atomic_load_explicit(&hdrs[i].seq, memory_order_relaxed) != after[i])
                after[i] |= 1;
        w = peer_pick_way(hdrs, after, c->g.ways, h);
        if (w < 0) {
            ret = -EAGAIN;
            continue;
        }
        CTR_ADD(pb, round_trips, 1);
        ret = peer_conn_write(c, name, pb->o.deadline_ms, bucket, (uint32_t)w, after[w], h, buf,
                              len, peer_realtime_ns(), &found);
        if (ret != -EAGAIN)
            break;
    }
out:
    pthread_mutex_unlock(&m->lock);
    return ret;
}

void peer_tier_set(struct peer_backend *pb, const struct sfs_key *key, const void *buf,
                   uint32_t len)
{
    struct peer_hash h = peer_key_hash(key);
    int owner, ret;

    peer_members_maybe_reload(pb);
    pthread_rwlock_rdlock(&pb->ring_lock);
    owner = peer_ring_owner(&pb->ring, &h);
    if (owner < 0 || owner == pb->self)
        ret = peer_local_set(&pb->region, &h, buf, len);
    else
        ret = remote_set(pb, &pb->mem[owner], pb->ring.members[owner], &h, buf, len);
    pthread_rwlock_unlock(&pb->ring_lock);
    if (ret == 0) {
        CTR_ADD(pb, writes, 1);
        CTR_ADD(pb, bytes_written, len);
    } else if (ret == -EAGAIN) {
        CTR_ADD(pb, lost_writes, 1);
    }
}

/*
 * Batch exists in the peer tier, headers only: for each key with
 * present[i] false, one round trip per owner host per PEER_BATCH_MAX keys
 * (READ_HDRS_MULTI), the local region read directly. A member that does
 * not answer leaves its keys absent.
 */
/* One READ_HDRS_MULTI for k keys (keys[idx[a]], in buckets[a]) of one
 * member (m->lock held, connection open); marks the ones found. false when
 * the member did not answer. */
static bool exists_flush(struct peer_backend *pb, struct peer_member *m, const char *name,
                         const struct sfs_key *keys, const size_t *idx, const uint64_t *buckets,
                         uint32_t k, struct peer_slot_hdr *hdrs, uint64_t *after, bool *present)
{
    uint32_t len = (uint32_t)pb->be.shard_size, ways;

    CTR_ADD(pb, round_trips, 1);
    if (peer_conn_read_hdrs_multi(&m->conn, name, pb->o.deadline_ms, buckets, k, hdrs, after) < 0)
        return false;
    ways = m->conn.g.ways;
    CTR_ADD(pb, bytes_read, (uint64_t)k * ways * (PEER_HDR_SIZE + 8));
    for (uint32_t a = 0; a < k; a++) {
        struct peer_hash h = peer_key_hash(&keys[idx[a]]);

        for (uint32_t w = 0; w < ways && !present[idx[a]]; w++) {
            struct peer_slot_hdr *x = &hdrs[a * ways + w];
            /* Relaxed: a private copy off the wire. */
            uint64_t before = atomic_load_explicit(&x->seq, memory_order_relaxed);

            present[idx[a]] =
                peer_slot_matches(x, before, after[a * ways + w], &h, len, NULL) == PEER_HIT;
        }
    }
    return true;
}

void peer_tier_has(struct peer_backend *pb, const struct sfs_key *keys, size_t n, bool *present)
{
    size_t *idx = malloc(PEER_BATCH_MAX * sizeof(*idx));
    struct peer_slot_hdr *hdrs = malloc((size_t)PEER_BATCH_MAX * PEER_WAYS_MAX * sizeof(*hdrs));
    uint64_t *after = malloc((size_t)PEER_BATCH_MAX * PEER_WAYS_MAX * sizeof(*after));
    uint64_t buckets[PEER_BATCH_MAX];
    uint32_t len = (uint32_t)pb->be.shard_size;
    bool *done = calloc(n ? n : 1, sizeof(*done));

    if (!idx || !hdrs || !after || !done)
        goto out;
    peer_members_maybe_reload(pb);
    pthread_rwlock_rdlock(&pb->ring_lock);
    for (size_t i = 0; i < n; i++) {
        struct peer_hash h;
        int owner;

        if (present[i] || done[i])
            continue;
        h = peer_key_hash(&keys[i]);
        owner = peer_ring_owner(&pb->ring, &h);
        if (owner < 0 || owner == pb->self) {
            present[i] = peer_local_get(&pb->region, &h, NULL, len) == PEER_HIT;
            done[i] = true;
            continue;
        }
        /* Gather this owner's keys from i on, PEER_BATCH_MAX at a time. */
        struct peer_member *m = &pb->mem[owner];
        const char *name = pb->ring.members[owner];
        uint32_t k = 0;

        pthread_mutex_lock(&m->lock);
        bool open = peer_conn_open(&m->conn, name, pb->o.deadline_ms) == 0;

        for (size_t j = i; j < n; j++) {
            struct peer_hash hj;

            if (present[j] || done[j])
                continue;
            hj = peer_key_hash(&keys[j]);
            if (peer_ring_owner(&pb->ring, &hj) != owner)
                continue;
            done[j] = true;
            if (!open || len > m->conn.g.max_payload)
                continue; /* absent: unreachable, or too long for its slots */
            idx[k] = j;
            buckets[k++] = peer_bucket_of(&hj, m->conn.g.num_buckets);
            if (k == PEER_BATCH_MAX) {
                open = exists_flush(pb, m, name, keys, idx, buckets, k, hdrs, after, present);
                k = 0;
            }
        }
        if (k && open)
            exists_flush(pb, m, name, keys, idx, buckets, k, hdrs, after, present);
        pthread_mutex_unlock(&m->lock);
    }
    pthread_rwlock_unlock(&pb->ring_lock);
out:
    free(idx);
    free(hdrs);
    free(after);
    free(done);
}
