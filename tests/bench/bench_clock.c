/* SPDX-License-Identifier: MIT */
/*
 * bench_clock.c - hit rates of the cache's CLOCK against exact LRU and FIFO on
 * the same traces, and whether a slot that was loaded is ever evicted before
 * it was copied out.
 *
 * Key idea: the real cache (one process, Get / fill / publish / release per
 * access) replays each trace beside simple simulators written here: exact LRU
 * (a doubly linked recency list), FIFO (an insertion queue), and a model of
 * the cache's own CLOCK (never-used slots first, then the hand; the accessed
 * bit set on hit and on a new load), also without the new-load bit, to show
 * what that bit buys. Traces are deterministic, so every policy sees the same
 * accesses. Batch traces load B keys and copy them later: with leases held
 * until the copy (the real contract) eviction is impossible by construction;
 * with the copy after the release only the accessed bit protects them. Those
 * rows run twice: the copy a plain Get (a use to every policy) and the copy a
 * peek (SFS_GET_PEEK: no policy counts it).
 */
#include "bench_util.h"

#include "testutil.h"

#include <math.h>

enum kind { REAL, CLOCK_SIM, REAL_SCAN, SCAN_SIM, CLOCK_NOBIT, LRU, LRU_FAIR, FIFO, NPOL };
static const char *const pol_name[NPOL] = {
    "CLOCK (the cache)",      "CLOCK model", "admission=scan (the cache)", "admission=scan model",
    "CLOCK, no new-load bit", "LRU (exact)", "LRU, leases honoured",       "FIFO",
};
#define IS_CLOCK(k) ((k) == CLOCK_SIM || (k) == CLOCK_NOBIT || (k) == SCAN_SIM)
#define IS_REAL(k)  ((k) == REAL || (k) == REAL_SCAN)
#define NONE        UINT32_MAX
#define SHARD       4096u

/* One policy instance over nkeys keys and cap slots. */
struct pol {
    enum kind kind;
    uint32_t cap, nkeys, used;
    uint32_t *where;                       /* key -> slot (CLOCK, FIFO) or 1/NONE (LRU) */
    uint32_t *skey;                        /* slot -> key */
    uint8_t *bit;                          /* CLOCK accessed bit */
    uint32_t *ref;                         /* CLOCK: leases held */
    uint8_t *prob;                         /* admission=scan: SLOT_F_PROBATION */
    uint32_t adm_seen, adm_prob, adm_last; /* admission=scan: the hand's census */
    uint64_t hand;
    /* LRU list over keys */
    uint32_t *prev, *next, head, tail;
    uint32_t *lref;  /* LRU_FAIR: leases held per key */
    uint64_t forced; /* LRU_FAIR: evictions of a leased key (every entry was leased) */
    /* FIFO ring of keys */
    uint32_t *ring, rhead, rcount;
    /* The real cache */
    struct sfs_cache *c;
    struct sfs_key *keys;
    struct sfs_lease *held;
    uint32_t nheld;
    int err;
};

static struct sfs_key *all_keys;

static void pol_init(struct pol *p, enum kind k, uint32_t cap, uint32_t nkeys)
{
    memset(p, 0, sizeof(*p));
    p->kind = k;
    p->cap = cap;
    p->nkeys = nkeys;
    p->where = malloc(nkeys * sizeof(uint32_t));
    for (uint32_t i = 0; i < nkeys; i++)
        p->where[i] = NONE;
    p->skey = malloc(cap * sizeof(uint32_t));
    for (uint32_t i = 0; i < cap; i++)
        p->skey[i] = NONE;
    p->bit = calloc(cap, 1);
    p->ref = calloc(cap, sizeof(uint32_t));
    p->prob = calloc(cap, 1);
    p->prev = malloc(nkeys * sizeof(uint32_t));
    p->next = malloc(nkeys * sizeof(uint32_t));
    p->head = p->tail = NONE;
    p->lref = calloc(nkeys, sizeof(uint32_t));
    p->ring = malloc(cap * sizeof(uint32_t));
    p->held = malloc(cap * sizeof(*p->held));
    p->keys = all_keys;
    if (k == REAL)
        p->c = tu_cache(cap, 0, SHARD);
    if (k == REAL_SCAN) {
        struct sfs_cache_config cfg = {
            .shard_size = SHARD,
            .nslots = cap,
            .no_reserved = true,
            .hugepages = SFS_HUGEPAGES_OFF,
            .admission = SFS_ADMIT_SCAN,
        };
        int err = 0;

        p->c = sfs_cache_create(&cfg, &err);
        if (!p->c)
            fprintf(stderr, "bench_clock: create: %s\n", strerror(-err));
    }
}

static void pol_free(struct pol *p)
{
    free(p->where);
    free(p->skey);
    free(p->bit);
    free(p->ref);
    free(p->prob);
    free(p->prev);
    free(p->next);
    free(p->lref);
    free(p->ring);
    free(p->held);
    sfs_cache_close(p->c);
}

static void lru_unlink(struct pol *p, uint32_t k)
{
    if (p->prev[k] != NONE)
        p->next[p->prev[k]] = p->next[k];
    else
        p->head = p->next[k];
    if (p->next[k] != NONE)
        p->prev[p->next[k]] = p->prev[k];
    else
        p->tail = p->prev[k];
}

static void lru_push(struct pol *p, uint32_t k)
{
    p->prev[k] = NONE;
    p->next[k] = p->head;
    if (p->head != NONE)
        p->prev[p->head] = k;
    p->head = k;
    if (p->tail == NONE)
        p->tail = k;
}

