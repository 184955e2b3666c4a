/* SPDX-License-Identifier: MIT */
/*
 * test_backend.c - the backends below the cache: posix (UCM PosixStore
 * layout, io_uring loads, tmp+rename dumps), mem, fault, and spec parsing.
 *
 * Every store here is written by the test itself, byte by byte, in the UCM
 * layout, and every shard's bytes are a pure function of (block, shard,
 * version), so a test can tell a right shard from a wrong or torn one without
 * keeping copies (backendfx.h). Temporary directories are unique per process
 * and test. The posix backend on a store other hosts share:
 * test_backend_remote.c.
 */
#include <shardfs/backend.h>
#include <shardfs/fault.h>

#include "backendfx.h"
#include "testpoint_i.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Read shard n of a block straight from disk into buf; returns bytes read. */
static ssize_t read_disk(unsigned dir_prefix, uint64_t block, uint32_t n, void *buf, uint32_t S)
{
    struct sfs_block_id id = mkid(block);
    char path[400];
    ssize_t r;
    int fd;

    block_path(dir_prefix, &id, path, sizeof(path), false);
    fd = open(path, O_RDONLY);
    if (fd < 0)
        return -errno;
    r = pread(fd, buf, S, (off_t)n * S);
    close(fd);
    return r;
}

/* In a forked child: the store at g_root, or tu_exit(2). */
static struct sfs_backend *child_open(void)
{
    struct sfs_backend_params p = {.shard_size = S_SMALL};
    int e;
    struct sfs_backend *be = sfs_backend_open(g_root, &p, NULL, 0, &e);

    if (!be)
        tu_exit(2);
    return be;
}

/* A batch of loads and a way to wait for all of them. */
struct batch {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    size_t pending;
    atomic_int calls; /* done() calls seen, to catch doubles */
};

static void batch_done(struct sfs_io *io)
{
    struct batch *b = io->arg;

    /* Relaxed: a counter read after the batch settles under the mutex. */
    atomic_fetch_add_explicit(&b->calls, 1, memory_order_relaxed);
    pthread_mutex_lock(&b->lock);
    b->pending--;
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
}

static void batch_init(struct batch *b, size_t n)
{
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->cond, NULL);
    b->pending = n;
    atomic_init(&b->calls, 0);
}

static void batch_wait(struct batch *b)
{
    pthread_mutex_lock(&b->lock);
    while (b->pending)
        pthread_cond_wait(&b->cond, &b->lock);
    pthread_mutex_unlock(&b->lock);
}

/* io[0..n) complete into b (set up here for n) and read or write len bytes
 * each at bufs + i * len; ios[i] = &io[i]. The caller sets the keys. */
static void batch_prepare(struct batch *b, struct sfs_io *io, struct sfs_io **ios, size_t n,
                          char *bufs, uint32_t len)
{
    batch_init(b, n);
    for (size_t i = 0; i < n; i++) {
        io[i] = (struct sfs_io){.buf = bufs + i * len, .len = len, .done = batch_done, .arg = b};
        ios[i] = &io[i];
    }
}

static int64_t mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Load nblocks x nshards keys in one batch and check every byte. */
static void load_all_and_check(struct sfs_backend *be, uint64_t nblocks, uint32_t nshards,
                               uint32_t S)
{
    size_t n = nblocks * nshards;
    struct sfs_io *io = calloc(n, sizeof(*io));
    struct sfs_io **ios = calloc(n, sizeof(*ios));
    char *bufs = xalloc(n * S);
    struct batch b;

    batch_prepare(&b, io, ios, n, bufs, S);
    for (size_t i = 0; i < n; i++)
        io[i].key = mkkey(i / nshards, (uint32_t)(i % nshards));
    cr_assert_eq(sfs_backend_load(be, ios, n), (int)n);
    batch_wait(&b);
    cr_assert_eq(atomic_load(&b.calls), (int)n, "done() called %d times for %zu loads",
                 atomic_load(&b.calls), n);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(io[i].result, (int)S, "load %zu: %d", i, io[i].result);
        cr_assert(matches(&io[i].key.block, io[i].key.shard, 0, io[i].buf, S),
                  "load %zu: wrong bytes", i);
    }
    free(bufs);
    free(ios);
    free(io);
}

TestSuite(backend, .init = mkroot, .fini = rmroot, .timeout = 30);

/* --- posix loads --- */

Test(backend, posix_load_many_prefix0, .timeout = 30)
{
    for (uint64_t b = 0; b < 64; b++)
        write_block(0, b, 4, S_SMALL);
    struct sfs_backend *be = open_be(g_root, S_SMALL, false);

    load_all_and_check(be, 64, 4, S_SMALL);
    sfs_backend_close(be);
}

Test(backend, posix_load_many_prefix2_small_ring, .timeout = 30)
{
    for (uint64_t b = 0; b < 100; b++)
        write_block(2, b, 3, S_SMALL);
    /* depth=4: most of the 300 loads wait on the pending list. */
    struct sfs_backend *be = open_spec("posix:%s?dir_prefix=2&depth=4", g_root);

    load_all_and_check(be, 100, 3, S_SMALL);
    sfs_backend_close(be);
}

