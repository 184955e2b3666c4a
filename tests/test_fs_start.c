/* SPDX-License-Identifier: MIT */
/*
 * test_fs_start.c - the daemon's start: every value it refuses is refused
 * before anything is created, with exit status 1 and one line on stderr
 * that names what is wrong; what the start takes from the system (the
 * store directory's owner and modes for the tree, the default socket's
 * path under /run/shardfs) is what a mount then shows. A step after the
 * checks that fails (a cache it cannot create, a mount, a thread) leaves
 * nothing behind, and the daemonizing parent says so.
 *
 * The refusals run the daemon binary in the foreground and read its stderr;
 * none mounts. The tests that mount use the fixture or a real mount point.
 * Needs /dev/fuse and fusermount3 for those; skips without.
 */
#include "fsfixture.h"
#include "testutil.h"

#include <shardfs/cache.h>

#include <criterion/criterion.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

static struct {
    char store[128], mnt[128], sock[128];
    struct fsfx fx;
} S;

static void setup(void)
{
    memset(&S, 0, sizeof(S));
    snprintf(S.store, sizeof(S.store), "%s", tu_path("store"));
    snprintf(S.mnt, sizeof(S.mnt), "%s", tu_path("mnt"));
    snprintf(S.sock, sizeof(S.sock), "%s", tu_path("sock"));
    snprintf(S.fx.log, sizeof(S.fx.log), "%s", tu_path("log"));
    cr_assert_eq(mkdir(S.store, 0755), 0);
    cr_assert_eq(mkdir(S.mnt, 0755), 0);
}

static void teardown(void)
{
    if (S.fx.pid > 0)
        fsfx_stop(&S.fx, true, 10.0);
    if (S.fx.mnt[0] && fsfx_is_mounted(S.fx.mnt))
        fsfx_sh("fusermount3 -uz '%s' 2>/dev/null", S.fx.mnt);
    fsfx_cleanup(&S.fx, NULL);
    rmdir(S.mnt);
    fsfx_sh("rm -rf %s", S.store);
}

TestSuite(fs_start, .init = setup, .fini = teardown, .timeout = 60);

/* The daemon run with args exits 1 with exactly one line on stderr, and
 * that line names want. */
static void expect_refused(const char *args, const char *want)
{
    char out[256], cmd[4096], line[2048] = "";
    bool found = false;
    int lines = 0;
    FILE *f;

    snprintf(out, sizeof(out), "%s", tu_path("err"));
    snprintf(cmd, sizeof(cmd), "%s -f %s >/dev/null 2>%s", fsfx_daemon_bin(SHARDFS_BIN), args, out);
    cr_assert_eq(fsfx_sh("%s", cmd), 1, "exit status of: %s", cmd);
    f = fopen(out, "re");
    cr_assert_not_null(f);
    while (fgets(line, sizeof(line), f)) {
        lines++;
        found = found || strstr(line, want);
    }
    fclose(f);
    unlink(out);
    cr_assert_eq(lines, 1, "%d lines of error for: %s", lines, cmd);
    cr_assert(found, "the error of '%s' must name '%s' (it is: %s)", cmd, want, line);
}

/* -o OPTS (after hugepages=off and a 64K shard in 1M) on the test's store
 * and mount point is refused, naming want. */
static void refuse_opts(const char *opts, const char *want)
{
    char args[2048];

    snprintf(args, sizeof(args), "-o socket=%s,hugepages=off,shard_size=64K,capacity=1M,%s %s %s",
             S.sock, opts, S.store, S.mnt);
    expect_refused(args, want);
}

/* Each option's bad values, beyond the sizes and counts test_fs checks:
 * out of range, not a number, inconsistent with another option. */
