/* SPDX-License-Identifier: MIT */
/*
 * threads_stress.c - many threads of one process on one cache: owners,
 * waiters, evictions, Touch, Prealloc, failures and removes at once.
 *
 * A plain program rather than a Criterion one, so that it also runs under
 * ThreadSanitizer (Criterion's runner does not start under TSan here). TSan
 * sees the same publication protocol the processes use: bytes written, then
 * a release store of the state, then an acquire load by the reader. Every
 * shard read is verified against the pure function of its key. Exit status 0
 * means every check held.
 */
#include "testutil.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NTHREADS 6
#define NKEYS    20
#define NSLOTS   24
#define SHARD    4096
#define OPS      30000

static struct sfs_cache *cache;
static atomic_long wrong, timeouts, errors, hits, owners, waits, fails_seen;

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void *worker(void *arg)
{
    uint64_t seed = (uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;

    for (int i = 0; i < OPS; i++) {
        uint64_t r = rnd(&seed);
        struct sfs_key k = tu_key(r % NKEYS, (uint32_t)(r >> 32) % 3);
        struct sfs_lease l;
        int role;

        switch ((r >> 8) % 32) {
        case 0: {
            struct sfs_block_id b = k.block;
            sfs_cache_touch(cache, &b, 1);
            continue;
        }
        case 1: {
            struct sfs_key n = k;
            n.shard++;
            sfs_cache_prealloc(cache, &n);
            continue;
        }
        case 2:
            sfs_cache_remove(cache, &k); /* -EBUSY when leased: fine */
            continue;
        default:
            break;
        }
        role = sfs_cache_get(cache, &k, 0, sfs_deadline_after(2000000000), &l);
        if (role < 0) {
            atomic_fetch_add(&errors, 1);
            continue;
        }
        if (role == SFS_WAITER) {
            atomic_fetch_add(&waits, 1);
            int st;
            /* Half the waits through futex_waitv (wait_any), half through
             * the single-word futex. */
            if ((r >> 40) & 1) {
                int got = sfs_cache_wait_any(cache, &l, 1, sfs_deadline_after(2000000000), &st);
                if (got < 0)
                    st = got;
            } else {
                st = sfs_cache_wait(cache, &l, sfs_deadline_after(2000000000));
            }
            if (st == -ETIMEDOUT)
                atomic_fetch_add(&timeouts, 1);
            if (st == SFS_WAIT_OWNER)
                role = SFS_OWNER;
            else if (st == SFS_WAIT_FAILED)
                atomic_fetch_add(&fails_seen, 1);
            else if (st == SFS_WAIT_READY && tu_check(&k, sfs_cache_data(cache, &l), SHARD) >= 0)
                atomic_fetch_add(&wrong, 1);
        }
        if (role == SFS_OWNER) {
            atomic_fetch_add(&owners, 1);
            if ((r >> 16) % 50 == 0) {
                sfs_cache_fail(cache, &l, -EIO);
            } else {
                tu_fill(&k, sfs_cache_data(cache, &l), SHARD);
                sfs_cache_publish(cache, &l, SHARD, 0);
            }
        } else if (role == SFS_HIT) {
            atomic_fetch_add(&hits, 1);
            if (tu_check(&k, sfs_cache_data(cache, &l), SHARD) >= 0)
                atomic_fetch_add(&wrong, 1);
        }
        sfs_cache_release(cache, &l);
    }
    return NULL;
}

int main(void)
{
    pthread_t t[NTHREADS];
    struct sfs_stats st;

    cache = tu_cache(NSLOTS, 4, SHARD);
    if (!cache)
        return 1;
    for (long i = 0; i < NTHREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)(i + 1));
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(t[i], NULL);
    sfs_cache_stats(cache, &st);
    printf("threads_stress: hits %ld owners %ld waits %ld failed-seen %ld evictions %llu\n",
           atomic_load(&hits), atomic_load(&owners), atomic_load(&waits), atomic_load(&fails_seen),
           (unsigned long long)st.evictions);
    printf("threads_stress: wrong bytes %ld, timeouts %ld, errors %ld\n", atomic_load(&wrong),
           atomic_load(&timeouts), atomic_load(&errors));
    /* Every slot must be unleased now: a full cycle of Gets of fresh keys
     * with no deadline must never find the cache full. */
    long full = 0;
    for (int i = 0; i < NSLOTS * 2; i++) {
        struct sfs_key k = tu_key(100000 + i, 0);
        if (tu_load(cache, &k) < 0)
            full++;
    }
    sfs_cache_close(cache);
    bool ok = atomic_load(&wrong) == 0 && atomic_load(&timeouts) == 0 &&
              atomic_load(&errors) == 0 && full == 0 && st.evictions > 0;
    printf("%d passed, %d failed\n", ok ? 1 : 0, ok ? 0 : 1);
    return ok ? 0 : 1;
}
