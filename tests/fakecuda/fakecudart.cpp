/* SPDX-License-Identifier: MIT */
/*
 * fakecudart.cpp - a fake CUDA runtime, to test the CUDA copier's host-side
 * logic in CI on machines without a GPU. It is not CUDA: it tests no GPU, no
 * driver, and nothing about the copier's speed.
 *
 * It is a shared library with the soname and symbol version of the libcudart
 * the build links (tests/CMakeLists.txt reads both from it), preloaded into
 * tests/test_rank by the rank_cuda_fake* ctest entries so that
 * libshardfs-rank binds to it instead of the real one. It implements the
 * runtime calls gpu/copier_cuda.cu and the tests make, on a model meant to
 * make the copier's mistakes fail:
 *
 * - Device memory (cudaMalloc) lies at PROT_NONE addresses, so a CPU access
 *   to it faults; its bytes are kept in a host "view" the fake copies to.
 * - Pinned and registered host memory gets device aliases that differ from
 *   its host addresses (cudaHostGetDevicePointer, cudaPointerGetAttributes),
 *   so a kernel handed a host pointer instead of its alias is caught.
 * - Copies and kernels are queued per stream and run only when the stream
 *   (or the device) is synchronized: a result read before the sync is wrong.
 *   cudaMemset is queued on the legacy stream, as it is asynchronous.
 * - A stream belongs to the device current when it was made; a launch or an
 *   async copy on it from another device fails (a copier thread that skipped
 *   cudaSetDevice). Handles of destroyed streams are refused.
 * - The kernel is emulated: at the sync it reads the descriptor array from
 *   device memory and moves each {src, dst, len}. Any address its device
 *   cannot reach (a host pointer, freed memory, another device's memory
 *   without peer access, past the end of an allocation, a grid too small for
 *   a descriptor) sets a sticky cudaErrorIllegalAddress on that device, as a
 *   real fault kills the context: every later call there returns it.
 * - Events: a record is an op of its stream; a wait, an op of the waiting
 *   stream that first runs the recording stream up to that record, so work
 *   after a wait sees what was queued before the record, and nothing else
 *   orders two streams (a dump that skips the wait reads stale bytes).
 * - Registrations: a range registered twice is refused; munmap of registered
 *   memory aborts (a registration that outlives its mapping), when preloaded.
 *
 * It cannot check: the device code of sfs_move_kernel (its 16-byte vector
 * paths, alignment heads, 64 KiB chunks per block; here one memmove per
 * descriptor), the real driver's registration limits (hugetlb, sizes),
 * speed, real concurrency (queued work runs in the thread that synchronizes,
 * under one lock), stream-ordering with the legacy stream, unified
 * addressing where a mapped host address is also its device address (never
 * here, so the fake is stricter), compute-sanitizer's checks. For those:
 * tests/bench/gpu_check.sh on a GPU machine.
 *
 * Stricter than the real runtime on purpose: host pointers are never device
 * addresses; copies take device or host addresses, not device aliases; an
 * async copy on another device's stream fails (the real one allows it).
 *
 * The kernel emulation mirrors `struct desc`, CHUNK and the launch shape of
 * gpu/copier_cuda.cu (grid.y descriptors, grid.x chunks), and emulates only
 * sfs_move_kernel: a launch of any other kernel fails and says so. A change
 * to them there is a change here.
 *
 * Environment: MOCK_CUDA_DEVICES=N devices (default 1; 0: none, so
 * cudaGetDeviceCount fails); MOCK_CUDA_REGISTER_FAIL=1: every
 * cudaHostRegister fails with cudaErrorNotSupported (as hugetlb memory does
 * on some drivers); MOCK_CUDA_NO_DRIVER=1: no cuPointerGetAttributes entry
 * point. Messages go to stderr, prefixed "fakecudart:".
 */
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <vector>

#define FAKE_API extern "C" __attribute__((visibility("default")))

#define MAX_DEV 16
#define VA_SIZE (64ull << 30) /* device addresses, and device aliases: each */
#define GAP     4096ull       /* between two of them: running off one is caught */
#define CHUNK   (64u * 1024)  /* copier_cuda.cu: bytes per block of the kernel */
#define KERNEL  "sfs_move_kernel"

