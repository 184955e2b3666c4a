/* SPDX-License-Identifier: MIT */
/*
 * peer_tier.c - get, set and exists against each key's owner host, a batch
 * at a time (HiCache's batch API): keys the ring gives this host (or every
 * key when no members are listed) go to the local region; the others are
 * grouped by owner, and every owner's requests go out pipelined on its
 * connection, all owners at once (peer_conn_batch_run): one round trip per
 * owner host per batch for a get (READ_GET: the bucket's headers and the
 * payload of the way that names the key) and for exists (READ_HDRS), two
 * for a set (READ_HDRS, then the conditional WRITEs). Every answer is judged
 * here by peer_slot_matches; a member that does not answer within the
 * deadline leaves its keys clean "unreachable" misses and the other
 * members' answers stand.
 *
 * Locking: ring_lock for reading for the whole batch; the connection lock
 * of every owner in the batch, taken in member order (no two batches wait
 * on each other in a circle).
 */
#include "peer_backend_i.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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

/* One batch's keys, grouped by owner (caller holds ring_lock for reading). */
struct plan {
    struct peer_backend *pb;
    size_t n;
    struct peer_hash *h;
    int *owner;   /* member index; -1: the local region */
    bool *remote; /* still to be asked over the wire */
    size_t nb;    /* distinct remote owners, ascending */
    int *bowner;
    struct peer_batch *b;
    struct peer_call *calls;    /* grouped by owner, b[j].calls into it */
    struct peer_slot_hdr *hdrs; /* PEER_WAYS_MAX per call */
    uint64_t *after;
};

static void plan_free(struct plan *pl)
{
    for (size_t j = 0; j < pl->nb; j++)
        pthread_mutex_unlock(&pl->pb->mem[pl->bowner[j]].lock);
    free(pl->h);
    free(pl->owner);
    free(pl->remote);
    free(pl->bowner);
    free(pl->b);
    free(pl->calls);
    free(pl->hdrs);
    free(pl->after);
}

static int cmp_int(const void *a, const void *b)
{
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

/* Hash and place the keys; lock and open every remote owner (member order).
 * -ENOMEM, else 0. */
static int plan_open(struct plan *pl, struct peer_backend *pb, const struct sfs_key *keys, size_t n)
{
    size_t k = 0;

    memset(pl, 0, sizeof(*pl));
    pl->pb = pb;
    pl->n = n;
    pl->h = malloc((n ? n : 1) * sizeof(*pl->h));
    pl->owner = malloc((n ? n : 1) * sizeof(*pl->owner));
    pl->remote = calloc(n ? n : 1, sizeof(*pl->remote));
    pl->bowner = malloc((n ? n : 1) * sizeof(*pl->bowner));
    pl->calls = calloc(n ? n : 1, sizeof(*pl->calls));
    pl->hdrs = malloc((n ? n : 1) * PEER_WAYS_MAX * sizeof(*pl->hdrs));
    pl->after = malloc((n ? n : 1) * PEER_WAYS_MAX * sizeof(*pl->after));
    if (!pl->h || !pl->owner || !pl->remote || !pl->bowner || !pl->calls || !pl->hdrs || !pl->after)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        int o;

        pl->h[i] = peer_key_hash(&keys[i]);
        o = peer_ring_owner(&pb->ring, &pl->h[i]);
        pl->owner[i] = o < 0 || o == pb->self ? -1 : o;
        pl->remote[i] = pl->owner[i] >= 0;
        if (pl->remote[i])
            pl->bowner[k++] = o;
    }
    qsort(pl->bowner, k, sizeof(*pl->bowner), cmp_int);
    for (size_t i = 0; i < k; i++)
        if (pl->nb == 0 || pl->bowner[pl->nb - 1] != pl->bowner[i])
            pl->bowner[pl->nb++] = pl->bowner[i];
    pl->b = calloc(pl->nb ? pl->nb : 1, sizeof(*pl->b));
    if (!pl->b) {
        pl->nb = 0;
        return -ENOMEM;
    }
    for (size_t j = 0; j < pl->nb; j++) {
        struct peer_member *m = &pb->mem[pl->bowner[j]];

        pthread_mutex_lock(&m->lock);
        pl->b[j].c = &m->conn;
        pl->b[j].member = pb->ring.members[pl->bowner[j]];
        /* Failing, it leaves fd < 0: its keys are unreachable. */
        peer_conn_open_fresh(&m->conn, pl->b[j].member, pb->o.deadline_ms);
    }
    return 0;
}

