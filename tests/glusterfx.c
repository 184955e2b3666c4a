/* SPDX-License-Identifier: MIT */
/*
 * glusterfx.c - a GlusterFS volume on a loopback brick, mounted twice (see
 * glusterfx.h). Every step is a shell command (gluster's own CLI), through
 * fsfx_sh().
 */
#include "glusterfx.h"

#include "fsfixture.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/utsname.h>
#include <unistd.h>

#define GL_PREFIX "sfsgl"

static int sh_quiet(const char *fmt, const char *a, const char *b)
{
    char cmd[1200];

    snprintf(cmd, sizeof(cmd), fmt, a, b);
    return fsfx_sh("%s >/dev/null 2>&1", cmd);
}

const char *glfx_mount(const struct glfx *g, int m)
{
    static __thread char p[2][240];

    snprintf(p[m & 1], sizeof(p[0]), "%s/%c", g->work, "ab"[m & 1]);
    return p[m & 1];
}

/* Unmount and delete what earlier runs, killed before their cleanup, left
 * of their volumes: only those of pids that no longer live (a run going on
 * beside us keeps its own). */
static void sweep_dead_runs(void)
{
    fsfx_sh("for m in $(awk '$1 ~ /^localhost:\\/" GL_PREFIX "[0-9]+$/ {print $1 \"=\" $2}' "
            "/proc/mounts); do p=${m%%%%=*}; p=${p#localhost:/" GL_PREFIX "}; "
            "kill -0 \"$p\" 2>/dev/null || umount -l \"${m#*=}\"; done >/dev/null 2>&1");
    fsfx_sh("for v in $(gluster volume list 2>/dev/null | grep -E '^" GL_PREFIX "[0-9]+$'); do "
            "kill -0 \"${v#" GL_PREFIX "}\" 2>/dev/null && continue; "
            "gluster --mode=script volume stop \"$v\" force; "
            "gluster --mode=script volume delete \"$v\"; done >/dev/null 2>&1");
}

/* Our turn: the flock on GLFX_LOCK (a local file: a blocking wait would do,
 * but it is polled so that it has a deadline). The fd is close-on-exec, so
 * glusterd and the mount helpers never hold it. 0, or -1 when the wait
 * ran out. */