/* copier_cuda.cu's descriptor, as its kernel reads it. */
struct desc {
    const uint8_t *src;
    uint8_t *dst;
    uint64_t len;
};
static_assert(sizeof(struct desc) == 24, "struct desc of gpu/copier_cuda.cu");

enum region_kind {
    R_DEVICE,     /* cudaMalloc */
    R_PINNED,     /* cudaMallocHost */
    R_REGISTERED, /* cudaHostRegister */
};

/* One allocation or registration. */
struct region {
    uintptr_t lo, hi; /* R_DEVICE: its device range; else its host range */
    enum region_kind kind;
    int dev;         /* the device current when it was made */
    uintptr_t view;  /* R_DEVICE: where its bytes are, for the CPU */
    uintptr_t alias; /* R_PINNED, R_REGISTERED: its device address */
};

enum op_kind { OP_COPY, OP_MEMSET, OP_KERNEL, OP_RECORD, OP_WAIT, OP_NONE };

struct stream;

/* An event: recorded on one stream at a time; `gen` counts its records, and
 * `done` is the last record whose op has run. */
struct event {
    struct stream *st;
    uint64_t gen, done;
};

/* Work queued on a stream. */
struct op {
    enum op_kind kind;
    uintptr_t dst;  /* OP_COPY, OP_MEMSET: a CPU address */
    uintptr_t src;  /* OP_COPY: a CPU address; OP_KERNEL: the descriptors' device address */
    size_t len;     /* OP_COPY, OP_MEMSET: bytes; OP_KERNEL: grid.x */
    int value;      /* OP_MEMSET */
    unsigned ndesc; /* OP_KERNEL: grid.y */
    event *ev;      /* OP_RECORD, OP_WAIT */
    uint64_t gen;   /* OP_RECORD: the record it is; OP_WAIT: the record waited for */
};

struct stream {
    int dev;
    std::vector<op> ops;
};

/* The whole state, under mu. Made on first use and never freed: munmap is
 * called after static destructors have run. */
struct fake {
    std::vector<region> regions;
    std::vector<stream *> streams; /* made by cudaStreamCreateWithFlags */
    std::vector<event *> events;   /* made by cudaEventCreate* */
    stream legacy[MAX_DEV];        /* each device's legacy default stream */
    uintptr_t dev_va, dev_next;
    uintptr_t alias_va, alias_next;
    int ndev;
    bool register_fail, no_driver;
    bool peer[MAX_DEV][MAX_DEV]; /* [from][to]: peer access enabled */
    cudaError_t sticky[MAX_DEV]; /* a kernel fault: that device is dead */
    const void *kernel;          /* sfs_move_kernel's host stub */
};

static pthread_mutex_t mu = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static struct fake *F;
static int (*next_munmap)(void *, size_t); /* set once, by the constructor */

/* Per thread, as in the real runtime. */
static thread_local int cur_dev;
static thread_local cudaError_t last_err;
static thread_local cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;
static thread_local dim3 cfg_grid, cfg_block;
static thread_local size_t cfg_shmem;
static thread_local cudaStream_t cfg_stream;