/*
 * The LRU victim. Raw LRU takes the least recent entry, leased or not.
 * LRU_FAIR honours what the cache honours (design.md, invariant 2: a leased slot
 * is never evicted): the least recent entry that no lease holds, walking from
 * the tail (at most cap steps). Only when every entry is leased, which a
 * leasing cache answers with -ENOSPC, does it take the least recent leased
 * one, and counts it in `forced`.
 */
static uint32_t lru_victim(struct pol *p)
{
    if (p->kind == LRU_FAIR) {
        for (uint32_t v = p->tail; v != NONE; v = p->prev[v])
            if (p->lref[v] == 0)
                return v;
        p->forced++;
    }
    return p->tail;
}

/* admission=scan: admit.c's sfs_admit_pass, step for step. */
static bool admit_pass(struct pol *p, uint32_t s)
{
    bool prob = p->prob[s];

    if (prob && p->ref[s]) {
        p->prob[s] = 0;
        prob = false;
    }
    uint32_t seen = ++p->adm_seen, np = p->adm_prob + prob;

    if (prob)
        p->adm_prob = np;
    if (seen >= p->cap) {
        p->adm_last = np;
        p->adm_seen = 0;
        p->adm_prob = 0;
    }
    return !prob && (uint64_t)p->adm_last * 100u > (uint64_t)p->cap * 50u; /* SFS_ADMIT_SHARE_PCT */
}

/* One clock_scan of evict.c: at most two laps. */
static uint32_t clock_scan(struct pol *p, bool *passed)
{
    for (uint64_t step = 0; step < 2ull * p->cap; step++) {
        uint32_t s = (uint32_t)(p->hand++ % p->cap);

        if (passed && admit_pass(p, s)) {
            *passed = true;
            continue;
        }
        if (p->bit[s]) {
            p->bit[s] = 0;
            continue;
        }
        if (p->ref[s])
            continue;
        return s;
    }
    return NONE;
}

/* The cache's CLOCK: a victim slot, or NONE (all leased). */
static uint32_t clock_victim(struct pol *p)
{
    if (p->used < p->cap)
        return p->used++;
    if (p->kind != SCAN_SIM)
        return clock_scan(p, NULL);
    bool passed = false;
    uint32_t s = clock_scan(p, &passed);

    return s == NONE && passed ? clock_scan(p, NULL) : s;
}

/* ACC_INFLIGHT: a lease that lasts until pol_unlease (the copy); only
 * LRU_FAIR takes it (the copy-after-release rows: see replay). ACC_PEEK: not
 * a use (SFS_GET_PEEK): no bit, no promotion, no move in LRU's order. */
enum { ACC_NOALLOC = 1, ACC_HOLD = 2, ACC_INFLIGHT = 4, ACC_PEEK = 8 };

/* Access key k: 1 hit, 0 loaded (a miss), -1 absent (NOALLOC), -2 error. */
static int pol_access(struct pol *p, uint32_t k, unsigned fl)
{
    switch (p->kind) {
    case REAL:
    case REAL_SCAN: {
        struct sfs_lease l;
        unsigned gf =
            ((fl & ACC_NOALLOC) ? SFS_GET_NOALLOC : 0) | ((fl & ACC_PEEK) ? SFS_GET_PEEK : 0);
        int r = sfs_cache_get(p->c, &p->keys[k], gf, 0, &l);

        if (r == -ENOENT)
            return -1;
        if (r == SFS_OWNER) {
            tu_fill(&p->keys[k], sfs_cache_data(p->c, &l), SHARD);
            sfs_cache_publish(p->c, &l, SHARD, 0);
        } else if (r != SFS_HIT) {
            p->err = r < 0 ? r : -EPROTO;
            return -2;
        }
        if (fl & ACC_HOLD)
            p->held[p->nheld++] = l;
        else
            sfs_cache_release(p->c, &l);
        return r == SFS_HIT;
    }
    case CLOCK_SIM:
    case SCAN_SIM:
    case CLOCK_NOBIT: {
        uint32_t s = p->where[k];

        if (s != NONE) {
            if (!(fl & ACC_PEEK)) {
                p->bit[s] = 1;
                p->prob[s] = 0;
            }
            if (fl & ACC_HOLD)
                p->ref[s]++, p->held[p->nheld++].slot = s;
            return 1;
        }
        if (fl & ACC_NOALLOC)
            return -1;
        s = clock_victim(p);
        if (s == NONE) {
            p->err = -ENOSPC;
            return -2;
        }
        if (p->skey[s] != NONE && p->where[p->skey[s]] == s)
            p->where[p->skey[s]] = NONE;
        p->skey[s] = k;
        p->where[k] = s;
        p->bit[s] = p->kind != CLOCK_NOBIT;
        p->prob[s] = p->kind == SCAN_SIM;
        if (fl & ACC_HOLD)
            p->ref[s]++, p->held[p->nheld++].slot = s;
        return 0;
    }
    case LRU:
    case LRU_FAIR: {
        int r = 1;

        if (p->where[k] != NONE) {
            if (fl & ACC_PEEK)
                return 1; /* in place: a peek never leases (no HOLD, no INFLIGHT) */
            lru_unlink(p, k);
        } else {
            if (fl & ACC_NOALLOC)
                return -1;
            if (p->used == p->cap) {
                uint32_t v = lru_victim(p);
                lru_unlink(p, v);
                p->where[v] = NONE;
            } else {
                p->used++;
            }
            p->where[k] = 1;
            r = 0;
        }
        lru_push(p, k);
        if (p->kind == LRU_FAIR && (fl & (ACC_HOLD | ACC_INFLIGHT))) {
            p->lref[k]++;
            if (fl & ACC_HOLD)
                p->held[p->nheld++].slot = k;
        }
        return r;
    }
    case FIFO:
        if (p->where[k] != NONE)
            return 1;
        if (fl & ACC_NOALLOC)
            return -1;
        if (p->rcount == p->cap) {
            p->where[p->ring[p->rhead]] = NONE;
            p->rhead = (p->rhead + 1) % p->cap;
            p->rcount--;
        }
        p->ring[(p->rhead + p->rcount) % p->cap] = k;
        p->rcount++;
        p->where[k] = 1;
        return 0;
    default:
        return -2;
    }
}

