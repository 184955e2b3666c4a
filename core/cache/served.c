/* SPDX-License-Identifier: MIT */
/*
 * served.c - where reads were served from, by requester class, and the
 * latency histograms, for the daemon's /stats.
 *
 * Key idea: nothing is added to the hit path. A Get served from memory (a
 * hit, or a wait on another's load) is derived from the counters every Get
 * already keeps; only the owner of a load, after the backend answered, adds
 * where it came from (peer, store, miss) and how long it took, with relaxed
 * fetch_adds on its own record's line. Each record names its class (the
 * mount, a rank, an engine adapter) in its own bytes; when a process goes,
 * proc.c folds its counts into a small table of classes in the header
 * under proc_lock, so the totals never go backwards. Names are read as
 * untrusted bytes: anything but 1..15 of [A-Za-z0-9_.-] reads as "other".
 */
#include "slot_i.h"

#include <string.h>

static bool name_ok(const char *s)
{
    size_t n = strnlen(s, SFS_CLASS_LEN);

    if (n == 0 || n >= SFS_CLASS_LEN)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];

        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '.' || ch == '-'))
            return false;
    }
    return true;
}

/* A copy of a record's or a table entry's name, checked ("other" if bad). */
static void read_name(const char *shared, char out[SFS_CLASS_LEN])
{
    memcpy(out, shared, SFS_CLASS_LEN);
    out[SFS_CLASS_LEN - 1] = '\0';
    if (!name_ok(out))
        strcpy(out, "other");
}

int sfs_cache_set_class(struct sfs_cache *c, const char *name)
{
    if (!name || !name_ok(name))
        return -EINVAL;
    if (!c || !c->self)
        return 0; /* c NULL: the name's check alone */
    char buf[SFS_CLASS_LEN] = {0};

    strcpy(buf, name);
    memcpy(c->self->cls, buf, SFS_CLASS_LEN);
    return 0;
}

void sfs_cache_count_served(struct sfs_cache *c, enum sfs_tier t)
{
    if (!c || !c->self || t <= SFS_TIER_MEMORY || t >= SFS_TIERS)
        return;
    /* Relaxed: a counter of our own record; readers sum. */
    atomic_fetch_add_explicit(&c->self->served[t], 1, memory_order_relaxed);
}