static uintptr_t reserve(void)
{
    void *p = mmap(NULL, VA_SIZE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

    if (p == MAP_FAILED) {
        perror("fakecudart: reserving address space");
        abort();
    }
    return (uintptr_t)p;
}

static struct fake *create(void)
{
    struct fake *f = new fake();
    const char *e = getenv("MOCK_CUDA_DEVICES");

    f->ndev = e ? atoi(e) : 1;
    if (f->ndev < 0)
        f->ndev = 0;
    if (f->ndev > MAX_DEV)
        f->ndev = MAX_DEV;
    for (int d = 0; d < MAX_DEV; d++)
        f->legacy[d].dev = d;
    f->register_fail = getenv("MOCK_CUDA_REGISTER_FAIL") != NULL;
    f->no_driver = getenv("MOCK_CUDA_NO_DRIVER") != NULL;
    f->dev_va = f->dev_next = reserve();
    f->alias_va = f->alias_next = reserve();
    return f;
}

/* Holds mu for its scope; the state exists while it does. */
struct guard {
    guard()
    {
        pthread_mutex_lock(&mu);
        if (!F)
            F = create();
    }
    ~guard()
    {
        pthread_mutex_unlock(&mu);
    }
};

__attribute__((constructor)) static void fake_init(void)
{
    guard g;

    next_munmap = (int (*)(void *, size_t))dlsym(RTLD_NEXT, "munmap");
}

__attribute__((destructor)) static void fake_fini(void)
{
    guard g;
    unsigned left = 0;

    for (const region &r : F->regions)
        left += r.kind == R_REGISTERED;
    if (left)
        fprintf(stderr, "fakecudart: %u host registrations left at exit\n", left);
}

/* What every call returns: the current device's sticky error wins, and an
 * error is kept for cudaGetLastError. Under mu. */
static cudaError_t ret(cudaError_t e)
{
    if (F->sticky[cur_dev] != cudaSuccess)
        e = F->sticky[cur_dev];
    if (e != cudaSuccess)
        last_err = e;
    return e;
}

static region *find_device(uintptr_t p)
{
    for (region &r : F->regions)
        if (r.kind == R_DEVICE && p >= r.lo && p < r.hi)
            return &r;
    return NULL;
}

static region *find_host(uintptr_t p)
{
    for (region &r : F->regions)
        if (r.kind != R_DEVICE && p >= r.lo && p < r.hi)
            return &r;
    return NULL;
}

static region *find_alias(uintptr_t p)
{
    for (region &r : F->regions)
        if (r.kind != R_DEVICE && p >= r.alias && p < r.alias + (r.hi - r.lo))
            return &r;
    return NULL;
}

static bool in_va(uintptr_t p, uintptr_t va)
{
    return p >= va && p < va + VA_SIZE;
}

static uintptr_t next_range(uintptr_t *next, size_t n)
{
    uintptr_t a = *next;

    *next += ((n + GAP - 1) & ~(GAP - 1)) + GAP;
    return a;
}

/* The CPU address of [p, p + n) as the kernel on device d sees it: device
 * memory of d or of a peer d may access, or a device alias of mapped host
 * memory. 0 when d cannot reach all of it. */
static uintptr_t kernel_reach(int d, uintptr_t p, size_t n)
{
    const region *r = find_device(p);

    if (r) {
        if (n > r->hi - p || (r->dev != d && !F->peer[d][r->dev]))
            return 0;
        return r->view + (p - r->lo);
    }
    r = find_alias(p);
    if (r) {
        if (n > r->alias + (r->hi - r->lo) - p)
            return 0;
        return r->lo + (p - r->alias);
    }
    return 0; /* a host address is no device address here */
}

/* The CPU address of [p, p + n) for a copy: device memory of any device, or
 * host memory. false for a range past its allocation, a freed device address,
 * or a device alias. */
static bool copy_reach(uintptr_t p, size_t n, uintptr_t *cpu)
{
    const region *r = find_device(p);

    if (r) {
        *cpu = r->view + (p - r->lo);
        return n <= r->hi - p;
    }
    if (in_va(p, F->dev_va) || in_va(p, F->alias_va)) {
        fprintf(stderr, "fakecudart: a copy with a freed device address or a device alias %p\n",
                (void *)p);
        return false;
    }
    *cpu = p;
    return true;
}

/* The stream a handle names; NULL for one that is not (destroyed). */
static stream *stream_of(cudaStream_t s)
{
    if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return &F->legacy[cur_dev];
    for (stream *st : F->streams)
        if ((cudaStream_t)st == s)
            return st;
    fprintf(stderr, "fakecudart: stream %p does not exist\n", (void *)s);
    return NULL;
}

static void fault(int d, const char *what, uintptr_t a, uintptr_t b, uint64_t len)
{
    fprintf(stderr,
            "fakecudart: device %d: kernel: %s (%p -> %p, %llu bytes): "
            "cudaErrorIllegalAddress, sticky\n",
            d, what, (void *)a, (void *)b, (unsigned long long)len);
    F->sticky[d] = cudaErrorIllegalAddress;
}

/* sfs_move_kernel<<<(grid_x, ndesc), ...>>>(descriptors at dd) on device d. */
static void run_kernel(int d, uintptr_t dd, unsigned ndesc, size_t grid_x)
{
    uintptr_t v = kernel_reach(d, dd, ndesc * sizeof(struct desc));

    if (!v) {
        fault(d, "descriptors unreachable", dd, 0, ndesc * sizeof(struct desc));
        return;
    }
    for (unsigned i = 0; i < ndesc; i++) {
        const struct desc x = ((const struct desc *)v)[i];
        uintptr_t s = kernel_reach(d, (uintptr_t)x.src, x.len);
        uintptr_t t = kernel_reach(d, (uintptr_t)x.dst, x.len);

        if (!s || !t) {
            fault(d, s ? "destination unreachable" : "source unreachable", (uintptr_t)x.src,
                  (uintptr_t)x.dst, x.len);
            return;
        }
        if ((uint64_t)grid_x * CHUNK < x.len) {
            fault(d, "grid.x too small for a descriptor", (uintptr_t)x.src, (uintptr_t)x.dst,
                  x.len);
            return;
        }
        memmove((void *)t, (const void *)s, x.len);
    }
}

/* Run what is queued on st; after a fault on its device, nothing more runs
 * there. Under mu. */
static void run_ops(stream *st)
{
    std::vector<op> ops;

    ops.swap(st->ops);
    for (const op &o : ops) {
        if (F->sticky[st->dev] != cudaSuccess)
            break;
        switch (o.kind) {
        case OP_COPY:
            memmove((void *)o.dst, (const void *)o.src, o.len);
            break;
        case OP_MEMSET:
            memset((void *)o.dst, o.value, o.len);
            break;
        case OP_KERNEL:
            run_kernel(st->dev, o.src, o.ndesc, o.len);
            break;
        case OP_RECORD:
            if (o.ev->done < o.gen)
                o.ev->done = o.gen;
            break;
        case OP_WAIT:
            /* Everything queued on the recording stream before that record
             * runs first (and whatever follows it there too: that order is
             * also the stream's own). */
            if (o.ev->done < o.gen && o.ev->st)
                run_ops(o.ev->st);
            break;
        case OP_NONE:
            break;
        }
    }
}

static void run_device(int d)
{
    for (stream *st : F->streams)
        if (st->dev == d)
            run_ops(st);
    run_ops(&F->legacy[d]);
}

/* ---------------------------------------------------------------------------
 * Devices, errors, streams.
 */

FAKE_API cudaError_t cudaGetDeviceCount(int *n)
{
    guard g;

    if (F->ndev == 0)
        return ret(cudaErrorNoDevice);
    *n = F->ndev;
    return cudaSuccess;
}

FAKE_API cudaError_t cudaSetDevice(int d)
{
    guard g;

    if (d < 0 || d >= F->ndev)
        return ret(cudaErrorInvalidDevice);
    cur_dev = d;
    return ret(cudaSuccess);
}

FAKE_API cudaError_t cudaGetDevice(int *d)
{
    guard g;

    *d = cur_dev;
    return ret(cudaSuccess);
}

FAKE_API cudaError_t cudaGetLastError(void)
{
    guard g;
    cudaError_t e = F->sticky[cur_dev] != cudaSuccess ? F->sticky[cur_dev] : last_err;

    last_err = cudaSuccess;
    return e;
}

FAKE_API cudaError_t cudaPeekAtLastError(void)
{
    guard g;

    return F->sticky[cur_dev] != cudaSuccess ? F->sticky[cur_dev] : last_err;
}

FAKE_API const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return "no error (fakecudart)";
    case cudaErrorIllegalAddress:
        return "an illegal memory access was encountered (fakecudart)";
    case cudaErrorInvalidValue:
        return "invalid argument (fakecudart)";
    case cudaErrorInvalidResourceHandle:
        return "invalid resource handle (fakecudart)";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument (fakecudart)";
    case cudaErrorInvalidDeviceFunction:
        return "invalid device function (fakecudart)";
    default:
        return "a CUDA error (fakecudart)";
    }
}

