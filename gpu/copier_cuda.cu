/* SPDX-License-Identifier: MIT */
/*
 * copier_cuda.cu - the CUDA copier: one kernel launch per batch of shards.
 *
 * Key idea (measured on an H200, docs/rank.md): one cudaMemcpyAsync per
 * shard runs at 5 GB/s for 16 KiB shards, because every call pays a fixed
 * cost; a kernel that reads the device-mapped host data plane directly moves
 * 51 GB/s at every shard size. So each rank's mapping of every data-plane
 * segment is registered once (cudaHostRegister, mapped | portable), and a
 * batch of copies becomes one array of descriptors (src, dst, len) uploaded
 * with the batch, and one launch of a gather kernel: grid.y walks
 * descriptors, grid.x the 64 KiB chunks of a shard, each thread moving
 * 16-byte vectors on whichever side the addresses allow it. Dumps launch the
 * same kernel the other way (a scatter into mapped host memory). Shards of at
 * least memcpy_min bytes (4 MiB; 0 = never; copier.c chooses it) go through
 * cudaMemcpyAsync, which is as fast there.
 *
 * The kernel may only touch memory our device can reach, or the context
 * dies for the whole process. So every end of every copy is placed first:
 * the data plane (through its registration), device memory of our device,
 * of a peer whose memory we may map (peer access), managed memory, pinned
 * host memory with a device mapping go to the kernel; any other device
 * memory goes through cudaMemcpyAsync, and plain pageable host memory is
 * copied by the CPU when the other end is host memory too.
 *
 * Registrations are per process (a mapping registered twice fails, and
 * unregistering it under another rank's feet faults that rank's kernel), so
 * they live in one refcounted table. A segment that cannot be registered
 * (hugetlb on some drivers, a limit) is copied through cudaMemcpyAsync,
 * slower but correct, and says so once in the log.
 *
 * cudaSetDevice is per thread: the copier thread sets its device before
 * every batch, and open and close run on a short-lived thread of their own
 * so the caller's current device is left as it was. CUDA errors become
 * -errno here, once.
 *
 * A small task whose keys are all Ready is gathered on the thread that
 * submitted it (load_inline), through a third slot with its own stream and
 * descriptor buffers, one caller at a time (a try-lock: a second caller, or
 * a thread whose current device is not ours, gets -EAGAIN and the rank
 * hands the batch to the copier thread instead). That thread's current
 * device is never changed, and its capture mode only for the call.
 *
 * This file: the kernel, batches, open and close. The registration table
 * and the placing of a copy's ends are copier_cuda_place.cu's; the types
 * both share, copier_cuda_i.h's.
 */
#include "copier_cuda_i.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

/* ---------------------------------------------------------------------------
 * The kernel.
 */

template <bool V> __device__ __forceinline__ uint4 load16(const uint8_t *p)
{
    uint4 v;

    if (V)
        return *(const uint4 *)p;
    memcpy(&v, p, sizeof(v)); /* no alignment known: byte loads */
    return v;
}

template <bool V> __device__ __forceinline__ void store16(uint8_t *p, uint4 v)
{
    if (V)
        *(uint4 *)p = v;
    else
        memcpy(p, &v, sizeof(v));
}

/* Move n bytes s -> t with this block's threads. VS/VT: the source/target
 * side moves as aligned 16-byte vectors (after a head of bytes that aligns
 * it); the other side byte by byte. Both, when the two are congruent mod 16. */
