/* SPDX-License-Identifier: MIT */
/*
 * backend_peer.c - the peer tier as a backend wrapping another:
 * cache -> peer -> posix (design.md, section 11; docs/peer.md).
 *
 *   peer:listen=ADDR:PORT,members=FILE,ways=N,capacity=SIZE[,slot=SIZE]
 *        [,deadline_ms=N][,key=FILE]:<inner spec>
 *
 * key: the members' key file (peer_auth_i.h): the server serves and the
 * client talks only to holders of the key. Without one the tier listens
 * only on a loopback address (one host, whose every local user is then
 * trusted; docs/security.md).
 *
 * Load: a pool of PEER_WORKERS threads takes each request from a queue (a
 * submitter never waits on the network). The key's owner comes from the
 * ring over the members file; the owner's region is read (the local region
 * directly, a remote one with a header read of the bucket, then the payload
 * of the one way that names the key, under peer_slot_matches). A hit
 * completes the request; any miss (counted, with its reason) forwards it to
 * the inner backend, and what the inner loads is copied onto the publish
 * queue (bounded: PEER_PUBLISH_MAX entries, a full queue drops the copy, the
 * reader never waits) that one thread writes to the owner.
 * Dump: the inner dump first; when it succeeds the shard is published the
 * same way (write-through to both). exists, shard_count: the inner, then the
 * peer tier for what the inner has not. touch, remove, list: the inner.
 *
 * The members file is re-read on sfs_backend_peer_reload (the daemon's
 * SIGHUP) and when its mtime changes (checked at most once a second, on use
 * and by the idle publisher thread). A member that does not answer within
 * deadline_ms is a clean miss ("unreachable") and is skipped for a second
 * (peer_client.c).
 */

#include "peer_backend_i.h"
#include "peer_net_i.h"
#include "util_i.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const struct sfs_backend_ops peer_ops;

/* --- publish queue --- */

static void publish(struct peer_backend *pb, const struct sfs_key *key, const void *buf,
                    uint32_t len)
{
    struct pub *p;

    if (len > pb->region.g.max_payload)
        return;
    pthread_mutex_lock(&pb->qlock);
    if (pb->npub >= PEER_PUBLISH_MAX || pb->stop) {
        pthread_mutex_unlock(&pb->qlock);
        return; /* bounded: a full queue drops, the reader never waits */
    }
    pb->npub++;
    pthread_mutex_unlock(&pb->qlock);
    p = malloc(sizeof(*p) + len);
    pthread_mutex_lock(&pb->qlock);
    if (!p) {
        pb->npub--;
    } else {
        p->next = NULL;
        p->key = *key;
        p->len = len;
        memcpy(p->data, buf, len);
        if (pb->ptail)
            pb->ptail->next = p;
        else
            pb->phead = p;
        pb->ptail = p;
        pthread_cond_signal(&pb->pcond);
    }
    pthread_mutex_unlock(&pb->qlock);
}

static void *publisher_main(void *arg)
{
    struct peer_backend *pb = arg;

    pthread_mutex_lock(&pb->qlock);
    for (;;) {
        struct pub *p = pb->phead;

        if (!p) {
            struct timespec ts;

            if (pb->stop)
                break;
            /* Idle: look at the members file once a second, so that a server
             * nobody asks still learns of a joiner (and lets it connect). */
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            if (pthread_cond_timedwait(&pb->pcond, &pb->qlock, &ts) == ETIMEDOUT) {
                pthread_mutex_unlock(&pb->qlock);
                peer_members_maybe_reload(pb);
                pthread_mutex_lock(&pb->qlock);
            }
            continue;
        }
        /* What is queued, PEER_BATCH_MAX at most, as one batch. */
        struct pub *batch[PEER_BATCH_MAX];
        struct sfs_key keys[PEER_BATCH_MAX];
        const void *bufs[PEER_BATCH_MAX];
        uint32_t lens[PEER_BATCH_MAX];
        int res[PEER_BATCH_MAX];
        size_t k = 0;

        for (; p && k < PEER_BATCH_MAX; p = p->next) {
            batch[k] = p;
            keys[k] = p->key;
            bufs[k] = p->data;
            lens[k++] = p->len;
        }
        pb->phead = p;
        if (!pb->phead)
            pb->ptail = NULL;
        pthread_mutex_unlock(&pb->qlock);
        peer_tier_set_batch(pb, keys, k, bufs, lens, res);
        for (size_t i = 0; i < k; i++)
            free(batch[i]);
        pthread_mutex_lock(&pb->qlock);
        pb->npub -= (unsigned)k;
        pthread_cond_broadcast(&pb->pcond);
    }
    pthread_mutex_unlock(&pb->qlock);
    return NULL;
}

