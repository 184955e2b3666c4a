/* SPDX-License-Identifier: MIT */
/*
 * test_fs.c - the shardfs daemon through real mounts.
 *
 * Each test writes a store in UCM PosixStore layout (data/<32 hex>, shard n at
 * n * shard_size, bytes from tu_fill), starts the daemon binary in the
 * foreground in a child, waits for the mount, and drives it with the tools an
 * operator uses (cp, dd, ls, setfattr) and with plain system calls. The
 * suite's fini always unmounts (fusermount3 -u, then SIGKILL) so a failed
 * test never leaves a mount behind.
 *
 * Needs /dev/fuse and fusermount3 (CI runs as root); skips without them.
 */
#include "fsfixture.h"
#include "testutil.h"

#include <shardfs/backend.h>
#include <shardfs/cache.h>

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD (64u << 10)

struct mount {
    char store[128];
    struct fsfx fx;                /* the daemon: mount point, socket, log, pid */
    char cgroup[2100], cgfile[32]; /* a cgroup this test made (removed at teardown) */
    bool join_cgroup;              /* start the daemon in it */
    pid_t kids[4];                 /* children a failed test leaves: killed at teardown */
    int nkids;
};

static struct mount M;

/* ---------------------------------------------------------------------------
 * Helpers.
 */

/* Write blocks [first, first+nblocks) of nshards each into dir/data/. */
static void store_write(const char *dir, uint64_t first, unsigned nblocks, unsigned nshards)
{
    int r = tu_store_write(dir, first, nblocks, nshards, SHARD, NULL, NULL, false);

    cr_assert_eq(r, 0, "store %s: %s", dir, strerror(-r));
}

/* Start the daemon on a fresh mount point, in the foreground, with the given
 * backend spec ("" = the store directory) and extra -o options. */
static void start_spec(const char *spec, const char *opts)
{
    char o[512];
    int st = 0, r;

    if (!M.fx.mnt[0])
        snprintf(M.fx.mnt, sizeof(M.fx.mnt), "%s", tu_path("mnt"));
    if (!M.fx.sock[0])
        snprintf(M.fx.sock, sizeof(M.fx.sock), "%s", tu_path("sock"));
    if (!M.fx.log[0])
        snprintf(M.fx.log, sizeof(M.fx.log), "%s", tu_path("log"));
    M.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
    M.fx.join_cgroup = M.join_cgroup ? M.cgroup : NULL;
    snprintf(o, sizeof(o), "hugepages=off%s%s", opts && *opts ? "," : "", opts ? opts : "");
    r = fsfx_start(&M.fx, spec && *spec ? spec : M.store, o, 10.0, &st);
    if (r == -ECHILD)
        cr_assert_fail("daemon exited before mounting (status %d), see %s", st, M.fx.log);
    cr_assert_eq(r, 0, "mount did not appear: %s", strerror(-r));
}

static void start(const char *opts)
{
    start_spec(NULL, opts);
}

/* Unmount and reap the daemon; returns its exit status (-1: had to kill). */
static int stop(void)
{
    return fsfx_stop(&M.fx, false, 10.0);
}

static void setup(void)
{
    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    memset(&M, 0, sizeof(M));
    snprintf(M.store, sizeof(M.store), "%s", tu_path("store"));
    mkdir(M.store, 0755);
}

static void teardown(void)
{
    for (int i = 0; i < M.nkids; i++)
        if (M.kids[i] > 0 && waitpid(M.kids[i], NULL, WNOHANG) == 0) {
            kill(M.kids[i], SIGKILL);
            waitpid(M.kids[i], NULL, 0);
        }
    if (M.fx.pid > 0)
        stop();
    fsfx_cleanup(&M.fx, M.store);
    /* Empty once the daemon is reaped; the kernel may take a moment. */
    for (int i = 0; M.cgroup[0] && rmdir(M.cgroup) < 0 && errno == EBUSY && i < 100; i++)
        fsfx_sleep_ms(10);
}

TestSuite(fs, .init = setup, .fini = teardown, .timeout = 120);

/* Check that file `path` (outside the mount) holds shard (b, s). */
static void assert_file_is_shard(const char *path, uint64_t b, uint32_t s)
{
    uint8_t *buf = malloc(SHARD + 1);
    struct sfs_key k = tu_key(b, s);
    long n;

    cr_assert_not_null(buf);
    n = fsfx_read_all(path, buf, SHARD + 1);
    cr_assert_eq(n, (long)SHARD, "%s: %ld bytes", path, n);
    cr_assert_eq(tu_check(&k, buf, SHARD), -1, "%s: wrong bytes for (%llu, %u)", path,
                 (unsigned long long)b, s);
    free(buf);
}

static int get_state(uint64_t b, uint32_t s, char *out, size_t len)
{
    ssize_t n = getxattr(fsfx_shard_path(&M.fx, b, s), "user.shardfs.state", out, len - 1);

    if (n < 0)
        return -errno;
    out[n] = '\0';
    return 0;
}

static bool have_tool(const char *t)
{
    return fsfx_sh("command -v %s >/dev/null 2>&1", t) == 0;
}

/* setfattr when installed (the operator's tool), else setxattr(2). */
static int xattr_set(const char *path, const char *name, const char *value)
{
    if (have_tool("setfattr"))
        return fsfx_sh("setfattr -n %s -v '%s' %s 2>/dev/null", name, value, path) == 0 ? 0 : -1;
    return setxattr(path, name, value, strlen(value), 0);
}

static size_t dir_list(const char *path, char names[][64], size_t max)
{
    DIR *d = opendir(path);
    struct dirent *e;
    size_t n = 0;

    cr_assert_not_null(d, "opendir %s: %s", path, strerror(errno));
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (n < max)
            snprintf(names[n], 64, "%.63s", e->d_name);
        n++;
    }
    closedir(d);
    return n;
}

/* ---------------------------------------------------------------------------
 * The tree.
 */

Test(fs, tree_stat_listing_enoent, .timeout = 60)
{
    char names[16][64], path[512], hex[SFS_BLOCK_HEX_LEN + 1], upper[SFS_BLOCK_HEX_LEN + 1];
    struct stat st;

    store_write(M.store, 0, 3, 4);
    /* readahead=0: this test counts the loads of exactly one read. */
    start("shard_size=64K,capacity=1M,readahead=0");

    cr_assert_eq(dir_list(M.fx.mnt, names, 16), 2);
    snprintf(path, sizeof(path), "%s/block", M.fx.mnt);
    cr_assert_eq(dir_list(path, names, 16), 0, "nothing resident yet");

    for (uint64_t b = 0; b < 3; b++) {
        cr_assert_eq(stat(fsfx_shard_path(&M.fx, b, -1), &st), 0);
        cr_assert(S_ISDIR(st.st_mode));
        cr_assert_eq(dir_list(fsfx_shard_path(&M.fx, b, -1), names, 16), 4);
        for (uint32_t s = 0; s < 4; s++) {
            char want[8];

            snprintf(want, sizeof(want), "%u", s);
            cr_assert_str_eq(names[s], want);
            cr_assert_eq(stat(fsfx_shard_path(&M.fx, b, s), &st), 0, "%s",
                         fsfx_shard_path(&M.fx, b, s));
            cr_assert(S_ISREG(st.st_mode));
            cr_assert_eq(st.st_size, (off_t)SHARD);
        }
    }
    /* ls of the mount: block, stats; ls -l of a shard directory works. */
    cr_assert_eq(fsfx_sh("ls -l %s >/dev/null", fsfx_shard_path(&M.fx, 1, -1)), 0);

    /* ENOENT for everything outside block/<32 hex>/shard/<decimal>. */
    tu_block_hex(0, hex);
    for (int i = 0; i < SFS_BLOCK_HEX_LEN; i++)
        upper[i] = (hex[i] >= 'a' && hex[i] <= 'f') ? (char)(hex[i] - 32) : hex[i];
    upper[SFS_BLOCK_HEX_LEN] = '\0';
    const char *bad[] = {"nothing",
                         "block/xyz",
                         "block/0123",
                         "block/0123456789abcdef0123456789abcdeg",
                         "block/0123456789abcdef0123456789abcdef0",
                         NULL, /* uppercase id */
                         NULL, /* shard 4: not in the store */
                         NULL, /* shard "01": not canonical */
                         NULL, /* shard "-1" */
                         NULL, /* block/<id>/foo */
                         NULL, /* shard 4294967296 */
                         "stats/x"};
    char b5[256], b6[256], b7[256], b8[256], b9[256], b10[256];
    snprintf(b5, sizeof(b5), "block/%s", upper);
    snprintf(b6, sizeof(b6), "block/%s/shard/4", hex);
    snprintf(b7, sizeof(b7), "block/%s/shard/01", hex);
    snprintf(b8, sizeof(b8), "block/%s/shard/-1", hex);
    snprintf(b9, sizeof(b9), "block/%s/foo", hex);
    snprintf(b10, sizeof(b10), "block/%s/shard/4294967296", hex);
    bad[5] = b5;
    bad[6] = b6;
    bad[7] = b7;
    bad[8] = b8;
    bad[9] = b9;
    bad[10] = b10;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", M.fx.mnt, bad[i]);
        errno = 0;
        cr_assert_eq(stat(path, &st), -1, "%s exists", bad[i]);
        cr_assert(errno == ENOENT || (i == 11 && errno == ENOTDIR), "%s: %s", bad[i],
                  strerror(errno));
        cr_assert_eq(open(path, O_RDONLY), -1);
    }
    /* Any well-formed id is a directory (empty when nothing is stored). */
    cr_assert_eq(stat(fsfx_shard_path(&M.fx, 999, -1), &st), 0);
    cr_assert_eq(dir_list(fsfx_shard_path(&M.fx, 999, -1), names, 16), 0);

    /* After a read, /block lists the block with a resident shard. */
    cr_assert_eq(fsfx_sh("cat %s >/dev/null", fsfx_shard_path(&M.fx, 2, 1)), 0);
    snprintf(path, sizeof(path), "%s/block", M.fx.mnt);
    cr_assert_eq(dir_list(path, names, 16), 1);
    tu_block_hex(2, hex);
    cr_assert_str_eq(names[0], hex);

    /* /stats: Prometheus text with every fixed counter. */
    const char *need[] = {"shardfs_requests_total",      "shardfs_hits_total",
                          "shardfs_misses_total",        "shardfs_prefetched_total",
                          "shardfs_prefetch_hits_total", "shardfs_bytes_read_total",
                          "shardfs_resident_bytes",      "shardfs_capacity_bytes",
                          "shardfs_backend_loads_total", "shardfs_evictions_total"};
    for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++) {
        cr_assert_geq(fsfx_stat(&M.fx, need[i]), 0, "%s missing", need[i]);
        cr_assert_eq(fsfx_sh("grep -q '^# TYPE %s ' %s/stats", need[i], M.fx.mnt), 0,
                     "%s: no # TYPE", need[i]);
        cr_assert_eq(fsfx_sh("grep -q '^# HELP %s ' %s/stats", need[i], M.fx.mnt), 0,
                     "%s: no # HELP", need[i]);
    }
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_capacity_bytes"), 1 << 20);
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_resident_bytes"), SHARD);
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_bytes_read_total"), SHARD);
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_backend_loads_total"), 1);
    cr_assert_eq(stop(), 0);
}