Test(backend, posix_dir_prefix_from_params, .timeout = 30)
{
    struct sfs_backend_params p = {.shard_size = S_SMALL, .dir_prefix = 3};
    int e;

    for (uint64_t b = 0; b < 8; b++)
        write_block(3, b, 2, S_SMALL);
    struct sfs_backend *be = sfs_backend_open(g_root, &p, NULL, 0, &e);

    cr_assert_not_null(be);
    load_all_and_check(be, 8, 2, S_SMALL);
    sfs_backend_close(be);
}

Test(backend, posix_missing_and_short, .timeout = 30)
{
    struct sfs_backend *be;
    struct sfs_key k;
    char *buf = xalloc(S_SMALL);
    char path[400];
    struct sfs_block_id id = mkid(1);

    write_block(0, 1, 2, S_SMALL);
    be = open_be(g_root, S_SMALL, false);
    k = mkkey(99, 0); /* no such file */
    cr_assert_eq(sfs_backend_load_sync(be, &k, buf, S_SMALL), -ENOENT);
    k = mkkey(1, 2); /* beyond EOF, at a shard boundary */
    cr_assert_eq(sfs_backend_load_sync(be, &k, buf, S_SMALL), -ENOENT);
    k = mkkey(1, 7);
    cr_assert_eq(sfs_backend_load_sync(be, &k, buf, S_SMALL), -ENOENT);
    k = mkkey(1, 1);
    cr_assert_eq(sfs_backend_load_sync(be, &k, buf, S_SMALL), (int)S_SMALL);
    cr_assert(matches(&k.block, 1, 0, buf, S_SMALL));

    /* Cut the file inside shard 1: shard 1 is a miss (not a short read
     * passed on: docs/shared-store.md), shard 0 still loads. */
    block_path(0, &id, path, sizeof(path), false);
    cr_assert_eq(truncate(path, S_SMALL + 100), 0);
    cr_assert_eq(sfs_backend_load_sync(be, &k, buf, S_SMALL), -ENOENT);
    k.shard = 0;
    cr_assert_eq(sfs_backend_load_sync(be, &k, buf, S_SMALL), (int)S_SMALL);
    /* A partial length (<= shard_size) reads a prefix. */
    cr_assert_eq(sfs_backend_load_sync(be, &k, buf, 100), 100);
    /* Longer than a shard: refused. */
    cr_assert_eq(sfs_backend_load_sync(be, &k, buf, S_SMALL + 1), -EINVAL);
    sfs_backend_close(be);

    /* No data/ directory at all: still just absent. */
    rmroot();
    mkroot();
    be = open_be(g_root, S_SMALL, false);
    cr_assert_eq(sfs_backend_load_sync(be, &k, buf, S_SMALL), -ENOENT);
    sfs_backend_close(be);
    free(buf);
}

Test(backend, posix_direct, .timeout = 30)
{
    struct sfs_key k = mkkey(3, 1);
    char *buf = xalloc(S_SMALL);
    char *odd = malloc(S_SMALL + 1);

    for (uint64_t b = 0; b < 16; b++)
        write_block(0, b, 4, S_SMALL);
    struct sfs_backend *be = open_spec("posix:%s?direct=1&depth=8", g_root);

    /* O_DIRECT where the fs takes it, buffered where not: same bytes. */
    load_all_and_check(be, 16, 4, S_SMALL);
    /* A misaligned buffer goes buffered. */
    cr_assert_eq(sfs_backend_load_sync(be, &k, odd + 1, S_SMALL), (int)S_SMALL);
    cr_assert(matches(&k.block, 1, 0, odd + 1, S_SMALL));
    /* A dump then a direct load sees the new bytes (page cache written back). */
    fill(&k.block, 1, 5, buf, S_SMALL);
    cr_assert_eq(sfs_backend_dump_sync(be, &k, buf, S_SMALL), (int)S_SMALL);
    memset(buf, 0, S_SMALL);
    cr_assert_eq(sfs_backend_load_sync(be, &k, buf, S_SMALL), (int)S_SMALL);
    cr_assert(matches(&k.block, 1, 5, buf, S_SMALL));
    sfs_backend_close(be);
    free(odd);
    free(buf);
}

/* A done() that submits the next load from the completion thread. */
struct chain {
    struct sfs_backend *be;
    struct sfs_io io;
    char *buf;
    int left, bad;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool finished;
};

