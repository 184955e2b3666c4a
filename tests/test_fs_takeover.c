/* SPDX-License-Identifier: MIT */
/*
 * test_fs_takeover.c - a read parked behind another process's load is never
 * held by that load's owner once the owner is gone (invariant 7).
 *
 * A process attached to the mount's cache (a rank, in life) takes a key as
 * owner and holds it Loading. A reader of that shard through the mount
 * parks (fs/wait.c): it holds no FUSE worker and waits on the slot. Then
 * the owner either dies (SIGKILL: the daemon reaps it and the slot goes
 * back to Idle) or gives the slot back without publishing (release: Idle).
 * The parked read must take the load over and answer the shard's bytes
 * from the store, not wait out wait_timeout and answer ETIMEDOUT.
 *
 * Both failed before the settler's fix: the settler's sleep
 * (sfs_cache_wait_any_bell) is what sees the Idle slot first and takes it
 * over for the parked read, and the settler dropped that outcome; the next
 * look found the slot Loading under a live owner (the daemon itself), so
 * the read waited out its deadline. Found by test_shared_store with its
 * rank writers in the kill rotation (docs/shared-store.md).
 *
 * An update of the shard (truncate(2), which copies its current bytes
 * before storing it) waits behind such a load the same way, and starts from
 * what the load gave: the owner's bytes, the store's when the owner gave it
 * back, or the owner's failure. A parked read whose owner holds the load
 * past wait_timeout fails ETIMEDOUT; reads parked on more slots than the
 * settler's one wait covers are all answered. A shard an owner published
 * short reads up to its length.
 */
#include "fsfixture.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD       (64u << 10)
#define BLOCK       3u
#define WAIT_S      20 /* the mount's wait_timeout: what a held read would wait */
#define OWNERS_BYTE 0xa5
#define KEPT        100 /* bytes an update by truncate(2) keeps */

static struct {
    char store[128];
    struct fsfx fx;
    int go[2];   /* parent -> owner: one byte, release the slot */
    pid_t owner; /* the owner while it may live: killed by the teardown */
} T;

static void setup(void)
{
    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3");
    snprintf(T.store, sizeof(T.store), "%s", tu_path("store"));
    snprintf(T.fx.mnt, sizeof(T.fx.mnt), "%s", tu_path("mnt"));
    snprintf(T.fx.log, sizeof(T.fx.log), "%s", tu_path("log"));
    snprintf(T.fx.sock, sizeof(T.fx.sock), "%s", tu_path("sock"));
    T.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
    cr_assert_eq(tu_store_write(T.store, BLOCK, 1, 1, SHARD, NULL, NULL, false), 0);
    cr_assert_eq(pipe2(T.go, O_CLOEXEC), 0);
    char opts[64];
    snprintf(opts, sizeof(opts), "capacity=4M,shard_size=64K,readahead=0,wait_timeout=%d", WAIT_S);
    cr_assert_eq(fsfx_start(&T.fx, T.store, opts, 20.0, NULL), 0, "mount (log: %s)", T.fx.log);
}

static void teardown(void)
{
    if (T.owner > 0) { /* a failed check left it holding the key */
        kill(T.owner, SIGKILL);
        tu_wait(T.owner);
    }
    if (T.fx.pid)
        fsfx_stop(&T.fx, true, 10.0);
    fsfx_cleanup(&T.fx, T.store);
    unlink(T.fx.sock);
}

/* The owner: takes the key (the daemon counts it) and holds it Loading
 * until told to give it back unpublished, or until killed; then waits to be
 * killed. */
static int own_key(struct sfs_cache *c, void *arg)
{
    struct sfs_key k = tu_key(BLOCK, 0);
    struct sfs_lease l;
    char b;

    (void)arg;
    if (sfs_cache_get(c, &k, 0, 0, &l) != SFS_OWNER)
        return 2;
    if (read(T.go[0], &b, 1) != 1)
        return 3;
    if (b == 'p' || b == 'h') { /* publish bytes of its own (not the store's); 'h': half */
        memset(sfs_cache_data(c, &l), OWNERS_BYTE, SHARD);
        if (sfs_cache_publish(c, &l, b == 'h' ? SHARD / 2 : SHARD, 0) != 0)
            return 4;
    } else if (b == 'f' && sfs_cache_fail(c, &l, -EIO) != 0) {
        return 5;
    }
    sfs_cache_release(c, &l); /* 'g': no publish, the slot goes back to Idle */
    pause();                  /* alive: only the release may free the read */
    return 0;
}

