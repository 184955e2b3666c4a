/* SPDX-License-Identifier: MIT */
/*
 * usage.c - the learned hot set and warm restart (design.md, section 10; docs/fs.md,
 * "Warm restart").
 *
 * The daemon keeps decayed per-block usage counts in a fixed table of
 * USE_SETS x USE_WAYS entries (set-associative by a hash of the block id;
 * when a block's set is full the entry with the lowest count, the coldest,
 * is replaced). Two sources feed it, neither on the cache's hit path:
 *   - the mount's own reads: a read at offset 0 of a shard counts one use of
 *     its block (fs_usage_note, under one of USE_STRIPES striped locks, so
 *     reads of different blocks share no line bar a stripe collision);
 *   - a sampler thread that, every USE_TICK_MS, looks at the Ready slots of
 *     the next USE_SAMPLE_BUCKETS buckets (all of a cache of up to ~32K
 *     slots) through sfs_cache_sample() (read-only: the CLOCK accessed bit and
 *     whether a lease holds the slot) and counts a use for a slot that is
 *     leased now, or whose accessed bit is set and was clear (or held
 *     another key) at the previous sample. That sees the ranks' use of the
 *     cache without a word written on their path.
 * Every USE_HALF_LIFE_S all counts halve (decay). The table is written to
 * BACKEND_DIR/.shardfs_usage every USE_SAVE_S when it changed and at stop,
 * by tmp + fsync + rename (+ fsync of the directory).
 *
 * At mount, the file (if valid) seeds the table, and a warm thread loads
 * the hottest blocks, all the shards the backend has of each, up to
 * warm_pct % of capacity, through the advisory prefetch path (loads.c:
 * SFS_GET_PREFETCH never evicts a leased slot and never blocks a reader; a
 * reader of a key being warmed is its waiter), a bounded number at a time.
 * A bad file (short, corrupt, foreign, another version) is ignored with one
 * log line; the mount never fails for it.
 *
 * Calls loads.c and log.c; read.c, storecap.c (the counts rank the store's
 * blocks) and main.c call it.
 */
#include "fs_i.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

#define USE_WAYS           8
#define USE_SETS           8192 /* x USE_WAYS = 65536 blocks, 24 B each: 1.5 MiB */
#define USE_STRIPES        64
#define USE_TICK_MS        1000
#define USE_SAMPLE_BUCKETS 16384 /* buckets one tick samples: bounds its cost */
#define USE_SAVE_S         60    /* the file is rewritten this often when it changed */
/* Test hooks (the test build, shardfs-hooks, only): SHARDFS_TEST_USAGE_SAVE_S=N
 * (1..USE_SAVE_S) rewrites it every N s and SHARDFS_TEST_USAGE_HALF_LIFE_S=N
 * (1..USE_HALF_LIFE_S) halves the counts every N s, so that a test sees
 * either without waiting minutes. */
#define USE_SAVE_ENV       "SHARDFS_TEST_USAGE_SAVE_S"
#define USE_HALF_LIFE_ENV  "SHARDFS_TEST_USAGE_HALF_LIFE_S"
#define USE_HALF_LIFE_S    600   /* counts halve this often */
#define USE_MAX_INFLIGHT   64    /* warm loads in flight at once (also <= nslots / 8) */
/* The usage file's read (at start) and write (periodic, at stop) wait this
 * long for the store, then go on without it (storefile.c). */
#define USE_IO_TIMEOUT_NS (5 * 1000 * 1000 * 1000ll)

/* The file: a 40-byte header, count entries of 24 bytes, an 8-byte FNV-1a
 * 64 checksum of everything before it. Little-endian. docs/fs.md. */
#define USE_FILE     ".shardfs_usage"
#define USE_MAGIC    "SFSUSAGE"
#define USE_VERSION  1
#define USE_HDR      40
#define USE_ENT      24
#define USE_MAX_FILE ((uint64_t)USE_HDR + (uint64_t)USE_SETS * USE_WAYS * USE_ENT + 8)

