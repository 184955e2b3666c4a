/* SPDX-License-Identifier: MIT */
/*
 * test_rank_cuda.c - libshardfs-rank's CUDA copier: placement of every end
 * (device, pinned, registered, pageable), dumps, two ranks in one process,
 * odd lengths and alignments, a hugetlb data plane, other devices.
 *
 * Built where the CUDA copier is. On a GPU machine it runs against the real
 * runtime (tests/bench/gpu_check.sh); under ctest, against the fake
 * libcudart in fakecuda/ (rank_cuda_fake*), which checks the copier's host
 * logic only. Without a device every test skips (SHARDFS_TEST_REQUIRE_CUDA=N
 * makes that a failure). Test names keep the rank suite's "rank/cuda_*".
 */
#include "rankenv.h"
#include "testutil.h"

#include <shardfs/rank.h>

#include <criterion/criterion.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------
 * The CUDA copier (skipped without a GPU). The CUDA runtime is reached with
 * dlopen so this file builds and runs the same with or without the toolkit.
 * The copier runs on its own non-blocking stream, so the tests synchronize
 * the device after filling a dump's source, as a program must.
 */

struct cudart {
    void *h;
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*memcpy_)(void *, const void *, size_t, int);
    int (*memset_)(void *, int, size_t);
    int (*malloc_host)(void **, size_t);
    int (*free_host)(void *);
    int (*host_register)(void *, size_t, unsigned);
    int (*host_unregister)(void *);
    int (*sync)(void);
    int (*device_count)(int *);
    int (*set_device)(int);
    int (*get_device)(int *);
};

static bool cudart_open(struct cudart *c)
{
    /* The runtime the library loaded, whichever its version: a second one
     * in the process would be a second set of runtime state. */
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                        "libcudart.so"};

    c->h = NULL;
    for (size_t i = 0; i < 4 && !c->h; i++)
        c->h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
    for (size_t i = 0; i < 4 && !c->h; i++)
        c->h = dlopen(names[i], RTLD_NOW);
    if (!c->h)
        return false;
#define CUDART_SYM(f, name) (c->f = (__typeof__(c->f))dlsym(c->h, name))
    return CUDART_SYM(malloc_, "cudaMalloc") && CUDART_SYM(free_, "cudaFree") &&
           CUDART_SYM(memcpy_, "cudaMemcpy") && CUDART_SYM(memset_, "cudaMemset") &&
           CUDART_SYM(malloc_host, "cudaMallocHost") && CUDART_SYM(free_host, "cudaFreeHost") &&
           CUDART_SYM(host_register, "cudaHostRegister") &&
           CUDART_SYM(host_unregister, "cudaHostUnregister") &&
           CUDART_SYM(sync, "cudaDeviceSynchronize") &&
           CUDART_SYM(device_count, "cudaGetDeviceCount") &&
           CUDART_SYM(set_device, "cudaSetDevice") && CUDART_SYM(get_device, "cudaGetDevice");
#undef CUDART_SYM
}

#define CUDA_H2D     1
#define CUDA_D2H     2
#define CUDA_DEFAULT 4
#define LOG_WARN_LVL 4 /* syslog's LOG_WARNING */
#define LOG_INFO_LVL 6 /* syslog's LOG_INFO */

/* The copier's log lines: shown (a slow fallback is otherwise silent) and
 * kept for the tests that check the data plane is mapped. */
static char cuda_info[256];
static int cuda_warnings;

static void cuda_log(int level, const char *msg, void *arg)
{
    if (!strstr(msg, "cuda copier"))
        return;
    fprintf(stderr, "[copier log, level %d] %s\n", level, msg);
    if (level <= LOG_WARN_LVL)
        cuda_warnings++;
    else
        snprintf(cuda_info, sizeof(cuda_info), "%s", msg);
}

/* SHARDFS_TEST_REQUIRE_CUDA=N: a run that must test the CUDA copier on N
 * devices (the fake-runtime ctest entries, a GPU check), where a skip for
 * want of a device would be a silent pass. 0 when unset. */
static int cuda_required(void)
{
    const char *e = getenv("SHARDFS_TEST_REQUIRE_CUDA");

    return e ? atoi(e) : 0;
}

/* Skip without a GPU (fail when one is required); otherwise the runtime,
 * and the copier's log. */
static void cuda_need(struct cudart *cu)
{
    if (sfs_rank_cuda_devices() <= 0) {
        cr_assert_leq(cuda_required(), 0,
                      "no CUDA device, and SHARDFS_TEST_REQUIRE_CUDA=%d says there must be",
                      cuda_required());
        cr_skip_test("no CUDA device (or built without CUDA): CUDA copier not tested");
    }
    cr_assert(cudart_open(cu), "libcudart not loadable");
    sfs_set_log(cuda_log, NULL, LOG_INFO_LVL);
}

