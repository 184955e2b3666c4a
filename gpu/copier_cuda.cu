/* SPDX-License-Identifier: MIT */
/*
 * copier_cuda.cu - the CUDA copier: one kernel launch per batch of shards.
 *
 * Key idea (measured on an H200, docs/rank.md): one cudaMemcpyAsync per
 * shard runs at 5 GB/s for 16 KiB shards, because every call pays a fixed
 * cost; a kernel that reads the device-mapped host data plane directly moves
 * 51 GB/s at every shard size. So each rank registers its mapping of every
 * data-plane segment once (cudaHostRegister, mapped | portable), and a batch
 * of copies becomes one array of descriptors (src, dst, len) uploaded with
 * the batch, and one launch of a gather kernel: grid.y walks descriptors,
 * grid.x the 64 KiB chunks of a shard, each thread moving 16-byte vectors
 * when the addresses allow it. Dumps launch the same kernel the other way
 * (a scatter into mapped host memory). Shards of at least memcpy_min bytes
 * (default 4 MiB, env SHARDFS_CUDA_MEMCPY_MIN; 0 = never) go through
 * cudaMemcpyAsync, which is as fast there.
 *
 * Destinations (sources, for dumps) may be device memory, pinned or
 * registered host memory (through its device mapping), or plain pageable
 * host memory (a host memcpy: both ends are host memory then). CUDA errors
 * become -errno here, once.
 */
#include "copier_i.h"

#include <cuda_runtime.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK              (64u * 1024)
#define THREADS            256u
#define BATCH_MAX          1024u
#define MEMCPY_MIN_DEFAULT (4ull << 20)

struct desc {
    const uint8_t *src;
    uint8_t *dst;
    uint64_t len;
};

struct seg {
    uintptr_t base;
    size_t len;
    uintptr_t dev;
    bool registered_here; /* unregister at close */
};

struct cuda_copier {
    struct sfs_copier cp;
    int device;
    cudaStream_t stream;
    struct seg *segs;
    uint32_t nseg;
    struct desc *hdesc; /* pinned */
    struct desc *ddesc; /* device */
    size_t memcpy_min;
};

static int cuda_errno(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return 0;
    case cudaErrorMemoryAllocation:
        return -ENOMEM;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
        return -EINVAL;
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorInsufficientDriver:
        return -ENODEV;
    case cudaErrorNotSupported:
        return -EOPNOTSUPP;
    default:
        return -EIO;
    }
}

__global__ void sfs_move_kernel(const struct desc *d)
{
    const struct desc x = d[blockIdx.y];
    uint64_t start = (uint64_t)blockIdx.x * CHUNK;

    if (start >= x.len)
        return;
    uint64_t end = start + CHUNK < x.len ? start + CHUNK : x.len;
    const uint8_t *s = x.src + start;
    uint8_t *t = x.dst + start;
    uint64_t n = end - start;

    if ((((uintptr_t)s | (uintptr_t)t) & 15) == 0) {
        const uint4 *sv = (const uint4 *)s;
        uint4 *tv = (uint4 *)t;
        uint64_t nv = n / 16, i = threadIdx.x;
        const uint64_t bd = blockDim.x;

        /* Four loads in flight per thread before the stores: reads of mapped
         * host memory cross PCIe and need many outstanding requests. */
        for (; i + 3 * bd < nv; i += 4 * bd) {
            uint4 a = sv[i], b = sv[i + bd], c = sv[i + 2 * bd], e = sv[i + 3 * bd];
            tv[i] = a;
            tv[i + bd] = b;
            tv[i + 2 * bd] = c;
            tv[i + 3 * bd] = e;
        }
        for (; i < nv; i += bd)
            tv[i] = sv[i];
        for (uint64_t k = nv * 16 + threadIdx.x; k < n; k += bd)
            t[k] = s[k];
    } else {
        for (uint64_t k = threadIdx.x; k < n; k += blockDim.x)
            t[k] = s[k];
    }
}

