/* SPDX-License-Identifier: MIT */
/*
 * util_i.h - what every room of the core may use (util.c): the library's
 * log call and robust process-shared mutexes. The clocks and the hex ids are
 * public (shardfs/cache.h). The base room calls nothing above it, so a store
 * or the peer tier that includes this header reaches no cache internals.
 */
#ifndef SHARDFS_UTIL_I_H
#define SHARDFS_UTIL_I_H

#include <shardfs/cache.h>

#include <pthread.h>
#include <syslog.h>

/* Log one line through the callback sfs_set_log() installed; silent when
 * none is, or when level is above its maximum. */
/* The histogram bucket of an observation of ns (sfs_hist_bound_ns). */
unsigned sfs_hist_bucket(int64_t ns);
void sfs_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A PTHREAD_PROCESS_SHARED, PTHREAD_MUTEX_ROBUST mutex. 0 or -errno. */
int sfs_robust_mutex_init(pthread_mutex_t *m);

#endif /* SHARDFS_UTIL_I_H */