Test(fs_start, every_bad_option_value_is_refused_with_one_line)
{
    static const struct {
        const char *opts, *want;
    } bad[] = {
        {"shard_size=64Kq", "shard_size=64Kq"},
        {"shard_size=64KiBx", "shard_size=64KiBx"},
        {"capacity=99999999999999999999", "capacity"},
        {"capacity=99999999999T", "capacity"},
        {"shard_size=512,capacity=600G", "too many slots"},
        {"page_cache=lots", "page_cache=lots"},
        {"page_cache=1K", "smaller than one shard"},
        {"page_cache=768K", "above half the capacity"},
        {"warm=101", "warm=101"},
        {"admission=lru", "admission=lru"},
        {"partitions=0", "partitions=0"},
        {"partitions=9", "partitions=9"},
        {"partition_budget=1", "one weight"},
        {"partition_budget=1::2", "not a list of weights"},
        {"partition_budget=0:1", "weight '0'"},
        {"partition_budget=1:15", "under two slots"},
        {"partitions=3,partition_budget=1:1", "for partitions=3"},
        {"pin_budget=101", "pin_budget=101"},
        {"pin_max=0", "pin_max=0"},
        {"pin_user_share=0", "pin_user_share=0"},
        {"warm_pin=x", "warm_pin=x"},
        {"pin_max=10,warm_pin=20", "longer than pin_max"},
        {"revalidate=x", "revalidate=x"},
        {"numa_node=1024", "numa_node=1024"},
        {"attach_uids=12:x", "'x' is not a uid"},
        {"attach_uids=12::13", "not a list of uids"},
        {"attach_gid=staff", "attach_gid=staff"},
        {"max_read=4k", "max_read=4k"},
        {"peers=/nonexistent", "need -o peer_listen"},
        {"peer_listen=127.0.0.1:1,peer_capacity=lots", "peer_capacity=lots"},
        {"peer_listen=127.0.0.1:1,peer_slot=lots", "peer_slot=lots"},
        {"peer_listen=127.0.0.1:1,peer_ways=x", "peer_ways=x"},
        {"peer_listen=127.0.0.1:1,peers=/nonexistent/members", "/nonexistent/members"},
        {"peer_listen=127.0.0.1:1,peer_key=a:b", "cannot be named"},
        {"peer_listen=127.0.0.1:1", "needs -o peer_key"},
        {"default_permissions,no_default_permissions", "pick one"},
        {"hugepages=sometimes", "hugepages=sometimes"},
        {"reserved=16", "reserved=16"},
        {"reserved=x", "reserved=x"},
        {"wait_timeout=0", "wait_timeout=0"},
        {"wait_timeout=86401", "wait_timeout=86401"},
        {"readahead=x", "readahead=x"},
        {"max_read=1024", "max_read=1024"},
        {"max_read=", "out of range (4096..1048576)"},
        {"max_read=99999999999999999999999", "max_read=99999999999999999999999"},
        {"max_read=2097152", "max_read=2097152"},
        {"capacity=32K", "smaller than one shard"},
        {"shard_size=16M,capacity=64T", "larger than this machine's memory"},
        {"page_cache=1KB", "smaller than one shard"},
        {"store_capacity=32K", "store_capacity=32K"},
        {"store_high=90", "need -o store_capacity"},
        {"dir_prefix=33", "dir_prefix=33"},
        {"dir_prefix=", "dir_prefix="},
        {"partition_budget=12345678901234567:1", "not a list of weights"},
        {"peer_listen=127.0.0.1:1,peers=a:b", "cannot be named"},
        /* Good values of the options checked before a bad one do not
         * hide it. */
        {"max_read=8192,hugepages=auto,reserved=1,numa_node=0,attach_gid=0,"
         "peer_listen=127.0.0.1:1",
         "needs -o peer_key"},
    };
    char args[2048], longsock[300];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        refuse_opts(bad[i].opts, bad[i].want);

    /* The socket path: empty, or longer than a socket address holds. */
    snprintf(args, sizeof(args), "-o socket= %s %s", S.store, S.mnt);
    expect_refused(args, "empty path");
    memset(longsock, 'a', sizeof(longsock) - 1);
    longsock[0] = '/';
    longsock[sizeof(longsock) - 1] = '\0';
    snprintf(args, sizeof(args), "-o socket=%s %s %s", longsock, S.store, S.mnt);
    expect_refused(args, "path too long");
    /* More than 64 uids. */
    {
        char uids[1024] = "";

        for (int i = 0; i < 70; i++)
            snprintf(uids + strlen(uids), sizeof(uids) - strlen(uids), "%s%d", i ? ":" : "", i);
        snprintf(args, sizeof(args), "-o socket=%s,attach_uids=%s %s %s", S.sock, uids, S.store,
                 S.mnt);
        expect_refused(args, "more than");
    }
    /* More than 64 partition weights. */
    {
        char w[512] = "";

        for (int i = 0; i < 65; i++)
            snprintf(w + strlen(w), sizeof(w) - strlen(w), "%s1", i ? ":" : "");
        snprintf(args, sizeof(args), "-o socket=%s,capacity=64M,partition_budget=%s %s %s", S.sock,
                 w, S.store, S.mnt);
        expect_refused(args, "more than 64 weights");
    }
    /* Arguments: one too many; no mount point; page_cache without the
     * multi-threaded loop. */
    snprintf(args, sizeof(args), "-o socket=%s %s %s extra", S.sock, S.store, S.mnt);
    expect_refused(args, "too many arguments");
    snprintf(args, sizeof(args), "-o socket=%s %s", S.sock, S.store);
    expect_refused(args, "MOUNTPOINT");
    snprintf(args, sizeof(args),
             "-s -o socket=%s,hugepages=off,shard_size=64K,capacity=1M,page_cache=256K %s %s",
             S.sock, S.store, S.mnt);
    expect_refused(args, "multi-threaded");
}

