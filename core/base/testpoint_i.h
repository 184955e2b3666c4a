/* SPDX-License-Identifier: MIT */
/*
 * testpoint_i.h - named crash and fault points for deterministic tests.
 *
 * A recovery claim ("a process killed between these two writes leaves a
 * repairable state") needs a death at exactly that instruction, not a random
 * kill that lands there once in a million runs. SFS_TEST_POINT("room:where")
 * marks such a place. It compiles to nothing unless SFS_TEST_HOOKS is
 * defined, and only the test variant of the core library (CMake target
 * shardfs-core-hooks, built from the same sources, linked by tests/ alone)
 * defines it: the production libraries and the daemon carry no hooks.
 *
 * A test arms a point by name with sfs_testpoint_arm(): SFS_TP_KILL sends the
 * process SIGKILL right there (a forked child dies holding whatever it holds
 * at that point), SFS_TP_STOP sends it SIGSTOP (a stopped holder, continued
 * or killed by the test), SFS_TP_CALL runs a callback (to open a race
 * window on purpose). SFS_TEST_RESULT("room:where", res) marks a result a
 * test may replace: armed by sfs_testpoint_arm_fail(), its next n passes
 * yield -err instead (a system call's failure no local file system gives
 * on demand). Points stay armed in a forked child, so the usual shape
 * is: fork, arm in the child, call into the cache, and let the parent watch.
 * Disarmed points cost one relaxed load in the test build.
 */
#ifndef SHARDFS_TESTPOINT_I_H
#define SHARDFS_TESTPOINT_I_H

#ifdef SFS_TEST_HOOKS
#include <stdatomic.h>

enum sfs_tp_action {
    SFS_TP_OFF,  /* disarm */
    SFS_TP_KILL, /* raise(SIGKILL) */
    SFS_TP_STOP, /* raise(SIGSTOP) */
    SFS_TP_CALL, /* fn(name, arg) */
    SFS_TP_FAIL, /* SFS_TEST_RESULT yields -err (sfs_testpoint_arm_fail) */
};

typedef void sfs_tp_fn(const char *name, void *arg);

/* Arm (or with SFS_TP_OFF disarm) the point `name`: 0, or -ENOSPC when
 * SFS_TP_MAX points are armed already. name must outlive the arming. */
#define SFS_TP_MAX 8
int sfs_testpoint_arm(const char *name, enum sfs_tp_action action, sfs_tp_fn *fn, void *arg);
void sfs_testpoint_disarm_all(void);
/* Arm the result point `name` to yield -err on its next n passes (then its
 * own result again, still armed): 0, -EINVAL (err or n not positive) or
 * -ENOSPC. */
int sfs_testpoint_arm_fail(const char *name, int err, unsigned n);
int sfs_testpoint_result(const char *name, int res);
/* How many times an armed point was reached (all actions). */
unsigned sfs_testpoint_hits(const char *name);

void sfs_testpoint_hit(const char *name);
extern _Atomic int sfs_testpoints_armed;

/* Set while a point on a locked path ("get:locked", "release:locked") is
 * armed: Gets and Releases then take their locked paths, so a test of those
 * points reaches them on a Ready key too (the lock-free hit would not). */
extern _Atomic int sfs_testpoints_force_locked;
#define SFS_TEST_FORCE_LOCKED()                                                             \
    atomic_load_explicit(&sfs_testpoints_force_locked, memory_order_relaxed)

#define SFS_TEST_POINT(name)                                                                \
    do {                                                                                    \
        /* Relaxed: arming happens before the calls a test makes to reach it. */            \
        if (atomic_load_explicit(&sfs_testpoints_armed, memory_order_relaxed))              \
            sfs_testpoint_hit(name);                                                        \
    } while (0)
/* res, or -err while the result point `name` is armed to fail. Relaxed:
 * arming happens before the calls a test makes to reach it. */
#define SFS_TEST_RESULT(name, res)                                                          \
    (atomic_load_explicit(&sfs_testpoints_armed, memory_order_relaxed)                      \
         ? sfs_testpoint_result(name, res)                                                  \
         : (res))
#else
#define SFS_TEST_POINT(name) ((void)0)
#define SFS_TEST_RESULT(name, res) (res)
#define SFS_TEST_FORCE_LOCKED() 0
#endif

#endif /* SHARDFS_TESTPOINT_I_H */
