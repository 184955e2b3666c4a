/* SPDX-License-Identifier: MIT */
/*
 * main.c - the shardfs daemon: options, setup and lifetime.
 *
 *   shardfs [options] BACKEND_DIR MOUNTPOINT
 *
 * The daemon creates the CacheBuffer, opens the backend below it, serves the
 * rank attach socket, mounts the tree of ops.c and runs the multi-threaded
 * FUSE loop until it is unmounted (fusermount3 -u, umount) or told to stop
 * (SIGTERM, SIGINT, SIGHUP). Then it unmounts, waits for loads in flight,
 * removes the socket and exits 0.
 *
 * Key idea: everything that can fail is checked before the parent returns.
 * Without -f the process forks first and the parent waits on a pipe until the
 * child has mounted (status 0) or failed (status 1, its one-line reason
 * already on stderr): `shardfs ... && use-it` is safe, and the threads of the
 * cache and the backend are only ever started in the process that keeps them.
 */
#include "fs_i.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <syslog.h>
#include <unistd.h>

#ifndef SHARDFS_VERSION
#define SHARDFS_VERSION "0.1.0"
#endif

#define SOCKET_DIR          "/run/shardfs"
#define DEFAULT_SHARD_SIZE  (256ull << 10)
#define DEFAULT_CAPACITY    (1ull << 30)
#define DEFAULT_WAIT_S      30
#define DEFAULT_MAX_READ    (1u << 20)
#define DEFAULT_MAX_THREADS 64
#define DEFAULT_MAX_IDLE_THREADS 16
#define DEFAULT_READAHEAD   4
#define MAX_READAHEAD       1024
#define REAP_INTERVAL_NS    (200 * 1000 * 1000ll)
#define STOP_GRACE_NS       (2 * 1000 * 1000 * 1000ll) /* loads in flight get this to finish */
#define SFS_ATTACH_UIDS_MAX 64                         /* uids in -o attach_uids */

/* What the command line says. Strings are owned by fuse_opt (free them). */
struct options {
    char *shard_size;
    char *capacity;
    char *dir_prefix;
    char *socket;
    char *hugepages;
    char *reserved;
    char *wait_timeout;
    char *readahead;
    char *numa_node;
    char *attach_uids; /* U1:U2:...: more uids that may attach */
    char *attach_gid;  /* a group whose members may attach */
    char *backend;     /* the first non-option argument */
    unsigned max_read;
    bool max_read_set;
    bool ro;
    bool perms_on;  /* -o default_permissions given (it is the default anyway) */
    bool perms_off; /* -o no_default_permissions: the kernel checks no modes */
    int nonopts;
    int bad; /* a one-line error was printed */
};

enum {
    KEY_RO,
    KEY_MAX_READ,
    KEY_PERMS_ON,
    KEY_PERMS_OFF,
    KEY_HELP,
    KEY_VERSION,
};

#define OPT(t, f)                                                                                  \
    {                                                                                              \
        t, offsetof(struct options, f), 0                                                          \
    }
static const struct fuse_opt opt_table[] = {
    OPT("shard_size=%s", shard_size),        OPT("capacity=%s", capacity),
    OPT("dir_prefix=%s", dir_prefix),        OPT("socket=%s", socket),
    OPT("hugepages=%s", hugepages),          OPT("reserved=%s", reserved),
    OPT("wait_timeout=%s", wait_timeout),    OPT("readahead=%s", readahead),
    OPT("numa_node=%s", numa_node),          OPT("attach_uids=%s", attach_uids),
    OPT("attach_gid=%s", attach_gid),        FUSE_OPT_KEY("ro", KEY_RO),
    FUSE_OPT_KEY("max_read=", KEY_MAX_READ), FUSE_OPT_KEY("default_permissions", KEY_PERMS_ON),
    FUSE_OPT_KEY("no_default_permissions", KEY_PERMS_OFF), FUSE_OPT_END,
};
#undef OPT

static void usage(const char *prog)
{
    printf("usage: %s [options] BACKEND_DIR MOUNTPOINT\n"
           "\n"
           "A node-local shared cache of KV-cache shards, as a file system:\n"
           "MOUNTPOINT/block/<32 hex>/shard/<n> is one shard, MOUNTPOINT/stats the counters.\n"
           "BACKEND_DIR is a store in UCM PosixStore layout, or a backend spec\n"
           "(mem:, posix:DIR?k=v, fault:OPTS:SPEC).\n"
           "\n"
           "shardfs options:\n"
           "    -o shard_size=SIZE     bytes per shard (default 256K; K/M/G suffixes)\n"
           "    -o capacity=SIZE       data-plane bytes (default 1G)\n"
           "    -o dir_prefix=N        posix layout: N hex chars of directory (default 0: data/)\n"
           "    -o socket=PATH         rank attach socket (default " SOCKET_DIR
           "/<mountpoint>.sock)\n"
           "    -o hugepages=auto|on|off  data plane on huge pages (default auto)\n"
           "    -o reserved=N          slots only loads and prewarming may take (default 1/64)\n"
           "    -o wait_timeout=SECS   deadline of a waiting read (default %d)\n"
           "    -o max_read=N          bytes per read request (default 1M)\n"
           "    -o readahead=N         shards of a block loaded ahead of a missed read\n"
           "                           (default %d, 0: off)\n"
           "    -o numa_node=N         bind the data plane to NUMA node N (default: none)\n"
           "    -o attach_uids=U1:U2   more uids that may attach to the socket (default: none;\n"
           "                           root and the daemon's uid always may)\n"
           "    -o attach_gid=GID      members of group GID may attach to the socket\n"
           "    -o ro                  read-only: every change is EROFS\n"
           "    -o no_default_permissions  the kernel does not check modes and owners\n"
           "                           (default: it does; see shardfs(8), PERMISSIONS)\n"
           "\n",
           prog, DEFAULT_WAIT_S, DEFAULT_READAHEAD);
}