/* What the start checks on the system: the store is a directory, the mount
 * point exists and is a directory, the socket path names nothing or a
 * socket in a directory that exists, a peer: spec names its key. Nothing is created by a refusal.
 */
Test(fs_start, the_store_mount_point_and_socket_are_checked)
{
    char args[2048], file[256], missing[256];
    struct stat st;
    int fd;

    snprintf(file, sizeof(file), "%s", tu_path("file"));
    snprintf(missing, sizeof(missing), "%s", tu_path("missing"));
    fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0);
    close(fd);

    snprintf(args, sizeof(args), "-o socket=%s %s %s", S.sock, file, S.mnt);
    expect_refused(args, "not a directory");
    snprintf(args, sizeof(args), "-o socket=%s %s %s", S.sock, S.store, missing);
    expect_refused(args, missing);
    snprintf(args, sizeof(args), "-o socket=%s %s %s", S.sock, S.store, file);
    expect_refused(args, "not a directory");
    snprintf(args, sizeof(args), "-o socket=%s %s %s", file, S.store, S.mnt);
    expect_refused(args, "not a socket");
    /* A directory that does not exist: found when the server binds. */
    snprintf(args, sizeof(args), "-o socket=%s/sock,hugepages=off,shard_size=64K,capacity=1M %s %s",
             missing, S.store, S.mnt);
    expect_refused(args, missing);
    snprintf(args, sizeof(args), "-o socket=%s 'peer:listen=127.0.0.1:1:%s' %s", S.sock, S.store,
             S.mnt);
    expect_refused(args, "key=FILE");

    cr_assert_eq(lstat(S.sock, &st), -1, "a refused start created its socket");
    cr_assert_eq(lstat(missing, &st), -1, "a refused start created its mount point");
    cr_assert_eq(stat(file, &st), 0);
    cr_assert_eq(st.st_size, 0, "a refused start wrote the file named as its socket");
    unlink(file);
}

