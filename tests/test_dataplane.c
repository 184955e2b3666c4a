/* SPDX-License-Identifier: MIT */
/*
 * test_dataplane.c - the data plane's memory (core/cache/dataplane.c): a
 * cache bound to a NUMA node, a binding the kernel refuses (said, not
 * fatal), huge pages asked for beyond what the machine has free (AUTO
 * falls back to ordinary memfds and says so; ON refuses with -ENOMEM), a
 * data plane past the process's file size, descriptor or address-space
 * limit (the kernel's errno, no descriptor left open), and one prefaulted
 * at create.
 *
 * Key idea: a hugetlb mapping reserves its pages at mmap, all or none, so a
 * data plane larger than the free pool fails there, whatever the pool's
 * size, without taking pages from anyone else on the machine: the fallback
 * is reached on demand on any machine. Every cache made is checked by a
 * load and a hit of real bytes.
 */
#include "testutil.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <numa.h>
#include <signal.h>
#include <stdio.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/resource.h>
#include <syslog.h>
#include <unistd.h>

#define SHARD (1024u * 1024)

TestSuite(dataplane, .timeout = 30);

static atomic_int mbind_lines, fallback_lines;

static void count_log(int level, const char *msg, void *arg)
{
    (void)level;
    (void)arg;
    if (strstr(msg, "mbind"))
        atomic_fetch_add(&mbind_lines, 1);
    if (strstr(msg, "huge pages unavailable"))
        atomic_fetch_add(&fallback_lines, 1);
}

static long hugepages_free(void)
{
    FILE *f = fopen("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "r");
    long n = 0;

    if (!f)
        return 0;
    if (fscanf(f, "%ld", &n) != 1)
        n = 0;
    fclose(f);
    return n;
}

/* A load and a hit of real bytes in c. */
static void check_data_works(struct sfs_cache *c)
{
    struct sfs_key k = tu_key(77, 3);
    struct sfs_lease l;

    cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &l), SFS_HIT);
    cr_assert_eq(tu_check(&k, sfs_cache_data(c, &l), SHARD), -1, "wrong bytes in the data plane");
    cr_assert_eq(sfs_cache_release(c, &l), 0);
}

static struct sfs_cache *create(uint32_t nslots, int hugepages, int numa_node, int *err)
{
    struct sfs_cache_config cfg = {.shard_size = SHARD,
                                   .nslots = nslots,
                                   .no_reserved = true,
                                   .hugepages = hugepages,
                                   .numa_bind = numa_node >= 0,
                                   .numa_node = numa_node};

    return sfs_cache_create(&cfg, err);
}

Test(dataplane, bound_to_a_numa_node)
{
    int err = 0;

    if (numa_available() < 0)
        cr_skip_test("no NUMA support in this kernel");
    atomic_store(&mbind_lines, 0);
    sfs_set_log(count_log, NULL, LOG_DEBUG);
    struct sfs_cache *c = create(8, SFS_HUGEPAGES_OFF, 0, &err);
    cr_assert_not_null(c, "bound to node 0: %s", strerror(-err));
    cr_assert_eq(atomic_load(&mbind_lines), 0, "node 0 exists: its binding must not fail");
    check_data_works(c);
    sfs_cache_close(c);

    /* A node the machine does not have: said, and the cache still works. */
    int none = numa_max_node() + 1;
    if (none <= numa_max_possible_node()) {
        c = create(8, SFS_HUGEPAGES_OFF, none, &err);
        cr_assert_not_null(c, "a refused binding is not fatal: %s", strerror(-err));
        cr_assert_geq(atomic_load(&mbind_lines), 1, "the refused binding was not said");
        check_data_works(c);
        sfs_cache_close(c);
    }
    sfs_set_log(NULL, NULL, 0);
}