static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs)
{
    struct options *o = data;

    switch (key) {
    case FUSE_OPT_KEY_NONOPT:
        if (o->nonopts++ == 0) {
            o->backend = strdup(arg);
            return 0; /* ours; the mount point goes on to fuse_parse_cmdline */
        }
        if (o->nonopts > 2) {
            fprintf(stderr, "shardfs: too many arguments: '%s' (see --help)\n", arg);
            o->bad = 1;
            return -1;
        }
        return 1;
    case KEY_RO:
        o->ro = true;
        return 1; /* also a mount option */
    case KEY_PERMS_ON:
        o->perms_on = true;
        return 1; /* a mount option: the kernel enforces it */
    case KEY_PERMS_OFF:
        o->perms_off = true;
        return 0; /* ours only: it keeps default_permissions off the mount */
    case KEY_MAX_READ: {
        char *end;
        unsigned long v;

        errno = 0;
        v = strtoul(arg + strlen("max_read="), &end, 10);
        if (errno || *end || end == arg + strlen("max_read=") || v < 4096 || v > (1u << 20)) {
            fprintf(stderr, "shardfs: max_read=%s: out of range (4096..1048576)\n",
                    arg + strlen("max_read="));
            o->bad = 1;
            return -1;
        }
        o->max_read = (unsigned)v;
        o->max_read_set = true;
        return 1; /* the kernel needs it as a mount option too */
    }
    default:
        return 1;
    }
}

/* "256K", "1G", "4096": a byte count with an optional K/M/G/T suffix (powers
 * of 1024; "KiB", "KB" and lowercase accepted). */
static bool parse_size(const char *s, uint64_t *out)
{
    uint64_t v = 0, mul = 1;
    const char *p = s;

    if (!isdigit((unsigned char)*p))
        return false;
    for (; isdigit((unsigned char)*p); p++) {
        if (v > (UINT64_MAX - 9) / 10)
            return false;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    switch (toupper((unsigned char)*p)) {
    case '\0':
        break;
    case 'K':
        mul = 1ull << 10;
        break;
    case 'M':
        mul = 1ull << 20;
        break;
    case 'G':
        mul = 1ull << 30;
        break;
    case 'T':
        mul = 1ull << 40;
        break;
    default:
        return false;
    }
    if (*p) {
        p++;
        if (*p == 'i')
            p++;
        if (*p == 'B' || *p == 'b')
            p++;
        if (*p)
            return false;
    }
    if (v > UINT64_MAX / mul)
        return false;
    *out = v * mul;
    return true;
}

static bool parse_uint(const char *s, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;

    if (!*s)
        return false;
    for (; *s; s++) {
        if (!isdigit((unsigned char)*s) || v > (max - (uint64_t)(*s - '0')) / 10)
            return false;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return true;
}

/* The validated configuration. */
struct config {
    struct sfs_cache_config cache;
    unsigned dir_prefix;
    int64_t wait_ns;
    uint32_t readahead;
    char socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
    bool default_socket;
    /* Who may attach besides root and our uid (-o attach_uids, attach_gid). */
    uint32_t attach_uids[SFS_ATTACH_UIDS_MAX];
    struct sfs_serve_opts serve;
    /* hugepages=auto turned into on: ordinary memory for the data plane
     * would be above this cgroup memory limit. */
    bool no_fallback;
    struct fs_limit memory_limit;
};

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "shardfs: " __VA_ARGS__);                                                  \
        fputc('\n', stderr);                                                                       \
        return -1;                                                                                 \
    } while (0)

/* <SOCKET_DIR>/<mount point with '/' as '-', odd bytes as '_'>.sock, hashed
 * when too long for sun_path. */
static int default_socket(const char *mnt, char *out, size_t outlen)
{
    char name[256];
    size_t n = 0;

    for (const char *p = mnt; *p && n < sizeof(name) - 1; p++) {
        unsigned char ch = (unsigned char)*p;

        if (ch == '/') {
            if (n == 0 || name[n - 1] == '-')
                continue;
            name[n++] = '-';
        } else {
            name[n++] = (isalnum(ch) || ch == '.' || ch == '_') ? (char)ch : '_';
        }
    }
    while (n && name[n - 1] == '-')
        n--;
    name[n] = '\0';
    if (n == 0)
        snprintf(name, sizeof(name), "root");
    if (strlen(SOCKET_DIR) + 1 + strlen(name) + 5 >= outlen) {
        uint64_t h = 0xcbf29ce484222325ull;

        for (const char *p = mnt; *p; p++)
            h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
        snprintf(name + 40, sizeof(name) - 40, "-%016" PRIx64, h);
    }
    snprintf(out, outlen, "%s/%s.sock", SOCKET_DIR, name);
    return 0;
}