/* ---------------------------------------------------------------------------
 * Reads.
 */

Test(fs, read_every_shard_cp_dd_with_eviction, .timeout = 120)
{
    const unsigned nb = 8, ns = 4; /* 2 MiB of store, 512K of cache */
    char tmp[256], cmd[1024];
    uint8_t *want = malloc(SHARD), *got = malloc(SHARD);

    cr_assert(want && got);
    store_write(M.store, 0, nb, ns);
    start("shard_size=64K,capacity=512K");
    snprintf(tmp, sizeof(tmp), "%s", tu_path("cp"));

    for (int pass = 0; pass < 2; pass++) {
        for (uint64_t b = 0; b < nb; b++) {
            for (uint32_t s = 0; s < ns; s++) {
                cr_assert_eq(fsfx_sh("cp %s %s", fsfx_shard_path(&M.fx, b, s), tmp), 0);
                assert_file_is_shard(tmp, b, s);
            }
        }
    }
    /* dd at offsets and odd sizes: skip/count in 4 KiB and 1000-byte units. */
    for (uint64_t b = 0; b < nb; b += 3) {
        struct sfs_key k = tu_key(b, 2);

        tu_fill(&k, want, SHARD);
        snprintf(cmd, sizeof(cmd), "dd if=%s of=%s bs=4096 skip=3 count=5 status=none",
                 fsfx_shard_path(&M.fx, b, 2), tmp);
        cr_assert_eq(fsfx_sh("%s", cmd), 0);
        cr_assert_eq(fsfx_read_all(tmp, got, SHARD), 5 * 4096);
        cr_assert_eq(memcmp(got, want + 3 * 4096, 5 * 4096), 0, "dd bs=4096 skip=3");
        snprintf(cmd, sizeof(cmd), "dd if=%s of=%s bs=1000 skip=17 count=100 status=none",
                 fsfx_shard_path(&M.fx, b, 2), tmp);
        cr_assert_eq(fsfx_sh("%s", cmd), 0);
        /* 17000 + 100*1000 > 64K: dd stops at the end of the shard. */
        cr_assert_eq(fsfx_read_all(tmp, got, SHARD), (long)SHARD - 17000);
        cr_assert_eq(memcmp(got, want + 17000, SHARD - 17000), 0, "dd bs=1000 skip=17");
        /* One big request past the end: a whole shard, then EOF. */
        snprintf(cmd, sizeof(cmd), "dd if=%s of=%s bs=1M status=none", fsfx_shard_path(&M.fx, b, 2),
                 tmp);
        cr_assert_eq(fsfx_sh("%s", cmd), 0);
        assert_file_is_shard(tmp, b, 2);
    }
    /* pread at odd offsets from this process. */
    {
        int fd = open(fsfx_shard_path(&M.fx, 5, 3), O_RDONLY);
        struct sfs_key k = tu_key(5, 3);

        cr_assert_geq(fd, 0);
        tu_fill(&k, want, SHARD);
        cr_assert_eq(pread(fd, got, 7777, 12345), 7777);
        cr_assert_eq(memcmp(got, want + 12345, 7777), 0);
        cr_assert_eq(pread(fd, got, 100, SHARD - 10), 10);
        cr_assert_eq(pread(fd, got, 100, SHARD), 0);
        cr_assert_eq(pread(fd, got, 100, 10 * SHARD), 0);
        close(fd);
    }
    cr_assert_gt(fsfx_stat(&M.fx, "shardfs_evictions_total"), 0,
                 "a cache smaller than the store evicts");
    cr_assert_geq(fsfx_stat(&M.fx, "shardfs_backend_loads_total"), (long long)(2 * nb * ns) - 8);
    cr_assert_leq(fsfx_stat(&M.fx, "shardfs_resident_bytes"), 512 << 10);
    cr_assert_gt(fsfx_stat(&M.fx, "shardfs_hits_total"), 0);
    unlink(tmp);
    free(want);
    free(got);
    cr_assert_eq(stop(), 0);
}

/* Wait until shard s of block b is Ready; false at the deadline. */
static bool wait_ready(uint64_t b, uint32_t s, double deadline_s)
{
    char st[32];
    double t0 = fsfx_now_s();

    do {
        if (get_state(b, s, st, sizeof(st)) == 0 && strcmp(st, "ready") == 0)
            return true;
        fsfx_sleep_ms(5);
    } while (fsfx_now_s() - t0 < deadline_s);
    return false;
}

Test(fs, readahead_loads_following_shards, .timeout = 60)
{
    char spec[512], st[32];
    uint8_t *buf = malloc(SHARD);
    long long pf0, loads;

    cr_assert_not_null(buf);
    /* Block 40: 8 shards; a slow backend, so loads overlap visibly. */
    store_write(M.store, 40, 1, 8);
    store_write(M.store, 41, 1, 3);
    snprintf(spec, sizeof(spec), "fault:latency_us=20000,seed=3:%s", M.store);
    start_spec(spec, "shard_size=64K,capacity=2M,readahead=3");
    pf0 = fsfx_stat(&M.fx, "shardfs_prefetched_total");
    cr_assert_eq(pf0, 0);

    /* A cold read of shard 0 starts loads of shards 1..3, not 4. */
    cr_assert_eq(fsfx_read_all(fsfx_shard_path(&M.fx, 40, 0), buf, SHARD), (long)SHARD);
    for (uint32_t s = 1; s <= 3; s++)
        cr_assert(wait_ready(40, s, 5.0), "shard %u not loaded ahead", s);
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_prefetched_total"), 3);
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_fs_readahead_started_total"), 3);
    cr_assert_eq(get_state(40, 4, st, sizeof(st)), 0);
    cr_assert_str_eq(st, "absent", "shard 4 is outside the window");

    /* Reading shard 1 (loaded ahead) moves the window on: shard 4 loads; the
     * data is the store's. */
    cr_assert_eq(fsfx_read_all(fsfx_shard_path(&M.fx, 40, 1), buf, SHARD), (long)SHARD);
    {
        struct sfs_key k = tu_key(40, 1);

        cr_assert_eq(tu_check(&k, buf, SHARD), -1);
    }
    cr_assert_geq(fsfx_stat(&M.fx, "shardfs_prefetch_hits_total"), 1);
    cr_assert(wait_ready(40, 4, 5.0), "shard 4 not loaded ahead after a hit on shard 1");
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_prefetched_total"), 4);

    /* Never past the backend's shard count: block 41 has 3 shards. */
    cr_assert_eq(fsfx_read_all(fsfx_shard_path(&M.fx, 41, 1), buf, SHARD), (long)SHARD);
    cr_assert(wait_ready(41, 2, 5.0));
    fsfx_sleep_ms(100);
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_prefetched_total"), 5);
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_backend_errors_total"), 0);
    cr_assert_eq(get_state(41, 0, st, sizeof(st)), 0);
    cr_assert_str_eq(st, "absent", "readahead only looks forward");

    /* A sequential reader of the whole block: every shard right, one load
     * each, most of them started ahead. */
    for (uint32_t s = 0; s < 8; s++) {
        struct sfs_key k = tu_key(40, s);

        cr_assert_eq(fsfx_read_all(fsfx_shard_path(&M.fx, 40, s), buf, SHARD), (long)SHARD);
        cr_assert_eq(tu_check(&k, buf, SHARD), -1, "shard %u", s);
    }
    loads = fsfx_stat(&M.fx, "shardfs_backend_loads_total");
    cr_assert_eq(loads, 8 + 2, "one load per shard read or read ahead: %lld", loads);
    cr_assert_geq(fsfx_stat(&M.fx, "shardfs_prefetched_total"), 7);

    /* Unlinking a shard whose readahead load is in flight waits for it
     * instead of failing EBUSY. */
    store_write(M.store, 42, 1, 4);
    cr_assert_eq(fsfx_read_all(fsfx_shard_path(&M.fx, 42, 0), buf, SHARD), (long)SHARD);
    cr_assert_eq(unlink(fsfx_shard_path(&M.fx, 42, 2)), 0, "unlink: %s", strerror(errno));
    cr_assert_eq(access(fsfx_shard_path(&M.fx, 42, 3), F_OK), -1, "the later shard went with it");
    cr_assert_eq(access(fsfx_shard_path(&M.fx, 42, 1), F_OK), 0);
    free(buf);
    cr_assert_eq(stop(), 0);
}

