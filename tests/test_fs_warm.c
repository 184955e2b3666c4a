/* SPDX-License-Identifier: MIT */
/*
 * test_fs_warm.c - the learned hot set and warm restart (design.md, section 10): the
 * daemon learns which blocks a skewed workload uses, writes
 * STORE/.shardfs_usage when it stops, and at the next mount with -o
 * warm=PCT loads the hottest blocks up to PCT of capacity with no reader.
 * A usage file that is corrupt, truncated or foreign is ignored with one
 * log line; warm=0 loads nothing; reads during the warm-up get the right
 * bytes; the periodic write keeps the hot set through a daemon killed
 * with SIGKILL; counts decay with their half-life; a process that attaches to the warm cache finds the hot keys as
 * hits, through the core's attach and through the rank library; a hot set
 * that a rank alone reads (only the daemon's sampler sees it) is learned
 * and warmed too.
 *
 * Real mounts (tests/fsfixture.h) on a posix store; the daemon is stopped
 * with SIGTERM. Capacity 8M of 64K shards: 128 slots. Skips without FUSE.
 */
#include "fsfixture.h"
#include "fswarm.h"
#include "testutil.h"

#include <shardfs/cache.h>
#include <shardfs/rank.h>

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD    (64u << 10)
#define NSH      4  /* shards per block */
#define NHOT     4  /* blocks 0..3: read HOTREADS times each */
#define COLD0    10 /* blocks COLD0..COLD0+NCOLD-1: read once */
#define NCOLD    20
#define HOTREADS 10
/* 13 % of 128 slots = 16 shards: exactly the hot blocks. */
#define WARM_HOT "warm=13"

struct mount {
    char store[128];
    char usage[160];
    struct fsfx fx;
};

static struct mount M;

static void start(const char *opts)
{
    char o[256];
    int st = 0, r;

    snprintf(o, sizeof(o), "hugepages=off,capacity=8M,shard_size=64K,%s", opts);
    r = fsfx_start(&M.fx, M.store, o, 10.0, &st);
    cr_assert_eq(r, 0, "daemon did not mount (%s, status %d), see %s", strerror(-r), st, M.fx.log);
}

/* SIGTERM, then reap: the daemon must exit 0 within 10 s. */
static void stop_term(void)
{
    int r;

    cr_assert_gt(M.fx.pid, 0);
    r = fswarm_stop_term(&M.fx, 10.0);
    cr_assert_neq(r, -ETIMEDOUT, "daemon did not stop on SIGTERM within 10 s");
    cr_assert_eq(r, 0, "daemon status %d, see %s", r, M.fx.log);
}

/* Read a whole shard through the mount; asserts its bytes. */
static void read_ok(uint64_t b, uint32_t s)
{
    uint8_t *buf = malloc(SHARD);
    struct sfs_key k = tu_key(b, s);
    int fd = open(fsfx_shard_path(&M.fx, b, s), O_RDONLY | O_CLOEXEC);
    ssize_t n;

    cr_assert_not_null(buf);
    cr_assert_geq(fd, 0, "open %s: %s", fsfx_shard_path(&M.fx, b, s), strerror(errno));
    n = pread(fd, buf, SHARD, 0);
    close(fd);
    cr_assert_eq(n, (ssize_t)SHARD, "read (%llu,%u): %zd", (unsigned long long)b, s, n);
    cr_assert_eq(tu_check(&k, buf, SHARD), -1, "wrong bytes in (%llu,%u)", (unsigned long long)b,
                 s);
    free(buf);
}

/* The skewed workload through the mount: every hot block HOTREADS times,
 * every cold one once. */
static void read_skewed(void)
{
    for (int r = 0; r < HOTREADS; r++)
        for (uint64_t b = 0; b < NHOT; b++)
            for (uint32_t s = 0; s < NSH; s++)
                read_ok(b, s);
    for (uint64_t b = COLD0; b < COLD0 + NCOLD; b++)
        for (uint32_t s = 0; s < NSH; s++)
            read_ok(b, s);
}

