/* SPDX-License-Identifier: MIT */
/*
 * fuzz_ctl_header.c - libFuzzer target: attaching to a hostile control plane
 * (core/cache/ctl.c's validation, and the attach path around it in attach.c,
 * dataplane.c, lease.c, proc.c).
 *
 * A real cache is created once (a few keys Ready, two Idle), and its control
 * plane is kept as a pristine image. Each input builds a new control memfd
 * from that image and rewrites parts of it, then attaches to it with the
 * real entry point, sfs_cache_attach_fds(), with the real data-plane memfds:
 *
 *   byte 0      flags: 1 run operations after a successful attach, 2 resize
 *               the memfd by byte 1 (signed) pages, 4 attach query-only,
 *               8 pass one segment fd too few, 16 pass a 4 KiB memfd as the
 *               last segment, 32 attach to the pristine plane and write
 *               the header bytes and patches below into it once attached
 *               (a hostile process scribbling while we hold the plane)
 *   byte 1      the resize
 *   bytes 2..   the header's geometry (magic .. part_rend), overwritten from
 *               the start for as many bytes as given
 *   then        8-byte patches {u32 which, u32 value}: which picks one 32-bit
 *               word among the shared mutable words (header hands and
 *               counters, bucket heads, every word of every slot record,
 *               process records, lease tables, hit counters); robust mutexes are left
 *               alone (a forged lock word is a documented, not preventable,
 *               stall: docs/security.md)
 *
 * The attach must fail with -errno or succeed; after a success the harness
 * looks keys up, takes leases (plain, no-alloc, prefetch, write), waits on
 * one and on several, reads and writes the leased slots' bytes, touches,
 * walks, prewarms, removes, reaps and detaches. Nothing may crash, trip a
 * sanitizer, touch memory outside the mappings, hang (libFuzzer's -timeout),
 * or leak a file descriptor. docs/security.md states what validation promises.
 */
#include "cache_i.h"
#include "fuzz_close.h"
#include "fuzz_harness.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum {
    F_OPS = 1,
    F_RESIZE = 2,
    F_QUERY = 4,
    F_FEWER_SEGS = 8,
    F_SMALL_SEG = 16,
    F_LATE = 32,
};

#define GEOM_END                                                                                   \
    (offsetof(struct sfs_header, part_rend) + sizeof(((struct sfs_header *)0)->part_rend))
#define MAX_WORDS (1u << 16)
#define NKEYS     12
#define MAX_PATCH 64

static struct sfs_cache *cache;
static uint8_t *pristine;
static size_t pristine_len;
static uint32_t words[MAX_WORDS]; /* byte offsets of the patchable words */
static uint32_t nwords;

static struct sfs_key key_of(unsigned i)
{
    struct sfs_key k;

    memset(&k, 0, sizeof(k));
    k.block.b[0] = (uint8_t)(0x10 + i % 3);
    k.block.b[15] = 0x5a;
    k.shard = i;
    return k;
}

static void add_word(uint64_t off)
{
    if (nwords < MAX_WORDS && off + 4 <= pristine_len)
        words[nwords++] = (uint32_t)off;
}

static void add_range(uint64_t off, uint64_t len)
{
    for (uint64_t o = 0; o + 4 <= len; o += 4)
        add_word(off + o);
}

