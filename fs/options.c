/* SPDX-License-Identifier: MIT */
/*
 * options.c - the daemon's command line: the -o options of shardfs (one
 * fuse_opt table), their parsing and validation into a configuration, and
 * the checks that refuse a start before anything is created.
 *
 * Key idea: every value is checked once, here, at the edge, and every refusal
 * is one line on stderr that names the option and the bound it broke, printed
 * before the parent returns (main.c): a capacity above the machine's memory
 * or the cgroup's limit, a mount point that already is one, a socket path a
 * live daemon answers on. What passes is a struct fs_config the rest of the
 * daemon takes as true. Calls only checks.c (the checks against the system:
 * the store directory, the mount point, the socket) and cgroup.c below it.
 */
#include "fs_i.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
        t, offsetof(struct fs_options, f), 0                                                       \
    }
static const struct fuse_opt opt_table[] = {
    OPT("shard_size=%s", shard_size),
    OPT("capacity=%s", capacity),
    OPT("dir_prefix=%s", dir_prefix),
    OPT("socket=%s", socket),
    OPT("hugepages=%s", hugepages),
    OPT("reserved=%s", reserved),
    OPT("wait_timeout=%s", wait_timeout),
    OPT("readahead=%s", readahead),
    OPT("numa_node=%s", numa_node),
    OPT("warm=%s", warm),
    OPT("partitions=%s", partitions),
    OPT("partition_budget=%s", partition_budget),
    OPT("pin_budget=%s", pin_budget),
    OPT("pin_max=%s", pin_max),
    OPT("pin_user_share=%s", pin_user_share),
    OPT("warm_pin=%s", warm_pin),
    OPT("revalidate=%s", revalidate),
    OPT("attach_uids=%s", attach_uids),
    OPT("attach_gid=%s", attach_gid),
    OPT("page_cache=%s", page_cache),
    OPT("admission=%s", admission),
    OPT("peer_listen=%s", peer_listen),
    OPT("peers=%s", peers),
    OPT("peer_capacity=%s", peer_capacity),
    OPT("peer_ways=%s", peer_ways),
    OPT("peer_slot=%s", peer_slot),
    OPT("peer_key=%s", peer_key),
    OPT("store_capacity=%s", store_capacity),
    OPT("store_high=%s", store_high),
    OPT("store_low=%s", store_low),
    FUSE_OPT_KEY("ro", KEY_RO),
    FUSE_OPT_KEY("max_read=", KEY_MAX_READ),
    FUSE_OPT_KEY("default_permissions", KEY_PERMS_ON),
    FUSE_OPT_KEY("no_default_permissions", KEY_PERMS_OFF),
    FUSE_OPT_END,
};
#undef OPT