/* A read of the shard through the mount: 0 for the whole, right shard; 1
 * for wrong bytes; otherwise 2 (the errno on stderr). */
static int read_shard(void *arg)
{
    struct sfs_key k = tu_key(BLOCK, 0);
    static char buf[SHARD + 1];
    long n = fsfx_read_all(fsfx_shard_path(&T.fx, BLOCK, 0), buf, sizeof(buf));

    (void)arg;
    if (n != (long)SHARD) {
        fprintf(stderr, "read through the mount: %ld (%s)\n", n, n < 0 ? strerror((int)-n) : "");
        return 2;
    }
    return tu_check(&k, buf, SHARD) == -1 ? 0 : 1;
}

/* Until the daemon counts n lookups that made their caller a waiter (the
 * reader parked), up to 10 s. */
static void await_waits(long long n)
{
    for (int i = 0; i < 1000 && fsfx_stat(&T.fx, "shardfs_waits_total") < n; i++)
        fsfx_sleep_ms(10);
    cr_assert_geq(fsfx_stat(&T.fx, "shardfs_waits_total"), n, "the read did not park");
}

/* The owner attached and holding the key Loading, a reader parked behind
 * it: *owner and *reader. */
static void owner_and_parked_reader(pid_t *owner, pid_t *reader)
{
    *owner = T.owner = tu_fork_attached(T.fx.sock, 0, own_key, NULL);
    for (int i = 0; i < 1000 && fsfx_stat(&T.fx, "shardfs_owner_loads_total") < 1; i++)
        fsfx_sleep_ms(10);
    cr_assert_eq(fsfx_stat(&T.fx, "shardfs_owner_loads_total"), 1, "the owner took no load");
    *reader = tu_fork(read_shard, NULL);
    await_waits(1);
    fsfx_sleep_ms(200); /* the settler asleep on the slot */
}

/* The reader's outcome within half the deadline: a held read waits it out. */
static void reader_gets_the_bytes(pid_t reader)
{
    int r = tu_wait_for(reader, (int64_t)WAIT_S / 2 * 1000000000ll);

    cr_assert_neq(r, -1, "the parked read was still waiting %d s later", WAIT_S / 2);
    cr_assert_eq(r, 0, "the parked read failed (%d)", r);
    cr_assert_geq(fsfx_stat(&T.fx, "shardfs_takeovers_total"), 1);
    cr_assert_eq(fsfx_stat(&T.fx, "shardfs_fs_wait_timeouts_total"), 0);
    cr_assert_eq(fsfx_stat(&T.fx, "shardfs_backend_loads_total"), 1, "the read loaded it");
}

TestSuite(fs_takeover, .init = setup, .fini = teardown, .timeout = 90);

Test(fs_takeover, a_parked_read_takes_over_from_an_owner_killed_mid_load)
{
    pid_t owner, reader;

    owner_and_parked_reader(&owner, &reader);
    kill(owner, SIGKILL);
    cr_assert_eq(tu_wait(owner), 128 + SIGKILL);
    T.owner = 0;
    reader_gets_the_bytes(reader);
    cr_assert_geq(fsfx_stat(&T.fx, "shardfs_reaped_total"), 1);
}

Test(fs_takeover, a_parked_read_takes_over_a_load_given_back_unpublished)
{
    pid_t owner, reader;

    owner_and_parked_reader(&owner, &reader);
    cr_assert_eq(write(T.go[1], "g", 1), 1);
    reader_gets_the_bytes(reader);
}

/* An update of a shard (truncate(2) to KEPT bytes: it copies the current
 * bytes, then stores the shard) behind another process's load of it waits
 * for that load like a read does, and starts from what the load gave: the
 * owner's published bytes, the store's when the owner gave the slot back
 * (the update loads it itself), or the owner's failure (EIO, nothing
 * stored). The exit status of the forked truncate: 0 or its errno. */
static int truncate_shard(void *arg)
{
    (void)arg;
    return truncate(fsfx_shard_path(&T.fx, BLOCK, 0), KEPT) == 0 ? 0 : errno;
}

/* The owner holding the key Loading, a truncate of it waiting; then the
 * owner does `what` ('p', 'g', 'f': see own_key); the truncate's status. */
