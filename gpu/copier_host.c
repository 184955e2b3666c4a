/* SPDX-License-Identifier: MIT */
/*
 * copier_host.c - the host copier: memcpy between the data plane and host
 * destinations. Used when there is no GPU, when the library was built
 * without CUDA, and for the scheduler-free test and benchmark paths.
 *
 * A load batch, or a batch of write-behind dumps, of HOST_STREAM_MIN bytes
 * or more is copied with
 * non-temporal stores (x86-64): memcpy of each piece (32 KiB pages of a
 * vLLM block) stays below glibc's own streaming threshold, so every
 * destination line is read before it is written: half as much memory
 * traffic again, for bytes that leave the caches before anyone reads them (a batch
 * of a few MiB, on its way to a GPU or to a KV cache the size of RAM).
 * Write-through dumps keep memcpy: the slot they write is read at once by
 * the store's write. A write-behind dump's store write starts only once
 * its task has ended (complete.c holds it back), after the rest of a batch
 * this big went through the caches, so its batch is streamed too: 64 x
 * 512 KiB write-behind dumps, best of 30, back to back on a loaded 2-CPU
 * host: 5.08-5.13 ms with memcpy, 4.52-4.63 ms streamed, numpy's copy of
 * the same bytes 4.58-4.71 ms. Pieces under 4 KiB, and the ends of a piece
 * not 16-byte aligned, go through memcpy.
 */
#include "copier_i.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define HOST_STREAM_MIN (1u << 20)

/* memcpy with non-temporal stores; the caller fences (host_load). */
static void stream_copy(void *dst, const void *src, size_t len)
{
#if defined(__x86_64__)
    char *d = dst;
    const char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;

    if (len < 4096) {
        memcpy(dst, src, len);
        return;
    }
    memcpy(d, s, head);
    d += head;
    s += head;
    len -= head;
    for (; len >= 64; d += 64, s += 64, len -= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));

        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    memcpy(d, s, len);
#else
    memcpy(dst, src, len);
#endif
}

static int host_copy(struct sfs_copier *cp, struct sfs_copy *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!v[i].dst || !v[i].src) {
            v[i].result = -EFAULT;
            continue;
        }
        memcpy(v[i].dst, v[i].src, v[i].len);
        v[i].result = 0;
    }
    return 0;
}

static int host_load(struct sfs_copier *cp, struct sfs_copy *v, size_t n)
{
    uint64_t total = 0;

    for (size_t i = 0; i < n; i++)
        total += v[i].len;
    if (total < HOST_STREAM_MIN)
        return host_copy(cp, v, n);
    for (size_t i = 0; i < n; i++) {
        if (!v[i].dst || !v[i].src) {
            v[i].result = -EFAULT;
            continue;
        }
        stream_copy(v[i].dst, v[i].src, v[i].len);
        v[i].result = 0;
    }
#if defined(__x86_64__)
    _mm_sfence(); /* the streamed lines are visible before the batch completes */
#endif
    return 0;
}

static void host_close(struct sfs_copier *cp)
{
    free(cp);
}

static const struct sfs_copier_ops host_ops = {
    .name = "host",
    .host_memory = true,
    .load = host_load,
    .dump = host_copy,
    .dump_behind = host_load, /* streamed as a load is: nobody reads the slots soon */
    .close = host_close,
    .load_inline = host_copy, /* memcpy: any thread */
};

struct sfs_copier *sfs_copier_host_open(int *err)
{
    struct sfs_copier *cp = calloc(1, sizeof(*cp));

    if (!cp) {
        *err = -ENOMEM;
        return NULL;
    }
    cp->ops = &host_ops;
    return cp;
}