Test(fs, readahead_zero_loads_only_what_is_read, .timeout = 60)
{
    uint8_t *buf = malloc(SHARD);
    char st[32];

    cr_assert_not_null(buf);
    store_write(M.store, 43, 1, 4);
    start("shard_size=64K,capacity=1M,readahead=0");
    cr_assert_eq(fsfx_read_all(fsfx_shard_path(&M.fx, 43, 0), buf, SHARD), (long)SHARD);
    fsfx_sleep_ms(100);
    cr_assert_eq(get_state(43, 1, st, sizeof(st)), 0);
    cr_assert_str_eq(st, "absent");
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_prefetched_total"), 0);
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_backend_loads_total"), 1);
    free(buf);
    cr_assert_eq(stop(), 0);
}

/* The kernel forgets idle nodes (here: drop_caches), and the next lookup
 * gets a new node number from the daemon; stat must still show the same
 * inode number, or cp, which compares its stat with its open's fstat, skips
 * the file as "replaced while being copied" (seen once in CI, with eight
 * cp readers on a slow daemon). */
Test(fs, inode_numbers_survive_the_kernel_forgetting_a_node, .timeout = 60)
{
    const char *paths[3];
    struct stat a[3], b[3];
    char blockdir[300], sharddir[320];

    store_write(M.store, 44, 1, 2);
    start("shard_size=64K,capacity=1M");
    snprintf(blockdir, sizeof(blockdir), "%s", fsfx_block_dir(&M.fx, 44));
    snprintf(sharddir, sizeof(sharddir), "%s/shard", blockdir);
    paths[0] = blockdir;
    paths[1] = sharddir;
    paths[2] = fsfx_shard_path(&M.fx, 44, 1);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(stat(paths[i], &a[i]), 0, "%s: %s", paths[i], strerror(errno));
    cr_assert_neq(a[0].st_ino, a[2].st_ino);
    cr_assert_neq(a[1].st_ino, a[2].st_ino);
    /* Dentries and inodes out: the kernel sends FORGET for each node. */
    cr_assert_eq(fsfx_sh("sync; echo 2 > /proc/sys/vm/drop_caches"), 0);
    fsfx_sleep_ms(100);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(stat(paths[i], &b[i]), 0, "%s: %s", paths[i], strerror(errno));
        cr_assert_eq(a[i].st_ino, b[i].st_ino, "%s: inode %llu, then %llu", paths[i],
                     (unsigned long long)a[i].st_ino, (unsigned long long)b[i].st_ino);
    }
    cr_assert_eq(stop(), 0);
}

struct reader_arg {
    const char *src, *dst;
};

static int reader_cp(void *arg)
{
    struct reader_arg *a = arg;
    char cmd[1024];

    snprintf(cmd, sizeof(cmd), "cp %s %s", a->src, a->dst);
    return fsfx_sh("%s", cmd);
}

Test(fs, eight_readers_of_a_missing_shard_one_load, .timeout = 60)
{
    char spec[512], dst[8][256];
    struct reader_arg ra[8];
    pid_t pids[8];

    store_write(M.store, 7, 1, 2);
    snprintf(spec, sizeof(spec), "fault:latency_us=400000,seed=1:%s", M.store);
    start_spec(spec, "shard_size=64K,capacity=1M");
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_backend_loads_total"), 0);
    for (int i = 0; i < 8; i++) {
        snprintf(dst[i], sizeof(dst[i]), "%s", tu_path("reader"));
        ra[i].src = fsfx_shard_path(&M.fx, 7, 1);
        ra[i].dst = dst[i];
        pids[i] = tu_fork(reader_cp, &ra[i]);
        cr_assert_gt(pids[i], 0);
    }
    for (int i = 0; i < 8; i++)
        cr_assert_eq(tu_wait(pids[i]), 0, "reader %d failed", i);
    for (int i = 0; i < 8; i++) {
        assert_file_is_shard(dst[i], 7, 1);
        unlink(dst[i]);
    }
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_backend_loads_total"), 1, "one owner, one backend load");
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_owner_loads_total"), 1);
    cr_assert_geq(fsfx_stat(&M.fx, "shardfs_waits_total"), 1, "the others waited on the owner");
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_requests_total"),
                 fsfx_stat(&M.fx, "shardfs_hits_total") + fsfx_stat(&M.fx, "shardfs_misses_total"));
    cr_assert_eq(stop(), 0);
}

/* ---------------------------------------------------------------------------
 * Scenario D (design.md) through the mount: Touch keeps a block resident.
 */

static void scenario_d_fs(bool touch)
{
    /* T = block 70 shards 0..2; U, V, W = blocks 71..73 shard 0; X = 74. */
    struct sfs_key all[6] = {tu_key(70, 0), tu_key(70, 1), tu_key(70, 2),
                             tu_key(71, 0), tu_key(72, 0), tu_key(73, 0)};
    struct sfs_key sweep = tu_key(75, 0);
    struct sfs_lease held[6], l;
    struct sfs_cache *c;
    char st[32], hex[SFS_BLOCK_HEX_LEN + 1], path[256];
    int err = 0;

    store_write(M.store, 70, 1, 3);
    store_write(M.store, 71, 4, 1);
    start("shard_size=64K,capacity=384K,reserved=0");

    /* Load T.s0..2, U, V, W through the mount: slots 0..5. */
    for (int i = 0; i < 6; i++) {
        uint64_t b = i < 3 ? 70 : 68 + (uint64_t)i;

        cr_assert_eq(fsfx_sh("cat %s >/dev/null", fsfx_shard_path(&M.fx, b, i < 3 ? i : 0)), 0);
    }
    /* A rank attached to the daemon's cache sweeps every bit clear: it holds
     * a lease on every slot and misses (two laps, -ENOSPC, hand back at 0). */
    c = sfs_cache_attach(M.fx.sock, 0, &err);
    cr_assert_not_null(c, "attach %s: %s", M.fx.sock, strerror(-err));
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(sfs_cache_get(c, &all[i], 0, 0, &held[i]), SFS_HIT);
        cr_assert_eq(held[i].slot, (uint32_t)i, "loads fill slots in order");
    }
    cr_assert_eq(sfs_cache_get(c, &sweep, 0, 0, &l), -ENOSPC);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(sfs_cache_release(c, &held[i]), 0);

    if (touch) {
        tu_block_hex(70, hex);
        snprintf(path, sizeof(path), "%s/block/%s", M.fx.mnt, hex);
        cr_assert_eq(xattr_set(path, "user.shardfs.touch", "1"), 0);
        cr_assert_eq(fsfx_stat(&M.fx, "shardfs_touched_total"), 3, "Touch marks T's 3 shards");
    }
    /* Miss X through the mount. */
    cr_assert_eq(fsfx_sh("cat %s >/dev/null", fsfx_shard_path(&M.fx, 74, 0)), 0);
    for (uint32_t s = 0; s < 3; s++) {
        cr_assert_eq(get_state(70, s, st, sizeof(st)), 0);
        if (touch || s > 0)
            cr_assert_str_eq(st, "ready", "T.s%u must survive", s);
        else
            cr_assert_str_eq(st, "absent", "without Touch, T.s0 at the hand is the victim");
    }
    cr_assert_eq(get_state(71, 0, st, sizeof(st)), 0);
    cr_assert_str_eq(st, touch ? "absent" : "ready", "U");
    cr_assert_eq(get_state(74, 0, st, sizeof(st)), 0);
    cr_assert_str_eq(st, "ready");
    sfs_cache_close(c);
    cr_assert_eq(stop(), 0);
}

Test(fs, touch_keeps_block_resident_scenario_d, .timeout = 60)
{
    scenario_d_fs(true);
}

Test(fs, scenario_d_control_without_touch, .timeout = 60)
{
    scenario_d_fs(false);
}

/* ---------------------------------------------------------------------------
 * Failures.
 */

Test(fs, backend_error_is_eio_and_next_read_retries, .timeout = 60)
{
    char spec[512], st[32], tmp[256];
    uint8_t *buf = malloc(SHARD);
    long n;

    cr_assert_not_null(buf);
    store_write(M.store, 3, 1, 2);
    snprintf(spec, sizeof(spec), "fault:seed=5:%s", M.store);
    start_spec(spec, "shard_size=64K,capacity=1M");
    snprintf(tmp, sizeof(tmp), "%s", tu_path("cp"));

    cr_assert_eq(setxattr(M.fx.mnt, "user.shardfs.fault", "eio=1", 5, 0), 0, "%s", strerror(errno));
    n = fsfx_read_all(fsfx_shard_path(&M.fx, 3, 0), buf, SHARD);
    cr_assert_eq(n, -EIO, "read: %ld", n);
    cr_assert_neq(fsfx_sh("cp %s %s 2>/dev/null", fsfx_shard_path(&M.fx, 3, 0), tmp), 0,
                  "cp must fail");
    cr_assert_eq(get_state(3, 0, st, sizeof(st)), 0);
    cr_assert_str_eq(st, "failed");
    cr_assert_geq(fsfx_stat(&M.fx, "shardfs_failures_total"), 1);
    cr_assert_geq(fsfx_stat(&M.fx, "shardfs_backend_errors_total"), 1);
    /* Short reads are EIO too. */
    cr_assert_eq(setxattr(M.fx.mnt, "user.shardfs.fault", "short=1", 7, 0), 0);
    cr_assert_eq(fsfx_read_all(fsfx_shard_path(&M.fx, 3, 1), buf, SHARD), -EIO);
    /* Bad fault options: EINVAL. */
    cr_assert_eq(setxattr(M.fx.mnt, "user.shardfs.fault", "bogus=1", 7, 0), -1);
    cr_assert_eq(errno, EINVAL);
    /* Cleared: the next read takes ownership again and succeeds. */
    cr_assert_eq(setxattr(M.fx.mnt, "user.shardfs.fault", "off", 3, 0), 0);
    cr_assert_eq(fsfx_sh("cp %s %s", fsfx_shard_path(&M.fx, 3, 0), tmp), 0);
    assert_file_is_shard(tmp, 3, 0);
    cr_assert_eq(fsfx_read_all(fsfx_shard_path(&M.fx, 3, 1), buf, SHARD), (long)SHARD);
    cr_assert_eq(get_state(3, 0, st, sizeof(st)), 0);
    cr_assert_str_eq(st, "ready");
    unlink(tmp);
    free(buf);
    cr_assert_eq(stop(), 0);
}

