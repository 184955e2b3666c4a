/* SPDX-License-Identifier: MIT */
/*
 * copier_cuda_place.cu - where the ends of a CUDA copy lie: the process's
 * table of host registrations (a data-plane piece is registered once per
 * process and refcounted by the ranks that map it), and the placing of each
 * end of a copy (data plane, device memory of ours or of a peer, managed,
 * pinned or pageable host memory), which decides whether the kernel,
 * cudaMemcpyAsync or the CPU moves it. Called by copier_cuda.cu only.
 */
#include "copier_cuda_i.h"

#include <stdlib.h>

/* ---------------------------------------------------------------------------
 * Host registrations, per process: [base, base + len) registered once,
 * refcounted by the ranks' data-plane pieces that lie in it.
 */

struct reg {
    uintptr_t base;
    size_t len;
    unsigned refs;
    bool ours; /* we registered it, so we unregister it; else the program did */
};

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct reg *regs; /* under reg_mu */
static size_t nregs, cap_regs;

/* Hold a registration covering [base, base + len), registering it (with our
 * device current) if nobody has. 0 and its key in *key, or -errno. */
int cuda_reg_get(uintptr_t base, size_t len, uintptr_t *key)
{
    cudaError_t e;
    bool ours = true;
    int r = 0;

    pthread_mutex_lock(&reg_mu);
    for (size_t i = 0; i < nregs; i++) {
        struct reg *g = &regs[i];

        if (base >= g->base && base + len <= g->base + g->len) {
            g->refs++;
            *key = g->base;
            goto out;
        }
        if (base < g->base + g->len && g->base < base + len) {
            r = -EEXIST; /* overlaps partly: not ours to split */
            goto out;
        }
    }
    if (nregs == cap_regs) {
        size_t cap = cap_regs ? 2 * cap_regs : 16;
        struct reg *nr = (struct reg *)realloc(regs, cap * sizeof(*nr));

        if (!nr) {
            r = -ENOMEM;
            goto out;
        }
        regs = nr;
        cap_regs = cap;
    }
    e = cudaHostRegister((void *)base, len, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
        /* Registered outside this table: by the program. Use it, never
         * unregister it. */
        (void)cudaGetLastError();
        ours = false;
    } else if (e != cudaSuccess) {
        (void)cudaGetLastError();
        r = cuda_errno(e);
        goto out;
    }
    regs[nregs++] = (struct reg){base, len, 1, ours};
    *key = base;
out:
    pthread_mutex_unlock(&reg_mu);
    return r;
}

/* Drop a hold from cuda_reg_get(); the last one unregisters. Before the memory is
 * unmapped: a registration that outlives its mapping pins the old pages, and
 * a new mapping at the same address would be read through them. */
void cuda_reg_put(uintptr_t key)
{
    pthread_mutex_lock(&reg_mu);
    for (size_t i = 0; i < nregs; i++) {
        if (regs[i].base != key)
            continue;
        if (--regs[i].refs == 0) {
            if (regs[i].ours && cudaHostUnregister((void *)key) != cudaSuccess)
                (void)cudaGetLastError();
            regs[i] = regs[--nregs];
        }
        break;
    }
    pthread_mutex_unlock(&reg_mu);
}

/* ---------------------------------------------------------------------------
 * Placing the ends of a copy.
 */

/* cuPointerGetAttributes, through the runtime (no link to libcuda: the
 * library must load on machines without a driver). NULL when unavailable:
 * then no span cache, and no kernel on other devices' memory. */