static void chain_done(struct sfs_io *io)
{
    struct chain *c = io->arg;
    struct sfs_io *p = &c->io;

    if (io->result != (int)S_SMALL || !matches(&io->key.block, io->key.shard, 0, io->buf, S_SMALL))
        c->bad++;
    if (--c->left > 0) {
        c->io.key = mkkey((uint64_t)c->left % 8, 0);
        sfs_backend_load(c->be, &p, 1);
        return;
    }
    pthread_mutex_lock(&c->lock);
    c->finished = true;
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

Test(backend, posix_resubmit_from_done, .timeout = 30)
{
    struct chain c = {.left = 200};
    struct sfs_io *p = &c.io;

    for (uint64_t b = 0; b < 8; b++)
        write_block(0, b, 1, S_SMALL);
    c.be = open_spec("posix:%s?depth=1", g_root);
    c.buf = xalloc(S_SMALL);
    pthread_mutex_init(&c.lock, NULL);
    pthread_cond_init(&c.cond, NULL);
    c.io = (struct sfs_io){
        .key = mkkey(0, 0), .buf = c.buf, .len = S_SMALL, .done = chain_done, .arg = &c};
    cr_assert_eq(sfs_backend_load(c.be, &p, 1), 1);
    pthread_mutex_lock(&c.lock);
    while (!c.finished)
        pthread_cond_wait(&c.cond, &c.lock);
    pthread_mutex_unlock(&c.lock);
    cr_assert_eq(c.bad, 0);
    sfs_backend_close(c.be);
    free(c.buf);
}

/* --- posix dumps --- */

Test(backend, posix_dump_roundtrip, .timeout = 30)
{
    for (unsigned prefix = 0; prefix <= 2; prefix += 2) {
        struct sfs_backend *be =
            open_spec("posix:%s?dir_prefix=%u&sync=%u", g_root, prefix, prefix ? 1u : 0u);
        char *buf = xalloc(S_SMALL), *disk = xalloc(S_SMALL);
        const size_t n = 40; /* 10 blocks x 4 shards in one batch */
        struct sfs_io io[40], *ios[40];
        char *bufs = xalloc(n * S_SMALL);
        struct batch b;

        batch_prepare(&b, io, ios, n, bufs, S_SMALL);
        for (size_t i = 0; i < n; i++) {
            /* Interleave blocks so grouping has work to do. */
            io[i].key = mkkey(100 + i % 10, (uint32_t)(i / 10));
            fill(&io[i].key.block, io[i].key.shard, 0, io[i].buf, S_SMALL);
        }
        cr_assert_eq(sfs_backend_dump(be, ios, n), (int)n);
        batch_wait(&b);
        cr_assert_eq(atomic_load(&b.calls), (int)n);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(io[i].result, (int)S_SMALL, "dump %zu: %d", i, io[i].result);
        for (uint64_t blk = 100; blk < 110; blk++) {
            cr_assert_eq(file_size(prefix, blk), 4 * (off_t)S_SMALL);
            for (uint32_t s = 0; s < 4; s++) {
                struct sfs_key k = mkkey(blk, s);

                cr_assert_eq(read_disk(prefix, blk, s, disk, S_SMALL), (ssize_t)S_SMALL);
                cr_assert(matches(&k.block, s, 0, disk, S_SMALL), "disk %lu/%u", blk, s);
                cr_assert_eq(sfs_backend_load_sync(be, &k, buf, S_SMALL), (int)S_SMALL);
                cr_assert(matches(&k.block, s, 0, buf, S_SMALL));
            }
        }
        /* Overwrite one shard: the others stay. */
        struct sfs_key k = mkkey(105, 2);

        fill(&k.block, 2, 9, buf, S_SMALL);
        cr_assert_eq(sfs_backend_dump_sync(be, &k, buf, S_SMALL), (int)S_SMALL);
        cr_assert_eq(read_disk(prefix, 105, 2, disk, S_SMALL), (ssize_t)S_SMALL);
        cr_assert(matches(&k.block, 2, 9, disk, S_SMALL));
        cr_assert_eq(read_disk(prefix, 105, 3, disk, S_SMALL), (ssize_t)S_SMALL);
        cr_assert(matches(&k.block, 3, 0, disk, S_SMALL));
        /* A dump must be a whole shard. */
        cr_assert_eq(sfs_backend_dump_sync(be, &k, buf, 100), -EINVAL);
        /* No .tmp left behind. */
        {
            char path[400], tmp[420];
            struct sfs_block_id id = mkid(105);

            block_path(prefix, &id, path, sizeof(path), false);
            snprintf(tmp, sizeof(tmp), "%s.tmp", path);
            cr_assert_neq(access(tmp, F_OK), 0);
        }
        sfs_backend_close(be);
        free(bufs);
        free(disk);
        free(buf);
    }
}

struct dumper_arg {
    struct sfs_backend *be;
    uint32_t first, step, nshards;
    int errors;
};

static void *dumper_thread(void *arg)
{
    struct dumper_arg *a = arg;
    char *buf = malloc(S_SMALL);

    for (uint32_t s = a->first; s < a->nshards; s += a->step) {
        struct sfs_key k = mkkey(7, s);

        fill(&k.block, s, 0, buf, S_SMALL);
        if (sfs_backend_dump_sync(a->be, &k, buf, S_SMALL) != (int)S_SMALL)
            a->errors++;
    }
    free(buf);
    return NULL;
}

static void check_block_complete(unsigned prefix, uint64_t blk, uint32_t nshards)
{
    char *disk = malloc(S_SMALL);
    struct sfs_block_id id = mkid(blk);

    cr_assert_eq(file_size(prefix, blk), (off_t)nshards * S_SMALL);
    for (uint32_t s = 0; s < nshards; s++) {
        cr_assert_eq(read_disk(prefix, blk, s, disk, S_SMALL), (ssize_t)S_SMALL);
        cr_assert(matches(&id, s, 0, disk, S_SMALL), "shard %u lost or wrong", s);
    }
    free(disk);
}

Test(backend, posix_concurrent_dumps_threads, .timeout = 30)
{
    struct sfs_backend *be = open_be(g_root, S_SMALL, false);
    struct dumper_arg a[4];
    pthread_t t[4];

    for (uint32_t i = 0; i < 4; i++) {
        a[i] = (struct dumper_arg){.be = be, .first = i, .step = 4, .nshards = 64};
        pthread_create(&t[i], NULL, dumper_thread, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(a[i].errors, 0);
    }
    check_block_complete(0, 7, 64);
    sfs_backend_close(be);
}

Test(backend, posix_concurrent_dumps_processes, .timeout = 30)
{
    pid_t pids[4];

    for (uint32_t i = 0; i < 4; i++) {
        pids[i] = fork();
        cr_assert_geq(pids[i], 0);
        if (pids[i] == 0) {
            struct dumper_arg a = {.be = child_open(), .first = i, .step = 4, .nshards = 64};

            dumper_thread(&a);
            sfs_backend_close(a.be);
            tu_exit(a.errors ? 1 : 0);
        }
    }
    for (int i = 0; i < 4; i++) {
        int st;

        cr_assert_eq(waitpid(pids[i], &st, 0), pids[i]);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d failed", i);
    }
    check_block_complete(0, 7, 64);
}

/* Every shard on disk must be exactly one version, never a mix. */
static void check_untorn(uint64_t blk, uint32_t maxshards, uint32_t nversions)
{
    struct sfs_block_id id = mkid(blk);
    char *disk = malloc(S_SMALL);
    off_t size = file_size(0, blk);

    cr_assert_eq(size % S_SMALL, 0, "block file size %lld not whole shards", (long long)size);
    cr_assert_leq(size, (off_t)maxshards * S_SMALL);
    for (uint32_t s = 0; s < size / S_SMALL; s++) {
        bool ok = false;

        cr_assert_eq(read_disk(0, blk, s, disk, S_SMALL), (ssize_t)S_SMALL);
        for (uint32_t v = 0; v < nversions && !ok; v++)
            ok = matches(&id, s, v, disk, S_SMALL);
        cr_assert(ok, "shard %u is torn", s);
    }
    free(disk);
}

Test(backend, posix_sigkill_mid_dump_never_torn, .timeout = 30)
{
    const uint32_t nshards = 8, nversions = 4;
    uint64_t rng = (uint64_t)getpid();
    char *buf = malloc(S_SMALL);

    int changed = 0;

    /* Start with every shard at version 0. */
    write_block(0, 11, nshards, S_SMALL);
    for (int round = 0; round < 40; round++) {
        int ready[2];
        char c;
        pid_t pid;

        cr_assert_eq(pipe(ready), 0);
        pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            struct sfs_backend *be = child_open();
            struct sfs_io io[4], *ios[4];
            char *b = malloc(4 * S_SMALL);

            for (uint32_t i = 0;; i++) {
                struct batch bt;

                /* A batch of 4 shards of block 11, whole versions each. */
                batch_prepare(&bt, io, ios, 4, b, S_SMALL);
                for (uint32_t j = 0; j < 4; j++) {
                    io[j].key = mkkey(11, (i + j * 2) % nshards);
                    fill(&io[j].key.block, io[j].key.shard, (i + j) % nversions, io[j].buf,
                         S_SMALL);
                }
                sfs_backend_dump(be, ios, 4);
                batch_wait(&bt);
                if (i == 0 && write(ready[1], "r", 1) != 1)
                    tu_exit(3);
            }
        }
        close(ready[1]);
        /* Kill at a random point once the child has committed one batch. */
        cr_assert_eq(read(ready[0], &c, 1), 1, "dumper child died");
        close(ready[0]);
        usleep((useconds_t)(mix(&rng) % 2000));
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        check_untorn(11, nshards, nversions);
        {
            struct sfs_block_id id = mkid(11);

            cr_assert_eq(read_disk(0, 11, 0, buf, S_SMALL), (ssize_t)S_SMALL);
            changed += !matches(&id, 0, 0, buf, S_SMALL);
        }
    }
    cr_assert_gt(changed, 0, "the dumper never committed anything");
    /* A stale .tmp from a killed writer does not stop the next dump. */
    struct sfs_backend *be = open_be(g_root, S_SMALL, false);
    struct sfs_key k = mkkey(11, 3);

    fill(&k.block, 3, 2, buf, S_SMALL);
    cr_assert_eq(sfs_backend_dump_sync(be, &k, buf, S_SMALL), (int)S_SMALL);
    check_untorn(11, nshards, nversions);
    memset(buf, 0, S_SMALL);
    cr_assert_eq(sfs_backend_load_sync(be, &k, buf, S_SMALL), (int)S_SMALL);
    cr_assert(matches(&k.block, 3, 2, buf, S_SMALL));
    sfs_backend_close(be);
    free(buf);
}

/* --- posix metadata: exists, shard_count, list, remove, touch --- */

struct listing {
    struct sfs_block_id ids[64];
    int n;
    int stop_after;
};

static int list_fn(const struct sfs_block_id *id, void *arg)
{
    struct listing *l = arg;

    if (l->n < 64)
        l->ids[l->n] = *id;
    l->n++;
    return l->stop_after && l->n >= l->stop_after ? 7 : 0;
}

static bool listed(const struct listing *l, uint64_t blk)
{
    struct sfs_block_id id = mkid(blk);

    for (int i = 0; i < l->n && i < 64; i++)
        if (memcmp(&l->ids[i], &id, sizeof(id)) == 0)
            return true;
    return false;
}

static void metadata_checks(unsigned prefix)
{
    char junk[400];
    struct sfs_backend *be;
    struct listing l = {0};
    struct sfs_key keys[4];
    bool present[4];
    struct sfs_block_id id;

    write_block(prefix, 1, 3, S_SMALL);
    write_block(prefix, 2, 1, S_SMALL);
    write_block(prefix, 3, 5, S_SMALL);
    /* Strangers in the store: a tmp, a bad name, an uppercase name. */
    id = mkid(1);
    block_path(prefix, &id, junk, sizeof(junk), false);
    strcat(junk, ".tmp");
    close(open(junk, O_CREAT | O_WRONLY, 0644));
    block_path(prefix, &id, junk, sizeof(junk), false);
    strcpy(strrchr(junk, '/') + 1, "not-a-block");
    close(open(junk, O_CREAT | O_WRONLY, 0644));
    be = open_spec("posix:%s?dir_prefix=%u", g_root, prefix);

    keys[0] = mkkey(1, 2);
    keys[1] = mkkey(1, 3);
    keys[2] = mkkey(2, 0);
    keys[3] = mkkey(9, 0);
    cr_assert_eq(sfs_backend_exists(be, keys, 4, present), 0);
    cr_assert(present[0] && !present[1] && present[2] && !present[3]);
    id = mkid(1);
    cr_assert_eq(sfs_backend_shard_count(be, &id), 3);
    id = mkid(3);
    cr_assert_eq(sfs_backend_shard_count(be, &id), 5);
    id = mkid(9);
    cr_assert_eq(sfs_backend_shard_count(be, &id), -ENOENT);

    cr_assert_eq(sfs_backend_list(be, list_fn, &l), 0);
    cr_assert_eq(l.n, 3, "listed %d blocks", l.n);
    cr_assert(listed(&l, 1) && listed(&l, 2) && listed(&l, 3));
    l = (struct listing){.stop_after = 2};
    cr_assert_eq(sfs_backend_list(be, list_fn, &l), 7);
    cr_assert_eq(l.n, 2);

    id = mkid(1);
    cr_assert_eq(sfs_backend_touch(be, &id, 1), 0);

    /* Remove shard 3 of block 3: cuts to 3 shards; shards 0..2 intact. */
    keys[0] = mkkey(3, 3);
    cr_assert_eq(sfs_backend_remove(be, &keys[0]), 0);
    id = mkid(3);
    cr_assert_eq(sfs_backend_shard_count(be, &id), 3);
    cr_assert_eq(file_size(prefix, 3), 3 * (off_t)S_SMALL);
    {
        char *buf = malloc(S_SMALL);

        for (uint32_t s = 0; s < 3; s++) {
            struct sfs_key k = mkkey(3, s);

            cr_assert_eq(sfs_backend_load_sync(be, &k, buf, S_SMALL), (int)S_SMALL);
            cr_assert(matches(&k.block, s, 0, buf, S_SMALL));
        }
        free(buf);
    }
    cr_assert_eq(sfs_backend_remove(be, &keys[0]), -ENOENT); /* gone already */
    keys[0] = mkkey(9, 0);
    cr_assert_eq(sfs_backend_remove(be, &keys[0]), -ENOENT);
    /* Remove shard 0 of block 2: the file goes. */
    keys[0] = mkkey(2, 0);
    cr_assert_eq(sfs_backend_remove(be, &keys[0]), 0);
    cr_assert_eq(file_size(prefix, 2), -1);
    l = (struct listing){0};
    cr_assert_eq(sfs_backend_list(be, list_fn, &l), 0);
    cr_assert_eq(l.n, 2);
    cr_assert(listed(&l, 1) && listed(&l, 3) && !listed(&l, 2));
    sfs_backend_close(be);
}

Test(backend, posix_metadata_prefix0, .timeout = 30)
{
    metadata_checks(0);
}

Test(backend, posix_metadata_prefix2, .timeout = 30)
{
    metadata_checks(2);
}

Test(backend, posix_read_only, .timeout = 30)
{
    char *buf = malloc(S_SMALL);
    struct sfs_key k = mkkey(1, 0);
    struct sfs_backend *be;

    write_block(0, 1, 2, S_SMALL);
    be = open_be(g_root, S_SMALL, true);
    cr_assert_eq(sfs_backend_dump_sync(be, &k, buf, S_SMALL), -EROFS);
    cr_assert_eq(sfs_backend_remove(be, &k), -EROFS);
    cr_assert_eq(sfs_backend_load_sync(be, &k, buf, S_SMALL), (int)S_SMALL);
    sfs_backend_close(be);
    be = open_spec("posix:%s?read_only=1", g_root);
    cr_assert_eq(sfs_backend_dump_sync(be, &k, buf, S_SMALL), -EROFS);
    sfs_backend_close(be);
    free(buf);
}

/* --- specs --- */

static void expect_bad(const char *spec, uint64_t S, int want, const char *needle)
{
    struct sfs_backend_params p = {.shard_size = S};
    char err[256] = "";
    int e = 0;
    struct sfs_backend *be = sfs_backend_open(spec, &p, err, sizeof(err), &e);

    cr_assert_null(be, "spec '%s' should fail", spec);
    cr_assert_eq(e, want, "spec '%s': err %d, want %d (%s)", spec, e, want, err);
    cr_assert_neq(err[0], '\0', "spec '%s': no message", spec);
    cr_assert_null(strchr(err, '\n'), "message is one line");
    if (needle)
        cr_assert_not_null(strstr(err, needle), "spec '%s': message '%s' lacks '%s'", spec, err,
                           needle);
}

Test(backend, bad_specs, .timeout = 30)
{
    char spec[400];

    expect_bad("", S_SMALL, -EINVAL, NULL);
    expect_bad("bogus:/tmp", S_SMALL, -EINVAL, "bogus");
    expect_bad("posix:", S_SMALL, -EINVAL, "empty");
    snprintf(spec, sizeof(spec), "posix:%s?dir_prefix=33", g_root);
    expect_bad(spec, S_SMALL, -EINVAL, "dir_prefix=33");
    snprintf(spec, sizeof(spec), "posix:%s?wat=1", g_root);
    expect_bad(spec, S_SMALL, -EINVAL, "wat");
    snprintf(spec, sizeof(spec), "posix:%s?direct=2", g_root);
    expect_bad(spec, S_SMALL, -EINVAL, "direct=2");
    snprintf(spec, sizeof(spec), "posix:%s?depth=0", g_root);
    expect_bad(spec, S_SMALL, -EINVAL, "depth=0");
    snprintf(spec, sizeof(spec), "posix:%s?depth", g_root);
    expect_bad(spec, S_SMALL, -EINVAL, "depth");
    expect_bad("mem:extra", S_SMALL, -EINVAL, "extra");
    expect_bad("fault:eio=2:mem:", S_SMALL, -EINVAL, "eio");
    expect_bad("fault:latency=5:mem:", S_SMALL, -EINVAL, "latency");
    expect_bad("fault:seed=x:mem:", S_SMALL, -EINVAL, "seed");
    expect_bad("fault:eio=0.1", S_SMALL, -EINVAL, "inner");
    expect_bad("fault::bogus:", S_SMALL, -EINVAL, "bogus");
    expect_bad("mem:", 0, -EINVAL, "shard_size");
    expect_bad("/nonexistent/shardfs/dir", S_SMALL, -ENOENT, "/nonexistent/shardfs/dir");
    snprintf(spec, sizeof(spec), "posix:%s/nope", g_root);
    expect_bad(spec, S_SMALL, -ENOENT, "nope");
    expect_bad("/etc/passwd", S_SMALL, -ENOTDIR, "not a directory");
    cr_assert_null(sfs_backend_open("mem:", NULL, NULL, 0, NULL));

    /* And the good ones. */
    struct sfs_backend *be = open_be("mem:", S_SMALL, false);

    sfs_backend_close(be);
    be = open_spec("fault::posix:%s?dir_prefix=4&direct=0&depth=2&sync=1", g_root);
    sfs_backend_close(be);
    be = open_spec("fault:eio=0:fault:latency_us=1:%s", g_root);
    sfs_backend_close(be);
}

/* --- mem --- */

Test(backend, mem_basics, .timeout = 30)
{
    struct sfs_backend *be = open_be("mem:", 4096, false);
    char buf[4096], out[4096];
    struct sfs_key k = mkkey(1, 2);
    bool present[2];
    struct sfs_key keys[2] = {mkkey(1, 2), mkkey(1, 0)};
    struct listing l = {0};
    struct sfs_block_id id = mkid(1);

    cr_assert_eq(sfs_backend_load_sync(be, &k, out, sizeof(out)), -ENOENT);
    cr_assert_eq(sfs_backend_shard_count(be, &id), -ENOENT);
    fill(&k.block, 2, 0, buf, sizeof(buf));
    cr_assert_eq(sfs_backend_dump_sync(be, &k, buf, sizeof(buf)), 4096);
    cr_assert_eq(sfs_backend_load_sync(be, &k, out, sizeof(out)), 4096);
    cr_assert_eq(memcmp(buf, out, sizeof(buf)), 0);
    cr_assert_eq(sfs_backend_exists(be, keys, 2, present), 0);
    cr_assert(present[0] && !present[1]);
    cr_assert_eq(sfs_backend_shard_count(be, &id), 3);
    /* Many keys: the table grows; every one comes back. */
    for (uint32_t i = 0; i < 2000; i++) {
        struct sfs_key kk = mkkey(1000 + i % 100, i / 100);

        fill(&kk.block, kk.shard, 0, buf, sizeof(buf));
        cr_assert_eq(sfs_backend_dump_sync(be, &kk, buf, sizeof(buf)), 4096);
    }
    for (uint32_t i = 0; i < 2000; i++) {
        struct sfs_key kk = mkkey(1000 + i % 100, i / 100);

        cr_assert_eq(sfs_backend_load_sync(be, &kk, out, sizeof(out)), 4096);
        cr_assert(matches(&kk.block, kk.shard, 0, out, sizeof(out)));
    }
    cr_assert_eq(sfs_backend_list(be, list_fn, &l), 0);
    cr_assert_eq(l.n, 101);
    cr_assert_eq(sfs_backend_remove(be, &k), 0);
    cr_assert_eq(sfs_backend_remove(be, &k), -ENOENT);
    cr_assert_eq(sfs_backend_load_sync(be, &k, out, sizeof(out)), -ENOENT);
    /* A short stored shard reads short. */
    cr_assert_eq(sfs_backend_dump_sync(be, &k, buf, 100), 100);
    cr_assert_eq(sfs_backend_load_sync(be, &k, out, sizeof(out)), -EIO);
    cr_assert_eq(sfs_backend_load_sync(be, &k, out, 100), 100);
    cr_assert_eq(sfs_backend_touch(be, &id, 1), 0);
    sfs_backend_close(be);

    be = open_be("mem", 4096, true);
    cr_assert_eq(sfs_backend_dump_sync(be, &k, buf, sizeof(buf)), -EROFS);
    sfs_backend_close(be);
}

/* --- fault --- */

static void fault_pattern(const char *spec, int *results, int n)
{
    struct sfs_backend *be = open_be(spec, 4096, false);
    char buf[4096];

    for (int i = 0; i < 16; i++) {
        struct sfs_key k = mkkey(i, 0);

        fill(&k.block, 0, 0, buf, sizeof(buf));
        /* The fault backend counts dumps as requests too: these come first. */
        cr_assert_geq(sfs_backend_dump_sync(be, &k, buf, sizeof(buf)), -EIO);
    }
    for (int i = 0; i < n; i++) {
        struct sfs_key k = mkkey(i % 16, 0);

        results[i] = sfs_backend_load_sync(be, &k, buf, sizeof(buf));
        /* An injected dump -EIO left its key absent: those loads are -ENOENT. */
        if (results[i] == 4096)
            cr_assert(matches(&k.block, 0, 0, buf, sizeof(buf)));
    }
    sfs_backend_close(be);
}

Test(backend, fault_eio_deterministic, .timeout = 30)
{
    enum { N = 400 };
    int a[N], b[N], c[N];
    int eio = 0;

    /* eio applies to dumps too; with the same seed the whole sequence,
     * dumps included, repeats. */
    fault_pattern("fault:eio=0.25,seed=42:mem:", a, N);
    fault_pattern("fault:eio=0.25,seed=42:mem:", b, N);
    fault_pattern("fault:eio=0.25,seed=43:mem:", c, N);
    cr_assert_eq(memcmp(a, b, sizeof(a)), 0, "same seed, different faults");
    cr_assert_neq(memcmp(a, c, sizeof(a)), 0, "different seeds, same faults");
    for (int i = 0; i < N; i++) {
        cr_assert(a[i] == 4096 || a[i] == -EIO || a[i] == -ENOENT, "result %d", a[i]);
        eio += a[i] == -EIO;
    }
    cr_assert(eio > N / 10 && eio < N / 2, "%d injected EIOs of %d", eio, N);
}

Test(backend, fault_short_reads, .timeout = 30)
{
    struct sfs_backend *be = open_be("fault:short=1,seed=1:mem:", 4096, false);
    char buf[4096], out[4096];
    struct sfs_key k = mkkey(5, 1);
    uint64_t loads, dumps, injected;

    fill(&k.block, 1, 0, buf, sizeof(buf));
    cr_assert_eq(sfs_backend_dump_sync(be, &k, buf, sizeof(buf)), 4096); /* dumps never short */
    memset(out, 0xAA, sizeof(out));
    cr_assert_eq(sfs_backend_load_sync(be, &k, out, sizeof(out)), -EIO);
    /* The first half arrived, the rest was never written. */
    cr_assert_eq(memcmp(out, buf, 2048), 0);
    for (int i = 2048; i < 4096; i++)
        cr_assert_eq((uint8_t)out[i], 0xAA);
    sfs_fault_counts(be, &loads, &dumps, &injected);
    cr_assert_eq(loads, 1);
    cr_assert_eq(dumps, 1);
    cr_assert_eq(injected, 1);
    /* Faults off: the retry succeeds. */
    cr_assert_eq(sfs_fault_set(be, ""), 0);
    cr_assert_eq(sfs_backend_load_sync(be, &k, out, sizeof(out)), 4096);
    cr_assert_eq(memcmp(out, buf, sizeof(buf)), 0);
    cr_assert_eq(sfs_fault_set(be, "eio=1"), 0);
    cr_assert_eq(sfs_backend_load_sync(be, &k, out, sizeof(out)), -EIO);
    cr_assert_eq(sfs_fault_set(be, "eio=7"), -EINVAL);
    cr_assert_eq(sfs_fault_set(be, "eio=0"), 0);
    cr_assert_eq(sfs_backend_load_sync(be, &k, out, sizeof(out)), 4096);
    sfs_fault_counts(be, &loads, &dumps, &injected);
    cr_assert_eq(loads, 4);
    cr_assert_eq(injected, 2);
    sfs_backend_close(be);

    /* Not a fault backend. */
    be = open_be("mem:", 4096, false);
    cr_assert_eq(sfs_fault_set(be, ""), -EINVAL);
    sfs_fault_counts(be, &loads, NULL, NULL);
    cr_assert_eq(loads, 0);
    sfs_backend_close(be);
}

/* Blocks 0..n-1 written with one shard each, and a batch that loads them:
 * io[i] reads block i into bufs + i * S_SMALL. */
static void one_shard_blocks(struct batch *b, struct sfs_io *io, struct sfs_io **ios, size_t n,
                             char *bufs)
{
    for (uint64_t blk = 0; blk < n; blk++)
        write_block(0, blk, 1, S_SMALL);
    batch_prepare(b, io, ios, n, bufs, S_SMALL);
    for (size_t i = 0; i < n; i++)
        io[i].key = mkkey(i, 0);
}

Test(backend, fault_latency_does_not_block_submit, .timeout = 30)
{
    struct sfs_backend *be;
    enum { N = 32 };
    struct sfs_io io[N], *ios[N];
    char *bufs = xalloc(N * S_SMALL);
    struct batch b;
    int64_t t0, t_submit, t_done;

    one_shard_blocks(&b, io, ios, N, bufs);
    be = open_spec("fault:latency_us=300000,jitter_us=1000,seed=3:%s", g_root);
    t0 = mono_ns();
    cr_assert_eq(sfs_backend_load(be, ios, N), N);
    t_submit = mono_ns() - t0;
    pthread_mutex_lock(&b.lock);
    cr_assert_eq(b.pending, (size_t)N, "completed before the latency passed");
    pthread_mutex_unlock(&b.lock);
    batch_wait(&b);
    t_done = mono_ns() - t0;
    cr_assert_lt(t_submit, 100 * 1000000ll, "submit took %lld ns", (long long)t_submit);
    cr_assert_geq(t_done, 300 * 1000000ll, "done after %lld ns", (long long)t_done);
    cr_assert_eq(atomic_load(&b.calls), N);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(io[i].result, (int)S_SMALL);
        cr_assert(matches(&io[i].key.block, 0, 0, io[i].buf, S_SMALL));
    }
    /* Turn the latency off at run time: the next load is quick. */
    cr_assert_eq(sfs_fault_set(be, "stall_ms=0"), 0);
    t0 = mono_ns();
    cr_assert_eq(sfs_backend_load_sync(be, &io[0].key, bufs, S_SMALL), (int)S_SMALL);
    cr_assert_lt(mono_ns() - t0, 200 * 1000000ll);
    /* A stall on every 2nd request. */
    cr_assert_eq(sfs_fault_set(be, "stall_ms=150,stall_every=2"), 0);
    {
        int64_t d[4];

        for (int i = 0; i < 4; i++) {
            t0 = mono_ns();
            cr_assert_eq(sfs_backend_load_sync(be, &io[i].key, bufs, S_SMALL), (int)S_SMALL);
            d[i] = mono_ns() - t0;
        }
        /* Requests are numbered from open; which two stall depends only on that. */
        int slow = 0;

        for (int i = 0; i < 4; i++)
            slow += d[i] >= 150 * 1000000ll;
        cr_assert_eq(slow, 2, "stalls: %d of 4", slow);
    }
    sfs_backend_close(be);
    free(bufs);
}