static struct sfs_rank *cuda_rank(const char *sock, int device)
{
    struct sfs_rank_config cfg;
    struct sfs_rank *rk;
    int err = 0;

    sfs_rank_config_init(&cfg);
    cfg.socket_path = sock;
    cfg.device_id = device;
    cfg.copier = SFS_COPIER_CUDA;
    cfg.prealloc = false;
    rk = sfs_rank_open(&cfg, &err);
    cr_assert_not_null(rk, "CUDA rank on device %d: %d", device, err);
    cr_assert_str_eq(sfs_rank_copier_name(rk), "cuda");
    return rk;
}

/* A served cache of SHARD shards with its own data-plane geometry; false if
 * it cannot be made (huge pages asked for and none reserved). */
static bool cuda_env_up(struct env *e, uint32_t nslots, uint64_t segment_size, int hugepages)
{
    struct sfs_cache_config cfg = {
        .shard_size = SHARD,
        .nslots = nslots,
        .no_reserved = true,
        .segment_size = segment_size,
        .hugepages = hugepages,
    };
    int err = 0;

    snprintf(e->sock, sizeof(e->sock), "%s", tu_path("sock"));
    snprintf(e->dir, sizeof(e->dir), "%s", tu_path("store"));
    e->c = sfs_cache_create(&cfg, &err);
    if (!e->c)
        return false;
    cr_assert_eq(sfs_cache_serve(e->c, e->sock), 0);
    return true;
}

/* Keys [first, first + n) of shard 0 Ready in the cache, key i holding
 * len_of(i) bytes (SHARD when NULL), as a backend load leaves them. */
static void cuda_fill(struct sfs_cache *c, uint64_t first, uint32_t n, uint32_t (*len_of)(uint32_t))
{
    for (uint32_t i = 0; i < n; i++) {
        struct sfs_key k = tu_key(first + i, 0);
        uint32_t len = len_of ? len_of(i) : SHARD;
        struct sfs_lease l;

        cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &l), SFS_OWNER);
        tu_fill(&k, sfs_cache_data(c, &l), len);
        cr_assert_eq(sfs_cache_publish(c, &l, len, 0), 0);
        cr_assert_eq(sfs_cache_release(c, &l), 0);
    }
}

/* One task of keys [first, first + n) at addr[i]; every entry succeeds. */
static void cuda_task(struct sfs_rank *rk, bool dump, uint64_t first, uint32_t n, void **addr)
{
    struct sfs_rank_entry *ent = calloc(n, sizeof(*ent));
    int *st = calloc(n, sizeof(*st));
    struct sfs_task *t;

    cr_assert(ent && st);
    for (uint32_t i = 0; i < n; i++)
        ent[i] = (struct sfs_rank_entry){tu_block(first + i), 0, addr[i]};
    cr_assert_eq(dump ? sfs_rank_dump(rk, ent, n, &t) : sfs_rank_load(rk, ent, n, &t), 0);
    cr_assert_eq(sfs_rank_wait(t, 60000, st), 0);
    sfs_rank_task_free(t);
    for (uint32_t i = 0; i < n; i++)
        cr_assert_eq(st[i], 0, "%s entry %u: %d", dump ? "dump" : "load", i, st[i]);
    free(ent);
    free(st);
}

/* One task of keys [first, first + n) at n consecutive shards from base. */
static void cuda_task_at(struct sfs_rank *rk, bool dump, uint64_t first, uint32_t n, uint8_t *base)
{
    void **addr = calloc(n, sizeof(*addr));

    cr_assert_not_null(addr);
    for (uint32_t i = 0; i < n; i++)
        addr[i] = base + (size_t)i * SHARD;
    cuda_task(rk, dump, first, n, addr);
    free(addr);
}

/* Keys [first, first + n) in n consecutive shards of host memory at buf, of
 * entries that succeeded (cuda_task checked their status). */
static void cuda_check(uint64_t first, uint32_t n, const uint8_t *buf)
{
    int *st = calloc(n, sizeof(*st));

    cr_assert_not_null(st);
    check_bufs(first, n, 0, buf, st);
    free(st);
}

/* A CUDA test's world: the runtime, a served cache, the rank under test,
 * and the memory the test made. cuda_down undoes whichever are set, the
 * rank first. */
struct cuda_fx {
    struct cudart cu;
    struct env e;
    struct sfs_rank *rk; /* the helpers below run their tasks on it */
    uint8_t *host;       /* pageable (malloc): the staging buffer */
    uint8_t *pinned;     /* cudaMallocHost */
    uint8_t *dev[2];     /* cudaMalloc, on whichever device was current */
};

/* cuda_need (skip without a GPU), then host_bytes of pageable memory (none
 * for 0). No cache yet: cuda_served, env_up or cuda_env_up makes it. */
