/* SPDX-License-Identifier: MIT */
/*
 * ctl.c - the control plane's geometry: laid out by its creator, validated by
 * every attacher.
 *
 * Key idea: one function (layout) computes every offset and the region size
 * from the geometry, for the creator and for each attacher's check, so the
 * two can never disagree. The creator writes the header, then the format word
 * (a hash of the layout's sizes and offsets, see layout_i.h), then the magic
 * last, so a half-built region is never taken for valid. An attacher trusts
 * nothing in the header: it recomputes the layout from the geometry it reads,
 * requires every stored size and offset to equal the recomputed one, and
 * keeps its own copy (cache_i.h) so nothing is re-read from shared memory.
 */
#include "cache_i.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(SFS_MAX_PARTITIONS == SFS_MAX_PARTITIONS_PUBLIC, "one bound on domains");

#define DEFAULT_SEGMENT    (1ull << 30)
#define DEFAULT_MAX_PROCS  64u
#define DEFAULT_MAX_LEASES 16384u
#define HUGE_2M            (2ull << 20)
#define STRIDE_ALIGN       4096u

/* ---------------------------------------------------------------------------
 * Layout: one function computes offsets from the geometry, for the creator
 * and for every attacher's validation.
 */

struct geometry {
    uint64_t shard_size, stride, seg_size;
    uint32_t nslots, nreserved, nbuckets, max_procs, max_leases, nsegments, slots_per_seg;
    uint32_t npartitions, npins, pin_budget, pin_user_budget, pin_max_s;
    uint32_t part_end[SFS_MAX_PARTITIONS], part_rend[SFS_MAX_PARTITIONS];
    uint64_t off_buckets, off_slots, off_procs, off_leases, off_hits, off_pins, size;
};

/* Where the geometry lives in the header: what the creator chose, and what
 * it laid out. One list each, so the header the creator writes and the one
 * an attacher reads (and checks) cannot disagree on a field: the geometry's
 * name, then the header's. */
#define GEOMETRY_CHOSEN(X)                                                                         \
    X(shard_size, shard_size)                                                                      \
    X(stride, stride)                                                                              \
    X(seg_size, segment_size)                                                                      \
    X(nslots, nslots)                                                                              \
    X(nreserved, nreserved)                                                                        \
    X(nbuckets, nbuckets)                                                                          \
    X(max_procs, max_procs)                                                                        \
    X(max_leases, max_leases)                                                                      \
    X(nsegments, nsegments)                                                                        \
    X(slots_per_seg, slots_per_segment)                                                            \
    X(npartitions, npartitions)                                                                    \
    X(npins, npins)                                                                                \
    X(pin_budget, pin_budget)                                                                      \
    X(pin_user_budget, pin_user_budget)                                                            \
    X(pin_max_s, pin_max_s)
#define GEOMETRY_LAID_OUT(X)                                                                       \
    X(size, region_size)                                                                           \
    X(off_buckets, off_buckets)                                                                    \
    X(off_slots, off_slots)                                                                        \
    X(off_procs, off_procs)                                                                        \
    X(off_leases, off_leases)                                                                      \
    X(off_hits, off_hits)                                                                          \
    X(off_pins, off_pins)

static void geometry_to_header(const struct geometry *g, struct sfs_header *h)
{
#define STORE(gf, hf) h->hf = g->gf;
    GEOMETRY_CHOSEN(STORE)
    GEOMETRY_LAID_OUT(STORE)
#undef STORE
    memcpy(h->part_end, g->part_end, sizeof(h->part_end));
    memcpy(h->part_rend, g->part_rend, sizeof(h->part_rend));
}

/* What the creator chose, as the header says (to be checked). */
static void geometry_from_header(const struct sfs_header *h, struct geometry *g)
{
    memset(g, 0, sizeof(*g));
#define LOAD(gf, hf) g->gf = h->hf;
    GEOMETRY_CHOSEN(LOAD)
#undef LOAD
    memcpy(g->part_end, h->part_end, sizeof(g->part_end));
    memcpy(g->part_rend, h->part_rend, sizeof(g->part_rend));
}

