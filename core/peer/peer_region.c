/* SPDX-License-Identifier: MIT */
/*
 * peer_region.c - the peer tier's slot region, its seqlock and placement.
 *
 * The region is a memfd of num_buckets x ways x stride bytes mapped shared;
 * the daemon serves its bytes to the other hosts (peer_net.c) and reads and
 * writes its own keys here directly. Every read of a slot is a seqlock copy:
 * seq (acquire), header and payload copied, an acquire fence, seq again; the
 * copy counts only when both reads are the same even value (a seqlock that
 * reads seq once, before the copy, so a write that landed during the copy went
 * unseen). A write claims the slot by a compare-and-swap of seq from the
 * even value the writer read to odd, so of two writers that read the same
 * seq exactly one wins and the other learns it (-EAGAIN) instead of silently
 * overwriting a different key.
 *
 * Hashes are fixed functions of the key's bytes (block id, then shard
 * little-endian), read as little-endian words, so every host computes the
 * same owner, bucket and key hash; so is the payload checksum.
 */

#include "peer_i.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* --- hashes --- */

static uint64_t fmix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t hash64(const void *p, size_t len, uint64_t seed)
{
    const uint8_t *b = p;
    uint64_t h = fmix64(seed ^ (len * 0x9e3779b97f4a7c15ull));
    size_t i = 0;

    for (; i + 8 <= len; i += 8)
        h = fmix64(h ^ peer_get64(b + i)) + 0x9e3779b97f4a7c15ull;
    if (i < len) {
        uint8_t tail[8] = {0};

        memcpy(tail, b + i, len - i);
        h = fmix64(h ^ peer_get64(tail) ^ 0xff);
    }
    return fmix64(h);
}

static void key_bytes(const struct sfs_key *k, uint8_t out[SFS_BLOCK_ID_LEN + 4])
{
    memcpy(out, k->block.b, SFS_BLOCK_ID_LEN);
    for (int i = 0; i < 4; i++)
        out[SFS_BLOCK_ID_LEN + i] = (uint8_t)(k->shard >> (8 * i));
}

struct peer_hash peer_key_hash(const struct sfs_key *key)
{
    uint8_t b[SFS_BLOCK_ID_LEN + 4];

    key_bytes(key, b);
    return (struct peer_hash){hash64(b, sizeof(b), 0x5046534b65794c6full),
                              hash64(b, sizeof(b), 0x5046534b65794869ull)};
}

/* The bucket and the ring position come from the 128-bit hash mixed with
 * seeds of their own, so they are independent of each other. */
uint64_t peer_bucket_of(const struct peer_hash *h, uint64_t num_buckets)
{
    return fmix64(h->lo ^ fmix64(h->hi ^ 0x4275636b6574ull)) % num_buckets;
}

static uint64_t ring_pos(const struct peer_hash *h)
{
    return fmix64(h->hi ^ fmix64(h->lo ^ 0x52696e67ull));
}

/* A word-at-a-time checksum: not cryptographic, it catches torn or stale
 * payloads the seq did not (a slot written twice between two reads). Eight
 * independent lanes, each taking two 8-byte words a step: the first mixed
 * in by a multiply, the second xored in after it, for the next step's
 * multiply to mix (a multiply per 16 bytes, not per 8: the multiplier's
 * throughput bounds the loop). As with one word a multiply, a change of
 * one word always moves its lane, and two words cancel only by a
 * difference chosen for the lane's state. 128 bytes a step, so the
 * multiplies of one step do not wait on each other (the client checks
 * every payload: 7.5 us a 256 KiB page here, was 16 us with four lanes of
 * one word a multiply, version 3). The lanes are scalars, not an array:
 * GCC kept an array's lanes in memory, a store-to-load forward in every
 * chain. A tail shorter than a step is taken zero-padded; the length goes
 * into the final mix. */
