/* SPDX-License-Identifier: MIT */
/*
 * backend_fault.c - a backend that wraps another and injects faults.
 *
 * Every request gets a sequence number at submission; whether it fails, is
 * cut short or stalls, and how much jitter it gets, are a pure function of
 * (seed, sequence number) through splitmix64, so a test that submits the same
 * requests in the same order sees the same faults, whatever the threads do.
 *
 * Each caller's request is forwarded as a shadow request of our own (the
 * inner backend needs the priv[] words of its request for itself). When the
 * shadow completes, or at once for an injected -EIO, the request is due at
 * submit time + latency + jitter (+ stall). Requests already due complete
 * in the thread that finished them; the others go on a min-heap served by one
 * timer thread, so a submitter never sleeps. Short reads forward a request
 * for the first half of the buffer and report -EIO: the caller's buffer holds
 * fewer bytes than asked, as after a real short read.
 *
 * Close waits until every request has completed, then closes the inner.
 */
#include "backend_i.h"

#include <shardfs/fault.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct fault_req {
    struct sfs_io shadow; /* what the inner backend sees */
    struct sfs_io *outer; /* the caller's request */
    struct fault_backend *fb;
    int64_t due_ns; /* CLOCK_MONOTONIC */
    bool short_read;
};

struct fault_backend {
    struct sfs_backend be;
    struct sfs_backend *inner;

    pthread_mutex_t cfg_lock;
    struct sfs_fault_opts cfg; /* cfg_lock */

    atomic_uint_fast64_t seq;      /* next request number */
    atomic_uint_fast64_t loads;    /* loads submitted */
    atomic_uint_fast64_t dumps;    /* dumps submitted */
    atomic_uint_fast64_t injected; /* -EIO and short reads injected */

    pthread_t timer;
    pthread_mutex_t lock;
    pthread_cond_t timer_cond; /* the heap's top changed, or stop */
    pthread_cond_t idle_cond;  /* outstanding reached 0 */
    struct fault_req **heap;   /* lock: min-heap on due_ns */
    size_t nheap, heap_cap;    /* lock */
    size_t outstanding;        /* lock: requests not yet completed */
    bool stop;                 /* lock */
};

static const struct sfs_backend_ops fault_ops;

static int64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* --- options --- */

int sfs_fault_parse(const char *s, size_t len, struct sfs_fault_opts *o, char *errbuf,
                    size_t errlen)
{
    char *copy, *item, *save = NULL;
    int ret = 0;

    memset(o, 0, sizeof(*o));
    copy = strndup(s, len);
    if (!copy)
        return -ENOMEM;
    for (item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '='), *end;
        const char *v;
        bool prob;
        uint64_t *u = NULL;
        double *d = NULL;

        if (!eq) {
            sfs_errf(errbuf, errlen, "fault spec: option '%s' has no '=value'", item);
            ret = -EINVAL;
            break;
        }
        *eq = '\0';
        v = eq + 1;
        if (strcmp(item, "latency_us") == 0)
            u = &o->latency_us;
        else if (strcmp(item, "jitter_us") == 0)
            u = &o->jitter_us;
        else if (strcmp(item, "stall_ms") == 0)
            u = &o->stall_ms;
        else if (strcmp(item, "stall_every") == 0)
            u = &o->stall_every;
        else if (strcmp(item, "seed") == 0)
            u = &o->seed;
        else if (strcmp(item, "eio") == 0)
            d = &o->eio;
        else if (strcmp(item, "short") == 0)
            d = &o->short_read;
        else {
            sfs_errf(errbuf, errlen,
                     "fault spec: unknown option '%s' (latency_us, jitter_us, eio, short, "
                     "stall_ms, stall_every, seed)",
                     item);
            ret = -EINVAL;
            break;
        }
        prob = d != NULL;
        errno = 0;
        if (prob) {
            double x = strtod(v, &end);

            if (*v == '\0' || *end != '\0' || errno || !isfinite(x) || x < 0 || x > 1)
                goto bad_value;
            *d = x;
        } else {
            unsigned long long x;

            if (*v < '0' || *v > '9')
                goto bad_value;
            x = strtoull(v, &end, 0);
            if (*end != '\0' || errno)
                goto bad_value;
            /* Delays in ns must not overflow int64 later: cap at ~1 day. */
            if ((u == &o->latency_us || u == &o->jitter_us) && x > 86400ull * 1000000)
                goto bad_value;
            if (u == &o->stall_ms && x > 86400ull * 1000)
                goto bad_value;
            *u = x;
        }
        continue;
    bad_value:
        sfs_errf(errbuf, errlen, "fault spec: bad value '%s' for '%s'%s", v, item,
                 prob ? " (a probability 0..1)" : " (a non-negative integer)");
        ret = -EINVAL;
        break;
    }
    free(copy);
    return ret;
}

