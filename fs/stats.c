/* SPDX-License-Identifier: MIT */
/*
 * stats.c - the /stats text: the cache's shared counters and the daemon's
 * own (fs_counters), in the Prometheus text format.
 *
 * A snapshot: every counter is read once, relaxed, and written into the
 * caller's buffer of STATS_MAX bytes; the text is cut, never overrun, when it
 * does not fit. The open of /stats (write.c) and its attributes (attr.c)
 * call it; it calls no other room.
 */
#include "fs_i.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

struct textbuf {
    char *p;
    size_t len, cap;
};

static void emit(struct textbuf *t, const char *name, const char *type, const char *help,
                 uint64_t v)
{
    int n =
        snprintf(t->p + (t->len < t->cap ? t->len : t->cap), t->len < t->cap ? t->cap - t->len : 0,
                 "# HELP %s %s\n# TYPE %s %s\n%s %" PRIu64 "\n", name, help, name, type, name, v);

    if (n > 0)
        t->len += (size_t)n;
}

static void out(struct textbuf *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(struct textbuf *t, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    int n = vsnprintf(t->p + (t->len < t->cap ? t->len : t->cap),
                      t->len < t->cap ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n > 0)
        t->len += (size_t)n;
}

static void emit_raw(struct textbuf *t, const char *text)
{
    int n = snprintf(t->p + (t->len < t->cap ? t->len : t->cap),
                     t->len < t->cap ? t->cap - t->len : 0, "%s", text);

    if (n > 0)
        t->len += (size_t)n;
}

/* shardfs_partition_evictions_total{partition="i"}, one line a domain. */
static void emit_partitions(struct textbuf *t, struct sfs_cache *c)
{
    uint64_t ev[SFS_MAX_PARTITIONS_PUBLIC];
    uint32_t p = sfs_cache_partition_evictions(c, ev, SFS_MAX_PARTITIONS_PUBLIC);

    out(t, "# HELP shardfs_partition_evictions_total Evictions in each eviction domain "
           "(-o partitions).\n# TYPE shardfs_partition_evictions_total counter\n");
    for (uint32_t i = 0; i < p && i < SFS_MAX_PARTITIONS_PUBLIC; i++)
        out(t, "shardfs_partition_evictions_total{partition=\"%u\"} %" PRIu64 "\n", i, ev[i]);
}

static const char *const tier_names[SFS_TIERS] = {"memory", "peer", "store", "miss"};

/* shardfs_served_total{tier} and shardfs_class_served_total{class,tier}:
 * where each read was served from, in all and by requester class. */
static void emit_served(struct textbuf *t, struct sfs_cache *c)
{
    struct sfs_served sv[32];
    unsigned n = sfs_cache_served(c, sv, 32);
    uint64_t all[SFS_TIERS] = {0};

    for (unsigned i = 0; i < n; i++)
        for (int k = 0; k < SFS_TIERS; k++)
            all[k] += sv[i].tier[k];
    out(t, "# HELP shardfs_served_total Reads (Gets of the mount and the ranks) by where they "
           "were served from: memory (a hit, or a wait on another's load), the peer tier, the "
           "store, or a miss.\n# TYPE shardfs_served_total counter\n");
    for (int k = 0; k < SFS_TIERS; k++)
        out(t, "shardfs_served_total{tier=\"%s\"} %" PRIu64 "\n", tier_names[k], all[k]);
    out(t, "# HELP shardfs_class_served_total shardfs_served_total by requester class (the "
           "mount, rank, or an engine adapter's name).\n"
           "# TYPE shardfs_class_served_total counter\n");
    for (unsigned i = 0; i < n; i++)
        for (int k = 0; k < SFS_TIERS; k++)
            out(t, "shardfs_class_served_total{class=\"%s\",tier=\"%s\"} %" PRIu64 "\n", sv[i].name,
                tier_names[k], sv[i].tier[k]);
    out(t, "# HELP shardfs_attached_processes Processes attached to the cache now, by requester "
           "class (the daemon is one, class mount).\n"
           "# TYPE shardfs_attached_processes gauge\n");
    for (unsigned i = 0; i < n; i++)
        out(t, "shardfs_attached_processes{class=\"%s\"} %u\n", sv[i].name, sv[i].attached);
}

/* One Prometheus histogram: cumulative _bucket{le}, _sum and _count. */
static void emit_hist(struct textbuf *t, const char *name, const char *help,
                      const struct sfs_hist *h)
{
    uint64_t cum = 0;

    out(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (unsigned b = 0; b < SFS_HIST_BUCKETS; b++) {
        cum += h->bucket[b];
        if (b < SFS_HIST_BUCKETS - 1)
            out(t, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, (double)sfs_hist_bound_ns(b) / 1e9,
                cum);
        else
            out(t, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
    }
    out(t, "%s_sum %.9f\n%s_count %" PRIu64 "\n", name, (double)h->sum_ns / 1e9, name, cum);
}

/* shardfs_hot_block_uses{block}: the 5 hottest blocks of the learned hot
 * set (decayed use counts, the warm restart's ranking). */
static void emit_hottest(struct textbuf *t, struct fs *fs)
{
    struct sfs_block_id ids[5];
    uint32_t counts[5];
    unsigned n = fs_usage_hottest(fs, ids, counts, 5);

    out(t, "# HELP shardfs_hot_block_uses The hottest blocks of the learned hot set: decayed "
           "use counts (mount reads and the sampler).\n# TYPE shardfs_hot_block_uses gauge\n");
    for (unsigned i = 0; i < n; i++) {
        char hex[SFS_BLOCK_HEX_LEN + 1];

        sfs_block_to_hex(&ids[i], hex);
        out(t, "shardfs_hot_block_uses{block=\"%s\"} %u\n", hex, counts[i]);
    }
}

static void emit_hists(struct textbuf *t, struct fs *fs)
{
    struct sfs_hist h;

    sfs_cache_hist(fs->cache, SFS_HIST_LOAD, &h);
    emit_hist(t, "shardfs_load_duration_seconds",
              "Backend loads of the mount's and the ranks' misses, submit to completion.", &h);
    sfs_cache_hist(fs->cache, SFS_HIST_WAIT, &h);
    emit_hist(t, "shardfs_wait_duration_seconds",
              "Waits of readers (mount and ranks) for a load another started.", &h);
    if (sfs_backend_peer_hist(fs->be, &h) == 0)
        emit_hist(t, "shardfs_peer_get_duration_seconds",
                  "The daemon's peer tier gets, one observation per key of a batch.", &h);
}

size_t fs_stats_text(struct fs *fs, char *buf, size_t len)
{
    struct textbuf t = {.p = buf, .cap = len};
    struct sfs_stats s;
    struct sfs_cache_info ci;

    if (len)
        buf[0] = '\0';
    sfs_cache_stats(fs->cache, &s);
    sfs_cache_info(fs->cache, &ci);
#define C(name, help, v) emit(&t, "shardfs_" name, "counter", help, (uint64_t)(v))
#define G(name, help, v) emit(&t, "shardfs_" name, "gauge", help, (uint64_t)(v))
#define L(f)             atomic_load_explicit(&fs->ctr.f, memory_order_relaxed)
    C("requests_total",
      "Cache lookups, from the mount and every attached rank (prefetches are loads, not lookups).",
      s.requests);
    C("hits_total", "Gets that found the shard Ready.", s.hits);
    C("misses_total", "Gets that did not (owner or waiter).", s.misses);
    C("prefetched_total", "Slots filled by prefetch.", s.prefetched);
    C("prefetch_hits_total", "Gets served by a prefetched slot.", s.prefetch_hits);
    C("bytes_read_total", "Bytes loaded from the backend into the cache.", s.bytes_read);
    G("resident_bytes", "Bytes of Ready shards in the cache.", s.resident_bytes);
    G("capacity_bytes", "Bytes of the data plane.", s.capacity_bytes);
    C("backend_loads_total", "Shard loads this daemon submitted to its backend.", L(backend_loads));
    C("evictions_total", "Slots with a key taken by the CLOCK hand.", s.evictions);
    C("owner_loads_total", "Gets that made the caller owner (mount and ranks).", s.owner_loads);
    C("waits_total", "Gets that made the caller a waiter.", s.waits);
    C("failures_total", "Owners that published Failed.", s.failures);
    C("backend_errors_total", "Backend loads and dumps of this daemon that failed.",
      L(backend_errors));
    C("takeovers_total", "Ownership taken from a dead owner or an Idle slot.", s.takeovers);
    C("prealloc_total", "Idle slots placed by Prealloc.", s.prealloc);
    C("touched_total", "Slots marked by Touch.", s.touched);
    C("reaped_total", "Dead processes reaped.", s.reaped);
    {
        struct sfs_behind_stats wb;

        sfs_cache_behind_stats(fs->cache, &wb);
        C("write_behind_total",
          "Write-behind dumps of the ranks whose background store write ended well.", wb.written);
        C("write_behind_failed_total",
          "Write-behind dumps whose background store write failed: in memory only.", wb.failed);
    }
    C("fs_reads_total", "Read requests on shard files.", L(reads));
    C("fs_read_bytes_total", "Bytes answered to reads of shard files.", L(read_bytes));
    C("fs_writes_total", "Shards stored through the mount.", L(writes));
    C("fs_wait_timeouts_total", "Reads that gave up at their deadline.", L(wait_timeouts));
    C("fs_prefetch_started_total", "Loads started by user.shardfs.prefetch.", L(prefetch_accepted));
    C("fs_readahead_started_total", "Loads started by readahead after a read.",
      L(readahead_started));
    {
        uint32_t pins;

        pthread_mutex_lock(&fs->lock);
        pins = fs->npins;
        pthread_mutex_unlock(&fs->lock);
        G("fs_page_cache_pinned_shards",
          "Shards the kernel page cache may hold (-o page_cache): leased by the daemon.", pins);
    }
    {
        struct sfs_peer_stats ps;

        if (sfs_backend_peer_stats(fs->be, &ps) == 0) {
            static const char *const why[] = {"torn", "other_key", "length", "unreachable"};
            uint64_t cm[] = {ps.clean_torn, ps.clean_other_key, ps.clean_length,
                             ps.clean_unreachable};

            C("peer_hits_total", "Loads the peer tier answered.", ps.hits);
            C("peer_misses_total", "Loads the peer tier did not (then the inner backend).",
              ps.misses);
            emit_raw(&t, "# HELP shardfs_peer_clean_misses_total Peer misses by reason, never "
                         "bytes.\n# TYPE shardfs_peer_clean_misses_total counter\n");
            for (int i = 0; i < 4; i++) {
                char line[128];

                snprintf(line, sizeof(line),
                         "shardfs_peer_clean_misses_total{reason=\"%s\"} %" PRIu64 "\n", why[i],
                         cm[i]);
                emit_raw(&t, line);
            }
            C("peer_bytes_read_total", "Bytes read from other hosts' slot regions.", ps.bytes_read);
            C("peer_bytes_written_total", "Payload bytes published to the peer tier.",
              ps.bytes_written);
            C("peer_writes_total", "Shards published to the peer tier.", ps.writes);
            C("peer_lost_writes_total",
              "Publishes that lost their slot to another writer twice (not written).",
              ps.lost_writes);
        }
    }
    C("warmed_total", "Shard loads started by the warm restart (-o warm).", L(warmed));
    G("warm_shards_done", "Shard loads the warm restart started so far (-o warm).", L(warmed));
    G("warm_shards_total",
      "Shard loads the warm restart means to start: its budget while it runs, what it started "
      "once it ends (done = total: finished).",
      L(warm_total));
    C("revalidate_sweeps_total", "Revalidation sweeps of the resident blocks (-o revalidate).",
      L(reval_sweeps));
    C("revalidate_invalidated_total",
      "Blocks a sweep invalidated: their file changed, went, or was not yet trusted.",
      L(reval_invalidated));
    C("revalidate_removed_total", "Resident shards those invalidations removed.", L(reval_removed));
    G("store_bytes",
      "Bytes of the store's block files, as the collector last counted them "
      "(-o store_capacity; 0: off, or never counted while standing by).",
      L(store_bytes));
    G("store_capacity_bytes", "The bound of the store's block bytes (-o store_capacity; 0: none).",
      fs->store_capacity);
    G("store_collector",
      "1 while this daemon is the store's collector (one a store; -o store_capacity).",
      L(store_collector));
    C("store_evicted_blocks_total", "Blocks the collector removed from the store.",
      L(store_evicted));
    C("store_evicted_bytes_total", "Bytes of the blocks the collector removed from the store.",
      L(store_freed));
    G("store_collector_pass_running",
      "1 while the collector removes blocks: from the pass that finds the store above "
      "store_high until it is at store_low or keeps the rest.",
      L(store_running));
    G("store_collector_to_remove_bytes",
      "Bytes the collector's latest run sets out to remove (the store's count above store_low); "
      "kept after it ends.",
      L(store_to_remove));
    G("store_collector_removed_bytes",
      "Bytes the collector's latest run removed so far; kept after it ends.", L(store_removed));
    G("pinned_bytes", "Bytes of the slots pins hold (user.shardfs.pin, the rank API).",
      sfs_cache_pinned_bytes(fs->cache));
    emit_partitions(&t, fs->cache);
    G("shard_size_bytes", "Bytes per shard.", ci.shard_size);
    G("slots", "Slots in the cache.", ci.nslots);
    emit_served(&t, fs->cache);
    emit_hists(&t, fs);
    emit_hottest(&t, fs);
#undef C
#undef G
#undef L
    return t.len;
}