/* --- load and dump --- */

struct shadow {
    struct sfs_io io; /* what the inner sees */
    struct sfs_io *outer;
    struct peer_backend *pb;
    bool dump;
};

static void shadow_done(struct sfs_io *sio)
{
    struct shadow *sh = sio->arg;
    struct sfs_io *outer = sh->outer;

    outer->result = sio->result;
    if (sio->result == (int)outer->len)
        publish(sh->pb, &outer->key, outer->buf, outer->len);
    free(sh);
    outer->done(outer);
}

static void forward(struct peer_backend *pb, struct sfs_io *io, bool dump)
{
    struct shadow *sh = calloc(1, sizeof(*sh));
    struct sfs_io *sio;
    int ret;

    if (!sh) {
        io->result = -ENOMEM;
        io->done(io);
        return;
    }
    sh->outer = io;
    sh->pb = pb;
    sh->dump = dump;
    sh->io.key = io->key;
    sh->io.buf = io->buf;
    sh->io.len = io->len;
    sh->io.done = shadow_done;
    sh->io.arg = sh;
    sio = &sh->io;
    ret = dump ? sfs_be_dump(pb->inner, &sio, 1) : sfs_be_load(pb->inner, &sio, 1);
    if (ret < 0) {
        free(sh);
        io->result = ret;
        io->done(io);
    }
}

const char sfs_peer_io_tag = 'p';

/* Each of the n keys of one get batch waited ns for it. */
static void observe_get(struct peer_backend *pb, int64_t ns, size_t n)
{
    if (ns < 0)
        ns = 0;
    /* Relaxed: counters read by /stats. */
    atomic_fetch_add_explicit(&pb->get_hist[sfs_hist_bucket(ns)], n, memory_order_relaxed);
    atomic_fetch_add_explicit(&pb->get_hist[SFS_HIST_BUCKETS], (uint64_t)ns * n,
                              memory_order_relaxed);
}

static void *worker_main(void *arg)
{
    struct peer_backend *pb = arg;

    pthread_mutex_lock(&pb->qlock);
    for (;;) {
        struct sfs_io *io = pb->qhead, *batch[PEER_BATCH_MAX];
        struct sfs_key keys[PEER_BATCH_MAX];
        void *bufs[PEER_BATCH_MAX];
        uint32_t lens[PEER_BATCH_MAX];
        enum peer_miss res[PEER_BATCH_MAX];
        size_t k = 0;

        if (!io) {
            if (pb->stop)
                break;
            pthread_cond_wait(&pb->qcond, &pb->qlock);
            continue;
        }
        /* What is queued, PEER_BATCH_MAX at most, as one batch: one round
         * trip per owner host. */
        for (; io && k < PEER_BATCH_MAX; io = io->priv[0]) {
            batch[k] = io;
            keys[k] = io->key;
            bufs[k] = io->buf;
            lens[k++] = io->len;
        }
        pb->qhead = io;
        if (!pb->qhead)
            pb->qtail = NULL;
        pthread_mutex_unlock(&pb->qlock);
        int64_t t0 = peer_mono_ns();

        peer_tier_get_batch(pb, keys, k, bufs, lens, res);
        observe_get(pb, peer_mono_ns() - t0, k);
        for (size_t i = 0; i < k; i++) {
            if (res[i] == PEER_HIT) {
                CTR_ADD(pb, hits, 1);
                batch[i]->result = (int)batch[i]->len;
                batch[i]->priv[3] = (void *)&sfs_peer_io_tag; /* sfs_io_from_peer() */
                batch[i]->done(batch[i]);
            } else {
                peer_count_miss(pb, res[i]);
                forward(pb, batch[i], false);
            }
        }
        pthread_mutex_lock(&pb->qlock);
    }
    pthread_mutex_unlock(&pb->qlock);
    return NULL;
}