static void cuda_up(struct cuda_fx *f, size_t host_bytes)
{
    memset(f, 0, sizeof(*f));
    cuda_need(&f->cu);
    if (host_bytes) {
        f->host = malloc(host_bytes);
        cr_assert_not_null(f->host);
    }
}

/* Skip with fewer than two devices (fail when two are required); what says
 * what goes untested. */
static void cuda_need_two(struct cuda_fx *f, const char *what)
{
    int ndev = 0;

    cr_assert_eq(f->cu.device_count(&ndev), 0);
    if (ndev < 2) {
        cr_assert_lt(cuda_required(), 2, "one CUDA device, and SHARDFS_TEST_REQUIRE_CUDA=%d",
                     cuda_required());
        cr_skip_test("needs two CUDA devices: %s not tested", what);
    }
}

/* A served cache of 4n slots with keys [first, first + n) Ready in it. */
static void cuda_served(struct cuda_fx *f, uint32_t n, uint64_t first)
{
    env_up(&f->e, 4 * n, 0);
    cuda_fill(f->e.c, first, n, NULL);
}

/* bytes of device memory on the current device (two at most). */
static uint8_t *cuda_dev(struct cuda_fx *f, size_t bytes)
{
    uint8_t **d = f->dev[0] ? &f->dev[1] : &f->dev[0];

    cr_assert_null(*d, "a third device buffer");
    cr_assert_eq(f->cu.malloc_((void **)d, bytes), 0);
    return *d;
}

/* bytes of pinned host memory (one buffer). */
static uint8_t *cuda_pinned(struct cuda_fx *f, size_t bytes)
{
    cr_assert_null(f->pinned, "a second pinned buffer");
    cr_assert_eq(f->cu.malloc_host((void **)&f->pinned, bytes), 0);
    return f->pinned;
}

/* Keys [first, first + n) loaded into n shards of device memory at dev, and
 * checked in the staging buffer after a cudaMemcpy of the given kind. */
static void cuda_load_device(struct cuda_fx *f, uint64_t first, uint32_t n, uint8_t *dev, int kind)
{
    cuda_task_at(f->rk, false, first, n, dev);
    cr_assert_eq(f->cu.memcpy_(f->host, dev, (size_t)n * SHARD, kind), 0);
    cuda_check(first, n, f->host);
}

/* Keys [first, first + n) written into n shards of device memory at dev
 * (from the staging buffer, by a cudaMemcpy of the given kind) and dumped
 * from there. From pageable memory cudaMemcpy may return before its DMA is
 * done, and the copier's stream does not wait for the legacy one: hence the
 * synchronize. */
static void cuda_dump_device(struct cuda_fx *f, uint64_t first, uint32_t n, uint8_t *dev, int kind)
{
    for (uint32_t i = 0; i < n; i++) {
        struct sfs_key k = tu_key(first + i, 0);

        tu_fill(&k, f->host + (size_t)i * SHARD, SHARD);
    }
    cr_assert_eq(f->cu.memcpy_(dev, f->host, (size_t)n * SHARD, kind), 0);
    cr_assert_eq(f->cu.sync(), 0);
    cuda_task_at(f->rk, true, first, n, dev);
}

/* Keys [first, first + n) loaded into the zeroed staging buffer (the CPU
 * path), and checked. */
static void cuda_load_host(struct cuda_fx *f, uint64_t first, uint32_t n)
{
    memset(f->host, 0, (size_t)n * SHARD);
    cuda_task_at(f->rk, false, first, n, f->host);
    cuda_check(first, n, f->host);
}

static void cuda_down(struct cuda_fx *f)
{
    if (f->rk)
        sfs_rank_close(f->rk);
    for (int i = 0; i < 2; i++)
        if (f->dev[i])
            f->cu.free_(f->dev[i]);
    if (f->pinned)
        f->cu.free_host(f->pinned);
    free(f->host);
    env_down(&f->e);
}