template <bool VS, bool VT>
__device__ __forceinline__ void move_bytes(const uint8_t *s, uint8_t *t, uint64_t n)
{
    const uint64_t bd = blockDim.x;
    const uintptr_t al = VS ? (uintptr_t)s : (uintptr_t)t;
    uint64_t head = (16 - (al & 15)) & 15;

    if (head > n)
        head = n;
    for (uint64_t k = threadIdx.x; k < head; k += bd)
        t[k] = s[k];
    s += head;
    t += head;
    n -= head;

    const uint64_t nv = n / 16;
    uint64_t i = threadIdx.x;

    /* Four loads in flight per thread before the stores: reads of mapped
     * host memory cross PCIe and need many outstanding requests. */
    for (; i + 3 * bd < nv; i += 4 * bd) {
        uint4 a = load16<VS>(s + 16 * i), b = load16<VS>(s + 16 * (i + bd)),
              c = load16<VS>(s + 16 * (i + 2 * bd)), e = load16<VS>(s + 16 * (i + 3 * bd));
        store16<VT>(t + 16 * i, a);
        store16<VT>(t + 16 * (i + bd), b);
        store16<VT>(t + 16 * (i + 2 * bd), c);
        store16<VT>(t + 16 * (i + 3 * bd), e);
    }
    for (; i < nv; i += bd)
        store16<VT>(t + 16 * i, load16<VS>(s + 16 * i));
    for (uint64_t k = nv * 16 + threadIdx.x; k < n; k += bd)
        t[k] = s[k];
}

/* grid.y: one descriptor each; grid.x: its 64 KiB chunks. When source and
 * target disagree mod 16, the host-memory side gets the vectors (it crosses
 * PCIe): the target for dumps (host_dst), the source for loads. */
__global__ void __launch_bounds__(THREADS) sfs_move_kernel(const struct desc *d, int host_dst)
{
    const struct desc x = d[blockIdx.y];
    const uint64_t start = (uint64_t)blockIdx.x * CHUNK;

    if (start >= x.len)
        return;
    const uint64_t n = x.len - start < CHUNK ? x.len - start : CHUNK;
    const uint8_t *s = x.src + start;
    uint8_t *t = x.dst + start;

    if ((((uintptr_t)s ^ (uintptr_t)t) & 15) == 0)
        move_bytes<true, true>(s, t, n);
    else if (host_dst)
        move_bytes<false, true>(s, t, n);
    else
        move_bytes<true, false>(s, t, n);
}

/* ---------------------------------------------------------------------------
 * Batches.
 */

/* Queue a batch of at most BATCH_MAX in slot `k`: each element by the
 * kernel or cudaMemcpyAsync on the slot's stream, or by the CPU right here.
 * The slot must be finished. Results of copies that could not be queued are
 * set now; cuda_finish() sets the others. */
