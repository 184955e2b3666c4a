/* SPDX-License-Identifier: MIT */
/*
 * test_workq.c - the rank library's work queue (gpu/workq.c): FIFO order,
 * chains, a pop's deadline, and the stop (queued items are still drained,
 * then every consumer gets NULL).
 */
#include "workq_i.h"

#include <shardfs/cache.h>

#include <criterion/criterion.h>

#include <pthread.h>
#include <stdlib.h>

struct item {
    int v;
    struct sfs_wq_node qn;
};

static int val(struct sfs_wq_node *n)
{
    return sfs_wq_entry(n, struct item, qn)->v;
}

Test(workq, fifo_order_and_chains, .timeout = 10)
{
    struct sfs_workq q;
    struct item it[5];
    struct sfs_wq_node *n;

    cr_assert_eq(sfs_workq_init(&q), 0);
    for (int i = 0; i < 5; i++)
        it[i].v = i;
    sfs_workq_push(&q, &it[0].qn);
    /* A chain already linked: 1 -> 2 -> 3. */
    it[1].qn.next = &it[2].qn;
    it[2].qn.next = &it[3].qn;
    sfs_workq_push_chain(&q, &it[1].qn, &it[3].qn);
    sfs_workq_push(&q, &it[4].qn);
    cr_assert(sfs_workq_peek(&q));
    cr_assert_eq(val(sfs_workq_pop(&q, SFS_WQ_NOWAIT)), 0);
    n = sfs_workq_pop_all(&q, SFS_WQ_NOWAIT);
    for (int i = 1; i < 5; i++, n = n->next)
        cr_assert_eq(val(n), i);
    cr_assert_null(n);
    cr_assert_not(sfs_workq_peek(&q));
    cr_assert_null(sfs_workq_pop(&q, SFS_WQ_NOWAIT));
    sfs_workq_destroy(&q);
}

Test(workq, pop_ends_at_its_deadline, .timeout = 10)
{
    struct sfs_workq q;
    int64_t t0;

    cr_assert_eq(sfs_workq_init(&q), 0);
    t0 = sfs_now_ns();
    cr_assert_null(sfs_workq_pop(&q, sfs_deadline_after(50 * 1000000ll)));
    cr_assert_geq(sfs_now_ns() - t0, 50 * 1000000ll);
    /* Generous: a busy machine may wake it late, never early. */
    cr_assert_lt(sfs_now_ns() - t0, 3000 * 1000000ll);
    sfs_workq_destroy(&q);
}

static struct sfs_workq g_q;

static void *consumer(void *arg)
{
    int *got = arg;
    struct sfs_wq_node *n;

    while ((n = sfs_workq_pop(&g_q, SFS_WQ_FOREVER)))
        *got += val(n);
    return NULL;
}

Test(workq, stop_drains_then_ends_every_consumer, .timeout = 10)
{
    pthread_t th[3];
    int got[3] = {0, 0, 0};
    struct item *it = calloc(100, sizeof(*it));

    cr_assert_not_null(it);
    cr_assert_eq(sfs_workq_init(&g_q), 0);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, consumer, &got[i]), 0);
    for (int i = 0; i < 100; i++) {
        it[i].v = 1;
        sfs_workq_push(&g_q, &it[i].qn);
    }
    sfs_workq_stop(&g_q);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    cr_assert_eq(got[0] + got[1] + got[2], 100, "every item pushed before the stop is taken");
    cr_assert_null(sfs_workq_pop(&g_q, SFS_WQ_FOREVER), "stopped and empty: no wait");
    sfs_workq_destroy(&g_q);
    free(it);
}
