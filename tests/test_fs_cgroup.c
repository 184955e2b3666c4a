/* SPDX-License-Identifier: MIT */
/*
 * test_fs_cgroup.c - the start's walk of its cgroups (fs/cgroup.c) against
 * the odd files a host can show it: a mount point with an escaped space,
 * lines of /proc/self/mountinfo and /proc/self/cgroup it cannot use, limit
 * files that hold no number, a cgroup outside the mounted subtree or above
 * the namespace's root, and a v1 hierarchy of several controllers. Each
 * case must find the limit a careful reader would (the refusal names its
 * file and its bytes) or none (the start goes on to the missing store).
 *
 * The daemon reads a fake tree through the test build's
 * SHARDFS_TEST_CGROUP_ROOT, in the foreground; nothing mounts (the store
 * directory does not exist, which is the next check after the limits), so
 * neither /dev/fuse nor privileges are needed. test_fs holds the ordinary
 * trees (v2, v1, a bind of a subtree, huge pages).
 */
#include "fsfixture.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

static struct {
    char root[256], sock[256], nostore[256], mnt[256];
} G;

static void setup(void)
{
    snprintf(G.root, sizeof(G.root), "%s", tu_path("cgroot"));
    snprintf(G.sock, sizeof(G.sock), "%s", tu_path("sock"));
    snprintf(G.nostore, sizeof(G.nostore), "%s", tu_path("nostore")); /* never created */
    snprintf(G.mnt, sizeof(G.mnt), "%s", tu_path("mnt"));
    cr_assert_eq(mkdir(G.mnt, 0755), 0);
}

static void teardown(void)
{
    rmdir(G.mnt);
    fsfx_sh("rm -rf '%s'", G.root);
}

TestSuite(fs_cgroup, .init = setup, .fini = teardown, .timeout = 60);

/* ROOT/rel holds text (its directories made). */
static void put(const char *rel, const char *text)
{
    char path[1024];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", G.root, rel);
    cr_assert_eq(fsfx_sh("mkdir -p \"$(dirname '%s')\"", path), 0);
    f = fopen(path, "we");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    fputs(text, f);
    fclose(f);
}

/* The daemon started with hugepages=off and capacity cap on the fake tree
 * exits 1 with one line naming want and want2 (want2 may be NULL). */
static void refused(const char *cap, const char *want, const char *want2)
{
    char out[256], cmd[4096], line[2048] = "";
    bool found = false;
    int lines = 0;
    FILE *f;

    snprintf(out, sizeof(out), "%s", tu_path("err"));
    snprintf(cmd, sizeof(cmd),
             "SHARDFS_TEST_CGROUP_ROOT='%s' %s -f -o socket=%s,hugepages=off,capacity=%s %s %s "
             ">/dev/null 2>%s",
             G.root, fsfx_daemon_bin(SHARDFS_BIN), G.sock, cap, G.nostore, G.mnt, out);
    cr_assert_eq(fsfx_sh("%s", cmd), 1, "exit status of: %s", cmd);
    f = fopen(out, "re");
    cr_assert_not_null(f);
    while (fgets(line, sizeof(line), f)) {
        lines++;
        found = found || (strstr(line, want) && (!want2 || strstr(line, want2)));
    }
    fclose(f);
    unlink(out);
    cr_assert_eq(lines, 1, "%d lines of error for: %s", lines, cmd);
    cr_assert(found, "the error of '%s' must name '%s' %s (it is: %s)", cmd, want,
              want2 ? want2 : "", line);
}

/* capacity cap passes the limits: the start stops at the missing store. */
static void passes(const char *cap)
{
    refused(cap, "BACKEND_DIR", G.nostore);
}

/* The limit file ROOT/rel, as the refusal names it. */
static const char *file_of(const char *rel)
{
    static char p[4][1024];
    static unsigned i;
    char *s = p[i++ % 4];

    snprintf(s, sizeof(p[0]), "%s/%s", G.root, rel);
    return s;
}

/* A mount point with a space, which mountinfo writes as \040: the limit
 * under the real name is found. */
Test(fs_cgroup, a_mount_point_with_an_escaped_space)
{
    put("proc/self/cgroup", "0::/a\n");
    put("proc/self/mountinfo", "30 20 0:26 / /sys/fs/cg\\040v2 rw - cgroup2 cgroup2 rw\n");
    put("sys/fs/cg v2/a/memory.max", "67108864\n");
    refused("128M", file_of("sys/fs/cg v2/a/memory.max"), "67108864 bytes");
    passes("64M");

    /* A backslash without three octal digits after it is a backslash. */
    static const char *const odd[] = {"c\\9g", "c\\18g", "c\\128g", "c\\"};
    for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
        char mi[256], rel[128];

        snprintf(mi, sizeof(mi), "30 20 0:26 / /sys/fs/%s rw - cgroup2 cgroup2 rw\n", odd[i]);
        put("proc/self/mountinfo", mi);
        snprintf(rel, sizeof(rel), "sys/fs/%s/a/memory.max", odd[i]);
        put(rel, "33554432\n");
        refused("64M", file_of(rel), "33554432 bytes");
    }
}

