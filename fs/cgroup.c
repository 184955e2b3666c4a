/* SPDX-License-Identifier: MIT */
/*
 * cgroup.c - the memory limits of the daemon's own cgroups, for the capacity
 * check at mount.
 *
 * The data plane is prefaulted at start. A capacity under the machine's RAM
 * can still be far above what the daemon may use in a container or a systemd
 * unit with MemoryMax, and then the OOM killer, not an error, answers. So
 * main() also compares the capacity with the smallest limit found here.
 *
 * Key idea: a limit applies through every ancestor, so the effective one is
 * the smallest along the path. For each hierarchy /proc/self/cgroup names, we
 * find where it is mounted (/proc/self/mountinfo, minus the mount's own root
 * when it is a bind of a subtree), then read the limit files of our cgroup
 * and of each parent up to the mount point:
 *
 *   cgroup v2:  memory.max ("max": none)        hugetlb.<size>.max
 *   cgroup v1:  memory.limit_in_bytes           hugetlb.<size>.limit_in_bytes
 *               (2^63 rounded down to a page, "unlimited", counts as none)
 *
 * Ordinary memfds (shmem) are charged to the memory limit; huge pages are
 * charged to the hugetlb limit of their size, not to memory.max, unless the
 * cgroup2 mount has memory_hugetlb_accounting (Linux 6.6+). Files that do
 * not exist (a controller not enabled, the root cgroup) are skipped.
 *
 * For tests (a hook of the test build, shardfs-hooks, only):
 * SHARDFS_TEST_CGROUP_ROOT=DIR reads DIR/proc/self/cgroup,
 * DIR/proc/self/mountinfo and the limit files under DIR, so the walk can be
 * checked against a fake tree without privileges or a cgroup v2 host.
 */
#include "fs_i.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* v1 writes "no limit" as PAGE_COUNTER_MAX pages: 2^63 rounded down. */
#define V1_UNLIMITED (1ull << 62)

static const char *test_root(void)
{
#ifdef SFS_TEST_HOOKS
    const char *r = getenv("SHARDFS_TEST_CGROUP_ROOT");

    return r ? r : "";
#else
    return "";
#endif
}

/* Does the comma-separated list have the item? */
static bool list_has(const char *list, const char *item)
{
    size_t n = strlen(item);

    for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
        if (strncmp(p, item, n) == 0 && (p[n] == ',' || p[n] == '\0'))
            return true;
    }
    return false;
}

void fs_unescape(char *s)
{
    char *w = s;

    for (char *r = s; *r;) {
        if (r[0] == '\\' && r[1] >= '0' && r[1] <= '7' && r[2] >= '0' && r[2] <= '7' &&
            r[3] >= '0' && r[3] <= '7') {
            *w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
            r += 4;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
}

/* A mount of one hierarchy: its root within the hierarchy, where it is. */
struct cg_mount {
    char root[PATH_MAX], point[PATH_MAX];
    bool hugetlb_accounting; /* v2: memory_hugetlb_accounting */
};

/* Find the mount of the v2 hierarchy (controllers == NULL) or of the v1
 * hierarchy with these controllers ("memory", "cpu,cpuacct",
 * "name=systemd"). Returns false if none. */
static bool find_mount(const char *controllers, struct cg_mount *out)
{
    char path[PATH_MAX], line[4096];
    bool found = false;
    FILE *f;

    snprintf(path, sizeof(path), "%s/proc/self/mountinfo", test_root());
    f = fopen(path, "re");
    if (!f)
        return false;
    while (!found && fgets(line, sizeof(line), f)) {
        char *save = NULL, *tok[5], *sep, *fstype, *super;
        int i;

        /* id parent major:minor root point opts [optional...] - fstype source super */
        line[strcspn(line, "\n")] = '\0';
        sep = strstr(line, " - ");
        if (!sep)
            continue;
        *sep = '\0';
        fstype = strtok_r(sep + 3, " ", &save);
        strtok_r(NULL, " ", &save); /* source */
        super = strtok_r(NULL, " ", &save);
        if (!fstype || !super)
            continue;
        if (controllers ? strcmp(fstype, "cgroup") != 0 : strcmp(fstype, "cgroup2") != 0)
            continue;
        if (controllers) {
            /* Every controller of the hierarchy is among the mount's options. */
            char c[256], *s2 = NULL;
            bool all = true;

            snprintf(c, sizeof(c), "%s", controllers);
            for (char *t = strtok_r(c, ",", &s2); t; t = strtok_r(NULL, ",", &s2))
                all = all && list_has(super, t);
            if (!all)
                continue;
        }
        save = NULL;
        tok[0] = strtok_r(line, " ", &save);
        for (i = 1; i < 5 && tok[i - 1]; i++)
            tok[i] = strtok_r(NULL, " ", &save);
        if (i < 5 || !tok[4])
            continue;
        fs_unescape(tok[3]);
        fs_unescape(tok[4]);
        snprintf(out->root, sizeof(out->root), "%s", tok[3]);
        snprintf(out->point, sizeof(out->point), "%s%s", test_root(), tok[4]);
        out->hugetlb_accounting = !controllers && list_has(super, "memory_hugetlb_accounting");
        found = true;
    }
    fclose(f);
    return found;
}

/* Read a limit file: false if absent or unreadable, else *out (UINT64_MAX
 * for "max" or v1's unlimited). */
static bool read_limit(const char *path, uint64_t *out)
{
    char buf[64];
    FILE *f = fopen(path, "re");
    char *end;
    uint64_t v;
    bool ok;

    if (!f)
        return false;
    ok = fgets(buf, sizeof(buf), f) != NULL;
    fclose(f);
    if (!ok)
        return false;
    buf[strcspn(buf, "\n")] = '\0';
    if (strcmp(buf, "max") == 0) {
        *out = UINT64_MAX;
        return true;
    }
    errno = 0;
    v = strtoull(buf, &end, 10);
    if (errno || end == buf || *end || buf[0] == '-')
        return false;
    *out = v >= V1_UNLIMITED ? UINT64_MAX : v;
    return true;
}

/* Keep the smaller of *lim and the limit in dir/file. */
static void take_min(const char *dir, const char *file, struct fs_limit *lim)
{
    char path[PATH_MAX + 64];
    uint64_t v;

    if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, file) >= sizeof(path))
        return;
    if (read_limit(path, &v) && v < lim->bytes) {
        lim->bytes = v;
        snprintf(lim->where, sizeof(lim->where), "%s", path);
    }
}