/* "each missing key loaded exactly once": the fault backend counts loads. */
Test(backend, fault_counts_loads_over_posix_with_faults, .timeout = 30)
{
    struct sfs_backend *be;
    enum { N = 64 };
    struct sfs_io io[N], *ios[N];
    char *bufs = xalloc(N * S_SMALL);
    struct batch b;
    uint64_t loads, injected;
    int failed = 0;

    one_shard_blocks(&b, io, ios, N, bufs);
    be = open_spec("fault:eio=0.2,short=0.2,latency_us=100,jitter_us=500,seed=9:"
                   "posix:%s?depth=8",
                   g_root);
    cr_assert_eq(sfs_backend_load(be, ios, N), N);
    batch_wait(&b);
    cr_assert_eq(atomic_load(&b.calls), N);
    for (int i = 0; i < N; i++) {
        if (io[i].result == -EIO) {
            failed++;
            continue;
        }
        cr_assert_eq(io[i].result, (int)S_SMALL);
        cr_assert(matches(&io[i].key.block, 0, 0, io[i].buf, S_SMALL));
    }
    sfs_fault_counts(be, &loads, NULL, &injected);
    cr_assert_eq(loads, N);
    cr_assert_eq(injected, (uint64_t)failed);
    cr_assert_gt(failed, 0);
    /* Retry the failures with faults off: all succeed. */
    cr_assert_eq(sfs_fault_set(be, ""), 0);
    for (int i = 0; i < N; i++)
        if (io[i].result == -EIO)
            cr_assert_eq(sfs_backend_load_sync(be, &io[i].key, io[i].buf, S_SMALL), (int)S_SMALL);
    sfs_fault_counts(be, &loads, NULL, NULL);
    cr_assert_eq(loads, N + (uint64_t)failed);
    sfs_backend_close(be);
    free(bufs);
}