static int slow_reader(void *arg)
{
    char buf[4096];
    int fd = open(arg, O_RDONLY);

    if (fd < 0)
        return 1;
    return read(fd, buf, sizeof(buf)) < 0 ? 2 : 0;
}

Test(fs, reader_killed_mid_read_leaks_no_lease, .timeout = 60)
{
    char spec[512], st[32];
    pid_t pid;
    double t0;

    store_write(M.store, 9, 1, 2);
    snprintf(spec, sizeof(spec), "fault:latency_us=500000,seed=2:%s", M.store);
    start_spec(spec, "shard_size=64K,capacity=1M");
    pid = tu_fork(slow_reader, (void *)fsfx_shard_path(&M.fx, 9, 1));
    cr_assert_gt(pid, 0);
    fsfx_sleep_ms(150); /* the load is in flight */
    cr_assert_eq(get_state(9, 1, st, sizeof(st)), 0);
    cr_assert_str_eq(st, "loading");
    kill(pid, SIGKILL);
    tu_wait(pid);
    /* The owner's load completes and its lease goes: the shard becomes
     * Ready and unleased, so removing it from the cache succeeds. */
    t0 = fsfx_now_s();
    do {
        fsfx_sleep_ms(50);
        cr_assert_eq(get_state(9, 1, st, sizeof(st)), 0);
    } while (strcmp(st, "ready") != 0 && fsfx_now_s() - t0 < 5.0);
    cr_assert_str_eq(st, "ready");
    fsfx_sleep_ms(50);
    cr_assert_eq(unlink(fsfx_shard_path(&M.fx, 9, 1)), 0, "unlink: %s (a lease leaked?)",
                 strerror(errno));
    cr_assert_eq(get_state(9, 0, st, sizeof(st)), 0);
    cr_assert_eq(access(fsfx_shard_path(&M.fx, 9, 1), F_OK), -1);
    cr_assert_eq(stop(), 0);
}

struct lease_holder {
    const char *sock;
    int ready[2], go[2];
};

/* A rank that fills two keys as owner and keeps their leases until told. */
static int hold_leases(void *arg)
{
    struct lease_holder *h = arg;
    struct sfs_key k[2] = {tu_key(200, 0), tu_key(201, 0)};
    struct sfs_lease l[2];
    struct sfs_cache *c;
    int err = 0;
    char ch = 0;

    c = sfs_cache_attach(h->sock, 0, &err);
    if (!c)
        return 10;
    for (int i = 0; i < 2; i++) {
        if (sfs_cache_get(c, &k[i], 0, 0, &l[i]) != SFS_OWNER)
            return 11;
        tu_fill(&k[i], sfs_cache_data(c, &l[i]), SHARD);
        if (sfs_cache_publish(c, &l[i], SHARD, 0) != 0)
            return 12;
    }
    if (write(h->ready[1], &ch, 1) != 1)
        return 13;
    if (read(h->go[0], &ch, 1) < 0)
        return 14;
    for (int i = 0; i < 2; i++)
        sfs_cache_release(c, &l[i]);
    sfs_cache_close(c);
    return 0;
}

Test(fs, cache_full_of_leases_answers_eagain_not_a_hang, .timeout = 60)
{
    struct lease_holder h;
    uint8_t *buf = malloc(SHARD);
    double t0, dt;
    long n;
    pid_t pid;
    char ch = 1;

    cr_assert_not_null(buf);
    store_write(M.store, 11, 1, 1);
    start("shard_size=64K,capacity=128K,reserved=0,wait_timeout=1");
    h.sock = M.fx.sock;
    cr_assert_eq(pipe(h.ready), 0);
    cr_assert_eq(pipe(h.go), 0);
    pid = tu_fork(hold_leases, &h);
    cr_assert_eq(read(h.ready[0], &ch, 1), 1, "lease holder failed");
    t0 = fsfx_now_s();
    n = fsfx_read_all(fsfx_shard_path(&M.fx, 11, 0), buf, SHARD);
    dt = fsfx_now_s() - t0;
    cr_assert_eq(n, -EAGAIN, "read: %ld", n);
    cr_assert(dt >= 0.9 && dt < 10.0, "waited %.2fs for a 1 s deadline", dt);
    cr_assert_geq(fsfx_stat(&M.fx, "shardfs_fs_wait_timeouts_total"), 1);
    cr_assert_eq(write(h.go[1], &ch, 1), 1);
    cr_assert_eq(tu_wait(pid), 0);
    n = fsfx_read_all(fsfx_shard_path(&M.fx, 11, 0), buf, SHARD);
    cr_assert_eq(n, (long)SHARD);
    {
        struct sfs_key k = tu_key(11, 0);

        cr_assert_eq(tu_check(&k, buf, SHARD), -1);
    }
    free(buf);
    cr_assert_eq(stop(), 0);
}

/* ---------------------------------------------------------------------------
 * Lifetime.
 */

struct rank_arg {
    const char *sock;
    int ready[2], go[2];
};

static int attached_rank(void *arg)
{
    struct rank_arg *a = arg;
    struct sfs_cache *c;
    struct sfs_key k = tu_key(12, 0);
    struct sfs_lease l;
    int err = 0;
    char ch = 0;

    c = sfs_cache_attach(a->sock, 0, &err);
    if (!c)
        return 10;
    /* The rank sees what the mount loaded. */
    if (sfs_cache_get(c, &k, 0, 0, &l) != SFS_HIT)
        return 11;
    if (tu_check(&k, sfs_cache_data(c, &l), SHARD) != -1)
        return 12;
    sfs_cache_release(c, &l);
    if (write(a->ready[1], &ch, 1) != 1)
        return 13;
    if (read(a->go[0], &ch, 1) < 0)
        return 14;
    sfs_cache_close(c);
    return 0;
}

Test(fs, unmount_with_a_rank_attached_exits_cleanly, .timeout = 60)
{
    struct rank_arg a;
    struct stat st;
    pid_t pid;
    char ch = 0;

    store_write(M.store, 12, 1, 1);
    start("shard_size=64K,capacity=1M");
    cr_assert_eq(fsfx_sh("cat %s >/dev/null", fsfx_shard_path(&M.fx, 12, 0)), 0);
    cr_assert_eq(stat(M.fx.sock, &st), 0);
    cr_assert(S_ISSOCK(st.st_mode));
    {
        char v[256];
        ssize_t n = getxattr(M.fx.mnt, "user.shardfs.socket", v, sizeof(v) - 1);

        cr_assert_gt(n, 0);
        v[n] = '\0';
        cr_assert_str_eq(v, M.fx.sock);
    }
    a.sock = M.fx.sock;
    cr_assert_eq(pipe(a.ready), 0);
    cr_assert_eq(pipe(a.go), 0);
    pid = tu_fork(attached_rank, &a);
    cr_assert_eq(read(a.ready[0], &ch, 1), 1, "rank failed to attach");
    /* Counters are shared: the rank's Get shows in the mount's stats. */
    cr_assert_geq(fsfx_stat(&M.fx, "shardfs_hits_total"), 1);
    cr_assert_eq(stop(), 0, "daemon exit status");
    cr_assert(!fsfx_is_mounted(M.fx.mnt));
    cr_assert_eq(stat(M.fx.sock, &st), -1, "socket removed");
    cr_assert_eq(write(a.go[1], &ch, 1), 1);
    cr_assert_eq(tu_wait(pid), 0);
}

Test(fs, sigterm_unmounts_and_exits_zero, .timeout = 60)
{
    struct stat st;
    int status;
    double t0 = fsfx_now_s();

    store_write(M.store, 13, 1, 1);
    start("shard_size=64K,capacity=1M");
    cr_assert_eq(kill(M.fx.pid, SIGTERM), 0);
    while (waitpid(M.fx.pid, &status, WNOHANG) != M.fx.pid) {
        cr_assert_lt(fsfx_now_s() - t0, 10.0, "daemon did not stop on SIGTERM");
        fsfx_sleep_ms(10);
    }
    M.fx.pid = 0;
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
    cr_assert(!fsfx_is_mounted(M.fx.mnt));
    cr_assert_eq(stat(M.fx.sock, &st), -1);
}

/* Shutdown with backend loads stuck in flight (the fault backend's stall):
 * the daemon exits within a bound, abandoning them, and a rank attached to the
 * same cache finds their slots Failed (not Loading forever) and unleased. */

#define STALL_SPEC   "fault:stall_ms=120000,seed=1:%s"
#define STOP_BOUND_S 8.0 /* the daemon's grace for loads is 2 s */

struct stall_rank {
    const char *sock;
    uint64_t block;
    uint32_t nloading; /* shards 0..nloading-1 are loading when told to go */
    int ready[2], go[2], gone[2];
};

/* A rank waiting on the daemon's stuck load of shard 0. Exit status: 0 when
 * every check held, else the number of the first that failed. */
