/* SPDX-License-Identifier: MIT */
/*
 * testutil.h - helpers shared by the test programs: unique names per test
 * process, keys and shard contents that are pure functions of the key, forking
 * real child processes (attached to a served cache, or not), reading what
 * leases are left, and holding or waiting for the server's reaper.
 */
#ifndef SHARDFS_TESTUTIL_H
#define SHARDFS_TESTUTIL_H

#include <shardfs/cache.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

/* A path unique to this process and call: /tmp/sfs-test-<pid>-<n>-<clock>-<tag>. */
const char *tu_path(const char *tag);

/* Block id number n (deterministic, distinct for distinct n). */
struct sfs_block_id tu_block(uint64_t n);
struct sfs_key tu_key(uint64_t block, uint32_t shard);

/* Fill / check len bytes that are a pure function of the key. check returns
 * the index of the first wrong byte, or -1 when all are right. */
void tu_fill(const struct sfs_key *k, void *buf, size_t len);
long tu_check(const struct sfs_key *k, const void *buf, size_t len);
/* Every one of the len bytes at buf is v (a buffer nothing may write). */
bool tu_all_bytes(const void *buf, size_t len, uint8_t v);

/* A small cache (ordinary memfds, no reserved pool unless given). */
struct sfs_cache *tu_cache(uint32_t nslots, uint32_t nreserved, uint64_t shard_size);

/* A check in a forked child, which never asserts (Criterion's asserts belong
 * to the test process): when cond is false, name it on stderr and return 1
 * from the child's function, for the parent to assert on its exit status. */
#define TU_CK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "child %d: check failed at line %d: %s\n", getpid(), __LINE__, #cond); \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* _exit(code) for a forked child; the coverage build (SFS_COVERAGE) writes
 * the child's counters first, which _exit alone would lose: the core code
 * the suite runs in its children counts. */
_Noreturn void tu_exit(int code);
/* Fork a child that runs fn(arg) and leaves by tu_exit with its return value. */
pid_t tu_fork(int (*fn)(void *arg), void *arg);
/* Print every thread's stack of process pid on stderr (gdb, when it is
 * installed; nothing otherwise), for a test that found it hung: the log then
 * shows where each thread waits. Bounded to 60 s. */
void tu_dump_stacks(pid_t pid);
/* Wait for a child; returns its exit status, or 128+signal. */
int tu_wait(pid_t pid);
/* The same with a time limit: a child that overruns is killed and the result
 * is -1 (a hang); -2 if it cannot be waited for. */
int tu_wait_for(pid_t pid, int64_t timeout_ns);

/* Fork a child that attaches to the cache served at path (device_id as for
 * sfs_cache_attach), runs body(c, arg) and _exits with its result; the child
 * closes the handle when body returns 0 and keeps it otherwise (a failed check
 * leaves the state it found). A child that cannot attach says why on stderr
 * and exits 10. */
pid_t tu_fork_attached(const char *path, int device_id, int (*body)(struct sfs_cache *c, void *arg),
                       void *arg);

/* Fill the slot of owner lease l with k's bytes and publish the whole shard;
 * returns sfs_cache_publish's result. */
int tu_publish(struct sfs_cache *c, const struct sfs_key *k, struct sfs_lease *l);

/* Load key as owner with the pattern and publish; for tests that need data. */
int tu_load(struct sfs_cache *c, const struct sfs_key *k);

/* Leases anywhere in the cache: the number of slots with a non-zero refcount;
 * *entries (when not NULL) gets the non-free lease-table entries of every
 * process record. Read with no lock: call when quiet. */
/* Leases on slot s now: its count and the hit lines' (slot_i.h). */
unsigned tu_leases_on(struct sfs_cache *c, uint32_t s);
unsigned tu_leases_left(struct sfs_cache *c, unsigned *entries);

/* xorshift64*: the next pseudo-random number of the sequence in *state
 * (non-zero). */
uint64_t tu_rng_next(uint64_t *state);

/*
 * The server's reaper. The server reaps a record as soon as its connection
 * closes (a thread of the serving process); tests that look at a dead
 * process's leases before they are reaped hold that reaper at the
 * "proc:reap" test point. tu_hold_reaper(true) holds every thread but the
 * caller's (reaps the caller makes pass) until tu_hold_reaper(false).
 * Criterion asserts: call from the test's own process.
 */
void tu_hold_reaper(bool on);
/* Wait until the server has declared n records dead (their connections
 * closed), at most 3 s; asserts. */
void tu_wait_marked_dead(struct sfs_cache *c, unsigned n);
/* Wait until stats count n reaped processes, at most 3 s; asserts. */
void tu_wait_reaped(struct sfs_cache *c, uint64_t n);

/* tu_block(n) in hex, as the store's file names and the mount's paths
 * spell it. */
void tu_block_hex(uint64_t n, char out[SFS_BLOCK_HEX_LEN + 1]);

/* The file of block number `block` in a posix store at dir (its default
 * layout: dir/data/<32 hex chars of tu_block(block)>). */
void tu_store_path(const char *dir, uint64_t block, char *out, size_t len);

/* The bytes of shard `shard` of block number `block` in a store: len bytes
 * at buf. NULL for tu_store_write: tu_fill() of tu_key(block, shard). */
typedef void tu_shard_fill_fn(uint64_t block, uint32_t shard, void *buf, size_t len, void *arg);

/* The one posix-store writer of the tests and benchmarks: blocks [first,
 * first + nblocks) of nshards shards of shard_size bytes each, in the
 * layout above (dir and dir/data created as needed), each file fsync'ed
 * when `sync`. Returns 0 or -errno; never asserts, so benchmarks use it
 * too. */
int tu_store_write(const char *dir, uint64_t first, uint64_t nblocks, uint32_t nshards,
                   uint32_t shard_size, tu_shard_fill_fn *fill, void *arg, bool sync);

#endif
