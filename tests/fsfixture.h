/* SPDX-License-Identifier: MIT */
/*
 * fsfixture.h - a shardfs daemon on a real FUSE mount, for the tests and the
 * benchmarks that drive the mount (test_fs*, bench_fs).
 *
 * The daemon runs in the foreground (-f) in a forked child, so its exit
 * status is the caller's to read; start returns once /proc/self/mountinfo
 * shows the mount, stop unmounts (fusermount3 -u) and reaps it, killing it
 * after a deadline so that a failed run never leaves a mount behind. No test
 * framework here: every call returns a status and the caller asserts.
 */
#ifndef SHARDFS_FSFIXTURE_H
#define SHARDFS_FSFIXTURE_H

#include <stdbool.h>
#include <sys/types.h>

struct fsfx {
    /* Set by the caller before fsfx_start(). */
    const char *bin;         /* the daemon binary */
    char mnt[128];           /* mount point (created by fsfx_start() when missing) */
    char sock[128];          /* -o socket= (empty: the daemon's default) */
    char log[128];           /* the daemon's stdout and stderr (empty: stdout to /dev/null) */
    const char *join_cgroup; /* a cgroup directory the daemon starts in, or NULL */
    /* Kept by the fixture. */
    pid_t pid; /* the daemon while it runs, else 0 */
};

/* /dev/fuse opens and fusermount3 is on PATH. */
bool fsfx_usable(void);
/* mnt is a shardfs mount (fuse.shardfs in /proc/self/mountinfo). */
bool fsfx_is_mounted(const char *mnt);
/*
 * Start the daemon on backend (a directory or a backend spec) with the extra
 * -o options opts (may be NULL or empty; socket= comes from m->sock), and
 * wait up to timeout_s for the mount. Returns 0; -ECHILD when the daemon
 * exited first (*status: its wait status, when status is not NULL);
 * -ETIMEDOUT when the mount did not appear (the daemon is killed); or
 * -errno of fork.
 */
int fsfx_start(struct fsfx *m, const char *backend, const char *opts, double timeout_s,
               int *status);
/*
 * Unmount (fusermount3 -u) and reap the daemon. term: when the unmount fails
 * (a file of the mount is open), send SIGTERM too. After timeout_s the daemon
 * is killed and the mount detached (fusermount3 -uz). Returns the daemon's
 * exit status (128 + signal for a signal), or -1 when it had to be killed or
 * none was running.
 */
int fsfx_stop(struct fsfx *m, bool term, double timeout_s);

#endif /* SHARDFS_FSFIXTURE_H */