static int stall_rank(void *arg)
{
    struct stall_rank *a = arg;
    struct sfs_key k0 = tu_key(a->block, 0);
    struct sfs_lease l;
    struct sfs_cache *c;
    int err = 0, r;
    char ch = 0;
    int64_t t0;

    /* Only the test's ends: if it dies, our reads see EOF, not a hang. */
    close(a->ready[0]);
    close(a->go[1]);
    close(a->gone[1]);
    c = sfs_cache_attach(a->sock, 0, &err);
    if (!c)
        return 10;
    if (write(a->ready[1], &ch, 1) != 1 || read(a->go[0], &ch, 1) != 1)
        return 11;
    r = sfs_cache_get(c, &k0, 0, 0, &l);
    if (r != SFS_WAITER)
        return 20; /* the daemon is not loading it */
    if (write(a->ready[1], &ch, 1) != 1)
        return 12;
    /* Woken by the daemon's shutdown with an error, not at our deadline. */
    t0 = sfs_now_ns();
    r = sfs_cache_wait(c, &l, sfs_deadline_after(60 * 1000000000ll));
    if (r != SFS_WAIT_FAILED)
        return 21;
    if (sfs_cache_error(c, &l) != -ECANCELED)
        return 22;
    if (sfs_now_ns() - t0 > (int64_t)(STOP_BOUND_S * 1e9))
        return 23;
    sfs_cache_release(c, &l);
    if (read(a->gone[0], &ch, 1) != 1)
        return 13;
    /* The daemon is gone: nothing of it is left Loading ... */
    for (uint32_t s = 1; s < a->nloading; s++) {
        struct sfs_key k = tu_key(a->block, s);

        if (sfs_cache_state(c, &k) != SFS_STATE_FAILED)
            return 30 + (int)s;
    }
    /* ... the next Get retries (ownership again) ... */
    if (sfs_cache_get(c, &k0, 0, 0, &l) != SFS_OWNER)
        return 24;
    tu_fill(&k0, sfs_cache_data(c, &l), SHARD);
    if (sfs_cache_publish(c, &l, SHARD, 0) != 0)
        return 25;
    sfs_cache_release(c, &l);
    /* ... and it left no lease: a leased slot cannot be removed. */
    for (uint32_t s = 0; s < a->nloading; s++) {
        struct sfs_key k = tu_key(a->block, s);

        if (sfs_cache_remove(c, &k) != 0)
            return 40 + (int)s;
    }
    sfs_cache_close(c);
    return 0;
}

static void stall_rank_start(struct stall_rank *a, pid_t *pid)
{
    char ch;

    a->sock = M.fx.sock;
    cr_assert_eq(pipe(a->ready), 0);
    cr_assert_eq(pipe(a->go), 0);
    cr_assert_eq(pipe(a->gone), 0);
    *pid = tu_fork(stall_rank, a);
    cr_assert_gt(*pid, 0);
    M.kids[M.nkids++] = *pid;
    cr_assert_eq(read(a->ready[0], &ch, 1), 1, "rank failed to attach");
}

/* Tell the rank to wait on shard 0; returns once it waits. */
static void stall_rank_wait(struct stall_rank *a, pid_t pid)
{
    char ch = 0;

    cr_assert_eq(write(a->go[1], &ch, 1), 1);
    if (read(a->ready[0], &ch, 1) != 1)
        cr_assert_fail("rank is not a waiter on the stalled load (status %d)", tu_wait(pid));
}

/* Wait for the daemon to exit; returns seconds since t0 (asserts the bound). */
static double daemon_exit_within(double t0, int *status)
{
    while (waitpid(M.fx.pid, status, WNOHANG) != M.fx.pid) {
        if (fsfx_now_s() - t0 > 30.0) {
            kill(M.fx.pid, SIGKILL);
            waitpid(M.fx.pid, status, 0);
            M.fx.pid = 0;
            cr_assert_fail("daemon still running 30 s after the stop");
        }
        fsfx_sleep_ms(10);
    }
    M.fx.pid = 0;
    return fsfx_now_s() - t0;
}

static bool wait_state(uint64_t b, uint32_t s, const char *want, double deadline_s)
{
    char st[32];
    double t0 = fsfx_now_s();

    do {
        if (get_state(b, s, st, sizeof(st)) == 0 && strcmp(st, want) == 0)
            return true;
        fsfx_sleep_ms(5);
    } while (fsfx_now_s() - t0 < deadline_s);
    return false;
}

/* A reader of a shard whose load is stuck: 0 when its read fails with EIO. */
static int stuck_reader(void *arg)
{
    char buf[4096];
    int fd = open(arg, O_RDONLY);

    if (fd < 0)
        return 1;
    if (read(fd, buf, sizeof(buf)) >= 0)
        return 2;
    return errno == EIO ? 0 : 3;
}

Test(fs, sigterm_with_a_stalled_load_exits_promptly_and_fails_its_slots, .timeout = 90)
{
    struct stall_rank a = {.block = 60, .nloading = 2};
    char spec[512], ch = 0;
    pid_t rank, owner, waiter;
    int status;
    double t0, dt;

    store_write(M.store, 60, 1, 3);
    snprintf(spec, sizeof(spec), STALL_SPEC, M.store);
    start_spec(spec, "shard_size=64K,capacity=1M,readahead=1");
    stall_rank_start(&a, &rank);
    /* A reader owns the load of shard 0 (and readahead that of shard 1);
     * a second reader waits in the daemon on the same load. */
    owner = tu_fork(stuck_reader, (void *)fsfx_shard_path(&M.fx, 60, 0));
    M.kids[M.nkids++] = owner;
    cr_assert(wait_state(60, 0, "loading", 5.0), "shard 0 not loading");
    cr_assert(wait_state(60, 1, "loading", 5.0), "readahead did not start shard 1");
    waiter = tu_fork(stuck_reader, (void *)fsfx_shard_path(&M.fx, 60, 0));
    M.kids[M.nkids++] = waiter;
    fsfx_sleep_ms(300);
    stall_rank_wait(&a, rank);

    t0 = fsfx_now_s();
    cr_assert_eq(kill(M.fx.pid, SIGTERM), 0);
    dt = daemon_exit_within(t0, &status);
    cr_assert_lt(dt, STOP_BOUND_S, "the daemon took %.1f s to stop", dt);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
    cr_assert(!fsfx_is_mounted(M.fx.mnt));
    cr_assert_neq(access(M.fx.sock, F_OK), 0, "socket removed");
    /* Both readers were answered: EIO, not a hang. */
    cr_assert_eq(tu_wait_for(owner, 5000000000ll), 0, "the owner's reader");
    cr_assert_eq(tu_wait_for(waiter, 5000000000ll), 0, "the waiting reader");
    cr_assert_eq(write(a.gone[1], &ch, 1), 1);
    cr_assert_eq(tu_wait_for(rank, 10000000000ll), 0, "rank's checks (see stall_rank)");
}

Test(fs, unmount_with_stalled_prefetch_exits_promptly_and_fails_its_slots, .timeout = 90)
{
    struct stall_rank a = {.block = 61, .nloading = 3};
    char spec[512], hex[SFS_BLOCK_HEX_LEN + 1], path[512], ch = 0;
    pid_t rank;
    int status;
    double t0, dt;

    store_write(M.store, 61, 1, 3);
    snprintf(spec, sizeof(spec), STALL_SPEC, M.store);
    start_spec(spec, "shard_size=64K,capacity=1M,readahead=0");
    stall_rank_start(&a, &rank);
    /* Loads in flight with no file open: the unmount itself succeeds. */
    tu_block_hex(61, hex);
    snprintf(path, sizeof(path), "%s/block/%s", M.fx.mnt, hex);
    cr_assert_eq(xattr_set(path, "user.shardfs.prefetch", "1"), 0);
    for (uint32_t s = 0; s < 3; s++)
        cr_assert(wait_state(61, s, "loading", 5.0), "shard %u not loading", s);
    stall_rank_wait(&a, rank);

    t0 = fsfx_now_s();
    cr_assert_eq(fsfx_sh("fusermount3 -u %s", M.fx.mnt), 0);
    dt = daemon_exit_within(t0, &status);
    cr_assert_lt(dt, STOP_BOUND_S, "the daemon took %.1f s to exit", dt);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
    cr_assert_neq(access(M.fx.sock, F_OK), 0, "socket removed");
    cr_assert_eq(write(a.gone[1], &ch, 1), 1);
    cr_assert_eq(tu_wait_for(rank, 10000000000ll), 0, "rank's checks (see stall_rank)");
}

/* ---------------------------------------------------------------------------
 * Writes.
 */

