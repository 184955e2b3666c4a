/* SPDX-License-Identifier: MIT */
/*
 * testpoint.c - the table behind SFS_TEST_POINT (test builds only; see
 * testpoint_i.h). A handful of named points, armed by the test before it
 * calls into the cache; a hit compares names and acts.
 */
#include "testpoint_i.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>

#ifdef SFS_COVERAGE
void __gcov_dump(void); /* libgcov's: write this process's counters now */
#endif

struct tp {
    const char *name;
    enum sfs_tp_action action;
    sfs_tp_fn *fn;
    void *arg;
    unsigned hits;
    int err;       /* SFS_TP_FAIL: the errno to inject */
    unsigned left; /* SFS_TP_FAIL: passes still to fail */
};

static struct tp table[SFS_TP_MAX];
static pthread_mutex_t tp_mu = PTHREAD_MUTEX_INITIALIZER;
_Atomic int sfs_testpoints_armed;
_Atomic int sfs_testpoints_force_locked;

/* tp_mu held: recompute both summaries of the table. */
static void summarise(void)
{
    int n = 0, locked = 0;

    for (int i = 0; i < SFS_TP_MAX; i++) {
        if (!table[i].name)
            continue;
        n++;
        size_t len = strlen(table[i].name);
        locked |= len >= 7 && strcmp(table[i].name + len - 7, ":locked") == 0;
    }
    atomic_store_explicit(&sfs_testpoints_force_locked, locked, memory_order_relaxed);
    atomic_store_explicit(&sfs_testpoints_armed, n, memory_order_relaxed);
}

static struct tp *find(const char *name)
{
    for (int i = 0; i < SFS_TP_MAX; i++)
        if (table[i].name && strcmp(table[i].name, name) == 0)
            return &table[i];
    return NULL;
}

int sfs_testpoint_arm(const char *name, enum sfs_tp_action action, sfs_tp_fn *fn, void *arg)
{
    struct tp *t;
    int r = 0;

    pthread_mutex_lock(&tp_mu);
    t = find(name);
    if (!t && action != SFS_TP_OFF) {
        for (int i = 0; i < SFS_TP_MAX && !t; i++)
            if (!table[i].name)
                t = &table[i];
        if (!t)
            r = -ENOSPC;
    }
    if (t) {
        *t = (struct tp){.name = action == SFS_TP_OFF ? NULL : name,
                         .action = action, .fn = fn, .arg = arg};
    }
    summarise();
    pthread_mutex_unlock(&tp_mu);
    return r;
}

void sfs_testpoint_disarm_all(void)
{
    pthread_mutex_lock(&tp_mu);
    memset(table, 0, sizeof(table));
    summarise();
    pthread_mutex_unlock(&tp_mu);
}

int sfs_testpoint_arm_fail(const char *name, int err, unsigned n)
{
    int r;

    if (err <= 0 || n == 0)
        return -EINVAL;
    r = sfs_testpoint_arm(name, SFS_TP_FAIL, NULL, NULL);
    if (r == 0) {
        pthread_mutex_lock(&tp_mu);
        struct tp *t = find(name);
        t->err = err;
        t->left = n;
        pthread_mutex_unlock(&tp_mu);
    }
    return r;
}

int sfs_testpoint_result(const char *name, int res)
{
    pthread_mutex_lock(&tp_mu);
    struct tp *t = find(name);
    if (t && t->action == SFS_TP_FAIL) {
        t->hits++;
        if (t->left) {
            t->left--;
            res = -t->err;
        }
    }
    pthread_mutex_unlock(&tp_mu);
    return res;
}

unsigned sfs_testpoint_hits(const char *name)
{
    unsigned n = 0;

    pthread_mutex_lock(&tp_mu);
    struct tp *t = find(name);
    if (t)
        n = t->hits;
    pthread_mutex_unlock(&tp_mu);
    return n;
}

void sfs_testpoint_hit(const char *name)
{
    struct tp t = {0};

    pthread_mutex_lock(&tp_mu);
    struct tp *p = find(name);
    if (p) {
        p->hits++;
        t = *p;
    }
    pthread_mutex_unlock(&tp_mu);
    if (!t.name)
        return;
    /* Act outside the table's lock: a stopped or killed process must not
     * leave it held for a callback in another thread. */
    switch (t.action) {
    case SFS_TP_KILL:
#ifdef SFS_COVERAGE
        /* The coverage build (tests/coverage/run.sh): a process killed
         * here would write no counters, and its last lines would read as
         * never run. */
        __gcov_dump();
#endif
        raise(SIGKILL);
        break;
    case SFS_TP_STOP:
        raise(SIGSTOP);
        break;
    case SFS_TP_CALL:
        if (t.fn)
            t.fn(name, t.arg);
        break;
    case SFS_TP_FAIL: /* acts in sfs_testpoint_result() only */
    case SFS_TP_OFF:
        break;
    }
}
