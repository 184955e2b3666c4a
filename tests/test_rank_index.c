/* SPDX-License-Identifier: MIT */
/*
 * test_rank_index.c - struct sfs_rank_config's rank_index: which key of a
 * task a rank takes first (RearrangeIndex: rank r of N walks r, r+N, ...),
 * set explicitly, derived from device_id when it is < 0 (the default and
 * 0.1's only way), refused when it is out of range; and the 0.1 entry point
 * sfs_rank_open@SHARDFS_RANK_0.1, which never reads the field (a 0.1
 * program's struct may hold anything where it sits).
 *
 * How the first key is seen: one rank in this process, load depth 1, a
 * fault backend with a long latency. The dispatcher takes the depth token
 * before the Get that makes it owner, so until the first load ends exactly
 * one key of the task is in the cache (Loading): order[0]. The test looks
 * at the cache until a key of the task appears there and asserts it is
 * key r, and that key 0 (visited fifth of eight when r = 2) is absent.
 */
#include "rankenv.h"
#include "testutil.h"

#include <shardfs/fault.h>
#include <shardfs/rank.h>

#include <criterion/criterion.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N      4
#define KEYS   8
#define LAT_US 1500000

typedef struct sfs_rank *(*open_fn)(const struct sfs_rank_config *, int *);

static struct sfs_rank_config config(struct env *e, char *spec, size_t len, int dev, int index)
{
    struct sfs_rank_config cfg;

    snprintf(spec, len, "fault:latency_us=%d:%s", LAT_US, e->dir);
    sfs_rank_config_init(&cfg);
    cfg.socket_path = e->sock;
    cfg.device_id = dev;
    cfg.local_rank_size = N;
    cfg.backend = spec;
    cfg.copier = SFS_COPIER_HOST;
    cfg.load_depth = 1;
    cfg.prealloc = false;
    cfg.rank_index = index;
    return cfg;
}

/* Load keys [0, KEYS) with a rank opened by `open` and return the first key
 * that showed up in the cache; every entry must load. */
static int first_key(struct env *e, open_fn open, const struct sfs_rank_config *cfg)
{
    struct sfs_rank_entry ent[KEYS];
    int st[KEYS], err = 0, first = -1;
    uint8_t *bufs = malloc((size_t)KEYS * SHARD);
    struct sfs_task *t;
    struct sfs_rank *rk = open(cfg, &err);

    cr_assert_not_null(rk, "sfs_rank_open: %s", strerror(-err));
    cr_assert_not_null(bufs);
    for (int i = 0; i < KEYS; i++)
        ent[i] = (struct sfs_rank_entry){tu_block(i), 0, bufs + (size_t)i * SHARD};
    cr_assert_eq(sfs_rank_load(rk, ent, KEYS, &t), 0);
    /* Liveness bound only: the first Get comes within milliseconds. */
    int64_t end = sfs_deadline_after(10ll * 1000 * 1000 * 1000);
    while (first < 0 && sfs_now_ns() < end) {
        for (int i = 0; i < KEYS && first < 0; i++) {
            struct sfs_key k = tu_key(i, 0);

            if (sfs_cache_state(e->c, &k) >= SFS_STATE_IDLE)
                first = i;
        }
        if (first < 0)
            usleep(200);
    }
    cr_assert_geq(first, 0, "no key of the task reached the cache");
    /* Key 0 comes fifth in every order but r = 0's: still absent here, even
     * after a descheduling of several latencies. */
    struct sfs_key k0 = tu_key(0, 0);
    int s0 = sfs_cache_state(e->c, &k0);

    cr_assert_eq(sfs_fault_set(sfs_rank_backend(rk), "latency_us=0"), 0);
    cr_assert_eq(sfs_rank_wait(t, 30000, st), 0);
    sfs_rank_task_free(t);
    check_bufs(0, KEYS, 0, bufs, st);
    sfs_rank_close(rk);
    free(bufs);
    if (first != 0)
        cr_expect_eq(s0, -ENOENT, "key 0 is in the cache (state %d) before key %d's load ended", s0,
                     first);
    return first;
}

/* A fresh cache and store for each case: nothing resident. */
static int case_first_key(open_fn open, int dev, int index)
{
    struct env e;
    char spec[256];
    int first;

    env_up(&e, 64, 0);
    write_store(e.dir, 0, KEYS, 1, SHARD);
    struct sfs_rank_config cfg = config(&e, spec, sizeof(spec), dev, index);
    first = first_key(&e, open, &cfg);
    env_down(&e);
    return first;
}

Test(rank_index, explicit_index_with_a_device, .timeout = 60)
{
    /* Every worker sees its GPU as device 0: the index says the rank. */
    cr_assert_eq(case_first_key(sfs_rank_open, 0, 2), 2);
    cr_assert_eq(case_first_key(sfs_rank_open, 0, 3), 3);
}

Test(rank_index, default_derives_from_the_device, .timeout = 60)
{
    struct sfs_rank_config cfg;

    sfs_rank_config_init(&cfg);
    cr_assert_eq(cfg.rank_index, -1, "the default is the derived index");
    cr_assert_eq(case_first_key(sfs_rank_open, 6, -1), 6 % N);
}

Test(rank_index, out_of_range_is_refused, .timeout = 30)
{
    struct env e;
    char spec[256];
    int err = 0;

    env_up(&e, 64, 0);
    write_store(e.dir, 0, 1, 1, SHARD);
    struct sfs_rank_config cfg = config(&e, spec, sizeof(spec), 0, N);
    cr_assert_null(sfs_rank_open(&cfg, &err));
    cr_assert_eq(err, -EINVAL);
    cfg.rank_index = N - 1;
    struct sfs_rank *rk = sfs_rank_open(&cfg, &err);
    cr_assert_not_null(rk, "sfs_rank_open: %s", strerror(-err));
    sfs_rank_close(rk);
    /* The scheduler role has no walk: its index is not looked at. */
    cfg.device_id = -1;
    cfg.rank_index = 1000;
    rk = sfs_rank_open(&cfg, &err);
    cr_assert_not_null(rk, "sfs_rank_open: %s", strerror(-err));
    sfs_rank_close(rk);
    env_down(&e);
}

/* The 0.1 entry point, as a program built against 0.1 binds it. */
static struct sfs_rank *open_0_1_garbage(const struct sfs_rank_config *cfg, int *err)
{
    open_fn old = (open_fn)dlvsym(RTLD_DEFAULT, "sfs_rank_open", "SHARDFS_RANK_0.1");
    struct sfs_rank_config c = *cfg;

    cr_assert_not_null(old, "no sfs_rank_open@SHARDFS_RANK_0.1: %s", dlerror());
    /* What a 0.1 program may leave where rank_index now sits. */
    memset(&c.rank_index, 0x5a, sizeof(c.rank_index));
    return old(&c, err);
}

Test(rank_index, the_0_1_entry_point_ignores_the_field, .timeout = 60)
{
    open_fn now = (open_fn)dlvsym(RTLD_DEFAULT, "sfs_rank_open", "SHARDFS_RANK_0.2");

    cr_assert_eq((void *)now, (void *)sfs_rank_open, "new programs bind 0.2");
    /* Device 6 of 4 is rank 2, whatever lies in the field. */
    cr_assert_eq(case_first_key(open_0_1_garbage, 6, 0), 2);
}
