/* SPDX-License-Identifier: MIT */
/*
 * test_hostile.c - what the fuzz targets (tests/fuzz) found, held as plain
 * tests: control-plane words forged by an attached process must not make
 * another process misbehave.
 *
 * Each test forges words of a real cache's control plane the way a hostile
 * attached process could (it maps the plane read-write), then calls the
 * public API of another handle on it. Some findings are undefined behaviour
 * that an ordinary build happens to tolerate; those tests fail under
 * -DSHARDFS_SANITIZE=ON (UBSan aborts), which CI runs.
 */
#include "testutil.h"
#include "cache_i.h" /* the control plane's header and process records */

#include <criterion/criterion.h>

#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

#define SHARD 4096u

/* A second handle on c's planes, as attach_fds makes one. */
static struct sfs_cache *second_handle(struct sfs_cache *c)
{
    int ctl = fcntl(c->ctl_fd, F_DUPFD_CLOEXEC, 0), segs[64], err = 0;

    cr_assert(c->nsegments <= 64);
    cr_assert_geq(ctl, 0);
    for (uint32_t i = 0; i < c->nsegments; i++) {
        segs[i] = fcntl(c->seg_fds[i], F_DUPFD_CLOEXEC, 0);
        cr_assert_geq(segs[i], 0);
    }
    struct sfs_cache *h = sfs_cache_attach_fds(ctl, segs, c->nsegments, 0, &err);
    cr_assert_not_null(h, "attach_fds: %d", err);
    return h;
}

/* ctl_header finding: sums of forged counters overflowed int64_t (UB) in
 * sfs_cache_stats and in the fold of a detaching process's counters. They
 * are summed modulo 2^64. */
Test(hostile, forged_counters_sum_modulo_2_64, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(8, 0, SHARD);
    struct sfs_cache *h = second_handle(c);
    struct sfs_stats s;

    c->hdr->retired[CTR_REQUESTS] = INT64_MAX;
    c->hdr->retired[CTR_MISSES] = INT64_MIN;
    atomic_store(&h->self->ctr[CTR_REQUESTS], INT64_MAX);
    atomic_store(&h->self->ctr[CTR_MISSES], INT64_MIN);
    atomic_store(&c->self->ctr[CTR_REQUESTS], 0);
    atomic_store(&c->self->ctr[CTR_MISSES], 0);
    atomic_store(&c->self->ctr[CTR_UNSERVED], 0);
    atomic_store(&h->self->ctr[CTR_UNSERVED], 0);
    c->hdr->retired[CTR_UNSERVED] = 0;
    sfs_cache_stats(c, &s);
    cr_expect_eq(s.requests, (uint64_t)INT64_MAX * 2);
    cr_expect_eq(s.misses, 0); /* INT64_MIN twice wraps to 0 */
    cr_expect_eq(s.hits, 0);   /* requests - misses reads negative: 0 */

    /* The fold at detach: the same sums, into the header's totals. */
    sfs_cache_close(h);
    cr_expect_eq((uint64_t)c->hdr->retired[CTR_REQUESTS], (uint64_t)INT64_MAX * 2);
    cr_expect_eq(c->hdr->retired[CTR_MISSES], 0);
    sfs_cache_close(c);
}
