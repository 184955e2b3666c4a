/* SPDX-License-Identifier: MIT */
/*
 * test_shardfs_load.c - shardfs-load against a real daemon: its ranks load
 * and verify every shard; on a terminal (a detached tmux pane of 80x24) it
 * draws a progress bar that ends full on its own line below the ranks'
 * lines, none of them torn by it; piped, its standard error stays empty and
 * its output holds the ranks' lines alone, with no terminal control bytes.
 *
 * Real mounts (tests/fsfixture.h) on a posix store. Skips without FUSE, and
 * the terminal test without tmux.
 */
#include "fsfixture.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif
#ifndef SHARDFS_LOAD_BIN
#error "SHARDFS_LOAD_BIN must name shardfs-load (tests/CMakeLists.txt)"
#endif

#define SHARD   (64u << 10)
#define NBLOCKS 64

static struct {
    char store[128];
    char ids[160]; /* the block ids, one a line */
    char out[160]; /* standard output, or the pane's capture */
    char err[160]; /* standard error when piped */
    char tmux[64]; /* tmux -L socket name */
    struct fsfx fx;
} L;

static void setup(void)
{
    FILE *f;

    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    memset(&L, 0, sizeof(L));
    L.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
    snprintf(L.store, sizeof(L.store), "%s", tu_path("store"));
    snprintf(L.ids, sizeof(L.ids), "%s", tu_path("ids"));
    snprintf(L.out, sizeof(L.out), "%s", tu_path("out"));
    snprintf(L.err, sizeof(L.err), "%s", tu_path("err"));
    snprintf(L.tmux, sizeof(L.tmux), "sfsload%d", (int)getpid());
    snprintf(L.fx.mnt, sizeof(L.fx.mnt), "%s", tu_path("mnt"));
    snprintf(L.fx.sock, sizeof(L.fx.sock), "%s", tu_path("sock"));
    snprintf(L.fx.log, sizeof(L.fx.log), "%s", tu_path("log"));
    mkdir(L.store, 0755);
    cr_assert_eq(tu_store_write(L.store, 0, NBLOCKS, 1, SHARD, NULL, NULL, false), 0);
    f = fopen(L.ids, "w");
    cr_assert_not_null(f);
    for (uint64_t b = 0; b < NBLOCKS; b++) {
        char hex[SFS_BLOCK_HEX_LEN + 1];

        tu_block_hex(b, hex);
        fprintf(f, "%s\n", hex);
    }
    cr_assert_eq(fclose(f), 0);
    {
        int st = 0,
            r = fsfx_start(&L.fx, L.store, "hugepages=off,capacity=8M,shard_size=64K", 20.0, &st);

        cr_assert_eq(r, 0, "daemon did not mount (status %d), see %s", st, L.fx.log);
    }
}

static void teardown(void)
{
    fsfx_sh("tmux -L %s kill-server 2>/dev/null", L.tmux);
    if (L.fx.pid > 0)
        fsfx_stop(&L.fx, true, 10.0);
    fsfx_cleanup(&L.fx, L.store);
    unlink(L.ids);
    unlink(L.out);
    unlink(L.err);
}

TestSuite(shardfs_load, .init = setup, .fini = teardown, .timeout = 120);

/* The file (L.out, L.err) for a failure's message. */
static const char *text(const char *path)
{
    static char buf[8192];
    long n = fsfx_read_all(path, buf, sizeof(buf) - 1);

    buf[n > 0 ? n : 0] = '\0';
    return buf;
}

/* grep -E pattern in path: how many lines match. */
static int lines(const char *pattern, const char *path)
{
    char cmd[512];
    FILE *p;
    int n = -1;

    snprintf(cmd, sizeof(cmd), "grep -cE -- '%s' %s", pattern, path);
    p = popen(cmd, "r");
    if (!p)
        return -1;
    if (fscanf(p, "%d", &n) != 1)
        n = -1;
    pclose(p);
    return n;
}

Test(shardfs_load, piped_it_prints_the_ranks_lines_and_no_bar)
{
    struct stat st;

    cr_assert_eq(fsfx_sh("%s -m %s -b %s -r 2 -V - <%s >%s 2>%s", SHARDFS_LOAD_BIN, L.fx.mnt,
                         L.store, L.ids, L.out, L.err),
                 0, "shardfs-load failed: %s%s", text(L.out), text(L.err));
    cr_assert_eq(lines("^rank [01]: 64 shards, .* 0 failed, bytes verified$", L.out), 2, "%s",
                 text(L.out));
    cr_assert_eq(stat(L.err, &st), 0);
    cr_assert_eq(st.st_size, 0, "standard error piped is not empty: %s", text(L.err));
    /* Neither a carriage return nor an escape sequence in what was piped. */
    cr_assert_eq(fsfx_sh("tr -d '\\n' <%s | LC_ALL=C grep -q '[[:cntrl:]]'", L.out), 1,
                 "control bytes in the piped output: %s", text(L.out));
}

/* The pane's text now, in L.out: wrapped lines joined (a rank's line is
 * longer than 80 columns), trailing blanks dropped. */
static void capture(void)
{
    cr_assert_eq(fsfx_sh("tmux -L %s capture-pane -p -J -t t | sed 's/ *$//' >%s", L.tmux, L.out),
                 0);
}

Test(shardfs_load, on_a_terminal_it_draws_a_bar_that_ends_full, .timeout = 90)
{
    char cmd[768];
    bool ended = false;

    if (fsfx_sh("command -v tmux >/dev/null") != 0)
        cr_skip_test("no tmux (packaging/install-deps.sh installs it)");
    cr_assert_eq(
        fsfx_sh("tmux -L %s new-session -d -s t -x 80 -y 24 "
                "'env -i PATH=/usr/bin:/bin TERM=xterm PS1=\"$ \" bash --norc --noprofile'",
                L.tmux),
        0);
    /* clear first: the typed line wraps, the screen below it is the tool's. */
    snprintf(cmd, sizeof(cmd),
             "tmux -L %s send-keys -t t 'clear; %s -m %s -b %s -r 2 -V - <%s; echo load exited "
             "$?' Enter",
             L.tmux, SHARDFS_LOAD_BIN, L.fx.mnt, L.store, L.ids);
    cr_assert_eq(fsfx_sh("%s", cmd), 0);
    for (int i = 0; i < 600 && !ended; i++) {
        capture();
        ended = lines("^load exited ", L.out) > 0;
        if (!ended)
            fsfx_sleep_ms(50);
    }
    cr_assert(ended, "shardfs-load did not end; the pane:\n%s", text(L.out));
    cr_assert_eq(lines("^load exited 0$", L.out), 1, "the pane:\n%s", text(L.out));
    /* The ranks' lines whole, each at the start of its line. */
    cr_assert_eq(lines("^rank [01]: 64 shards, .* 0 failed, bytes verified$", L.out), 2,
                 "the pane:\n%s", text(L.out));
    /* The bar, full, on a line of its own after them. */
    cr_assert_eq(lines("^\\[#{40}\\] 100% 128/128 shards$", L.out), 1, "the pane:\n%s",
                 text(L.out));
    cr_assert_eq(fsfx_sh("grep -A1 -E '^\\[#{40}\\]' %s | grep -q '^load exited 0$'", L.out), 0,
                 "the bar is not the last line before the shell's; the pane:\n%s", text(L.out));
    cr_assert_eq(fsfx_sh("awk '/^\\[/ && length > 80 { exit 1 }' %s", L.out), 0,
                 "the bar is wider than 80 columns");
}