static int update_behind_owner(char what)
{
    pid_t upd;
    int r;

    T.owner = tu_fork_attached(T.fx.sock, 0, own_key, NULL);
    for (int i = 0; i < 1000 && fsfx_stat(&T.fx, "shardfs_owner_loads_total") < 1; i++)
        fsfx_sleep_ms(10);
    cr_assert_eq(fsfx_stat(&T.fx, "shardfs_owner_loads_total"), 1, "the owner took no load");
    upd = tu_fork(truncate_shard, NULL);
    await_waits(1);
    cr_assert_eq(write(T.go[1], &what, 1), 1);
    r = tu_wait_for(upd, (int64_t)WAIT_S / 2 * 1000000000ll);
    cr_assert_neq(r, -1, "the update was still waiting %d s later", WAIT_S / 2);
    return r;
}

/* Shard (BLOCK, 0) through the mount: `head`'s first KEPT bytes (NULL: the
 * store's first version), zeros after; or the store's bytes when !kept. */
static void assert_shard(const uint8_t *head, bool cut)
{
    static uint8_t buf[SHARD], want[SHARD];
    struct sfs_key k = tu_key(BLOCK, 0);
    long n = fsfx_read_all(fsfx_shard_path(&T.fx, BLOCK, 0), buf, SHARD);

    cr_assert_eq(n, (long)SHARD, "read: %ld", n);
    tu_fill(&k, want, SHARD);
    if (head)
        memcpy(want, head, KEPT);
    if (cut)
        memset(want + KEPT, 0, SHARD - KEPT);
    cr_assert_eq(memcmp(buf, want, SHARD), 0, "the shard's bytes");
}

Test(fs_takeover, an_update_behind_a_load_starts_from_the_owners_bytes)
{
    uint8_t owners[KEPT];

    cr_assert_eq(update_behind_owner('p'), 0, "truncate behind a published load");
    memset(owners, OWNERS_BYTE, sizeof(owners));
    assert_shard(owners, true);
    cr_assert_eq(fsfx_stat(&T.fx, "shardfs_backend_loads_total"), 0, "nothing read the store");
}

Test(fs_takeover, an_update_behind_a_load_given_back_loads_it_itself)
{
    cr_assert_eq(update_behind_owner('g'), 0, "truncate behind a load given back");
    assert_shard(NULL, true);
    cr_assert_eq(fsfx_stat(&T.fx, "shardfs_backend_loads_total"), 1, "the update loaded it");
}

Test(fs_takeover, an_update_behind_a_failed_load_fails_and_stores_nothing)
{
    cr_assert_eq(update_behind_owner('f'), EIO, "truncate behind a failed load");
    kill(T.owner, SIGKILL); /* done: the read below loads the store's bytes again */
    tu_wait(T.owner);
    T.owner = 0;
    assert_shard(NULL, false);
}

/* The mount started again with these options (the store as it is). */
static void restart(const char *opts)
{
    if (T.fx.pid)
        cr_assert_eq(fsfx_stop(&T.fx, false, 10.0), 0);
    cr_assert_eq(fsfx_start(&T.fx, T.store, opts, 20.0, NULL), 0, "mount (log: %s)", T.fx.log);
}

/* A read parked behind an owner that neither publishes nor gives the slot
 * back (alive, holding it) fails ETIMEDOUT at wait_timeout, counted; the
 * owner's load is not disturbed. */
Test(fs_takeover, a_parked_read_behind_a_held_load_times_out)
{
    pid_t owner, reader;

    restart("capacity=4M,shard_size=64K,readahead=0,wait_timeout=1");
    owner_and_parked_reader(&owner, &reader);
    cr_assert_eq(tu_wait_for(reader, 10ll * 1000000000), 2, "the parked read did not fail");
    cr_assert_eq(fsfx_stat(&T.fx, "shardfs_fs_wait_timeouts_total"), 1);
    cr_assert_eq(fsfx_stat(&T.fx, "shardfs_takeovers_total"), 0);
    cr_assert_eq(fsfx_stat(&T.fx, "shardfs_backend_loads_total"), 0);
}

#define MANY 130 /* parked reads on distinct slots: more than one wait set (128) */