/* Is key k still resident with its own bytes? Held leases: check the bytes. */
static bool pol_intact(struct pol *p, uint32_t k, uint32_t held_idx)
{
    if (IS_REAL(p->kind)) {
        const struct sfs_lease *l = &p->held[held_idx];
        return sfs_cache_state(p->c, &p->keys[k]) == SFS_STATE_READY &&
               tu_check(&p->keys[k], sfs_cache_data(p->c, l), SHARD) < 0;
    }
    return p->where[k] != NONE;
}

static void pol_release_held(struct pol *p)
{
    for (uint32_t i = 0; i < p->nheld; i++) {
        if (IS_REAL(p->kind))
            sfs_cache_release(p->c, &p->held[i]);
        else if (IS_CLOCK(p->kind))
            p->ref[p->held[i].slot]--;
        else if (p->kind == LRU_FAIR)
            p->lref[p->held[i].slot]--;
    }
    p->nheld = 0;
}

/* The copy of an in-flight key (ACC_INFLIGHT) came: its lease ends. */
static void pol_unlease(struct pol *p, uint32_t k)
{
    if (p->kind == LRU_FAIR && p->lref[k])
        p->lref[k]--;
}

/* ---------------------------------------------------------------------------
 * Traces.
 */

static uint64_t rng_state;
static uint64_t rnd(void)
{
    uint64_t x = rng_state += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static double rnd01(void)
{
    return (double)(rnd() >> 11) / 9007199254740992.0;
}

struct zipf {
    uint32_t n;
    double *cdf;
    uint32_t *perm; /* rank -> key: hot keys spread over the key space */
};

static void zipf_init(struct zipf *z, uint32_t n, double s)
{
    double sum = 0;

    z->n = n;
    z->cdf = malloc(n * sizeof(double));
    z->perm = malloc(n * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++) {
        sum += 1.0 / pow((double)(i + 1), s);
        z->cdf[i] = sum;
        z->perm[i] = i;
    }
    for (uint32_t i = 0; i < n; i++)
        z->cdf[i] /= sum;
    for (uint32_t i = n - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(rnd() % (i + 1)), t = z->perm[i];
        z->perm[i] = z->perm[j];
        z->perm[j] = t;
    }
}

static uint32_t zipf_next(const struct zipf *z)
{
    double u = rnd01();
    uint32_t lo = 0, hi = z->n - 1;

    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (z->cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return z->perm[lo];
}

static void zipf_free(struct zipf *z)
{
    free(z->cdf);
    free(z->perm);
}

/* A trace: a key sequence; for batch traces, grouped in batches of `batch`. */
struct trace {
    char name[160];
    uint32_t *k;
    uint32_t len, nkeys, warm, batch, lag;
    bool held; /* batch: leases held until the copy */
    bool peek; /* batch, released: the copy is SFS_GET_PEEK, not a use */
    bool scan; /* a scan trace: admission=scan's target is >= LRU */
};

static void gen_zipf(struct trace *t, uint32_t cap, double s, uint32_t mult, uint32_t len)
{
    struct zipf z;

    t->nkeys = cap * mult;
    zipf_init(&z, t->nkeys, s);
    t->len = len;
    t->k = malloc(len * sizeof(uint32_t));
    for (uint32_t i = 0; i < len; i++)
        t->k[i] = zipf_next(&z);
    zipf_free(&z);
    snprintf(t->name, sizeof(t->name), "Zipf s=%.1f, %ux capacity keys", s, mult);
}

/* Half the accesses to a hot set of cap/4 keys, half a cyclic scan of 8x cap. */
static void gen_scan_hot(struct trace *t, uint32_t cap, uint32_t len)
{
    uint32_t hot = cap / 4, scan = 8 * cap, pos = 0;

    t->nkeys = hot + scan;
    t->len = len;
    t->k = malloc(len * sizeof(uint32_t));
    for (uint32_t i = 0; i < len; i++)
        t->k[i] = (rnd() & 1) ? (uint32_t)(rnd() % hot) : hot + (pos++ % scan);
    t->scan = true;
    snprintf(t->name, sizeof(t->name), "hot set (cap/4 keys) + cyclic scan (8x cap), 50/50");
}

/* A hot set of cap/2 keys (2x cap accesses) between full scans of the same
 * 3x cap cold keys, in order: does the hot set survive each scan? */
static void gen_scan_repeat(struct trace *t, uint32_t cap, uint32_t len)
{
    uint32_t hot = cap / 2, cold = 3 * cap, i = 0;

    t->len = len;
    t->k = malloc(len * sizeof(uint32_t));
    while (i < len) {
        for (uint32_t j = 0; j < 2 * cap && i < len; j++)
            t->k[i++] = (uint32_t)(rnd() % hot);
        for (uint32_t j = 0; j < cold && i < len; j++)
            t->k[i++] = hot + j;
    }
    t->nkeys = hot + cold;
    t->scan = true;
    snprintf(t->name, sizeof(t->name),
             "hot set (cap/2 keys, 2x cap accesses) between full scans of the same 3x cap keys");
}

/* Hot phases (4x cap accesses over cap/2 keys) broken by scans of 2x cap new keys. */
static void gen_scan_bursts(struct trace *t, uint32_t cap, uint32_t len)
{
    uint32_t hot = cap / 2, scan = 2 * cap, next_new = hot, i = 0;

    t->len = len;
    t->k = malloc(len * sizeof(uint32_t));
    while (i < len) {
        for (uint32_t j = 0; j < 4 * cap && i < len; j++)
            t->k[i++] = (uint32_t)(rnd() % hot);
        for (uint32_t j = 0; j < scan && i < len; j++)
            t->k[i++] = next_new++;
    }
    t->nkeys = next_new;
    t->scan = true;
    snprintf(t->name, sizeof(t->name), "hot set (cap/2 keys) + scan bursts of 2x cap new keys");
}

/* Batches of `batch` distinct Zipf keys. */
static void gen_batches(struct trace *t, uint32_t cap, uint32_t batch, uint32_t nbatches, bool held,
                        bool peek, uint32_t lag)
{
    struct zipf z;
    uint32_t mult = 8;

    t->nkeys = cap * mult;
    zipf_init(&z, t->nkeys, 1.0);
    t->batch = batch;
    t->held = held;
    t->peek = peek;
    t->lag = lag;
    t->len = batch * nbatches;
    t->k = malloc(t->len * sizeof(uint32_t));
    uint8_t *in = calloc(t->nkeys, 1);
    for (uint32_t b = 0; b < nbatches; b++) {
        uint32_t *bk = t->k + b * batch;
        for (uint32_t i = 0; i < batch; i++) {
            uint32_t k;
            do
                k = zipf_next(&z);
            while (in[k]);
            in[k] = 1;
            bk[i] = k;
        }
        for (uint32_t i = 0; i < batch; i++)
            in[bk[i]] = 0;
    }
    free(in);
    zipf_free(&z);
    if (held)
        snprintf(t->name, sizeof(t->name),
                 "batch load + copy, leases held until copied (B=%u, Zipf 1.0, 8x cap)", batch);
    else
        snprintf(t->name, sizeof(t->name),
                 "batch load, release, copy %u batches later (B=%u; %u%% of cap in flight)%s", lag,
                 batch, (unsigned)(100ull * batch * (lag + 1) / cap), peek ? ", copy a peek" : "");
}

struct outcome {
    uint64_t acc, hits; /* counted after warm-up (batch traces: loads only) */
    uint64_t loaded;    /* batch traces: keys loaded (misses) */
    uint64_t lost;      /* loaded, then evicted before copied */
    int err;
};

static struct outcome replay(struct pol *p, const struct trace *t)
{
    struct outcome o = {0};

    if (!t->batch) {
        for (uint32_t i = 0; i < t->len; i++) {
            int r = pol_access(p, t->k[i], 0);
            if (r < -1) {
                o.err = p->err;
                return o;
            }
            if (i >= t->warm) {
                o.acc++;
                o.hits += r == 1;
            }
        }
        return o;
    }
    uint32_t nb = t->len / t->batch;
    uint8_t *loaded = calloc(t->len, 1); /* per position: loaded by that access */
    for (uint32_t b = 0; b < nb + (t->held ? 0 : t->lag); b++) {
        /* Load batch b. */
        if (b < nb) {
            for (uint32_t i = 0; i < t->batch; i++) {
                uint32_t pos = b * t->batch + i;
                /* Released rows: the cache holds no lease until the copy
                 * (that is the sweep); LRU_FAIR holds one, as the rank
                 * library's contract would, so that its figure is LRU's
                 * with no load evicted before its copy. */
                int r = pol_access(p, t->k[pos], t->held ? ACC_HOLD : ACC_INFLIGHT);
                if (r < -1) {
                    o.err = p->err;
                    goto out;
                }
                loaded[pos] = r == 0;
                if (pos >= t->warm) {
                    o.acc++;
                    o.hits += r == 1;
                }
            }
        }
        /* Copy batch b (held) or batch b - lag (released). */
        if (t->held) {
            for (uint32_t i = 0; i < t->batch; i++) {
                uint32_t pos = b * t->batch + i;
                if (loaded[pos] && pos >= t->warm) {
                    o.loaded++;
                    o.lost += !pol_intact(p, t->k[pos], i);
                }
            }
            pol_release_held(p);
        } else if (b >= t->lag) {
            uint32_t cb = b - t->lag;
            for (uint32_t i = 0; i < t->batch; i++) {
                uint32_t pos = cb * t->batch + i;
                int r = pol_access(p, t->k[pos], ACC_NOALLOC | (t->peek ? ACC_PEEK : 0));
                if (r < -1) {
                    o.err = p->err;
                    goto out;
                }
                pol_unlease(p, t->k[pos]);
                if (loaded[pos] && pos >= t->warm) {
                    o.loaded++;
                    o.lost += r != 1;
                }
            }
        }
    }
out:
    free(loaded);
    return o;
}

/*
 * Is LRU_FAIR what it claims? Three checks, each against something that is
 * not lru_victim:
 *  A. random accesses, leases taken and ended at random (at most cap - 1, so
 *     an unleased entry always exists), against a brute-force reference that
 *     keeps each key's last access time and evicts the resident, unleased
 *     key with the oldest: same hit or miss on every access, same resident
 *     set after every step, and no leased key ever absent;
 *  B. with no leases it is raw LRU, access for access;
 *  C. with every entry leased it evicts the least recent one and counts it.
 * Returns the number of evictions A checked, or -1 with *why set.
 */
static long lru_selfcheck(const char **why)
{
    enum { CAP = 16, NK = 48, STEPS = 200000 };
    uint64_t st = 7, stamp[NK] = {0}, now = 0;
    uint32_t refs[NK] = {0}, leases[CAP], nl = 0, count = 0;
    bool res[NK] = {false};
    long evictions = 0;
    struct pol f, l;

#define SC_RND() (st += 0x9e3779b97f4a7c15ull, (st ^ (st >> 29)) * 0xbf58476d1ce4e5b9ull >> 17)
    pol_init(&f, LRU_FAIR, CAP, NK);
    for (uint32_t i = 0; i < STEPS; i++) {
        uint64_t r = SC_RND();

        if (r % 4 == 3) { /* end a lease */
            if (nl) {
                uint32_t j = (uint32_t)((r >> 8) % nl), k = leases[j];
                leases[j] = leases[--nl];
                refs[k]--;
                pol_unlease(&f, k);
            }
        } else { /* an access, skewed towards low keys, sometimes leased */
            uint32_t k = (uint32_t)(((r >> 8) % NK) * ((r >> 24) % NK) / NK);
            bool lease = (r >> 40) % 3 == 0 && nl < CAP - 1, hit = res[k];

            if (!hit) {
                if (count == CAP) {
                    uint32_t v = NONE;
                    for (uint32_t x = 0; x < NK; x++)
                        if (res[x] && !refs[x] && (v == NONE || stamp[x] < stamp[v]))
                            v = x;
                    res[v] = false;
                    evictions++;
                } else {
                    count++;
                }
                res[k] = true;
            }
            stamp[k] = ++now;
            if (lease)
                refs[k]++, leases[nl++] = k;
            if (pol_access(&f, k, lease ? ACC_INFLIGHT : 0) != (int)hit) {
                *why = "A: hit or miss differs from the reference";
                goto fail;
            }
        }
        for (uint32_t x = 0; x < NK; x++) {
            if ((f.where[x] != NONE) != res[x]) {
                *why = "A: resident set differs from the reference";
                goto fail;
            }
            if (refs[x] && f.where[x] == NONE) {
                *why = "A: a leased key was evicted";
                goto fail;
            }
        }
    }
    if (f.forced) {
        *why = "A: evicted a leased key with an unleased one resident";
        goto fail;
    }
    pol_free(&f);

    pol_init(&f, LRU_FAIR, 64, 640);
    pol_init(&l, LRU, 64, 640);
    for (uint32_t i = 0; i < STEPS; i++) {
        uint64_t r = SC_RND();
        uint32_t k = (uint32_t)(((r >> 8) % 640) * ((r >> 24) % 640) / 640);

        if (pol_access(&f, k, 0) != pol_access(&l, k, 0)) {
            *why = "B: differs from raw LRU with no leases";
            pol_free(&l);
            goto fail;
        }
    }
    pol_free(&l);
    pol_free(&f);

    pol_init(&f, LRU_FAIR, 4, 8);
    for (uint32_t k = 0; k < 4; k++)
        pol_access(&f, k, ACC_INFLIGHT);
    pol_access(&f, 0, ACC_INFLIGHT); /* 0 is now the most recent; 1 the least */
    pol_access(&f, 4, 0);
    if (f.forced != 1 || f.where[1] != NONE || f.where[0] == NONE || f.where[4] == NONE) {
        *why = "C: every entry leased: not the least recent one, or not counted";
        goto fail;
    }
    pol_free(&f);
#undef SC_RND
    return evictions;
fail:
    pol_free(&f);
    return -1;
}

/* Hit rate against cache size: one Zipf trace (s = 1.0) and one of a hot set
 * under scans, over a fixed key universe (the main table's, at its cache
 * size base), replayed by the policies' models at 1/8 to 4x that size. The
 * models match the cache hit for hit (the main table checks it), so the
 * curves are the cache's. tests/bench/plots.py draws them. */
static void hit_rate_against_size(FILE *o, uint32_t base, uint32_t len, bool quick)
{
    static const enum kind kinds[] = {CLOCK_SIM, SCAN_SIM, LRU, FIFO};
    static const char *const label[] = {"CLOCK", "admission=scan", "LRU", "FIFO"};
    static const uint32_t frac8[] = {1, 2, 4, 8, 16, 32}; /* size = base * frac8 / 8 */
    struct trace tr[2];
    const char *tname[2] = {"Zipf s=1.0, 8x keys", "hot set + scans"};

    memset(tr, 0, sizeof(tr));
    gen_zipf(&tr[0], base, 1.0, 8, len);
    gen_scan_hot(&tr[1], base, len);
    for (int t = 0; t < 2; t++)
        tr[t].warm = tr[t].len / 5;
    fprintf(o,
            "### Hit rate against cache size\n\n"
            "The same key universe at cache sizes from 1/8 to 4x the table's (%u slots); the "
            "policies' models, which match the cache hit for hit. Hit rate in %%.\n\n",
            base);
    fprintf(o, "| trace | slots |");
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++)
        fprintf(o, " %s |", label[k]);
    fprintf(o, "\n|---|---|");
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++)
        fprintf(o, "---|");
    fprintf(o, "\n");
    for (int t = 0; t < 2; t++) {
        for (size_t f = 0; f < sizeof(frac8) / sizeof(frac8[0]); f++) {
            uint32_t size = base * frac8[f] / 8;

            if (quick && frac8[f] > 16)
                continue;
            fprintf(o, "| %s | %u |", tname[t], size);
            for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
                struct pol p;

                pol_init(&p, kinds[k], size, tr[t].nkeys);
                struct outcome r = replay(&p, &tr[t]);
                fprintf(o, " %.2f |", r.acc ? 100.0 * (double)r.hits / (double)r.acc : 0.0);
                pol_free(&p);
            }
            fprintf(o, "\n");
        }
    }
    fprintf(o, "\n");
    for (int t = 0; t < 2; t++)
        free(tr[t].k);
}