void fs_usage(const char *prog)
{
    printf("usage: %s [options] BACKEND_DIR MOUNTPOINT\n"
           "\n"
           "A node-local shared cache of KV-cache shards, as a file system:\n"
           "MOUNTPOINT/block/<32 hex>/shard/<n> is one shard, MOUNTPOINT/stats the counters.\n"
           "BACKEND_DIR is a store in UCM PosixStore layout, or a backend spec\n"
           "(mem:, posix:DIR?k=v, fault:OPTS:SPEC, peer:OPTS:SPEC).\n"
           "\n"
           "shardfs options:\n"
           "    -o shard_size=SIZE     bytes per shard (default " DEFAULT_SHARD_SIZE_TEXT
           "; K/M/G suffixes)\n"
           "    -o capacity=SIZE       data-plane bytes (default " DEFAULT_CAPACITY_TEXT ")\n"
           "    -o dir_prefix=N        posix layout: N hex chars of directory (default 0: data/)\n"
           "    -o socket=PATH         rank attach socket (default " SOCKET_DIR
           "/<mountpoint>.sock)\n"
           "    -o hugepages=auto|on|off  data plane on huge pages (default auto)\n"
           "    -o reserved=N          slots only loads and prewarming may take (default 1/64)\n"
           "    -o wait_timeout=SECS   deadline of a waiting read (default %d)\n"
           "    -o max_read=N          bytes per read request (default 1M)\n"
           "    -o readahead=N         shards of a block loaded ahead of a missed read\n"
           "                           (default %d, 0: off)\n"
           "    -o page_cache=SIZE     the kernel page cache may hold this many bytes of\n"
           "                           resident shards, kept coherent (default 0: off)\n"
           "    -o numa_node=N         bind the data plane to NUMA node N (default: none)\n"
           "    -o warm=PCT            at mount, load the hottest blocks of the usage file up\n"
           "                           to PCT %% of capacity (default %d, 0: off)\n"
           "    -o admission=scan|clock  how a new shard enters the cache: scan (default):\n"
           "                           probationary until its second read, so a scan\n"
           "                           larger than the cache does not flush hot shards;\n"
           "                           or clock: every new shard on equal terms\n"
           "    -o partitions=P        eviction domains: a key's domain is its shard index\n"
           "                           mod P; each has 1/P of the slots (default 1)\n"
           "    -o partition_budget=W0:W1:...  each domain's budget: domain i has Wi/sum\n"
           "                           of the slots (P weights; sets P if partitions is unset)\n"
           "    -o pin_budget=PCT      pins (user.shardfs.pin) may hold PCT %% of the slots\n"
           "                           (default 25, 0: no pins)\n"
           "    -o pin_max=SECONDS     the longest pin (default a year, 366 days)\n"
           "    -o pin_user_share=PCT  one user's pins may hold PCT %% of pin_budget\n"
           "                           (default 100; root's are not bounded by it)\n"
           "    -o warm_pin=SECONDS    pin each block the warm-up loads for SECONDS (within\n"
           "                           pin_budget; default 0: no pin)\n"
           "    -o revalidate=MS       every MS ms, drop resident blocks whose file another\n"
           "                           host replaced or removed (default %d on a network or\n"
           "                           FUSE store, 0: off elsewhere)\n"
           "    -o attach_uids=U1:U2   more uids that may attach to the socket (default: none;\n"
           "                           root and the daemon's uid always may)\n"
           "    -o attach_gid=GID      members of group GID may attach to the socket\n"
           "    -o peer_listen=ADDR:PORT  serve a peer-tier slot region there and read other\n"
           "                           hosts' (enables the peer tier; see shardfs(8))\n"
           "    -o peers=FILE          peer members, one host:port a line\n"
           "    -o peer_capacity=SIZE  slot region bytes (default 1G)\n"
           "    -o peer_ways=N         ways per bucket (default 4)\n"
           "    -o peer_slot=SIZE      max payload of a slot (default the shard size)\n"
           "    -o peer_key=FILE       the members' shared key (mode 0600, root's; required\n"
           "                           with peer_listen)\n"
           "    -o store_capacity=SIZE keep the store's block files within SIZE bytes: past\n"
           "                           store_high %% of it, remove the coldest blocks down\n"
           "                           to store_low %% (default 0: off; docs/eviction.md)\n"
           "    -o store_high=PCT      the collector starts above PCT %% (default %d)\n"
           "    -o store_low=PCT       and stops at PCT %% (default %d, below store_high)\n"
           "    -o ro                  read-only: every change is EROFS\n"
           "    -o no_default_permissions  the kernel does not check modes and owners\n"
           "                           (default: it does; see shardfs(8), PERMISSIONS)\n"
           "\n",
           prog, DEFAULT_WAIT_S, DEFAULT_READAHEAD, DEFAULT_WARM_PCT, DEFAULT_REVALIDATE_MS,
           DEFAULT_STORE_HIGH_PCT, DEFAULT_STORE_LOW_PCT);
}

static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs)
{
    struct fs_options *o = data;

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

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "shardfs: " __VA_ARGS__);                                                  \
        fputc('\n', stderr);                                                                       \
        return -1;                                                                                 \
    } while (0)