static int peer_load(struct sfs_backend *be, struct sfs_io **ios, size_t n)
{
    struct peer_backend *pb = (struct peer_backend *)be;

    pthread_mutex_lock(&pb->qlock);
    for (size_t i = 0; i < n; i++) {
        ios[i]->priv[0] = NULL;
        if (pb->qtail)
            pb->qtail->priv[0] = ios[i];
        else
            pb->qhead = ios[i];
        pb->qtail = ios[i];
    }
    pthread_cond_broadcast(&pb->qcond);
    pthread_mutex_unlock(&pb->qlock);
    return (int)n;
}

static int peer_dump(struct sfs_backend *be, struct sfs_io **ios, size_t n)
{
    struct peer_backend *pb = (struct peer_backend *)be;

    for (size_t i = 0; i < n; i++)
        forward(pb, ios[i], true);
    return (int)n;
}

static int peer_exists(struct sfs_backend *be, const struct sfs_key *keys, size_t n, bool *present)
{
    struct peer_backend *pb = (struct peer_backend *)be;
    int ret = sfs_be_exists(pb->inner, keys, n, present);

    if (ret < 0)
        return ret;
    peer_tier_has(pb, keys, n, (uint32_t)pb->be.shard_size, present);
    return 0;
}

/* The inner's: the peer tier holds copies, the store the versions. */
static int peer_scan(struct sfs_backend *be, sfs_scan_fn *fn, void *arg)
{
    return sfs_be_scan(((struct peer_backend *)be)->inner, fn, arg);
}

static int peer_evict(struct sfs_backend *be, const struct sfs_block_id *block,
                      const struct sfs_block_stamp *expect, uint64_t *freed)
{
    return sfs_be_evict(((struct peer_backend *)be)->inner, block, expect, freed);
}

static int peer_lease(struct sfs_backend *be, const char *role, uint32_t ttl_ms)
{
    return sfs_be_lease(((struct peer_backend *)be)->inner, role, ttl_ms);
}

static int peer_stamp(struct sfs_backend *be, const struct sfs_block_id *block,
                      struct sfs_block_stamp *out)
{
    return sfs_be_stamp(((struct peer_backend *)be)->inner, block, out);
}

/* The inner's count, else the shards 0, 1, ... the peer tier has in a row,
 * PEER_BATCH_MAX at a time (one round trip per owner host per batch). */
static int peer_shard_count(struct sfs_backend *be, const struct sfs_block_id *block)
{
    struct peer_backend *pb = (struct peer_backend *)be;
    int ret = sfs_be_shard_count(pb->inner, block);
    struct sfs_key keys[PEER_BATCH_MAX];
    bool present[PEER_BATCH_MAX];
    uint32_t k = 0;

    if (ret != -ENOENT)
        return ret;
    while (k < PEER_SHARD_PROBE) {
        uint32_t i;

        for (i = 0; i < PEER_BATCH_MAX; i++) {
            keys[i] = (struct sfs_key){.block = *block, .shard = k + i};
            present[i] = false;
        }
        peer_tier_has(pb, keys, PEER_BATCH_MAX, (uint32_t)pb->be.shard_size, present);
        for (i = 0; i < PEER_BATCH_MAX && present[i]; i++)
            ;
        k += i;
        if (i < PEER_BATCH_MAX)
            break;
    }
    return k ? (int)k : -ENOENT;
}

static int peer_touch(struct sfs_backend *be, const struct sfs_block_id *b, size_t n)
{
    return sfs_be_touch(((struct peer_backend *)be)->inner, b, n);
}

static int peer_remove(struct sfs_backend *be, const struct sfs_key *key)
{
    return sfs_be_remove(((struct peer_backend *)be)->inner, key);
}

static int peer_list(struct sfs_backend *be, int (*fn)(const struct sfs_block_id *, void *),
                     void *arg)
{
    return sfs_be_list(((struct peer_backend *)be)->inner, fn, arg);
}

static void peer_close(struct sfs_backend *be)
{
    struct peer_backend *pb = (struct peer_backend *)be;

    pthread_mutex_lock(&pb->qlock);
    pb->stop = true;
    pthread_cond_broadcast(&pb->qcond);
    pthread_cond_broadcast(&pb->pcond);
    pthread_mutex_unlock(&pb->qlock);
    for (int i = 0; i < PEER_WORKERS; i++)
        pthread_join(pb->workers[i], NULL);
    pthread_join(pb->publisher, NULL);
    peer_server_stop(pb->srv);
    sfs_be_close(pb->inner);
    peer_members_free(pb->mem, pb->ring.nmembers);
    peer_ring_free(&pb->ring);
    peer_region_destroy(&pb->region);
    peer_key_free(pb->key);
    pthread_rwlock_destroy(&pb->ring_lock);
    free(pb);
}

