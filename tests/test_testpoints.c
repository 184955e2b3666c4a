/* SPDX-License-Identifier: MIT */
/*
 * test_testpoints.c - the test points the recovery tests stand on
 * (core/base/testpoint_i.h): a table of SFS_TP_MAX armed points (-ENOSPC
 * past it), disarming by name or all at once, hits counted for every
 * action, a result point failing its next n passes and then yielding its
 * own result again, a ":locked" point forcing the locked paths, a call
 * point's callback, and a stop point that stops the process right there
 * (the parent sees it stopped, continues it, and it carries on).
 */
#include "testpoint_i.h"
#include "testutil.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>

TestSuite(testpoints, .fini = sfs_testpoint_disarm_all, .timeout = 30);

static const char *names[SFS_TP_MAX + 1] = {"t:0", "t:1", "t:2", "t:3", "t:4",
                                            "t:5", "t:6", "t:7", "t:8"};

Test(testpoints, the_table_and_disarming)
{
    for (int i = 0; i < SFS_TP_MAX; i++)
        cr_assert_eq(sfs_testpoint_arm(names[i], SFS_TP_CALL, NULL, NULL), 0);
    cr_assert_eq(sfs_testpoint_arm(names[SFS_TP_MAX], SFS_TP_CALL, NULL, NULL), -ENOSPC);
    cr_assert_eq(sfs_testpoint_arm_fail(names[SFS_TP_MAX], EIO, 1), -ENOSPC);
    /* Re-arming an armed point takes no new place. */
    cr_assert_eq(sfs_testpoint_arm(names[0], SFS_TP_CALL, NULL, NULL), 0);
    /* Disarming one frees its place; disarming one not armed is nothing. */
    cr_assert_eq(sfs_testpoint_arm(names[3], SFS_TP_OFF, NULL, NULL), 0);
    cr_assert_eq(sfs_testpoint_arm("t:never", SFS_TP_OFF, NULL, NULL), 0);
    cr_assert_eq(sfs_testpoint_arm(names[SFS_TP_MAX], SFS_TP_CALL, NULL, NULL), 0);
    cr_assert_eq(atomic_load(&sfs_testpoints_armed), SFS_TP_MAX);
    sfs_testpoint_disarm_all();
    cr_assert_eq(atomic_load(&sfs_testpoints_armed), 0);
    cr_assert_eq(sfs_testpoint_hits(names[0]), 0, "a point not armed counts nothing");
}

static int calls;

static void count_call(const char *name, void *arg)
{
    (void)name;
    cr_assert_eq(arg, &calls);
    calls++;
}

Test(testpoints, hits_calls_and_results)
{
    cr_assert_eq(sfs_testpoint_arm("t:call", SFS_TP_CALL, count_call, &calls), 0);
    cr_assert_eq(sfs_testpoint_arm("t:plain", SFS_TP_CALL, NULL, NULL), 0);
    SFS_TEST_POINT("t:call");
    SFS_TEST_POINT("t:call");
    SFS_TEST_POINT("t:plain");
    SFS_TEST_POINT("t:elsewhere");
    cr_assert_eq(calls, 2);
    cr_assert_eq(sfs_testpoint_hits("t:call"), 2);
    cr_assert_eq(sfs_testpoint_hits("t:plain"), 1);
    cr_assert_eq(sfs_testpoint_hits("t:elsewhere"), 0);
    /* A result point: its next n passes fail, then its own result; a
     * point armed for another action leaves results alone. */
    cr_assert_eq(sfs_testpoint_arm_fail("t:result", 0, 1), -EINVAL);
    cr_assert_eq(sfs_testpoint_arm_fail("t:result", EIO, 0), -EINVAL);
    cr_assert_eq(sfs_testpoint_arm_fail("t:result", ESTALE, 2), 0);
    cr_assert_eq(SFS_TEST_RESULT("t:result", 7), -ESTALE);
    cr_assert_eq(SFS_TEST_RESULT("t:result", 7), -ESTALE);
    cr_assert_eq(SFS_TEST_RESULT("t:result", 7), 7);
    cr_assert_eq(sfs_testpoint_hits("t:result"), 3);
    cr_assert_eq(SFS_TEST_RESULT("t:call", 5), 5);
    cr_assert_eq(calls, 2, "a result never calls");
    /* A failing point reached as a plain point does nothing. */
    SFS_TEST_POINT("t:result");
    cr_assert_eq(sfs_testpoint_hits("t:result"), 4);
}

Test(testpoints, a_locked_point_forces_the_locked_paths)
{
    cr_assert_eq(SFS_TEST_FORCE_LOCKED(), 0);
    cr_assert_eq(sfs_testpoint_arm("get:lock", SFS_TP_CALL, NULL, NULL), 0);
    cr_assert_eq(SFS_TEST_FORCE_LOCKED(), 0, "not a \":locked\" point");
    cr_assert_eq(sfs_testpoint_arm("release:locked", SFS_TP_CALL, NULL, NULL), 0);
    cr_assert_neq(SFS_TEST_FORCE_LOCKED(), 0);
    cr_assert_eq(sfs_testpoint_arm("release:locked", SFS_TP_OFF, NULL, NULL), 0);
    cr_assert_eq(SFS_TEST_FORCE_LOCKED(), 0);
}

static int stop_then_go(void *arg)
{
    (void)arg;
    TU_CK(sfs_testpoint_arm("t:stop", SFS_TP_STOP, NULL, NULL) == 0);
    SFS_TEST_POINT("t:stop"); /* stopped here until the parent continues us */
    TU_CK(sfs_testpoint_hits("t:stop") == 1);
    return 0;
}

Test(testpoints, a_stop_point_stops_the_process_there)
{
    int st;
    pid_t pid = tu_fork(stop_then_go, NULL);

    cr_assert_gt(pid, 0);
    cr_assert_eq(waitpid(pid, &st, WUNTRACED), pid);
    cr_assert(WIFSTOPPED(st), "status %#x", st);
    cr_assert_eq(kill(pid, SIGCONT), 0);
    cr_assert_eq(tu_wait(pid), 0);
}