/*
 * The data plane is prefaulted: a capacity above what this process's cgroups
 * let it have is an OOM kill, not an error, so refuse it here. Ordinary
 * memfds (hugepages=off, and the fallback of auto) are charged to the memory
 * limit; huge pages to the hugetlb limit of their size instead (and to the
 * memory limit too on a cgroup2 mount with memory_hugetlb_accounting). So:
 * off checks memory, on checks hugetlb, and auto, when only huge pages fit,
 * becomes on: better no mount than a fallback into the OOM killer.
 */
static int check_cgroup(const char *capacity, struct config *cfg)
{
    struct fs_cgroup_limits lim;
    uint64_t cap = cfg->cache.capacity;
    int hp = cfg->cache.hugepages;

    fs_cgroup_limits(hp == SFS_HUGEPAGES_OFF ? 0 : fs_hugepage_size(), &lim);
    if (hp == SFS_HUGEPAGES_ON) {
        if (cap > lim.hugetlb.bytes)
            FAIL("capacity=%s: above the huge page limit of this process's cgroup (%" PRIu64
                 " bytes, %s)",
                 capacity, lim.hugetlb.bytes, lim.hugetlb.where);
        if (lim.hugetlb_in_memory && cap > lim.memory.bytes)
            goto refuse;
        return 0;
    }
    if (cap <= lim.memory.bytes)
        return 0;
    if (hp == SFS_HUGEPAGES_OFF || lim.hugetlb_in_memory || cap > lim.hugetlb.bytes)
        goto refuse;
    /* auto, and only huge pages can hold it: no fallback. */
    cfg->cache.hugepages = SFS_HUGEPAGES_ON;
    cfg->no_fallback = true;
    cfg->memory_limit = lim.memory;
    return 0;
refuse:
    FAIL("capacity=%s: above the memory limit of this process's cgroup (%" PRIu64 " bytes, %s)",
         capacity, lim.memory.bytes, lim.memory.where);
}

