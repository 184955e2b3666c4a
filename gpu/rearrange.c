/* SPDX-License-Identifier: MIT */
/*
 * rearrange.c - RearrangeIndex, the order in which a rank walks a task.
 *
 * Key idea (design.md, scenario A): if every rank walks a task 0, 1, 2, ... they all
 * contend for the same key at the same step: one bucket lock, one owner, one
 * backend load at a time. Rank r of N instead walks its own residue class
 * first (r, r+N, r+2N, ...), then the next one (r+1, r+1+N, ...), wrapping
 * mod N. At every step the N ranks touch N different keys, so they all
 * become owners at once and the backend sees N concurrent loads; each rank
 * owns about 1/N of the keys, and by the time it reaches another rank's
 * residue class those keys are loading or Ready.
 */
#include <shardfs/rank.h>

#include <errno.h>

int sfs_rank_rearrange(size_t n, unsigned r, unsigned N, uint32_t *order)
{
    size_t k = 0;

    if (n == 0)
        return 0;
    if (!order || n > UINT32_MAX)
        return -EINVAL;
    if (N == 0)
        N = 1;
    r %= N;
    for (unsigned step = 0; step < N; step++) {
        size_t residue = (r + step) % N;

        for (size_t i = residue; i < n; i += N)
            order[k++] = (uint32_t)i;
    }
    return 0;
}