/* --- decisions --- */

struct verdict {
    bool eio, short_read;
    int64_t delay_ns;
};

static double unit(uint64_t r)
{
    return (double)(r >> 11) * 0x1.0p-53;
}

static struct verdict decide(const struct sfs_fault_opts *c, uint64_t seq, bool load)
{
    uint64_t st = c->seed ^ (seq * 0xd1b54a32d192ed03ull);
    uint64_t r1 = sfs_splitmix64(&st), r2 = sfs_splitmix64(&st), r3 = sfs_splitmix64(&st);
    struct verdict v = {0};

    v.eio = c->eio > 0 && unit(r1) < c->eio;
    v.short_read = load && !v.eio && c->short_read > 0 && unit(r2) < c->short_read;
    v.delay_ns = (int64_t)c->latency_us * 1000;
    if (c->jitter_us)
        v.delay_ns += (int64_t)(r3 % (c->jitter_us + 1)) * 1000;
    if (c->stall_ms && (c->stall_every <= 1 || (seq + 1) % c->stall_every == 0))
        v.delay_ns += (int64_t)c->stall_ms * 1000000;
    return v;
}

/* --- timer heap (caller holds fb->lock) --- */

static void heap_swap(struct fault_req **h, size_t a, size_t b)
{
    struct fault_req *t = h[a];

    h[a] = h[b];
    h[b] = t;
}