struct use_ent {
    uint8_t id[SFS_BLOCK_ID_LEN];
    uint32_t count; /* 0: empty */
};

struct use_stripe {
    pthread_mutex_t lock; /* the sets s with s % USE_STRIPES == this stripe */
    bool dirty;           /* lock: a count changed since the last save */
} __attribute__((aligned(64)));

struct fs_usage {
    struct fs *fs;
    struct use_ent *ents; /* USE_SETS * USE_WAYS; stripe locks */
    struct use_stripe stripes[USE_STRIPES];
    char path[PATH_MAX]; /* BACKEND_DIR/.shardfs_usage */
    bool save;           /* write the file (not with -o ro) */
    uint32_t save_ticks; /* sampler ticks between periodic writes */
    uint32_t half_ticks; /* sampler ticks between two halvings of the counts */

    /* The sampler's own memory (only its thread touches it). */
    uint32_t nslots;
    uint32_t nregular;         /* slots outside the reserved pool: the most warm may fill */
    uint64_t *seen_key;        /* per slot: hash of the key at the last sample | 1, 0: none */
    uint8_t *seen_acc;         /* per slot: its accessed bit then */
    struct sfs_block_id *used; /* blocks of this pass's used slots (at most nslots) */
    uint32_t nused;
    uint32_t cursor; /* the next bucket to sample */

    /* Warm restart: blocks hottest first (set before the warm thread starts). */
    struct use_ent *warm;
    size_t nwarm;
    unsigned warm_pct;
    bool warm_started;

    pthread_t sampler, warmer;
    bool sampler_started;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* CLOCK_MONOTONIC: stop was set */
    _Atomic bool stop;   /* relaxed reads by the warm loop; set under lock */
};

static uint64_t block_hash(const uint8_t *id)
{
    uint64_t a, b;

    memcpy(&a, id, 8);
    memcpy(&b, id + 8, 8);
    a ^= b * 0x9e3779b97f4a7c15ull;
    a ^= a >> 31;
    a *= 0xbf58476d1ce4e5b9ull;
    return a ^ (a >> 29);
}

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Add v uses of block id (saturating). */
static void use_add(struct fs_usage *u, const uint8_t *id, uint32_t v)
{
    uint64_t h = block_hash(id);
    uint32_t set = (uint32_t)h & (USE_SETS - 1);
    struct use_stripe *st = &u->stripes[set % USE_STRIPES];
    struct use_ent *e = &u->ents[(size_t)set * USE_WAYS], *victim = NULL;

    pthread_mutex_lock(&st->lock);
    for (int w = 0; w < USE_WAYS; w++) {
        if (e[w].count && memcmp(e[w].id, id, SFS_BLOCK_ID_LEN) == 0) {
            e[w].count = e[w].count > UINT32_MAX - v ? UINT32_MAX : e[w].count + v;
            st->dirty = true;
            pthread_mutex_unlock(&st->lock);
            return;
        }
        if (!victim || e[w].count < victim->count)
            victim = &e[w]; /* an empty way (0), else the coldest */
    }
    /* Full set: the coldest entry makes room (a block hotter than it stays). */
    memcpy(victim->id, id, SFS_BLOCK_ID_LEN);
    victim->count = v;
    st->dirty = true;
    pthread_mutex_unlock(&st->lock);
}

uint32_t fs_usage_count(struct fs *fs, const struct sfs_block_id *block)
{
    struct fs_usage *u = fs->usage;
    uint32_t set, n = 0;
    struct use_stripe *st;
    struct use_ent *e;

    if (!u)
        return 0;
    set = (uint32_t)block_hash(block->b) & (USE_SETS - 1);
    st = &u->stripes[set % USE_STRIPES];
    e = &u->ents[(size_t)set * USE_WAYS];
    pthread_mutex_lock(&st->lock);
    for (int w = 0; w < USE_WAYS; w++) {
        if (e[w].count && memcmp(e[w].id, block->b, SFS_BLOCK_ID_LEN) == 0) {
            n = e[w].count;
            break;
        }
    }
    pthread_mutex_unlock(&st->lock);
    return n;
}