static int validate(const struct options *o, const char *mnt, struct config *cfg)
{
    uint64_t v;

    memset(cfg, 0, sizeof(*cfg));
    cfg->cache.shard_size = DEFAULT_SHARD_SIZE;
    cfg->cache.capacity = DEFAULT_CAPACITY;
    cfg->cache.hugepages = SFS_HUGEPAGES_AUTO;
    cfg->cache.numa_node = -1;
    /* First touch of the data plane dominates start-up: pay it once, here,
     * not in every rank and not in the first reads (BENCHMARKS.md). */
    cfg->cache.populate = true;
    cfg->wait_ns = DEFAULT_WAIT_S * 1000000000ll;
    cfg->readahead = DEFAULT_READAHEAD;

    if (o->shard_size) {
        if (!parse_size(o->shard_size, &v))
            FAIL("shard_size=%s: not a size (a number with an optional K, M or G suffix)",
                 o->shard_size);
        if (v < 512 || v > (1ull << 30))
            FAIL("shard_size=%s: out of range (512 bytes to 1G)", o->shard_size);
        cfg->cache.shard_size = v;
    }
    if (o->capacity) {
        if (!parse_size(o->capacity, &v))
            FAIL("capacity=%s: not a size (a number with an optional K, M or G suffix)",
                 o->capacity);
        cfg->cache.capacity = v;
    }
    if (cfg->cache.capacity < cfg->cache.shard_size)
        FAIL("capacity=%s: smaller than one shard (shard_size=%" PRIu64 ")",
             o->capacity ? o->capacity : "1G", cfg->cache.shard_size);
    if (cfg->cache.capacity / cfg->cache.shard_size >= (1u << 30))
        FAIL("capacity=%s: too many slots for shard_size=%" PRIu64 " (at most 2^30)",
             o->capacity ? o->capacity : "1G", cfg->cache.shard_size);
    {
        /* The data plane is prefaulted at create (populate): more than the
         * machine has would wake the OOM killer, not give an error. */
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

        if (pages > 0 && psz > 0 && cfg->cache.capacity > (uint64_t)pages * (uint64_t)psz)
            FAIL("capacity=%s: larger than this machine's memory (%" PRIu64 " bytes)",
                 o->capacity ? o->capacity : "1G", (uint64_t)pages * (uint64_t)psz);
    }
    if (o->dir_prefix) {
        if (!parse_uint(o->dir_prefix, 32, &v))
            FAIL("dir_prefix=%s: out of range (0..32)", o->dir_prefix);
        cfg->dir_prefix = (unsigned)v;
    }
    if (o->hugepages) {
        if (strcmp(o->hugepages, "auto") == 0)
            cfg->cache.hugepages = SFS_HUGEPAGES_AUTO;
        else if (strcmp(o->hugepages, "on") == 0)
            cfg->cache.hugepages = SFS_HUGEPAGES_ON;
        else if (strcmp(o->hugepages, "off") == 0)
            cfg->cache.hugepages = SFS_HUGEPAGES_OFF;
        else
            FAIL("hugepages=%s: must be auto, on or off", o->hugepages);
    }
    if (check_cgroup(o->capacity ? o->capacity : "1G", cfg) < 0)
        return -1;
    if (o->reserved) {
        uint64_t nslots = cfg->cache.capacity / cfg->cache.shard_size;

        if (!parse_uint(o->reserved, UINT32_MAX, &v) || v >= nslots)
            FAIL("reserved=%s: out of range (0..%" PRIu64 ", fewer than the %" PRIu64 " slots)",
                 o->reserved, nslots ? nslots - 1 : 0, nslots);
        cfg->cache.nreserved = (uint32_t)v;
        cfg->cache.no_reserved = v == 0;
    }
    if (o->wait_timeout) {
        if (!parse_uint(o->wait_timeout, 86400, &v) || v == 0)
            FAIL("wait_timeout=%s: out of range (1..86400 seconds)", o->wait_timeout);
        cfg->wait_ns = (int64_t)v * 1000000000ll;
    }
    if (o->readahead) {
        if (!parse_uint(o->readahead, MAX_READAHEAD, &v))
            FAIL("readahead=%s: out of range (0..%d shards)", o->readahead, MAX_READAHEAD);
        cfg->readahead = (uint32_t)v;
    }
    if (o->numa_node) {
        if (!parse_uint(o->numa_node, 1023, &v))
            FAIL("numa_node=%s: out of range (0..1023)", o->numa_node);
        cfg->cache.numa_node = (int)v;
        cfg->cache.numa_bind = true;
    }
    if (o->socket) {
        if (!o->socket[0])
            FAIL("socket=: empty path");
        if (strlen(o->socket) >= sizeof(cfg->socket))
            FAIL("socket=%s: path too long (at most %zu bytes)", o->socket,
                 sizeof(cfg->socket) - 1);
        snprintf(cfg->socket, sizeof(cfg->socket), "%s", o->socket);
    } else {
        default_socket(mnt, cfg->socket, sizeof(cfg->socket));
        cfg->default_socket = true;
    }
    cfg->serve.gid = -1;
    cfg->serve.uids = cfg->attach_uids;
    if (o->attach_uids) {
        const char *p = o->attach_uids;

        for (;;) {
            char num[16];
            size_t n = strcspn(p, ":");

            if (cfg->serve.nuids == SFS_ATTACH_UIDS_MAX)
                FAIL("attach_uids=%s: more than %d uids", o->attach_uids, SFS_ATTACH_UIDS_MAX);
            if (n == 0 || n >= sizeof(num))
                FAIL("attach_uids=%s: not a list of uids (U1:U2:...)", o->attach_uids);
            memcpy(num, p, n);
            num[n] = '\0';
            if (!parse_uint(num, UINT32_MAX - 1, &v))
                FAIL("attach_uids=%s: '%s' is not a uid", o->attach_uids, num);
            cfg->attach_uids[cfg->serve.nuids++] = (uint32_t)v;
            if (!p[n])
                break;
            p += n + 1;
        }
    }
    if (o->attach_gid) {
        if (!parse_uint(o->attach_gid, UINT32_MAX - 1, &v))
            FAIL("attach_gid=%s: not a group id", o->attach_gid);
        cfg->serve.gid = (int64_t)v;
    }
    return 0;
}

/* A backend spec names a scheme ("mem:", "fault:...", "posix:..."); anything
 * else is a directory, checked here so the error names it. */