/* The shared mutable words of the layout (layout_i.h), mutexes excluded. */
static void list_words(void)
{
    const struct sfs_header *h = (const void *)pristine;

    add_range(offsetof(struct sfs_header, hand),
              offsetof(struct sfs_header, release_waiters) + 4 - offsetof(struct sfs_header, hand));
    add_range(offsetof(struct sfs_header, retired), sizeof(h->retired));
    for (uint32_t b = 0; b < h->nbuckets; b++)
        add_word(h->off_buckets + (uint64_t)b * sizeof(struct sfs_bucket_rec) +
                 offsetof(struct sfs_bucket_rec, head));
    add_range(h->off_slots, (uint64_t)h->nslots * sizeof(struct sfs_slot_rec));
    for (uint32_t p = 0; p < h->max_procs; p++) {
        uint64_t base = h->off_procs + (uint64_t)p * sizeof(struct sfs_proc_rec);

        add_range(base, offsetof(struct sfs_proc_rec, kind) + 4);
        add_range(base + offsetof(struct sfs_proc_rec, ctr),
                  sizeof(((struct sfs_proc_rec *)0)->ctr));
    }
    add_range(h->off_leases, (uint64_t)h->max_procs * h->max_leases * sizeof(uint32_t));
    /* Layout 4: the pin count and hint, the domains' counters and hands,
     * the pin table. */
    add_range(offsetof(struct sfs_header, pinned_slots), 8);
    add_range(offsetof(struct sfs_header, part_evictions), sizeof(h->part_evictions));
    add_range(offsetof(struct sfs_header, dom), sizeof(h->dom));
    add_range(h->off_pins, (uint64_t)h->npins * sizeof(struct sfs_pin_rec));
    /* Layout 6: the hit counters. */
    add_range(h->off_hits, (uint64_t)h->max_procs * h->max_leases * sizeof(uint64_t));
}

static void seed_header(const char *name, uint8_t flags, const uint8_t *hdr)
{
    uint8_t buf[2 + GEOM_END];

    buf[0] = flags;
    buf[1] = 0;
    memcpy(buf + 2, hdr, GEOM_END);
    fz_seed(name, buf, sizeof(buf));
}

static void seed(const char *name, uint8_t flags, const void *patch, size_t plen)
{
    uint8_t buf[2 + GEOM_END + 8 * 4];

    buf[0] = flags;
    buf[1] = 0;
    memcpy(buf + 2, pristine, GEOM_END);
    if (plen)
        memcpy(buf + 2 + GEOM_END, patch, plen);
    fz_seed(name, buf, 2 + GEOM_END + plen);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct sfs_cache_config cfg = {.shard_size = 4096,
                                   .nslots = 64,
                                   .nbuckets = 64,
                                   .segment_size = 128 << 10, /* 32 slots a segment: 2 */
                                   .max_procs = 4,
                                   .max_leases = 16,
                                   .hugepages = SFS_HUGEPAGES_OFF};

    cache = fz_cache_create(&cfg);
    /* Some keys on their chains: Ready ones, and two Idle. */
    for (unsigned i = 0; i < NKEYS - 2; i++) {
        struct sfs_key k = key_of(i);
        struct sfs_lease l;

        if (sfs_cache_get(cache, &k, 0, 0, &l) != SFS_OWNER)
            fz_fail("get key %u", i);
        memset(sfs_cache_data(cache, &l), (int)i, 4096);
        sfs_cache_publish(cache, &l, 4096, 0);
        sfs_cache_release(cache, &l);
    }
    for (unsigned i = NKEYS - 2; i < NKEYS; i++) {
        struct sfs_key k = key_of(i);

        sfs_cache_prealloc(cache, &k);
    }
    pristine_len = cache->ctl_len;
    pristine = malloc(pristine_len);
    if (!pristine)
        fz_fail("malloc");
    memcpy(pristine, cache->ctl, pristine_len);
    list_words();

    /* Seeds: the pristine header, query-only, and a few words rewritten
     * (the first hand word, words of the slot table, the last lease entry). */
    seed("clean", F_OPS, NULL, 0);
    seed("query", F_OPS | F_QUERY, NULL, 0);
    seed("late", F_OPS | F_LATE, NULL, 0);
    const uint32_t patch[8] = {0,          0xffff, nwords / 3, 0x7fffffff,
                               nwords / 2, 63,     nwords - 1, 100000};
    seed("words", F_OPS, patch, sizeof(patch));
    /* Regression: a stride whose product with slots_per_segment wraps to
     * less than the segment size (docs/fuzzing.md, finding 1). */
    const struct sfs_header *h = (const void *)pristine;
    uint8_t hdr[GEOM_END];
    uint64_t stride = 0xc000000000000000ull | h->stride;
    memcpy(hdr, pristine, GEOM_END);
    memcpy(hdr + offsetof(struct sfs_header, stride), &stride, sizeof(stride));
    seed_header("regress-stride-wraps", F_OPS, hdr);

    return 0;
}