#define CK_STEP(h, k, w)                                                                           \
    ((h) = (((h) ^ peer_get64(w)) * (k)) ^ peer_get64((w) + 8), (h) ^= (h) >> 29)
#define CK_BLOCK(w)                                                                                \
    (CK_STEP(h0, k0, (w)), CK_STEP(h1, k1, (w) + 16), CK_STEP(h2, k2, (w) + 32),                   \
     CK_STEP(h3, k3, (w) + 48), CK_STEP(h4, k0, (w) + 64), CK_STEP(h5, k1, (w) + 80),              \
     CK_STEP(h6, k2, (w) + 96), CK_STEP(h7, k3, (w) + 112))
#define CK_BLOCK_BYTES 128u

uint64_t peer_checksum(const void *p, size_t len)
{
    const uint64_t k0 = 0x9e3779b97f4a7c15ull, k1 = 0xc2b2ae3d27d4eb4full,
                   k2 = 0x165667b19e3779f9ull, k3 = 0xd6e8feb86659fd93ull;
    uint64_t h0 = 0x243f6a8885a308d3ull, h1 = 0x13198a2e03707344ull, h2 = 0xa4093822299f31d0ull,
             h3 = 0x082efa98ec4e6c89ull, h4 = 0x452821e638d01377ull, h5 = 0xbe5466cf34e90c6cull,
             h6 = 0xc0ac29b7c97c50ddull, h7 = 0x3f84d5b5b5470917ull;
    const uint8_t *b = p;
    size_t i = 0;

    for (; i + CK_BLOCK_BYTES <= len; i += CK_BLOCK_BYTES)
        CK_BLOCK(b + i);
    if (i < len) {
        uint8_t tail[CK_BLOCK_BYTES] = {0};

        memcpy(tail, b + i, len - i);
        CK_BLOCK(tail);
    }
    h0 = fmix64(h0 ^ fmix64(h1 ^ fmix64(h2 ^ fmix64(h3 ^ len))));
    return fmix64(h4 ^ fmix64(h5 ^ fmix64(h6 ^ fmix64(h7 ^ h0))));
}

/* --- ring --- */

static int point_cmp(const void *a, const void *b)
{
    const struct peer_point *x = a, *y = b;

    if (x->h != y->h)
        return x->h < y->h ? -1 : 1;
    return x->member < y->member ? -1 : x->member > y->member;
}

int peer_ring_build(struct peer_ring *r, char *const *members, size_t n)
{
    memset(r, 0, sizeof(*r));
    if (n > PEER_MEMBERS_MAX)
        return -E2BIG;
    if (n == 0)
        return 0;
    r->members = calloc(n, sizeof(*r->members));
    r->points = calloc(n * PEER_VNODES, sizeof(*r->points));
    if (!r->members || !r->points)
        goto nomem;
    for (size_t i = 0; i < n; i++) {
        r->members[i] = strdup(members[i]);
        if (!r->members[i])
            goto nomem;
        r->nmembers = i + 1;
        /* A member's points depend on its name only: adding or removing a
         * member moves only the keys of its own arcs. */
        for (uint32_t v = 0; v < PEER_VNODES; v++) {
            uint64_t h = hash64(members[i], strlen(members[i]), 0x566e6f6465ull + v);

            r->points[r->npoints++] = (struct peer_point){h, (uint32_t)i};
        }
    }
    qsort(r->points, r->npoints, sizeof(*r->points), point_cmp);
    return 0;
nomem:
    peer_ring_free(r);
    return -ENOMEM;
}

void peer_ring_free(struct peer_ring *r)
{
    for (size_t i = 0; i < r->nmembers; i++)
        free(r->members[i]);
    free(r->members);
    free(r->points);
    memset(r, 0, sizeof(*r));
}