/* Whether every address addr ("host:port") names is a loopback one. */
static bool loopback_only(const char *addr)
{
    struct addrinfo *res = NULL;
    bool lo = true;

    if (peer_resolve(addr, true, &res) < 0)
        return false;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET)
            lo &= (ntohl(((struct sockaddr_in *)ai->ai_addr)->sin_addr.s_addr) >> 24) == 127;
        else if (ai->ai_family == AF_INET6)
            lo &= IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr);
        else
            lo = false;
    }
    freeaddrinfo(res);
    return lo;
}

static const struct sfs_backend_ops peer_ops = {
    .name = "peer",
    .load = peer_load,
    .dump = peer_dump,
    .exists = peer_exists,
    .shard_count = peer_shard_count,
    .stamp = peer_stamp,
    .scan = peer_scan,
    .evict = peer_evict,
    .lease = peer_lease,
    .touch = peer_touch,
    .remove = peer_remove,
    .list = peer_list,
    .close = peer_close,
};

struct sfs_backend *sfs_peer_wrap(struct sfs_backend *inner, const struct sfs_peer_opts *o,
                                  char *errbuf, size_t errlen, int *err)
{
    struct peer_backend *pb = calloc(1, sizeof(*pb));
    struct peer_geometry g;
    int ret, nw = 0;

    if (!pb) {
        *err = -ENOMEM;
        return NULL;
    }
    pb->be.ops = &peer_ops;
    pb->be.shard_size = inner->shard_size;
    pb->inner = inner;
    pb->o = *o;
    pb->self = -1;
    pb->region.memfd = -1;
    if (!pb->o.slot)
        pb->o.slot =
            (uint32_t)(inner->shard_size < PEER_PAYLOAD_MAX ? inner->shard_size : PEER_PAYLOAD_MAX);
    pthread_rwlock_init(&pb->ring_lock, NULL);
    pthread_mutex_init(&pb->reload_lock, NULL);
    pthread_mutex_init(&pb->qlock, NULL);
    pthread_cond_init(&pb->qcond, NULL);
    pthread_cond_init(&pb->pcond, NULL);
    if (pb->o.key[0]) {
        ret = peer_key_load(pb->o.key, &pb->key, errbuf, errlen);
        if (ret < 0)
            goto fail;
    } else if (!loopback_only(pb->o.listen)) {
        sfs_errf(errbuf, errlen,
                 "peer: listen=%s is not a loopback address: members must share a key= file",
                 pb->o.listen);
        ret = -EINVAL;
        goto fail;
    }
    ret = peer_geometry_make(o->capacity, pb->o.ways, pb->o.slot, &g);
    if (ret < 0) {
        sfs_errf(errbuf, errlen, "peer spec: capacity=%llu holds no bucket of %u ways x %u bytes",
                 (unsigned long long)o->capacity, pb->o.ways, pb->o.slot);
        goto fail;
    }
    ret = peer_region_create(&pb->region, &g);
    if (ret < 0) {
        sfs_errf(errbuf, errlen, "peer: slot region of %llu bytes: %s",
                 (unsigned long long)(g.num_buckets * g.ways * g.stride), strerror(-ret));
        goto fail;
    }
    if (pb->o.members[0]) {
        ret = peer_members_load(pb);
        if (ret < 0) {
            sfs_errf(errbuf, errlen, "peer: members file '%s': %s", pb->o.members, strerror(-ret));
            goto fail;
        }
    }
    ret = peer_server_start(&pb->srv, &pb->region, pb->o.listen, pb->key, errbuf, errlen);
    if (ret < 0)
        goto fail;
    if (pb->ring.nmembers)
        peer_server_allow(pb->srv, pb->ring.members, pb->ring.nmembers);
    for (; nw < PEER_WORKERS; nw++)
        if ((ret = -pthread_create(&pb->workers[nw], NULL, worker_main, pb)) < 0)
            goto fail_threads;
    if ((ret = -pthread_create(&pb->publisher, NULL, publisher_main, pb)) < 0)
        goto fail_threads;
    return &pb->be;
fail_threads:
    pthread_mutex_lock(&pb->qlock);
    pb->stop = true;
    pthread_cond_broadcast(&pb->qcond);
    pthread_mutex_unlock(&pb->qlock);
    while (nw--)
        pthread_join(pb->workers[nw], NULL);
    peer_server_stop(pb->srv);
fail:
    peer_members_free(pb->mem, pb->ring.nmembers);
    peer_ring_free(&pb->ring);
    peer_region_destroy(&pb->region);
    peer_key_free(pb->key);
    free(pb);
    *err = ret;
    return NULL;
}