static int take_turn(struct glfx *g)
{
    g->lock_fd = open(GLFX_LOCK, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (g->lock_fd < 0)
        return -1;
    for (int i = 0; i < GLFX_LOCK_WAIT * 10; i++) {
        if (flock(g->lock_fd, LOCK_EX | LOCK_NB) == 0)
            return 0;
        fsfx_sleep_ms(100);
    }
    close(g->lock_fd);
    g->lock_fd = -1;
    return -1;
}

void glfx_down(struct glfx *g)
{
    if (!g->work[0]) {
        if (g->lock_fd >= 0)
            close(g->lock_fd);
        g->lock_fd = -1;
        return;
    }
    /* A plain unmount first; lazily if something still holds the mount,
     * and then the volume's client processes end by their volume name. */
    sh_quiet("{ umount %s/a || umount -l %s/a; }", g->work, g->work);
    sh_quiet("{ umount %s/b || umount -l %s/b; }", g->work, g->work);
    sh_quiet("pkill -f -- '--volfile-id=/%s %s/'", g->vol, g->work);
    sh_quiet("gluster --mode=script volume stop %s force%s", g->vol, "");
    sh_quiet("gluster --mode=script volume delete %s%s", g->vol, "");
    /* volume stop ended the brick's process; ours ends by its pid. */
    if (g->own_glusterd)
        sh_quiet("kill $(cat %s/glusterd.pid)%s", g->work, "");
    sh_quiet("rm -rf %s%s", g->work, "");
    g->work[0] = '\0';
    g->own_glusterd = false;
    if (g->lock_fd >= 0)
        close(g->lock_fd); /* the next run's turn */
    g->lock_fd = -1;
}

void glfx_report(const struct glfx *g)
{
    if (!g->work[0])
        return;
    /* A client's log is named by its mount point, slashes as dashes; a
     * brick's by its path. */
    fsfx_sh("w=$(echo %s | tr / -); cd /var/log/glusterfs 2>/dev/null &&"
            " for f in $w*.log bricks/$w*.log; do [ -f $f ] || continue; echo \"== $f\";"
            " grep -E '\\] (E|W|C) \\[' $f | tail -n 15; done >&2",
            g->work + 1);
}

void glfx_kill_clients(const struct glfx *g)
{
    if (g->vol[0])
        fsfx_sh("pkill -9 -f -- '--volfile-id=/%s ' 2>/dev/null", g->vol);
}

int glfx_set(const struct glfx *g, const char *key, const char *value)
{
    return fsfx_sh("gluster --mode=script volume set %s %s %s >/dev/null 2>&1", g->vol, key, value);
}

int glfx_up(struct glfx *g, int replica, char *why, size_t wl)
{
    struct utsname u;
    char cmd[1200], bricks[700];

    memset(g, 0, sizeof(*g));
    g->lock_fd = -1;
    if (fsfx_sh("command -v glusterd >/dev/null && command -v gluster >/dev/null && "
                "command -v mount.glusterfs >/dev/null") != 0) {
        snprintf(why, wl,
                 "glusterd or mount.glusterfs not installed "
                 "(packaging/install-deps.sh installs glusterfs-server, glusterfs-client)");
        return -1;
    }
    if (!fsfx_usable()) {
        snprintf(why, wl, "no /dev/fuse here: GlusterFS's client cannot mount");
        return -1;
    }
    if (geteuid() != 0) {
        snprintf(why, wl, "not root: glusterd and its mounts need root");
        return -1;
    }
    if (take_turn(g) < 0) {
        snprintf(why, wl, "another GlusterFS run kept %s for %d s", GLFX_LOCK, GLFX_LOCK_WAIT);
        return -1;
    }
    uname(&u);
    snprintf(g->work, sizeof(g->work), "/tmp/sfs_gluster_%d", (int)getpid());
    snprintf(g->vol, sizeof(g->vol), GL_PREFIX "%d", (int)getpid());
    fsfx_sh("mkdir -p %s/brick %s/brick1 %s/a %s/b %s/wd %s/run", g->work, g->work, g->work,
            g->work, g->work, g->work);
    if (fsfx_sh("gluster volume list >/dev/null 2>&1") != 0) {
        /* None answers: our own, with its state under work. */
        snprintf(cmd, sizeof(cmd),
                 "glusterd --xlator-option management.working-directory=%s/wd "
                 "--xlator-option management.run-directory=%s/run -p %s/glusterd.pid "
                 "-l %s/glusterd.log",
                 g->work, g->work, g->work, g->work);
        if (fsfx_sh("%s", cmd) != 0) {
            snprintf(why, wl, "glusterd cannot start here (see %s/glusterd.log)", g->work);
            return -1;
        }
        g->own_glusterd = true;
        for (int i = 0; i < 100 && fsfx_sh("gluster volume list >/dev/null 2>&1") != 0; i++)
            fsfx_sleep_ms(100);
        if (fsfx_sh("gluster volume list >/dev/null 2>&1") != 0) {
            snprintf(why, wl, "glusterd started but does not answer");
            return -1;
        }
    }
    sweep_dead_runs();
    /* Replica 2: both bricks on this host (force: gluster warns that a
     * replica on one server protects nothing, and of split brain). */
    if (replica == 2)
        snprintf(bricks, sizeof(bricks), "replica 2 %s:%s/brick %s:%s/brick1", u.nodename, g->work,
                 u.nodename, g->work);
    else
        snprintf(bricks, sizeof(bricks), "%s:%s/brick", u.nodename, g->work);
    if (fsfx_sh("gluster --mode=script volume create %s %s force >/dev/null", g->vol, bricks) !=
            0 ||
        fsfx_sh("gluster --mode=script volume start %s >/dev/null", g->vol) != 0) {
        snprintf(why, wl, "volume create/start failed");
        return -2;
    }
    for (int m = 0; m < 2; m++) {
        int ok = -1;

        /* The brick may need a moment after start. */
        for (int i = 0; i < 50 && ok != 0; i++) {
            /* Its client daemon must not inherit our stdout and stderr
             * (a pipe of the caller's stays open while it lives). */
            ok = fsfx_sh("mount -t glusterfs localhost:/%s %s </dev/null >/dev/null 2>&1", g->vol,
                         glfx_mount(g, m));
            if (ok != 0)
                fsfx_sleep_ms(200);
        }
        if (ok != 0) {
            snprintf(why, wl, "mount %c failed", "ab"[m]);
            return -2;
        }
    }
    return 0;
}
