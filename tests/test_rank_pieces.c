/* SPDX-License-Identifier: MIT */
/*
 * test_rank_pieces.c - entries made of pieces (sfs_rank_loadv,
 * sfs_rank_dumpv), and the host copier's check of every address it would
 * touch.
 *
 * An engine's page is often K here and V there (SGLang's host pool), or one
 * row per layer (vLLM through UCM): the pieces are moved as they are, one
 * copy each, no staging buffer. The shard's bytes are the pieces one after
 * the other, so a vectored dump reads back whole through a plain load (and
 * through the store), and a plain dump reads back into pieces. Loads go
 * both ways the library copies: inline on the submitting thread (a small
 * resident task) and through the dispatcher and copier thread (a miss
 * loaded from the store).
 *
 * The address check: a rank that copies with memcpy must refuse an address
 * the CPU cannot write (a load) or read (a dump) -- what a GPU worker's
 * device pointer is to a library built without CUDA -- with -EFAULT at
 * submit; before the check, the copier thread died of SIGSEGV there.
 */
#include "rankenv.h"
#include "testutil.h"

#include <shardfs/rank.h>

#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define NPIECE 3

/* A page as an engine keeps it: NPIECE pieces of unequal lengths, each in
 * its own allocation, adding up to less than a shard. */
static const uint64_t piece_len[NPIECE] = {5000, 9000, 3000};

static uint64_t pieces_total(void)
{
    return piece_len[0] + piece_len[1] + piece_len[2];
}

static void pieces_alloc(uint8_t *p[NPIECE], struct sfs_rank_piece v[NPIECE])
{
    for (int j = 0; j < NPIECE; j++) {
        p[j] = malloc(piece_len[j]);
        cr_assert_not_null(p[j]);
        v[j] = (struct sfs_rank_piece){p[j], piece_len[j]};
    }
}

static void pieces_free(uint8_t *p[NPIECE])
{
    for (int j = 0; j < NPIECE; j++)
        free(p[j]);
}

/* Piece j of entry i holds bytes derived from (i, j, offset). */
static uint8_t byte_of(uint32_t i, int j, uint64_t off)
{
    return (uint8_t)(i * 131 + (uint32_t)j * 31 + off * 7 + 1);
}

static int wait_task(struct sfs_task *t, int *st)
{
    int r = sfs_rank_wait(t, 20000, st);

    sfs_rank_task_free(t);
    return r;
}