static bool is_ready(uint64_t b, uint32_t s)
{
    char v[64];
    ssize_t n = getxattr(fsfx_shard_path(&M.fx, b, s), "user.shardfs.state", v, sizeof(v) - 1);

    if (n < 0)
        return false;
    v[n] = '\0';
    return strncmp(v, "ready", 5) == 0;
}

/* Wait up to limit_s for every shard of the hot blocks to be Ready. */
static bool hot_ready_within(double limit_s)
{
    double t0 = fsfx_now_s();

    for (;;) {
        bool all = true;

        for (uint64_t b = 0; b < NHOT && all; b++)
            for (uint32_t s = 0; s < NSH && all; s++)
                all = is_ready(b, s);
        if (all)
            return true;
        if (fsfx_now_s() - t0 > limit_s)
            return false;
        fsfx_sleep_ms(20);
    }
}

static int cold_ready(void)
{
    int n = 0;

    for (uint64_t b = COLD0; b < COLD0 + NCOLD; b++)
        for (uint32_t s = 0; s < NSH; s++)
            n += is_ready(b, s);
    return n;
}

/* ---------------------------------------------------------------------------
 * The usage file, as docs/fs.md describes it.
 */

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static uint8_t *slurp(const char *path, size_t *len)
{
    uint8_t *buf = fswarm_slurp(path, len);

    cr_assert_not_null(buf, "read %s: %s", path, strerror(errno));
    return buf;
}

static void spit(const char *path, const uint8_t *buf, size_t len)
{
    cr_assert_eq(fswarm_spit(path, buf, len), 0, "write %s", path);
}

/* Parse and check the file; the count of block b (0: not in it). */
static uint32_t usage_count(const uint8_t *buf, size_t len, uint64_t b)
{
    struct sfs_block_id id = tu_block(b);
    uint32_t n;

    memcpy(&n, buf + 32, 4);
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = buf + 40 + (size_t)i * 24;
        uint32_t c;

        if (memcmp(e, id.b, 16) == 0) {
            memcpy(&c, e + 16, 4);
            return c;
        }
    }
    (void)len;
    return 0;
}

static void check_usage_file(void)
{
    size_t len;
    uint8_t *buf = slurp(M.usage, &len);
    uint32_t version, idlen, n, entsize;
    uint64_t ss, sum;
    uint32_t min_hot = UINT32_MAX, max_cold = 0;

    cr_assert_geq(len, 48u);
    cr_assert_eq(memcmp(buf, "SFSUSAGE", 8), 0, "magic");
    memcpy(&version, buf + 8, 4);
    memcpy(&idlen, buf + 12, 4);
    memcpy(&ss, buf + 16, 8);
    memcpy(&n, buf + 32, 4);
    memcpy(&entsize, buf + 36, 4);
    cr_assert_eq(version, 1);
    cr_assert_eq(idlen, 16);
    cr_assert_eq(entsize, 24);
    cr_assert_eq(ss, SHARD);
    cr_assert_eq(len, 40 + (size_t)n * 24 + 8, "length %zu for %u entries", len, n);
    memcpy(&sum, buf + len - 8, 8);
    cr_assert_eq(sum, fnv1a(buf, len - 8), "checksum");
    for (uint64_t b = 0; b < NHOT; b++) {
        uint32_t c = usage_count(buf, len, b);

        min_hot = c < min_hot ? c : min_hot;
    }
    for (uint64_t b = COLD0; b < COLD0 + NCOLD; b++) {
        uint32_t c = usage_count(buf, len, b);

        cr_assert_gt(c, 0, "cold block %llu missing", (unsigned long long)b);
        max_cold = c > max_cold ? c : max_cold;
    }
    cr_assert_gt(min_hot, max_cold, "hot blocks (min %u) must outrank cold ones (max %u)", min_hot,
                 max_cold);
    free(buf);
}

/* Mount, run the skewed workload, stop with SIGTERM: the usage file exists
 * and ranks the hot blocks first. */
static void learn(void)
{
    start("warm=0");
    read_skewed();
    stop_term();
    cr_assert_eq(access(M.usage, F_OK), 0, "no usage file at %s after SIGTERM", M.usage);
    check_usage_file();
}