Test(rank, cuda_load_dump_device_memory, .timeout = 120)
{
    struct cuda_fx f;
    char spec[256];
    const uint32_t n = 64;
    struct sfs_rank_config cfg;
    struct sfs_rank_entry ent[64];
    struct sfs_task *t;
    int st[64], err = 0;

    cuda_up(&f, (size_t)n * SHARD);
    env_up(&f.e, 4 * n, 0);
    write_store(f.e.dir, 0, n, 1, SHARD);
    snprintf(spec, sizeof(spec), "%s", f.e.dir);
    sfs_rank_config_init(&cfg);
    cfg.socket_path = f.e.sock;
    cfg.device_id = 0;
    cfg.backend = spec;
    cfg.copier = SFS_COPIER_CUDA;
    struct sfs_rank *rk = f.rk = sfs_rank_open(&cfg, &err);
    cr_assert_not_null(rk, "open: %d", err);
    cr_assert_str_eq(sfs_rank_copier_name(rk), "cuda");
    uint8_t *host = f.host, *dev = cuda_dev(&f, (size_t)n * SHARD),
            *pinned = cuda_pinned(&f, (size_t)n * SHARD);

    /* Load into device memory (twice: misses, then hits). */
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < n; i++)
            ent[i] = (struct sfs_rank_entry){tu_block(i), 0, dev + (size_t)i * SHARD};
        cr_assert_eq(sfs_rank_load(rk, ent, n, &t), 0);
        cr_assert_eq(sfs_rank_wait(t, 30000, st), 0);
        sfs_rank_task_free(t);
        memset(host, 0, (size_t)n * SHARD);
        cr_assert_eq(f.cu.memcpy_(host, dev, (size_t)n * SHARD, CUDA_D2H), 0);
        check_bufs(0, n, 0, host, st);
    }
    /* Load into pinned host memory and pageable host memory. */
    for (uint32_t i = 0; i < n; i++)
        ent[i] = (struct sfs_rank_entry){
            tu_block(i), 0, i % 2 ? pinned + (size_t)i * SHARD : host + (size_t)i * SHARD};
    memset(host, 0, (size_t)n * SHARD);
    memset(pinned, 0, (size_t)n * SHARD);
    cr_assert_eq(sfs_rank_load(rk, ent, n, &t), 0);
    cr_assert_eq(sfs_rank_wait(t, 30000, st), 0);
    sfs_rank_task_free(t);
    for (uint32_t i = 0; i < n; i++) {
        struct sfs_key k = tu_key(i, 0);

        cr_assert_eq(st[i], 0);
        cr_assert_eq(tu_check(&k, (uint8_t *)ent[i].addr, SHARD), -1, "entry %u", i);
    }
    /* Dump from device memory (new keys), then load them back. */
    for (uint32_t i = 0; i < n; i++) {
        struct sfs_key k = tu_key(500 + i, 0);

        tu_fill(&k, host + (size_t)i * SHARD, SHARD);
        ent[i] = (struct sfs_rank_entry){k.block, 0, dev + (size_t)i * SHARD};
    }
    /* From pageable memory cudaMemcpy may return before its DMA is done,
     * and the copier's stream does not wait for the legacy one. */
    cr_assert_eq(f.cu.memcpy_(dev, host, (size_t)n * SHARD, CUDA_H2D), 0);
    cr_assert_eq(f.cu.sync(), 0);
    cr_assert_eq(sfs_rank_dump(rk, ent, n, &t), 0);
    cr_assert_eq(sfs_rank_wait(t, 30000, st), 0);
    sfs_rank_task_free(t);
    for (uint32_t i = 0; i < n; i++)
        cr_assert_eq(st[i], 0, "dump %u: %d", i, st[i]);
    assert_no_leases(f.e.c); /* drop them: the next load reads the backend */
    memset(host, 0, (size_t)n * SHARD);
    for (uint32_t i = 0; i < n; i++)
        ent[i].addr = host + (size_t)i * SHARD;
    cr_assert_eq(sfs_rank_load(rk, ent, n, &t), 0);
    cr_assert_eq(sfs_rank_wait(t, 30000, st), 0);
    sfs_rank_task_free(t);
    check_bufs(500, n, 0, host, st);
    cuda_down(&f);
}

Test(rank, cuda_data_plane_is_mapped, .timeout = 60)
{
    /* Every data-plane piece registered and mapped for the kernel: the fast
     * path. A piece that is not still copies (cudaMemcpyAsync), slowly; this
     * test is what says so. Many small segments: one registration each. */
    struct cuda_fx f;
    unsigned a = 0, b = 1;

    cuda_up(&f, 0);
    cr_assert(cuda_env_up(&f.e, 256, 2u << 20, SFS_HUGEPAGES_OFF));
    cuda_warnings = 0;
    cuda_info[0] = '\0';
    f.rk = cuda_rank(f.e.sock, 0);
    cr_assert_eq(sscanf(cuda_info, "cuda copier: device 0: %u of %u", &a, &b), 2, "log: '%s'",
                 cuda_info);
    cr_assert(a == b && a >= 4, "%u of %u data-plane pieces mapped", a, b);
    cr_assert_eq(cuda_warnings, 0);
    cuda_down(&f);
}