Test(fs, write_cp_dd_readback_store_unlink, .timeout = 60)
{
    char src[256], tmp[256], disk[512], hex[SFS_BLOCK_HEX_LEN + 1], cmd[1024];
    uint8_t *buf = malloc(2 * SHARD);
    struct sfs_key k0 = tu_key(100, 0), k1 = tu_key(100, 1);
    int fd;

    cr_assert(buf);
    start("shard_size=64K,capacity=1M");
    snprintf(src, sizeof(src), "%s", tu_path("src"));
    snprintf(tmp, sizeof(tmp), "%s", tu_path("tmp"));
    tu_block_hex(100, hex);
    snprintf(disk, sizeof(disk), "%s/data/%s", M.store, hex);

    /* cp a whole shard in: mkdir -p works on any well-formed id. */
    tu_fill(&k0, buf, SHARD);
    fd = open(src, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_eq(write(fd, buf, SHARD), (ssize_t)SHARD);
    close(fd);
    cr_assert_eq(fsfx_sh("mkdir -p %s", fsfx_shard_path(&M.fx, 100, -1)), 0);
    cr_assert_eq(fsfx_sh("cp %s %s", src, fsfx_shard_path(&M.fx, 100, 0)), 0);
    assert_file_is_shard(fsfx_shard_path(&M.fx, 100, 0), 100, 0); /* through the mount */
    assert_file_is_shard(disk, 100, 0);               /* on disk, written through */
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_fs_writes_total"), 1);

    /* dd a second shard in 4 KiB writes. */
    tu_fill(&k1, buf, SHARD);
    fd = open(src, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_eq(write(fd, buf, SHARD), (ssize_t)SHARD);
    close(fd);
    snprintf(cmd, sizeof(cmd), "dd if=%s of=%s bs=4096 status=none", src,
             fsfx_shard_path(&M.fx, 100, 1));
    cr_assert_eq(fsfx_sh("%s", cmd), 0);
    assert_file_is_shard(fsfx_shard_path(&M.fx, 100, 1), 100, 1);
    cr_assert_eq(fsfx_read_all(disk, buf, 2 * SHARD), 2 * (long)SHARD);
    cr_assert_eq(tu_check(&k1, buf + SHARD, SHARD), -1, "shard 1 on disk");
    cr_assert_eq(fsfx_sh("ls %s | tr '\\n' ' ' | grep -qx '0 1 '", fsfx_shard_path(&M.fx, 100, -1)),
                 0);

    /* A partial write (conv=notrunc) is not a whole shard: dd's close fails
     * (ENODATA) and the shard keeps its bytes, in the mount and on disk. */
    snprintf(cmd, sizeof(cmd),
             "printf 'HELLO' | dd of=%s bs=1 seek=1000 conv=notrunc status=none 2>/dev/null",
             fsfx_shard_path(&M.fx, 100, 0));
    cr_assert_neq(fsfx_sh("%s", cmd), 0, "dd of a partial shard exited 0");
    assert_file_is_shard(fsfx_shard_path(&M.fx, 100, 0), 100, 0);
    cr_assert_eq(fsfx_read_all(disk, buf, 2 * SHARD), 2 * (long)SHARD);
    cr_assert_eq(tu_check(&k0, buf, SHARD), -1, "shard 0 on disk");

    /* A short cp to a new name stores nothing and fails: once the file is
     * released, the name does not exist. */
    cr_assert_eq(fsfx_sh("printf 'abc' > %s", tmp), 0);
    cr_assert_neq(fsfx_sh("cp %s %s 2>/dev/null", tmp, fsfx_shard_path(&M.fx, 101, 0)), 0,
                  "a short cp exited 0");
    for (double t0 = fsfx_now_s(); access(fsfx_shard_path(&M.fx, 101, 0), F_OK) == 0;) {
        cr_assert_lt(fsfx_now_s() - t0, 3.0, "a short cp left a shard");
        fsfx_sleep_ms(10);
    }
    cr_assert_eq(fsfx_sh("cp %s %s", src, fsfx_shard_path(&M.fx, 101, 0)), 0); /* a whole one */

    /* More than a shard: EFBIG. */
    fd = open(fsfx_shard_path(&M.fx, 101, 0), O_WRONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pwrite(fd, "x", 1, SHARD), -1);
    cr_assert_eq(errno, EFBIG);
    close(fd);

    /* Unlink: gone from the mount, the cache and the store. */
    cr_assert_eq(unlink(fsfx_shard_path(&M.fx, 101, 0)), 0);
    cr_assert_eq(access(fsfx_shard_path(&M.fx, 101, 0), F_OK), -1);
    cr_assert_eq(errno, ENOENT);
    tu_block_hex(101, hex);
    snprintf(cmd, sizeof(cmd), "test -e %s/data/%s", M.store, hex);
    cr_assert_neq(fsfx_sh("%s", cmd), 0, "block file removed");
    cr_assert_eq(unlink(fsfx_shard_path(&M.fx, 101, 0)), -1);
    cr_assert_eq(errno, ENOENT);
    /* An empty block directory can be "removed" (rm -r works). */
    cr_assert_eq(fsfx_sh("rm -r %s/block/%s", M.fx.mnt, hex), 0);

    unlink(src);
    unlink(tmp);
    free(buf);
    cr_assert_eq(stop(), 0);
}

/* close(2) returns after FLUSH stored the shard, but the kernel sends RELEASE
 * afterwards, asynchronously: an unlink right after the close must not see
 * the lingering handle (EBUSY), nor a lookup after the unlink find the shard.
 * A handle that still holds unstored bytes keeps the shard (EBUSY). */
Test(fs, unlink_right_after_close_is_not_ebusy, .timeout = 60)
{
    static char whole[SHARD] = "xyz"; /* a shard is stored only when written whole */
    const char *p;
    int busy = 0, exists = 0, fd;

    start("shard_size=64K,capacity=1M");
    cr_assert_eq(fsfx_sh("mkdir -p %s", fsfx_shard_path(&M.fx, 102, -1)), 0);
    p = fsfx_shard_path(&M.fx, 102, 0);
    for (int i = 0; i < 300; i++) {
        fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        cr_assert_geq(fd, 0, "open: %s", strerror(errno));
        cr_assert_eq(write(fd, whole, SHARD), (ssize_t)SHARD);
        cr_assert_eq(close(fd), 0);
        if (unlink(p) != 0) {
            cr_assert_eq(errno, EBUSY, "unlink: %s", strerror(errno));
            busy++;
            continue;
        }
        if (access(p, F_OK) == 0)
            exists++;
    }
    cr_assert_eq(busy, 0, "%d of 300 unlinks after close failed EBUSY", busy);
    cr_assert_eq(exists, 0, "%d of 300 shards still there after unlink", exists);

    /* An open handle with bytes not yet stored: EBUSY, the bytes survive. */
    fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, whole, SHARD), (ssize_t)SHARD);
    cr_assert_eq(unlink(p), -1);
    cr_assert_eq(errno, EBUSY);
    cr_assert_eq(close(fd), 0);
    {
        char got[4] = "";
        int rfd = open(p, O_RDONLY);

        cr_assert_geq(rfd, 0);
        cr_assert_eq(read(rfd, got, 3), 3);
        close(rfd);
        cr_assert_eq(memcmp(got, "xyz", 3), 0);
    }
    cr_assert_eq(stop(), 0);
}

Test(fs, read_only_mount_is_erofs, .timeout = 60)
{
    char src[256];
    int fd;

    store_write(M.store, 20, 1, 2);
    start("shard_size=64K,capacity=1M,ro");
    snprintf(src, sizeof(src), "%s", tu_path("src"));
    cr_assert_eq(fsfx_sh("head -c 100 /dev/zero > %s", src), 0);
    assert_file_is_shard(fsfx_shard_path(&M.fx, 20, 1), 20, 1);
    cr_assert_neq(fsfx_sh("cp %s %s 2>/dev/null", src, fsfx_shard_path(&M.fx, 20, 0)), 0);
    cr_assert_neq(fsfx_sh("cp %s %s 2>/dev/null", src, fsfx_shard_path(&M.fx, 20, 5)), 0);
    fd = open(fsfx_shard_path(&M.fx, 20, 0), O_WRONLY);
    cr_assert_eq(fd, -1);
    cr_assert_eq(errno, EROFS);
    cr_assert_eq(unlink(fsfx_shard_path(&M.fx, 20, 0)), -1);
    cr_assert_eq(errno, EROFS);
    assert_file_is_shard(fsfx_shard_path(&M.fx, 20, 0), 20, 0); /* untouched */
    unlink(src);
    cr_assert_eq(stop(), 0);
}

/* ---------------------------------------------------------------------------
 * xattrs.
 */

Test(fs, xattrs_prefetch_state_errors, .timeout = 60)
{
    char path[256], hex[SFS_BLOCK_HEX_LEN + 1], v[256], st[32];
    ssize_t n;
    double t0;

    store_write(M.store, 30, 1, 4);
    start("shard_size=64K,capacity=1M");
    tu_block_hex(30, hex);
    snprintf(path, sizeof(path), "%s/block/%s", M.fx.mnt, hex);

    cr_assert_eq(get_state(30, 0, st, sizeof(st)), 0);
    cr_assert_str_eq(st, "absent");
    /* Prefetch returns at once and loads in the background. */
    cr_assert_eq(xattr_set(path, "user.shardfs.prefetch", "1"), 0);
    t0 = fsfx_now_s();
    for (uint32_t s = 0; s < 4; s++) {
        do {
            cr_assert_eq(get_state(30, s, st, sizeof(st)), 0);
            if (strcmp(st, "ready") == 0)
                break;
            fsfx_sleep_ms(5);
        } while (fsfx_now_s() - t0 < 5.0);
        cr_assert_str_eq(st, "ready", "shard %u after prefetch", s);
    }
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_prefetched_total"), 4);
    assert_file_is_shard(fsfx_shard_path(&M.fx, 30, 2), 30, 2);
    cr_assert_eq(fsfx_stat(&M.fx, "shardfs_prefetch_hits_total"), 1);
    cr_assert_eq(xattr_set(path, "user.shardfs.touch", "1"), 0);

    /* Unknown names: ENODATA on get, ENOTSUP on set; bad values EINVAL. */
    cr_assert_eq(getxattr(path, "user.shardfs.nope", v, sizeof(v)), -1);
    cr_assert_eq(errno, ENODATA);
    cr_assert_eq(getxattr(fsfx_shard_path(&M.fx, 30, 0), "user.other", v, sizeof(v)), -1);
    cr_assert_eq(errno, ENODATA);
    cr_assert_eq(setxattr(path, "user.shardfs.nope", "1", 1, 0), -1);
    cr_assert_eq(errno, ENOTSUP);
    cr_assert_eq(setxattr(path, "user.shardfs.touch", "2", 1, 0), -1);
    cr_assert_eq(errno, EINVAL);
    cr_assert_eq(setxattr(path, "user.shardfs.prefetch", "yes", 3, 0), -1);
    cr_assert_eq(errno, EINVAL);
    cr_assert_eq(setxattr(fsfx_shard_path(&M.fx, 30, 0), "user.shardfs.state", "ready", 5, 0), -1);
    cr_assert_eq(errno, ENOTSUP);
    /* The fault hook answers EINVAL on a backend that is not a fault one. */
    cr_assert_eq(setxattr(M.fx.mnt, "user.shardfs.fault", "eio=1", 5, 0), -1);
    cr_assert_eq(errno, EINVAL);
    /* Too small a buffer: ERANGE; size 0 asks for the length. */
    cr_assert_eq(getxattr(M.fx.mnt, "user.shardfs.socket", v, 2), -1);
    cr_assert_eq(errno, ERANGE);
    cr_assert_eq(getxattr(M.fx.mnt, "user.shardfs.socket", NULL, 0), (ssize_t)strlen(M.fx.sock));
    /* listxattr names what get answers. */
    n = listxattr(fsfx_shard_path(&M.fx, 30, 0), v, sizeof(v));
    cr_assert_eq(n, (ssize_t)sizeof("user.shardfs.state"));
    cr_assert_str_eq(v, "user.shardfs.state");
    n = listxattr(M.fx.mnt, v, sizeof(v));
    cr_assert_eq(n, (ssize_t)sizeof("user.shardfs.socket"));
    if (have_tool("getfattr"))
        cr_assert_eq(
            fsfx_sh(
                "getfattr --absolute-names -n user.shardfs.state --only-values %s | grep -qx ready",
                fsfx_shard_path(&M.fx, 30, 1)),
            0);
    cr_assert_eq(stop(), 0);
}