unsigned fs_usage_hottest(struct fs *fs, struct sfs_block_id *ids, uint32_t *counts, unsigned max)
{
    struct fs_usage *u = fs->usage;
    unsigned n = 0;

    /* Bounded: one pass over the table, a stripe's lock at a time. */
    for (uint32_t stripe = 0; u && stripe < USE_STRIPES; stripe++) {
        pthread_mutex_lock(&u->stripes[stripe].lock);
        for (uint32_t set = stripe; set < USE_SETS; set += USE_STRIPES) {
            const struct use_ent *e = &u->ents[(size_t)set * USE_WAYS];

            for (int w = 0; w < USE_WAYS; w++) {
                unsigned i = n < max ? n++ : max;

                if (i == max && (max == 0 || e[w].count <= counts[max - 1]))
                    continue; /* not among the hottest max */
                i = i == max ? max - 1 : i;
                while (i > 0 && counts[i - 1] < e[w].count) { /* insertion, hottest first */
                    counts[i] = counts[i - 1];
                    ids[i] = ids[i - 1];
                    i--;
                }
                counts[i] = e[w].count;
                memcpy(ids[i].b, e[w].id, SFS_BLOCK_ID_LEN);
            }
        }
        pthread_mutex_unlock(&u->stripes[stripe].lock);
    }
    while (n > 0 && counts[n - 1] == 0)
        n--; /* empty entries are no blocks */
    return n;
}

void fs_usage_note(struct fs *fs, const struct sfs_block_id *block)
{
    if (fs->usage)
        use_add(fs->usage, block->b, 1);
}

/* ---------------------------------------------------------------------------
 * The file.
 */

/* BACKEND_DIR of a posix store (a plain path or posix:DIR?opts), else NULL:
 * mem: and fault: stores have no usage file. */
static bool usage_path(const char *spec, char *out, size_t len)
{
    size_t n;

    if (strncmp(spec, "mem", 3) == 0 || strncmp(spec, "fault:", 6) == 0)
        return false;
    if (strncmp(spec, "posix:", 6) == 0) {
        const char *q = strchr(spec + 6, '?');

        spec += 6;
        n = q ? (size_t)(q - spec) : strlen(spec);
    } else {
        n = strlen(spec);
    }
    while (n > 1 && spec[n - 1] == '/')
        n--;
    return n && snprintf(out, len, "%.*s/%s", (int)n, spec, USE_FILE) < (int)len;
}

static int cmp_hot(const void *a, const void *b)
{
    const struct use_ent *x = a, *y = b;

    return x->count < y->count   ? 1
           : x->count > y->count ? -1
                                 : memcmp(x->id, y->id, SFS_BLOCK_ID_LEN);
}

/* Read and check the file; on success *out (malloc'd, *n entries, counts >
 * 0). Returns 0, -ENOENT (no file: silent), or -EINVAL or -ETIMEDOUT (the
 * store did not answer within USE_IO_TIMEOUT_NS) with *why set. */