/* A free TCP port on 127.0.0.1. */
static unsigned free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    cr_assert_geq(fd, 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* The tree takes its owner and modes from the store directory, whichever
 * way the spec names it (posix:DIR?OPTIONS, fault:OPTIONS:posix:DIR, the
 * inner store of a peer: spec, after its listen address's port). */
Test(fs_start, the_tree_takes_the_store_directorys_modes)
{
    static const char *fmt[] = {"posix:%s", "posix:%s?direct=0", "fault:seed=1:posix:%s",
                                "peer:listen=127.0.0.1:%u,capacity=1M,key=%s:%s"};
    char spec[512], key[256];
    uint8_t k[32];
    struct stat st;
    int r, fd, status = 0;

    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    cr_assert_eq(chmod(S.store, 0750), 0);
    snprintf(key, sizeof(key), "%s", tu_path("key"));
    cr_assert_eq(getrandom(k, sizeof(k), 0), (ssize_t)sizeof(k));
    fd = open(key, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, k, sizeof(k)), (ssize_t)sizeof(k));
    close(fd);
    for (size_t i = 0; i < sizeof(fmt) / sizeof(fmt[0]); i++) {
        if (strncmp(fmt[i], "peer:", 5) == 0)
            snprintf(spec, sizeof(spec), fmt[i], free_port(), key, S.store);
        else
            snprintf(spec, sizeof(spec), fmt[i], S.store);
        snprintf(S.fx.mnt, sizeof(S.fx.mnt), "%s", S.mnt);
        snprintf(S.fx.sock, sizeof(S.fx.sock), "%s", S.sock);
        S.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
        r = fsfx_start(&S.fx, spec, "hugepages=off,shard_size=64K,capacity=1M", 10.0, &status);
        cr_assert_eq(r, 0, "%s: the mount did not appear (%s, status %d)", spec, strerror(-r),
                     status);
        cr_assert_eq(stat(S.mnt, &st), 0);
        cr_assert_eq(st.st_mode & 0777, 0750, "%s: the root's mode is %o, not the store's 750",
                     spec, st.st_mode & 0777);
        cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
    }
    unlink(key);
}

/* Without -o socket=, the socket is /run/shardfs/<the mount point, '/' as
 * '-', odd bytes as '_'>.sock, cut and hashed when too long for a socket
 * address;
 * the root's socket attribute names it, a cache attaches there, and the
 * stop removes it. */
Test(fs_start, the_default_socket_is_named_after_the_mount_point)
{
    char mnt[400], got[256] = "", want[256];
    struct sfs_cache *c;
    struct stat st;
    ssize_t n;
    int r, err = 0, status = 0;

    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    if (geteuid() != 0 && access("/run/shardfs", W_OK) != 0)
        cr_skip_test("/run/shardfs is not ours to create sockets in: default socket not tested");
    for (int long_path = 0; long_path < 2; long_path++) {
        /* S.mnt/a@b (odd), or S.mnt/<85 x's> (past sun_path's 108). */
        if (long_path) {
            char xs[86];

            memset(xs, 'x', 85);
            xs[85] = '\0';
            snprintf(mnt, sizeof(mnt), "%s/%s", S.mnt, xs);
        } else {
            snprintf(mnt, sizeof(mnt), "%s/a@b", S.mnt);
        }
        cr_assert_lt(strlen(mnt), sizeof(S.fx.mnt), "%s: too long for the fixture", mnt);
        cr_assert_eq(mkdir(mnt, 0755), 0);
        memcpy(S.fx.mnt, mnt, strlen(mnt) + 1);
        S.fx.sock[0] = '\0';
        S.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
        r = fsfx_start(&S.fx, S.store, "hugepages=off,shard_size=64K,capacity=1M", 10.0, &status);
        cr_assert_eq(r, 0, "the mount did not appear (%s, status %d)", strerror(-r), status);
        n = getxattr(mnt, SFS_XATTR_SOCKET, got, sizeof(got) - 1);
        cr_assert_gt(n, 0, "getxattr %s: %s", SFS_XATTR_SOCKET, strerror(errno));
        got[n] = '\0';
        if (long_path) {
            cr_assert_lt(strlen(got), sizeof(((struct sockaddr_un *)0)->sun_path),
                         "%s: too long for a socket address", got);
            cr_assert_eq(strncmp(got, "/run/shardfs/", 13), 0, "%s: not in /run/shardfs", got);
        } else {
            /* Leading '/' dropped, the others as '-', letters, digits, '.'
             * and '_' kept, any other byte ('-', '@') as '_'. */
            const char *p = mnt + 1;
            size_t k = (size_t)snprintf(want, sizeof(want), "/run/shardfs/");

            for (; *p && k < sizeof(want) - 6; p++)
                want[k++] = *p == '/' ? '-' : (isalnum((unsigned char)*p) || *p == '.') ? *p : '_';
            snprintf(want + k, sizeof(want) - k, ".sock");
            cr_assert_str_eq(got, want);
        }
        cr_assert_eq(lstat(got, &st), 0, "%s: %s", got, strerror(errno));
        cr_assert(S_ISSOCK(st.st_mode), "%s is not a socket", got);
        c = sfs_cache_attach(got, 0, &err);
        cr_assert_not_null(c, "attach at %s: %s", got, strerror(-err));
        sfs_cache_close(c);
        cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
        cr_assert_eq(lstat(got, &st), -1, "the stop left %s behind", got);
        rmdir(mnt);
    }
}

/* Write the usage file STORE/.shardfs_usage: a header (magic, version 1,
 * id_len, the shard size, count, entry size), count entries of 24 bytes
 * (a 16-byte id and a count of n each), and its FNV-1a checksum. */
static void usage_file(const char *magic, uint32_t id_len, uint32_t count, uint32_t n)
{
    uint8_t buf[40 + 4 * 24 + 8] = {0};
    uint32_t v = 1, ent = 24;
    uint64_t shard = 64 << 10, h = 0xcbf29ce484222325ull;
    size_t len = 40 + (size_t)count * 24 + 8;
    char path[256];
    FILE *f;

    cr_assert_leq(count, 4u);
    memcpy(buf, magic, 8);
    memcpy(buf + 8, &v, 4);
    memcpy(buf + 12, &id_len, 4);
    memcpy(buf + 16, &shard, 8);
    memcpy(buf + 32, &count, 4);
    memcpy(buf + 36, &ent, 4);
    for (uint32_t i = 0; i < count; i++) {
        memset(buf + 40 + i * 24, 0x10 + (int)i, 16);
        memcpy(buf + 40 + i * 24 + 16, &n, 4);
    }
    for (size_t i = 0; i < len - 8; i++)
        h = (h ^ buf[i]) * 0x100000001b3ull;
    memcpy(buf + len - 8, &h, 8);
    snprintf(path, sizeof(path), "%s/.shardfs_usage", S.store);
    f = fopen(path, "we");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(buf, 1, len, f), len);
    fclose(f);
}

/* Mount read-only (the usage file is then never rewritten), stop; the log
 * has n lines naming why. */
