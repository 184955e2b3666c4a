/* SPDX-License-Identifier: MIT */
/*
 * storecap.c - -o store_capacity: the collector that keeps the store's block
 * bytes at or under a bound (docs/eviction.md, "The store's bound").
 *
 * One thread. A pass scans the store (sfs_backend_scan: one directory at a
 * time, one stat a file) and, as it goes, sums the block files' bytes on
 * disk and keeps the COLLECT_HEAP coldest of them in a max-heap (the
 * hottest of the kept at its root, replaced by any colder one): memory
 * bounded by the heap, whatever the store holds, sorted coldest first.
 * When the count is above the high watermark, the kept blocks are removed
 * coldest first until it is at the low one; a pass that runs out of kept
 * blocks first is followed at once by another (at most COLLECT_PASSES in
 * a row). A scan runs at mount and every COLLECT_PERIOD_MS. Between scans,
 * the mount's own commits add to the running count (fs_storecap_note), and
 * one that takes it past the high watermark starts a pass at once that
 * goes on down the last scan's list, without scanning again: a burst of
 * writes costs a removal each, not a scan each. Writes the daemon does not
 * see (ranks, other hosts) are counted at the next scan.
 *
 * Coldest: the fewest uses in the learned hot set (usage.c: decayed counts,
 * kept across restarts in the usage file), then the oldest of the file's
 * access and modification times (what the store says of a block the daemon
 * never saw used). So the ranking survives an unmount and a SIGKILL (the
 * usage file as last saved; the times in the store itself).
 *
 * Kept whatever their rank: a block whose pin lasts (sfs_cache_block_pinned),
 * a block of which a slot is leased (a rank's or a reader's use now: a full
 * sfs_cache_sample of the cache just before the removals), and a block with
 * a commit in flight (the store's evict takes the commit's own lock and keeps
 * a block changed since the scan: shardfs/backend.h). The removal is the
 * store's: one unlink of the whole block file, so a reader gets the whole
 * old block (an open file keeps its bytes) or a miss. The cache's copies
 * stay until CLOCK takes them: they are the bytes the store held.
 *
 * Several hosts (or daemons) on one store with the bound: one collects at a
 * time. The store decides: a store-wide lease (sfs_backend_lease, a file at
 * the store's root) names the collector, which looks that it still holds it
 * at every pass, every COLLECT_RENEW_EVERY files of a scan and before each
 * removal (a stat; renewed every quarter of its ttl); the others stand by,
 * and one of them takes over a ttl (COLLECT_LEASE_PERIODS periods) after it
 * stops renewing (killed, hung, stopped) or at once when it stops cleanly.
 * A collector stopped past the ttl and continued finds at its next look
 * that it lost the lease, and removes nothing more. A collector killed
 * mid-pass leaves whole files only: each removal is one unlink.
 *
 * A run: the passes in a row from the one that finds the count above the
 * high watermark. It shows its progress as the warm-up does: in /stats (a
 * gauge while it runs, the bytes above the low watermark it sets out to
 * remove, the bytes removed so far) and in the log, a line as it starts,
 * one at each 10 % of those bytes, and one with its totals as it ends.
 *
 * Calls usage.c (the counts) and log.c; main.c, write.c and stats.c call it.
 */
#include "fs_i.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>
#include <unistd.h>

#define COLLECT_HEAP      4096  /* the coldest blocks one pass keeps (56 B each) */
#define COLLECT_PASSES    64    /* passes in a row while above the low watermark */
#define COLLECT_PERIOD_MS 10000 /* a pass at least this often */
/* The test build (shardfs-hooks) only: SHARDFS_TEST_STORE_PERIOD_MS=N
 * (100..COLLECT_PERIOD_MS) passes every N ms, so that a test sees the
 * writes of ranks without waiting 10 s. */
#define COLLECT_PERIOD_ENV "SHARDFS_TEST_STORE_PERIOD_MS"
/* The store's collector lease (sfs_backend_lease): lost this long after its
 * holder's last renewal, in periods (the test build's shorter period gives
 * a shorter ttl: 3 x 200 ms in test_fs_storecap). */