/* The device address of data-plane memory, or 0 if p is not in it. */
static uintptr_t seg_dev(const struct cuda_copier *cc, const void *p, size_t len)
{
    uintptr_t a = (uintptr_t)p;

    for (uint32_t i = 0; i < cc->nseg; i++) {
        const struct seg *s = &cc->segs[i];

        if (a >= s->base && a + len <= s->base + s->len)
            return s->dev + (a - s->base);
    }
    return 0;
}

/* How the GPU reaches memory at p: its device address, or 0 when it cannot
 * (pageable host memory). */
static uintptr_t dev_addr(const struct cuda_copier *cc, const void *p, size_t len)
{
    uintptr_t d = seg_dev(cc, p, len);
    cudaPointerAttributes at;

    if (d)
        return d;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        cudaGetLastError(); /* clear it: plain host memory on old drivers */
        return 0;
    }
    switch (at.type) {
    case cudaMemoryTypeDevice:
    case cudaMemoryTypeManaged:
        return (uintptr_t)at.devicePointer;
    case cudaMemoryTypeHost:
        return (uintptr_t)at.devicePointer; /* pinned/registered: mapped, or 0 */
    default:
        return 0;
    }
}

/* Move a batch: each element by kernel, cudaMemcpyAsync or host memcpy. */
static int cuda_move(struct sfs_copier *cp, struct sfs_copy *v, size_t n)
{
    struct cuda_copier *cc = (struct cuda_copier *)cp;
    size_t nd = 0;
    uint64_t maxlen = 0;
    bool async = false;
    int err = 0;
    cudaError_t e;

    e = cudaSetDevice(cc->device);
    if (e != cudaSuccess) {
        err = cuda_errno(e);
        goto out_fail;
    }
    for (size_t i = 0; i < n; i++) {
        uintptr_t s, d;

        v[i].result = 0;
        if (!v[i].src || !v[i].dst) {
            v[i].result = -EFAULT;
            continue;
        }
        s = dev_addr(cc, v[i].src, v[i].len);
        d = dev_addr(cc, v[i].dst, v[i].len);
        if (!s && !d) {
            memcpy(v[i].dst, v[i].src, v[i].len); /* both in host memory */
            continue;
        }
        if (!s || !d || (cc->memcpy_min && v[i].len >= cc->memcpy_min)) {
            /* One end is pageable host memory, or the shard is big enough
             * for the copy engines: let the runtime stage it. */
            e = cudaMemcpyAsync(v[i].dst, v[i].src, v[i].len, cudaMemcpyDefault, cc->stream);
            if (e != cudaSuccess) {
                v[i].result = cuda_errno(e);
                /* Clear it, or the launch check below takes this element's
                 * error for the kernel's and fails the whole batch. */
                cudaGetLastError();
            }
            async = true;
            continue;
        }
        cc->hdesc[nd].src = (const uint8_t *)s;
        cc->hdesc[nd].dst = (uint8_t *)d;
        cc->hdesc[nd].len = v[i].len;
        if (v[i].len > maxlen)
            maxlen = v[i].len;
        nd++;
    }
    if (nd) {
        e = cudaMemcpyAsync(cc->ddesc, cc->hdesc, nd * sizeof(struct desc), cudaMemcpyHostToDevice,
                            cc->stream);
        if (e == cudaSuccess) {
            dim3 grid((unsigned)((maxlen + CHUNK - 1) / CHUNK), (unsigned)nd);

            sfs_move_kernel<<<grid, THREADS, 0, cc->stream>>>(cc->ddesc);
            e = cudaGetLastError();
        }
        if (e != cudaSuccess) {
            err = cuda_errno(e);
            goto out_fail;
        }
        async = true;
    }
    if (async) {
        e = cudaStreamSynchronize(cc->stream);
        if (e != cudaSuccess) {
            err = cuda_errno(e);
            goto out_fail;
        }
    }
    return 0;

out_fail:
    if (async || nd) {
        /* Copies (and the descriptor upload) queued before the failure may
         * still be running: the caller releases the slots and reuses hdesc
         * as soon as we return, so wait for them first. */
        cudaStreamSynchronize(cc->stream);
        cudaGetLastError();
    }
    for (size_t i = 0; i < n; i++)
        if (v[i].result == 0)
            v[i].result = err;
    return err;
}

