/* SPDX-License-Identifier: MIT */
/*
 * futex_i.h - the futex calls the core sleeps and wakes with.
 *
 * Words in the control plane are shared between processes, so they use the
 * shared (not FUTEX_PRIVATE_FLAG) operations; a doorbell in one process's own
 * memory uses the private ones. These wrappers know futex words only, never
 * the cache's records. Every deadline is absolute CLOCK_MONOTONIC
 * nanoseconds; 0 or negative waits without one.
 */
#ifndef SHARDFS_FUTEX_I_H
#define SHARDFS_FUTEX_I_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* The kernel's bound on the words one futex_waitv takes (FUTEX_WAITV_MAX). */
#define SFS_FUTEX_WAITV_MAX 128

/* Sleep while *word == expect. 0 on a wake; -EAGAIN: the word differed;
 * -ETIMEDOUT; -EINTR; any other -errno is an error the caller must not
 * retry blindly. */
int sfs_futex_wait(_Atomic uint32_t *word, uint32_t expect, int64_t deadline_ns);

/*
 * Sleep until any of n shared words differs from expect[i], or the private
 * word `bell` (may be NULL) differs from bell_seen. n plus the bell is at
 * most SFS_FUTEX_WAITV_MAX, else -E2BIG (checked here: the kernel's EINVAL
 * would read like a caller's bug). Returns as sfs_futex_wait; -ENOSYS before
 * Linux 5.16.
 */
int sfs_futex_waitv(_Atomic uint32_t *const *words, const uint32_t *expect, size_t n,
                    _Atomic uint32_t *bell, uint32_t bell_seen, int64_t deadline_ns);

/* Wake up to n sleepers; the number woken or -errno. */
int sfs_futex_wake(_Atomic uint32_t *word, int n);
int sfs_futex_wake_private(_Atomic uint32_t *word, int n);

#endif /* SHARDFS_FUTEX_I_H */