#define COLLECT_LEASE_PERIODS 3
#define COLLECT_LEASE_ROLE    "collector"
#define COLLECT_RENEW_EVERY   1024 /* files scanned between two looks at the clock */
/* Blocks with a leased slot one look records (16 B each): more leased at
 * once and the pass removes nothing (it cannot tell which they are). */
#define COLLECT_BUSY_MAX 65536

struct cand {
    struct sfs_block_scan b;
    uint32_t uses;
};

struct fs_storecap {
    struct fs *fs;
    uint64_t high, low; /* bytes: the watermarks */
    uint32_t period_ms;
    uint32_t lease_ms; /* the lease's ttl */

    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* CLOCK_MONOTONIC: stop or kick was set */
    bool stop;           /* set under lock; read relaxed between blocks too (__atomic) */
    bool kick;           /* lock: a write took the count past high */

    /* The thread's own. */
    struct cand *heap; /* COLLECT_HEAP: during a scan a max-heap of the coldest seen
                        * (the hottest of them at 0), then sorted coldest first */
    size_t n;
    uint64_t total;            /* this pass's count of the store's bytes */
    size_t next;               /* heap[next]: the next candidate (heap sorted coldest first) */
    int64_t scanned_ns;        /* sfs_now_ns of the last scan */
    struct sfs_block_id *busy; /* blocks with a leased slot, sorted; at most capbusy */
    size_t nbusy, capbusy;
    bool busy_over;   /* the last look found more than capbusy leased slots */
    uint64_t scanned; /* files this pass */
    bool lost;        /* this pass lost the lease: it removes nothing more */
    bool standby;     /* the last look found another collector's lease */

    /* The run under way (passes in a row that found the count above high). */
    bool running;
    uint64_t to_remove; /* bytes: the count above low at its start, grown by later passes' */
    uint64_t removed;   /* bytes removed so far */
    uint64_t nremoved;  /* blocks removed so far */
    unsigned step;      /* the last 10 % step logged */
    int64_t run_ns;     /* sfs_now_ns at its start */
};

#ifndef SFS_TEST_HOOKS
#define period_ms()          ((uint32_t)COLLECT_PERIOD_MS)
#define test_removal_wait()  ((void)0)
#define test_removal_noted() ((void)0)
#else
/* The test build only: SHARDFS_TEST_STORE_REMOVE_MS=N (1..1000) waits N ms
 * before each removal's look at the lease (a pass long enough for a test to
 * stop its collector mid-pass), and SHARDFS_TEST_STORE_REMOVALS=FILE appends
 * a line "<pid>" to FILE after each removal (O_APPEND: the daemons on one
 * store share it, in the order of their removals). */
static void test_removal_wait(void)
{
    const char *e = getenv("SHARDFS_TEST_STORE_REMOVE_MS");
    unsigned long v = e ? strtoul(e, NULL, 10) : 0;

    if (v >= 1 && v <= 1000)
        {
        struct timespec ts = {(time_t)(v / 1000), (long)(v % 1000) * 1000000};

        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
    }
}