static int heap_push(struct fault_backend *fb, struct fault_req *r)
{
    size_t i;

    if (fb->nheap == fb->heap_cap) {
        size_t cap = fb->heap_cap ? fb->heap_cap * 2 : 64;
        struct fault_req **h = realloc(fb->heap, cap * sizeof(*h));

        if (!h)
            return -ENOMEM;
        fb->heap = h;
        fb->heap_cap = cap;
    }
    i = fb->nheap++;
    fb->heap[i] = r;
    while (i > 0 && fb->heap[(i - 1) / 2]->due_ns > fb->heap[i]->due_ns) {
        heap_swap(fb->heap, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    return 0;
}

static struct fault_req *heap_pop(struct fault_backend *fb)
{
    struct fault_req *top = fb->heap[0];
    size_t i = 0;

    fb->heap[0] = fb->heap[--fb->nheap];
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;

        if (l < fb->nheap && fb->heap[l]->due_ns < fb->heap[m]->due_ns)
            m = l;
        if (r < fb->nheap && fb->heap[r]->due_ns < fb->heap[m]->due_ns)
            m = r;
        if (m == i)
            break;
        heap_swap(fb->heap, i, m);
        i = m;
    }
    return top;
}

/* Hand the caller's request back and forget ours. */
static void complete(struct fault_req *r)
{
    struct fault_backend *fb = r->fb;
    struct sfs_io *outer = r->outer;

    free(r);
    outer->done(outer);
    pthread_mutex_lock(&fb->lock);
    if (--fb->outstanding == 0)
        pthread_cond_broadcast(&fb->idle_cond);
    pthread_mutex_unlock(&fb->lock);
}

/* The request's result is set: complete it now if due, else at due_ns. */
static void schedule(struct fault_req *r)
{
    struct fault_backend *fb = r->fb;
    bool queued = false;

    if (r->due_ns > now_ns()) {
        pthread_mutex_lock(&fb->lock);
        if (heap_push(fb, r) == 0) {
            queued = true;
            if (fb->heap[0] == r)
                pthread_cond_signal(&fb->timer_cond);
        }
        pthread_mutex_unlock(&fb->lock);
    }
    if (!queued)
        complete(r); /* due, or no memory to wait with: complete early */
}

static void *timer_main(void *arg)
{
    struct fault_backend *fb = arg;

    pthread_mutex_lock(&fb->lock);
    for (;;) {
        int64_t now;

        if (fb->nheap == 0) {
            if (fb->stop)
                break;
            pthread_cond_wait(&fb->timer_cond, &fb->lock);
            continue;
        }
        now = now_ns();
        if (fb->heap[0]->due_ns <= now) {
            struct fault_req *r = heap_pop(fb);

            pthread_mutex_unlock(&fb->lock);
            complete(r);
            pthread_mutex_lock(&fb->lock);
        } else {
            struct timespec ts = {
                .tv_sec = fb->heap[0]->due_ns / 1000000000,
                .tv_nsec = fb->heap[0]->due_ns % 1000000000,
            };

            pthread_cond_timedwait(&fb->timer_cond, &fb->lock, &ts);
        }
    }
    pthread_mutex_unlock(&fb->lock);
    return NULL;
}

/* --- requests --- */

static void shadow_done(struct sfs_io *shadow)
{
    struct fault_req *r = shadow->arg;

    /* A short read that read its half reports the shortfall; errors pass. */
    r->outer->result = (r->short_read && shadow->result >= 0) ? -EIO : shadow->result;
    schedule(r);
}

static int submit(struct sfs_backend *be, struct sfs_io **ios, size_t n, bool load)
{
    struct fault_backend *fb = (struct fault_backend *)be;
    struct sfs_io **fwd = malloc(n * sizeof(*fwd));
    struct fault_req **reqs = malloc(n * sizeof(*reqs));
    struct sfs_fault_opts cfg;
    int64_t t0 = now_ns();
    size_t nfwd = 0, nreq = 0;
    int ret;

    if (!fwd || !reqs) {
        free(fwd);
        free(reqs);
        return -ENOMEM;
    }
    pthread_mutex_lock(&fb->cfg_lock);
    cfg = fb->cfg;
    pthread_mutex_unlock(&fb->cfg_lock);
    /* Relaxed: counters and request numbers need atomicity, not ordering. */
    atomic_fetch_add_explicit(load ? &fb->loads : &fb->dumps, n, memory_order_relaxed);

    pthread_mutex_lock(&fb->lock);
    fb->outstanding += n;
    pthread_mutex_unlock(&fb->lock);

    for (size_t i = 0; i < n; i++) {
        struct sfs_io *io = ios[i];
        /* Relaxed: see above; one number per request is all that matters. */
        uint64_t seq = atomic_fetch_add_explicit(&fb->seq, 1, memory_order_relaxed);
        struct verdict v = decide(&cfg, seq, load);
        struct fault_req *r = calloc(1, sizeof(*r));

        if (!r) {
            io->result = -ENOMEM;
            io->done(io);
            pthread_mutex_lock(&fb->lock);
            if (--fb->outstanding == 0)
                pthread_cond_broadcast(&fb->idle_cond);
            pthread_mutex_unlock(&fb->lock);
            continue;
        }
        r->outer = io;
        r->fb = fb;
        r->due_ns = t0 + v.delay_ns;
        reqs[nreq++] = r;
        if (v.eio || (v.short_read && io->len < 2)) {
            /* Relaxed: a counter. */
            atomic_fetch_add_explicit(&fb->injected, 1, memory_order_relaxed);
            io->result = -EIO;
            r->shadow.arg = NULL; /* marks "not forwarded" */
            continue;
        }
        if (v.short_read)
            atomic_fetch_add_explicit(&fb->injected, 1,
                                      memory_order_relaxed); /* relaxed: counter */
        r->short_read = v.short_read;
        r->shadow.key = io->key;
        r->shadow.buf = io->buf;
        r->shadow.len = v.short_read ? io->len / 2 : io->len;
        r->shadow.done = shadow_done;
        r->shadow.arg = r;
        fwd[nfwd++] = &r->shadow;
    }

    /* Injected failures first: forwarded requests may complete (and free
     * themselves) inline during the inner submit. */
    for (size_t i = 0; i < nreq; i++)
        if (!reqs[i]->shadow.arg)
            schedule(reqs[i]);
    free(reqs);
    if (nfwd) {
        ret =
            load ? sfs_be_load(fb->inner, fwd, nfwd) : sfs_be_dump(fb->inner, fwd, nfwd);
        if (ret < 0) {
            /* None was submitted, so none will complete: we do it. */
            for (size_t i = 0; i < nfwd; i++) {
                struct fault_req *r = fwd[i]->arg;

                r->outer->result = ret;
                schedule(r);
            }
        }
    }
    free(fwd);
    return (int)n;
}

static int fault_load(struct sfs_backend *be, struct sfs_io **ios, size_t n)
{
    return submit(be, ios, n, true);
}

static int fault_dump(struct sfs_backend *be, struct sfs_io **ios, size_t n)
{
    return submit(be, ios, n, false);
}

static int fault_exists(struct sfs_backend *be, const struct sfs_key *keys, size_t n, bool *present)
{
    return sfs_be_exists(((struct fault_backend *)be)->inner, keys, n, present);
}

static int fault_shard_count(struct sfs_backend *be, const struct sfs_block_id *block)
{
    return sfs_be_shard_count(((struct fault_backend *)be)->inner, block);
}

static int fault_scan(struct sfs_backend *be, sfs_scan_fn *fn, void *arg)
{
    return sfs_be_scan(((struct fault_backend *)be)->inner, fn, arg);
}

static int fault_evict(struct sfs_backend *be, const struct sfs_block_id *block,
                       const struct sfs_block_stamp *expect, uint64_t *freed)
{
    return sfs_be_evict(((struct fault_backend *)be)->inner, block, expect, freed);
}

static int fault_lease(struct sfs_backend *be, const char *role, uint32_t ttl_ms)
{
    return sfs_be_lease(((struct fault_backend *)be)->inner, role, ttl_ms);
}

static int fault_stamp(struct sfs_backend *be, const struct sfs_block_id *block,
                       struct sfs_block_stamp *out)
{
    return sfs_be_stamp(((struct fault_backend *)be)->inner, block, out);
}

static int fault_touch(struct sfs_backend *be, const struct sfs_block_id *blocks, size_t n)
{
    return sfs_be_touch(((struct fault_backend *)be)->inner, blocks, n);
}

static int fault_remove(struct sfs_backend *be, const struct sfs_key *key)
{
    return sfs_be_remove(((struct fault_backend *)be)->inner, key);
}

static int fault_list(struct sfs_backend *be, int (*fn)(const struct sfs_block_id *, void *),
                      void *arg)
{
    return sfs_be_list(((struct fault_backend *)be)->inner, fn, arg);
}

static void fault_close(struct sfs_backend *be)
{
    struct fault_backend *fb = (struct fault_backend *)be;

    pthread_mutex_lock(&fb->lock);
    while (fb->outstanding)
        pthread_cond_wait(&fb->idle_cond, &fb->lock);
    fb->stop = true;
    pthread_cond_signal(&fb->timer_cond);
    pthread_mutex_unlock(&fb->lock);
    pthread_join(fb->timer, NULL);
    sfs_be_close(fb->inner);
    free(fb->heap);
    pthread_cond_destroy(&fb->idle_cond);
    pthread_cond_destroy(&fb->timer_cond);
    pthread_mutex_destroy(&fb->lock);
    pthread_mutex_destroy(&fb->cfg_lock);
    free(fb);
}

static const struct sfs_backend_ops fault_ops = {
    .name = "fault",
    .load = fault_load,
    .dump = fault_dump,
    .exists = fault_exists,
    .shard_count = fault_shard_count,
    .stamp = fault_stamp,
    .scan = fault_scan,
    .evict = fault_evict,
    .lease = fault_lease,
    .touch = fault_touch,
    .remove = fault_remove,
    .list = fault_list,
    .close = fault_close,
};

struct sfs_backend *sfs_fault_wrap(struct sfs_backend *inner, const struct sfs_fault_opts *o,
                                   int *err)
{
    struct fault_backend *fb = calloc(1, sizeof(*fb));
    pthread_condattr_t ca;
    sigset_t all, old;
    int ret;

    if (!fb) {
        *err = -ENOMEM;
        return NULL;
    }
    fb->be.ops = &fault_ops;
    fb->be.shard_size = inner->shard_size;
    fb->inner = inner;
    fb->cfg = *o;
    atomic_init(&fb->seq, 0);
    atomic_init(&fb->loads, 0);
    atomic_init(&fb->dumps, 0);
    atomic_init(&fb->injected, 0);
    pthread_mutex_init(&fb->cfg_lock, NULL);
    pthread_mutex_init(&fb->lock, NULL);
    pthread_cond_init(&fb->idle_cond, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&fb->timer_cond, &ca);
    pthread_condattr_destroy(&ca);
    /* The timer thread takes no signals: they belong to the application. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    ret = pthread_create(&fb->timer, NULL, timer_main, fb);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (ret) {
        pthread_cond_destroy(&fb->timer_cond);
        pthread_cond_destroy(&fb->idle_cond);
        pthread_mutex_destroy(&fb->lock);
        pthread_mutex_destroy(&fb->cfg_lock);
        free(fb);
        *err = -ret;
        return NULL;
    }
    return &fb->be;
}

int sfs_fault_set(struct sfs_backend *be, const char *opts)
{
    struct fault_backend *fb = (struct fault_backend *)be;
    struct sfs_fault_opts o;
    int ret;

    if (!be || !opts || be->ops != &fault_ops)
        return -EINVAL;
    ret = sfs_fault_parse(opts, strlen(opts), &o, NULL, 0);
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&fb->cfg_lock);
    fb->cfg = o;
    pthread_mutex_unlock(&fb->cfg_lock);
    return 0;
}

void sfs_fault_counts(struct sfs_backend *be, uint64_t *loads, uint64_t *dumps, uint64_t *injected)
{
    struct fault_backend *fb = (struct fault_backend *)be;
    bool ok = be && be->ops == &fault_ops;

    /* Relaxed: a snapshot of counters. */
    if (loads)
        *loads = ok ? atomic_load_explicit(&fb->loads, memory_order_relaxed) : 0;
    if (dumps)
        *dumps = ok ? atomic_load_explicit(&fb->dumps, memory_order_relaxed) : 0;
    if (injected)
        *injected = ok ? atomic_load_explicit(&fb->injected, memory_order_relaxed) : 0;
}
