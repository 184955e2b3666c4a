/* SPDX-License-Identifier: MIT */
/*
 * test_shardfsctl.c - the operator's tool against real daemons.
 *
 * check: 0 and "ok" against a live daemon; 1 with the reason against one
 * killed with SIGKILL (its mount left behind) and against one stopped with
 * SIGSTOP (it never answers: the deadline says so); 2 for a directory that
 * is not a shardfs mount. top: in a detached tmux terminal of 80x24, with a
 * reader hammering the mount, the screen shows the read rates; q ends it,
 * and so does Ctrl-C, each time leaving the terminal as it was (the shell's
 * screen back, line editing and echo on).
 *
 * Real mounts (tests/fsfixture.h) on a posix store. Skips without FUSE, and
 * the top test without tmux.
 */
#include "fsfixture.h"
#include "fswarm.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif
#ifndef SHARDFSCTL_BIN
#error "SHARDFSCTL_BIN must name shardfsctl (tests/CMakeLists.txt)"
#endif

#define SHARD (64u << 10)

static struct {
    char store[128];
    char out[160]; /* shardfsctl's output */
    char tmux[64]; /* tmux -L socket name */
    pid_t reader;  /* the load */
    struct fsfx fx;
} M;

static void start(void)
{
    int st = 0,
        r = fsfx_start(&M.fx, M.store, "hugepages=off,capacity=4M,shard_size=64K", 10.0, &st);

    cr_assert_eq(r, 0, "daemon did not mount (%s, status %d), see %s", strerror(-r), st, M.fx.log);
}

/* shardfsctl ARGS, its output in M.out: its exit status. */
static int ctl(const char *args)
{
    return fsfx_sh("%s %s >%s 2>&1", SHARDFSCTL_BIN, args, M.out);
}

/* shardfsctl's output, or the pane's last capture, for a failure's message. */
static const char *out_text(void)
{
    static char buf[4096];
    long n = fsfx_read_all(M.out, buf, sizeof(buf) - 1);

    buf[n > 0 ? n : 0] = '\0';
    return buf;
}

static bool out_has(const char *s)
{
    return fsfx_sh("grep -qF -- '%s' %s", s, M.out) == 0;
}

static void setup(void)
{
    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    memset(&M, 0, sizeof(M));
    {
        const char *e = getenv("SHARDFS_TEST_DAEMON");

        M.fx.bin = e && *e ? e : SHARDFS_BIN;
    }
    snprintf(M.store, sizeof(M.store), "%s", tu_path("store"));
    snprintf(M.out, sizeof(M.out), "%s", tu_path("out"));
    snprintf(M.tmux, sizeof(M.tmux), "sfsctl%d", (int)getpid());
    snprintf(M.fx.mnt, sizeof(M.fx.mnt), "%s", tu_path("mnt"));
    snprintf(M.fx.sock, sizeof(M.fx.sock), "%s", tu_path("sock"));
    snprintf(M.fx.log, sizeof(M.fx.log), "%s", tu_path("log"));
    mkdir(M.store, 0755);
    mkdir(M.fx.mnt, 0755);
    cr_assert_eq(tu_store_write(M.store, 0, 8, 4, SHARD, NULL, NULL, false), 0);
}

static void teardown(void)
{
    if (M.reader > 0) {
        kill(M.reader, SIGKILL);
        waitpid(M.reader, NULL, 0);
    }
    fsfx_sh("tmux -L %s kill-server 2>/dev/null", M.tmux);
    if (M.fx.pid > 0)
        kill(M.fx.pid, SIGCONT); /* the stopped-daemon test */
    fswarm_teardown(&M.fx, M.store);
    unlink(M.out);
}

TestSuite(shardfsctl, .init = setup, .fini = teardown, .timeout = 120);

Test(shardfsctl, help_and_usage)
{
    cr_assert_eq(ctl("--help"), 0);
    cr_assert(out_has("shardfsctl check"));
    cr_assert(out_has("shardfsctl top"));
    cr_assert_eq(ctl(""), 2);
    cr_assert_eq(ctl("frob /tmp"), 2);
    cr_assert_eq(ctl("check -t 0 /tmp"), 2);
}

Test(shardfsctl, check_says_ok_for_a_live_daemon_and_why_not_for_a_killed_one)
{
    char args[256];

    start();
    snprintf(args, sizeof(args), "check %s", M.fx.mnt);
    cr_assert_eq(ctl(args), 0, "check of a live daemon failed");
    cr_assert(out_has("ok: "));
    cr_assert(out_has("cache attached"));

    kill(M.fx.pid, SIGKILL);
    waitpid(M.fx.pid, NULL, 0);
    M.fx.pid = 0;
    cr_assert(fsfx_is_mounted(M.fx.mnt), "the killed daemon's mount is left behind");
    cr_assert_eq(ctl(args), 1, "check of a killed daemon did not fail");
    cr_assert(out_has("the daemon is gone"));

    fsfx_sh("fusermount3 -uz %s", M.fx.mnt);
    cr_assert_eq(ctl(args), 2, "a plain directory is not a shardfs mount");
    cr_assert(out_has("not a shardfs mount"));
}