Test(dataplane, huge_pages_beyond_the_free_pool)
{
    long free_pages = hugepages_free();
    /* 2 MiB pages: more shards than the free pool holds, and 16 more. */
    uint32_t nslots = (uint32_t)(free_pages * 2 + 16);
    int err = 0;

    if (nslots > 1024)
        cr_skip_test("%ld huge pages free: a data plane beyond them is too big here", free_pages);
    atomic_store(&fallback_lines, 0);
    sfs_set_log(count_log, NULL, LOG_DEBUG);
    struct sfs_cache *c = create(nslots, SFS_HUGEPAGES_AUTO, -1, &err);
    cr_assert_not_null(c, "AUTO must fall back: %s", strerror(-err));
    struct sfs_cache_info info;
    sfs_cache_info(c, &info);
    cr_assert_not(info.hugepages, "%u MiB on %ld free huge pages", nslots, free_pages);
    cr_assert_eq(atomic_load(&fallback_lines), 1, "the fallback is said once");
    check_data_works(c);
    sfs_cache_close(c);

    cr_assert_null(create(nslots, SFS_HUGEPAGES_ON, -1, &err), "ON beyond the pool must refuse");
    cr_assert_eq(err, -ENOMEM);
    sfs_set_log(NULL, NULL, 0);
}

/* No configuration: the defaults (256 KiB shards, 1 GiB, huge pages if
 * the machine has them free, else ordinary memfds). */
Test(dataplane, no_config_is_the_defaults)
{
    struct sfs_cache_info info;
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(NULL, &err);

    cr_assert_not_null(c, "the defaults: %s", strerror(-err));
    sfs_cache_info(c, &info);
    cr_assert_eq(info.shard_size, 256u * 1024);
    cr_assert_eq((uint64_t)info.nslots * info.shard_size, 1ull << 30);
    struct sfs_key k = tu_key(5, 0);
    struct sfs_lease l;
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &l), SFS_OWNER);
    cr_assert_eq(tu_publish(c, &k, &l), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &l), SFS_HIT);
    cr_assert_eq(tu_check(&k, sfs_cache_data(c, &l), info.shard_size), -1);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * A data plane past the process's limits: the create fails with the
 * kernel's errno, in every huge-page mode (AUTO says it falls back, then
 * fails the same way), and leaves no descriptor open. In forked children:
 * the limits are the process's; each is lowered for the create alone.
 */

/* 8 slots of 1 MiB (one segment of 8 MiB) and a small control plane. */
static struct sfs_cache_config small_ctl(int hugepages)
{
    return (struct sfs_cache_config){.shard_size = SHARD,
                                     .nslots = 8,
                                     .no_reserved = true,
                                     .max_procs = 2,
                                     .max_leases = 64,
                                     .hugepages = hugepages};
}

/* The lowest free descriptor. */
static int lowest_free_fd(void)
{
    int fd = dup(0);

    if (fd >= 0)
        close(fd);
    return fd;
}

/* sfs_cache_create under limit `res` at `cur`: its -errno (0: created). */
static int create_limited(int res, rlim_t cur, int hugepages)
{
    struct sfs_cache_config cfg = small_ctl(hugepages);
    struct rlimit old, low;
    int err = 0;

    if (getrlimit(res, &old) < 0)
        return 1;
    low = old;
    low.rlim_cur = cur;
    if (setrlimit(res, &low) < 0)
        return 1;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);
    if (setrlimit(res, &old) < 0)
        return 1;
    if (c) {
        sfs_cache_close(c);
        return 0;
    }
    return err;
}

static int sizes_of(uint64_t *ctl, uint64_t *seg)
{
    struct sfs_cache_config cfg = small_ctl(SFS_HUGEPAGES_OFF);
    struct sfs_cache_info info;
    size_t len = 0;
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);

    TU_CK(c);
    sfs_cache_info(c, &info);
    TU_CK(sfs_cache_segment(c, 0, &len) != NULL);
    TU_CK(sfs_cache_segment(c, info.nsegments, NULL) == NULL);
    *ctl = info.control_bytes;
    *seg = len;
    sfs_cache_close(c);
    return 0;
}