static void cuda_start(struct cuda_copier *cc, struct sfs_copy *v, size_t n, bool dump, int k)
{
    struct slot *sl = &cc->slots[k];
    cudaError_t e;
    uint64_t maxlen = 0;
    size_t nd = 0, nasync = 0;
    void *gate = NULL;
    cudaError_t gate_err = cudaSuccess;

    sl->v = v;
    sl->n = n;
    sl->launch = cudaSuccess;
    sl->queued = false;
    e = cudaSetDevice(cc->device); /* per thread: the copier thread's (an inline
                                      caller's is ours already: a no-op) */
    if (e != cudaSuccess) {
        int err = cuda_errno(e);

        (void)cudaGetLastError();
        for (size_t i = 0; i < n; i++) {
            v[i].result = err;
            sl->path[i] = PATH_DONE;
        }
        return;
    }
    if (k != SLOT_INLINE)
        capture_mode_local(); /* the copier thread's own, kept (inline: the caller sets it) */
    sl->nspans = 0;
    for (size_t i = 0; i < n; i++) {
        struct place s, d;

        sl->path[i] = PATH_DONE;
        v[i].result = 0;
        if (!v[i].src || !v[i].dst) {
            v[i].result = -EFAULT;
            continue;
        }
        if (v[i].len == 0)
            continue;
        if (v[i].gate && v[i].gate != gate) {
            /* A dump whose source a program's stream is still writing
             * (sfs_rank_dumpv_after): everything of this batch queued from
             * here on waits for the gate. A task's copies are consecutive,
             * so one wait serves them. */
            gate = v[i].gate;
            gate_err = cudaStreamWaitEvent(sl->stream, (cudaEvent_t)gate, 0);
            if (gate_err != cudaSuccess)
                (void)cudaGetLastError();
        }
        if (v[i].gate && gate_err != cudaSuccess) {
            v[i].result = cuda_errno(gate_err);
            continue;
        }
        cuda_place_of(cc, sl, v[i].src, v[i].len, &s);
        cuda_place_of(cc, sl, v[i].dst, v[i].len, &d);
        if (s.bad || d.bad) {
            v[i].result = -EFAULT;
            continue;
        }
        if (s.kernel && d.kernel && !(cc->memcpy_min && v[i].len >= cc->memcpy_min)) {
            sl->hdesc[nd].src = (const uint8_t *)s.dev;
            sl->hdesc[nd].dst = (uint8_t *)d.dev;
            sl->hdesc[nd].len = v[i].len;
            if (v[i].len > maxlen)
                maxlen = v[i].len;
            nd++;
            sl->path[i] = PATH_KERNEL;
            continue;
        }
        if (s.host && d.host) {
            /* Both in host memory: the CPU copies now, after the gate. */
            e = v[i].gate ? cudaEventSynchronize((cudaEvent_t)v[i].gate) : cudaSuccess;
            if (e != cudaSuccess) {
                v[i].result = cuda_errno(e);
                (void)cudaGetLastError();
                continue;
            }
            memcpy(v[i].dst, v[i].src, v[i].len);
            continue;
        }
        /* Device memory the kernel may not touch, or pageable memory on one
         * side, or a shard big enough for the copy engines: the runtime
         * stages it (host pointers: unified addressing finds the aliases). */
        e = cudaMemcpyAsync(v[i].dst, v[i].src, v[i].len, cudaMemcpyDefault, sl->stream);
        if (e != cudaSuccess) {
            v[i].result = cuda_errno(e);
            (void)cudaGetLastError();
            continue;
        }
        sl->path[i] = PATH_ASYNC;
        nasync++;
    }
    if (nd) {
        /* grid.x <= 2^31 / CHUNK (shards are < 2 GiB), grid.y <= BATCH_MAX. */
        dim3 grid((unsigned)((maxlen + CHUNK - 1) / CHUNK), (unsigned)nd);

        sl->launch = cudaMemcpyAsync(sl->ddesc, sl->hdesc, nd * sizeof(struct desc),
                                     cudaMemcpyHostToDevice, sl->stream);
        if (sl->launch == cudaSuccess) {
            (void)cudaGetLastError(); /* what we read next is this launch's */
            sfs_move_kernel<<<grid, THREADS, 0, sl->stream>>>(sl->ddesc, dump ? 1 : 0);
            sl->launch = cudaGetLastError();
        } else {
            (void)cudaGetLastError();
        }
    }
    /* A failed launch too: the copies queued before it may still run. */
    sl->queued = nd || nasync;
}

/* Wait for slot `k`'s batch: every copy complete (the caller may release a
 * slot, read a destination; hdesc may be refilled), every result set. */
static void cuda_finish(struct cuda_copier *cc, int k)
{
    struct slot *sl = &cc->slots[k];
    cudaError_t sync = cudaSuccess;

    if (sl->queued) {
        sync = cudaStreamSynchronize(sl->stream);
        if (sync != cudaSuccess)
            (void)cudaGetLastError();
        sl->queued = false;
    }
    for (size_t i = 0; i < sl->n; i++) {
        if (sl->path[i] == PATH_KERNEL)
            sl->v[i].result = cuda_errno(sl->launch != cudaSuccess ? sl->launch : sync);
        else if (sl->path[i] == PATH_ASYNC)
            sl->v[i].result = cuda_errno(sync);
    }
    /* Relaxed exchange: only "was it logged" matters. */
    if ((sl->launch != cudaSuccess || sync != cudaSuccess) &&
        !__atomic_exchange_n(&cc->failed_once, true, __ATOMIC_RELAXED)) {
        sfs_log(LOG_ERR, "cuda copier: device %d: a batch of %zu failed: %s", cc->device, sl->n,
                cudaGetErrorString(sl->launch != cudaSuccess ? sl->launch : sync));
    }
    sl->n = 0;
}

/* A whole batch, synchronously, through slot 0 (the copier thread uses
 * start/finish instead; slot 0 is finished whenever it calls this). */