Test(rank, cuda_two_ranks_in_one_process, .timeout = 120)
{
    /* Two CUDA ranks of one process on one cache, loading at once; closing
     * one leaves the other's registrations alone. Then a new cache, whose
     * mapping may reuse the freed addresses: a registration left behind
     * would pin the old pages and show them to the GPU. */
    struct cuda_fx f;
    const uint32_t n = 64;
    struct sfs_rank_entry ent[2][64];
    struct sfs_task *t[2];
    int st[2][64];

    cuda_up(&f, 2 * (size_t)n * SHARD);
    cuda_served(&f, n, 0);
    struct sfs_rank *a = cuda_rank(f.e.sock, 0);
    struct sfs_rank *b = f.rk = cuda_rank(f.e.sock, 0); /* the helpers' rank */
    uint8_t *dev = cuda_dev(&f, 2 * (size_t)n * SHARD);

    for (uint32_t i = 0; i < n; i++) {
        ent[0][i] = (struct sfs_rank_entry){tu_block(i), 0, dev + (size_t)i * SHARD};
        ent[1][i] = (struct sfs_rank_entry){tu_block(i), 0, dev + (size_t)(n + i) * SHARD};
    }
    cr_assert_eq(sfs_rank_load(a, ent[0], n, &t[0]), 0);
    cr_assert_eq(sfs_rank_load(b, ent[1], n, &t[1]), 0);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(sfs_rank_wait(t[r], 60000, st[r]), 0);
        sfs_rank_task_free(t[r]);
    }
    cr_assert_eq(f.cu.memcpy_(f.host, dev, 2 * (size_t)n * SHARD, CUDA_D2H), 0);
    check_bufs(0, n, 0, f.host, st[0]);
    check_bufs(0, n, 0, f.host + (size_t)n * SHARD, st[1]);

    sfs_rank_close(a);
    cr_assert_eq(f.cu.memset_(dev, 0, 2 * (size_t)n * SHARD), 0);
    cr_assert_eq(f.cu.sync(), 0);
    cuda_load_device(&f, 0, n, dev, CUDA_D2H);
    /* And b dumps (the kernel writing its mapping) after a is gone. */
    cuda_dump_device(&f, 300, n, dev, CUDA_H2D);
    cuda_load_host(&f, 300, n);
    sfs_rank_close(b);
    env_down(&f.e);

    cuda_served(&f, n, 1000);
    f.rk = cuda_rank(f.e.sock, 0);
    cuda_load_device(&f, 1000, n, dev, CUDA_D2H);
    cuda_down(&f);
}

Test(rank, cuda_host_memory_ends, .timeout = 120)
{
    /* Loads into, and dumps from, the three kinds of host memory: pinned
     * (cudaMallocHost), registered by the program (cudaHostRegister, default
     * flags: mapped), and pageable. */
    struct cuda_fx f;
    const uint32_t n = 48;
    const size_t part = 16 * (size_t)SHARD;
    uint8_t *reg = aligned_alloc(4096, part), *pageable = malloc(part);
    uint8_t *kinds[3];
    static const char *const kind_name[3] = {"pinned", "registered", "pageable"};
    void *addr[48];

    cuda_up(&f, 0);
    cr_assert(reg && pageable);
    cuda_served(&f, n, 0);
    kinds[0] = cuda_pinned(&f, part);
    cr_assert_eq(f.cu.host_register(reg, part, 0), 0);
    kinds[1] = reg;
    kinds[2] = pageable;
    f.rk = cuda_rank(f.e.sock, 0);

    for (uint32_t i = 0; i < n; i++)
        addr[i] = kinds[i % 3] + (size_t)(i / 3) * SHARD;
    for (int k = 0; k < 3; k++)
        memset(kinds[k], 0, part);
    cuda_task(f.rk, false, 0, n, addr);
    for (uint32_t i = 0; i < n; i++) {
        struct sfs_key k = tu_key(i, 0);

        cr_assert_eq(tu_check(&k, addr[i], SHARD), -1, "load into %s memory, entry %u",
                     kind_name[i % 3], i);
    }
    for (uint32_t i = 0; i < n; i++) {
        struct sfs_key k = tu_key(400 + i, 0);

        tu_fill(&k, addr[i], SHARD);
    }
    cuda_task(f.rk, true, 400, n, addr);
    for (int k = 0; k < 3; k++)
        memset(kinds[k], 0, part);
    cuda_task(f.rk, false, 400, n, addr);
    for (uint32_t i = 0; i < n; i++) {
        struct sfs_key k = tu_key(400 + i, 0);

        cr_assert_eq(tu_check(&k, addr[i], SHARD), -1, "dump from %s memory, entry %u",
                     kind_name[i % 3], i);
    }
    sfs_rank_close(f.rk);
    f.rk = NULL;
    cr_assert_eq(f.cu.host_unregister(reg), 0);
    free(reg);
    free(pageable);
    cuda_down(&f);
}

#define ODD_N      1100 /* more than one copier batch (1024) */
#define ODD_STRIDE (SHARD + 64)

static uint32_t odd_len(uint32_t i)
{
    return SHARD - (i * 7) % 29; /* SHARD .. SHARD - 28 */
}

static size_t odd_off(uint32_t i)
{
    return (size_t)i * ODD_STRIDE + (i * 5) % 32; /* every offset mod 16, both sides of it */
}