/* The layout g computes is the one the header records. */
static bool geometry_laid_out_as(const struct geometry *g, const struct sfs_header *h)
{
#define SAME(gf, hf) &&g->gf == h->hf
    return true GEOMETRY_LAID_OUT(SAME);
#undef SAME
}

static void layout(struct geometry *g)
{
    uint64_t off = SFS_ALIGN_UP(sizeof(struct sfs_header), SFS_CACHELINE);

    g->off_buckets = off;
    off += (uint64_t)g->nbuckets * sizeof(struct sfs_bucket_rec);
    g->off_slots = off;
    off += (uint64_t)g->nslots * sizeof(struct sfs_slot_rec);
    g->off_procs = off;
    off += (uint64_t)g->max_procs * sizeof(struct sfs_proc_rec);
    g->off_leases = off;
    off += (uint64_t)g->max_procs * g->max_leases * sizeof(uint32_t);
    off = SFS_ALIGN_UP(off, SFS_CACHELINE);
    g->off_hits = off;
    off += (uint64_t)g->max_procs * g->max_leases * sizeof(uint64_t);
    g->off_pins = off;
    off += (uint64_t)g->npins * sizeof(struct sfs_pin_rec);
    g->size = SFS_ALIGN_UP(off, 4096);
}

static uint64_t fnv(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t sfs_layout_format(void)
{
    const uint64_t parts[] = {
        SFS_LAYOUT_VERSION,
        sizeof(struct sfs_header),
        offsetof(struct sfs_header, hand),
        offsetof(struct sfs_header, release_seq),
        offsetof(struct sfs_header, proc_lock),
        offsetof(struct sfs_header, pin_lock),
        offsetof(struct sfs_header, dom),
        offsetof(struct sfs_header, part_end),
        offsetof(struct sfs_header, part_rend),
        sizeof(struct sfs_pin_rec),
        SFS_MAX_PARTITIONS,
        offsetof(struct sfs_header, retired),
        offsetof(struct sfs_header, off_hits),
        offsetof(struct sfs_header, procs_used),
        SFS_HIT_LINE,
        sizeof(struct sfs_bucket_rec),
        offsetof(struct sfs_bucket_rec, head),
        sizeof(struct sfs_slot_rec),
        offsetof(struct sfs_slot_rec, state),
        offsetof(struct sfs_slot_rec, version),
        offsetof(struct sfs_slot_rec, refcount),
        offsetof(struct sfs_slot_rec, accessed),
        sizeof(struct sfs_proc_rec),
        offsetof(struct sfs_proc_rec, lease_hwm),
        offsetof(struct sfs_proc_rec, release_waiting),
        offsetof(struct sfs_proc_rec, ctr),
        CTR_COUNT,
        sizeof(pthread_mutex_t),
    };
    uint64_t h = 0xcbf29ce484222325ull;

    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
        h = fnv(h, parts[i]);
    return h;
}

static uint32_t pow2_at_least(uint64_t v)
{
    uint32_t p = 1;

    while (p < v && p < (1u << 31))
        p <<= 1;
    return p;
}

/*
 * Each domain's budget: the boundaries of its ranges in the regular and the
 * reserved pool, from weights (NULL: all equal, which is d * n / P). Domain
 * d ends at n * (w[0] + ... + w[d]) / sum, so the ranges tile each pool
 * exactly. Every domain needs one regular slot at least: -EINVAL if not.
 */
static int domain_bounds(struct geometry *g, const uint32_t *w)
{
    uint32_t p = g->npartitions, nregular = g->nslots - g->nreserved;
    uint64_t sum = 0, acc = 0;

    for (uint32_t d = 0; d < p; d++) {
        if (w && (w[d] == 0 || w[d] > SFS_PARTITION_WEIGHT_MAX))
            return -EINVAL;
        sum += w ? w[d] : 1;
    }
    for (uint32_t d = 0; d < p; d++) {
        acc += w ? w[d] : 1;
        g->part_end[d] = (uint32_t)((uint64_t)nregular * acc / sum);
        g->part_rend[d] = (uint32_t)((uint64_t)g->nreserved * acc / sum);
        if (g->part_end[d] <= (d ? g->part_end[d - 1] : 0))
            return -EINVAL;
    }
    return 0;
}

/* Attach: the boundaries as domain_bounds() leaves them, whatever weights. */
static bool domain_bounds_ok(const struct geometry *g)
{
    uint32_t nregular = g->nslots - g->nreserved;

    for (uint32_t d = 0; d < g->npartitions; d++)
        if (g->part_end[d] <= (d ? g->part_end[d - 1] : 0) ||
            g->part_rend[d] < (d ? g->part_rend[d - 1] : 0))
            return false;
    return g->part_end[g->npartitions - 1] == nregular &&
           g->part_rend[g->npartitions - 1] == g->nreserved;
}

static int geometry_from_config(const struct sfs_cache_config *cfg, struct geometry *g)
{
    uint64_t cap = cfg->capacity ? cfg->capacity : SFS_DEFAULT_CAPACITY;
    uint64_t segbytes = cfg->segment_size ? cfg->segment_size : DEFAULT_SEGMENT;
    uint64_t nslots;

    memset(g, 0, sizeof(*g));
    g->shard_size = cfg->shard_size ? cfg->shard_size : SFS_DEFAULT_SHARD_SIZE;
    if (g->shard_size > UINT32_MAX)
        return -EINVAL;
    g->stride = SFS_ALIGN_UP(g->shard_size, STRIDE_ALIGN);
    nslots = cfg->nslots ? cfg->nslots : cap / g->shard_size;
    if (nslots < 1 || nslots >= (1u << 29))
        return -EINVAL;
    g->nslots = (uint32_t)nslots;
    if (cfg->no_reserved)
        g->nreserved = 0;
    else
        g->nreserved = cfg->nreserved ? cfg->nreserved : g->nslots / 64;
    if (g->nreserved >= g->nslots)
        return -EINVAL;
    /* Domains: each needs a regular slot at least. */
    g->npartitions = cfg->partitions ? cfg->partitions : 1;
    if (g->npartitions > SFS_MAX_PARTITIONS || g->npartitions > g->nslots - g->nreserved)
        return -EINVAL;
    if (domain_bounds(g, cfg->partition_weights) < 0)
        return -EINVAL;
    if (cfg->pin_budget_pct > 100)
        return -EINVAL;
    uint32_t pct = cfg->pin_budget_pct ? (uint32_t)cfg->pin_budget_pct : SFS_DEFAULT_PIN_BUDGET_PCT;
    g->pin_budget = cfg->pin_budget_pct < 0 ? 0 : (uint32_t)((uint64_t)g->nslots * pct / 100);
    if (cfg->pin_user_pct > 100 || cfg->pin_max_seconds > SFS_PIN_MAX_SECONDS)
        return -EINVAL;
    /* A user's share: 0 (no bound) when it is the whole budget. */
    g->pin_user_budget = cfg->pin_user_pct && cfg->pin_user_pct < 100
                             ? (uint32_t)((uint64_t)g->pin_budget * cfg->pin_user_pct / 100)
                             : 0;
    g->pin_max_s = cfg->pin_max_seconds;
    /* One entry per pinned block; half the slots is room for a budget of
     * 100 % in blocks of two shards (a table of 32 bytes an entry). */
    g->npins = pow2_at_least(g->nslots / 2 > 65536 ? 65536 : g->nslots / 2);
    if (g->npins < 64)
        g->npins = 64;
    g->nbuckets = pow2_at_least(cfg->nbuckets ? cfg->nbuckets : g->nslots / 2);
    if (g->nbuckets < 64)
        g->nbuckets = 64;
    g->max_procs = cfg->max_procs ? cfg->max_procs : DEFAULT_MAX_PROCS;
    g->max_leases = cfg->max_leases ? cfg->max_leases : DEFAULT_MAX_LEASES;
    if (g->max_procs > 4096 || g->max_leases > (1u << 24))
        return -EINVAL;
    /* Slots per segment: a power of two when it can be, for shift + mask. */
    uint64_t sps = segbytes / g->stride;
    if (sps < 1)
        sps = 1;
    if (sps > g->nslots)
        sps = g->nslots;
    uint32_t p2 = 1;
    while ((uint64_t)p2 * 2 <= sps)
        p2 *= 2;
    if (p2 * 2 > sps && sps != g->nslots)
        sps = p2;
    g->slots_per_seg = (uint32_t)sps;
    g->nsegments = (uint32_t)((g->nslots + sps - 1) / sps);
    g->seg_size = SFS_ALIGN_UP(sps * g->stride, HUGE_2M);
    layout(g);
    return 0;
}

static void adopt_geometry(struct sfs_cache *c, const struct geometry *g)
{
    /* The handle keeps what the creator chose under the geometry's names. */
#define ADOPT(gf, hf) c->gf = g->gf;
    GEOMETRY_CHOSEN(ADOPT)
#undef ADOPT
    c->nregular = g->nslots - g->nreserved;
    c->bucket_mask = g->nbuckets - 1;
    c->nhit = sfs_hit_entries(g->max_leases);
    c->seg_shift = 0;
    c->seg_mask = 0;
    if ((g->slots_per_seg & (g->slots_per_seg - 1)) == 0 && g->slots_per_seg > 1) {
        c->seg_shift = (uint32_t)__builtin_ctz(g->slots_per_seg);
        c->seg_mask = g->slots_per_seg - 1;
    }
    c->hdr = c->ctl;
    c->buckets = (struct sfs_bucket_rec *)((uint8_t *)c->ctl + g->off_buckets);
    c->slots = (struct sfs_slot_rec *)((uint8_t *)c->ctl + g->off_slots);
    c->procs = (struct sfs_proc_rec *)((uint8_t *)c->ctl + g->off_procs);
    c->off_leases = g->off_leases;
    c->off_hits = g->off_hits;
    memcpy(c->part_end, g->part_end, sizeof(c->part_end));
    memcpy(c->part_rend, g->part_rend, sizeof(c->part_rend));
    c->pins = (struct sfs_pin_rec *)((uint8_t *)c->ctl + g->off_pins);
}

int sfs_ctl_init(struct sfs_cache *c, const struct sfs_cache_config *cfg)
{
    struct geometry g;
    struct sfs_header *h;
    int r;

    r = geometry_from_config(cfg, &g);
    if (r < 0)
        return r;
    c->ctl_fd = memfd_create("shardfs-ctl", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (c->ctl_fd < 0)
        return -errno;
    if (ftruncate(c->ctl_fd, (off_t)g.size) < 0)
        return -errno;
    /* The control plane never changes size: seal it so no one can shrink it
     * under another process's mapping. */
    fcntl(c->ctl_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
    c->ctl = mmap(NULL, g.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, c->ctl_fd, 0);
    if (c->ctl == MAP_FAILED) {
        c->ctl = NULL;
        return -errno;
    }
    c->ctl_len = g.size;
    adopt_geometry(c, &g);

    h = c->hdr;
    geometry_to_header(&g, h);
    h->seg_shift = c->seg_shift;
    r = sfs_robust_mutex_init(&h->proc_lock);
    if (r < 0)
        return r;
    r = sfs_robust_mutex_init(&h->pin_lock);
    if (r < 0)
        return r;
    for (uint32_t b = 0; b < g.nbuckets; b++) {
        r = sfs_robust_mutex_init(&c->buckets[b].lock);
        if (r < 0)
            return r;
        atomic_store_explicit(&c->buckets[b].head, SFS_NIL, memory_order_relaxed);
    }
    for (uint32_t s = 0; s < g.nslots; s++) {
        struct sfs_slot_rec *sl = &c->slots[s];

        atomic_store_explicit(&sl->bucket, SFS_NIL, memory_order_relaxed);
        atomic_store_explicit(&sl->next, SFS_NIL, memory_order_relaxed);
        atomic_store_explicit(&sl->owner, SFS_NIL, memory_order_relaxed);
        if (s >= c->nregular)
            atomic_store_explicit(&sl->flags, SLOT_F_RESERVED, memory_order_relaxed);
    }
    /* Publish: magic last, so a half-built region is never taken for valid. */
    h->format = sfs_layout_format();
    atomic_thread_fence(memory_order_release);
    h->magic = SFS_MAGIC;
    return 0;
}

int sfs_ctl_validate(struct sfs_cache *c)
{
    const struct sfs_header *h = c->ctl;
    struct geometry g;
    struct stat st;

    if (fstat(c->ctl_fd, &st) < 0)
        return -errno;
    if ((uint64_t)st.st_size < sizeof(struct sfs_header))
        return -EBADMSG;
    if (h->magic != SFS_MAGIC)
        return -EBADMSG;
    if (h->format != sfs_layout_format())
        return -EPROTO;
    geometry_from_header(h, &g);
    /* Each field within the bounds geometry_from_config() gives it. */
    if (g.shard_size == 0 || g.shard_size > UINT32_MAX || g.nslots == 0 || g.nslots >= (1u << 29) ||
        g.nreserved >= g.nslots || g.nbuckets == 0 || (g.nbuckets & (g.nbuckets - 1)) ||
        g.max_procs == 0 || g.max_procs > 4096 || g.max_leases == 0 || g.max_leases > (1u << 24) ||
        g.slots_per_seg == 0 || g.slots_per_seg > g.nslots || g.npartitions == 0 ||
        g.npartitions > SFS_MAX_PARTITIONS || g.npartitions > g.nslots - g.nreserved ||
        g.npins < 64 || g.npins > 65536 || (g.npins & (g.npins - 1)) || g.pin_budget > g.nslots ||
        g.pin_user_budget > g.pin_budget || g.pin_max_s > SFS_PIN_MAX_SECONDS ||
        !domain_bounds_ok(&g))
        return -EBADMSG;
    /* Every derived size recomputed as the creator computes it, each product
     * overflow-checked, and required equal: stride exactly the aligned shard
     * size (it bounds every slot's address), segment size exactly the
     * aligned slots-per-segment * stride, and the segments exactly cover the
     * slots. (A stride of 2^61 was accepted when only bounded below, and
     * slots_per_segment * stride wrapped.) */
    uint64_t seg_bytes, total;
    if (g.stride != SFS_ALIGN_UP(g.shard_size, STRIDE_ALIGN) ||
        __builtin_mul_overflow((uint64_t)g.slots_per_seg, g.stride, &seg_bytes) ||
        seg_bytes > UINT64_MAX - HUGE_2M || g.seg_size != SFS_ALIGN_UP(seg_bytes, HUGE_2M) ||
        g.nsegments != (g.nslots + (uint64_t)g.slots_per_seg - 1) / g.slots_per_seg ||
        __builtin_mul_overflow((uint64_t)g.nsegments, g.seg_size, &total))
        return -EBADMSG;
    layout(&g);
    if (!geometry_laid_out_as(&g, h) || g.size != (uint64_t)st.st_size || g.size != c->ctl_len)
        return -EBADMSG;
    adopt_geometry(c, &g);
    return 0;
}

/* ---------------------------------------------------------------------------
 * The handle's geometry and segments, as validated.
 */

void sfs_cache_info(struct sfs_cache *c, struct sfs_cache_info *o)
{
    memset(o, 0, sizeof(*o));
    o->shard_size = c->shard_size;
    o->nslots = c->nslots;
    o->nreserved = c->nreserved;
    o->nbuckets = c->nbuckets;
    o->nsegments = c->nsegments;
    o->max_procs = c->max_procs;
    o->hugepages = c->hugepages;
    o->query_only = c->query_only;
    o->proc_index = (int)c->me;
    o->control_bytes = c->ctl_len;
}

void *sfs_cache_segment(struct sfs_cache *c, uint32_t i, size_t *len)
{
    if (!c || c->query_only || i >= c->nsegments)
        return NULL;
    if (len)
        *len = c->seg_size;
    return c->seg_base[i];
}