static void start_and_stop(const char *why, int n)
{
    char want[128];
    int r, status = 0;

    unlink(S.fx.log);
    snprintf(S.fx.mnt, sizeof(S.fx.mnt), "%s", S.mnt);
    snprintf(S.fx.sock, sizeof(S.fx.sock), "%s", S.sock);
    S.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
    r = fsfx_start(&S.fx, S.store, "ro,hugepages=off,shard_size=64K,capacity=1M", 10.0, &status);
    cr_assert_eq(r, 0, "the mount did not appear (%s, status %d)", strerror(-r), status);
    cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
    snprintf(want, sizeof(want), "ignored: %s", why);
    cr_assert_eq(fsfx_log_lines_with(&S.fx, want), n, "the log does not say '%s' %d time(s)", want,
                 n);
}

/* A usage file the start cannot use (not a regular file, truncated, too
 * large, another magic, a foreign block-id format) is ignored with one log
 * line saying why, and the mount starts all the same; one whose entries
 * count nothing is taken silently. */
Test(fs_start, a_usage_file_it_cannot_use_is_ignored_with_its_reason)
{
    char path[256], target[256];
    int fd;

    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    snprintf(path, sizeof(path), "%s/.shardfs_usage", S.store);
    snprintf(target, sizeof(target), "%s/elsewhere", S.store);
    cr_assert_eq(symlink(target, path), 0);
    start_and_stop("not a regular file", 1);
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(mkdir(path, 0755), 0);
    start_and_stop("not a regular file", 1);
    cr_assert_eq(rmdir(path), 0);

    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "SFSUSAGE\1\0", 10), 10);
    cr_assert_eq(ftruncate(fd, 2 << 20), 0); /* past 65536 entries of 24 bytes */
    close(fd);
    start_and_stop("larger than any usage file", 1);
    cr_assert_eq(truncate(path, 10), 0);
    start_and_stop("truncated", 1);

    usage_file("NOTUSAGE", 16, 0, 0);
    start_and_stop("not a shardfs usage file (bad magic)", 1);
    usage_file("SFSUSAGE", 20, 0, 0);
    start_and_stop("foreign block-id format", 1);
    usage_file("SFSUSAGE", 16, 2, 0);
    start_and_stop("", 0);
}

/* A step of the start after the checks that fails (the test build fails it
 * on demand: SHARDFS_TEST_START_FAIL, as a thread that cannot start, a
 * session libfuse cannot make or a mount the kernel refuses would) ends the
 * start with exit status 1 and the step's one line, in the foreground and
 * through the daemonizing parent; what the start had made is undone: no
 * mount is left, the socket is removed. A revalidation thread that cannot
 * start does not fail the mount: it serves, saying that blocks other hosts
 * replace are served until evicted. */
Test(fs_start, a_step_that_fails_after_the_checks_undoes_the_start)
{
    static const struct {
        const char *step, *want; /* want NULL: libfuse's own reason (none here) */
        bool foreground;
    } steps[] = {
        {"session", NULL, true},
        {"signals", "signal handlers", true},
        {"mount", "mount failed", true},
        {"reaper", "reaper thread", true},
        {"settler", "settler thread", true},
        {"pagecache", "page-cache thread", true},
        {"storecap", "collector thread", true},
        {"loop", "session thread", true},
        {"loop", "session thread", false},
    };
    char out[256], line[1024], dir[160], sock[200];
    struct stat st;

    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    snprintf(out, sizeof(out), "%s", tu_path("err"));
    /* The socket in a directory of its own (in /tmp its warning would be
     * one more line). */
    snprintf(dir, sizeof(dir), "%s", tu_path("sockdir"));
    cr_assert_eq(mkdir(dir, 0700), 0);
    snprintf(sock, sizeof(sock), "%s/sock", dir);
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        int lines = 0, rc;
        bool found = false;
        FILE *f;

        rc = fsfx_sh("SHARDFS_TEST_START_FAIL=%s %s %s -o socket=%s,hugepages=off,shard_size=64K,"
                     "capacity=1M,revalidate=50 %s %s >/dev/null 2>%s",
                     steps[i].step, fsfx_daemon_bin(SHARDFS_BIN), steps[i].foreground ? "-f" : "",
                     sock, S.store, S.mnt, out);
        cr_assert_eq(rc, 1, "%s: exit status %d", steps[i].step, rc);
        f = fopen(out, "re");
        cr_assert_not_null(f);
        while (fgets(line, sizeof(line), f)) {
            lines++;
            found = found || (steps[i].want && strstr(line, steps[i].want));
        }
        fclose(f);
        cr_assert_eq(lines, steps[i].want ? 1 : 0, "%s: %d lines of error (the last: %s)",
                     steps[i].step, lines, line);
        cr_assert(!steps[i].want || found, "%s: the error does not name '%s' (it is: %s)",
                  steps[i].step, steps[i].want, line);
        cr_assert(!fsfx_is_mounted(S.mnt), "%s: the mount was left behind", steps[i].step);
        cr_assert_eq(lstat(sock, &st), -1, "%s: the socket was left behind", steps[i].step);
    }
    unlink(out);
    rmdir(dir);
}