static void setup(void)
{
    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    memset(&M, 0, sizeof(M));
    {
        const char *e = getenv("SHARDFS_TEST_DAEMON");

        M.fx.bin = e && *e ? e : SHARDFS_BIN;
    }
    snprintf(M.store, sizeof(M.store), "%s", tu_path("store"));
    snprintf(M.usage, sizeof(M.usage), "%s/.shardfs_usage", M.store);
    snprintf(M.fx.mnt, sizeof(M.fx.mnt), "%s", tu_path("mnt"));
    snprintf(M.fx.sock, sizeof(M.fx.sock), "%s", tu_path("sock"));
    snprintf(M.fx.log, sizeof(M.fx.log), "%s", tu_path("log"));
    mkdir(M.store, 0755);
    mkdir(M.fx.mnt, 0755);
    cr_assert_eq(tu_store_write(M.store, 0, NHOT, NSH, SHARD, NULL, NULL, false), 0);
    cr_assert_eq(tu_store_write(M.store, COLD0, NCOLD, NSH, SHARD, NULL, NULL, false), 0);
}

static void teardown(void)
{
    fswarm_teardown(&M.fx, M.store);
}

TestSuite(fs_warm, .init = setup, .fini = teardown, .timeout = 120);

Test(fs_warm, hot_blocks_are_resident_after_restart_without_a_reader, .timeout = 90)
{
    learn();
    start(WARM_HOT);
    cr_assert(hot_ready_within(15.0), "hot blocks not all Ready 15 s after mount, see %s",
              M.fx.log);
    /* The budget is exactly the hot blocks: no cold shard is loaded. */
    cr_assert_eq(cold_ready(), 0, "cold shards warmed beyond the budget");
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_warmed_total"), NHOT * NSH);
    cr_assert_eq(fsfx_log_lines_with(&M.fx, "usage file"), 0,
                 "a valid file is read silently, see %s", M.fx.log);
    for (uint64_t b = 0; b < NHOT; b++)
        for (uint32_t s = 0; s < NSH; s++)
            read_ok(b, s);
    stop_term();
}

Test(fs_warm, warm_zero_loads_nothing, .timeout = 90)
{
    learn();
    start("warm=0");
    fsfx_sleep_ms(1500);
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_warmed_total"), 0);
    for (uint64_t b = 0; b < NHOT; b++)
        for (uint32_t s = 0; s < NSH; s++)
            cr_assert(!is_ready(b, s), "(%llu,%u) loaded with warm=0", (unsigned long long)b, s);
    cr_assert_eq(cold_ready(), 0);
    stop_term();
}

/* Mount on a bad file: one log line, the mount serves, nothing warmed. */
static void bad_file_is_ignored(const uint8_t *buf, size_t len)
{
    spit(M.usage, buf, len);
    start(WARM_HOT);
    read_ok(COLD0, 0);
    cr_assert_eq(fsfx_log_lines_with(&M.fx, "usage file"), 1, "want one log line, see %s",
                 M.fx.log);
    cr_assert_eq(fsfx_log_lines_with(&M.fx, "ignored"), 1, "see %s", M.fx.log);
    fsfx_sleep_ms(500);
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_warmed_total"), 0);
    stop_term();
}

Test(fs_warm, corrupt_truncated_foreign_files_are_ignored, .timeout = 110)
{
    size_t len;
    uint8_t *good, *bad;
    uint64_t ss = 32u << 10, sum;

    learn();
    good = slurp(M.usage, &len);
    bad = malloc(len);
    cr_assert_not_null(bad);

    memcpy(bad, good, len); /* one byte of an entry flipped */
    bad[40 + 5] ^= 0x40;
    bad_file_is_ignored(bad, len);

    bad_file_is_ignored(good, len / 2); /* truncated */

    memcpy(bad, good, len); /* foreign: another shard_size, checksum right */
    memcpy(bad + 16, &ss, 8);
    sum = fnv1a(bad, len - 8);
    memcpy(bad + len - 8, &sum, 8);
    bad_file_is_ignored(bad, len);

    memcpy(bad, good, len); /* another version, checksum right */
    bad[8] = 2;
    sum = fnv1a(bad, len - 8);
    memcpy(bad + len - 8, &sum, 8);
    bad_file_is_ignored(bad, len);

    bad_file_is_ignored((const uint8_t *)"not a usage file at all\n", 24);
    free(bad);
    free(good);
}