static const int modes[] = {SFS_HUGEPAGES_OFF, SFS_HUGEPAGES_AUTO, SFS_HUGEPAGES_ON};

static int past_file_size(void *arg)
{
    uint64_t ctl, seg;
    int fd0 = lowest_free_fd();

    (void)arg;
    TU_CK(sizes_of(&ctl, &seg) == 0);
    TU_CK(ctl < seg);
    signal(SIGXFSZ, SIG_IGN); /* the ftruncate's EFBIG, not the signal */
    sfs_set_log(count_log, NULL, LOG_DEBUG);
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        atomic_store(&fallback_lines, 0);
        /* Room for the control plane, not for a segment. */
        int r = create_limited(RLIMIT_FSIZE, ctl, modes[i]);
        if (r != -EFBIG)
            fprintf(stderr, "mode %d: %s\n", modes[i], strerror(-r));
        TU_CK(r == -EFBIG);
        TU_CK(atomic_load(&fallback_lines) == (modes[i] == SFS_HUGEPAGES_AUTO));
        /* Not even for the control plane. */
        TU_CK(create_limited(RLIMIT_FSIZE, ctl / 2, modes[i]) == -EFBIG);
        TU_CK(lowest_free_fd() == fd0);
    }
    sfs_set_log(NULL, NULL, 0);
    return 0;
}

Test(dataplane, a_data_plane_past_the_file_size_limit_is_efbig)
{
    cr_assert_eq(tu_wait(tu_fork(past_file_size, NULL)), 0);
}

static int without_descriptors(void *arg)
{
    int fd0 = lowest_free_fd();

    (void)arg;
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        /* One for the control plane, none for a segment; then none. */
        TU_CK(create_limited(RLIMIT_NOFILE, (rlim_t)fd0 + 1, modes[i]) == -EMFILE);
        TU_CK(create_limited(RLIMIT_NOFILE, (rlim_t)fd0, modes[i]) == -EMFILE);
        TU_CK(lowest_free_fd() == fd0);
    }
    return 0;
}

Test(dataplane, a_data_plane_without_descriptors_is_emfile)
{
    cr_assert_eq(tu_wait(tu_fork(without_descriptors, NULL)), 0);
}

/* The address space this process uses now, in bytes (VmSize). */
static uint64_t vm_size(void)
{
    FILE *f = fopen("/proc/self/status", "re");
    char line[256];
    unsigned long long kb = 0;

    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmSize: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

static int past_address_space(void *arg)
{
    uint64_t ctl, seg;
    int fd0 = lowest_free_fd();

    (void)arg;
    TU_CK(sizes_of(&ctl, &seg) == 0);
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        uint64_t vm = vm_size();

        TU_CK(vm > 0);
        /* Room for the control plane and a little more, not for the 8 MiB
         * segment. */
        int r = create_limited(RLIMIT_AS, vm + ctl + (1u << 20), modes[i]);
        if (r != -ENOMEM)
            fprintf(stderr, "mode %d: %s\n", modes[i], strerror(-r));
        TU_CK(r == -ENOMEM);
        TU_CK(lowest_free_fd() == fd0);
    }
    return 0;
}

Test(dataplane, a_data_plane_past_the_address_space_limit_is_enomem)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    /* Their runtimes map memory of their own at any time: a limit on the
     * address space would fail them, not the create. */
    cr_skip_test("an address-space limit under a sanitizer's runtime");
#endif
    cr_assert_eq(tu_wait(tu_fork(past_address_space, NULL)), 0);
}

/* Ordinary pages prefaulted at create, as asked. */
Test(dataplane, populated_at_create)
{
    struct sfs_cache_config cfg = {.shard_size = SHARD,
                                   .nslots = 4,
                                   .no_reserved = true,
                                   .hugepages = SFS_HUGEPAGES_OFF,
                                   .populate = true};
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);

    cr_assert_not_null(c, "%s", strerror(-err));
    check_data_works(c);
    sfs_cache_close(c);
}