int peer_ring_owner(const struct peer_ring *r, const struct peer_hash *h)
{
    uint64_t pos = ring_pos(h);
    size_t lo = 0, hi = r->npoints;

    if (r->npoints == 0)
        return -ENOENT;
    /* First point >= pos, wrapping to the first. */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (r->points[mid].h < pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (int)r->points[lo == r->npoints ? 0 : lo].member;
}

/* --- geometry and region --- */

int peer_geometry_make(uint64_t capacity, uint32_t ways, uint32_t max_payload,
                       struct peer_geometry *g)
{
    memset(g, 0, sizeof(*g));
    if (ways == 0 || ways > PEER_WAYS_MAX || max_payload == 0 || max_payload > PEER_PAYLOAD_MAX)
        return -EINVAL;
    g->ways = ways;
    g->max_payload = max_payload;
    g->stride = (PEER_HDR_SIZE + (uint64_t)max_payload + 63) & ~(uint64_t)63;
    g->num_buckets = capacity / (g->stride * ways);
    return g->num_buckets ? 0 : -EINVAL;
}

int peer_geometry_check(const struct peer_geometry *g)
{
    uint64_t stride;

    if (g->ways == 0 || g->ways > PEER_WAYS_MAX || g->max_payload == 0 ||
        g->max_payload > PEER_PAYLOAD_MAX || g->num_buckets == 0)
        return -EINVAL;
    stride = (PEER_HDR_SIZE + (uint64_t)g->max_payload + 63) & ~(uint64_t)63;
    if (g->stride != stride)
        return -EINVAL;
    /* Bound: the region fits a 48-bit address space. */
    if (g->num_buckets > (1ull << 47) / (stride * g->ways))
        return -EINVAL;
    return 0;
}

int peer_region_create(struct peer_region *r, const struct peer_geometry *g)
{
    int ret = peer_geometry_check(g);

    memset(r, 0, sizeof(*r));
    r->memfd = -1;
    if (ret < 0)
        return ret;
    r->g = *g;
    r->size = g->num_buckets * g->ways * g->stride;
    r->memfd = memfd_create("shardfs-peer", MFD_CLOEXEC);
    if (r->memfd < 0)
        return -errno;
    if (ftruncate(r->memfd, (off_t)r->size) < 0)
        goto fail;
    r->base = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, r->memfd, 0);
    if (r->base == MAP_FAILED) {
        r->base = NULL;
        goto fail;
    }
    return 0; /* a fresh memfd reads as zeros: every seq 0, every slot empty */
fail:
    ret = -errno;
    close(r->memfd);
    r->memfd = -1;
    return ret;
}

void peer_region_destroy(struct peer_region *r)
{
    if (r->base)
        munmap(r->base, r->size);
    if (r->memfd >= 0)
        close(r->memfd);
    memset(r, 0, sizeof(*r));
    r->memfd = -1;
}

/* --- the gate --- */

enum peer_miss peer_slot_matches(const struct peer_slot_hdr *hdr, uint64_t seq_before,
                                 uint64_t seq_after, const struct peer_hash *h,
                                 uint32_t expected_len, const void *payload)
{
    if (seq_before & 1 || seq_before != seq_after)
        return PEER_MISS_TORN;
    if (seq_before == 0 || hdr->magic != PEER_MAGIC)
        return PEER_MISS_EMPTY;
    if (hdr->hash_lo != h->lo || hdr->hash_hi != h->hi)
        return PEER_MISS_OTHER_KEY;
    if (hdr->len != expected_len)
        return PEER_MISS_LENGTH;
    if (payload && peer_checksum(payload, expected_len) != hdr->csum)
        return PEER_MISS_CHECKSUM;
    return PEER_HIT;
}

/*
 * The copy races with writers by design (a seqlock): what it copied counts
 * only when seq did not move, which the caller checks. TSan cannot see that
 * contract, so the plain copies are not instrumented.
 */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PEER_NO_TSAN __attribute__((no_sanitize("thread")))
#define PEER_TSAN    1
#endif
#endif
#if !defined(PEER_NO_TSAN) && defined(__SANITIZE_THREAD__)
#define PEER_NO_TSAN __attribute__((no_sanitize_thread))
#define PEER_TSAN    1
#endif
#ifndef PEER_NO_TSAN
#define PEER_NO_TSAN
#endif