FAKE_API cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode *m)
{
    cudaStreamCaptureMode old = capture_mode;

    capture_mode = *m;
    *m = old;
    return cudaSuccess;
}

FAKE_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    guard g;
    stream *st = new stream();

    st->dev = cur_dev;
    F->streams.push_back(st);
    *s = (cudaStream_t)st;
    return ret(cudaSuccess);
}

FAKE_API cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    guard g;
    stream *st = stream_of(s);

    if (!st)
        return ret(cudaErrorInvalidResourceHandle);
    run_ops(st);
    return ret(cudaSuccess);
}

FAKE_API cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    guard g;
    stream *st = stream_of(s);

    if (!st || st == &F->legacy[st->dev])
        return ret(cudaErrorInvalidResourceHandle);
    run_ops(st); /* its work completes */
    for (size_t i = 0; i < F->streams.size(); i++)
        if (F->streams[i] == st)
            F->streams.erase(F->streams.begin() + i);
    for (event *ev : F->events)
        if (ev->st == st)
            ev->st = NULL; /* its records have all run */
    delete st;
    return ret(cudaSuccess);
}

/* ---------------------------------------------------------------------------
 * Events: a record is an op of its stream; a wait, an op of the waiting
 * stream that first runs the recording stream up to (at least) that record.
 * So work a stream does after a wait on another's event sees what that one
 * queued before the record, and nothing orders them without the wait.
 */