/* Entry i's bytes at odd_off(i), and nothing written around them. */
static void odd_check(const uint8_t *buf, uint64_t first, uint32_t (*len_of)(uint32_t))
{
    size_t at = 0;

    for (uint32_t i = 0; i < ODD_N; i++) {
        struct sfs_key k = tu_key(first + i, 0);
        uint32_t len = len_of(i);

        for (; at < odd_off(i); at++)
            cr_assert_eq(buf[at], 0xa5, "byte %zu before entry %u written", at, i);
        cr_assert_eq(tu_check(&k, buf + at, len), -1, "entry %u (offset %zu, %u bytes)", i, at,
                     len);
        at += len;
    }
    for (; at < (size_t)ODD_N * ODD_STRIDE; at++)
        cr_assert_eq(buf[at], 0xa5, "byte %zu after the last entry written", at);
}

static uint32_t full_len(uint32_t i)
{
    return SHARD;
}

Test(rank, cuda_odd_lengths_and_unaligned_addresses, .timeout = 240)
{
    /* Shards shorter than the slot by 0..28 bytes, destinations and dump
     * sources at every alignment mod 32, in device and pinned memory, more
     * entries than one batch; the bytes around each entry stay as they were.
     * Data-plane segments of 2 MiB: dozens of registrations. */
    struct cuda_fx f;
    const size_t bytes = (size_t)ODD_N * ODD_STRIDE;
    void **addr = calloc(ODD_N, sizeof(*addr));

    cuda_up(&f, bytes);
    cr_assert(f.host && addr);
    cr_assert(cuda_env_up(&f.e, 2 * ODD_N + 64, 2u << 20, SFS_HUGEPAGES_OFF));
    cuda_fill(f.e.c, 0, ODD_N, odd_len);
    f.rk = cuda_rank(f.e.sock, 0);
    uint8_t *host = f.host, *dev = cuda_dev(&f, bytes), *pinned = cuda_pinned(&f, bytes);

    for (int pass = 0; pass < 2; pass++) {
        uint8_t *base = pass ? pinned : dev;

        memset(host, 0xa5, bytes);
        if (pass)
            memcpy(pinned, host, bytes);
        else
            cr_assert_eq(f.cu.memcpy_(dev, host, bytes, CUDA_H2D), 0);
        cr_assert_eq(f.cu.sync(), 0);
        for (uint32_t i = 0; i < ODD_N; i++)
            addr[i] = base + odd_off(i);
        cuda_task(f.rk, false, 0, ODD_N, addr);
        if (pass)
            memcpy(host, pinned, bytes);
        else
            cr_assert_eq(f.cu.memcpy_(host, dev, bytes, CUDA_D2H), 0);
        odd_check(host, 0, odd_len);
    }

    /* Dumps from unaligned device memory (the kernel's other direction),
     * read back through the CPU path into pageable memory. */
    memset(host, 0xa5, bytes);
    for (uint32_t i = 0; i < ODD_N; i++) {
        struct sfs_key k = tu_key(20000 + i, 0);

        tu_fill(&k, host + odd_off(i), SHARD);
        addr[i] = dev + odd_off(i);
    }
    cr_assert_eq(f.cu.memcpy_(dev, host, bytes, CUDA_H2D), 0);
    cr_assert_eq(f.cu.sync(), 0);
    cuda_task(f.rk, true, 20000, ODD_N, addr);
    memset(host, 0xa5, bytes);
    for (uint32_t i = 0; i < ODD_N; i++)
        addr[i] = host + odd_off(i);
    cuda_task(f.rk, false, 20000, ODD_N, addr);
    odd_check(host, 20000, full_len);

    free(addr);
    cuda_down(&f);
}

Test(rank, cuda_huge_page_data_plane, .timeout = 120)
{
    /* The daemon's data plane is hugetlb memfds when huge pages are
     * reserved: registered like any other, or, if the driver refuses, copied
     * through cudaMemcpyAsync (the log says which). Either way correct. */
    struct cuda_fx f;
    const uint32_t n = 64;

    cuda_up(&f, (size_t)n * SHARD);
    if (!cuda_env_up(&f.e, 128, 0, SFS_HUGEPAGES_ON))
        cr_skip_test("no huge pages reserved: a hugetlb data plane not tested");
    cuda_fill(f.e.c, 0, n, NULL);
    cuda_warnings = 0;
    f.rk = cuda_rank(f.e.sock, 0);
    /* Not cr_log_warn: a Criterion warning makes the run exit non-zero. */
    if (cuda_warnings)
        fprintf(stderr, "[note] the hugetlb data plane is not mapped for the kernel (see the log "
                        "above): its copies go through cudaMemcpyAsync\n");
    cuda_load_device(&f, 0, n, cuda_dev(&f, (size_t)n * SHARD), CUDA_D2H);
    cuda_down(&f);
}

