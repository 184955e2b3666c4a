/* SPDX-License-Identifier: MIT */
/*
 * memmap.c - is a range of this process's address space memory the CPU may
 * read (and write)? The host copier's question about every address of a
 * task, asked once at submit (task.c), so that a device pointer handed to a
 * rank that copies with memcpy -- a library built without CUDA, a worker on
 * a GPU whose copier fell back to the host one -- is a clean -EFAULT and not
 * a SIGSEGV in the copier thread. CUDA's device allocations lie in ranges
 * the driver reserves without access (or outside every mapping), so
 * /proc/self/maps tells them from host memory without the CUDA runtime.
 *
 * Key idea: a process-local snapshot of the mappings, sorted, taken again
 * only when a range is not covered by it. A range the snapshot covers is
 * trusted: memory unmapped since, and mapped again without access, is not
 * noticed (a program that frees a buffer it handed to a task breaks the
 * task's contract anyway); a range a new mapping made usable is found by
 * the re-read. So a buffer the engine keeps costs a binary search per
 * entry, and a new one at most one read of /proc/self/maps.
 */
#include "rank_i.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct range {
    uintptr_t lo, hi; /* [lo, hi) */
    bool read, write;
};

static pthread_mutex_t map_mu = PTHREAD_MUTEX_INITIALIZER;
static struct range *map; /* under map_mu: sorted by lo, disjoint */
static size_t map_n;      /* under map_mu */

/* The whole of /proc/self/maps, NUL-terminated; NULL on failure. */
static char *maps_read(void)
{
    size_t cap = 64 * 1024, len = 0;
    char *buf = malloc(cap);
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);

    if (!buf || fd < 0)
        goto out_fail;
    for (;;) {
        ssize_t r;

        if (cap - len < 4096) {
            char *nb = realloc(buf, cap * 2);

            if (!nb)
                goto out_fail;
            buf = nb;
            cap *= 2;
        }
        r = read(fd, buf + len, cap - len - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            goto out_fail;
        if (r == 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    return buf;

out_fail:
    if (fd >= 0)
        close(fd);
    free(buf);
    return NULL;
}

/* Take a new snapshot (under map_mu). 0 or -errno. */
static int map_reload(void)
{
    char *text = maps_read(), *line, *save = NULL;
    struct range *v = NULL;
    size_t n = 0, cap = 0;

    if (!text)
        return -ENOMEM;
    for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        unsigned long lo, hi;
        char perms[8];

        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || hi <= lo)
            continue;
        if (perms[0] != 'r')
            continue; /* no access: a reservation (CUDA's device ranges among them) */
        if (n && v[n - 1].hi == lo && v[n - 1].write == (perms[1] == 'w')) {
            v[n - 1].hi = hi; /* adjacent, alike: one range */
            continue;
        }
        if (n == cap) {
            struct range *nv = realloc(v, (cap ? cap * 2 : 256) * sizeof(*v));

            if (!nv) {
                free(v);
                free(text);
                return -ENOMEM;
            }
            v = nv;
            cap = cap ? cap * 2 : 256;
        }
        v[n++] = (struct range){.lo = lo, .hi = hi, .read = true, .write = perms[1] == 'w'};
    }
    free(text);
    free(map);
    map = v;
    map_n = n;
    return 0;
}

/* Is [lo, hi) inside the snapshot's usable ranges (under map_mu)? */
static bool map_covers(uintptr_t lo, uintptr_t hi, bool write)
{
    size_t a = 0, b = map_n;

    /* The last range starting at or below lo. */
    while (a < b) {
        size_t m = a + (b - a) / 2;

        if (map[m].lo <= lo)
            a = m + 1;
        else
            b = m;
    }
    if (a == 0)
        return false;
    for (size_t i = a - 1; i < map_n; i++) {
        if (map[i].lo > lo || lo >= map[i].hi || (write && !map[i].write))
            return false;
        if (hi <= map[i].hi)
            return true;
        lo = map[i].hi; /* runs on into the next range, if adjacent */
    }
    return false;
}

int sfs_mem_usable(const void *addr, uint64_t len, bool write)
{
    uintptr_t lo = (uintptr_t)addr, hi;
    bool ok;

    if (!addr || len == 0 || __builtin_add_overflow(lo, len, &hi))
        return -EFAULT;
    pthread_mutex_lock(&map_mu);
    ok = map_covers(lo, hi, write);
    if (!ok && map_reload() == 0)
        ok = map_covers(lo, hi, write);
    pthread_mutex_unlock(&map_mu);
    return ok ? 0 : -EFAULT;
}