static int cuda_batch(struct cuda_copier *cc, struct sfs_copy *v, size_t n, bool dump)
{
    /* The descriptor buffers hold BATCH_MAX entries. */
    for (size_t off = 0; off < n; off += BATCH_MAX) {
        size_t k = n - off < BATCH_MAX ? n - off : BATCH_MAX;

        cuda_start(cc, v + off, k, dump, 0);
        cuda_finish(cc, 0);
    }
    return 0;
}

static int cuda_load(struct sfs_copier *cp, struct sfs_copy *v, size_t n)
{
    return cuda_batch((struct cuda_copier *)cp, v, n, false);
}

static int cuda_dump(struct sfs_copier *cp, struct sfs_copy *v, size_t n)
{
    return cuda_batch((struct cuda_copier *)cp, v, n, true);
}

static int cuda_start_op(struct sfs_copier *cp, struct sfs_copy *v, size_t n, bool dump, int k)
{
    if (n > BATCH_MAX || k < 0 || k >= NSLOTS_THREAD)
        return -EINVAL;
    cuda_start((struct cuda_copier *)cp, v, n, dump, k);
    return 0;
}

static void cuda_finish_op(struct sfs_copier *cp, int k)
{
    cuda_finish((struct cuda_copier *)cp, k);
}

/* A small load on the caller's thread: one gather launch on the inline
 * slot's stream, then its synchronize, so the batch is complete on return
 * (stream-ordered after nothing of the program's: as the copier thread's
 * batches, see rank.md's GPU path, item 8). -EAGAIN, touching nothing, when
 * another thread holds the inline slot or this thread's current device is
 * not ours: making ours current here would change the caller's (and, on a
 * thread that never used CUDA, create a context for its old one when set
 * back). The capture mode is relaxed for the call and then put back, so a
 * graph captured in global mode elsewhere (or on this thread, on another
 * stream) neither breaks these calls nor is broken by them. */
static int cuda_load_inline(struct sfs_copier *cp, struct sfs_copy *v, size_t n)
{
    struct cuda_copier *cc = (struct cuda_copier *)cp;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    int cur = -1;

    if (n > BATCH_MAX || pthread_mutex_trylock(&cc->inline_mu) != 0)
        return -EAGAIN;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != cc->device) {
        (void)cudaGetLastError();
        pthread_mutex_unlock(&cc->inline_mu);
        return -EAGAIN;
    }
    if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) {
        (void)cudaGetLastError();
        pthread_mutex_unlock(&cc->inline_mu);
        return -EAGAIN;
    }
    cuda_start(cc, v, n, false, SLOT_INLINE);
    cuda_finish(cc, SLOT_INLINE);
    if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) /* the caller's again */
        (void)cudaGetLastError();
    pthread_mutex_unlock(&cc->inline_mu);
    return 0;
}

/* ---------------------------------------------------------------------------
 * Open and close, each on a thread of its own.
 */

/* Run fn(arg) on a new thread and wait for it: cudaSetDevice there leaves
 * the caller's current device alone (setting it back afterwards would create
 * a context on device 0 in a thread that never used one). */
static int run_apart(void *(*fn)(void *), void *arg)
{
    pthread_t th;
    int r = pthread_create(&th, NULL, fn, arg);

    if (r)
        return -r;
    pthread_join(th, NULL);
    return 0;
}

/* Register and map one piece of the data plane. A piece that cannot be is
 * left to cudaMemcpyAsync (correct, slower), and the log says why. */
static void seg_add(struct cuda_copier *cc, uintptr_t base, size_t len)
{
    struct seg *s = &cc->segs[cc->nseg++];
    cudaPointerAttributes at;
    void *dev = NULL;
    int r;

    *s = (struct seg){base, len, 0, 0};
    r = cuda_reg_get(base, len, &s->reg);
    if (r < 0) {
        sfs_log(LOG_WARNING,
                "cuda copier: device %d: cannot register %zu bytes of the data plane at %p "
                "(%s): copies from it go through cudaMemcpyAsync",
                cc->device, len, (void *)base, strerror(-r));
        return;
    }
    if (cudaHostGetDevicePointer(&dev, (void *)base, 0) != cudaSuccess || !dev) {
        (void)cudaGetLastError();
        sfs_log(LOG_WARNING, "cuda copier: device %d: the data plane at %p has no device mapping",
                cc->device, (void *)base);
        return;
    }
    /* The kernel addresses the whole piece through this one alias: check
     * that its last byte is where the alias says. */
    if (cudaPointerGetAttributes(&at, (void *)(base + len - 1)) != cudaSuccess ||
        at.type != cudaMemoryTypeHost || (uintptr_t)at.devicePointer != (uintptr_t)dev + len - 1) {
        (void)cudaGetLastError();
        sfs_log(LOG_WARNING,
                "cuda copier: device %d: the data plane at %p is not mapped as one range",
                cc->device, (void *)base);
        return;
    }
    s->dev = (uintptr_t)dev;
}