/* Run the recording stream up to (at least) ev's last record. */
static void event_complete(event *ev)
{
    if (ev->st && ev->done < ev->gen)
        run_ops(ev->st);
}

/* Ops that name ev, in every stream, become no-ops (it is gone). */
static void event_forget(event *ev)
{
    for (stream *st : F->streams)
        for (op &o : st->ops)
            if (o.ev == ev)
                o.kind = OP_NONE, o.ev = NULL;
    for (int d = 0; d < MAX_DEV; d++)
        for (op &o : F->legacy[d].ops)
            if (o.ev == ev)
                o.kind = OP_NONE, o.ev = NULL;
}

static event *event_of(cudaEvent_t e)
{
    for (event *ev : F->events)
        if ((cudaEvent_t)ev == e)
            return ev;
    fprintf(stderr, "fakecudart: event %p does not exist\n", (void *)e);
    return NULL;
}

FAKE_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    guard g;
    event *ev = new event();

    (void)flags;
    F->events.push_back(ev);
    *e = (cudaEvent_t)ev;
    return ret(cudaSuccess);
}

FAKE_API cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    return cudaEventCreateWithFlags(e, 0);
}

FAKE_API cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    guard g;
    event *ev = event_of(e);

    if (!ev)
        return ret(cudaErrorInvalidResourceHandle);
    /* A wait already queued on it stays valid, as in the real runtime: its
     * recording stream runs it now. */
    event_complete(ev);
    for (size_t i = 0; i < F->events.size(); i++)
        if (F->events[i] == ev)
            F->events.erase(F->events.begin() + i);
    event_forget(ev);
    delete ev;
    return ret(cudaSuccess);
}

FAKE_API cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    guard g;
    event *ev = event_of(e);
    stream *st = stream_of(s);

    if (!ev || !st)
        return ret(cudaErrorInvalidResourceHandle);
    if (ev->st != st)
        event_complete(ev); /* its earlier record completes first (a simplification) */
    ev->st = st;
    ev->gen++;
    op o = {};
    o.kind = OP_RECORD;
    o.ev = ev;
    o.gen = ev->gen;
    st->ops.push_back(o);
    return ret(cudaSuccess);
}

FAKE_API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    guard g;
    event *ev = event_of(e);
    stream *st = stream_of(s);

    (void)flags;
    if (!ev || !st)
        return ret(cudaErrorInvalidResourceHandle);
    if (ev->gen == 0 || ev->done >= ev->gen)
        return ret(cudaSuccess); /* never recorded, or already complete */
    op o = {};
    o.kind = OP_WAIT;
    o.ev = ev;
    o.gen = ev->gen;
    st->ops.push_back(o);
    return ret(cudaSuccess);
}

FAKE_API cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    guard g;
    event *ev = event_of(e);

    if (!ev)
        return ret(cudaErrorInvalidResourceHandle);
    event_complete(ev);
    return ret(cudaSuccess);
}

FAKE_API cudaError_t cudaEventQuery(cudaEvent_t e)
{
    guard g;
    event *ev = event_of(e);

    if (!ev)
        return ret(cudaErrorInvalidResourceHandle);
    return ret(ev->done >= ev->gen ? cudaSuccess : cudaErrorNotReady);
}

FAKE_API cudaError_t cudaDeviceSynchronize(void)
{
    guard g;

    run_device(cur_dev);
    return ret(cudaSuccess);
}