Test(fs_warm, reads_during_the_warm_up_get_the_right_bytes, .timeout = 90)
{
    learn();
    start("warm=100"); /* everything the file names: 96 of 128 slots */
    for (uint64_t b = 0; b < NHOT; b++)
        for (uint32_t s = 0; s < NSH; s++)
            read_ok(b, s);
    for (uint64_t b = COLD0; b < COLD0 + NCOLD; b++)
        for (uint32_t s = 0; s < NSH; s++)
            read_ok(b, s);
    stop_term();
}

Test(fs_warm, an_attached_process_finds_the_hot_keys_as_hits, .timeout = 90)
{
    struct sfs_cache *c;
    struct sfs_stats st;
    int err = 0;

    learn();
    start(WARM_HOT);
    c = sfs_cache_attach(M.fx.sock, 0, &err);
    cr_assert_not_null(c, "attach %s: %s", M.fx.sock, strerror(-err));
    /* Wait without a Get (state only) for the warm-up. */
    for (double t0 = fsfx_now_s();;) {
        bool all = true;

        for (uint64_t b = 0; b < NHOT && all; b++)
            for (uint32_t s = 0; s < NSH && all; s++) {
                struct sfs_key k = tu_key(b, s);

                all = sfs_cache_state(c, &k) == SFS_STATE_READY;
            }
        if (all)
            break;
        cr_assert_lt(fsfx_now_s() - t0, 15.0, "hot keys not Ready 15 s after mount");
        fsfx_sleep_ms(20);
    }
    for (uint64_t b = 0; b < NHOT; b++)
        for (uint32_t s = 0; s < NSH; s++) {
            struct sfs_key k = tu_key(b, s);
            struct sfs_lease l;
            int r = sfs_cache_get(c, &k, 0, sfs_deadline_after(5000000000ll), &l);

            cr_assert_eq(r, SFS_HIT, "(%llu,%u): role %d", (unsigned long long)b, s, r);
            cr_assert_eq(tu_check(&k, sfs_cache_data(c, &l), SHARD), -1);
            cr_assert_eq(sfs_cache_release(c, &l), 0);
        }
    sfs_cache_stats_local(c, &st);
    cr_assert_eq(st.hits, NHOT * NSH);
    cr_assert_eq(st.misses, 0);
    sfs_cache_close(c);
    stop_term();
}

Test(fs_warm, a_rank_finds_the_hot_keys_as_hits, .timeout = 90)
{
    struct sfs_rank_config cfg;
    struct sfs_rank_entry e[NHOT * NSH];
    struct sfs_rank_stats rs;
    struct sfs_task *t;
    struct sfs_rank *rk;
    uint8_t *bufs = malloc((size_t)NHOT * NSH * SHARD);
    char spec[200];
    int st[NHOT * NSH], err = 0, i = 0;

    cr_assert_not_null(bufs);
    learn();
    start(WARM_HOT);
    /* No reader: the state xattr only, until the warm-up is done. */
    cr_assert(hot_ready_within(15.0), "hot blocks not all Ready 15 s after mount");
    sfs_rank_config_init(&cfg);
    snprintf(spec, sizeof(spec), "posix:%s", M.store);
    cfg.mount_point = M.fx.mnt;
    cfg.backend = spec;
    cfg.copier = SFS_COPIER_HOST;
    rk = sfs_rank_open(&cfg, &err);
    cr_assert_not_null(rk, "sfs_rank_open: %s", strerror(-err));
    for (uint64_t b = 0; b < NHOT; b++)
        for (uint32_t s = 0; s < NSH; s++, i++)
            e[i] = (struct sfs_rank_entry){
                .block = tu_block(b), .shard = s, .addr = bufs + (size_t)i * SHARD};
    cr_assert_eq(sfs_rank_load(rk, e, NHOT * NSH, &t), 0);
    cr_assert_eq(sfs_rank_wait(t, 20000, st), 0);
    sfs_rank_task_free(t);
    i = 0;
    for (uint64_t b = 0; b < NHOT; b++)
        for (uint32_t s = 0; s < NSH; s++, i++) {
            struct sfs_key k = tu_key(b, s);

            cr_assert_eq(st[i], 0);
            cr_assert_eq(tu_check(&k, bufs + (size_t)i * SHARD, SHARD), -1);
        }
    sfs_rank_stats(rk, &rs);
    cr_assert_eq(rs.hits, NHOT * NSH, "rank hits %llu", (unsigned long long)rs.hits);
    cr_assert_eq(rs.owner_loads, 0);
    cr_assert_eq(rs.waits, 0);
    sfs_rank_close(rk);
    free(bufs);
    stop_term();
}