Test(fs_start, a_revalidation_thread_that_cannot_start_does_not_fail_the_mount)
{
    char p[256];
    int r, status = 0;

    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    snprintf(S.fx.mnt, sizeof(S.fx.mnt), "%s", S.mnt);
    snprintf(S.fx.sock, sizeof(S.fx.sock), "%s", S.sock);
    S.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
    setenv("SHARDFS_TEST_START_FAIL", "revalidate", 1);
    r = fsfx_start(&S.fx, S.store, "hugepages=off,shard_size=64K,capacity=1M,revalidate=50", 10.0,
                   &status);
    unsetenv("SHARDFS_TEST_START_FAIL");
    cr_assert_eq(r, 0, "the mount did not appear (%s, status %d)", strerror(-r), status);
    snprintf(p, sizeof(p), "%s/stats", S.mnt);
    cr_assert_eq(access(p, R_OK), 0, "the mount serves");
    fsfx_sleep_ms(200); /* four periods: a sweep would have run */
    cr_assert_eq(fsfx_stat(&S.fx, "shardfs_revalidate_sweeps_total"), 0);
    cr_assert_eq(fsfx_stop(&S.fx, false, 10.0), 0);
    cr_assert_eq(fsfx_log_lines_with(&S.fx, "served until evicted"), 1);
}

/* The huge pages the machine has free, in bytes (HugePages_Free less the
 * reserved ones, times Hugepagesize); -1 when /proc/meminfo does not say. */
static long long huge_free_bytes(void)
{
    long long free_pages = -1, rsvd = 0, size_kb = -1, v;
    char line[256];
    FILE *f = fopen("/proc/meminfo", "re");

    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "HugePages_Free: %lld", &v) == 1)
            free_pages = v;
        else if (sscanf(line, "HugePages_Rsvd: %lld", &v) == 1)
            rsvd = v;
        else if (sscanf(line, "Hugepagesize: %lld kB", &v) == 1)
            size_kb = v;
    }
    fclose(f);
    if (free_pages < 0 || size_kb <= 0)
        return -1;
    return (free_pages > rsvd ? free_pages - rsvd : 0) * size_kb * 1024;
}

/* hugepages=on with more capacity than the machine has huge pages free: a
 * cache the start cannot create, refused (its last line says so) with
 * nothing left behind: no mount, no socket. */
Test(fs_start, a_cache_it_cannot_create_is_refused)
{
    long long free_b = huge_free_bytes(), cap;
    char out[256], line[1024] = "", last[1024] = "";
    struct stat st;
    FILE *f;
    int rc;

    if (free_b < 0)
        cr_skip_test("no huge page figures in /proc/meminfo");
    cap = free_b + (4ll << 20); /* 2 huge pages of 2M (or 1 of 1G) more than free */
    if (cap > (1ll << 30))
        cr_skip_test("%lld bytes of huge pages free: more than this test should ask for", free_b);
    snprintf(out, sizeof(out), "%s", tu_path("err"));
    rc = fsfx_sh("%s -f -o socket=%s,hugepages=on,shard_size=64K,capacity=%lldK %s %s "
                 ">/dev/null 2>%s",
                 fsfx_daemon_bin(SHARDFS_BIN), S.sock, cap >> 10, S.store, S.mnt, out);
    cr_assert_eq(rc, 1, "exit status %d", rc);
    f = fopen(out, "re");
    cr_assert_not_null(f);
    while (fgets(line, sizeof(line), f))
        snprintf(last, sizeof(last), "%s", line);
    fclose(f);
    unlink(out);
    cr_assert(strstr(last, "cannot create the cache") && strstr(last, "hugepages=on"),
              "the refusal's line: %s", last);
    cr_assert(!fsfx_is_mounted(S.mnt), "a mount was left behind");
    cr_assert_eq(lstat(S.sock, &st), -1, "the socket was left behind");
}

/* Mount read-write, read a shard until the hot set counts it (so the stop
 * has a usage file to write), stop; the daemon's exit status. */
