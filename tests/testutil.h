/* SPDX-License-Identifier: MIT */
/*
 * testutil.h - helpers shared by the test programs: unique names per test
 * process, keys and shard contents that are pure functions of the key, and
 * forking real child processes.
 */
#ifndef SHARDFS_TESTUTIL_H
#define SHARDFS_TESTUTIL_H

#include <shardfs/cache.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* A path unique to this process and call: /tmp/sfs-test-<pid>-<n>-<tag>. */
const char *tu_path(const char *tag);

/* Block id number n (deterministic, distinct for distinct n). */
struct sfs_block_id tu_block(uint64_t n);
struct sfs_key tu_key(uint64_t block, uint32_t shard);

/* Fill / check len bytes that are a pure function of the key. check returns
 * the index of the first wrong byte, or -1 when all are right. */
void tu_fill(const struct sfs_key *k, void *buf, size_t len);
long tu_check(const struct sfs_key *k, const void *buf, size_t len);

/* A small cache (ordinary memfds, no reserved pool unless given). */
struct sfs_cache *tu_cache(uint32_t nslots, uint32_t nreserved, uint64_t shard_size);

/* Fork a child that runs fn(arg) and _exits with its return value. */
pid_t tu_fork(int (*fn)(void *arg), void *arg);
/* Wait for a child; returns its exit status, or 128+signal. */
int tu_wait(pid_t pid);
/* The same with a time limit: a child that overruns is killed and the result
 * is -1 (a hang); -2 if it cannot be waited for. */
int tu_wait_for(pid_t pid, int64_t timeout_ns);

/* Load key as owner with the pattern and publish; for tests that need data. */
int tu_load(struct sfs_cache *c, const struct sfs_key *k);

#endif