Test(rank, cuda_other_device_and_current_device, .timeout = 120)
{
    /* Destinations on another GPU (peer access, or cudaMemcpyAsync where
     * there is none), and the caller's current device left as it was by
     * open and close (they run their CUDA calls on a thread of their own). */
    struct cuda_fx f;
    const uint32_t n = 64;
    void *addr[64];
    int cur = -1;

    cuda_up(&f, (size_t)n * SHARD);
    cuda_need_two(&f, "destinations on another GPU");
    cuda_served(&f, n, 0);
    cr_assert_eq(f.cu.set_device(1), 0);
    uint8_t *d1 = cuda_dev(&f, (size_t)n * SHARD);
    f.rk = cuda_rank(f.e.sock, 0);
    cr_assert_eq(f.cu.get_device(&cur), 0);
    cr_assert_eq(cur, 1, "sfs_rank_open changed the caller's current device");
    cr_assert_eq(f.cu.set_device(0), 0);
    uint8_t *d0 = cuda_dev(&f, (size_t)n * SHARD);
    cr_assert_eq(f.cu.set_device(1), 0);

    for (uint32_t i = 0; i < n; i++)
        addr[i] = (i % 2 ? d1 : d0) + (size_t)i * SHARD;
    cuda_task(f.rk, false, 0, n, addr);
    for (uint32_t i = 0; i < n; i++) {
        struct sfs_key k = tu_key(i, 0);

        cr_assert_eq(f.cu.memcpy_(f.host, addr[i], SHARD, CUDA_DEFAULT), 0);
        cr_assert_eq(tu_check(&k, f.host, SHARD), -1, "entry %u on device %u", i, i % 2);
    }
    /* Dump from the other device's memory, read back on ours. */
    cuda_dump_device(&f, 700, n, d1, CUDA_H2D);
    cuda_load_device(&f, 700, n, d0, CUDA_DEFAULT);
    sfs_rank_close(f.rk);
    f.rk = NULL;
    cr_assert_eq(f.cu.get_device(&cur), 0);
    cr_assert_eq(cur, 1, "sfs_rank_close changed the caller's current device");
    cuda_down(&f);
}

Test(rank, cuda_rank_on_second_device, .timeout = 120)
{
    /* A rank on device 1 while the caller's current device is 0: its stream,
     * descriptors and registrations are made on device 1, and the copier
     * thread (which starts on device 0, as every thread does) must make
     * device 1 current before each batch, or its launches fail. */
    struct cuda_fx f;
    const uint32_t n = 64;

    cuda_up(&f, (size_t)n * SHARD);
    cuda_need_two(&f, "a rank on device 1");
    cuda_served(&f, n, 0);
    cr_assert_eq(f.cu.set_device(1), 0);
    uint8_t *d1 = cuda_dev(&f, (size_t)n * SHARD);
    cr_assert_eq(f.cu.set_device(0), 0);
    f.rk = cuda_rank(f.e.sock, 1);

    cuda_load_device(&f, 0, n, d1, CUDA_DEFAULT);
    /* Dump from device 1 (the kernel writing the mapping), read back by the
     * CPU path. */
    cuda_dump_device(&f, 900, n, d1, CUDA_DEFAULT);
    cuda_load_host(&f, 900, n);
    cuda_down(&f);
}

/* ---------------------------------------------------------------------------
 * Entries made of pieces through the CUDA copier, and a dump gated on the
 * program's event (sfs_rank_dumpv_after): the source is written by an async
 * copy on the program's own stream, never synchronized by the program; the
 * dump must wait for it on the copier's stream, with no thread blocking.
 * A dump without the gate reads the source before that copy ran (the fake
 * runtime runs a stream's work only when something waits for it): the
 * test shows both, so it fails when the gate is not waited for.
 */