/*
 * -o partition_budget=W0:W1:...: one weight per domain, each 1..
 * SFS_PARTITION_WEIGHT_MAX; domain i gets Wi / sum of the slots. The count
 * sets partitions, or must equal it. As for equal shares (partitions at most
 * half the slots), every domain must come to two slots at least, so that
 * the core's rounding leaves each one regular slot whatever the reserved
 * pool takes.
 */
static int check_partition_budget(const char *spec, struct fs_config *cfg)
{
    uint64_t nslots = cfg->cache.capacity / cfg->cache.shard_size, sum = 0, v;
    uint32_t n = 0;
    const char *p = spec;

    for (;;) {
        char num[16];
        size_t len = strcspn(p, ":");

        if (n == SFS_MAX_PARTITIONS_PUBLIC)
            FAIL("partition_budget=%s: more than %u weights", spec, SFS_MAX_PARTITIONS_PUBLIC);
        if (len == 0 || len >= sizeof(num))
            FAIL("partition_budget=%s: not a list of weights (W0:W1:..., one a domain)", spec);
        memcpy(num, p, len);
        num[len] = '\0';
        if (!parse_uint(num, SFS_PARTITION_WEIGHT_MAX, &v) || v == 0)
            FAIL("partition_budget=%s: weight '%s' out of range (1..%u)", spec, num,
                 SFS_PARTITION_WEIGHT_MAX);
        cfg->partition_weights[n++] = (uint32_t)v;
        sum += v;
        if (!p[len])
            break;
        p += len + 1;
    }
    if (cfg->cache.partitions && cfg->cache.partitions != n)
        FAIL("partition_budget=%s: %u weights for partitions=%u (one weight a domain)", spec, n,
             cfg->cache.partitions);
    if (n < 2)
        FAIL("partition_budget=%s: one weight: a single domain has the whole cache", spec);
    for (uint32_t d = 0; d < n; d++)
        if (nslots * cfg->partition_weights[d] < 2 * sum)
            FAIL("partition_budget=%s: domain %u's share (%u/%" PRIu64 " of %" PRIu64
                 " slots) is under two slots",
                 spec, d, cfg->partition_weights[d], sum, nslots);
    cfg->cache.partitions = n;
    cfg->cache.partition_weights = cfg->partition_weights;
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
static int check_cgroup(const char *capacity, struct fs_config *cfg)
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

/*
 * -o store_capacity=SIZE, store_high=PCT, store_low=PCT: the bound of the
 * store's block bytes and the collector's watermarks (storecap.c). Off (0)
 * by default; the watermarks mean nothing without it, and a read-only
 * daemon removes nothing, so either is refused rather than ignored.
 */
static int check_store_capacity(const struct fs_options *o, struct fs_config *cfg)
{
    uint64_t v;

    cfg->store_high_pct = DEFAULT_STORE_HIGH_PCT;
    cfg->store_low_pct = DEFAULT_STORE_LOW_PCT;
    if (o->store_capacity) {
        if (!parse_size(o->store_capacity, &v))
            FAIL("store_capacity=%s: not a size (a number with an optional K, M, G or T suffix)",
                 o->store_capacity);
        if (v && v < cfg->cache.shard_size)
            FAIL("store_capacity=%s: smaller than one shard (shard_size=%" PRIu64 "; 0: off)",
                 o->store_capacity, cfg->cache.shard_size);
        cfg->store_capacity = v;
    }
    if (!cfg->store_capacity && (o->store_high || o->store_low))
        FAIL("store_high, store_low: need -o store_capacity=SIZE");
    if (o->store_high) {
        if (!parse_uint(o->store_high, 100, &v) || v < 2)
            FAIL("store_high=%s: out of range (2..100 percent of store_capacity)", o->store_high);
        cfg->store_high_pct = (unsigned)v;
    }
    if (o->store_low) {
        if (!parse_uint(o->store_low, 99, &v) || v == 0)
            FAIL("store_low=%s: out of range (1..99 percent of store_capacity)", o->store_low);
        cfg->store_low_pct = (unsigned)v;
    }
    if (cfg->store_low_pct >= cfg->store_high_pct)
        FAIL("store_low=%u: not below store_high=%u", cfg->store_low_pct, cfg->store_high_pct);
    if (cfg->store_capacity && o->ro)
        FAIL("store_capacity=%s and ro: a read-only daemon removes nothing", o->store_capacity);
    return 0;
}

static int validate(const struct fs_options *o, const char *mnt, struct fs_config *cfg)
{
    uint64_t v;

    memset(cfg, 0, sizeof(*cfg));
    cfg->cache.shard_size = SFS_DEFAULT_SHARD_SIZE;
    cfg->cache.capacity = SFS_DEFAULT_CAPACITY;
    cfg->cache.hugepages = SFS_HUGEPAGES_AUTO;
    cfg->cache.numa_node = -1;
    /* First touch of the data plane dominates start-up: pay it once, here,
     * not in every rank and not in the first reads (BENCHMARKS.md). */
    cfg->cache.populate = true;
    cfg->wait_ns = DEFAULT_WAIT_S * 1000000000ll;
    cfg->readahead = DEFAULT_READAHEAD;
    cfg->warm_pct = DEFAULT_WARM_PCT;
    cfg->revalidate_ms = -1; /* the store's default (revalidate.c) */

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
             o->capacity ? o->capacity : DEFAULT_CAPACITY_TEXT, cfg->cache.shard_size);
    if (cfg->cache.capacity / cfg->cache.shard_size >= (1u << 30))
        FAIL("capacity=%s: too many slots for shard_size=%" PRIu64 " (at most 2^30)",
             o->capacity ? o->capacity : DEFAULT_CAPACITY_TEXT, cfg->cache.shard_size);
    {
        /* The data plane is prefaulted at create (populate): more than the
         * machine has would wake the OOM killer, not give an error. */
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

        if (pages > 0 && psz > 0 && cfg->cache.capacity > (uint64_t)pages * (uint64_t)psz)
            FAIL("capacity=%s: larger than this machine's memory (%" PRIu64 " bytes)",
                 o->capacity ? o->capacity : DEFAULT_CAPACITY_TEXT,
                 (uint64_t)pages * (uint64_t)psz);
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
    if (check_cgroup(o->capacity ? o->capacity : DEFAULT_CAPACITY_TEXT, cfg) < 0)
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
    if (o->page_cache) {
        if (!parse_size(o->page_cache, &v))
            FAIL("page_cache=%s: not a size (a number with an optional K, M or G suffix)",
                 o->page_cache);
        if (v && v < cfg->cache.shard_size)
            FAIL("page_cache=%s: smaller than one shard (shard_size=%" PRIu64 "; 0: off)",
                 o->page_cache, cfg->cache.shard_size);
        if (v > cfg->cache.capacity / 2)
            FAIL("page_cache=%s: above half the capacity (%" PRIu64
                 " bytes): the shards it holds cannot be evicted",
                 o->page_cache, cfg->cache.capacity / 2);
        cfg->page_cache = v;
    }
    if (o->warm) {
        if (!parse_uint(o->warm, 100, &v))
            FAIL("warm=%s: out of range (0..100 percent of capacity)", o->warm);
        cfg->warm_pct = (unsigned)v;
    }
    /* The daemon's default is scan (docs/eviction.md, "The default"); a
     * cache made with the core API's zero config stays CLOCK. */
    cfg->cache.admission = SFS_ADMIT_SCAN;
    if (o->admission) {
        if (strcmp(o->admission, "clock") == 0)
            cfg->cache.admission = SFS_ADMIT_CLOCK;
        else if (strcmp(o->admission, "scan") == 0)
            cfg->cache.admission = SFS_ADMIT_SCAN;
        else
            FAIL("admission=%s: must be clock or scan", o->admission);
    }
    if (o->partitions) {
        uint64_t nslots = cfg->cache.capacity / cfg->cache.shard_size;

        if (!parse_uint(o->partitions, SFS_MAX_PARTITIONS_PUBLIC, &v) || v == 0 || v > nslots / 2)
            FAIL("partitions=%s: out of range (1..%u, and at most half the %" PRIu64 " slots)",
                 o->partitions, SFS_MAX_PARTITIONS_PUBLIC, nslots);
        cfg->cache.partitions = (uint32_t)v;
    }
    if (o->partition_budget && check_partition_budget(o->partition_budget, cfg) < 0)
        return -1;
    cfg->cache.pin_budget_pct = (int)SFS_DEFAULT_PIN_BUDGET_PCT;
    if (o->pin_budget) {
        if (!parse_uint(o->pin_budget, 100, &v))
            FAIL("pin_budget=%s: out of range (0..100 percent of capacity)", o->pin_budget);
        cfg->cache.pin_budget_pct = v ? (int)v : -1;
    }
    if (o->pin_max) {
        if (!parse_uint(o->pin_max, SFS_PIN_MAX_SECONDS, &v) || v == 0)
            FAIL("pin_max=%s: out of range (1..%u seconds)", o->pin_max, SFS_PIN_MAX_SECONDS);
        cfg->cache.pin_max_seconds = (uint32_t)v;
    }
    if (o->pin_user_share) {
        if (!parse_uint(o->pin_user_share, 100, &v) || v == 0)
            FAIL("pin_user_share=%s: out of range (1..100 percent of pin_budget)",
                 o->pin_user_share);
        cfg->cache.pin_user_pct = (uint32_t)v;
    }
    if (o->warm_pin) {
        if (!parse_uint(o->warm_pin, SFS_PIN_MAX_SECONDS, &v))
            FAIL("warm_pin=%s: out of range (0..%u seconds)", o->warm_pin, SFS_PIN_MAX_SECONDS);
        cfg->warm_pin_s = (uint32_t)v;
        if (cfg->cache.pin_max_seconds && v > cfg->cache.pin_max_seconds)
            FAIL("warm_pin=%s: longer than pin_max=%u", o->warm_pin, cfg->cache.pin_max_seconds);
    }
    if (o->revalidate) {
        if (!parse_uint(o->revalidate, MAX_REVALIDATE_MS, &v))
            FAIL("revalidate=%s: out of range (0..%d ms; 0: off)", o->revalidate,
                 MAX_REVALIDATE_MS);
        cfg->revalidate_ms = (int64_t)v;
    }
    if (check_store_capacity(o, cfg) < 0)
        return -1;
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
        fs_default_socket(mnt, cfg->socket, sizeof(cfg->socket));
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

int fs_options_parse(struct fuse_args *args, struct fs_options *o)
{
    memset(o, 0, sizeof(*o));
    o->max_read = DEFAULT_MAX_READ;
    if (fuse_opt_parse(args, o, opt_table, opt_proc) != 0) {
        if (!o->bad)
            fprintf(stderr, "shardfs: bad options (see --help)\n");
        return -1;
    }
    return 0;
}

/* The peer options: their values are checked again, with reasons, by
 * sfs_backend_open; here only what the spec syntax cannot carry. */
static int check_peer(const struct fs_options *o)
{
    uint64_t v;

    if (!o->peer_listen) {
        if (o->peers || o->peer_capacity || o->peer_ways || o->peer_slot || o->peer_key)
            FAIL("peers, peer_capacity, peer_ways, peer_slot, peer_key: need -o "
                 "peer_listen=ADDR:PORT");
        return 0;
    }
    if (strpbrk(o->peer_listen, ",") || (o->peers && strpbrk(o->peers, ",:")) ||
        (o->peer_key && strpbrk(o->peer_key, ",:")))
        FAIL("peer_listen, peers, peer_key: ',' and (in peers, peer_key) ':' cannot be named in "
             "a backend spec");
    if (o->peer_capacity && !parse_size(o->peer_capacity, &v))
        FAIL("peer_capacity=%s: not a size", o->peer_capacity);
    if (o->peer_slot && !parse_size(o->peer_slot, &v))
        FAIL("peer_slot=%s: not a size", o->peer_slot);
    if (o->peer_ways && !parse_uint(o->peer_ways, 64, &v))
        FAIL("peer_ways=%s: not a number 1..64", o->peer_ways);
    if (o->peers && access(o->peers, R_OK) < 0)
        FAIL("peers=%s: %s", o->peers, strerror(errno));
    /* Its mode and owner are checked when the tier reads it. */
    if (!o->peer_key)
        FAIL("peer_listen=%s needs -o peer_key=FILE: members authenticate each other "
             "(shardfs(8))",
             o->peer_listen);
    return 0;
}

char *fs_backend_spec(const struct fs_options *o)
{
    char *s = NULL;
    uint64_t cap = 1ull << 30, slot = 0;

    if (!o->peer_listen)
        return strdup(o->backend);
    if (o->peer_capacity)
        parse_size(o->peer_capacity, &cap);
    if (o->peer_slot)
        parse_size(o->peer_slot, &slot);
    if (asprintf(&s, "peer:listen=%s%s%s,ways=%s,capacity=%" PRIu64 "%s%.0" PRIu64 ",key=%s:%s",
                 o->peer_listen, o->peers ? ",members=" : "", o->peers ? o->peers : "",
                 o->peer_ways ? o->peer_ways : "4", cap, slot ? ",slot=" : "", slot, o->peer_key,
                 o->backend) < 0)
        return NULL;
    return s;
}

int fs_options_check(const struct fs_options *o, const char *mnt, struct fs_config *cfg)
{
    if (validate(o, mnt, cfg) < 0 || check_peer(o) < 0 || fs_check_backend(o->backend) < 0 ||
        fs_check_mountpoint(mnt) < 0 || fs_check_socket(cfg->socket, cfg->default_socket) < 0)
        return -1;
    if (o->perms_on && o->perms_off)
        FAIL("default_permissions and no_default_permissions: pick one");
    return 0;
}

int fs_options_mount_args(const struct fs_options *o, struct fuse_args *args)
{
    /* The kernel checks modes and owners (fs_fill_attr's) before any request
     * reaches us: with allow_other, other users get what the modes say. */
    if (!o->perms_on && !o->perms_off && fuse_opt_add_arg(args, "-odefault_permissions") != 0)
        return -1;
    if (!o->max_read_set) {
        char mr[32];

        snprintf(mr, sizeof(mr), "-omax_read=%u", o->max_read);
        if (fuse_opt_add_arg(args, mr) != 0)
            return -1;
    }
    return 0;
}

void fs_options_free(struct fs_options *o)
{
    free(o->shard_size);
    free(o->capacity);
    free(o->dir_prefix);
    free(o->socket);
    free(o->attach_uids);
    free(o->attach_gid);
    free(o->hugepages);
    free(o->reserved);
    free(o->wait_timeout);
    free(o->readahead);
    free(o->page_cache);
    free(o->peer_listen);
    free(o->peers);
    free(o->peer_capacity);
    free(o->peer_ways);
    free(o->peer_slot);
    free(o->peer_key);
    free(o->warm);
    free(o->admission);
    free(o->partitions);
    free(o->partition_budget);
    free(o->pin_budget);
    free(o->pin_max);
    free(o->pin_user_share);
    free(o->warm_pin);
    free(o->revalidate);
    free(o->numa_node);
    free(o->store_capacity);
    free(o->store_high);
    free(o->store_low);
    free(o->backend);
}