FAKE_API cudaError_t cudaDeviceCanAccessPeer(int *can, int d, int p)
{
    guard g;

    if (d < 0 || d >= F->ndev || p < 0 || p >= F->ndev)
        return ret(cudaErrorInvalidDevice);
    *can = d != p;
    return ret(cudaSuccess);
}

FAKE_API cudaError_t cudaDeviceEnablePeerAccess(int p, unsigned flags)
{
    guard g;

    if (p < 0 || p == cur_dev || p >= F->ndev)
        return ret(cudaErrorInvalidDevice);
    if (F->peer[cur_dev][p])
        return ret(cudaErrorPeerAccessAlreadyEnabled);
    F->peer[cur_dev][p] = true;
    return ret(cudaSuccess);
}

/* ---------------------------------------------------------------------------
 * Memory.
 */

FAKE_API cudaError_t cudaMalloc(void **p, size_t n)
{
    guard g;
    region r = {};
    void *view;

    n = (n + 255) & ~(size_t)255;
    view = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (view == MAP_FAILED)
        return ret(cudaErrorMemoryAllocation);
    memset(view, 0x5a, n); /* not zero: a load that wrote nothing shows */
    r.lo = next_range(&F->dev_next, n);
    r.hi = r.lo + n;
    r.kind = R_DEVICE;
    r.dev = cur_dev;
    r.view = (uintptr_t)view;
    F->regions.push_back(r);
    *p = (void *)r.lo;
    return ret(cudaSuccess);
}

FAKE_API cudaError_t cudaFree(void *p)
{
    guard g;

    for (int d = 0; d < F->ndev; d++)
        run_device(d); /* cudaFree synchronizes */
    for (size_t i = 0; i < F->regions.size(); i++) {
        const region &r = F->regions[i];

        if (r.kind == R_DEVICE && r.lo == (uintptr_t)p) {
            munmap((void *)r.view, r.hi > r.lo ? r.hi - r.lo : 1);
            F->regions.erase(F->regions.begin() + i);
            return ret(cudaSuccess);
        }
    }
    return ret(cudaErrorInvalidValue);
}

FAKE_API cudaError_t cudaMallocHost(void **p, size_t n)
{
    guard g;
    region r = {};
    void *m = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (m == MAP_FAILED)
        return ret(cudaErrorMemoryAllocation);
    r.lo = (uintptr_t)m;
    r.hi = r.lo + n;
    r.kind = R_PINNED;
    r.dev = cur_dev;
    r.alias = next_range(&F->alias_next, n);
    F->regions.push_back(r);
    *p = m;
    return ret(cudaSuccess);
}

FAKE_API cudaError_t cudaFreeHost(void *p)
{
    guard g;

    for (size_t i = 0; i < F->regions.size(); i++) {
        const region &r = F->regions[i];

        if (r.kind == R_PINNED && r.lo == (uintptr_t)p) {
            munmap(p, r.hi > r.lo ? r.hi - r.lo : 1);
            F->regions.erase(F->regions.begin() + i);
            return ret(cudaSuccess);
        }
    }
    return ret(cudaErrorInvalidValue);
}

FAKE_API cudaError_t cudaHostRegister(void *p, size_t n, unsigned flags)
{
    guard g;
    uintptr_t a = (uintptr_t)p;
    region r = {};

    if (!p || !n)
        return ret(cudaErrorInvalidValue);
    if (F->register_fail)
        return ret(cudaErrorNotSupported);
    for (const region &o : F->regions)
        if (o.kind != R_DEVICE && a < o.hi && o.lo < a + n)
            return ret(cudaErrorHostMemoryAlreadyRegistered);
    r.lo = a;
    r.hi = a + n;
    r.kind = R_REGISTERED;
    r.dev = cur_dev;
    r.alias = next_range(&F->alias_next, n);
    F->regions.push_back(r);
    return ret(cudaSuccess);
}

FAKE_API cudaError_t cudaHostUnregister(void *p)
{
    guard g;

    for (size_t i = 0; i < F->regions.size(); i++)
        if (F->regions[i].kind == R_REGISTERED && F->regions[i].lo == (uintptr_t)p) {
            F->regions.erase(F->regions.begin() + i);
            return ret(cudaSuccess);
        }
    return ret(cudaErrorHostMemoryNotRegistered);
}