/* Does the usage file at M.usage exist, parse, and rank every hot block
 * above every cold one? No assertion: the caller polls. */
static bool usage_ranks_hot(void)
{
    size_t len;
    uint8_t *buf = fswarm_slurp(M.usage, &len);
    uint32_t n, min_hot = UINT32_MAX, max_cold = 0, min_cold = UINT32_MAX;
    bool ok;

    if (!buf)
        return false;
    memcpy(&n, buf + (len >= 40 ? 32 : 0), 4);
    ok = len >= 48 && memcmp(buf, "SFSUSAGE", 8) == 0 && len == 40 + (size_t)n * 24 + 8;
    for (uint64_t b = 0; ok && b < NHOT; b++) {
        uint32_t c = usage_count(buf, len, b);

        min_hot = c < min_hot ? c : min_hot;
    }
    for (uint64_t b = COLD0; ok && b < COLD0 + NCOLD; b++) {
        uint32_t c = usage_count(buf, len, b);

        max_cold = c > max_cold ? c : max_cold;
        min_cold = c < min_cold ? c : min_cold;
    }
    free(buf);
    return ok && min_cold > 0 && min_hot > max_cold;
}

/* The periodic write: with the period cut to 1 s (SHARDFS_TEST_USAGE_SAVE_S,
 * fs/usage.c), the file appears while the daemon serves. The daemon is then
 * killed (SIGKILL: no write at stop), and the next mount warms from what the
 * periodic write kept. */
Test(fs_warm, the_periodic_write_keeps_the_hot_set_through_a_crash, .timeout = 90)
{
    double t0;
    int st;

    cr_assert_eq(setenv("SHARDFS_TEST_USAGE_SAVE_S", "1", 1), 0);
    start("warm=0");
    unsetenv("SHARDFS_TEST_USAGE_SAVE_S");
    read_skewed();
    for (t0 = fsfx_now_s(); !usage_ranks_hot(); fsfx_sleep_ms(50))
        cr_assert_lt(fsfx_now_s() - t0, 15.0,
                     "no usage file ranking the hot blocks first 15 s after the reads, with the "
                     "daemon running (see %s)",
                     M.fx.log);
    kill(M.fx.pid, SIGKILL);
    cr_assert_eq(waitpid(M.fx.pid, &st, 0), M.fx.pid);
    M.fx.pid = 0;
    fsfx_sh("fusermount3 -uz %s 2>/dev/null", M.fx.mnt);
    check_usage_file();

    start(WARM_HOT);
    cr_assert(hot_ready_within(15.0), "hot blocks not all Ready 15 s after the remount");
    stop_term();
}

/* Has the usage file at M.usage decayed: every hot block's count in
 * [1, max_hot), every cold block's under NSH (what it was read)? */
