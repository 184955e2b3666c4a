/* SPDX-License-Identifier: MIT */
/*
 * glusterfx.h - a GlusterFS volume on a loopback brick, mounted twice (two
 * "hosts"), for the tests and benchmarks of a shared store (test_shared_store,
 * bench_cold --shared; docs/shared-store.md).
 *
 * Everything a run creates is named by its pid: the volume sfsgl<pid>, its
 * brick, mount points and (when no glusterd answers) its own glusterd's
 * state under /tmp/sfs_gluster_<pid>. glfx_down() removes all of it whatever
 * glfx_up() got to; a run killed before its cleanup is swept by a later run's
 * glfx_up(), which removes only the volumes and mounts of pids that no longer
 * live, so two runs at once (a CI run beside a benchmark) never touch each
 * other's volume; and runs take turns (an flock on GLFX_LOCK, held while a
 * volume lives), so that a run never reuses a glusterd another run started
 * and is about to stop. Needs root, glusterd, gluster and mount.glusterfs, and
 * /dev/fuse.
 */
#ifndef SHARDFS_GLUSTERFX_H
#define SHARDFS_GLUSTERFX_H

#include <stdbool.h>
#include <stddef.h>

#define GLFX_LOCK      "/tmp/sfs_gluster.lock"
#define GLFX_LOCK_WAIT 240 /* seconds a run waits for its turn, then skips */

struct glfx {
    int lock_fd;       /* GLFX_LOCK, held from glfx_up() to glfx_down() */
    char work[200];    /* brick, mount points a and b, our glusterd's state */
    char vol[64];      /* sfsgl<pid> */
    bool own_glusterd; /* we started it: glfx_down() stops it */
};

/*
 * Start glusterd when none answers (its own, state under g->work), sweep the
 * leftovers of dead runs, create and start the volume (replica 1: one
 * brick; 2: two bricks on this host, replicated) and mount it twice, at
 * glfx_mount(g, 0) and glfx_mount(g, 1). Returns 0; -1 when GlusterFS cannot
 * run here (not installed, no /dev/fuse, glusterd does not start: skip), -2
 * when it failed; why gets the reason either way (-1 too when another run
 * kept its turn for GLFX_LOCK_WAIT s). Call glfx_down() after,
 * whatever it returned.
 */
int glfx_up(struct glfx *g, int replica, char *why, size_t wl);
/* Set a volume option (gluster volume set): the command's exit status. */
int glfx_set(const struct glfx *g, const char *key, const char *value);
/* Mount point m (0 or 1) of the volume. */
const char *glfx_mount(const struct glfx *g, int m);
/* After a failure: the warnings and errors of the volume's client and
 * brick logs (their last lines, /var/log/glusterfs) on stderr. */
void glfx_report(const struct glfx *g);
/* Kill the volume's client processes: their mounts answer ENOTCONN from
 * then on, and whatever was stuck in one (a wedged client's requests, in
 * D state) wakes, so the cleanup after a failure never hangs. */
void glfx_kill_clients(const struct glfx *g);
/* Unmount both mounts (lazily when busy), end their client processes, stop
 * and delete the volume, stop our glusterd, remove g->work. Idempotent; a g
 * glfx_up() never touched is a no-op. */
void glfx_down(struct glfx *g);

#endif /* SHARDFS_GLUSTERFX_H */