FAKE_API cudaError_t cudaHostGetDevicePointer(void **d, void *p, unsigned flags)
{
    guard g;
    const region *r = find_host((uintptr_t)p);

    if (!r || flags)
        return ret(cudaErrorInvalidValue);
    *d = (void *)(r->alias + ((uintptr_t)p - r->lo));
    return ret(cudaSuccess);
}

FAKE_API cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *at, const void *p)
{
    guard g;
    uintptr_t a = (uintptr_t)p;
    const region *r;

    memset(at, 0, sizeof(*at));
    if ((r = find_device(a))) {
        at->type = cudaMemoryTypeDevice;
        at->device = r->dev;
        if (r->dev == cur_dev || F->peer[cur_dev][r->dev])
            at->devicePointer = (void *)p;
    } else if ((r = find_host(a))) {
        at->type = cudaMemoryTypeHost;
        at->device = r->dev;
        at->devicePointer = (void *)(r->alias + (a - r->lo));
        at->hostPointer = (void *)p;
    } else if ((r = find_alias(a))) {
        at->type = cudaMemoryTypeHost;
        at->device = r->dev;
        at->devicePointer = (void *)p;
        at->hostPointer = (void *)(r->lo + (a - r->alias));
    } else {
        at->type = cudaMemoryTypeUnregistered;
        at->device = -2;
        at->hostPointer = (void *)p;
    }
    return ret(cudaSuccess);
}

/* The driver's cuPointerGetAttributes, for the three attributes the copier
 * asks: the allocation of device memory, and whether it is an ordinary
 * cudaMalloc one. The boolean is written as one byte, as the driver may. */
static CUresult driver_pointer_attributes(unsigned n, CUpointer_attribute *which, void **data,
                                          CUdeviceptr p)
{
    guard g;
    const region *r = find_device((uintptr_t)p);

    for (unsigned i = 0; i < n; i++) {
        switch (which[i]) {
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
            *(CUdeviceptr *)data[i] = r ? r->lo : 0;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
            *(size_t *)data[i] = r ? r->hi - r->lo : 0;
            break;
        case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
            *(bool *)data[i] = r != NULL;
            break;
        default:
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    return CUDA_SUCCESS;
}

FAKE_API cudaError_t cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned ver,
                                                      unsigned long long flags,
                                                      cudaDriverEntryPointQueryResult *q)
{
    guard g;
    bool ok = !strcmp(sym, "cuPointerGetAttributes") && !F->no_driver;

    *fn = ok ? (void *)driver_pointer_attributes : NULL;
    if (q)
        *q = ok ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return ret(cudaSuccess);
}

/* Queue (st) or make (st NULL) a copy of n bytes. Under mu. */
static cudaError_t copy(void *dst, const void *src, size_t n, stream *st)
{
    uintptr_t t, s;

    if (!copy_reach((uintptr_t)dst, n, &t) || !copy_reach((uintptr_t)src, n, &s))
        return ret(cudaErrorInvalidValue);
    if (st)
        st->ops.push_back(op{OP_COPY, t, s, n, 0, 0, NULL, 0});
    else
        memmove((void *)t, (const void *)s, n);
    return ret(cudaSuccess);
}

FAKE_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k,
                                     cudaStream_t s)
{
    guard g;
    stream *st = stream_of(s);

    if (!st)
        return ret(cudaErrorInvalidResourceHandle);
    if (F->sticky[cur_dev] != cudaSuccess)
        return ret(cudaSuccess);
    if (st->dev != cur_dev) {
        fprintf(stderr, "fakecudart: cudaMemcpyAsync on a stream of device %d from device %d\n",
                st->dev, cur_dev);
        return ret(cudaErrorInvalidResourceHandle);
    }
    return copy(dst, src, n, st);
}

FAKE_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k)
{
    guard g;

    run_ops(&F->legacy[cur_dev]); /* after the legacy stream's work */
    if (F->sticky[cur_dev] != cudaSuccess)
        return ret(cudaSuccess);
    return copy(dst, src, n, NULL);
}

FAKE_API cudaError_t cudaMemset(void *p, int v, size_t n)
{
    guard g;
    uintptr_t t;

    if (!copy_reach((uintptr_t)p, n, &t))
        return ret(cudaErrorInvalidValue);
    F->legacy[cur_dev].ops.push_back(op{OP_MEMSET, t, 0, n, v, 0, NULL, 0});
    return ret(cudaSuccess);
}