/* ---------------------------------------------------------------------------
 * Options.
 */

/* Run the daemon with args, after the shell words in prefix ("VAR=x", or
 * "echo $$ >F && exec"); expect exit 1 and one line on stderr that contains
 * `want` (and `want2`, unless NULL). */
static void expect_refused_in(const char *prefix, const char *args, const char *want,
                              const char *want2)
{
    char out[256], cmd[4096], line[2048] = "";
    FILE *f;
    int lines = 0;
    bool found = false;

    snprintf(out, sizeof(out), "%s", tu_path("err"));
    snprintf(cmd, sizeof(cmd), "%s %s -f %s >/dev/null 2>%s", prefix, fsfx_daemon_bin(SHARDFS_BIN),
             args, out);
    cr_assert_eq(fsfx_sh("%s", cmd), 1, "exit status of: %s", cmd);
    f = fopen(out, "re");
    cr_assert_not_null(f);
    while (fgets(line, sizeof(line), f)) {
        lines++;
        found = found || (strstr(line, want) && (!want2 || strstr(line, want2)));
    }
    fclose(f);
    unlink(out);
    cr_assert_eq(lines, 1, "%d lines of error for: %s", lines, cmd);
    cr_assert(found, "the error of '%s' must name '%s'%s%s (it is: %s)", cmd, want,
              want2 ? " and " : "", want2 ? want2 : "", line);
}

static void expect_refused(const char *args, const char *want)
{
    expect_refused_in("", args, want, NULL);
}

Test(fs, bad_options_exit_1_with_one_line, .timeout = 60)
{
    char args[1024], mnt[256], sock[256];

    snprintf(mnt, sizeof(mnt), "%s", tu_path("badmnt"));
    snprintf(sock, sizeof(sock), "%s", tu_path("badsock"));
    mkdir(mnt, 0755);
#define REFUSE(opts, want)                                                                         \
    do {                                                                                           \
        snprintf(args, sizeof(args), "-o socket=%s%s%s %s %s", sock, *(opts) ? "," : "", opts,     \
                 M.store, mnt);                                                                    \
        expect_refused(args, want);                                                                \
    } while (0)
    REFUSE("capacity=lots", "capacity");
    REFUSE("capacity=1K", "capacity");
    REFUSE("shard_size=0", "shard_size");
    REFUSE("shard_size=3X", "shard_size");
    REFUSE("shard_size=2G", "shard_size");
    REFUSE("dir_prefix=33", "dir_prefix");
    REFUSE("dir_prefix=-1", "dir_prefix");
    REFUSE("hugepages=maybe", "hugepages");
    REFUSE("reserved=99999", "reserved");
    REFUSE("wait_timeout=0", "wait_timeout");
    REFUSE("max_read=1", "max_read");
    REFUSE("readahead=-1", "readahead");
    REFUSE("readahead=100000", "readahead");
    {
        /* More than the machine's memory: refused, not prefaulted into the
         * OOM killer (capacity=1T for 1G is one typo away). */
        char big[64];
        unsigned long long mem =
            (unsigned long long)sysconf(_SC_PHYS_PAGES) * (unsigned long long)sysconf(_SC_PAGESIZE);

        snprintf(big, sizeof(big), "capacity=%lluK", 2 * (mem >> 10) + 1024);
        REFUSE(big, "capacity");
    }
#undef REFUSE
    snprintf(args, sizeof(args), "-o socket=%s /nonexistent/store %s", sock, mnt);
    expect_refused(args, "/nonexistent/store");
    snprintf(args, sizeof(args), "-o socket=%s %s", sock, M.store);
    expect_refused(args, "MOUNTPOINT");
    snprintf(args, sizeof(args), "-o socket=%s 'fault:bogus=1:%s' %s", sock, M.store, mnt);
    expect_refused(args, "bogus");

    /* A busy mount point: already mounted. */
    start("shard_size=64K,capacity=1M");
    snprintf(args, sizeof(args), "-o socket=%s %s %s", sock, M.store, M.fx.mnt);
    expect_refused(args, M.fx.mnt);
    /* The socket of a live daemon is not stolen. */
    snprintf(args, sizeof(args), "-o socket=%s %s %s", M.fx.sock, M.store, mnt);
    expect_refused(args, "socket");
    cr_assert_eq(stop(), 0);
    rmdir(mnt);

    /* --help and --version exit 0. */
    cr_assert_eq(fsfx_sh("%s --help >/dev/null 2>&1", fsfx_daemon_bin(SHARDFS_BIN)), 0);
    cr_assert_eq(fsfx_sh("%s --version >/dev/null 2>&1", fsfx_daemon_bin(SHARDFS_BIN)), 0);
}

/* ---------------------------------------------------------------------------
 * The capacity against cgroup memory limits.
 */

/* Write root/rel (creating its directories) with text. */
static void put(const char *root, const char *rel, const char *text)
{
    char path[1024];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", root, rel);
    cr_assert_eq(fsfx_sh("mkdir -p \"$(dirname '%s')\"", path), 0);
    f = fopen(path, "we");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    fputs(text, f);
    fclose(f);
}

/* This machine's default huge page size, as cgroup files name it ("2MB"),
 * and how many bytes of huge pages are free; false without huge pages. */
static bool host_hugepages(char *name, size_t len, unsigned long long *free_bytes)
{
    char line[256];
    unsigned long long kb = 0, nfree = 0;
    FILE *f = fopen("/proc/meminfo", "re");

    if (!f)
        return false;
    while (fgets(line, sizeof(line), f)) {
        sscanf(line, "Hugepagesize: %llu kB", &kb);
        sscanf(line, "HugePages_Free: %llu", &nfree);
    }
    fclose(f);
    if (!kb)
        return false;
    if (kb >= (1ull << 20))
        snprintf(name, len, "%lluGB", kb >> 20);
    else if (kb >= (1ull << 10))
        snprintf(name, len, "%lluMB", kb >> 10);
    else
        snprintf(name, len, "%lluKB", kb);
    *free_bytes = nfree * kb * 1024;
    return true;
}

/* The daemon reads its cgroups from a fake tree (SHARDFS_TEST_CGROUP_ROOT):
 * the limit of every ancestor counts, the smallest wins, "max" and v1's
 * "unlimited" are none, huge pages answer to the hugetlb limit (and to the
 * memory one with memory_hugetlb_accounting), a bind-mounted subtree resolves
 * relative to its root. A capacity that passes the check stops at the
 * missing backend directory instead. */