static int check_backend(const char *spec)
{
    struct stat st;

    if (strncmp(spec, "mem", 3) == 0 && (spec[3] == '\0' || spec[3] == ':'))
        return 0;
    if (strncmp(spec, "fault:", 6) == 0 || strncmp(spec, "posix:", 6) == 0)
        return 0; /* sfs_backend_open reports what is wrong */
    if (stat(spec, &st) < 0)
        FAIL("BACKEND_DIR %s: %s", spec, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        FAIL("BACKEND_DIR %s: not a directory", spec);
    return 0;
}

/* The directory a backend spec stores in: a plain path, posix:DIR?opts, or
 * the inner spec of fault:OPTS:INNER; NULL for mem: (nothing on disk).
 * Returns a malloc'd path or NULL. */
static char *backend_dir(const char *spec)
{
    if (strncmp(spec, "mem", 3) == 0 && (spec[3] == '\0' || spec[3] == ':'))
        return NULL;
    if (strncmp(spec, "fault:", 6) == 0) {
        const char *inner = strchr(spec + 6, ':');

        return inner ? backend_dir(inner + 1) : NULL;
    }
    if (strncmp(spec, "posix:", 6) == 0) {
        const char *q = strchr(spec + 6, '?');

        return strndup(spec + 6, q ? (size_t)(q - spec - 6) : strlen(spec + 6));
    }
    return strdup(spec);
}

/* Every inode shows the backend directory's owner, group and permission
 * bits, so that with default_permissions the mount grants exactly what the
 * store's own directory does (chgrp + chmod g+w BACKEND_DIR gives a group
 * write access). Read once, at start. A store with no directory (mem:): the
 * daemon's user, 0755. */
static void inode_owner(const char *spec, struct fs *fs)
{
    char *dir = backend_dir(spec);
    struct stat st;

    fs->uid = geteuid();
    fs->gid = getegid();
    fs->perm = 0755;
    if (dir && stat(dir, &st) == 0) {
        fs->uid = st.st_uid;
        fs->gid = st.st_gid;
        fs->perm = st.st_mode & 0777;
    }
    free(dir);
}

/* The kernel lets a mount stack on another; an operator almost never means
 * that, so a mount point that already is one is "busy". */
static int check_mountpoint(const char *mnt)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    char line[4096];
    struct stat st;
    int busy = 0;

    if (stat(mnt, &st) < 0)
        FAIL("MOUNTPOINT %s: %s", mnt, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        FAIL("MOUNTPOINT %s: not a directory", mnt);
    if (!f)
        return 0;
    while (!busy && fgets(line, sizeof(line), f)) {
        char *save = NULL, *tok = strtok_r(line, " ", &save);

        for (int i = 1; tok && i < 5; i++)
            tok = strtok_r(NULL, " ", &save);
        if (tok) {
            fs_unescape(tok);
            busy = strcmp(tok, mnt) == 0;
        }
    }
    fclose(f);
    if (busy)
        FAIL("MOUNTPOINT %s: busy (already a mount point; unmount it first)", mnt);
    return 0;
}

/* The socket path is replaced at start (a stale socket of a dead daemon is
 * unlinked), so it must name nothing or a socket: anything else (a regular
 * file, a symlink, a directory) is the operator's, refused here. A socket
 * someone answers on belongs to a live daemon: refuse to steal it. */
static int check_socket(const char *path, bool default_dir)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct stat st;
    int fd, r;

    if (default_dir && mkdir(SOCKET_DIR, 0755) < 0 && errno != EEXIST)
        FAIL("socket: cannot create %s: %s (use -o socket=PATH)", SOCKET_DIR, strerror(errno));
    if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode))
        FAIL("socket=%s: exists and is not a socket (refusing to replace it)", path);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    close(fd);
    if (r == 0)
        FAIL("socket=%s: in use by another daemon", path);
    return 0;
}

/* ---------------------------------------------------------------------------
 * The reaper, daemonizing.
 */

static void touch_hook(const struct sfs_block_id *blocks, size_t n, void *arg)
{
    sfs_backend_touch(arg, blocks, n);
}

struct reaper {
    struct sfs_cache *cache;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* CLOCK_MONOTONIC */
    bool stop;           /* lock */
};

/* Every ~200 ms, finishes any reap the attach server started and could not
 * finish (the server reaps a rank as soon as its connection closes). */
static void *reaper_main(void *arg)
{
    struct reaper *r = arg;

    pthread_mutex_lock(&r->lock);
    while (!r->stop) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += REAP_INTERVAL_NS;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&r->cond, &r->lock, &ts);
        if (r->stop)
            break;
        pthread_mutex_unlock(&r->lock);
        sfs_cache_reap(r->cache);
        pthread_mutex_lock(&r->lock);
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

static int reaper_start(struct reaper *r, struct sfs_cache *c)
{
    pthread_condattr_t ca;
    int e;

    r->cache = c;
    r->stop = false;
    pthread_mutex_init(&r->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cond, &ca);
    pthread_condattr_destroy(&ca);
    e = pthread_create(&r->thread, NULL, reaper_main, r);
    if (e) {
        pthread_cond_destroy(&r->cond);
        pthread_mutex_destroy(&r->lock);
    }
    return -e;
}

static void reaper_stop(struct reaper *r)
{
    pthread_mutex_lock(&r->lock);
    r->stop = true;
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->lock);
    pthread_join(r->thread, NULL);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
}

/*
 * The session loop runs in a thread of its own, so that a stop never waits
 * on a handler stuck in the backend: libfuse's loop joins every worker
 * before it returns, and a worker inside a handler cannot be cancelled.
 * Only this thread takes the stop signals (libfuse's handler ends the
 * session; its workers block them, and so does every other thread here), so
 * the signal interrupts the loop's own wait.
 */
struct session_loop {
    struct fuse_session *se;
    bool single;
    unsigned clone_fd, max_idle_threads, max_threads;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;   /* CLOCK_MONOTONIC: done was set */
    bool done;             /* lock */
    int err;               /* lock: what the loop returned */
    int64_t grace_left_ns; /* set by loop_wait(): the stop grace not yet spent */
};

