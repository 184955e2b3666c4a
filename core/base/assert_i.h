/* SPDX-License-Identifier: MIT */
/*
 * assert_i.h - the core's internal invariants, checked in tiers.
 *
 * Three tiers, as mimalloc has them. Always: everything that comes from
 * outside this process's own logic (a client's argument, a socket, the
 * kernel, shared memory) is validated and answered with -EINVAL / -EBADMSG,
 * in every build; it is never asserted. Debug (SFS_DEBUG >= 1: Debug builds,
 * sanitizer builds, and the hooks library tests link): SFS_ASSERT checks a
 * promise one part of the core makes another, on values in this process's
 * own memory (an index a caller already bounds-checked, a counter only this
 * process writes). Expensive (SFS_DEBUG >= 2): SFS_ASSERT_EXPENSIVE, checks
 * that walk a whole structure. Release builds compile both to nothing, so
 * they cost the Get path nothing.
 */
#ifndef SHARDFS_ASSERT_I_H
#define SHARDFS_ASSERT_I_H

#ifndef SFS_DEBUG
#define SFS_DEBUG 0
#endif

#if SFS_DEBUG >= 1
#include <stdio.h>
#include <stdlib.h>
#define SFS_ASSERT(cond)                                                                    \
    do {                                                                                    \
        if (__builtin_expect(!(cond), 0)) {                                                 \
            fprintf(stderr, "shardfs: invariant broken at %s:%d: %s\n", __FILE__, __LINE__, \
                    #cond);                                                                 \
            abort();                                                                        \
        }                                                                                   \
    } while (0)
#else
#define SFS_ASSERT(cond) ((void)0)
#endif

#if SFS_DEBUG >= 2
#define SFS_ASSERT_EXPENSIVE(cond) SFS_ASSERT(cond)
#else
#define SFS_ASSERT_EXPENSIVE(cond) ((void)0)
#endif

#endif /* SHARDFS_ASSERT_I_H */