struct open_job {
    struct cuda_copier *cc;
    struct sfs_cache *c;
    int err;
};

static int open_here(struct cuda_copier *cc, struct sfs_cache *c)
{
    struct sfs_cache_info info;
    size_t npieces = 0;
    uint32_t mapped = 0;
    cudaError_t e;

    capture_mode_local();
    e = cudaSetDevice(cc->device);
    if (e == cudaSuccess)
        e = cudaGetDeviceCount(&cc->ndev);
    for (int k = 0; k < NSLOTS && e == cudaSuccess; k++) {
        struct slot *sl = &cc->slots[k];

        e = cudaStreamCreateWithFlags(&sl->stream, cudaStreamNonBlocking);
        if (e == cudaSuccess)
            e = cudaMallocHost((void **)&sl->hdesc, BATCH_MAX * sizeof(struct desc));
        if (e == cudaSuccess)
            e = cudaMalloc((void **)&sl->ddesc, BATCH_MAX * sizeof(struct desc));
    }
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&cc->gate_stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_errno(e);
    }
    cc->peer = (signed char *)calloc(cc->ndev > 0 ? (size_t)cc->ndev : 1, 1);
    if (!cc->peer)
        return -ENOMEM;
    cc->ptr_attrs = cuda_driver_ptr_attrs();

    sfs_cache_info(c, &info);
    for (uint32_t i = 0; i < info.nsegments; i++) {
        size_t len = 0;

        if (!sfs_cache_segment(c, i, &len))
            break;
        npieces += (len + REG_PIECE_MAX - 1) / REG_PIECE_MAX;
    }
    cc->segs = (struct seg *)calloc(npieces ? npieces : 1, sizeof(*cc->segs));
    if (!cc->segs)
        return -ENOMEM;
    for (uint32_t i = 0; i < info.nsegments; i++) {
        size_t len = 0;
        uintptr_t base = (uintptr_t)sfs_cache_segment(c, i, &len);

        if (!base)
            break;
        for (size_t off = 0; off < len; off += REG_PIECE_MAX)
            seg_add(cc, base + off, len - off < REG_PIECE_MAX ? len - off : REG_PIECE_MAX);
    }
    for (uint32_t i = 0; i < cc->nseg; i++)
        mapped += cc->segs[i].dev != 0;
    sfs_log(LOG_INFO, "cuda copier: device %d: %u of %u data-plane pieces mapped%s", cc->device,
            mapped, cc->nseg, cc->ptr_attrs ? "" : " (no driver pointer queries)");
    return 0;
}

static void *open_main(void *arg)
{
    struct open_job *j = (struct open_job *)arg;

    j->err = open_here(j->cc, j->c);
    return NULL;
}

static void close_here(struct cuda_copier *cc)
{
    if (cudaSetDevice(cc->device) != cudaSuccess)
        (void)cudaGetLastError();
    for (int k = 0; k < NSLOTS; k++)
        if (cc->slots[k].stream)
            cudaStreamSynchronize(cc->slots[k].stream);
    for (uint32_t i = 0; i < cc->nseg; i++)
        if (cc->segs[i].reg)
            cuda_reg_put(cc->segs[i].reg);
    for (int k = 0; k < NSLOTS; k++) {
        struct slot *sl = &cc->slots[k];

        if (sl->ddesc)
            cudaFree(sl->ddesc);
        if (sl->hdesc)
            cudaFreeHost(sl->hdesc);
        if (sl->stream)
            cudaStreamDestroy(sl->stream);
    }
    if (cc->gate_stream)
        cudaStreamDestroy(cc->gate_stream); /* its gates may outlive it */
    (void)cudaGetLastError();
}