void sfs_cache_observe(struct sfs_cache *c, enum sfs_hist_kind k, int64_t ns)
{
    if (!c || !c->self || (unsigned)k >= SFS_HIST_KINDS)
        return;
    if (ns < 0)
        ns = 0;
    /* Relaxed: counters of our own record; readers sum. */
    atomic_fetch_add_explicit(&c->self->hist[k][sfs_hist_bucket(ns)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->self->hist[k][SFS_HIST_BUCKETS], (uint64_t)ns,
                              memory_order_relaxed);
}

/* A record's memory tier from its counters v[] (CTR_*, requests with its
 * lock-free hits): hits and waits. Modulo 2^64, as the counters. */
static int64_t memory_of(const int64_t *v)
{
    return (int64_t)((uint64_t)v[CTR_REQUESTS] - (uint64_t)v[CTR_MISSES] -
                     (uint64_t)v[CTR_UNSERVED] + (uint64_t)v[CTR_WAITS]);
}

void sfs_served_clear(struct sfs_proc_rec *p)
{
    memset(p->cls, 0, sizeof(p->cls));
    for (int t = 0; t < SFS_TIERS; t++)
        atomic_store_explicit(&p->served[t], 0, memory_order_relaxed);
    for (int k = 0; k < SFS_HIST_KINDS; k++)
        for (int b = 0; b <= SFS_HIST_BUCKETS; b++)
            atomic_store_explicit(&p->hist[k][b], 0, memory_order_relaxed);
}

/* The header's entry for name: found, or a free one taken, or "other"'s.
 * The last entry is kept for "other": a class past the table's room is
 * counted there, never under another class's name. */
static struct sfs_class_rec *class_entry(struct sfs_cache *c, const char *name)
{
    struct sfs_class_rec *free_e = NULL, *other = NULL;
    struct sfs_class_rec *last = &c->hdr->classes[SFS_CLASSES - 1];

    for (int i = 0; i < SFS_CLASSES; i++) {
        struct sfs_class_rec *e = &c->hdr->classes[i];

        if (e->name[0] == '\0') {
            if (!free_e && e != last)
                free_e = e;
            continue;
        }
        if (strncmp(e->name, name, SFS_CLASS_LEN) == 0)
            return e;
        if (strncmp(e->name, "other", SFS_CLASS_LEN) == 0)
            other = e;
    }
    if (free_e) {
        memcpy(free_e->name, name, strlen(name) + 1);
        return free_e;
    }
    if (other)
        return other;
    /* Free, or a name that no fold wrote there (the header is shared
     * memory): "other" from now on. */
    memcpy(last->name, "other", sizeof("other"));
    return last;
}

void sfs_served_fold(struct sfs_cache *c, struct sfs_proc_rec *p, const int64_t *v)
{
    char name[SFS_CLASS_LEN];
    int64_t t[SFS_TIERS];

    t[SFS_TIER_MEMORY] = memory_of(v);
    for (int i = SFS_TIER_PEER; i < SFS_TIERS; i++)
        /* Relaxed: the record's writer is gone or is us. */
        t[i] = atomic_exchange_explicit(&p->served[i], 0, memory_order_relaxed);
    read_name(p->cls, name);
    bool any = false;
    for (int i = 0; i < SFS_TIERS; i++)
        any |= t[i] != 0;
    if (any) {
        struct sfs_class_rec *e = class_entry(c, name);

        for (int i = 0; i < SFS_TIERS; i++)
            e->served[i] = (int64_t)((uint64_t)e->served[i] + (uint64_t)t[i]);
    }
    for (int k = 0; k < SFS_HIST_KINDS; k++)
        for (int b = 0; b <= SFS_HIST_BUCKETS; b++)
            c->hdr->retired_hist[k][b] +=
                atomic_exchange_explicit(&p->hist[k][b], 0, memory_order_relaxed);
}

static void add_to(struct sfs_served *out, unsigned *n, unsigned max, const char *name,
                   const int64_t *t, uint32_t attached)
{
    unsigned i;

    for (i = 0; i < *n; i++)
        if (strcmp(out[i].name, name) == 0)
            break;
    if (i == *n) {
        if (*n == max)
            return;
        memset(&out[i], 0, sizeof(out[i]));
        strcpy(out[i].name, name);
        (*n)++;
    }
    for (int k = 0; k < SFS_TIERS; k++)
        out[i].tier[k] += (uint64_t)t[k];
    out[i].attached += attached;
}

unsigned sfs_cache_served(struct sfs_cache *c, struct sfs_served *out, unsigned max)
{
    unsigned n = 0;
    char name[SFS_CLASS_LEN];

    if (!c || !out)
        return 0;
    /* Under proc_lock a fold is never seen half-done; past its wait the
     * snapshot is taken without it (as sfs_cache_stats). */
    bool locked = sfs_proc_lock(c, 0) == 0;

    for (int i = 0; i < SFS_CLASSES; i++) {
        const struct sfs_class_rec *e = &c->hdr->classes[i];

        if (e->name[0] == '\0')
            continue;
        read_name(e->name, name);
        add_to(out, &n, max, name, e->served, 0);
    }
    for (uint32_t i = 0; i < c->max_procs; i++) {
        struct sfs_proc_rec *p = &c->procs[i];
        int64_t v[CTR_COUNT], t[SFS_TIERS];

        uint32_t state = atomic_load_explicit(&p->state, memory_order_acquire);

        if (state == PROC_FREE)
            continue;
        for (int k = 0; k < CTR_COUNT; k++)
            v[k] = atomic_load_explicit(&p->ctr[k], memory_order_relaxed);
        v[CTR_REQUESTS] += (int64_t)hits_sum(c, i, false);
        t[SFS_TIER_MEMORY] = memory_of(v);
        for (int k = SFS_TIER_PEER; k < SFS_TIERS; k++)
            t[k] = atomic_load_explicit(&p->served[k], memory_order_relaxed);
        bool any = false;
        for (int k = 0; k < SFS_TIERS; k++)
            any |= t[k] != 0;
        if (!any && state != PROC_ALIVE)
            continue;
        read_name(p->cls, name);
        add_to(out, &n, max, name, t, state == PROC_ALIVE);
    }
    if (locked)
        pthread_mutex_unlock(&c->hdr->proc_lock);
    for (unsigned i = 0; i < n; i++)
        for (int k = 0; k < SFS_TIERS; k++)
            if ((int64_t)out[i].tier[k] < 0)
                out[i].tier[k] = 0; /* counters are read one by one */
    return n;
}

void sfs_cache_hist(struct sfs_cache *c, enum sfs_hist_kind k, struct sfs_hist *out)
{
    uint64_t acc[SFS_HIST_BUCKETS + 1];

    if (!out)
        return;
    memset(out, 0, sizeof(*out));
    if (!c || (unsigned)k >= SFS_HIST_KINDS)
        return;
    bool locked = sfs_proc_lock(c, 0) == 0;

    memcpy(acc, c->hdr->retired_hist[k], sizeof(acc));
    for (uint32_t i = 0; i < c->max_procs; i++)
        for (int b = 0; b <= SFS_HIST_BUCKETS; b++)
            acc[b] += atomic_load_explicit(&c->procs[i].hist[k][b], memory_order_relaxed);
    if (locked)
        pthread_mutex_unlock(&c->hdr->proc_lock);
    memcpy(out->bucket, acc, sizeof(out->bucket));
    out->sum_ns = acc[SFS_HIST_BUCKETS];
}