ptr_attrs_fn cuda_driver_ptr_attrs(void)
{
#if CUDART_VERSION >= 12050
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    void *fn = NULL;

    if (cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &fn, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return (ptr_attrs_fn)fn;
#else
    return NULL;
#endif
}

/* The allocation p lies in, and whether it is an ordinary cudaMalloc one
 * (the kind peer access maps; pool and VMM memory have their own access
 * lists). false when the driver does not say. */
static bool alloc_range(const struct cuda_copier *cc, const void *p, uintptr_t *lo, size_t *size,
                        bool *legacy)
{
    CUpointer_attribute which[3] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                    CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                    CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
    /* 8 bytes each, zeroed: the boolean may be written narrower. */
    unsigned long long start = 0, sz = 0, leg = 0;
    void *data[3] = {&start, &sz, &leg};
    uintptr_t a = (uintptr_t)p;

    if (!cc->ptr_attrs || cc->ptr_attrs(3, which, data, (CUdeviceptr)a) != CUDA_SUCCESS)
        return false;
    if (sz == 0 || a < start || a - start >= sz)
        return false;
    *lo = (uintptr_t)start;
    *size = (size_t)sz;
    *legacy = leg != 0;
    return true;
}

/* May the kernel on our device reach memory of device `dev`? Peer access is
 * enabled the first time it is needed (process-wide, as the runtime has it),
 * and kept. The thread placing a batch, our device current; peer[] under
 * peer_mu (the copier thread and an inline caller may place at once). */
static bool peer_ok(struct cuda_copier *cc, int dev)
{
    bool ok;

    if (dev < 0 || dev >= cc->ndev)
        return false;
    pthread_mutex_lock(&cc->peer_mu);
    if (cc->peer[dev] == 0) {
        int can = 0;
        cudaError_t e;

        cc->peer[dev] = -1;
        if (cudaDeviceCanAccessPeer(&can, cc->device, dev) == cudaSuccess && can) {
            e = cudaDeviceEnablePeerAccess(dev, 0);
            if (e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled)
                cc->peer[dev] = 1;
        }
        (void)cudaGetLastError();
    }
    ok = cc->peer[dev] > 0;
    pthread_mutex_unlock(&cc->peer_mu);
    return ok;
}

static void span_add(struct slot *sl, uintptr_t lo, size_t size, bool kernel)
{
    unsigned i = sl->nspans < SPANS ? sl->nspans++ : sl->next_span++ % SPANS;

    sl->spans[i] = (struct span){lo, lo + size, kernel};
}

/* Where [p, p + len) lies and who may reach it. The thread placing slot
 * sl's batch, our device current. Device allocations are remembered for the
 * rest of the batch only: every destination of a batch is live until its
 * entry completes, but between batches the program may free memory and
 * reuse its addresses. */
void cuda_place_of(struct cuda_copier *cc, struct slot *sl, const void *p, size_t len,
                   struct place *o)
{
    uintptr_t a = (uintptr_t)p, lo = 0;
    size_t size = 0;
    bool known, legacy = false;
    cudaPointerAttributes at;

    *o = (struct place){0, false, false, false};
    /* The data plane: host memory, for the kernel through its mapping. */
    for (uint32_t i = 0; i < cc->nseg; i++) {
        const struct seg *s = &cc->segs[i];

        if (a - s->base < s->len) {
            o->host = true;
            if (s->dev && len <= s->len - (a - s->base)) {
                o->kernel = true;
                o->dev = s->dev + (a - s->base);
            }
            return;
        }
    }
    for (unsigned i = 0; i < sl->nspans; i++) {
        const struct span *sp = &sl->spans[i];

        if (a - sp->lo < sp->hi - sp->lo) {
            o->bad = len > sp->hi - a;
            o->kernel = sp->kernel;
            o->dev = a;
            return;
        }
    }
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        /* Drivers before CUDA 11 say so for plain host memory. */
        (void)cudaGetLastError();
        o->host = true;
        return;
    }
    switch (at.type) {
    case cudaMemoryTypeHost:
        /* Pinned or registered: the kernel goes through its device alias,
         * which exists only if it was mapped for our device. */
        o->host = true;
        if (at.devicePointer) {
            o->kernel = true;
            o->dev = (uintptr_t)at.devicePointer;
        }
        return;
    case cudaMemoryTypeDevice:
    case cudaMemoryTypeManaged:
        break;
    default: /* unregistered: pageable host memory */
        o->host = true;
        return;
    }
    known = alloc_range(cc, p, &lo, &size, &legacy);
    if (known && len > size - (a - lo)) {
        o->bad = true; /* the kernel would run off its allocation */
        return;
    }
    if (at.type == cudaMemoryTypeManaged)
        o->kernel = at.devicePointer != NULL; /* never the CPU: concurrent access rules */
    else if (at.device == cc->device)
        o->kernel = true;
    else
        o->kernel = known && legacy && peer_ok(cc, at.device);
    o->dev = a; /* unified addressing: device memory has one address */
    if (known)
        span_add(sl, lo, size, o->kernel);
}