Test(rank_pieces, dumpv_reads_back_whole_and_in_pieces, .timeout = 60)
{
    enum { N = 4 };
    struct env e;
    char spec[256];
    uint8_t *p[N][NPIECE], *got[N][NPIECE];
    struct sfs_rank_piece v[N][NPIECE], w[N][NPIECE];
    struct sfs_rank_entryv ent[N], back[N];
    struct sfs_rank_entry flat[N];
    uint8_t *whole = malloc((size_t)N * SHARD);
    struct sfs_task *t;
    int st[N];

    cr_assert_not_null(whole);
    env_up(&e, 64, 0);
    write_store(e.dir, 1000, 1, 1, SHARD); /* an existing store, other blocks */
    snprintf(spec, sizeof(spec), "posix:%s", e.dir);
    struct sfs_rank *rk = rank_here(&e, spec, 0, 0);
    for (uint32_t i = 0; i < N; i++) {
        pieces_alloc(p[i], v[i]);
        pieces_alloc(got[i], w[i]);
        for (int j = 0; j < NPIECE; j++)
            for (uint64_t o = 0; o < piece_len[j]; o++)
                p[i][j][o] = byte_of(i, j, o);
        ent[i] = (struct sfs_rank_entryv){tu_block(200 + i), 2, NPIECE, v[i]};
        back[i] = (struct sfs_rank_entryv){tu_block(200 + i), 2, NPIECE, w[i]};
        flat[i] = (struct sfs_rank_entry){tu_block(200 + i), 2, whole + (size_t)i * SHARD};
    }
    cr_assert_eq(sfs_rank_dumpv(rk, ent, N, &t), 0);
    memset(v, 0, sizeof(v)); /* the pieces were copied at submit */
    cr_assert_eq(wait_task(t, st), 0);
    for (uint32_t i = 0; i < N; i++)
        cr_assert_eq(st[i], 0, "dumpv %u: %d", i, st[i]);

    /* Whole, through a plain load: the pieces one after the other, then
     * zeros up to the shard size. */
    memset(whole, 0xee, (size_t)N * SHARD);
    cr_assert_eq(sfs_rank_load(rk, flat, N, &t), 0);
    cr_assert_eq(wait_task(t, st), 0);
    for (uint32_t i = 0; i < N; i++) {
        const uint8_t *s = whole + (size_t)i * SHARD;
        uint64_t off = 0;

        cr_assert_eq(st[i], 0);
        for (int j = 0; j < NPIECE; j++)
            for (uint64_t o = 0; o < piece_len[j]; o++, off++)
                cr_assert_eq(s[off], byte_of(i, j, o), "entry %u piece %d byte %lu", i, j,
                             (unsigned long)o);
        for (; off < SHARD; off++)
            cr_assert_eq(s[off], 0, "entry %u: byte %lu after the pieces is not 0", i,
                         (unsigned long)off);
    }

    /* In pieces, resident (the inline path): each piece gets its bytes. */
    cr_assert_eq(sfs_rank_loadv(rk, back, N, &t), 0);
    cr_assert_eq(wait_task(t, st), 0);
    for (uint32_t i = 0; i < N; i++) {
        cr_assert_eq(st[i], 0);
        for (int j = 0; j < NPIECE; j++)
            cr_assert_eq(memcmp(got[i][j], p[i][j], piece_len[j]), 0, "entry %u piece %d", i, j);
    }

    /* In pieces, from the store (owner loads, the copier thread). */
    for (uint32_t i = 0; i < N; i++) {
        struct sfs_key k = {tu_block(200 + i), 2};

        cr_assert_eq(sfs_cache_remove(e.c, &k), 0);
        for (int j = 0; j < NPIECE; j++)
            memset(got[i][j], 0, piece_len[j]);
    }
    cr_assert_eq(sfs_rank_loadv(rk, back, N, &t), 0);
    cr_assert_eq(wait_task(t, st), 0);
    for (uint32_t i = 0; i < N; i++) {
        cr_assert_eq(st[i], 0, "loadv from the store %u: %d", i, st[i]);
        for (int j = 0; j < NPIECE; j++)
            cr_assert_eq(memcmp(got[i][j], p[i][j], piece_len[j]), 0, "entry %u piece %d", i, j);
    }
    struct sfs_rank_stats s;
    sfs_rank_stats(rk, &s);
    cr_assert_eq(s.dumps_bounced, 0);
    cr_assert_eq(s.owner_loads, N);
    sfs_rank_close(rk);
    for (uint32_t i = 0; i < N; i++) {
        pieces_free(p[i]);
        pieces_free(got[i]);
    }
    free(whole);
    env_down(&e);
}

Test(rank_pieces, a_plain_dump_loads_into_pieces, .timeout = 60)
{
    struct env e;
    char spec[256];
    uint8_t *got[NPIECE];
    struct sfs_rank_piece w[NPIECE];
    uint8_t *want = malloc(SHARD);
    struct sfs_task *t;
    int st[1];

    env_up(&e, 64, 0);
    write_store(e.dir, 300, 1, 4, SHARD);
    snprintf(spec, sizeof(spec), "posix:%s", e.dir);
    struct sfs_rank *rk = rank_here(&e, spec, 0, 0);
    struct sfs_key k = tu_key(300, 3);
    tu_fill(&k, want, SHARD);
    pieces_alloc(got, w);
    struct sfs_rank_entryv ent = {k.block, 3, NPIECE, w};
    cr_assert_eq(sfs_rank_loadv(rk, &ent, 1, &t), 0);
    cr_assert_eq(wait_task(t, st), 0);
    cr_assert_eq(st[0], 0);
    uint64_t off = 0;
    for (int j = 0; j < NPIECE; j++) {
        cr_assert_eq(memcmp(got[j], want + off, piece_len[j]), 0, "piece %d", j);
        off += piece_len[j];
    }
    cr_assert_eq(off, pieces_total());
    sfs_rank_close(rk);
    pieces_free(got);
    free(want);
    env_down(&e);
}

