/* SPDX-License-Identifier: MIT */
/*
 * dataplane.c - the shard bytes: segments of huge-page memfds.
 *
 * The creator makes nsegments memfds of segment_size bytes each. It asks for
 * MFD_HUGETLB first; with no huge pages reserved the mmap of such a memfd
 * fails with ENOMEM, and then it falls back to ordinary memfds, says so once
 * in the log, and remembers the failure so later segments do not retry
 * (mimalloc's habit). Each memfd is sealed once sized (no shrink, no grow, no
 * further seals), so no attached process can truncate the bytes under the
 * others. Other processes receive the fds over the attach socket and map
 * them; their sizes are checked against the header first.
 *
 * Slot s lives in segment s / slots_per_segment at (s % slots_per_segment) *
 * stride; sfs_dp_addr() uses shift + mask when slots_per_segment is a power
 * of two.
 */
#include "cache_i.h"

#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004U
#endif

static int make_segment(uint64_t size, bool huge, bool populate, int numa_node, int *fd_out,
                        uint8_t **base_out)
{
    int fd, r;
    void *p;

    fd = memfd_create("shardfs-data", MFD_CLOEXEC | MFD_ALLOW_SEALING | (huge ? MFD_HUGETLB : 0));
    if (fd < 0)
        return -errno;
    if (ftruncate(fd, (off_t)size) < 0) {
        r = -errno;
        goto out_close;
    }
    /* Every attached process holds this fd: without the seals any of them
     * could ftruncate it and every other reader would die of SIGBUS; without
     * F_SEAL_SEAL one could add F_SEAL_WRITE and break every later load. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        r = -errno;
        goto out_close;
    }
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        r = -errno;
        goto out_close;
    }
    if (numa_node >= 0 && numa_available() >= 0) {
        struct bitmask *nodes = numa_allocate_nodemask();

        numa_bitmask_setbit(nodes, (unsigned)numa_node);
        if (mbind(p, size, MPOL_BIND, nodes->maskp, nodes->size + 1, 0) < 0)
            sfs_log(LOG_WARNING, "data plane: mbind to node %d failed: %s", numa_node,
                    strerror(errno));
        numa_free_nodemask(nodes);
    }
    if (populate || huge) {
        /* Huge pages: fault them all now, or a later touch dies with SIGBUS
         * when the pool runs dry. Ordinary pages: only when asked. */
        if (madvise(p, size, MADV_POPULATE_WRITE) < 0) {
            r = -errno;
            munmap(p, size);
            if (r == -EINVAL) /* kernel without POPULATE_WRITE: touch by hand */
                goto touch;
            goto out_close;
        }
    }
    *fd_out = fd;
    *base_out = p;
    return 0;

touch:
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        r = -errno;
        goto out_close;
    }
    *fd_out = fd;
    *base_out = p;
    return 0;
out_close:
    close(fd);
    return r;
}

static int alloc_tables(struct sfs_cache *c)
{
    c->seg_fds = calloc(c->nsegments, sizeof(*c->seg_fds));
    c->seg_base = calloc(c->nsegments, sizeof(*c->seg_base));
    if (!c->seg_fds || !c->seg_base)
        return -ENOMEM;
    for (uint32_t i = 0; i < c->nsegments; i++)
        c->seg_fds[i] = -1;
    return 0;
}

static int create_all(struct sfs_cache *c, bool huge, int numa_node, bool populate)
{
    int r;

    for (uint32_t i = 0; i < c->nsegments; i++) {
        r = make_segment(c->seg_size, huge, populate, numa_node, &c->seg_fds[i], &c->seg_base[i]);
        if (r < 0)
            return r;
    }
    return 0;
}

int sfs_dp_create(struct sfs_cache *c, int hugepages, int numa_node, bool populate)
{
    bool huge = hugepages != SFS_HUGEPAGES_OFF;
    int r;

    r = alloc_tables(c);
    if (r < 0)
        return r;
    r = create_all(c, huge, numa_node, populate);
    if (r < 0 && huge && hugepages == SFS_HUGEPAGES_AUTO) {
        sfs_log(LOG_NOTICE, "data plane: huge pages unavailable (%s), using ordinary memfds",
                strerror(-r));
        sfs_dp_unmap(c);
        r = alloc_tables(c);
        if (r < 0)
            return r;
        huge = false;
        r = create_all(c, false, numa_node, populate);
    }
    if (r < 0) {
        sfs_log(LOG_ERR, "data plane: %u segments of %llu bytes: %s", c->nsegments,
                (unsigned long long)c->seg_size, strerror(-r));
        return r;
    }
    c->hugepages = huge;
    sfs_log(LOG_INFO, "data plane: %u %s segments of %llu bytes", c->nsegments,
            huge ? "huge-page" : "ordinary", (unsigned long long)c->seg_size);
    return 0;
}

/* Map segments received from the creator. Takes ownership of every fd. */
int sfs_dp_map(struct sfs_cache *c, const int *fds, uint32_t n)
{
    struct stat st;
    int r;

    r = n == c->nsegments ? alloc_tables(c) : -EBADMSG;
    if (r < 0) {
        for (uint32_t i = 0; i < n; i++)
            close(fds[i]);
        return r;
    }
    for (uint32_t i = 0; i < n; i++)
        c->seg_fds[i] = fds[i];
    for (uint32_t i = 0; i < n; i++) {
        void *p;

        if (fstat(fds[i], &st) < 0)
            return -errno;
        if ((uint64_t)st.st_size < c->seg_size)
            return -EBADMSG; /* truncated segment: refuse, never SIGBUS later */
        p = mmap(NULL, c->seg_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
        if (p == MAP_FAILED)
            return -errno;
        c->seg_base[i] = p;
        /* Map every page now (the creator already allocated them): otherwise
         * the first O_DIRECT read into each slot pays a page fault inside
         * io_uring_enter, and the first pass of a rank runs at half speed.
         * Best effort: an old kernel without POPULATE_WRITE just faults later. */
        (void)madvise(p, c->seg_size, MADV_POPULATE_WRITE);
    }
    return 0;
}

void sfs_dp_unmap(struct sfs_cache *c)
{
    if (c->seg_base) {
        for (uint32_t i = 0; i < c->nsegments; i++)
            if (c->seg_base[i])
                munmap(c->seg_base[i], c->seg_size);
    }
    if (c->seg_fds) {
        for (uint32_t i = 0; i < c->nsegments; i++)
            if (c->seg_fds[i] >= 0)
                close(c->seg_fds[i]);
    }
    free(c->seg_base);
    free(c->seg_fds);
    c->seg_base = NULL;
    c->seg_fds = NULL;
}