static int read_and_stop(void)
{
    static char buf[64 << 10];
    int r, status = 0;

    unlink(S.fx.log);
    snprintf(S.fx.mnt, sizeof(S.fx.mnt), "%s", S.mnt);
    snprintf(S.fx.sock, sizeof(S.fx.sock), "%s", S.sock);
    S.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
    r = fsfx_start(&S.fx, S.store, "hugepages=off,shard_size=64K,capacity=1M", 10.0, &status);
    cr_assert_eq(r, 0, "the mount did not appear (%s, status %d)", strerror(-r), status);
    cr_assert_eq(fsfx_read_all(fsfx_shard_path(&S.fx, 1, 0), buf, sizeof(buf)), (long)sizeof(buf));
    for (int i = 0; i < 500 && fsfx_sh("grep -q '^shardfs_hot_block_uses{' %s/stats", S.mnt); i++)
        fsfx_sleep_ms(10);
    cr_assert_eq(fsfx_sh("grep -q '^shardfs_hot_block_uses{' %s/stats", S.mnt), 0,
                 "the read was not counted");
    return fsfx_stop(&S.fx, false, 10.0);
}

/* A usage file the stop cannot write (a directory at its name, or at its
 * temporary name) is reported with one log line, and the stop goes on: exit
 * status 0, the directory as it was, no temporary file left. */
Test(fs_start, a_usage_file_it_cannot_write_is_reported_and_the_stop_goes_on)
{
    char path[256], tmp[300];
    struct stat st;

    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    cr_assert_eq(tu_store_write(S.store, 1, 1, 1, 64 << 10, NULL, NULL, false), 0);
    snprintf(path, sizeof(path), "%s/.shardfs_usage", S.store);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);

    cr_assert_eq(mkdir(path, 0755), 0);
    cr_assert_eq(read_and_stop(), 0);
    cr_assert_eq(fsfx_log_lines_with(&S.fx, "not written: Is a directory"), 1,
                 "the failed write was not reported, see %s", S.fx.log);
    cr_assert(stat(path, &st) == 0 && S_ISDIR(st.st_mode), "the directory was replaced");
    cr_assert_eq(lstat(tmp, &st), -1, "the temporary file was left behind");
    cr_assert_eq(rmdir(path), 0);

    cr_assert_eq(mkdir(tmp, 0755), 0);
    cr_assert_eq(read_and_stop(), 0);
    cr_assert_eq(fsfx_log_lines_with(&S.fx, "not written: Is a directory"), 1,
                 "the failed write was not reported, see %s", S.fx.log);
    cr_assert(stat(tmp, &st) == 0 && S_ISDIR(st.st_mode), "the directory was replaced");
    cr_assert_eq(lstat(path, &st), -1, "a usage file was written without its temporary file");
    cr_assert_eq(rmdir(tmp), 0);
}

/* What libfuse refuses of the command line: an -o without its argument
 * (our line after libfuse's), an option neither knows (libfuse's line, when
 * the session is made, after the cache and the socket: both undone). */
Test(fs_start, options_libfuse_refuses_end_the_start)
{
    char out[256], cmd[2048], text[4096] = "";
    struct stat st;
    size_t n;
    FILE *f;

    snprintf(out, sizeof(out), "%s", tu_path("err"));
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof(cmd),
                 "%s -f -o socket=%s,hugepages=off,shard_size=64K,capacity=1M %s %s %s "
                 ">/dev/null 2>%s",
                 fsfx_daemon_bin(SHARDFS_BIN), S.sock, S.store, S.mnt,
                 i == 0 ? "-o" : "-o no_such_option=1", out);
        cr_assert_eq(fsfx_sh("%s", cmd), 1, "exit status of: %s", cmd);
        f = fopen(out, "re");
        cr_assert_not_null(f);
        n = fread(text, 1, sizeof(text) - 1, f);
        text[n] = '\0';
        fclose(f);
        cr_assert(strstr(text, i == 0 ? "bad options (see --help)" : "no_such_option"),
                  "the errors of '%s' (they are: %s)", cmd, text);
        cr_assert(!fsfx_is_mounted(S.mnt), "a mount was left behind");
        cr_assert_eq(lstat(S.sock, &st), -1, "the socket was left behind");
    }
    unlink(out);
}

/* The session's loop as the FUSE options ask: single-threaded (-s), or
 * multi-threaded with libfuse's bounds on its workers (max_idle_threads,
 * max_threads). Each daemonized start returns 0 once the mount serves; a
 * read through it answers the shard's bytes, and an unmount ends it. */