/* Write the input's header bytes and word patches into a plane of len bytes
 * mapped at p. */
static void rewrite(uint8_t *p, size_t len, const uint8_t *data, size_t size)
{
    size_t geom = size - 2 < GEOM_END ? size - 2 : GEOM_END;

    if (geom <= len)
        memcpy(p, data + 2, geom);
    const uint8_t *q = data + 2 + geom, *end = data + size;
    for (unsigned i = 0; i < MAX_PATCH && end - q >= 8; i++, q += 8) {
        uint32_t which, value;

        memcpy(&which, q, 4);
        memcpy(&value, q + 4, 4);
        uint32_t off = words[which % nwords];
        if (off + 4 <= len)
            memcpy(p + off, &value, 4); /* a plain store, as a careless writer's */
    }
}

/* A copy of the pristine plane, rewritten as the input says. */
static int build_ctl(const uint8_t *data, size_t size, uint8_t flags)
{
    int fd = memfd_create("fuzz-ctl", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    int64_t len = (int64_t)pristine_len;

    if (fd < 0)
        fz_fail("memfd_create: %s", strerror(errno));
    if (flags & F_RESIZE) {
        len += (int64_t)(int8_t)data[1] * 4096;
        if (len < 0)
            len = 0;
    }
    if (ftruncate(fd, len) < 0)
        fz_fail("ftruncate: %s", strerror(errno));
    uint8_t *p = mmap(NULL, pristine_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        fz_fail("mmap: %s", strerror(errno));
    size_t keep = (size_t)len < pristine_len ? (size_t)len : pristine_len;
    memcpy(p, pristine, keep);
    if (!(flags & F_LATE))
        rewrite(p, keep, data, size);
    munmap(p, pristine_len);
    return fd;
}

/* What validation promises about an accepted geometry, restated: every slot
 * of a segment lies inside the segment's mapping, and the segments hold
 * every slot. (Checked on the handle's own copy, so a wrong acceptance is
 * named here rather than found as a wild access later.) */
static void check_geometry(const struct sfs_cache *c)
{
    unsigned __int128 end = (unsigned __int128)(c->slots_per_seg - 1) * c->stride + c->shard_size;

    if (c->slots_per_seg == 0 || c->stride < c->shard_size || end > c->seg_size ||
        (uint64_t)c->nsegments * c->slots_per_seg < c->nslots)
        fz_fail("attach accepted a geometry that does not fit: shard_size %llu stride %#llx "
             "seg_size %llu slots_per_seg %u nsegments %u nslots %u (the last slot of a "
             "segment ends at byte %#llx%08llx)",
             (unsigned long long)c->shard_size, (unsigned long long)c->stride,
             (unsigned long long)c->seg_size, c->slots_per_seg, c->nsegments, c->nslots,
             (unsigned long long)(uint64_t)(end >> 32),
             (unsigned long long)(uint64_t)end & 0xffffffffull);
}

static int visit(const struct sfs_key *key, int state, void *arg)
{
    (*(unsigned *)arg) += key->shard + (unsigned)state;
    return 0;
}

/* What an attached process does; every call must return, in bounded time. */
static void exercise(struct sfs_cache *c)
{
    static const unsigned flags[] = {0, SFS_GET_NOALLOC, SFS_GET_PREFETCH, SFS_GET_WRITE,
                                     SFS_GET_PEEK | SFS_GET_NOALLOC};
    struct sfs_cache_info info;
    struct sfs_stats st;
    struct sfs_block_id blocks[3];
    struct sfs_lease waiting[4];
    unsigned nwaiting = 0;

    sfs_cache_info(c, &info);
    sfs_cache_stats(c, &st);
    for (unsigned i = 0; i < NKEYS + 4; i++) {
        struct sfs_key k = key_of(i);
        struct sfs_lease l;
        int r;

        (void)sfs_cache_state(c, &k);
        (void)sfs_cache_exists(c, &k);
        r = sfs_cache_get(c, &k, flags[i % (sizeof(flags) / sizeof(flags[0]))], 0, &l);
        if (r < 0)
            continue;
        uint8_t *d = sfs_cache_data(c, &l);
        if (r == SFS_WAITER && nwaiting < 4) {
            waiting[nwaiting++] = l; /* waited on together below */
            continue;
        }
        if (r == SFS_WAITER) {
            r = sfs_cache_wait(c, &l, sfs_deadline_after(1000 * 1000));
            if (r == SFS_WAIT_OWNER)
                r = SFS_OWNER;
        }
        if (r == SFS_OWNER) {
            if (d) {
                memset(d, 0xee, info.shard_size);
                (void)sfs_cache_publish(c, &l, (uint32_t)info.shard_size, 0);
            } else {
                (void)sfs_cache_fail(c, &l, -EIO);
            }
        } else if (d && r == SFS_WAIT_READY) {
            uint32_t n = sfs_cache_length(c, &l);
            volatile uint8_t sink = d[0];
            if (n)
                sink ^= d[n - 1 < info.shard_size ? n - 1 : info.shard_size - 1];
            (void)sink;
        } else if (d && r == SFS_HIT) {
            volatile uint8_t sink = d[0] ^ d[info.shard_size - 1];
            (void)sink;
        }
        (void)sfs_cache_release(c, &l);
    }
    if (nwaiting) {
        int state = 0, r;

        r = sfs_cache_wait_any(c, waiting, nwaiting, sfs_deadline_after(1000 * 1000), &state);
        if (r >= 0 && (unsigned)r < nwaiting && state == SFS_WAIT_OWNER)
            (void)sfs_cache_fail(c, &waiting[r], -EIO);
        for (unsigned i = 0; i < nwaiting; i++)
            (void)sfs_cache_release(c, &waiting[i]);
    }
    for (unsigned i = 0; i < 3; i++)
        blocks[i] = key_of(i).block;
    (void)sfs_cache_touch(c, blocks, 3);
    unsigned sum = 0;
    (void)sfs_cache_foreach(c, ~0u, visit, &sum);
    struct sfs_key extra = key_of(NKEYS + 2), gone = key_of(NKEYS + 1);
    (void)sfs_cache_prealloc(c, &extra);
    (void)sfs_cache_remove(c, &gone);
    (void)sfs_cache_reap(c);
    sfs_cache_stats(c, &st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    uint8_t flags = data[0];
    int fd_baseline = fz_lowest_free_fd();
    int ctl = build_ctl(data, size, flags);
    uint32_t nseg = cache->nsegments;
    int segs[64];

    if (nseg > 64)
        fz_fail("too many segments for the harness");
    if (flags & F_FEWER_SEGS)
        nseg--;
    for (uint32_t i = 0; i < nseg; i++) {
        segs[i] = fcntl(cache->seg_fds[i], F_DUPFD_CLOEXEC, 0);
        if (segs[i] < 0)
            fz_fail("dup: %s", strerror(errno));
    }
    if ((flags & F_SMALL_SEG) && nseg) {
        close(segs[nseg - 1]);
        segs[nseg - 1] = memfd_create("fuzz-seg", MFD_CLOEXEC);
        if (segs[nseg - 1] < 0 || ftruncate(segs[nseg - 1], 4096) < 0)
            fz_fail("small segment: %s", strerror(errno));
    }

    int err = 0;
    struct sfs_cache *c = sfs_cache_attach_fds(ctl, segs, (flags & F_QUERY) ? 0 : nseg,
                                               (flags & F_QUERY) ? -1 : 0, &err);
    if (flags & F_QUERY)
        for (uint32_t i = 0; i < nseg; i++)
            close(segs[i]); /* not passed: still ours */
    if (!c) {
        if (err >= 0)
            fz_fail("attach failed with %d, not -errno", err);
    } else {
        check_geometry(c);
        if (flags & F_LATE)
            rewrite(c->ctl, c->ctl_len, data, size);
        if (flags & F_OPS)
            exercise(c);
        sfs_cache_close(c);
    }

    /* Every fd given to the attach is closed, on success and on failure. */
    fz_check_no_fd_leak(fd_baseline);
    return 0;
}