Test(rank_pieces, bad_piece_lists_are_refused, .timeout = 30)
{
    struct env e;
    uint8_t *buf = malloc(2 * SHARD);
    struct sfs_task *t = NULL;

    env_up(&e, 64, 0);
    struct sfs_rank *rk = rank_here(&e, NULL, 0, 0);
    struct sfs_rank_piece too_long[2] = {{buf, SHARD}, {buf + SHARD, 1}};
    struct sfs_rank_piece empty[1] = {{buf, 0}};
    struct sfs_rank_piece null[1] = {{NULL, 16}};
    struct sfs_rank_piece many[SFS_RANK_PIECES_MAX + 1];
    for (int j = 0; j <= SFS_RANK_PIECES_MAX; j++)
        many[j] = (struct sfs_rank_piece){buf + j, 1};
    struct sfs_rank_entryv bad[] = {
        {tu_block(1), 0, 2, too_long}, {tu_block(1), 0, 1, empty},
        {tu_block(1), 0, 1, null},     {tu_block(1), 0, 0, null},
        {tu_block(1), 0, 1, NULL},     {tu_block(1), 0, SFS_RANK_PIECES_MAX + 1, many},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(sfs_rank_loadv(rk, &bad[i], 1, &t), -EINVAL, "load case %zu", i);
        cr_assert_eq(sfs_rank_dumpv(rk, &bad[i], 1, &t), -EINVAL, "dump case %zu", i);
    }
    /* SFS_RANK_PIECES_MAX pieces are fine. */
    struct sfs_rank_entryv ok = {tu_block(1), 0, SFS_RANK_PIECES_MAX, many};
    int st[1];
    cr_assert_eq(sfs_rank_dumpv(rk, &ok, 1, &t), 0);
    cr_assert_eq(wait_task(t, st), 0);
    cr_assert_eq(st[0], 0);
    sfs_rank_close(rk);
    free(buf);
    env_down(&e);
}

/* An address the CPU cannot touch: a reservation without access (as CUDA
 * keeps device ranges), one never mapped, one the CPU may read but not
 * write. Loads of each are -EFAULT at submit, nothing queued, the rank
 * alive; a dump may read the read-only one. Plain and vectored. */
