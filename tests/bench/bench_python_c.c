/* SPDX-License-Identifier: MIT */
/*
 * bench_python_c.c - the C side of tests/bench/bench_python.py: a small
 * shared object the Python benchmark loads into its own process, so that the
 * C API's load of a resident task is timed in C (clock_gettime around
 * sfs_rank_load + sfs_rank_wait + sfs_rank_task_free, no interpreter in
 * between) on the very rank, daemon and destination the Python path uses.
 * Not part of libshardfs-rank; built only with -DSHARDFS_BENCH=ON.
 */
#include <shardfs/rank.h>

#include <errno.h>
#include <stdlib.h>
#include <time.h>

static int64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

__attribute__((visibility("default"))) int
bench_python_c_load(struct sfs_rank *rk, const struct sfs_rank_entry *e, size_t n, int reps,
                    int64_t *ns);

/*
 * Load the n entries `reps` times, one task after the other, as a C program
 * does; ns[i] receives the time of run i. Returns 0, the first -errno of a
 * call, or -EIO when an entry failed. Bounds: n and reps as the caller's
 * arrays hold (the Python side allocates them).
 */
int bench_python_c_load(struct sfs_rank *rk, const struct sfs_rank_entry *e, size_t n, int reps,
                        int64_t *ns)
{
    int *status = calloc(n ? n : 1, sizeof(*status));
    int rc = 0;

    if (!status)
        return -ENOMEM;
    for (int r = 0; r < reps && rc == 0; r++) {
        struct sfs_task *t = NULL;
        int64_t t0 = now_ns();

        rc = sfs_rank_load(rk, e, n, &t);
        if (rc == 0)
            rc = sfs_rank_wait(t, -1, status);
        sfs_rank_task_free(t);
        ns[r] = now_ns() - t0;
        for (size_t i = 0; rc == 0 && i < n; i++)
            if (status[i])
                rc = -EIO;
    }
    free(status);
    return rc;
}