static bool usage_decayed(uint32_t max_hot)
{
    size_t len;
    uint8_t *buf = fswarm_slurp(M.usage, &len);
    uint32_t n;
    bool ok;

    if (!buf)
        return false;
    memcpy(&n, buf + (len >= 40 ? 32 : 0), 4);
    ok = len >= 48 && len == 40 + (size_t)n * 24 + 8;
    for (uint64_t b = 0; ok && b < NHOT; b++) {
        uint32_t c = usage_count(buf, len, b);

        ok = c > 0 && c < max_hot;
    }
    for (uint64_t b = COLD0; ok && b < COLD0 + NCOLD; b++)
        ok = usage_count(buf, len, b) < NSH;
    free(buf);
    return ok;
}

/* Decay: with the half-life cut to 1 s (SHARDFS_TEST_USAGE_HALF_LIFE_S) and
 * the file rewritten every second, the counts the workload left (40 reads of
 * each hot block, 4 of each cold one; without decay at least that, as
 * learn() sees) are seen halved while the daemon runs: every hot block
 * still counted but under half its reads, every cold one under its 4. */
Test(fs_warm, counts_decay_with_their_half_life, .timeout = 60)
{
    double t0;

    cr_assert_eq(setenv("SHARDFS_TEST_USAGE_HALF_LIFE_S", "1", 1), 0);
    cr_assert_eq(setenv("SHARDFS_TEST_USAGE_SAVE_S", "1", 1), 0);
    start("warm=0");
    unsetenv("SHARDFS_TEST_USAGE_HALF_LIFE_S");
    unsetenv("SHARDFS_TEST_USAGE_SAVE_S");
    read_skewed();
    for (t0 = fsfx_now_s(); !usage_decayed(HOTREADS * NSH / 2); fsfx_sleep_ms(50))
        cr_assert_lt(fsfx_now_s() - t0, 20.0, "no decayed usage file 20 s after the reads");
    stop_term();
}

/* ---------------------------------------------------------------------------
 * Learning from a rank: ranks read the cache directly, not through the
 * mount, so only the daemon's sampler sees their use.
 */

#define RCOLD0  100 /* blocks RCOLD0..RCOLD0+RNCOLD-1: a stream read once, 2x the cache */
#define RNCOLD  64
#define RROUNDS 8

static struct sfs_rank *open_rank(void)
{
    struct sfs_rank_config cfg;
    struct sfs_rank *rk;
    static char spec[200];
    int err = 0;

    sfs_rank_config_init(&cfg);
    snprintf(spec, sizeof(spec), "posix:%s", M.store);
    cfg.mount_point = M.fx.mnt;
    cfg.backend = spec;
    cfg.copier = SFS_COPIER_HOST;
    rk = sfs_rank_open(&cfg, &err);
    cr_assert_not_null(rk, "sfs_rank_open: %s", strerror(-err));
    return rk;
}

/* Load every shard of blocks [first, first + n) through the rank; asserts
 * each entry's status and bytes. */
static void rank_read(struct sfs_rank *rk, uint64_t first, uint32_t n)
{
    uint32_t ne = n * NSH;
    struct sfs_rank_entry *e = calloc(ne, sizeof(*e));
    uint8_t *bufs = malloc((size_t)ne * SHARD);
    int *st = calloc(ne, sizeof(int));
    struct sfs_task *t;
    uint32_t i = 0;

    cr_assert(e && bufs && st);
    for (uint64_t b = first; b < first + n; b++)
        for (uint32_t s = 0; s < NSH; s++, i++)
            e[i] = (struct sfs_rank_entry){
                .block = tu_block(b), .shard = s, .addr = bufs + (size_t)i * SHARD};
    cr_assert_eq(sfs_rank_load(rk, e, ne, &t), 0);
    cr_assert_eq(sfs_rank_wait(t, 20000, st), 0);
    sfs_rank_task_free(t);
    i = 0;
    for (uint64_t b = first; b < first + n; b++)
        for (uint32_t s = 0; s < NSH; s++, i++) {
            struct sfs_key k = tu_key(b, s);

            cr_assert_eq(st[i], 0, "(%llu,%u): %d", (unsigned long long)b, s, st[i]);
            cr_assert_eq(tu_check(&k, bufs + (size_t)i * SHARD, SHARD), -1);
        }
    free(st);
    free(bufs);
    free(e);
}