Test(shardfsctl, check_gives_up_on_a_daemon_that_does_not_answer)
{
    char args[256];

    start();
    kill(M.fx.pid, SIGSTOP);
    snprintf(args, sizeof(args), "check -t 1 %s", M.fx.mnt);
    cr_assert_eq(ctl(args), 1, "check of a stopped daemon did not fail");
    cr_assert(out_has("does not answer"));
    kill(M.fx.pid, SIGCONT);
    snprintf(args, sizeof(args), "check %s", M.fx.mnt);
    cr_assert_eq(ctl(args), 0, "check of the daemon continued failed");
    cr_assert_eq(fswarm_stop_term(&M.fx, 10.0), 0);
}

/* ---------------------------------------------------------------------------
 * top, in tmux.
 */

/* The pane's text now, in M.out. */
static void capture(void)
{
    cr_assert_eq(fsfx_sh("tmux -L %s capture-pane -p -t t >%s", M.tmux, M.out), 0);
}

/* Poll the pane (up to 20 s) until it shows s. */
static bool pane_shows(const char *s)
{
    for (int i = 0; i < 400; i++) {
        capture();
        if (out_has(s))
            return true;
        fsfx_sleep_ms(50);
    }
    return false;
}

static void keys(const char *k)
{
    cr_assert_eq(fsfx_sh("tmux -L %s send-keys -t t %s", M.tmux, k), 0);
}

/* reads/s on the screen is a positive number. */
static bool reads_shown(void)
{
    for (int i = 0; i < 400; i++) {
        capture();
        if (fsfx_sh("grep -Eq '^reads/s +[1-9][0-9]* ' %s", M.out) == 0)
            return true;
        fsfx_sleep_ms(50);
    }
    return false;
}

/* After top ended: the shell's screen is back, with echo and line editing. */
static void assert_restored(const char *how, int round)
{
    char done[32];

    snprintf(done, sizeof(done), "top%d exited 0", round);
    cr_assert(pane_shows(done), "top did not exit 0 after %s; the pane:\n%s", how, out_text());
    keys("'stty -a | tr -s \" ;\" \"\\n\\n\" | grep -E \"^-?(icanon|echo)$\" | tr \"\\n\" \" \"; "
         "echo :do\"\"ne' Enter"); /* the echo, not the typed line, says :done */
    cr_assert(pane_shows(":done"), "no prompt after %s; the pane:\n%s", how, out_text());
    capture();
    cr_assert(out_has("icanon echo :done"), "terminal not restored after %s; the pane:\n%s", how,
              out_text());
    cr_assert(!out_has("reads/s"), "top's screen left behind after %s", how);
    keys("clear Enter");
}

static int hammer(void *arg)
{
    uint8_t *buf = malloc(SHARD);

    (void)arg;
    for (uint64_t i = 0;; i++)
        fsfx_read_all(fsfx_shard_path(&M.fx, i % 8, (long)(i / 8 % 4)), buf, SHARD);
    return 0;
}

Test(shardfsctl, top_shows_rates_and_q_or_ctrl_c_restore_the_terminal, .timeout = 90)
{
    if (fsfx_sh("command -v tmux >/dev/null") != 0)
        cr_skip_test("no tmux (packaging/install-deps.sh installs it)");
    start();
    M.reader = tu_fork(hammer, NULL);
    cr_assert_gt(M.reader, 0);
    cr_assert_eq(
        fsfx_sh("tmux -L %s new-session -d -s t -x 80 -y 24 "
                "'env -i PATH=/usr/bin:/bin TERM=xterm PS1=\"$ \" bash --norc --noprofile'",
                M.tmux),
        0);
    for (int round = 0; round < 2; round++) {
        const char *how = round == 0 ? "q" : "Ctrl-C";
        char cmd[512];

        snprintf(cmd, sizeof(cmd), "'%s top %s; echo top%d exited $?' Enter", SHARDFSCTL_BIN,
                 M.fx.mnt, round);
        keys(cmd);
        cr_assert(pane_shows("hit ratio"), "top drew nothing; the pane:\n%s", out_text());
        cr_assert(reads_shown(), "no read rate on the screen with a reader running, see %s", M.out);
        cr_assert(out_has("class"), "no class table");
        cr_assert(out_has("mount "), "the mount's class is not listed");
        cr_assert(out_has("hottest blocks"), "no hottest blocks with a reader running");
        /* 80 columns: no line of the screen is wider. */
        cr_assert_eq(fsfx_sh("awk 'length > 80 { exit 1 }' %s", M.out), 0);
        keys(round == 0 ? "q" : "C-c");
        assert_restored(how, round);
    }
}