static void *loop_main(void *arg)
{
    struct session_loop *l = arg;
    struct fuse_loop_config *lc;
    sigset_t stopsigs;
    int err;

    sigemptyset(&stopsigs);
    sigaddset(&stopsigs, SIGINT);
    sigaddset(&stopsigs, SIGTERM);
    sigaddset(&stopsigs, SIGHUP);
    sigaddset(&stopsigs, SIGQUIT);
    pthread_sigmask(SIG_UNBLOCK, &stopsigs, NULL);
    if (l->single) {
        err = fuse_session_loop(l->se);
    } else {
        lc = fuse_loop_cfg_create();
        if (!lc) {
            err = -ENOMEM;
        } else {
            fuse_loop_cfg_set_clone_fd(lc, l->clone_fd);
            if (l->max_idle_threads != UINT_MAX)
                fuse_loop_cfg_set_idle_threads(lc, l->max_idle_threads);
            fuse_loop_cfg_set_max_threads(lc, l->max_threads);
            err = fuse_session_loop_mt(l->se, lc);
            fuse_loop_cfg_destroy(lc);
        }
    }
    pthread_sigmask(SIG_BLOCK, &stopsigs, NULL);
    pthread_mutex_lock(&l->lock);
    l->err = err;
    l->done = true;
    pthread_cond_signal(&l->cond);
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

static int loop_start(struct session_loop *l)
{
    pthread_condattr_t ca;
    int e;

    l->done = false;
    l->err = 0;
    pthread_mutex_init(&l->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cond, &ca);
    pthread_condattr_destroy(&ca);
    e = pthread_create(&l->thread, NULL, loop_main, l);
    if (e) {
        pthread_cond_destroy(&l->cond);
        pthread_mutex_destroy(&l->lock);
    }
    return -e;
}

/* Wait for the loop to end. Once the session has exited (a signal, an
 * unmount), wait at most grace_ns more for libfuse to join its workers.
 * True: the loop returned and was joined (l->err, l->grace_left_ns are
 * set). False: a handler is still running after the grace; the loop thread
 * is left as it is. Bound: wakes every 100 ms to look at the session. */
static bool loop_wait(struct session_loop *l, int64_t grace_ns)
{
    int64_t stop_at = 0; /* when the session was seen to exit, + grace */
    bool done;

    pthread_mutex_lock(&l->lock);
    while (!l->done) {
        int64_t now = sfs_now_ns(), until = now + 100 * 1000000ll;
        struct timespec ts;

        if (!stop_at && fuse_session_exited(l->se))
            stop_at = now + grace_ns;
        if (stop_at && now >= stop_at)
            break;
        if (stop_at && until > stop_at)
            until = stop_at;
        ts.tv_sec = until / 1000000000;
        ts.tv_nsec = until % 1000000000;
        pthread_cond_timedwait(&l->cond, &l->lock, &ts);
    }
    done = l->done;
    pthread_mutex_unlock(&l->lock);
    if (!done)
        return false;
    pthread_join(l->thread, NULL);
    pthread_cond_destroy(&l->cond);
    pthread_mutex_destroy(&l->lock);
    if (!stop_at) /* unmounted: the loop ended before we looked */
        stop_at = sfs_now_ns() + grace_ns;
    l->grace_left_ns = stop_at > sfs_now_ns() ? stop_at - sfs_now_ns() : 0;
    return true;
}

/* Fork; the parent waits for the child's verdict and exits with it. Returns
 * the write end of the pipe in the child. */
static int daemonize_start(void)
{
    int p[2];
    pid_t pid;
    char status = 1;

    if (pipe2(p, O_CLOEXEC) < 0) {
        fprintf(stderr, "shardfs: pipe: %s\n", strerror(errno));
        exit(1);
    }
    pid = fork();
    if (pid < 0) {
        fprintf(stderr, "shardfs: fork: %s\n", strerror(errno));
        exit(1);
    }
    if (pid > 0) {
        close(p[1]);
        if (read(p[0], &status, 1) != 1)
            status = 1; /* the child died before it was ready */
        _exit(status);
    }
    close(p[0]);
    setsid();
    return p[1];
}

/* The child is mounted and serving: detach from the terminal, release the
 * parent with status 0. */
static void daemonize_done(int fd)
{
    char ok = 0;
    int nul = open("/dev/null", O_RDWR | O_CLOEXEC);

    if (chdir("/") < 0) {
        /* harmless: nothing here uses relative paths any more */
    }
    if (nul >= 0) {
        dup2(nul, 0);
        dup2(nul, 1);
        dup2(nul, 2);
        if (nul > 2)
            close(nul);
    }
    fs_log_to_syslog();
    if (write(fd, &ok, 1) != 1) {
        /* the parent is gone: nobody to tell */
    }
    close(fd);
}

/* ---------------------------------------------------------------------------
 * main
 */

int main(int argc, char *argv[])
{
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    struct fuse_cmdline_opts co;
    struct options o;
    struct config cfg;
    /* Static: a backend may still complete an abandoned load while the
     * process exits (fs_loads_stop). */
    static struct fs fs;
    struct sfs_backend_params bp;
    struct fuse_session *se;
    struct session_loop loop;
    struct reaper reaper;
    sigset_t stopsigs;
    char errbuf[256] = "";
    int ret = 1, err = 0, ready_fd = -1;
    unsigned abandoned = 0;

    memset(&o, 0, sizeof(o));
    memset(&co, 0, sizeof(co));
    memset(&fs, 0, sizeof(fs));
    o.max_read = DEFAULT_MAX_READ;
    if (fuse_opt_parse(&args, &o, opt_table, opt_proc) != 0) {
        if (!o.bad)
            fprintf(stderr, "shardfs: bad options (see --help)\n");
        goto out_args;
    }
    if (fuse_parse_cmdline(&args, &co) != 0)
        goto out_args; /* libfuse printed the reason */
    if (co.show_help) {
        usage(argv[0]);
        printf("FUSE options:\n");
        fuse_cmdline_help();
        fuse_lowlevel_help();
        ret = 0;
        goto out_args;
    }
    if (co.show_version) {
        printf("shardfs version %s\n", SHARDFS_VERSION);
        fuse_lowlevel_version();
        ret = 0;
        goto out_args;
    }
    if (!o.backend || !co.mountpoint) {
        fprintf(stderr, "shardfs: missing %s (usage: %s [options] BACKEND_DIR MOUNTPOINT)\n",
                o.backend ? "MOUNTPOINT" : "BACKEND_DIR", argv[0]);
        goto out_args;
    }
    if (validate(&o, co.mountpoint, &cfg) < 0 || check_backend(o.backend) < 0 ||
        check_mountpoint(co.mountpoint) < 0 || check_socket(cfg.socket, cfg.default_socket) < 0)
        goto out_args;
    if (o.perms_on && o.perms_off) {
        fprintf(stderr, "shardfs: default_permissions and no_default_permissions: pick one\n");
        goto out_args;
    }
    /* The kernel checks modes and owners (fill_attr's) before any request
     * reaches us: with allow_other, other users get what the modes say. */
    if (!o.perms_on && !o.perms_off && fuse_opt_add_arg(&args, "-odefault_permissions") != 0)
        goto out_args;
    if (!o.max_read_set) {
        char mr[32];

        snprintf(mr, sizeof(mr), "-omax_read=%u", o.max_read);
        if (fuse_opt_add_arg(&args, mr) != 0)
            goto out_args;
    }

    if (!co.foreground)
        ready_fd = daemonize_start();
    /* Threads started from here on (backend, socket server, reaper) must not
     * take the stop signals: the FUSE loop's threads do. */
    sigemptyset(&stopsigs);
    sigaddset(&stopsigs, SIGINT);
    sigaddset(&stopsigs, SIGTERM);
    sigaddset(&stopsigs, SIGHUP);
    sigaddset(&stopsigs, SIGQUIT);
    pthread_sigmask(SIG_BLOCK, &stopsigs, NULL);
    sfs_set_log(fs_log_msg, NULL, co.debug ? LOG_DEBUG : LOG_WARNING);
    openlog("shardfs", LOG_PID, LOG_DAEMON);

    fs.shard_size = cfg.cache.shard_size;
    fs.max_read = o.max_read;
    fs.ro = o.ro;
    fs.wait_ns = cfg.wait_ns;
    fs.readahead = cfg.readahead;
    fs.nslots = (uint32_t)(cfg.cache.capacity / cfg.cache.shard_size); /* < 2^30 (validate) */
    inode_owner(o.backend, &fs);
    snprintf(fs.socket_path, sizeof(fs.socket_path), "%s", cfg.socket);
    clock_gettime(CLOCK_REALTIME, &fs.start);
    if (fs_table_init(&fs) < 0) {
        fprintf(stderr, "shardfs: out of memory\n");
        goto out_args;
    }

    memset(&bp, 0, sizeof(bp));
    bp.shard_size = cfg.cache.shard_size;
    bp.dir_prefix = cfg.dir_prefix;
    bp.read_only = o.ro;
    fs.be = sfs_backend_open(o.backend, &bp, errbuf, sizeof(errbuf), &err);
    if (!fs.be) {
        fprintf(stderr, "shardfs: BACKEND_DIR %s: %s\n", o.backend,
                errbuf[0] ? errbuf : strerror(-err));
        goto out_table;
    }
    if (cfg.no_fallback) /* its one line says it all: the data plane's own is noise */
        sfs_set_log(fs_log_msg, NULL, co.debug ? LOG_DEBUG : LOG_CRIT);
    fs.cache = sfs_cache_create(&cfg.cache, &err);
    sfs_set_log(fs_log_msg, NULL, co.debug ? LOG_DEBUG : LOG_WARNING);
    if (!fs.cache && cfg.no_fallback) {
        fprintf(stderr,
                "shardfs: capacity=%s: no huge pages for the data plane (%s), and ordinary "
                "memory is above the memory limit of this process's cgroup (%" PRIu64
                " bytes, %s)\n",
                o.capacity ? o.capacity : "1G", strerror(-err), cfg.memory_limit.bytes,
                cfg.memory_limit.where);
        goto out_backend;
    }
    if (!fs.cache) {
        fprintf(stderr,
                "shardfs: cannot create the cache (capacity=%" PRIu64 " shard_size=%" PRIu64
                " hugepages=%s): %s\n",
                cfg.cache.capacity, cfg.cache.shard_size, o.hugepages ? o.hugepages : "auto",
                strerror(-err));
        goto out_backend;
    }
    sfs_cache_set_touch_hook(fs.cache, touch_hook, fs.be);
    err = sfs_cache_serve_opts(fs.cache, cfg.socket, &cfg.serve);
    if (err < 0) {
        fprintf(stderr, "shardfs: socket=%s: %s\n", cfg.socket, strerror(-err));
        goto out_cache;
    }

    se = fuse_session_new(&args, &fs_ops, sizeof(fs_ops), &fs);
    if (!se)
        goto out_cache; /* libfuse printed the reason */
    fs.se = se;
    if (fuse_set_signal_handlers(se) != 0) {
        fprintf(stderr, "shardfs: cannot set signal handlers\n");
        goto out_session;
    }
    if (fuse_session_mount(se, co.mountpoint) != 0) {
        fprintf(stderr, "shardfs: MOUNTPOINT %s: mount failed\n", co.mountpoint);
        goto out_signals;
    }
    err = reaper_start(&reaper, fs.cache);
    if (err < 0) {
        fprintf(stderr, "shardfs: reaper thread: %s\n", strerror(-err));
        goto out_unmount;
    }
    err = fs_waitq_start(&fs);
    if (err < 0) {
        fprintf(stderr, "shardfs: settler thread: %s\n", strerror(-err));
        reaper_stop(&reaper);
        goto out_unmount;
    }
    if (ready_fd >= 0) {
        daemonize_done(ready_fd);
        ready_fd = -1;
    }

    loop.se = se;
    loop.single = co.singlethread;
    loop.clone_fd = (unsigned)co.clone_fd;
    /* Idle workers beyond this many end (libfuse keeps every one by
     * default): a burst of requests does not leave 64 threads behind. */
    loop.max_idle_threads =
        co.max_idle_threads != UINT_MAX ? co.max_idle_threads : DEFAULT_MAX_IDLE_THREADS;
    /* Readers waiting for a load hold no worker (wait.c), but stores and
     * a few other requests wait in theirs: allow more than libfuse's 10. */
    loop.max_threads = co.max_threads && co.max_threads != 10 && co.max_threads <= 100000
                           ? co.max_threads
                           : DEFAULT_MAX_THREADS;
    err = loop_start(&loop);
    if (err < 0) {
        fprintf(stderr, "shardfs: session thread: %s\n", strerror(-err));
        fs_waitq_stop(&fs);
        reaper_stop(&reaper);
        goto out_unmount;
    }
    if (!loop_wait(&loop, STOP_GRACE_NS)) {
        /* A handler is stuck in the backend (a hung store, a dump that
         * does not return) and libfuse would join it forever. Answer what
         * can be answered, unmount, remove the socket, and leave: the exit
         * ends the stuck threads; nothing they did is reported done. */
        unsigned n = fs_loads_stop(&fs, 0);
        char msg[200];

        snprintf(msg, sizeof(msg),
                 "stopping: request handlers still in the backend after %lld s; exiting "
                 "without them (%u backend load%s abandoned)",
                 STOP_GRACE_NS / 1000000000, n, n == 1 ? "" : "s");
        fs_log_msg(LOG_WARNING, msg, NULL);
        /* Detach without closing /dev/fuse under libfuse's threads (the
         * exit closes it); fusermount3 -uz's way when not root. */
        if (umount2(co.mountpoint, MNT_DETACH) < 0)
            fuse_session_unmount(se);
        unlink(cfg.socket);
        /* The stuck threads end with the process, unjoined on purpose:
         * exit_group directly, not _exit (a sanitizer's _exit would report
         * them as leaked threads and change the status). */
        syscall(SYS_exit_group, 0);
        _exit(0);
    }
    err = loop.err;
    /* 0: unmounted; > 0: stopped by that signal; < 0: an error. */
    ret = err < 0 ? 1 : 0;
    if (err < 0)
        fprintf(stderr, "shardfs: session loop: %s\n", strerror(-err));

    /* Loads in flight answer requests from backend threads: let them finish
     * while the session still exists, for what is left of the grace. A
     * backend that is stuck must not keep us (and the mount) alive: what is
     * left is abandoned, its slots failed so that no rank waits on a load
     * that will never come. */
    fs_waitq_stop(&fs); /* parked reads: EIO, the session ended */
    abandoned = fs_loads_stop(&fs, loop.grace_left_ns);
    if (abandoned) {
        char msg[160];

        snprintf(msg, sizeof(msg),
                 "stopping: %u backend load%s still in flight after %lld s abandoned "
                 "(their slots failed with ECANCELED)",
                 abandoned, abandoned == 1 ? "" : "s", STOP_GRACE_NS / 1000000000);
        fs_log_msg(LOG_WARNING, msg, NULL);
    }
    reaper_stop(&reaper);
out_unmount:
    fuse_session_unmount(se);
out_signals:
    fuse_remove_signal_handlers(se);
out_session:
    fuse_session_destroy(se);
out_cache:
    sfs_cache_close(fs.cache); /* stops the socket server, unlinks the socket */
out_backend:
    /* Closing waits for every request: not for those we abandoned. The
     * process exit takes the backend's threads and rings with it. */
    if (!abandoned)
        sfs_backend_close(fs.be);
out_table:
    fs_handles_drop(&fs); /* files still open: before the table they name */
    fs_table_destroy(&fs);
out_args:
    free(o.shard_size);
    free(o.capacity);
    free(o.dir_prefix);
    free(o.socket);
    free(o.attach_uids);
    free(o.attach_gid);
    free(o.hugepages);
    free(o.reserved);
    free(o.wait_timeout);
    free(o.readahead);
    free(o.numa_node);
    free(o.backend);
    free(co.mountpoint);
    fuse_opt_free_args(&args);
    return ret;
}