/* A skewed workload read by a rank alone, under the daemon's default
 * admission, with the cache under pressure: each of RROUNDS rounds reads
 * the hot blocks, then the next part of a cold stream twice the cache's
 * size, and lets the sampler tick. The usage file must rank every hot block
 * above every cold one, and a warm restart must make the hot blocks
 * resident with no reader.
 *
 * The margin is thinner than under admission=clock: the sampler sees a
 * rank's reuse of a slot only after the hand cleared its bit, and with
 * admission=scan the hand passes over main slots (bits untouched) while
 * probationary ones hold more than half the pool, as the cold stream makes
 * them do here. Measured: each hot block counted 8 uses, each cold one 4.
 * docs/fs.md, "What it counts". */
Test(fs_warm, a_rank_workload_is_learned_and_warmed, .timeout = 110)
{
    struct sfs_rank *rk;
    size_t len;
    uint8_t *buf;
    uint32_t min_hot = UINT32_MAX, max_cold = 0;

    cr_assert_eq(tu_store_write(M.store, RCOLD0, RNCOLD, NSH, SHARD, NULL, NULL, false), 0);
    start("warm=0");
    rk = open_rank();
    for (int r = 0; r < RROUNDS; r++) {
        rank_read(rk, 0, NHOT);
        rank_read(rk, RCOLD0 + (uint64_t)r * (RNCOLD / RROUNDS), RNCOLD / RROUNDS);
        fsfx_sleep_ms(2000); /* two sampler ticks (fs/usage.c): one sees cleared bits */
    }
    sfs_rank_close(rk);
    stop_term();
    buf = slurp(M.usage, &len);
    for (uint64_t b = 0; b < NHOT; b++) {
        uint32_t c = usage_count(buf, len, b);

        min_hot = c < min_hot ? c : min_hot;
    }
    for (uint64_t b = RCOLD0; b < RCOLD0 + RNCOLD; b++) {
        uint32_t c = usage_count(buf, len, b);

        max_cold = c > max_cold ? c : max_cold;
    }
    free(buf);
    cr_assert_gt(min_hot, max_cold,
                 "a rank's hot blocks (min count %u) must outrank its cold ones (max %u)", min_hot,
                 max_cold);

    start(WARM_HOT);
    cr_assert(hot_ready_within(15.0), "hot blocks not all Ready 15 s after mount");
    stop_term();
}

/* ---------------------------------------------------------------------------
 * sfs_cache_sample(), the sampler's read-only query (core/cache/sample.c), in
 * this process: no mount needed.
 */

struct seen {
    unsigned n, leased, accessed, stop_after;
    bool key3_leased;
};

static int count_visit(const struct sfs_key *k, uint32_t slot, bool acc, bool leased, void *arg)
{
    struct seen *s = arg;

    (void)slot;
    s->n++;
    s->leased += leased;
    s->accessed += acc;
    if (k->shard == 0 && memcmp(k->block.b, tu_block(3).b, SFS_BLOCK_ID_LEN) == 0)
        s->key3_leased = leased;
    return s->stop_after && s->n == s->stop_after ? 42 : 0;
}