/* The server copies every payload it answers with here (READ_GET,
 * READ_SLOT), in series with the get: libc's memcpy, 9-12 us a 256 KiB
 * page from a cold region and 2.5 us hot, where a loop of 8-byte words ran
 * 17-28 us and 10-13 us (GCC -O2 keeps it scalar). Under TSan the loop
 * stays: TSan intercepts memcpy itself and would report the seqlock's
 * designed race. */
PEER_NO_TSAN static void racy_copy(void *dst, const void *src, size_t n)
{
#ifdef PEER_TSAN
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
        uint64_t w;

        __builtin_memcpy(&w, s + i, 8);
        __builtin_memcpy(d + i, &w, 8);
    }
    for (; i < n; i++)
        d[i] = s[i];
#else
    memcpy(dst, src, n);
#endif
}

uint64_t peer_slot_copy(const struct peer_region *r, uint64_t bucket, uint32_t way,
                        struct peer_slot_hdr *hdr, uint64_t *seq_before, void *buf, size_t cap)
{
    struct peer_slot_hdr *s = peer_slot(r, bucket, way);
    /* Acquire: the header and payload read below are at least as new as the
     * write that published this seq. */
    uint64_t before = atomic_load_explicit(&s->seq, memory_order_acquire);
    uint32_t len;

    racy_copy((uint8_t *)hdr + 8, (const uint8_t *)s + 8, PEER_HDR_SIZE - 8);
    atomic_init(&hdr->seq, before);
    len = hdr->len;
    if (buf && cap) {
        if (len > cap)
            len = (uint32_t)cap;
        if (len > r->g.max_payload)
            len = r->g.max_payload;
        racy_copy(buf, (const uint8_t *)s + PEER_HDR_SIZE, len);
    }
    *seq_before = before;
    /* Acquire fence: the copies above are ordered before the second seq
     * read, so a writer that started during them has moved seq by then. */
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(&s->seq, memory_order_relaxed);
}

enum peer_miss peer_local_get(const struct peer_region *r, const struct peer_hash *h, void *buf,
                              uint32_t len)
{
    uint64_t bucket = peer_bucket_of(h, r->g.num_buckets);
    enum peer_miss best = PEER_MISS_EMPTY;

    if (len > r->g.max_payload)
        return PEER_MISS_LENGTH;
    for (uint32_t w = 0; w < r->g.ways; w++) {
        struct peer_slot_hdr hdr;
        uint64_t before, after;
        enum peer_miss m;

        /* Header first: the payload is copied only from the way that names
         * the key (and copied again, with the payload, for the re-check). */
        after = peer_slot_copy(r, bucket, w, &hdr, &before, NULL, 0);
        m = peer_slot_matches(&hdr, before, after, h, len, NULL);
        if (m == PEER_MISS_EMPTY || m == PEER_MISS_OTHER_KEY) {
            if (best == PEER_MISS_EMPTY)
                best = m;
            continue;
        }
        if (m == PEER_HIT && !buf)
            return PEER_HIT; /* header only */
        if (m == PEER_HIT) {
            after = peer_slot_copy(r, bucket, w, &hdr, &before, buf, len);
            m = peer_slot_matches(&hdr, before, after, h, len, buf);
            if (m == PEER_HIT)
                return PEER_HIT;
        }
        best = m; /* the key's own slot: torn, wrong length or checksum */
    }
    return best;
}

int peer_find_way(const struct peer_slot_hdr *hdrs, const uint64_t *after, uint32_t ways,
                  const struct peer_hash *h, uint32_t len)
{
    for (uint32_t w = 0; w < ways; w++) {
        /* Relaxed: hdrs are private copies. */
        uint64_t before = atomic_load_explicit(&hdrs[w].seq, memory_order_relaxed);

        if (peer_slot_matches(&hdrs[w], before, after[w], h, len, NULL) == PEER_HIT)
            return (int)w;
    }
    return -1;
}