/* The batch index of member o. */
static size_t plan_batch(const struct plan *pl, int o)
{
    size_t lo = 0, hi = pl->nb;

    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;

        if (pl->bowner[mid] <= o)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/*
 * Lay out one call per key with want[i] (remote, owner reachable), grouped
 * by owner, fill each with fill(), and run them all. Keys whose owner is
 * unreachable get no call (call_of[i] = SIZE_MAX).
 */
typedef void fill_fn(struct plan *pl, size_t i, struct peer_call *k, const struct peer_conn *c,
                     void *arg);

static void plan_run(struct plan *pl, const bool *want, size_t *call_of, fill_fn *fill, void *arg)
{
    size_t at = 0;

    for (size_t j = 0; j < pl->nb; j++) {
        struct peer_batch *b = &pl->b[j];

        b->calls = pl->calls + at;
        b->n = 0;
        for (size_t i = 0; i < pl->n; i++) {
            struct peer_call *k;

            if (!want[i] || pl->owner[i] != pl->bowner[j])
                continue;
            call_of[i] = SIZE_MAX;
            if (b->c->fd < 0)
                continue;
            k = &b->calls[b->n];
            memset(k, 0, sizeof(*k));
            k->key = i;
            k->hdrs = pl->hdrs + (at + b->n) * PEER_WAYS_MAX;
            k->after = pl->after + (at + b->n) * PEER_WAYS_MAX;
            fill(pl, i, k, b->c, arg);
            call_of[i] = at + b->n++;
        }
        at += b->n;
        if (b->n)
            CTR_ADD(pl->pb, round_trips, 1);
    }
    peer_conn_batch_run(pl->b, pl->nb, pl->pb->o.deadline_ms);
}

static const struct peer_conn *plan_conn(const struct plan *pl, size_t i)
{
    return pl->b[plan_batch(pl, pl->owner[i])].c;
}

/* --- get --- */

struct get_arg {
    void *const *bufs;
    const uint32_t *lens;
};

static void fill_get(struct plan *pl, size_t i, struct peer_call *k, const struct peer_conn *c,
                     void *arg)
{
    struct get_arg *ga = arg;

    k->buf = ga->bufs[i];
    k->q = peer_req_for(PEER_OP_READ_GET, &pl->h[i], &c->g);
    k->q.len = ga->lens[i];
}

void peer_tier_get_batch(struct peer_backend *pb, const struct sfs_key *keys, size_t n,
                         void *const *bufs, const uint32_t *lens, enum peer_miss *res)
{
    struct plan pl;
    struct get_arg ga = {bufs, lens};
    size_t *call_of = malloc((n ? n : 1) * sizeof(*call_of));
    bool *want = calloc(n ? n : 1, sizeof(*want));

    peer_members_maybe_reload(pb);
    pthread_rwlock_rdlock(&pb->ring_lock);
    if (!call_of || !want || plan_open(&pl, pb, keys, n) < 0) {
        for (size_t i = 0; i < n; i++)
            res[i] = PEER_MISS_UNREACHABLE;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const struct peer_conn *c;

        if (!pl.remote[i]) {
            res[i] = peer_local_get(&pb->region, &pl.h[i], bufs[i], lens[i]);
            continue;
        }
        c = plan_conn(&pl, i);
        if (c->fd >= 0 && lens[i] > c->g.max_payload)
            res[i] = PEER_MISS_LENGTH;
        else
            want[i] = true;
    }
    plan_run(&pl, want, call_of, fill_get, &ga);
    for (size_t i = 0; i < n; i++) {
        const struct peer_call *k;
        uint32_t ways;

        if (!want[i])
            continue;
        if (call_of[i] == SIZE_MAX) {
            res[i] = PEER_MISS_UNREACHABLE;
            continue;
        }
        k = &pl.calls[call_of[i]];
        ways = plan_conn(&pl, i)->g.ways;
        res[i] = peer_call_judge(k, ways, &pl.h[i], lens[i], bufs[i]);
        if (k->err == 0)
            CTR_ADD(pb, bytes_read,
                    (uint64_t)ways * PEER_HDR_WIRE +
                        (k->rep.status >= 0 ? PEER_HDR_WIRE + (uint64_t)lens[i] : 0));
    }
out:
    if (call_of && want)
        plan_free(&pl);
    pthread_rwlock_unlock(&pb->ring_lock);
    free(call_of);
    free(want);
}

enum peer_miss peer_tier_get(struct peer_backend *pb, const struct sfs_key *key, void *buf,
                             uint32_t len)
{
    enum peer_miss r = PEER_MISS_UNREACHABLE;

    peer_tier_get_batch(pb, key, 1, &buf, &len, &r);
    return r;
}

/* --- exists --- */

static void fill_hdrs(struct plan *pl, size_t i, struct peer_call *k, const struct peer_conn *c,
                      void *arg)
{
    (void)arg;
    k->q = peer_req_for(PEER_OP_READ_HDRS, &pl->h[i], &c->g);
    k->q.nways = c->g.ways;
}

void peer_tier_has(struct peer_backend *pb, const struct sfs_key *keys, size_t n, uint32_t len,
                   bool *present)
{
    struct plan pl;
    size_t *call_of = malloc((n ? n : 1) * sizeof(*call_of));
    bool *want = calloc(n ? n : 1, sizeof(*want));

    peer_members_maybe_reload(pb);
    pthread_rwlock_rdlock(&pb->ring_lock);
    if (!call_of || !want || plan_open(&pl, pb, keys, n) < 0)
        goto out;
    for (size_t i = 0; i < n; i++) {
        const struct peer_conn *c;

        if (present[i])
            continue;
        if (!pl.remote[i]) {
            present[i] = peer_local_get(&pb->region, &pl.h[i], NULL, len) == PEER_HIT;
            continue;
        }
        c = plan_conn(&pl, i);
        want[i] = c->fd < 0 || len <= c->g.max_payload;
    }
    plan_run(&pl, want, call_of, fill_hdrs, NULL);
    for (size_t i = 0; i < n; i++) {
        uint32_t ways;

        if (!want[i] || call_of[i] == SIZE_MAX)
            continue;
        ways = plan_conn(&pl, i)->g.ways;
        present[i] = peer_call_judge(&pl.calls[call_of[i]], ways, &pl.h[i], len, NULL) == PEER_HIT;
        if (pl.calls[call_of[i]].err == 0)
            CTR_ADD(pb, bytes_read, (uint64_t)ways * PEER_HDR_WIRE);
    }
out:
    if (call_of && want)
        plan_free(&pl);
    pthread_rwlock_unlock(&pb->ring_lock);
    free(call_of);
    free(want);
}

/* --- set --- */

struct set_arg {
    const void *const *bufs;
    const uint32_t *lens;
    const uint32_t *way;
    const uint64_t *expect;
    uint64_t stamp;
};

static void fill_write(struct plan *pl, size_t i, struct peer_call *k, const struct peer_conn *c,
                       void *arg)
{
    struct set_arg *sa = arg;

    k->payload = sa->bufs[i];
    k->q = peer_req_for(PEER_OP_WRITE, &pl->h[i], &c->g);
    k->q.way = sa->way[i];
    k->q.nways = 1;
    k->q.expect = sa->expect[i];
    k->q.len = sa->lens[i];
    k->q.stamp = sa->stamp;
}

/* Choose key i's way from its headers; earlier keys of this batch that chose
 * a way of the same bucket of the same owner hold it (marked busy). */
static int choose_way(struct plan *pl, size_t i, const size_t *call_of, const bool *want,
                      const uint32_t *way, uint32_t ways)
{
    struct peer_call *k = &pl->calls[call_of[i]];

    for (uint32_t w = 0; w < ways; w++)
        /* Relaxed: private copies. */
        if (atomic_load_explicit(&k->hdrs[w].seq, memory_order_relaxed) != k->after[w])
            k->after[w] |= 1;
    for (size_t j = 0; j < i; j++)
        if (want[j] && call_of[j] != SIZE_MAX && pl->owner[j] == pl->owner[i] &&
            pl->calls[call_of[j]].q.bucket == k->q.bucket && way[j] < ways)
            k->after[way[j]] |= 1;
    return peer_pick_way(k->hdrs, k->after, ways, &pl->h[i]);
}

void peer_tier_set_batch(struct peer_backend *pb, const struct sfs_key *keys, size_t n,
                         const void *const *bufs, const uint32_t *lens, int *res)
{
    struct plan pl;
    size_t *call_of = malloc((n ? n : 1) * sizeof(*call_of));
    bool *want = calloc(n ? n : 1, sizeof(*want)), *wr = calloc(n ? n : 1, sizeof(*wr));
    uint32_t *way = malloc((n ? n : 1) * sizeof(*way));
    uint64_t *expect = malloc((n ? n : 1) * sizeof(*expect));
    struct set_arg sa = {bufs, lens, way, expect, peer_realtime_ns()};

    peer_members_maybe_reload(pb);
    pthread_rwlock_rdlock(&pb->ring_lock);
    if (!call_of || !want || !wr || !way || !expect || plan_open(&pl, pb, keys, n) < 0) {
        for (size_t i = 0; i < n; i++)
            res[i] = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const struct peer_conn *c;

        res[i] = -EAGAIN;
        if (!pl.remote[i]) {
            res[i] = peer_local_set(&pb->region, &pl.h[i], bufs[i], lens[i]);
            continue;
        }
        c = plan_conn(&pl, i);
        if (c->fd >= 0 && lens[i] > c->g.max_payload)
            res[i] = -EMSGSIZE;
        else
            want[i] = true;
    }
    /* Read the buckets, choose, write conditionally on the seq read; once
     * more for the keys another writer beat; then report (lost_writes). */
    for (int attempt = 0; attempt < 2; attempt++) {
        bool any = false;

        plan_run(&pl, want, call_of, fill_hdrs, NULL);
        for (size_t i = 0; i < n; i++) {
            uint32_t ways;
            int w;

            wr[i] = false;
            way[i] = UINT32_MAX;
            if (!want[i])
                continue;
            if (call_of[i] == SIZE_MAX || pl.calls[call_of[i]].err < 0) {
                res[i] = -EHOSTUNREACH;
                want[i] = false;
                continue;
            }
            ways = plan_conn(&pl, i)->g.ways;
            CTR_ADD(pb, bytes_read, (uint64_t)ways * PEER_HDR_WIRE);
            w = choose_way(&pl, i, call_of, want, way, ways);
            if (w < 0)
                continue; /* every way busy: -EAGAIN, maybe next attempt */
            way[i] = (uint32_t)w;
            expect[i] = pl.calls[call_of[i]].after[w];
            wr[i] = any = true;
        }
        if (!any)
            continue;
        plan_run(&pl, wr, call_of, fill_write, &sa);
        for (size_t i = 0; i < n; i++) {
            const struct peer_call *k;

            if (!wr[i])
                continue;
            k = call_of[i] == SIZE_MAX ? NULL : &pl.calls[call_of[i]];
            if (!k || k->err < 0) {
                res[i] = -EHOSTUNREACH;
                want[i] = false;
            } else if (k->rep.status == 0) {
                res[i] = 0;
                want[i] = false;
            }
        }
    }
out:
    if (call_of && want && wr && way && expect)
        plan_free(&pl);
    pthread_rwlock_unlock(&pb->ring_lock);
    for (size_t i = 0; i < n; i++) {
        if (res[i] == 0) {
            CTR_ADD(pb, writes, 1);
            CTR_ADD(pb, bytes_written, lens[i]);
        } else if (res[i] == -EAGAIN) {
            CTR_ADD(pb, lost_writes, 1);
        }
    }
    free(call_of);
    free(want);
    free(wr);
    free(way);
    free(expect);
}

void peer_tier_set(struct peer_backend *pb, const struct sfs_key *key, const void *buf,
                   uint32_t len)
{
    int r = 0;

    peer_tier_set_batch(pb, key, 1, &buf, &len, &r);
}