static void test_removal_noted(void)
{
    const char *e = getenv("SHARDFS_TEST_STORE_REMOVALS");
    char line[24];
    int fd, n;

    if (!e || !*e)
        return;
    fd = open(e, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    n = snprintf(line, sizeof(line), "%d\n", (int)getpid());
    if (write(fd, line, (size_t)n) != n)
        fs_log(LOG_WARNING, "store_capacity: the test's removal log: %s", strerror(errno));
    close(fd);
}

static uint32_t period_ms(void)
{
    const char *e = getenv(COLLECT_PERIOD_ENV);
    char *end;
    unsigned long v = e ? strtoul(e, &end, 10) : 0;

    if (!e || !*e || *end != '\0' || v < 100 || v > COLLECT_PERIOD_MS)
        return COLLECT_PERIOD_MS;
    return (uint32_t)v;
}
#endif

static int64_t last_use(const struct sfs_block_scan *b)
{
    return b->atime_ns > b->stamp.mtime_ns ? b->atime_ns : b->stamp.mtime_ns;
}

/* a is hotter than b: more uses, then a later access or change. */
static bool hotter(const struct cand *a, const struct cand *b)
{
    if (a->uses != b->uses)
        return a->uses > b->uses;
    return last_use(&a->b) > last_use(&b->b);
}

static void sift_up(struct cand *h, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        struct cand t;

        if (!hotter(&h[i], &h[p]))
            break;
        t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

static void sift_down(struct cand *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        struct cand t;

        if (l < n && hotter(&h[l], &h[m]))
            m = l;
        if (r < n && hotter(&h[r], &h[m]))
            m = r;
        if (m == i)
            return;
        t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/*
 * Is this daemon the store's collector? Takes the lease, or (held) checks
 * that the store's lease file is still ours and renews it (the backend
 * renews a quarter of the ttl after its last renewal: a check costs one
 * stat). Called at each pass, every COLLECT_RENEW_EVERY files of a scan and
 * before each removal, so a collector that lost the lease (stopped past
 * its ttl, then continued) removes nothing more. A backend without leases
 * (-EOPNOTSUPP: no shared directory) collects alone; one that cannot
 * answer (-errno) stands by this time: two collectors at once never.
 * Logs each change of role.
 */
static bool hold_lease(struct fs_storecap *sc)
{
    int r = sfs_backend_lease(sc->fs->be, COLLECT_LEASE_ROLE, sc->lease_ms);
    bool standby = r != 1 && r != -EOPNOTSUPP;

    if (r < 0 && r != -EOPNOTSUPP && !sc->standby)
        fs_log(LOG_WARNING, "store_capacity: the store's collector lease: %s (standing by)",
               strerror(-r));
    if (standby != sc->standby)
        fs_log(LOG_NOTICE, "store_capacity: %s",
               standby ? "another host or daemon collects "
                         "this store: standing by"
                       : "collecting this store");
    sc->standby = standby;
    atomic_store_explicit(&sc->fs->ctr.store_collector, !standby, memory_order_relaxed);
    return !standby;
}

/* Mid-pass: still the collector? False (and lost set) once another took
 * the lease: the pass removes nothing more. */
static bool still_held(struct fs_storecap *sc)
{
    if (!sc->lost && !hold_lease(sc))
        sc->lost = true;
    return !sc->lost;
}

static int scan_fn(const struct sfs_block_scan *b, void *arg)
{
    struct fs_storecap *sc = arg;
    struct cand c = {*b, fs_usage_count(sc->fs, &b->id)};

    sc->total += b->bytes;
    if (sc->n < COLLECT_HEAP) {
        sc->heap[sc->n] = c;
        sift_up(sc->heap, sc->n++);
    } else if (hotter(&sc->heap[0], &c)) {
        sc->heap[0] = c;
        sift_down(sc->heap, sc->n, 0);
    }
    if (++sc->scanned % COLLECT_RENEW_EVERY == 0 && !still_held(sc))
        return 1;
    /* Relaxed reads of stop: the pass ends early at a stop. */
    return __atomic_load_n(&sc->stop, __ATOMIC_RELAXED) ? 1 : 0;
}

static int cmp_id(const void *a, const void *b)
{
    return memcmp(a, b, sizeof(struct sfs_block_id));
}

/* Runs under a bucket lock: only appends, within capbusy (never grows). */
static int busy_fn(const struct sfs_key *key, uint32_t slot, bool accessed, bool leased, void *arg)
{
    struct fs_storecap *sc = arg;

    (void)slot;
    (void)accessed;
    if (leased && sc->nbusy < sc->capbusy)
        sc->busy[sc->nbusy++] = key->block;
    else if (leased)
        sc->busy_over = true;
    return 0;
}

/* The blocks with a leased slot now: one look at every bucket. */
static void busy_snapshot(struct fs_storecap *sc)
{
    uint32_t cursor = 0;

    sc->nbusy = 0;
    sc->busy_over = false;
    sfs_cache_sample(sc->fs->cache, &cursor, 0, busy_fn, sc);
    if (sc->nbusy > 1)
        qsort(sc->busy, sc->nbusy, sizeof(*sc->busy), cmp_id);
}

static bool keep(struct fs_storecap *sc, const struct sfs_block_id *id)
{
    if (sfs_cache_block_pinned(sc->fs->cache, id) != 0)
        return true;
    return sc->nbusy && bsearch(id, sc->busy, sc->nbusy, sizeof(*sc->busy), cmp_id);
}

static int cmp_cold(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;

    return hotter(x, y) ? 1 : hotter(y, x) ? -1 : 0;
}

/* Scan the store: the sum, and the COLLECT_HEAP coldest sorted coldest
 * first (sc->next = 0). 0, or -1 (an error logged, a stop, the lease lost). */
static int scan_store(struct fs_storecap *sc)
{
    int r;

    sc->n = 0;
    sc->next = 0;
    sc->total = 0;
    sc->scanned = 0;
    r = sfs_backend_scan(sc->fs->be, scan_fn, sc);
    if (r < 0)
        fs_log(LOG_WARNING, "store_capacity: the scan of the store failed: %s", strerror(-r));
    if (r != 0) {
        sc->n = 0; /* a partial heap ranks nothing */
        return -1;
    }
    qsort(sc->heap, sc->n, sizeof(*sc->heap), cmp_cold);
    sc->scanned_ns = sfs_now_ns();
    atomic_store_explicit(&sc->fs->ctr.store_bytes, sc->total, memory_order_relaxed);
    return 0;
}

/* Progress of a run, as the warm-up shows its own: the gauges of /stats
 * (relaxed: read only by /stats) and a log line at each 10 % step. */
static void run_show(struct fs_storecap *sc)
{
    struct fs *fs = sc->fs;
    unsigned pct =
        sc->removed >= sc->to_remove ? 100 : (unsigned)(sc->removed * 100 / sc->to_remove);

    atomic_store_explicit(&fs->ctr.store_to_remove, sc->to_remove, memory_order_relaxed);
    atomic_store_explicit(&fs->ctr.store_removed, sc->removed, memory_order_relaxed);
    if (pct / 10 <= sc->step)
        return;
    sc->step = pct / 10;
    fs_log(LOG_INFO,
           "store_capacity: %u %% (%" PRIu64 " of %" PRIu64 " bytes removed, %" PRIu64 " blocks)",
           pct, sc->removed, sc->to_remove, sc->nremoved);
}

/* A pass found the count above high (sc->total > sc->high > sc->low): a run
 * starts, or the one under way sets out to remove what was written since. */
static void run_note(struct fs_storecap *sc)
{
    struct fs *fs = sc->fs;
    uint64_t goal = sc->removed + (sc->total - sc->low);

    if (sc->running) {
        if (goal > sc->to_remove)
            sc->to_remove = goal;
        run_show(sc);
        return;
    }
    sc->running = true;
    sc->to_remove = sc->total - sc->low;
    sc->removed = 0;
    sc->nremoved = 0;
    sc->step = 0;
    sc->run_ns = sfs_now_ns();
    atomic_store_explicit(&fs->ctr.store_running, 1, memory_order_relaxed);
    run_show(sc);
    fs_log(LOG_INFO,
           "store_capacity: the store holds %" PRIu64 " bytes, above store_high (%" PRIu64
           "): removing the coldest blocks down to store_low (%" PRIu64 "), %" PRIu64 " bytes",
           sc->total, sc->high, sc->low, sc->to_remove);
}

/* The run ends: its totals, once. */
static void run_end(struct fs_storecap *sc)
{
    struct fs *fs = sc->fs;
    int64_t ms = (sfs_now_ns() - sc->run_ns) / 1000000;

    if (!sc->running)
        return;
    sc->running = false;
    atomic_store_explicit(&fs->ctr.store_running, 0, memory_order_relaxed);
    fs_log(LOG_INFO,
           "store_capacity: removed %" PRIu64 " blocks, %" PRIu64 " of %" PRIu64
           " bytes, in %" PRId64 ".%03" PRId64 " s; the store holds %" PRIu64
           " bytes (store_low %" PRIu64 ")%s",
           sc->nremoved, sc->removed, sc->to_remove, ms / 1000, ms % 1000, sc->total, sc->low,
           __atomic_load_n(&sc->stop, __ATOMIC_RELAXED) ? "; stopped"
           : sc->lost                                   ? "; another collector took the lease"
                                                        : "");
}

/*
 * One pass: remove the coldest first down to low. rescan: scan the store
 * first; otherwise (a kick from the mount's writes within a period of the
 * last scan) go on down the last scan's list from where the last pass
 * stopped, with the running count (the scan's, plus the mount's commits
 * since, minus the removals), as far as blocks unused then and since go
 * (colder than any block written since, which the list lacks): a burst of
 * writes costs one removal each, not one scan each. True when a scan may
 * find more above low (the caller scans again).
 */
static bool pass(struct fs_storecap *sc, bool rescan)
{
    struct fs *fs = sc->fs;
    bool removed = false, fresh = false;
    int r;

    sc->lost = false;
    if (!hold_lease(sc))
        return false; /* another collects: stand by */
    if (rescan || sc->next >= sc->n ||
        sfs_now_ns() - sc->scanned_ns >= (int64_t)sc->period_ms * 1000000) {
        if (scan_store(sc) < 0)
            return false;
        fresh = true;
    } else {
        sc->total = atomic_load_explicit(&fs->ctr.store_bytes, memory_order_relaxed);
    }
    if (sc->total <= sc->high)
        return false;
    run_note(sc);
    busy_snapshot(sc);
    if (sc->busy_over) {
        fs_log(LOG_WARNING,
               "store_capacity: more than %d slots leased at once: nothing removed "
               "this pass",
               COLLECT_BUSY_MAX);
        return false;
    }
    for (; sc->next < sc->n && sc->total > sc->low; sc->next++) {
        struct cand *c = &sc->heap[sc->next];
        uint64_t freed = 0;

        test_removal_wait();
        if (__atomic_load_n(&sc->stop, __ATOMIC_RELAXED) || !still_held(sc))
            return false;
        /* Going on down an older list: the blocks the mount wrote since,
         * not on it, rank as unused and newest; only a block colder than
         * them, unused then and since, may go before a scan sees them. */
        if (!fresh && c->uses)
            break;
        if (!fresh && fs_usage_count(fs, &c->b.id))
            continue;
        if (keep(sc, &c->b.id))
            continue;
        r = sfs_backend_evict(fs->be, &c->b.id, &c->b.stamp, &freed);
        if (r == -ENOENT) {
            sc->total -= c->b.bytes < sc->total ? c->b.bytes : sc->total;
            continue;
        }
        if (r < 0) {
            if (r != -ESTALE && r != -EBUSY)
                fs_log(LOG_WARNING, "store_capacity: a block's removal failed: %s", strerror(-r));
            if (r == -EROFS || r == -ETIMEDOUT)
                return false;
            continue;
        }
        sc->total -= freed < sc->total ? freed : sc->total;
        test_removal_noted();
        CTR_ADD(fs, store_evicted, 1);
        CTR_ADD(fs, store_freed, freed);
        /* The running count: the mount's commits since the last store are
         * added by fs_storecap_note (relaxed: a gauge). */
        atomic_fetch_sub_explicit(
            &fs->ctr.store_bytes,
            freed < atomic_load_explicit(&fs->ctr.store_bytes, memory_order_relaxed) ? freed : 0,
            memory_order_relaxed);
        removed = true;
        sc->removed += freed;
        sc->nremoved++;
        run_show(sc);
    }
    /* Out of candidates above low: scan again, unless a fresh scan's list
     * removed nothing (every cold block kept). */
    return sc->total > sc->low && (!fresh || (removed && sc->next >= sc->n));
}

static void *collect_main(void *arg)
{
    struct fs_storecap *sc = arg;
    struct timespec ts;

    bool stuck;

    bool kicked = false;

    pthread_mutex_lock(&sc->lock);
    while (!sc->stop) {
        kicked = sc->kick;
        sc->kick = false;
        pthread_mutex_unlock(&sc->lock);
        /* A kick goes on down the last scan's list; the period scans. */
        for (int i = 0; i < COLLECT_PASSES && pass(sc, i > 0 || !kicked); i++)
            ;
        run_end(sc);
        /* Still above high (every cold block kept: pinned, leased, being
         * committed): kicks wait for the period, not one scan a write. */
        stuck = sc->total > sc->high || sc->standby;
        pthread_mutex_lock(&sc->lock);
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += sc->period_ms / 1000;
        ts.tv_nsec += (long)(sc->period_ms % 1000) * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        /* Bound: one wake a period, or at a kick or a stop. */
        while (!sc->stop && (!sc->kick || stuck) &&
               pthread_cond_timedwait(&sc->cond, &sc->lock, &ts) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&sc->lock);
    return NULL;
}


int fs_storecap_start(struct fs *fs, unsigned high_pct, unsigned low_pct)
{
    struct fs_storecap *sc;
    struct sfs_cache_info ci;
    pthread_condattr_t ca;
    int r;

    fs->storecap = NULL;
    if (!fs->store_capacity)
        return 0;
    sc = calloc(1, sizeof(*sc));
    if (!sc)
        return -ENOMEM;
    sfs_cache_info(fs->cache, &ci);
    sc->fs = fs;
    sc->high = fs->store_capacity / 100 * high_pct + fs->store_capacity % 100 * high_pct / 100;
    sc->low = fs->store_capacity / 100 * low_pct + fs->store_capacity % 100 * low_pct / 100;
    sc->period_ms = period_ms();
    sc->lease_ms = COLLECT_LEASE_PERIODS * sc->period_ms;
    sc->heap = calloc(COLLECT_HEAP, sizeof(*sc->heap));
    sc->capbusy = ci.nslots < COLLECT_BUSY_MAX ? ci.nslots : COLLECT_BUSY_MAX;
    sc->busy = calloc(sc->capbusy ? sc->capbusy : 1, sizeof(*sc->busy));
    if (!sc->heap || !sc->busy) {
        r = -ENOMEM;
        goto out_free;
    }
    pthread_mutex_init(&sc->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&sc->cond, &ca);
    pthread_condattr_destroy(&ca);
    r = -pthread_create(&sc->thread, NULL, collect_main, sc);
    if (r < 0) {
        pthread_cond_destroy(&sc->cond);
        pthread_mutex_destroy(&sc->lock);
        goto out_free;
    }
    pthread_setname_np(sc->thread, "sfs-storecap"); /* for top, and bench_storecap's CPU */
    fs->storecap = sc;
    return 0;
out_free:
    free(sc->busy);
    free(sc->heap);
    free(sc);
    return r;
}

bool fs_storecap_stop(struct fs *fs, int64_t grace_ns)
{
    struct fs_storecap *sc = fs->storecap;
    struct timespec ts;

    if (!sc)
        return true;
    pthread_mutex_lock(&sc->lock);
    __atomic_store_n(&sc->stop, true, __ATOMIC_RELAXED); /* under lock: the wait sees it */
    pthread_cond_signal(&sc->cond);
    pthread_mutex_unlock(&sc->lock);
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += grace_ns / 1000000000;
    ts.tv_nsec += grace_ns % 1000000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    fs->storecap = NULL;
    if (pthread_timedjoin_np(sc->thread, NULL, &ts) != 0) {
        /* In a hung store (a scan has no deadline): left to the exit. */
        pthread_detach(sc->thread);
        return false;
    }
    /* Another host's or daemon's to take at once, not a ttl later. */
    if (!sc->standby)
        sfs_backend_lease(fs->be, COLLECT_LEASE_ROLE, 0);
    pthread_cond_destroy(&sc->cond);
    pthread_mutex_destroy(&sc->lock);
    free(sc->busy);
    free(sc->heap);
    free(sc);
    return true;
}

void fs_storecap_note(struct fs *fs, uint64_t bytes)
{
    struct fs_storecap *sc = fs->storecap;
    uint64_t now;

    if (!sc)
        return;
    /* Relaxed: a gauge; the next pass's scan replaces it with the truth. */
    now = atomic_fetch_add_explicit(&fs->ctr.store_bytes, bytes, memory_order_relaxed) + bytes;
    if (now > sc->high) {
        pthread_mutex_lock(&sc->lock);
        sc->kick = true;
        pthread_cond_signal(&sc->cond);
        pthread_mutex_unlock(&sc->lock);
    }
}