Test(fs, capacity_checked_against_cgroup_limits_fake_tree, .timeout = 60)
{
    char root[256], env[512], args[1024], want[1024], hp[32], file[256];
    char sock[256], nostore[256], mnt[256];
    const char *v2mi = "30 20 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
    unsigned long long hpfree = 0;
    bool huge = host_hugepages(hp, sizeof(hp), &hpfree);

    snprintf(root, sizeof(root), "%s", tu_path("cgroot"));
    snprintf(env, sizeof(env), "SHARDFS_TEST_CGROUP_ROOT=%s", root);
    snprintf(sock, sizeof(sock), "%s", tu_path("cgsock"));
    snprintf(nostore, sizeof(nostore), "%s", tu_path("nostore")); /* never created */
    snprintf(mnt, sizeof(mnt), "%s", tu_path("cgmnt"));
    mkdir(mnt, 0755);
#define REFUSED(opts, w1, w2)                                                                      \
    do {                                                                                           \
        snprintf(args, sizeof(args), "-o socket=%s,%s %s %s", sock, opts, nostore, mnt);           \
        expect_refused_in(env, args, w1, w2);                                                      \
    } while (0)
#define PASSES(opts) REFUSED(opts, "BACKEND_DIR", nostore)

    /* cgroup v2, /a/b: the parent's limit binds the child with "max". */
    put(root, "proc/self/cgroup", "0::/a/b\n");
    put(root, "proc/self/mountinfo", v2mi);
    put(root, "sys/fs/cgroup/a/memory.max", "1073741824\n");
    put(root, "sys/fs/cgroup/a/b/memory.max", "max\n");
    snprintf(want, sizeof(want), "%s/sys/fs/cgroup/a/memory.max", root);
    REFUSED("hugepages=off,capacity=2G", want, "1073741824 bytes");
    PASSES("hugepages=off,capacity=512M");
    /* A smaller limit deeper down wins. */
    put(root, "sys/fs/cgroup/a/b/memory.max", "268435456\n");
    snprintf(want, sizeof(want), "%s/sys/fs/cgroup/a/b/memory.max", root);
    REFUSED("hugepages=off,capacity=512M", want, "268435456 bytes");
    PASSES("hugepages=off,capacity=256M");
    if (huge) {
        /* Huge pages are not charged to memory.max: on passes ... */
        PASSES("hugepages=on,capacity=512M");
        /* ... up to the hugetlb limit of their size ... */
        snprintf(file, sizeof(file), "sys/fs/cgroup/a/hugetlb.%s.max", hp);
        put(root, file, "134217728\n");
        snprintf(want, sizeof(want), "%s/%s", root, file);
        REFUSED("hugepages=on,capacity=512M", want, "huge page limit");
        put(root, file, "max\n");
        /* ... unless the mount charges them to memory too. */
        put(root, "proc/self/mountinfo",
            "30 20 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,memory_hugetlb_accounting\n");
        snprintf(want, sizeof(want), "%s/sys/fs/cgroup/a/b/memory.max", root);
        REFUSED("hugepages=on,capacity=512M", want, "memory limit");
        REFUSED("capacity=512M", want, "memory limit");
        put(root, "proc/self/mountinfo", v2mi);
        /* auto with only huge pages fitting: on, never the ordinary
         * fallback; without free huge pages it is refused at create. */
        if (hpfree < (512ull << 20)) {
            snprintf(args, sizeof(args), "-o socket=%s,capacity=512M %s %s", sock, M.store, mnt);
            expect_refused_in(env, args, "no huge pages", want);
        }
    }
    /* cgroup v1: "unlimited" is none; the hierarchy's root limit counts. */
    put(root, "proc/self/cgroup", "5:cpu,cpuacct:/x\n4:memory:/x\n0::/x\n");
    put(root, "proc/self/mountinfo",
        "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n");
    put(root, "sys/fs/cgroup/memory/x/memory.limit_in_bytes", "9223372036854771712\n");
    put(root, "sys/fs/cgroup/memory/memory.limit_in_bytes", "268435456\n");
    put(root, "sys/fs/cgroup/cpu,cpuacct/x/memory.limit_in_bytes", "4096\n"); /* not memory's */
    snprintf(want, sizeof(want), "%s/sys/fs/cgroup/memory/memory.limit_in_bytes", root);
    REFUSED("hugepages=off,capacity=512M", want, "268435456 bytes");
    PASSES("hugepages=off,capacity=128M");
    /* A container's view: the mount is the subtree /pods/p1 of the
     * hierarchy, our cgroup /pods/p1/c is its c/. */
    put(root, "proc/self/cgroup", "0::/pods/p1/c\n");
    put(root, "proc/self/mountinfo",
        "30 20 0:26 /pods/p1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    put(root, "sys/fs/cgroup/c/memory.max", "67108864\n");
    snprintf(want, sizeof(want), "%s/sys/fs/cgroup/c/memory.max", root);
    REFUSED("hugepages=off,capacity=128M", want, "67108864 bytes");
    PASSES("hugepages=off,capacity=64M");
#undef PASSES
#undef REFUSED
    rmdir(mnt);
    fsfx_sh("rm -rf %s", root);
}

/* A real cgroup with a memory limit (v2 memory.max; v1 memory.limit_in_bytes
 * where the memory controller is on v1), under the mount of that hierarchy,
 * or under our own cgroup on v1. Returns false (and says why in why) when
 * there is none to be had. */
static bool cgroup_make(uint64_t limit, char *why, size_t whylen)
{
    char line[4096], v2[1024] = "", v1[1024] = "", mine[1024] = "", path[2200], val[32];
    FILE *f = fopen("/proc/self/mountinfo", "re");

    if (!f) {
        snprintf(why, whylen, "no /proc/self/mountinfo");
        return false;
    }
    while (fgets(line, sizeof(line), f)) {
        char root[1024], point[1024], *sep = strstr(line, " - ");

        if (!sep || sscanf(line, "%*s %*s %*s %1023s %1023s", root, point) != 2 ||
            strcmp(root, "/") != 0)
            continue;
        if (strncmp(sep, " - cgroup2 ", 11) == 0)
            snprintf(v2, sizeof(v2), "%s", point);
        else if (strncmp(sep, " - cgroup ", 10) == 0 && strstr(sep, ",memory"))
            snprintf(v1, sizeof(v1), "%s", point);
    }
    fclose(f);
    if (v2[0]) {
        snprintf(path, sizeof(path), "%s/cgroup.subtree_control", v2);
        f = fopen(path, "re");
        line[0] = '\0';
        if (f) {
            if (!fgets(line, sizeof(line), f))
                line[0] = '\0';
            fclose(f);
        }
        if (strstr(line, "memory")) {
            snprintf(M.cgroup, sizeof(M.cgroup), "%s/shardfs-test-%d", v2, (int)getpid());
            snprintf(M.cgfile, sizeof(M.cgfile), "memory.max");
        }
    }
    if (!M.cgroup[0] && v1[0]) {
        f = fopen("/proc/self/cgroup", "re");
        while (f && fgets(line, sizeof(line), f)) {
            char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;

            if (c2 && strncmp(c1 + 1, "memory:", 7) == 0) {
                c2[1 + strcspn(c2 + 1, "\n")] = '\0';
                snprintf(mine, sizeof(mine), "%s", strcmp(c2 + 1, "/") ? c2 + 1 : "");
            }
        }
        if (f)
            fclose(f);
        snprintf(M.cgroup, sizeof(M.cgroup), "%s%s/shardfs-test-%d", v1, mine, (int)getpid());
        snprintf(M.cgfile, sizeof(M.cgfile), "memory.limit_in_bytes");
    }
    if (!M.cgroup[0]) {
        snprintf(why, whylen, "no cgroup2 mount with the memory controller, nor a v1 one");
        return false;
    }
    if (mkdir(M.cgroup, 0755) < 0) {
        snprintf(why, whylen, "mkdir %s: %s", M.cgroup, strerror(errno));
        M.cgroup[0] = '\0';
        return false;
    }
    snprintf(path, sizeof(path), "%s/%s", M.cgroup, M.cgfile);
    snprintf(val, sizeof(val), "%llu", (unsigned long long)limit);
    f = fopen(path, "we");
    if (!f || fputs(val, f) < 0 || fclose(f) != 0) {
        snprintf(why, whylen, "cannot set %s: %s", path, strerror(errno));
        return false;
    }
    return true;
}

Test(fs, capacity_above_cgroup_memory_limit_is_refused, .timeout = 60)
{
    char why[2400], join[2300], args[1024], want[2300], mnt[256], sock[256];

    if (!cgroup_make(64ull << 20, why, sizeof(why)))
        cr_skip_test("no cgroup to limit (%s): cgroup limit test skipped", why);
    snprintf(join, sizeof(join), "echo $$ > %s/cgroup.procs && exec", M.cgroup);
    snprintf(want, sizeof(want), "%s/%s", M.cgroup, M.cgfile);
    snprintf(mnt, sizeof(mnt), "%s", tu_path("cgmnt"));
    snprintf(sock, sizeof(sock), "%s", tu_path("cgsock"));
    mkdir(mnt, 0755);
    /* Under RAM, above the cgroup's 64M: refused, naming the limit and where
     * it came from, instead of prefaulting into the OOM killer. */
    snprintf(args, sizeof(args), "-o socket=%s,hugepages=off,capacity=128M %s %s", sock, M.store,
             mnt);
    expect_refused_in(join, args, want, "67108864 bytes");
    {
        char hp[32];
        unsigned long long hpfree = 0;

        /* auto: ordinary memory would not fit, so no fallback to it. */
        if (!host_hugepages(hp, sizeof(hp), &hpfree) || hpfree < (128ull << 20)) {
            snprintf(args, sizeof(args), "-o socket=%s,capacity=128M %s %s", sock, M.store, mnt);
            expect_refused_in(join, args, want, "no huge pages");
        }
    }
    rmdir(mnt);
    /* Below it: mounts, and serves. */
    store_write(M.store, 70, 1, 1);
    M.join_cgroup = true;
    start("shard_size=64K,capacity=16M");
    assert_file_is_shard(fsfx_shard_path(&M.fx, 70, 0), 70, 0);
    cr_assert_eq(stop(), 0);
}

Test(fs, daemonizes_without_f, .timeout = 60)
{
    char cmd[1024];
    double t0;

    store_write(M.store, 40, 1, 1);
    snprintf(M.fx.mnt, sizeof(M.fx.mnt), "%s", tu_path("mnt"));
    snprintf(M.fx.sock, sizeof(M.fx.sock), "%s", tu_path("sock"));
    mkdir(M.fx.mnt, 0755);
    snprintf(cmd, sizeof(cmd), "%s -o socket=%s,hugepages=off,shard_size=64K,capacity=1M %s %s",
             fsfx_daemon_bin(SHARDFS_BIN), M.fx.sock, M.store, M.fx.mnt);
    /* The parent returns once the child is mounted. */
    cr_assert_eq(fsfx_sh("%s", cmd), 0);
    cr_assert(fsfx_is_mounted(M.fx.mnt));
    assert_file_is_shard(fsfx_shard_path(&M.fx, 40, 0), 40, 0);
    cr_assert_eq(fsfx_sh("fusermount3 -u %s", M.fx.mnt), 0);
    t0 = fsfx_now_s();
    while (access(M.fx.sock, F_OK) == 0 && fsfx_now_s() - t0 < 10.0)
        fsfx_sleep_ms(10);
    cr_assert_neq(access(M.fx.sock, F_OK), 0, "socket removed after unmount");
}