Test(rank, cuda_pieces_and_a_dump_after_the_programs_event, .timeout = 120)
{
    enum { N = 8, K = 4, LEN = SHARD / K };
    struct cuda_fx f;
    struct sfs_rank_piece pc[N][K];
    struct sfs_rank_entryv ev[N];
    struct sfs_task *t;
    int st[N];
    int (*stream_create)(void **, unsigned);
    int (*stream_destroy)(void *);
    int (*memcpy_async)(void *, const void *, size_t, int, void *);
    int (*event_create)(void **);
    int (*event_record)(void *, void *);
    int (*event_destroy)(void *);

    cuda_up(&f, (size_t)N * SHARD);
    env_up(&f.e, 4 * N, 0);
    f.rk = cuda_rank(f.e.sock, 0); /* no backend: dumps fill the cache */
    stream_create = (__typeof__(stream_create))dlsym(f.cu.h, "cudaStreamCreateWithFlags");
    stream_destroy = (__typeof__(stream_destroy))dlsym(f.cu.h, "cudaStreamDestroy");
    memcpy_async = (__typeof__(memcpy_async))dlsym(f.cu.h, "cudaMemcpyAsync");
    event_create = (__typeof__(event_create))dlsym(f.cu.h, "cudaEventCreate");
    event_record = (__typeof__(event_record))dlsym(f.cu.h, "cudaEventRecord");
    event_destroy = (__typeof__(event_destroy))dlsym(f.cu.h, "cudaEventDestroy");
    cr_assert(stream_create && stream_destroy && memcpy_async && event_create && event_record &&
              event_destroy);
    uint8_t *host = f.host, *dev = cuda_dev(&f, (size_t)N * SHARD);
    uint8_t *back = malloc((size_t)N * SHARD);
    cr_assert_not_null(back);
    void *stream = NULL, *event = NULL;
    cr_assert_eq(stream_create(&stream, 1 /* cudaStreamNonBlocking */), 0);
    cr_assert_eq(event_create(&event), 0);

    /* Entry i: its shard as K device pieces, in reverse order in memory. */
    for (uint32_t i = 0; i < N; i++) {
        struct sfs_key k = tu_key(700 + i, 0);

        tu_fill(&k, host + (size_t)i * SHARD, SHARD);
        for (int j = 0; j < K; j++)
            pc[i][j] = (struct sfs_rank_piece){dev + (size_t)i * SHARD + (size_t)(K - 1 - j) * LEN,
                                               LEN};
        ev[i] = (struct sfs_rank_entryv){k.block, 0, K, pc[i]};
    }
    /* The program's producer: the shard's chunk j lands in piece j. */
    for (uint32_t i = 0; i < N; i++)
        for (int j = 0; j < K; j++)
            cr_assert_eq(memcpy_async(pc[i][j].addr, host + (size_t)i * SHARD + (size_t)j * LEN,
                                      LEN, CUDA_H2D, stream),
                         0);
    cr_assert_eq(event_record(event, stream), 0);

    /* Gated: the stored shards are the producer's bytes. */
    cr_assert_eq(sfs_rank_dumpv_after(f.rk, ev, N, event, &t), 0);
    cr_assert_eq(sfs_rank_wait(t, 30000, st), 0);
    sfs_rank_task_free(t); /* its gate goes with it */
    cr_assert_eq(event_destroy(event), 0);
    for (uint32_t i = 0; i < N; i++)
        cr_assert_eq(st[i], 0, "dump %u: %d", i, st[i]);
    cr_assert_eq(load_sync(f.rk, 700, N, 0, back, st), 0);
    check_bufs(700, N, 0, back, st);

    /* Loaded into the pieces (device memory): the same bytes come back. */
    struct sfs_rank_entryv lv[N];
    memset(back, 0, (size_t)N * SHARD);
    cr_assert_eq(f.cu.memset_(dev, 0, (size_t)N * SHARD), 0);
    cr_assert_eq(f.cu.sync(), 0); /* cudaMemset is asynchronous */
    for (uint32_t i = 0; i < N; i++)
        lv[i] = ev[i];
    cr_assert_eq(sfs_rank_loadv(f.rk, lv, N, &t), 0);
    cr_assert_eq(sfs_rank_wait(t, 30000, st), 0);
    sfs_rank_task_free(t);
    for (uint32_t i = 0; i < N; i++) {
        cr_assert_eq(st[i], 0, "loadv %u: %d", i, st[i]);
        for (int j = 0; j < K; j++)
            cr_assert_eq(f.cu.memcpy_(back + (size_t)i * SHARD + (size_t)j * LEN, pc[i][j].addr,
                                      LEN, CUDA_D2H),
                         0);
    }
    check_bufs(700, N, 0, back, st);

    /* Ungated, the same producer on new keys: the fake runs the producer's
     * copies only when something waits for them, so the dump reads what
     * the source held before (zeros) -- what the gate is for. On a real
     * GPU the race may go either way, so only the fake asserts it. */
    if (getenv("MOCK_CUDA_DEVICES")) { /* the fake runtime */
        cr_assert_eq(f.cu.memset_(dev, 0, (size_t)N * SHARD), 0);
        cr_assert_eq(f.cu.sync(), 0);
        for (uint32_t i = 0; i < N; i++) {
            ev[i].block = tu_block(800 + i);
            for (int j = 0; j < K; j++)
                cr_assert_eq(memcpy_async(pc[i][j].addr, host + (size_t)i * SHARD + (size_t)j * LEN,
                                          LEN, CUDA_H2D, stream),
                             0);
        }
        cr_assert_eq(sfs_rank_dumpv(f.rk, ev, N, &t), 0);
        cr_assert_eq(sfs_rank_wait(t, 30000, st), 0);
        sfs_rank_task_free(t);
        cr_assert_eq(load_sync(f.rk, 800, N, 0, back, st), 0);
        for (uint32_t i = 0; i < N; i++)
            cr_assert_eq(back[(size_t)i * SHARD], 0, "an ungated dump saw the producer's bytes");
    }
    cr_assert_eq(stream_destroy(stream), 0);
    free(back);
    cuda_down(&f);
}