Test(rank_pieces, host_copier_refuses_addresses_it_cannot_touch, .timeout = 60)
{
    struct env e;
    char spec[256];
    struct sfs_task *t = NULL;
    int st[1];

    env_up(&e, 64, 0);
    write_store(e.dir, 400, 1, 1, SHARD);
    snprintf(spec, sizeof(spec), "posix:%s", e.dir);
    struct sfs_rank *rk = rank_here(&e, spec, 0, 0);
    cr_assert_str_eq(sfs_rank_copier_name(rk), "host");
    uint8_t *none = mmap(NULL, 4 * SHARD, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *ro = mmap(NULL, 2 * SHARD, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *gone = (uint8_t *)(uintptr_t)0x1000; /* below mmap_min_addr: never mapped */
    cr_assert(none != MAP_FAILED && ro != MAP_FAILED);
    /* Writable memory running on into the reservation. */
    uint8_t *edge =
        mmap(NULL, 2 * SHARD, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(edge != MAP_FAILED);
    cr_assert_eq(mprotect(edge + SHARD, SHARD, PROT_NONE), 0);

    uint8_t *bad[] = {none + SHARD, ro, edge + SHARD / 2};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct sfs_rank_entry ent = {tu_block(400), 0, bad[i]};
        struct sfs_rank_piece pc[2] = {{bad[i], 100}, {bad[i] + SHARD / 2, 100}};
        struct sfs_rank_entryv ev = {tu_block(400), 0, 2, pc};

        cr_assert_eq(sfs_rank_load(rk, &ent, 1, &t), -EFAULT, "load case %zu", i);
        cr_assert_eq(sfs_rank_loadv(rk, &ev, 1, &t), -EFAULT, "loadv case %zu", i);
    }
    struct sfs_rank_entry unmapped = {tu_block(400), 0, gone};
    cr_assert_eq(sfs_rank_load(rk, &unmapped, 1, &t), -EFAULT);
    struct sfs_rank_entry dump_none = {tu_block(401), 0, none};
    cr_assert_eq(sfs_rank_dump(rk, &dump_none, 1, &t), -EFAULT);
    /* Read-only memory is a fine source. */
    struct sfs_rank_entry dump_ro = {tu_block(401), 0, ro};
    cr_assert_eq(sfs_rank_dump(rk, &dump_ro, 1, &t), 0);
    cr_assert_eq(wait_task(t, st), 0);
    cr_assert_eq(st[0], 0);
    /* The rank still works. */
    uint8_t *buf = malloc(SHARD);
    struct sfs_rank_entry good = {tu_block(400), 0, buf};
    cr_assert_eq(sfs_rank_load(rk, &good, 1, &t), 0);
    cr_assert_eq(wait_task(t, st), 0);
    check_bufs(400, 1, 0, buf, st);
    sfs_rank_close(rk);
    munmap(none, 4 * SHARD);
    munmap(ro, 2 * SHARD);
    munmap(edge, 2 * SHARD);
    free(buf);
    env_down(&e);
}

/* Many small pieces: more copies than one batch holds (and than the inline
 * path takes), so items are split across batches whole, never torn. */
Test(rank_pieces, more_pieces_than_a_batch, .timeout = 60)
{
    enum { N = 100, K = 32, LEN = SHARD / K };
    struct env e;
    char spec[256];
    uint8_t *src = malloc((size_t)N * SHARD), *dst = malloc((size_t)N * SHARD);
    static struct sfs_rank_piece ps[N][K], pd[N][K];
    struct sfs_rank_entryv es[N], ed[N];
    struct sfs_task *t;
    int st[N];

    env_up(&e, 256, 0);
    write_store(e.dir, 1000, 1, 1, SHARD);
    snprintf(spec, sizeof(spec), "posix:%s", e.dir);
    struct sfs_rank *rk = rank_here(&e, spec, 0, 0);
    for (uint32_t i = 0; i < N; i++) {
        struct sfs_key k = tu_key(500 + i, 0);

        tu_fill(&k, src + (size_t)i * SHARD, SHARD);
        /* Pieces in reverse order of their place in memory: a scatter. */
        for (int j = 0; j < K; j++) {
            ps[i][j] =
                (struct sfs_rank_piece){src + (size_t)i * SHARD + (size_t)(K - 1 - j) * LEN, LEN};
            pd[i][j] =
                (struct sfs_rank_piece){dst + (size_t)i * SHARD + (size_t)(K - 1 - j) * LEN, LEN};
        }
        es[i] = (struct sfs_rank_entryv){k.block, 0, K, ps[i]};
        ed[i] = (struct sfs_rank_entryv){k.block, 0, K, pd[i]};
    }
    cr_assert_eq(sfs_rank_dumpv(rk, es, N, &t), 0);
    cr_assert_eq(wait_task(t, st), 0);
    for (int i = 0; i < N; i++)
        cr_assert_eq(st[i], 0, "dumpv %d: %d", i, st[i]);
    for (int pass = 0; pass < 2; pass++) { /* resident, then from the store */
        memset(dst, 0, (size_t)N * SHARD);
        cr_assert_eq(sfs_rank_loadv(rk, ed, N, &t), 0);
        cr_assert_eq(wait_task(t, st), 0);
        for (int i = 0; i < N; i++)
            cr_assert_eq(st[i], 0, "pass %d loadv %d: %d", pass, i, st[i]);
        cr_assert_eq(memcmp(src, dst, (size_t)N * SHARD), 0, "pass %d", pass);
        for (uint32_t i = 0; i < N; i++) {
            struct sfs_key k = tu_key(500 + i, 0);

            cr_assert_eq(sfs_cache_remove(e.c, &k), 0);
        }
    }
    /* The store holds each shard as its pieces in piece order: here the
     * source's chunks reversed. */
    cr_assert_eq(load_sync(rk, 500, N, 0, dst, st), 0);
    for (uint32_t i = 0; i < N; i++) {
        cr_assert_eq(st[i], 0);
        for (int j = 0; j < K; j++)
            cr_assert_eq(memcmp(dst + (size_t)i * SHARD + (size_t)j * LEN,
                                src + (size_t)i * SHARD + (size_t)(K - 1 - j) * LEN, LEN),
                         0, "entry %u chunk %d", i, j);
    }
    sfs_rank_close(rk);
    free(src);
    free(dst);
    env_down(&e);
}