Test(fs_start, the_loop_runs_as_the_fuse_options_ask)
{
    static const char *const how[] = {"-s -o ", "-o max_idle_threads=2,max_threads=4,"};
    static char buf[64 << 10], want[64 << 10];
    struct sfs_key k = tu_key(1, 0);

    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3: FUSE tests skipped");
    cr_assert_eq(tu_store_write(S.store, 1, 1, 1, sizeof(buf), NULL, NULL, false), 0);
    tu_fill(&k, want, sizeof(want));
    snprintf(S.fx.mnt, sizeof(S.fx.mnt), "%s", S.mnt); /* the teardown's: detach if left */
    for (size_t i = 0; i < sizeof(how) / sizeof(how[0]); i++) {
        int rc = fsfx_sh("%s %ssocket=%s,hugepages=off,shard_size=64K,capacity=1M %s %s "
                         ">/dev/null 2>&1",
                         fsfx_daemon_bin(SHARDFS_BIN), how[i], S.sock, S.store, S.mnt);

        cr_assert_eq(rc, 0, "%s: the daemonized start exited %d", how[i], rc);
        cr_assert(fsfx_is_mounted(S.mnt), "%s: not mounted when the start returned", how[i]);
        cr_assert_eq(fsfx_read_all(fsfx_shard_path(&S.fx, 1, 0), buf, sizeof(buf)),
                     (long)sizeof(buf), "%s: a read", how[i]);
        cr_assert_eq(memcmp(buf, want, sizeof(buf)), 0, "%s: the shard's bytes", how[i]);
        cr_assert_eq(fsfx_sh("fusermount3 -u '%s'", S.mnt), 0, "%s: unmount", how[i]);
        for (int t = 0; t < 500 && access(S.sock, F_OK) == 0; t++)
            fsfx_sleep_ms(10); /* the daemon removes its socket as it exits */
        cr_assert_neq(access(S.sock, F_OK), 0, "%s: the daemon did not exit", how[i]);
    }
}

/* A mount copied into another mount namespace (a container made while it
 * was mounted: `unshare -m`, `ip netns exec`) outlives its unmount here:
 * the kernel keeps the connection for the copy and the daemon keeps
 * serving it, until it is stopped (SIGTERM), when the copy's reads fail
 * (ENOTCONN). The test fixture's stop handles it the same way. */
Test(fs_start, a_copy_in_another_mount_namespace_is_served_until_a_stop)
{
    int r, status = 0, ready[2], go[2], answer[2];
    char c = 0, path[300];
    pid_t child;

    snprintf(S.fx.mnt, sizeof(S.fx.mnt), "%s", S.mnt);
    snprintf(S.fx.sock, sizeof(S.fx.sock), "%s", S.sock);
    S.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
    r = fsfx_start(&S.fx, S.store, "hugepages=off,shard_size=64K,capacity=1M", 10.0, &status);
    cr_assert_eq(r, 0, "the mount did not appear (%s, status %d)", strerror(-r), status);
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(go), 0);
    cr_assert_eq(pipe(answer), 0);
    snprintf(path, sizeof(path), "%s/stats", S.mnt);
    child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) {
        /* The container: a copy of every mount, this one included. Each
         * time told, it answers whether it can read the daemon's stats. */
        char ok = unshare(CLONE_NEWNS) == 0 ? 'u' : 'x';

        close(ready[0]);
        close(go[1]); /* the parent's close of it ends this child */
        close(answer[0]);
        if (write(ready[1], &ok, 1) != 1)
            _exit(1);
        while (read(go[0], &c, 1) == 1) {
            int fd = open(path, O_RDONLY);
            char buf[64];

            ok = fd >= 0 && read(fd, buf, sizeof(buf)) > 0 ? 'y' : 'n';
            if (fd >= 0)
                close(fd);
            if (write(answer[1], &ok, 1) != 1)
                _exit(1);
        }
        _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    close(answer[1]);
    cr_assert_eq(read(ready[0], &c, 1), 1);
    cr_assert_eq(c, 'u', "unshare(CLONE_NEWNS) failed in the child");
    cr_assert_eq(fsfx_sh("fusermount3 -u %s", S.mnt), 0, "the unmount here");
    cr_assert(!fsfx_is_mounted(S.mnt));
    fsfx_sleep_ms(300);
    cr_assert_eq(waitpid(S.fx.pid, &status, WNOHANG), 0, "the daemon left with its copy still mounted");
    cr_assert_eq(write(go[1], "?", 1), 1);
    cr_assert_eq(read(answer[0], &c, 1), 1);
    cr_assert_eq(c, 'y', "the copy in the other namespace is not served");
    r = fsfx_stop(&S.fx, false, 10.0);
    cr_assert_eq(r, 0, "the stop: %d", r);
    cr_assert_eq(write(go[1], "?", 1), 1);
    cr_assert_eq(read(answer[0], &c, 1), 1);
    cr_assert_eq(c, 'n', "the copy still answers after the daemon stopped");
    close(go[1]);
    cr_assert_eq(waitpid(child, &status, 0), child);
    close(ready[0]);
    close(answer[0]);
}