int peer_pick_way(const struct peer_slot_hdr *hdrs, const uint64_t *seqs, uint32_t ways,
                  const struct peer_hash *h)
{
    int same = -1, oldest = -1;

    for (uint32_t w = 0; w < ways; w++) {
        const struct peer_slot_hdr *x = &hdrs[w];
        uint64_t seq = atomic_load_explicit(&((struct peer_slot_hdr *)x)->seq,
                                            memory_order_relaxed); /* a copy: no ordering */

        if (seq & 1 || seq != seqs[w])
            continue; /* being written, or moved while read */
        if (seq == 0 || x->magic != PEER_MAGIC)
            return (int)w;
        if (same < 0 && x->hash_lo == h->lo && x->hash_hi == h->hi)
            same = (int)w;
        if (oldest < 0 || x->stamp < hdrs[oldest].stamp)
            oldest = (int)w;
    }
    if (same >= 0)
        return same;
    return oldest >= 0 ? oldest : -EBUSY;
}

PEER_NO_TSAN static void racy_store(void *dst, const void *src, size_t n)
{
    uint8_t *d = dst;
    const uint8_t *s = src;

    for (size_t i = 0; i < n; i++)
        d[i] = s[i];
}

int peer_slot_write(struct peer_region *r, uint64_t bucket, uint32_t way, uint64_t expect,
                    const struct peer_hash *h, const void *payload, uint32_t len, uint64_t stamp)
{
    struct peer_slot_hdr *s, nh;

    if (bucket >= r->g.num_buckets || way >= r->g.ways || len > r->g.max_payload || expect & 1)
        return -EINVAL;
    s = peer_slot(r, bucket, way);
    /* Acquire on success: our stores below stay after the claim; the release
     * fence then keeps them from becoming visible before the odd seq. */
    if (!atomic_compare_exchange_strong_explicit(&s->seq, &expect, expect + 1, memory_order_acquire,
                                                 memory_order_relaxed))
        return -EAGAIN;
    atomic_thread_fence(memory_order_release);
    memset(&nh, 0, sizeof(nh));
    nh.hash_lo = h->lo;
    nh.hash_hi = h->hi;
    nh.len = len;
    nh.magic = PEER_MAGIC;
    nh.csum = peer_checksum(payload, len);
    nh.stamp = stamp;
    racy_store((uint8_t *)s + PEER_HDR_SIZE, payload, len);
    racy_store((uint8_t *)s + 8, (const uint8_t *)&nh + 8, PEER_HDR_SIZE - 8);
    /* Release: a reader that sees the new even seq sees the bytes above. */
    atomic_store_explicit(&s->seq, expect + 2, memory_order_release);
    return 0;
}

static uint64_t realtime_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int peer_local_set(struct peer_region *r, const struct peer_hash *h, const void *payload,
                   uint32_t len)
{
    uint64_t bucket = peer_bucket_of(h, r->g.num_buckets);
    struct peer_slot_hdr hdrs[PEER_WAYS_MAX];
    uint64_t seqs[PEER_WAYS_MAX];

    if (len > r->g.max_payload)
        return -EINVAL;
    for (int attempt = 0; attempt < 2; attempt++) {
        int w;

        for (uint32_t i = 0; i < r->g.ways; i++) {
            uint64_t before;

            seqs[i] = peer_slot_copy(r, bucket, i, &hdrs[i], &before, NULL, 0);
            if (before != seqs[i])
                seqs[i] |= 1; /* moved: treat as busy */
        }
        w = peer_pick_way(hdrs, seqs, r->g.ways, h);
        if (w < 0)
            continue;
        if (peer_slot_write(r, bucket, (uint32_t)w, seqs[w], h, payload, len, realtime_ns()) == 0)
            return 0;
    }
    return -EAGAIN;
}
