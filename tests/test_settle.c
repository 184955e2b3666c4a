/* SPDX-License-Identifier: MIT */
/*
 * test_settle.c - sfs_cache_settle(), the one call that ends an owner's
 * load: Ready when the whole shard arrived, Failed with the I/O's errno or
 * -EIO for a short one, and every outcome returned (publish's and fail's own
 * refusals included), so no caller can ignore a refused publish.
 */
#include "testutil.h"

#include <criterion/criterion.h>

#include <errno.h>

#define SHARD 4096u

static struct sfs_cache *c;

static void setup(void)
{
    c = tu_cache(16, 0, SHARD);
    cr_assert_not_null(c);
}

static void teardown(void)
{
    sfs_cache_close(c);
}

TestSuite(settle, .init = setup, .fini = teardown, .timeout = 30);

/* Own key n (and hold a second lease of this process on it: a waiter). */
static void own(uint64_t n, struct sfs_lease *owner, struct sfs_lease *waiter)
{
    struct sfs_key k = tu_key(n, 0);

    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, owner), SFS_OWNER);
    if (waiter)
        cr_assert_eq(sfs_cache_get(c, &k, 0, 0, waiter), SFS_WAITER);
}

Test(settle, whole_shard_publishes_ready)
{
    struct sfs_key k = tu_key(1, 0);
    struct sfs_lease l;
    struct sfs_stats st;

    own(1, &l, NULL);
    tu_fill(&k, sfs_cache_data(c, &l), SHARD);
    cr_assert_eq(sfs_cache_settle(c, &l, SHARD, SHARD, 0), 0);
    cr_assert_eq(sfs_cache_state(c, &k), SFS_STATE_READY);
    cr_assert_eq(sfs_cache_length(c, &l), SHARD);
    sfs_cache_stats_local(c, &st);
    cr_assert_eq(st.bytes_read, SHARD);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
}

