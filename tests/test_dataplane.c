/* SPDX-License-Identifier: MIT */
/*
 * test_dataplane.c - the data plane's memory (core/cache/dataplane.c): a
 * cache bound to a NUMA node, a binding the kernel refuses (said, not
 * fatal), and huge pages asked for beyond what the machine has free (AUTO
 * falls back to ordinary memfds and says so; ON refuses with -ENOMEM).
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
#include <stdatomic.h>
#include <string.h>
#include <syslog.h>

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
