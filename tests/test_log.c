/* SPDX-License-Identifier: MIT */
/*
 * test_log.c - the log callback replaced while other threads log.
 *
 * sfs_set_log() is process-wide and callers replace it at any time (the
 * tests do, around a server whose threads log). A line must go whole to one
 * sink: never to a function already taken away (the old sfs_log read the
 * pointer twice, and a server thread once called the NULL installed in
 * between: SIGSEGV), never to the new function with the old argument.
 */
#include "testutil.h"
#include "util_i.h" /* sfs_log */

#include <criterion/criterion.h>

#include <pthread.h>
#include <stdatomic.h>
#include <syslog.h>

#define ROUNDS 200000

static atomic_bool stop;
static atomic_ulong lines, mismatched;

/* Each sink's argument is its own function's tag. */
static const int tag_a = 1, tag_b = 2;

static void sink_a(int level, const char *msg, void *arg)
{
    (void)level;
    (void)msg;
    if (arg != &tag_a)
        atomic_fetch_add(&mismatched, 1);
    atomic_fetch_add(&lines, 1);
}

static void sink_b(int level, const char *msg, void *arg)
{
    (void)level;
    (void)msg;
    if (arg != &tag_b)
        atomic_fetch_add(&mismatched, 1);
    atomic_fetch_add(&lines, 1);
}

static void *logger_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop))
        sfs_log(LOG_ERR, "a line %d", 1);
    return NULL;
}

Test(log, replaced_while_threads_log_each_line_goes_to_one_sink, .timeout = 60)
{
    pthread_t t[2];

    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, logger_main, NULL), 0);
    for (int r = 0; r < ROUNDS; r++) {
        switch (r % 3) {
        case 0:
            sfs_set_log(sink_a, (void *)&tag_a, LOG_DEBUG);
            break;
        case 1:
            sfs_set_log(NULL, NULL, 0); /* silent: what the old code then called */
            break;
        default:
            sfs_set_log(sink_b, (void *)&tag_b, LOG_DEBUG);
            break;
        }
    }
    atomic_store(&stop, true);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    sfs_set_log(NULL, NULL, 0);
    cr_assert_gt(atomic_load(&lines), 0, "no line was logged");
    cr_assert_eq(atomic_load(&mismatched), 0,
                 "%lu lines went to a function with another's argument", atomic_load(&mismatched));
}