int sfs_backend_peer_hist(struct sfs_backend *be, struct sfs_hist *out)
{
    struct peer_backend *pb = (struct peer_backend *)be;

    if (!be || be->ops != &peer_ops)
        return -ENOENT;
    /* Relaxed: a snapshot of counters. */
    for (int b = 0; b < SFS_HIST_BUCKETS; b++)
        out->bucket[b] = atomic_load_explicit(&pb->get_hist[b], memory_order_relaxed);
    out->sum_ns = atomic_load_explicit(&pb->get_hist[SFS_HIST_BUCKETS], memory_order_relaxed);
    return 0;
}

int sfs_backend_peer_stats(struct sfs_backend *be, struct sfs_peer_stats *out)
{
    struct peer_backend *pb = (struct peer_backend *)be;

    if (!be || be->ops != &peer_ops)
        return -ENOENT;
        /* Relaxed: a snapshot of counters. */
#define RD(f) out->f = atomic_load_explicit(&pb->st.f, memory_order_relaxed)
    RD(hits);
    RD(misses);
    RD(clean_torn);
    RD(clean_other_key);
    RD(clean_length);
    RD(clean_unreachable);
    RD(bytes_read);
    RD(bytes_written);
    RD(writes);
    RD(lost_writes);
    RD(round_trips);
#undef RD
    return 0;
}

static uint32_t *lens_of(uint32_t len, size_t n)
{
    uint32_t *v = calloc(n ? n : 1, sizeof(*v));

    for (size_t i = 0; v && i < n; i++)
        v[i] = len;
    return v;
}

int sfs_backend_peer_batch_get(struct sfs_backend *be, const struct sfs_key *keys, size_t n,
                               void *const *bufs, uint32_t len, int *results)
{
    struct peer_backend *pb = (struct peer_backend *)be;
    uint32_t *lens;
    enum peer_miss *res;

    if (!be || be->ops != &peer_ops)
        return -EINVAL;
    lens = lens_of(len, n);
    res = malloc((n ? n : 1) * sizeof(*res));
    if (!lens || !res) {
        free(lens);
        free(res);
        return -ENOMEM;
    }
    int64_t t0 = peer_mono_ns();

    peer_tier_get_batch(pb, keys, n, bufs, lens, res);
    observe_get(pb, peer_mono_ns() - t0, n);
    for (size_t i = 0; i < n; i++) {
        results[i] = res[i] == PEER_HIT ? (int)len : -ENOENT;
        if (res[i] == PEER_HIT)
            CTR_ADD(pb, hits, 1);
        else
            peer_count_miss(pb, res[i]);
    }
    free(lens);
    free(res);
    return 0;
}

int sfs_backend_peer_batch_set(struct sfs_backend *be, const struct sfs_key *keys, size_t n,
                               const void *const *bufs, uint32_t len, int *results)
{
    uint32_t *lens;

    if (!be || be->ops != &peer_ops)
        return -EINVAL;
    lens = lens_of(len, n);
    if (!lens)
        return -ENOMEM;
    peer_tier_set_batch((struct peer_backend *)be, keys, n, bufs, lens, results);
    free(lens);
    return 0;
}

int sfs_backend_peer_batch_exists(struct sfs_backend *be, const struct sfs_key *keys, size_t n,
                                  uint32_t len)
{
    bool *present;
    size_t k = 0;

    if (!be || be->ops != &peer_ops)
        return -EINVAL;
    present = calloc(n ? n : 1, sizeof(*present));
    if (!present)
        return -ENOMEM;
    peer_tier_has((struct peer_backend *)be, keys, n, len, present);
    while (k < n && present[k])
        k++;
    free(present);
    return (int)k;
}

int sfs_backend_peer_reload(struct sfs_backend *be)
{
    if (!be || be->ops != &peer_ops)
        return -EINVAL;
    /* Release: a flag the next use or the publisher takes (at most a second
     * later); nothing else here, so a signal handler may call it. */
    atomic_store_explicit(&((struct peer_backend *)be)->reload_asked, true, memory_order_release);
    return 0;
}