static int usage_read(struct fs_usage *u, struct use_ent **out, size_t *n, const char **why)
{
    uint8_t *buf = NULL;
    size_t size;
    uint64_t shard_size, sum;
    uint32_t version, id_len, count, ent_size;
    int r;

    /* On a thread of its own, opened O_NONBLOCK | O_NOFOLLOW and used only
     * as a regular file (storefile.c): a FIFO, a device or a symlink at the
     * name, or a store that stopped answering, never holds the start. */
    r = fs_store_file_read(u->path, USE_MAX_FILE, USE_IO_TIMEOUT_NS, &buf, &size, why);
    if (r < 0)
        return r;
    r = -EINVAL;
    if (size < USE_HDR + 8) {
        *why = "truncated";
        goto out;
    }
    if (memcmp(buf, USE_MAGIC, 8) != 0) {
        *why = "not a shardfs usage file (bad magic)";
        goto out;
    }
    memcpy(&version, buf + 8, 4);
    memcpy(&id_len, buf + 12, 4);
    memcpy(&shard_size, buf + 16, 8);
    memcpy(&count, buf + 32, 4);
    memcpy(&ent_size, buf + 36, 4);
    version = le32toh(version);
    id_len = le32toh(id_len);
    shard_size = le64toh(shard_size);
    count = le32toh(count);
    ent_size = le32toh(ent_size);
    if (version != USE_VERSION) {
        *why = "another version";
        goto out;
    }
    if (size != USE_HDR + (uint64_t)count * USE_ENT + 8) {
        *why = size < USE_HDR + (uint64_t)count * USE_ENT + 8 ? "truncated" : "trailing bytes";
        goto out;
    }
    memcpy(&sum, buf + size - 8, 8);
    if (le64toh(sum) != fnv1a(buf, size - 8)) {
        *why = "checksum mismatch (corrupt)";
        goto out;
    }
    if (id_len != SFS_BLOCK_ID_LEN || ent_size != USE_ENT) {
        *why = "foreign block-id format";
        goto out;
    }
    if (shard_size != u->fs->shard_size) {
        *why = "written for another shard_size (foreign)";
        goto out;
    }
    *out = calloc(count ? count : 1, sizeof(**out));
    if (!*out) {
        *why = "no memory";
        goto out;
    }
    *n = 0;
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *p = buf + USE_HDR + (size_t)i * USE_ENT;
        uint32_t c;

        memcpy(&c, p + 16, 4);
        c = le32toh(c);
        if (!c)
            continue;
        memcpy((*out)[*n].id, p, SFS_BLOCK_ID_LEN);
        (*out)[(*n)++].count = c;
    }
    r = 0;
out:
    free(buf);
    return r;
}

/* Write the table (storefile.c: tmp + fsync + rename + fsync of the
 * directory, within USE_IO_TIMEOUT_NS). Does
 * nothing when no count changed since the last save (force: unless the
 * table is empty). Errors: one log line. */
static void usage_save(struct fs_usage *u)
{
    size_t cap = (size_t)USE_SETS * USE_WAYS, n = 0;
    uint8_t *buf;
    bool dirty = false;
    uint32_t v32;
    uint64_t v64;
    int r;

    if (!u->save)
        return;
    for (int i = 0; i < USE_STRIPES; i++) {
        pthread_mutex_lock(&u->stripes[i].lock);
        dirty |= u->stripes[i].dirty;
        pthread_mutex_unlock(&u->stripes[i].lock);
    }
    if (!dirty)
        return;
    buf = malloc(USE_HDR + cap * USE_ENT + 8);
    if (!buf)
        return;
    for (int i = 0; i < USE_STRIPES; i++) {
        struct use_stripe *st = &u->stripes[i];

        pthread_mutex_lock(&st->lock);
        for (uint32_t set = (uint32_t)i; set < USE_SETS; set += USE_STRIPES) {
            for (int w = 0; w < USE_WAYS; w++) {
                const struct use_ent *e = &u->ents[(size_t)set * USE_WAYS + w];
                uint8_t *p = buf + USE_HDR + n * USE_ENT;

                if (!e->count)
                    continue;
                memcpy(p, e->id, SFS_BLOCK_ID_LEN);
                v32 = htole32(e->count);
                memcpy(p + 16, &v32, 4);
                memset(p + 20, 0, 4);
                n++;
            }
        }
        st->dirty = false;
        pthread_mutex_unlock(&st->lock);
    }
    memcpy(buf, USE_MAGIC, 8);
    v32 = htole32(USE_VERSION);
    memcpy(buf + 8, &v32, 4);
    v32 = htole32(SFS_BLOCK_ID_LEN);
    memcpy(buf + 12, &v32, 4);
    v64 = htole64(u->fs->shard_size);
    memcpy(buf + 16, &v64, 8);
    v64 = htole64((uint64_t)time(NULL));
    memcpy(buf + 24, &v64, 8);
    v32 = htole32((uint32_t)n);
    memcpy(buf + 32, &v32, 4);
    v32 = htole32(USE_ENT);
    memcpy(buf + 36, &v32, 4);
    v64 = htole64(fnv1a(buf, USE_HDR + n * USE_ENT));
    memcpy(buf + USE_HDR + n * USE_ENT, &v64, 8);

    /* Owns buf; on a thread of its own, within USE_IO_TIMEOUT_NS. */
    r = fs_store_file_replace(u->path, buf, USE_HDR + n * USE_ENT + 8, USE_IO_TIMEOUT_NS);
    if (r < 0)
        fs_log(LOG_WARNING, "usage file %s not written: %s", u->path,
               r == -ETIMEDOUT ? "the store did not answer in time"
               : r == -EBUSY   ? "an earlier write is still waiting on the store"
                               : strerror(-r));
}