static int cuda_batch(struct sfs_copier *cp, struct sfs_copy *v, size_t n)
{
    int r = 0;

    /* The descriptor buffers hold BATCH_MAX entries. */
    for (size_t off = 0; off < n; off += BATCH_MAX) {
        size_t k = n - off < BATCH_MAX ? n - off : BATCH_MAX;
        int rr = cuda_move(cp, v + off, k);

        if (rr < 0 && r == 0)
            r = rr;
    }
    return r;
}

static void cuda_close(struct sfs_copier *cp)
{
    struct cuda_copier *cc = (struct cuda_copier *)cp;

    if (!cc)
        return;
    cudaSetDevice(cc->device);
    if (cc->stream)
        cudaStreamSynchronize(cc->stream);
    for (uint32_t i = 0; i < cc->nseg; i++)
        if (cc->segs[i].registered_here)
            cudaHostUnregister((void *)cc->segs[i].base);
    if (cc->ddesc)
        cudaFree(cc->ddesc);
    if (cc->hdesc)
        cudaFreeHost(cc->hdesc);
    if (cc->stream)
        cudaStreamDestroy(cc->stream);
    free(cc->segs);
    free(cc);
}

static const struct sfs_copier_ops cuda_ops = {
    "cuda",
    cuda_batch,
    cuda_batch,
    cuda_close,
};

extern "C" int sfs_cuda_device_count(void)
{
    int n = 0;

    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" struct sfs_copier *sfs_copier_cuda_open(int device, struct sfs_cache *c, int *err)
{
    struct cuda_copier *cc = (struct cuda_copier *)calloc(1, sizeof(*cc));
    struct sfs_cache_info info;
    const char *env = getenv("SHARDFS_CUDA_MEMCPY_MIN");
    cudaError_t e;

    if (!cc) {
        *err = -ENOMEM;
        return NULL;
    }
    cc->cp.ops = &cuda_ops;
    cc->device = device;
    cc->memcpy_min = env ? (size_t)strtoull(env, NULL, 0) : MEMCPY_MIN_DEFAULT;
    e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&cc->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaMallocHost((void **)&cc->hdesc, BATCH_MAX * sizeof(struct desc));
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&cc->ddesc, BATCH_MAX * sizeof(struct desc));
    if (e != cudaSuccess)
        goto out_cuda;

    /* Register every data-plane segment of this mapping, once. */
    sfs_cache_info(c, &info);
    cc->segs = (struct seg *)calloc(info.nsegments ? info.nsegments : 1, sizeof(*cc->segs));
    if (!cc->segs) {
        *err = -ENOMEM;
        goto out_close;
    }
    for (uint32_t i = 0; i < info.nsegments; i++) {
        size_t len = 0;
        void *base = sfs_cache_segment(c, i, &len);
        void *dev = NULL;
        struct seg *s = &cc->segs[cc->nseg];

        if (!base)
            break;
        e = cudaHostRegister(base, len, cudaHostRegisterMapped | cudaHostRegisterPortable);
        if (e == cudaErrorHostMemoryAlreadyRegistered) {
            cudaGetLastError(); /* another handle of this process did it */
        } else if (e != cudaSuccess) {
            goto out_cuda;
        } else {
            s->registered_here = true;
        }
        s->base = (uintptr_t)base;
        s->len = len;
        cc->nseg++;
        e = cudaHostGetDevicePointer(&dev, base, 0);
        if (e != cudaSuccess)
            goto out_cuda;
        s->dev = (uintptr_t)dev;
    }
    *err = 0;
    return &cc->cp;

out_cuda:
    *err = cuda_errno(e);
    cudaGetLastError();
out_close:
    cuda_close(&cc->cp);
    return NULL;
}