/* The owner of MANY keys: takes them all, publishes every one when told. */
static int own_many(struct sfs_cache *c, void *arg)
{
    static struct sfs_lease l[MANY];
    char b;

    (void)arg;
    for (uint32_t i = 0; i < MANY; i++) {
        struct sfs_key k = tu_key(BLOCK, i);

        if (sfs_cache_get(c, &k, 0, 0, &l[i]) != SFS_OWNER)
            return 2;
    }
    if (read(T.go[0], &b, 1) != 1)
        return 3;
    for (uint32_t i = 0; i < MANY; i++) {
        struct sfs_key k = tu_key(BLOCK, i);

        if (tu_publish(c, &k, &l[i]) != 0)
            return 4;
        sfs_cache_release(c, &l[i]);
    }
    pause();
    return 0;
}

/* A read of shard (BLOCK, arg): 0 for its right bytes, 1 for wrong ones,
 * 2 for an error. */
static int read_shard_n(void *arg)
{
    uint32_t s = (uint32_t)(uintptr_t)arg;
    struct sfs_key k = tu_key(BLOCK, s);
    static char buf[SHARD + 1];
    long n = fsfx_read_all(fsfx_shard_path(&T.fx, BLOCK, s), buf, sizeof(buf));

    if (n != (long)SHARD)
        return 2;
    return tu_check(&k, buf, SHARD) == -1 ? 0 : 1;
}

/* More reads parked on distinct slots than the settler's one wait covers
 * (SFS_WAIT_ANY_MAX): the ones beyond it are looked at by polling, and
 * every read gets its bytes once the owner publishes. */
Test(fs_takeover, reads_parked_beyond_one_wait_set_are_all_answered)
{
    static pid_t readers[MANY];

    cr_assert_eq(tu_store_write(T.store, BLOCK, 1, MANY, SHARD, NULL, NULL, false), 0);
    restart("capacity=16M,shard_size=64K,readahead=0,wait_timeout=20");
    T.owner = tu_fork_attached(T.fx.sock, 0, own_many, NULL);
    for (int i = 0; i < 1000 && fsfx_stat(&T.fx, "shardfs_owner_loads_total") < MANY; i++)
        fsfx_sleep_ms(10);
    cr_assert_eq(fsfx_stat(&T.fx, "shardfs_owner_loads_total"), MANY, "the owner took no load");
    for (uint32_t i = 0; i < MANY; i++)
        readers[i] = tu_fork(read_shard_n, (void *)(uintptr_t)i);
    await_waits(MANY);
    cr_assert_eq(write(T.go[1], "p", 1), 1);
    for (uint32_t i = 0; i < MANY; i++)
        cr_assert_eq(tu_wait_for(readers[i], 10ll * 1000000000), 0, "read of shard %u", i);
    cr_assert_eq(fsfx_stat(&T.fx, "shardfs_fs_wait_timeouts_total"), 0);
}

/* A shard an owner published shorter than a whole one (SHARD / 2 bytes):
 * reads through the mount end at its bytes, as at a shard's end. */
Test(fs_takeover, a_short_shard_reads_up_to_its_length)
{
    static uint8_t buf[256];
    int fd;

    T.owner = tu_fork_attached(T.fx.sock, 0, own_key, NULL);
    for (int i = 0; i < 1000 && fsfx_stat(&T.fx, "shardfs_owner_loads_total") < 1; i++)
        fsfx_sleep_ms(10);
    cr_assert_eq(fsfx_stat(&T.fx, "shardfs_owner_loads_total"), 1, "the owner took no load");
    cr_assert_eq(write(T.go[1], "h", 1), 1);
    fd = open(fsfx_shard_path(&T.fx, BLOCK, 0), O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open: %s", strerror(errno));
    /* The owner's bytes (a read before the publish waits for it). */
    cr_assert_eq(pread(fd, buf, 10, 0), 10);
    cr_assert(tu_all_bytes(buf, 10, OWNERS_BYTE), "not the owner's bytes");
    cr_assert_eq(pread(fd, buf, sizeof(buf), SHARD / 2 + 10), 0, "a read past its length");
    cr_assert_eq(pread(fd, buf, sizeof(buf), SHARD / 2 - 10), 10, "a read across its length");
    cr_assert(tu_all_bytes(buf, 10, OWNERS_BYTE), "its last bytes");
    close(fd);
    cr_assert_eq(fsfx_stat(&T.fx, "shardfs_backend_loads_total"), 0, "the store was read");
}