/* ---------------------------------------------------------------------------
 * The sampler and the warm thread.
 */

static int sample_one(const struct sfs_key *key, uint32_t slot, bool accessed, bool leased,
                      void *arg)
{
    struct fs_usage *u = arg;
    uint64_t h = (block_hash(key->block.b) + key->shard) | 1;
    bool used;

    if (slot >= u->nslots)
        return 0;
    /* Used since the last sample: leased now, or its accessed bit turned on
     * (a hit or a claim after the hand cleared it, or a new key here). */
    used = leased || (accessed && (u->seen_key[slot] != h || !u->seen_acc[slot]));
    u->seen_key[slot] = h;
    u->seen_acc[slot] = accessed;
    /* Counted after the pass: no lock of ours is taken under a bucket lock. */
    if (used && u->nused < u->nslots)
        u->used[u->nused++] = key->block;
    return 0;
}

static void decay(struct fs_usage *u)
{
    for (int i = 0; i < USE_STRIPES; i++) {
        struct use_stripe *st = &u->stripes[i];

        pthread_mutex_lock(&st->lock);
        for (uint32_t set = (uint32_t)i; set < USE_SETS; set += USE_STRIPES)
            for (int w = 0; w < USE_WAYS; w++) {
                struct use_ent *e = &u->ents[(size_t)set * USE_WAYS + w];

                if (e->count) {
                    e->count >>= 1;
                    st->dirty = true;
                }
            }
        pthread_mutex_unlock(&st->lock);
    }
}

/* Sleeps ms or until stop; true when stopping. */
static bool nap(struct fs_usage *u, int64_t ms)
{
    int64_t until = sfs_now_ns() + ms * 1000000ll;
    struct timespec ts = {.tv_sec = until / 1000000000, .tv_nsec = until % 1000000000};
    bool stop;

    pthread_mutex_lock(&u->lock);
    /* Relaxed: stop is written under lock, read here under it too. */
    while (!atomic_load_explicit(&u->stop, memory_order_relaxed) &&
           pthread_cond_timedwait(&u->cond, &u->lock, &ts) != ETIMEDOUT)
        ;
    stop = atomic_load_explicit(&u->stop, memory_order_relaxed);
    pthread_mutex_unlock(&u->lock);
    return stop;
}

static void *sampler_main(void *arg)
{
    struct fs_usage *u = arg;
    uint64_t tick = 0;

    while (!nap(u, USE_TICK_MS)) {
        tick++;
        u->nused = 0;
        sfs_cache_sample(u->fs->cache, &u->cursor, USE_SAMPLE_BUCKETS, sample_one, u);
        for (uint32_t i = 0; i < u->nused; i++)
            use_add(u, u->used[i].b, 1);
        if (tick % u->half_ticks == 0)
            decay(u);
        if (tick % u->save_ticks == 0)
            usage_save(u);
    }
    return NULL;
}