Test(settle, written_flag_is_not_a_read)
{
    struct sfs_key k = tu_key(2, 0);
    struct sfs_lease l;
    struct sfs_stats st;

    own(2, &l, NULL);
    cr_assert_eq(sfs_cache_settle(c, &l, 100, 100, SFS_PUBLISH_WRITTEN), 0);
    cr_assert_eq(sfs_cache_state(c, &k), SFS_STATE_READY);
    cr_assert_eq(sfs_cache_length(c, &l), 100);
    sfs_cache_stats_local(c, &st);
    cr_assert_eq(st.bytes_read, 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
}

Test(settle, short_read_fails_with_eio)
{
    struct sfs_key k = tu_key(3, 0);
    struct sfs_lease l, w;

    own(3, &l, &w);
    cr_assert_eq(sfs_cache_settle(c, &l, SHARD - 1, SHARD, 0), -EIO);
    cr_assert_eq(sfs_cache_state(c, &k), SFS_STATE_FAILED);
    cr_assert_eq(sfs_cache_error(c, &w), -EIO); /* what the waiter sees */
    cr_assert_eq(sfs_cache_release(c, &w), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
}

Test(settle, error_fails_with_its_errno)
{
    struct sfs_key k = tu_key(4, 0);
    struct sfs_lease l, w;

    own(4, &l, &w);
    cr_assert_eq(sfs_cache_settle(c, &l, -ENOENT, SHARD, 0), -ENOENT);
    cr_assert_eq(sfs_cache_state(c, &k), SFS_STATE_FAILED);
    cr_assert_eq(sfs_cache_error(c, &w), -ENOENT);
    cr_assert_eq(sfs_cache_release(c, &w), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
}

/* A lease that is not the owner's: both ways refused, nothing changes. */
Test(settle, not_the_owner_is_refused)
{
    struct sfs_key k = tu_key(5, 0);
    struct sfs_lease l, w;

    own(5, &l, &w);
    cr_assert_eq(sfs_cache_settle(c, &w, SHARD, SHARD, 0), -EPERM);
    cr_assert_eq(sfs_cache_settle(c, &w, -EIO, SHARD, 0), -EPERM);
    cr_assert_eq(sfs_cache_state(c, &k), SFS_STATE_LOADING);
    cr_assert_eq(sfs_cache_settle(c, &l, SHARD, SHARD, 0), 0);
    /* Settled once: a second settle is refused either way. */
    cr_assert_eq(sfs_cache_settle(c, &l, SHARD, SHARD, 0), -EPERM);
    cr_assert_eq(sfs_cache_settle(c, &l, -EIO, SHARD, 0), -EPERM);
    cr_assert_eq(sfs_cache_state(c, &k), SFS_STATE_READY);
    cr_assert_eq(sfs_cache_release(c, &w), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
}

Test(settle, too_long_is_refused)
{
    struct sfs_key k = tu_key(6, 0);
    struct sfs_lease l;

    own(6, &l, NULL);
    cr_assert_eq(sfs_cache_settle(c, &l, SHARD + 1, SHARD + 1, 0), -EINVAL);
    cr_assert_eq(sfs_cache_state(c, &k), SFS_STATE_LOADING);
    cr_assert_eq(sfs_cache_settle(c, &l, 0, SHARD, 0), -EIO);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
}

/* A wait's outcome is its own type: never a state, never a role; and
 * sfs_cache_wait_errno is the one triage of it into an errno. */
Test(settle, wait_outcomes_and_their_errno)
{
    struct sfs_lease l, w;

    for (int st = SFS_STATE_FREE; st <= SFS_STATE_FAILED; st++) {
        cr_assert_neq(st, SFS_WAIT_READY);
        cr_assert_neq(st, SFS_WAIT_FAILED);
        cr_assert_neq(st, SFS_WAIT_OWNER);
    }
    /* Nor a role: comparing the two enums is what -Wenum-compare flags. */
    cr_assert((int)SFS_WAIT_OWNER != (int)SFS_OWNER && (int)SFS_WAIT_READY != (int)SFS_HIT);

    own(7, &l, &w);
    cr_assert_eq(sfs_cache_wait(c, &w, 1 /* long past */), -ETIMEDOUT);
    cr_assert_eq(sfs_cache_wait_errno(c, &w, -ETIMEDOUT), -ETIMEDOUT);
    cr_assert_eq(sfs_cache_settle(c, &l, -ENOENT, SHARD, 0), -ENOENT);
    cr_assert_eq(sfs_cache_wait(c, &w, sfs_deadline_after(5000000000ll)), SFS_WAIT_FAILED);
    cr_assert_eq(sfs_cache_wait_errno(c, &w, SFS_WAIT_FAILED), -ENOENT);
    cr_assert_eq(sfs_cache_wait_errno(c, &w, SFS_WAIT_OWNER), -EINVAL);
    cr_assert_eq(sfs_cache_release(c, &w), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);

    own(8, &l, &w);
    cr_assert_eq(sfs_cache_settle(c, &l, SHARD, SHARD, 0), 0);
    cr_assert_eq(sfs_cache_wait(c, &w, sfs_deadline_after(5000000000ll)), SFS_WAIT_READY);
    cr_assert_eq(sfs_cache_wait_errno(c, &w, SFS_WAIT_READY), 0);
    cr_assert_eq(sfs_cache_release(c, &w), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
}

/* The owner gives the slot back unsettled: the waiter becomes owner. */
Test(settle, waiter_takes_over_an_idle_slot)
{
    struct sfs_key k = tu_key(9, 0);
    struct sfs_lease l, w;

    own(9, &l, &w);
    cr_assert_eq(sfs_cache_release(c, &l), 0); /* released unpublished: Idle */
    cr_assert_eq(sfs_cache_wait(c, &w, sfs_deadline_after(5000000000ll)), SFS_WAIT_OWNER);
    cr_assert_eq(sfs_cache_settle(c, &w, SHARD, SHARD, 0), 0);
    cr_assert_eq(sfs_cache_state(c, &k), SFS_STATE_READY);
    cr_assert_eq(sfs_cache_release(c, &w), 0);
}
