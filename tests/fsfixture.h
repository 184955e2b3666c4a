/* SPDX-License-Identifier: MIT */
/*
 * fsfixture.h - a shardfs daemon on a real FUSE mount, for the tests and the
 * benchmarks that drive the mount (test_fs*, bench_fs).
 *
 * The daemon runs in the foreground (-f) in a forked child, so its exit
 * status is the caller's to read; start returns once /proc/self/mountinfo
 * shows the mount, stop unmounts (fusermount3 -u) and reaps it, killing it
 * after a deadline so that a failed run never leaves a mount behind. No test
 * framework here: every call returns a status and the caller asserts. The
 * helpers after fsfx_stop() are the small ones every FUSE test used to
 * define for itself (shell commands, paths of shards and block files, the
 * stats counters, whole-file reads, the daemon's log).
 */
#ifndef SHARDFS_FSFIXTURE_H
#define SHARDFS_FSFIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
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

/* ---------------------------------------------------------------------------
 * Helpers the tests that drive a mount share (one copy, instead of one per
 * test file). Paths name blocks by number as the test utilities do
 * (tu_block(b), tests/testutil.h). A returned path is in a thread-local ring
 * of 4 buffers per function: valid until the same thread's 4th next call.
 */

/* system(3) of the printf-formatted command: its exit status, 128 + signal
 * for a signal, or -1 when no shell ran. */
int fsfx_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Sleep ms milliseconds, resumed across signals. */
void fsfx_sleep_ms(long ms);
/* sfs_now_ns() in seconds (the clock the library's deadlines use). */
double fsfx_now_s(void);
/* The daemon under test: $SHARDFS_TEST_DAEMON when set and not empty (CI
 * points it at a ThreadSanitizer build of the daemon, since Criterion's
 * runner cannot run under TSan itself), else `built` (the test's
 * SHARDFS_BIN). */
const char *fsfx_daemon_bin(const char *built);
/* MNT/block/<hex of b>/shard/<n> of m's mount; n < 0: the shard directory
 * MNT/block/<hex of b>/shard. */
const char *fsfx_shard_path(const struct fsfx *m, uint64_t b, long n);
/* MNT/block/<hex of b>: the block directory of m's mount. */
const char *fsfx_block_dir(const struct fsfx *m, uint64_t b);
/* STORE/data/<hex of b>: block b's file in a posix store (its default
 * layout) at directory store. */
const char *fsfx_block_file(const char *store, uint64_t b);
/* The value of counter `name` in MNT/stats of m's mount; -1 if absent. */
long long fsfx_stat(const struct fsfx *m, const char *name);
/* Read the file at path with read(2) into buf, up to len bytes: the bytes
 * read (fewer at end of file) or -errno (of open or of a read). */
long fsfx_read_all(const char *path, void *buf, size_t len);
/* How many lines of the daemon's log (m->log) contain s; 0 without a log. */
int fsfx_log_lines_with(const struct fsfx *m, const char *s);
/* A test's teardown, after fsfx_stop(): detach a mount still there
 * (fusermount3 -uz), remove the mount point once unmounted, the store
 * directory tree (when store is not NULL) and the daemon's log (kept when
 * SFS_TEST_KEEP_LOGS is set, for a failed run's post-mortem). */
void fsfx_cleanup(const struct fsfx *m, const char *store);

#endif /* SHARDFS_FSFIXTURE_H */