/*
 * The warm budget, per eviction domain (-o partitions: shard s of a block is
 * domain s mod P's). Prefetch takes no reserved slot and evicts within its
 * key's domain only, so a budget over the whole cache let the hot blocks'
 * domain take more warm loads than it has slots: the colder ones evicted
 * the hotter ones warmed just before (a prewarmed slot gets no second
 * chance). Each domain gets warm_pct of its own regular slots; a block
 * warms its shards of domain d only while they fit d's budget, and the
 * first that does not closes d to every colder block: within each domain
 * the warmed set is a prefix of the ranking, and never more than the
 * domain holds, so the warm-up evicts nothing it warmed. One domain: the
 * whole regular pool, as before.
 */
struct warm_budget {
    uint32_t ndom;
    uint64_t left[SFS_MAX_PARTITIONS_PUBLIC];
    uint64_t total; /* budgeted over every domain, for the log line */
};

static void warm_budget_init(struct warm_budget *wb, struct fs *fs, uint32_t nregular, unsigned pct)
{
    uint32_t slots[SFS_MAX_PARTITIONS_PUBLIC];
    uint32_t p = sfs_cache_partition_slots(fs->cache, slots, SFS_MAX_PARTITIONS_PUBLIC);

    if (p <= 1 || p > SFS_MAX_PARTITIONS_PUBLIC) {
        uint64_t b = (uint64_t)fs->nslots * pct / 100;

        p = 1;
        slots[0] = nregular;
        wb->left[0] = b < nregular ? b : nregular;
    } else {
        for (uint32_t d = 0; d < p; d++)
            wb->left[d] = (uint64_t)slots[d] * pct / 100;
    }
    wb->ndom = p;
    wb->total = 0;
    for (uint32_t d = 0; d < p; d++)
        wb->total += wb->left[d];
}

/* Take block shards [0, n) from the budget: marks in `take` (n bits, by
 * shard) those to warm; a domain they do not fit is closed (left = 0).
 * Returns how many. */
static uint32_t warm_budget_take(struct warm_budget *wb, uint32_t n, uint8_t *take)
{
    uint64_t need[SFS_MAX_PARTITIONS_PUBLIC] = {0};
    uint32_t k = 0;

    for (uint32_t s = 0; s < n; s++)
        need[s % wb->ndom]++;
    for (uint32_t d = 0; d < wb->ndom; d++) {
        if (need[d] > wb->left[d]) {
            wb->left[d] = 0; /* no colder block jumps this one here */
            need[d] = 0;
        } else {
            wb->left[d] -= need[d];
        }
    }
    for (uint32_t s = 0; s < n; s++) {
        bool t = need[s % wb->ndom] != 0;

        take[s / 8] = (uint8_t)(t ? take[s / 8] | (1u << (s % 8)) : take[s / 8] & ~(1u << (s % 8)));
        k += t;
    }
    return k;
}

static bool warm_budget_spent(const struct warm_budget *wb)
{
    for (uint32_t d = 0; d < wb->ndom; d++)
        if (wb->left[d])
            return false;
    return true;
}

/* A log line at each 10 % step of the warm-up (started <= total shards). */
static void warm_progress(uint64_t started, uint64_t total, unsigned *step)
{
    unsigned pct = total ? (unsigned)(started * 100 / total) : 100;

    if (pct / 10 <= *step)
        return;
    *step = pct / 10;
    fs_log(LOG_INFO, "warm restart: %u %% (%" PRIu64 " of %" PRIu64 " shards started)", pct,
           started, total);
}