/* ---------------------------------------------------------------------------
 * Kernels: registration by nvcc's generated code, and launches.
 */

FAKE_API void **__cudaRegisterFatBinary(void *fat)
{
    static void *handle[4];

    return handle;
}

FAKE_API void __cudaRegisterFatBinaryEnd(void **h)
{
}

FAKE_API void __cudaUnregisterFatBinary(void **h)
{
}

FAKE_API char __cudaInitModule(void **h)
{
    return 1;
}

FAKE_API void __cudaRegisterFunction(void **h, const char *host_fun, char *dev_fun,
                                     const char *name, int thread_limit, uint3 *tid, uint3 *bid,
                                     dim3 *bdim, dim3 *gdim, int *wsize)
{
    guard g;

    if (name && strstr(name, KERNEL))
        F->kernel = host_fun;
}

FAKE_API unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shmem,
                                              struct CUstream_st *s)
{
    cfg_grid = grid;
    cfg_block = block;
    cfg_shmem = shmem;
    cfg_stream = s;
    return 0;
}

FAKE_API cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shmem, void *s)
{
    *grid = cfg_grid;
    *block = cfg_block;
    *shmem = cfg_shmem;
    *(cudaStream_t *)s = cfg_stream;
    return cudaSuccess;
}

FAKE_API cudaError_t __cudaGetKernel(cudaKernel_t *k, const void *fun)
{
    *k = (cudaKernel_t)fun;
    return cudaSuccess;
}

/* Queue sfs_move_kernel(const struct desc *d, int host_dst) on s. */
static cudaError_t launch(const void *fun, dim3 grid, dim3 block, void **args, cudaStream_t s)
{
    guard g;
    stream *st = stream_of(s);

    if (!st)
        return ret(cudaErrorInvalidResourceHandle);
    if (F->sticky[cur_dev] != cudaSuccess)
        return ret(cudaSuccess);
    if (!fun || fun != F->kernel) {
        fprintf(stderr, "fakecudart: a launch of a kernel other than " KERNEL
                        " (the only one emulated; see its header)\n");
        return ret(cudaErrorInvalidDeviceFunction);
    }
    if (st->dev != cur_dev) {
        fprintf(stderr, "fakecudart: a launch on a stream of device %d from device %d\n", st->dev,
                cur_dev);
        return ret(cudaErrorInvalidResourceHandle);
    }
    if (grid.x == 0 || grid.y == 0 || grid.z != 1 || grid.y > 65535 || block.x == 0 ||
        block.x * block.y * block.z > 1024)
        return ret(cudaErrorInvalidConfiguration);
    st->ops.push_back(op{OP_KERNEL, 0, *(const uintptr_t *)args[0], grid.x, 0, grid.y, NULL, 0});
    return ret(cudaSuccess);
}

FAKE_API cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 grid, dim3 block, void **args,
                                        size_t shmem, cudaStream_t s)
{
    return launch((const void *)k, grid, block, args, s);
}

/* Code built by older nvcc, or with __NV_LEGACY_LAUNCH, launches through
 * the public call. */
FAKE_API cudaError_t cudaLaunchKernel(const void *fun, dim3 grid, dim3 block, void **args,
                                      size_t shmem, cudaStream_t s)
{
    return launch(fun, grid, block, args, s);
}

/* ---------------------------------------------------------------------------
 * munmap, when preloaded: unmapping registered host memory is the bug of a
 * registration that outlives its mapping (the pages stay pinned, and a new
 * mapping at that address would be read through the old ones).
 */
FAKE_API int munmap(void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;

    pthread_mutex_lock(&mu);
    if (F) {
        for (const region &r : F->regions)
            if (r.kind == R_REGISTERED && a < r.hi && r.lo < a + n) {
                fprintf(stderr, "fakecudart: munmap(%p, %zu) of registered memory [%p, %p)\n", p, n,
                        (void *)r.lo, (void *)r.hi);
                abort();
            }
    }
    pthread_mutex_unlock(&mu);
    if (next_munmap)
        return next_munmap(p, n);
    return (int)syscall(SYS_munmap, p, n);
}
