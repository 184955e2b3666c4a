/* SPDX-License-Identifier: MIT */
/*
 * copier_cuda_i.h - the CUDA copier's private types, shared by its two
 * files: copier_cuda.cu (the kernel, batches, open and close) and
 * copier_cuda_place.cu (the process's host registrations, and where each
 * end of a copy lies). See copier_cuda.cu for the design.
 */
#ifndef SHARDFS_COPIER_CUDA_I_H
#define SHARDFS_COPIER_CUDA_I_H

#include "copier_i.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>

#define CHUNK     (64u * 1024)
#define THREADS   256u
#define BATCH_MAX ((size_t)SFS_COPY_BATCH_MAX)
/* One cudaHostRegister call at most: drivers fail single registrations of
 * hundreds of GiB (page-table metadata beyond their allocation limit). */
#define REG_PIECE_MAX (64ull << 30)
/* Device allocations remembered within one batch. */
#define SPANS 16u

/* The core's logger (util.c, linked into this library). */
extern "C" void sfs_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* What sfs_move_kernel reads, one per grid.y. tests/fakecuda/fakecudart.cpp
 * emulates the kernel by reading this array (and relies on CHUNK, the launch
 * shape and the kernel's name): a change here is a change there. */
struct desc {
    const uint8_t *src;
    uint8_t *dst;
    uint64_t len;
};

/* One registered piece of this rank's data-plane mapping. */
struct seg {
    uintptr_t base;
    size_t len;
    uintptr_t dev; /* its device address; 0: the kernel cannot read it */
    uintptr_t reg; /* the process registration we hold (its key); 0: none */
};

/* Where one end of a copy lies, as seen from the thread placing a batch. */
struct place {
    uintptr_t dev; /* the kernel's address for it, when `kernel` */
    bool kernel;   /* the kernel on our device may read and write it */
    bool host;     /* the CPU may read and write it (memcpy) */
    bool bad;      /* it runs past the end of its allocation */
};

/* A device allocation placed earlier in this batch: [lo, hi). */
struct span {
    uintptr_t lo, hi;
    bool kernel;
};

enum {
    PATH_DONE = 0, /* copied by the CPU, skipped, or failed: result is final */
    PATH_ASYNC,    /* cudaMemcpyAsync on our stream */
    PATH_KERNEL,   /* a descriptor of this batch's launch */
};

typedef CUresult (*ptr_attrs_fn)(unsigned int n, CUpointer_attribute *which, void **data,
                                 CUdeviceptr p);

/* One batch on its way: the copier has two, so that the CPU work of one
 * (placing, releasing leases) overlaps the other's transfer on the GPU.
 * Each has its own stream, so finishing one never waits for the other. */
struct slot {
    cudaStream_t stream;
    struct desc *hdesc; /* pinned */
    struct desc *ddesc; /* device */
    struct sfs_copy *v; /* the batch, between start and finish */
    size_t n;
    cudaError_t launch; /* the descriptor upload or the launch */
    bool queued;        /* work on the stream to wait for */
    uint8_t path[BATCH_MAX];
    /* Device allocations placed in this slot's batch (its thread only). */
    struct span spans[SPANS];
    unsigned nspans, next_span;
};

/* Slots 0 and 1: the copier thread's (start/finish). Slot 2: load_inline's,
 * under inline_mu. */
#define NSLOTS_THREAD 2
#define SLOT_INLINE   2
#define NSLOTS        3

struct cuda_copier {
    struct sfs_copier cp;
    int device;
    int ndev;
    struct slot slots[NSLOTS];
    struct seg *segs;
    uint32_t nseg;
    size_t memcpy_min;
    signed char *peer;         /* [ndev]: 0 not asked yet, 1 peer access on, -1 none */
    ptr_attrs_fn ptr_attrs;    /* cuPointerGetAttributes; NULL: not available */
    pthread_mutex_t peer_mu;   /* peer[]: the copier thread and inline callers */
    pthread_mutex_t inline_mu; /* slot SLOT_INLINE: one load_inline at a time */
    pthread_mutex_t gate_mu;   /* gate_stream: one wait-and-record at a time */
    cudaStream_t gate_stream;  /* where a gate captures a program's event */
    bool mutexes;              /* the two above are initialised */
    bool failed_once;          /* a failed batch was logged (__atomic: any thread) */
};

static inline int cuda_errno(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return 0;
    case cudaErrorMemoryAllocation:
    case cudaErrorLaunchOutOfResources:
        return -ENOMEM;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
        return -EINVAL;
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
        return -ENODEV;
    case cudaErrorDevicesUnavailable:
        return -EBUSY;
    case cudaErrorHostMemoryAlreadyRegistered:
        return -EEXIST;
    case cudaErrorNotSupported:
        return -EOPNOTSUPP;
    default:
        return -EIO;
    }
}

/* This thread never captures: a capture another thread runs in global mode
 * (PyTorch's default) must not turn our calls into capture errors. For our
 * own threads only (the mode is per thread, and is not put back). */
static inline void capture_mode_local(void)
{
    cudaStreamCaptureMode m = cudaStreamCaptureModeThreadLocal;

    if (cudaThreadExchangeStreamCaptureMode(&m) != cudaSuccess)
        (void)cudaGetLastError();
}

/* copier_cuda_place.cu (called by copier_cuda.cu) */

/* Hold a registration covering [base, base + len), registering it (with our
 * device current) if nobody has. 0 and its key in *key, or -errno. */
int cuda_reg_get(uintptr_t base, size_t len, uintptr_t *key);
/* Drop a hold from cuda_reg_get(); the last one unregisters. */
void cuda_reg_put(uintptr_t key);
/* cuPointerGetAttributes through the runtime; NULL when unavailable. */
ptr_attrs_fn cuda_driver_ptr_attrs(void);
/* Where [p, p + len) lies and who may reach it (slot sl's batch, our device
 * current). */
void cuda_place_of(struct cuda_copier *cc, struct slot *sl, const void *p, size_t len,
                   struct place *o);

#endif /* SHARDFS_COPIER_CUDA_I_H */