static void *warm_main(void *arg)
{
    struct fs_usage *u = arg;
    struct fs *fs = u->fs;
    uint64_t used = 0, started = 0;
    uint32_t inflight = fs->nslots / 8 ? fs->nslots / 8 : 1;
    size_t blocks = 0;
    unsigned pin_failed = 0;
    struct warm_budget wb;
    uint8_t *take = NULL;
    uint32_t take_n = 0;

    unsigned step = 0;

    warm_budget_init(&wb, fs, u->nregular, u->warm_pct);
    CTR_SET(fs, warm_total, wb.total);
    if (inflight > USE_MAX_INFLIGHT)
        inflight = USE_MAX_INFLIGHT;
    for (size_t i = 0; i < u->nwarm && !warm_budget_spent(&wb); i++) {
        struct sfs_block_id b;
        uint32_t nt;
        int n;

        memcpy(b.b, u->warm[i].id, SFS_BLOCK_ID_LEN);
        n = sfs_backend_shard_count(fs->be, &b);
        if (n <= 0)
            continue; /* gone from the store */
        if ((uint32_t)n > take_n) {
            uint8_t *t = realloc(take, ((size_t)n + 7) / 8);

            if (!t)
                break;
            take = t;
            take_n = (uint32_t)n;
        }
        nt = warm_budget_take(&wb, (uint32_t)n, take);
        if (nt == 0)
            continue;
        used += nt;
        blocks++;
        /* -o warm_pin: pin before loading, so each shard is pinned as it
         * lands (within pin_budget: past it, shards load unpinned). */
        if (fs->warm_pin_s) {
            int p = sfs_cache_pin(fs->cache, &b, 1, fs->warm_pin_s);

            if (p < 0 && !pin_failed++)
                fs_log(LOG_WARNING, "warm restart: pin: %s; warming unpinned", strerror(-p));
        }
        for (uint32_t s = 0; s < (uint32_t)n; s++) {
            int k;

            if (!(take[s / 8] & (1u << (s % 8))))
                continue; /* its domain's budget is spent */
            /* Relaxed: an approximate bound on the prefetch loads in flight
             * (all of them, readahead's and prefetch's too). */
            while (atomic_load_explicit(&fs->prefetch_pinned, memory_order_relaxed) >= inflight)
                if (nap(u, 1))
                    goto out;
            if (atomic_load_explicit(&u->stop, memory_order_relaxed))
                goto out;
            k = fs_prefetch_shards(fs, &b, s, 1, false);
            if (k > 0) {
                started += (uint64_t)k;
                CTR_ADD(fs, warmed, (uint64_t)k);
                warm_progress(started, wb.total, &step);
            }
        }
    }
out:
    free(take);
    /* Ended: what it started is the whole of it, so the progress reads 100 %. */
    CTR_SET(fs, warm_total, started);
    if (started && !atomic_load_explicit(&u->stop, memory_order_relaxed))
        warm_progress(started, started, &step);
    fs_log(LOG_INFO,
           "warm restart: %" PRIu64 " loads started for %zu blocks (%" PRIu64 " of %" PRIu64
           " shards budgeted, %u domain%s)",
           started, blocks, used, wb.total, wb.ndom, wb.ndom == 1 ? "" : "s");
    return NULL;
}

/* Sampler ticks in a period of dflt_s seconds, or (test build) of the N
 * seconds (1..dflt_s) a test's environment variable name gives; at least 1. */
#ifndef SFS_TEST_HOOKS
#define test_ticks(name, dflt_s) ((uint32_t)(1000 * (dflt_s) / USE_TICK_MS))
#else
static uint32_t test_ticks(const char *name, uint32_t dflt_s)
{
    const char *e = getenv(name);
    char *end;
    unsigned long v = e ? strtoul(e, &end, 10) : 0;
    uint32_t t;

    if (!e || !*e || *end != '\0' || v < 1 || v > dflt_s)
        v = dflt_s;
    t = (uint32_t)(v * 1000 / USE_TICK_MS);
    return t ? t : 1;
}
#endif