static void *close_main(void *arg)
{
    capture_mode_local();
    close_here((struct cuda_copier *)arg);
    return NULL;
}

/* Before the cache is detached (its mapping goes with it). */
static void cuda_close(struct sfs_copier *cp)
{
    struct cuda_copier *cc = (struct cuda_copier *)cp;

    if (!cc)
        return;
    if (run_apart(close_main, cc) < 0) {
        /* No thread to spare: here, at the cost of this thread's device. */
        int prev = -1;

        if (cudaGetDevice(&prev) != cudaSuccess)
            (void)cudaGetLastError();
        close_here(cc);
        if (prev >= 0 && prev != cc->device && cudaSetDevice(prev) != cudaSuccess)
            (void)cudaGetLastError();
    }
    if (cc->mutexes) {
        pthread_mutex_destroy(&cc->peer_mu);
        pthread_mutex_destroy(&cc->inline_mu);
        pthread_mutex_destroy(&cc->gate_mu);
    }
    free(cc->segs);
    free(cc->peer);
    free(cc);
}

/* A gate: our own event, recorded on gate_stream after a wait for the
 * program's event, so it fires after the record the event had at submit
 * (whatever the program does with its event later). On the submitting
 * thread, whose current device is put back. */
static int cuda_gate_open(struct sfs_copier *cp, void *event, void **gate)
{
    struct cuda_copier *cc = (struct cuda_copier *)cp;
    cudaEvent_t g = NULL;
    int prev = -1;
    cudaError_t e;

    *gate = NULL;
    if (cudaGetDevice(&prev) != cudaSuccess)
        (void)cudaGetLastError();
    e = cudaSetDevice(cc->device);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&g, cudaEventDisableTiming);
    if (e == cudaSuccess) {
        pthread_mutex_lock(&cc->gate_mu);
        e = cudaStreamWaitEvent(cc->gate_stream, (cudaEvent_t)event, 0);
        if (e == cudaSuccess)
            e = cudaEventRecord(g, cc->gate_stream);
        pthread_mutex_unlock(&cc->gate_mu);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (g)
            cudaEventDestroy(g);
    } else {
        *gate = (void *)g;
    }
    if (prev >= 0 && prev != cc->device && cudaSetDevice(prev) != cudaSuccess)
        (void)cudaGetLastError();
    return cuda_errno(e);
}

static void cuda_gate_close(void *gate)
{
    if (cudaEventDestroy((cudaEvent_t)gate) != cudaSuccess)
        (void)cudaGetLastError();
}

static const struct sfs_copier_ops cuda_ops = {
    "cuda",        cuda_load,     cuda_dump,      cuda_close,      cuda_start_op, cuda_finish_op,
    cuda_load_inline, false /* host_memory */, cuda_gate_open, cuda_gate_close,
};

extern "C" int sfs_cuda_device_count(void)
{
    int n = 0;

    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" struct sfs_copier *sfs_copier_cuda_open(int device, struct sfs_cache *c,
                                                   size_t memcpy_min, int *err)
{
    struct cuda_copier *cc = (struct cuda_copier *)calloc(1, sizeof(*cc));
    struct open_job job = {cc, c, 0};
    int r;

    if (!cc) {
        *err = -ENOMEM;
        return NULL;
    }
    cc->cp.ops = &cuda_ops;
    cc->device = device;
    pthread_mutex_init(&cc->peer_mu, NULL);
    pthread_mutex_init(&cc->inline_mu, NULL);
    pthread_mutex_init(&cc->gate_mu, NULL);
    cc->mutexes = true;
    cc->memcpy_min = memcpy_min;
    r = run_apart(open_main, &job);
    if (r == 0)
        r = job.err;
    if (r < 0) {
        *err = r;
        cuda_close(&cc->cp);
        return NULL;
    }
    *err = 0;
    return &cc->cp;
}