/* Walk from the cgroup at `path` in this hierarchy up to the mount point,
 * taking the smallest memory and hugetlb limits. */
static void walk(const struct cg_mount *m, const char *path, bool v2, const char *hpname,
                 struct fs_cgroup_limits *out)
{
    char dir[PATH_MAX], mem[64], huge[64];
    size_t top, rl = strlen(m->root);
    const char *rel = path;

    if (strcmp(m->root, "/") != 0) {
        /* A bind of a subtree: the path is relative to its root, or (outside
         * it, in another namespace) unknown: then only the mount point. */
        if (strncmp(path, m->root, rl) == 0 && (path[rl] == '/' || path[rl] == '\0'))
            rel = path + rl;
        else
            rel = "";
    }
    if (strstr(rel, "/.."))
        rel = ""; /* outside our cgroup namespace: only what we can see */
    snprintf(mem, sizeof(mem), "%s", v2 ? "memory.max" : "memory.limit_in_bytes");
    snprintf(huge, sizeof(huge), "hugetlb.%s.%s", hpname, v2 ? "max" : "limit_in_bytes");
    if ((size_t)snprintf(dir, sizeof(dir), "%s%s", m->point, strcmp(rel, "/") ? rel : "") >=
        sizeof(dir))
        return;
    top = strlen(m->point);
    for (;;) {
        size_t n = strlen(dir);

        while (n > top && dir[n - 1] == '/')
            dir[--n] = '\0';
        take_min(dir, mem, &out->memory);
        if (hpname[0])
            take_min(dir, huge, &out->hugetlb);
        if (n <= top)
            break;
        while (n > top && dir[n - 1] != '/')
            n--;
        dir[n] = '\0';
    }
}

/* The kernel's name of a huge page size: 2MB, 1GB, 64KB. */
static void hugepage_name(uint64_t size, char *out, size_t len)
{
    if (size >= (1ull << 30))
        snprintf(out, len, "%" PRIu64 "GB", size >> 30);
    else if (size >= (1ull << 20))
        snprintf(out, len, "%" PRIu64 "MB", size >> 20);
    else
        snprintf(out, len, "%" PRIu64 "KB", size >> 10);
}

void fs_cgroup_limits(uint64_t hugepage_size, struct fs_cgroup_limits *out)
{
    char path[PATH_MAX], line[4096], hpname[32] = "";
    FILE *f;

    memset(out, 0, sizeof(*out));
    out->memory.bytes = UINT64_MAX;
    out->hugetlb.bytes = UINT64_MAX;
    if (hugepage_size)
        hugepage_name(hugepage_size, hpname, sizeof(hpname));
    snprintf(path, sizeof(path), "%s/proc/self/cgroup", test_root());
    f = fopen(path, "re");
    if (!f)
        return;
    /* hierarchy-id:controllers:path; v2 is "0::path" */
    while (fgets(line, sizeof(line), f)) {
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        struct cg_mount m;
        bool v2;

        if (!c2)
            continue;
        line[strcspn(line, "\n")] = '\0';
        *c1 = '\0';
        *c2 = '\0';
        v2 = strcmp(line, "0") == 0 && c1[1] == '\0';
        if (!v2 && !list_has(c1 + 1, "memory") && !list_has(c1 + 1, "hugetlb"))
            continue; /* no limit of ours in that hierarchy */
        if (c2[1] != '/' || !find_mount(v2 ? NULL : c1 + 1, &m))
            continue;
        walk(&m, c2 + 1, v2, hpname, out);
        if (v2)
            out->hugetlb_in_memory = m.hugetlb_accounting;
    }
    fclose(f);
}

uint64_t fs_hugepage_size(void)
{
    char line[256];
    FILE *f = fopen("/proc/meminfo", "re");
    uint64_t kb = 0;

    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "Hugepagesize: %" SCNu64 " kB", &kb) == 1)
            break;
    fclose(f);
    return kb << 10;
}
