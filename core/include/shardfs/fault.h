/* SPDX-License-Identifier: MIT */
/*
 * shardfs/fault.h - runtime control of the fault-injecting backend.
 *
 * A backend opened with the spec "fault:<opts>:<inner spec>" wraps the inner
 * backend and injects latency, -EIO, short reads and stalls into loads (and
 * -EIO, latency and stalls into dumps). Options, comma separated, each
 * optional (unnamed ones are 0):
 *
 *   latency_us=N   delay every completion by N microseconds
 *   jitter_us=N    plus a uniform extra delay in [0, N] us
 *   eio=P          fail a request with -EIO with probability P (0..1); the
 *                  request never reaches the inner backend
 *   short=P        load only: the inner backend reads only the first half of
 *                  the buffer and the request completes with -EIO
 *   stall_ms=N     add N ms to every stall_every-th request
 *   stall_every=N  (0 or 1: every request)
 *   seed=S         decisions are a pure function of (seed, request number),
 *                  where requests are numbered in submission order from 0:
 *                  the same submissions give the same faults whatever the
 *                  thread timing
 *
 * Delays run on a timer thread of the backend: submitting never sleeps.
 */
#ifndef SHARDFS_FAULT_H
#define SHARDFS_FAULT_H

#include <shardfs/backend.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Replace the fault options of a fault backend with `opts` (same syntax as in
 * the spec; "" turns every fault off). Request numbering continues. Returns 0,
 * or -EINVAL for bad options or a backend that is not a fault backend.
 */
SFS_API int sfs_fault_set(struct sfs_backend *be, const char *opts);

/*
 * Counters since open: loads and dumps submitted (one per request), and faults
 * injected (-EIO and short reads; delays are not counted). Any pointer may be
 * NULL. A backend that is not a fault backend reports zeros.
 */
SFS_API void sfs_fault_counts(struct sfs_backend *be, uint64_t *loads, uint64_t *dumps,
                              uint64_t *injected);

#ifdef __cplusplus
}
#endif
#endif /* SHARDFS_FAULT_H */