Test(fs_warm_sample, reports_ready_slots_with_their_bits_and_sweeps_by_cursor, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(64, 0, 4096);
    struct sfs_cache_info ci;
    struct sfs_key k3 = tu_key(3, 0), k10 = tu_key(10, 0);
    struct sfs_lease l3, l10;
    struct seen s = {0};
    uint32_t cursor = 0;

    cr_assert_not_null(c);
    sfs_cache_info(c, &ci);
    for (uint64_t b = 0; b < 10; b++) {
        struct sfs_key k = tu_key(b, 0);

        cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    }
    cr_assert_eq(sfs_cache_get(c, &k3, 0, 0, &l3), SFS_HIT);     /* held: leased */
    cr_assert_eq(sfs_cache_get(c, &k10, 0, 0, &l10), SFS_OWNER); /* Loading: not visited */

    cr_assert_eq(sfs_cache_sample(c, &cursor, 0, count_visit, &s), 0);
    cr_assert_eq(s.n, 10, "visited %u Ready slots of 10", s.n);
    cr_assert_eq(s.leased, 1);
    cr_assert(s.key3_leased);
    cr_assert_eq(s.accessed, 10, "a claim and a hit set the accessed bit");

    /* One bucket at a time: a whole sweep sees each Ready slot once and
     * brings the cursor back. */
    memset(&s, 0, sizeof(s));
    cursor = 5;
    for (uint32_t i = 0; i < ci.nbuckets; i++)
        cr_assert_eq(sfs_cache_sample(c, &cursor, 1, count_visit, &s), 0);
    cr_assert_eq(s.n, 10);
    cr_assert_eq(cursor, 5);

    memset(&s, 0, sizeof(s));
    s.stop_after = 4;
    cr_assert_eq(sfs_cache_sample(c, &cursor, 0, count_visit, &s), 42);
    cr_assert_eq(s.n, 4);
    cr_assert_eq(sfs_cache_sample(c, NULL, 0, count_visit, &s), -EINVAL);

    cr_assert_eq(sfs_cache_release(c, &l3), 0);
    cr_assert_eq(sfs_cache_fail(c, &l10, -EIO), 0);
    cr_assert_eq(sfs_cache_release(c, &l10), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * What sits at the usage file's names is the store's, not the daemon's: a
 * FIFO, or a symlink, at BACKEND_DIR/.shardfs_usage or at its temporary
 * name must neither block the daemon (at start: the mount served nothing and
 * SIGTERM was ignored; at stop: it never exited) nor redirect its write.
 */

static int read_one_main(void *arg)
{
    uint8_t *buf = malloc(SHARD);
    int fd = open((const char *)arg, O_RDONLY | O_CLOEXEC);

    return buf && fd >= 0 && pread(fd, buf, SHARD, 0) == (ssize_t)SHARD ? 0 : 1;
}

/* A shard of the mount reads within 10 s (in a child: a hung daemon would
 * hold the reader for ever). */
static void reads_within_10s(const char *when)
{
    pid_t kid = tu_fork(read_one_main, (void *)fsfx_shard_path(&M.fx, 0, 0));

    cr_assert_eq(tu_wait_for(kid, 10ll * 1000000000), 0, "%s: a read of the mount hung or failed",
                 when);
}

Test(fs_warm, a_fifo_or_link_at_the_usage_names_blocks_nothing, .timeout = 110)
{
    char tmp[200], outside[200];
    struct stat st;
    int fd;

    /* A FIFO as the usage file: ignored at start with one line; the mount
     * serves, and stops on SIGTERM. */
    cr_assert_eq(mkfifo(M.usage, 0644), 0);
    start("warm=25");
    reads_within_10s("a FIFO as the usage file");
    stop_term();
    cr_assert_eq(fsfx_log_lines_with(&M.fx, "not a regular file"), 1,
                 "the FIFO usage file was not ignored with one line, see %s", M.fx.log);
    cr_assert_eq(unlink(M.usage), 0);

    /* A FIFO at the temporary name: the stop writes the file all the same. */
    snprintf(tmp, sizeof(tmp), "%s.tmp", M.usage);
    cr_assert_eq(mkfifo(tmp, 0644), 0);
    start("warm=0");
    read_skewed();
    stop_term();
    cr_assert_eq(access(M.usage, F_OK), 0, "no usage file with a FIFO at its temporary name");
    check_usage_file();

    /* A symlink at the temporary name: it is not followed (the file it
     * names stays as it was) and the file is written. */
    cr_assert_eq(unlink(M.usage), 0);
    if (lstat(tmp, &st) == 0)
        cr_assert_eq(unlink(tmp), 0);
    snprintf(outside, sizeof(outside), "%s", tu_path("outside"));
    fd = open(outside, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_eq(write(fd, "keep", 4), 4);
    close(fd);
    cr_assert_eq(symlink(outside, tmp), 0);
    start("warm=0");
    read_skewed();
    stop_term();
    cr_assert_eq(stat(outside, &st), 0);
    cr_assert_eq(st.st_size, 4, "the symlink at the temporary name was followed");
    check_usage_file();
    unlink(outside);
}