void fs_usage_start(struct fs *fs, const char *spec, unsigned warm_pct, bool save)
{
    struct fs_usage *u;
    struct sfs_cache_info ci;
    pthread_condattr_t ca;
    struct use_ent *file = NULL;
    size_t nfile = 0;
    const char *why = NULL;
    int r;

    fs->usage = NULL;
    u = calloc(1, sizeof(*u));
    if (!u)
        return;
    u->fs = fs;
    if (!usage_path(spec, u->path, sizeof(u->path))) {
        free(u); /* no store directory: no hot set (docs/fs.md) */
        return;
    }
    sfs_cache_info(fs->cache, &ci);
    u->nslots = ci.nslots;
    u->nregular = ci.nslots - ci.nreserved;
    u->ents = calloc((size_t)USE_SETS * USE_WAYS, sizeof(*u->ents));
    u->seen_key = calloc(u->nslots ? u->nslots : 1, sizeof(*u->seen_key));
    u->seen_acc = calloc(u->nslots ? u->nslots : 1, 1);
    u->used = calloc(u->nslots ? u->nslots : 1, sizeof(*u->used));
    if (!u->ents || !u->seen_key || !u->seen_acc || !u->used) {
        fs_log(LOG_WARNING, "hot set: out of memory; running without one");
        goto fail;
    }
    u->save = save;
    u->save_ticks = test_ticks(USE_SAVE_ENV, USE_SAVE_S);
    u->half_ticks = test_ticks(USE_HALF_LIFE_ENV, USE_HALF_LIFE_S);
    u->warm_pct = warm_pct;
    for (int i = 0; i < USE_STRIPES; i++)
        pthread_mutex_init(&u->stripes[i].lock, NULL);
    pthread_mutex_init(&u->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&u->cond, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&u->stop, false);

    r = usage_read(u, &file, &nfile, &why);
    if (r == -EINVAL || r == -ETIMEDOUT)
        fs_log(LOG_WARNING, "usage file %s ignored: %s", u->path, why);
    if (r == 0) {
        for (size_t i = 0; i < nfile; i++)
            use_add(u, file[i].id, file[i].count);
        for (int i = 0; i < USE_STRIPES; i++)
            u->stripes[i].dirty = false; /* as on disk */
        qsort(file, nfile, sizeof(*file), cmp_hot);
        u->warm = file;
        u->nwarm = nfile;
    }
    fs->usage = u;
    r = pthread_create(&u->sampler, NULL, sampler_main, u);
    u->sampler_started = r == 0;
    if (r)
        fs_log(LOG_WARNING, "hot set: sampler thread: %s; usage learned from reads only",
               strerror(r));
    if (warm_pct && u->nwarm) {
        r = pthread_create(&u->warmer, NULL, warm_main, u);
        u->warm_started = r == 0;
        if (r)
            fs_log(LOG_WARNING, "warm restart: thread: %s; not warming", strerror(r));
    }
    return;
fail:
    free(u->ents);
    free(u->seen_key);
    free(u->seen_acc);
    free(u->used);
    free(u);
}

void fs_usage_stop(struct fs *fs, bool free_it)
{
    struct fs_usage *u = fs->usage;

    if (!u)
        return;
    pthread_mutex_lock(&u->lock);
    atomic_store_explicit(&u->stop, true, memory_order_relaxed); /* under lock: see nap */
    pthread_cond_broadcast(&u->cond);
    pthread_mutex_unlock(&u->lock);
    if (u->warm_started)
        pthread_join(u->warmer, NULL);
    if (u->sampler_started)
        pthread_join(u->sampler, NULL);
    usage_save(u);
    if (!free_it)
        return; /* a thread left to the exit still reads the counts */
    fs->usage = NULL;
    for (int i = 0; i < USE_STRIPES; i++)
        pthread_mutex_destroy(&u->stripes[i].lock);
    pthread_cond_destroy(&u->cond);
    pthread_mutex_destroy(&u->lock);
    free(u->warm);
    free(u->ents);
    free(u->seen_key);
    free(u->seen_acc);
    free(u->used);
    free(u);
}