int main(int argc, char **argv)
{
    struct bench b;
    int rc = bench_init(&b, "bench_clock", argc, argv);
    if (rc)
        return rc;

    const uint32_t cap = b.quick ? 256 : 1024;
    const uint32_t len = b.quick ? 40 * cap : 200 * cap;
    const uint32_t batch = cap / 8;
    const uint32_t nbatches = len / batch / 2;
    struct trace tr[16];
    int nt = 0;

    rng_state = 42;
    memset(tr, 0, sizeof(tr));
    gen_zipf(&tr[nt++], cap, 0.9, 10, len);
    gen_zipf(&tr[nt++], cap, 1.0, 8, len);
    gen_zipf(&tr[nt++], cap, 1.1, 4, len);
    gen_scan_hot(&tr[nt++], cap, len);
    gen_scan_bursts(&tr[nt++], cap, len);
    gen_scan_repeat(&tr[nt++], cap, len);
    gen_batches(&tr[nt++], cap, batch, nbatches, true, false, 0);
    for (int peek = 0; peek < 2; peek++) {
        gen_batches(&tr[nt++], cap, batch, nbatches, false, peek, 3);
        gen_batches(&tr[nt++], cap, batch, nbatches, false, peek, 5);
        gen_batches(&tr[nt++], cap, batch, nbatches, false, peek, 7);
        gen_batches(&tr[nt++], cap, batch, nbatches, false, peek, 11);
    }

    uint32_t maxkeys = 0;
    for (int i = 0; i < nt; i++) {
        tr[i].warm = tr[i].len / 5;
        if (tr[i].nkeys > maxkeys)
            maxkeys = tr[i].nkeys;
    }
    all_keys = malloc(maxkeys * sizeof(*all_keys));
    for (uint32_t i = 0; i < maxkeys; i++)
        all_keys[i] = tu_key(i + 1, 0);

    const char *why = "";
    long checked = lru_selfcheck(&why);
    if (checked < 0) {
        fprintf(stderr, "bench_clock: the leases-honoured LRU fails its self-check: %s\n", why);
        return 1;
    }

    FILE *o = b.out;
    fprintf(o, "## CLOCK against exact LRU and FIFO (`bench_clock`)\n\n");
    bench_stamp(&b);
    fprintf(o,
            "The cache (%u slots of %u KiB, one process: Get, fill, publish, release per "
            "access) and simulators replay the same deterministic traces of %u accesses; "
            "hit rates count the accesses after the first fifth. \"CLOCK model\" is the "
            "cache's algorithm re-implemented here (it should match the cache exactly); "
            "\"no new-load bit\" is the same without the second chance a new load gets. "
            "\"scan\" is the cache created with admission=scan (`-o admission=scan`: a new key "
            "is probationary until its second access; docs/eviction.md) and its model. "
            "Batch traces: B keys are loaded, then copied; \"lost\" counts keys that a batch "
            "loaded and that were gone when their copy came (hit rates count the loads "
            "only).\n\n"
            "Two LRUs. \"LRU\" (raw) evicts the least recent key whatever holds it. \"LRU, "
            "leased\" honours the cache's lease contract (design.md, invariant 2): it evicts the "
            "least recent key that no lease holds. Where the cache holds leases (the batch row "
            "with leases held) both LRUs see the same leases; in the copy-after-release rows, "
            "where the cache holds none and only its accessed bit protects a load, the leased "
            "LRU holds each batch's keys from their load to their copy, as the rank library "
            "does, so that its figure is LRU's with every load delivered: raw LRU's extra hits "
            "there include loads it evicted before their copy. (\"In flight\" counts accesses; "
            "should more distinct keys be in flight than there are slots, no leasing cache "
            "could run the trace, and the leased LRU would evict the least recent leased key "
            "and count it: \"forced\".) Its self-check: %ld "
            "evictions against a brute-force reference with random leases (same hits, same "
            "resident set after every step, no leased key evicted), access for access equal "
            "to raw LRU with no leases, and the least recent one taken when all are leased. "
            "The admission target is judged against the leased LRU on every row.\n\n",
            cap, SHARD >> 10, len, checked);
    fprintf(o, "| trace | CLOCK (the cache) | CLOCK model | scan (the cache) | scan model | "
               "no new-load bit | LRU | LRU, leased | FIFO | CLOCK - LRU, points | within 2 "
               "points | scan - LRU, points | scan - leased LRU, points | scan target (leased "
               "LRU) | lost: CLOCK / model / scan / scan model / no bit / LRU / leased LRU "
               "(forced) / FIFO |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");

    int64_t t0 = bench_now_ns();
    uint64_t real_acc = 0;
    int nmiss = 0, ntarget = 0;
    uint64_t fifo_lost = 0, fifo_loaded = 0;
    double fifo_gap = 0;
    char *misses = NULL, *lost_after = NULL;
    size_t misses_len = 0, lost_after_len = 0;
    FILE *mf = open_memstream(&misses, &misses_len);
    FILE *lf = open_memstream(&lost_after, &lost_after_len);
    int nafter = 0;
    uint64_t lost_held = 0;
    double bitcost = 0;
    int nbitcost = 0;
    int nscan_rows = 0, nscan_met = 0, model_diff = 0;
    int nfair = 0, nfair_met = 0, fair_diff = 0, nfair_free = 0;
    int ngetcopy = 0, ngetcopy_met = 0;
    double fair_worst = 1e9, getcopy_worst = 1e9;
    char *fair_below = NULL;
    size_t fair_below_len = 0;
    FILE *ff = open_memstream(&fair_below, &fair_below_len);
    int nfair_below = 0;
    uint64_t lost_held_scan = 0;
    int64_t real_ns[2] = {0, 0}; /* replay time of the cache: CLOCK, admission=scan */
    for (int i = 0; i < nt; i++) {
        struct outcome res[NPOL];
        double hr[NPOL];
        uint64_t forced = 0;

        for (int k = 0; k < NPOL; k++) {
            struct pol p;
            pol_init(&p, (enum kind)k, cap, tr[i].nkeys);
            if (IS_REAL(k) && !p.c)
                return 1;
            int64_t tk = bench_now_ns();
            res[k] = replay(&p, &tr[i]);
            if (IS_REAL(k))
                real_ns[k == REAL_SCAN] += bench_now_ns() - tk;
            if (res[k].err) {
                fprintf(stderr, "bench_clock: %s on %s: %s\n", pol_name[k], tr[i].name,
                        strerror(-res[k].err));
                return 1;
            }
            if (IS_REAL(k)) {
                struct sfs_stats st;
                sfs_cache_stats(p.c, &st);
                real_acc += st.requests;
            }
            if (k == LRU_FAIR)
                forced = p.forced;
            pol_free(&p);
            hr[k] = 100.0 * (double)res[k].hits / (double)res[k].acc;
        }
        double d = hr[REAL] - hr[LRU];
        bool within = d >= -2.0, sweep = tr[i].batch && !tr[i].held;
        ntarget += !sweep;
        if (!within && !sweep) {
            nmiss++;
            fprintf(mf, "%s\"%s\" (%+.2f)", nmiss > 1 ? ", " : "", tr[i].name, d);
        }
        if (!tr[i].batch || tr[i].held) {
            bitcost += hr[CLOCK_NOBIT] - hr[CLOCK_SIM];
            nbitcost++;
        }
        /* admission=scan: >= LRU on scan traces, within 1 point elsewhere. */
        double ds = hr[REAL_SCAN] - hr[LRU];
        bool smet = tr[i].scan ? ds >= 0 : ds >= -1.0;
        if (!sweep) {
            nscan_rows++;
            nscan_met += smet;
        }
        /* Against the leased LRU, every row; apart, the rows whose copy
         * after the release is a plain Get (a reuse to every policy). */
        double df = hr[REAL_SCAN] - hr[LRU_FAIR];
        bool fmet = tr[i].scan ? df >= 0 : df >= -1.0;
        if (sweep && !tr[i].peek) {
            ngetcopy++;
            ngetcopy_met += fmet;
            if (df < getcopy_worst)
                getcopy_worst = df;
        } else {
            nfair++;
            nfair_met += fmet;
            if (!fmet)
                fprintf(ff, "%s\"%s\" (%+.2f)", nfair_below++ ? ", " : "", tr[i].name, df);
            if (df < fair_worst)
                fair_worst = df;
        }
        /* Where no lease is taken the two LRUs must agree hit for hit. */
        if (!tr[i].batch) {
            nfair_free++;
            fair_diff += res[LRU].hits != res[LRU_FAIR].hits;
        }
        model_diff +=
            res[REAL].hits != res[CLOCK_SIM].hits || res[REAL_SCAN].hits != res[SCAN_SIM].hits ||
            res[REAL].lost != res[CLOCK_SIM].lost || res[REAL_SCAN].lost != res[SCAN_SIM].lost;
        fprintf(o,
                "| %s | %.2f%% | %.2f%% | %.2f%% | %.2f%% | %.2f%% | %.2f%% | %.2f%% | %.2f%% | "
                "%+.2f | %s | %+.2f | %+.2f | %s%s |",
                tr[i].name, hr[REAL], hr[CLOCK_SIM], hr[REAL_SCAN], hr[SCAN_SIM], hr[CLOCK_NOBIT],
                hr[LRU], hr[LRU_FAIR], hr[FIFO], d,
                sweep    ? (within ? "yes (sweep)" : "no (sweep)")
                : within ? "yes"
                         : "**no**",
                ds, df, fmet ? "met" : "**not met**", tr[i].scan ? " (>= LRU)" : " (within 1)");
        if (tr[i].batch && !tr[i].held) {
            fifo_lost += res[FIFO].lost;
            fifo_loaded += res[FIFO].loaded;
        }
        if (hr[FIFO] - hr[LRU] < fifo_gap)
            fifo_gap = hr[FIFO] - hr[LRU];
        if (tr[i].batch) {
            if (tr[i].held) {
                lost_held += res[REAL].lost;
                lost_held_scan += res[REAL_SCAN].lost;
            } else
                fprintf(lf, "%s%llu of %llu at %u%% of capacity in flight%s", nafter++ ? ", " : "",
                        (unsigned long long)res[REAL].lost, (unsigned long long)res[REAL].loaded,
                        (unsigned)(100ull * tr[i].batch * (tr[i].lag + 1) / cap),
                        tr[i].peek ? " (copy a peek)" : "");
            fprintf(o,
                    " %llu / %llu / %llu / %llu / %llu / %llu / %llu (%llu) / %llu of %llu / %llu "
                    "loaded |",
                    (unsigned long long)res[REAL].lost, (unsigned long long)res[CLOCK_SIM].lost,
                    (unsigned long long)res[REAL_SCAN].lost, (unsigned long long)res[SCAN_SIM].lost,
                    (unsigned long long)res[CLOCK_NOBIT].lost, (unsigned long long)res[LRU].lost,
                    (unsigned long long)res[LRU_FAIR].lost, (unsigned long long)forced,
                    (unsigned long long)res[FIFO].lost, (unsigned long long)res[REAL].loaded,
                    (unsigned long long)res[REAL_SCAN].loaded);
        } else {
            fprintf(o, " - |");
        }
        fputc('\n', o);
    }
    double secs = (double)(bench_now_ns() - t0) / 1e9;
    fclose(mf);
    fclose(lf);
    fclose(ff);
    fprintf(o, "\n| target | figure | met |\n|---|---|---|\n");
    fprintf(o,
            "| hit rate within 2 points of LRU | %d of %d traces within (the copy-after-release "
            "sweep rows are not counted)%s%s | %s |\n",
            ntarget - nmiss, ntarget, nmiss ? "; below: " : "", misses, nmiss ? "**no**" : "yes");
    fprintf(o,
            "| zero loaded-then-evicted-before-copied | leases held until the copy: %llu "
            "lost (admission=scan: %llu) | %s |\n",
            (unsigned long long)lost_held, (unsigned long long)lost_held_scan,
            lost_held || lost_held_scan ? "**no**" : "yes");
    fprintf(o,
            "| admission=scan: >= LRU on scan traces, within 1 point elsewhere; against the "
            "leased LRU, every trace (a copy after the release is a peek) | %d of %d traces "
            "(worst %+.2f)%s%s | %s |\n",
            nfair_met, nfair, fair_worst, nfair_below ? "; below: " : "", fair_below,
            nfair_met == nfair ? "yes" : "**no**");
    fprintf(o,
            "| (the copy-after-release rows with the copy a plain Get, a reuse to every "
            "policy: scan is CLOCK there, docs/eviction.md) | %d of %d within 1 point (worst "
            "%+.2f) | - |\n",
            ngetcopy_met, ngetcopy, getcopy_worst);
    fprintf(o,
            "| (the same against raw LRU, the copy-after-release sweep rows not counted) | %d of "
            "%d traces | %s |\n",
            nscan_met, nscan_rows, nscan_met == nscan_rows ? "yes" : "**no**");
    fprintf(o,
            "| the leased LRU is exact LRU under the lease contract | self-check passed (%ld "
            "evictions against the reference); equal to raw LRU hit for hit on %d of %d "
            "lease-free traces | %s |\n",
            checked, nfair_free - fair_diff, nfair_free, fair_diff ? "**no**" : "yes");
    fprintf(o, "| the models match the cache hit for hit | %s | %s |\n",
            model_diff ? "differ on some trace" : "every trace", model_diff ? "**no**" : "yes");
    fprintf(o, "| (copy after release: only the accessed bit protects) | %s | - |\n\n", lost_after);
    fprintf(o,
            "The new-load bit costs the CLOCK model %.2f points of hit rate on average over "
            "the traces that do not copy after release (no bit minus bit); it is what keeps "
            "released, not yet copied loads resident (the \"lost\" column).\n\n",
            bitcost / nbitcost);
    fprintf(o,
            "FIFO lost %llu of %llu loads over the copy-after-release rows: it evicts strictly "
            "in load order, so a load survives as many further loads as there are slots "
            "whatever the hits; it pays in hit rate (down to %+.2f points from LRU here).\n\n",
            (unsigned long long)fifo_lost, (unsigned long long)fifo_loaded, fifo_gap);
    fprintf(o,
            "(%llu Gets on the cache; all policies replayed in %.1f s. The cache's replays, "
            "one thread, Get + fill + publish + release: %.0f ns per access with CLOCK, %.0f "
            "with admission=scan, ratio %.3f.)\n\n",
            (unsigned long long)real_acc, secs, (double)real_ns[0] / (double)(real_acc / 2),
            (double)real_ns[1] / (double)(real_acc / 2), (double)real_ns[1] / (double)real_ns[0]);
    hit_rate_against_size(o, cap, len, b.quick);
    free(misses);
    free(lost_after);
    free(fair_below);
    if (fair_diff) {
        fprintf(stderr, "bench_clock: the leased LRU differs from raw LRU with no leases\n");
        b.md = NULL; /* print the report, but leave the file alone */
        bench_finish(&b);
        return 1;
    }
    for (int i = 0; i < nt; i++)
        free(tr[i].k);
    free(all_keys);
    return bench_finish(&b);
}