/* Lines neither file can be read by are skipped, the good ones still
 * count: a mountinfo line without its separator, one cut after the file
 * system type, one with too few fields before the separator, another file
 * system's; a cgroup line without its fields, one with a relative path. */
Test(fs_cgroup, lines_it_cannot_read_are_skipped)
{
    put("proc/self/cgroup", "garbage\n0::relative\n0::/a\n");
    put("proc/self/mountinfo", "no separator at all\n"
                               "31 20 0:27 / /x rw - cgroup2\n"
                               "32 20 0:28 / - cgroup2 cgroup2 rw\n"
                               "33 20 0:29 / /tmp rw - tmpfs tmpfs rw\n"
                               "34 20 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    put("sys/fs/cgroup/a/memory.max", "67108864\n");
    refused("128M", file_of("sys/fs/cgroup/a/memory.max"), "67108864 bytes");
}

/* A limit file that holds no number (negative, a suffix, empty, past
 * 2^64) is no limit: the next one up still counts. */
Test(fs_cgroup, a_limit_file_without_a_number_is_no_limit)
{
    put("proc/self/cgroup", "0::/a/b/c/d/e\n");
    put("proc/self/mountinfo", "30 20 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    put("sys/fs/cgroup/a/b/c/d/e/memory.max", "-5\n");
    put("sys/fs/cgroup/a/b/c/d/memory.max", "64M\n");
    put("sys/fs/cgroup/a/b/c/memory.max", "\n");
    put("sys/fs/cgroup/a/b/memory.max", "99999999999999999999999\n");
    passes("512M");
    put("sys/fs/cgroup/a/memory.max", "134217728\n");
    refused("512M", file_of("sys/fs/cgroup/a/memory.max"), "134217728 bytes");
}

/* A cgroup the mount cannot show (outside the bound subtree, or above the
 * cgroup namespace's root: "/.." in its path) is read at the mount point
 * only, never beside or above it. */
Test(fs_cgroup, a_cgroup_outside_the_mount_is_read_at_its_mount_point)
{
    put("proc/self/cgroup", "0::/elsewhere/c\n");
    put("proc/self/mountinfo", "30 20 0:26 /pods/p1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    put("sys/fs/cgroup/elsewhere/c/memory.max", "4096\n"); /* another's: not ours to read */
    passes("64M");
    put("sys/fs/cgroup/memory.max", "33554432\n");
    refused("64M", file_of("sys/fs/cgroup/memory.max"), "33554432 bytes");

    /* A prefix of the subtree's name is not inside it. */
    put("proc/self/cgroup", "0::/pods/p10/c\n");
    put("sys/fs/cgroup/c/memory.max", "4096\n");
    refused("64M", file_of("sys/fs/cgroup/memory.max"), "33554432 bytes");

    put("proc/self/cgroup", "0::/../../x\n");
    put("proc/self/mountinfo", "30 20 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
    put("sys/x/memory.max", "4096\n");
    refused("64M", file_of("sys/fs/cgroup/memory.max"), "33554432 bytes");
}

/* cgroup v1: a hierarchy of several controllers is found at the mount
 * whose options hold every one of them; one that holds only some is
 * another hierarchy. Hierarchies with neither memory nor hugetlb are not
 * read; hugetlb's has no memory limit (and no huge pages are asked for). */
Test(fs_cgroup, a_v1_hierarchy_of_several_controllers)
{
    put("proc/self/cgroup", "7:pids:/x\n6:hugetlb:/x\n4:cpu,memory:/x\n");
    put("proc/self/mountinfo",
        "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "36 31 0:33 / /sys/fs/cgroup/cpu,memory rw - cgroup cgroup rw,cpu,memory\n"
        "37 31 0:34 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
        "38 31 0:35 / /sys/fs/cgroup/hugetlb rw - cgroup cgroup rw,hugetlb\n");
    put("sys/fs/cgroup/memory/x/memory.limit_in_bytes", "4096\n"); /* another hierarchy's */
    put("sys/fs/cgroup/pids/x/memory.limit_in_bytes", "4096\n");   /* not a memory one */
    put("sys/fs/cgroup/cpu,memory/x/memory.limit_in_bytes", "67108864\n");
    refused("128M", file_of("sys/fs/cgroup/cpu,memory/x/memory.limit_in_bytes"), "67108864 bytes");
    passes("64M");

    /* Hierarchy 0 with controllers is a v1 one, not the v2 hierarchy. */
    put("proc/self/cgroup", "0:cpu,memory:/x\n");
    refused("128M", file_of("sys/fs/cgroup/cpu,memory/x/memory.limit_in_bytes"), "67108864 bytes");
}
