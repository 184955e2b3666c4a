/* SPDX-License-Identifier: MIT */
/*
 * test_peer_gate_hosts.c - the gate's clean misses as the daemons count them
 * in /stats, through real mounts on two of tests/peerfx.h's hosts (network
 * namespaces joined by veth pairs, a shardfs daemon each).
 *
 * The owner's slot is made from outside: the test (root) opens the owner
 * daemon's peer region, its memfd "shardfs-peer", through /proc/<pid>/fd
 * and writes the slot header and payload as a writer would. One-slot
 * regions (peer_capacity = header + one shard, peer_ways = 1), so every key
 * of the owner lives in that slot. The reader's own store has the key with
 * its right bytes; the slot has other bytes under a header that passes
 * every check of the gate but one, so a reader that took them would fail
 * the byte check.
 */
#include "peerfx.h"
#include "peer_i.h"
#include "testutil.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define STRIDE (PEER_HDR_SIZE + SHARD) /* SHARD is a multiple of 64 */

/* The one slot of host's peer region, mapped shared with its daemon. */
static struct peer_slot_hdr *map_slot(int host)
{
    char dir[64], path[320], link[128];
    struct dirent *e;
    struct stat st;
    void *p;
    int fd = -1;
    DIR *d;

    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)H.fx[host].pid);
    d = opendir(dir);
    cr_assert(d, "%s: %s", dir, strerror(errno));
    while (fd < 0 && (e = readdir(d))) {
        ssize_t n;

        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        n = readlink(path, link, sizeof(link) - 1);
        if (n < 0)
            continue;
        link[n] = '\0';
        if (strcmp(link, "/memfd:shardfs-peer (deleted)") == 0)
            fd = open(path, O_RDWR | O_CLOEXEC);
    }
    closedir(d);
    cr_assert_geq(fd, 0, "no peer region among host %d's fds", host);
    cr_assert_eq(fstat(fd, &st), 0);
    cr_assert_eq(st.st_size, (off_t)STRIDE, "host %d's region is %lld bytes, not one slot", host,
                 (long long)st.st_size);
    p = mmap(NULL, STRIDE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    cr_assert_neq(p, MAP_FAILED);
    return p;
}

/* Write the slot as peer_slot_write does, but for the closing seq: key
 * hash of (b, 0), length len, bytes `pay` and their checksum, with seq
 * already set by the caller (odd: the writer has not finished). */
static void write_slot_body(struct peer_slot_hdr *s, uint64_t b, const uint8_t *pay, uint32_t len)
{
    struct sfs_key k = tu_key(b, 0);
    struct peer_hash h = peer_key_hash(&k);

    memcpy((uint8_t *)s + PEER_HDR_SIZE, pay, len);
    s->hash_lo = h.lo;
    s->hash_hi = h.hi;
    s->len = len;
    s->magic = PEER_MAGIC;
    s->csum = peer_checksum(pay, len);
}

static long long clean(int host, const char *reason)
{
    char name[96];

    snprintf(name, sizeof(name), "shardfs_peer_clean_misses_total{reason=\"%s\"}", reason);
    return fsfx_stat(&H.fx[host], name);
}

/* Host B's clean misses: `torn` and `length` as given, no other reason. */
static void expect_clean(long long torn, long long length)
{
    static const char *const reason[] = {"torn", "length", "other_key", "unreachable"};
    const long long want[] = {torn, length, 0, 0};

    for (size_t i = 0; i < sizeof(reason) / sizeof(reason[0]); i++) {
        long long v = clean(1, reason[i]);

        cr_assert_eq(v, want[i], "B's clean misses {reason=\"%s\"}: %lld, not %lld", reason[i], v,
                     want[i]);
    }
}

/* B's publish after a store load is asynchronous: until it has written or
 * lost `n` times in all (a liveness bound). */
static void wait_b_publishes(long long n)
{
    for (int i = 0; i < 2000; i++) {
        if (fsfx_stat(&H.fx[1], "shardfs_peer_writes_total") +
                fsfx_stat(&H.fx[1], "shardfs_peer_lost_writes_total") >=
            n)
            return;
        fsfx_sleep_ms(10);
    }
    cr_assert_fail("B did not try its publish %lld", n);
}

TestSuite(peer_gate_hosts, .init = peerfx_setup, .fini = peerfx_teardown, .timeout = 180);

/* Blocks X and Z, both owned by host A, are in host B's store. X is
 * published through A's mount; then A's slot is rewritten from outside as
 * a writer that stopped before its closing seq: seq odd, a whole payload
 * of other bytes with their checksum under X's header. B's read of X is a
 * `torn` clean miss, served from B's store byte-exact; B's own publish of X
 * loses to the busy slot (it never writes over a write in progress). Then
 * the slot is finished (seq even) as Z's with half a shard of other bytes:
 * B's read of Z is a `length` clean miss, served from its store, and its
 * publish then puts Z's whole shard in the slot. No other reason moves and
 * B counts no peer hit. */
Test(peer_gate_hosts, torn_and_wrong_length_slots_are_clean_misses_served_from_the_store,
     .timeout = 180)
{
    static uint8_t other[SHARD];
    uint64_t x = 0, z = 0, seq;
    struct peer_slot_hdr *s;
    struct sfs_key k;
    struct peer_hash h;
    char sizes[96];

    for (uint64_t b = 800; !z; b++)
        if (peerfx_owner_of(b, 0, 2) == 0) {
            if (!x)
                x = b;
            else
                z = b;
        }
    cr_assert_eq(tu_store_write(H.store[1], x, 1, 1, SHARD, NULL, NULL, false), 0);
    cr_assert_eq(tu_store_write(H.store[1], z, 1, 1, SHARD, NULL, NULL, false), 0);
    snprintf(sizes, sizeof(sizes), "capacity=16M,peer_capacity=%u,peer_ways=1",
             STRIDE); /* one bucket of one way */
    peerfx_start_host_with(0, sizes);
    peerfx_start_host_with(1, sizes);
    peerfx_write_shard(0, x, 0);
    for (int i = 0; i < 2000 && fsfx_stat(&H.fx[0], "shardfs_peer_writes_total") < 1; i++)
        fsfx_sleep_ms(10);
    cr_assert_eq(fsfx_stat(&H.fx[0], "shardfs_peer_writes_total"), 1);

    /* The slot A wrote is X's, whole (else the test proves nothing). */
    s = map_slot(0);
    k = tu_key(x, 0);
    h = peer_key_hash(&k);
    /* Acquire: A's daemon is done with the slot (its publish was counted). */
    seq = atomic_load_explicit(&s->seq, memory_order_acquire);
    cr_assert(seq != 0 && !(seq & 1), "A's slot seq %llu", (unsigned long long)seq);
    cr_assert(s->hash_lo == h.lo && s->hash_hi == h.hi && s->len == SHARD,
              "A's slot is not block %llu's", (unsigned long long)x);
    expect_clean(0, 0);

    /* Torn: seq odd, then the body, and no closing seq. Another shard's
     * bytes: the payload and checksum agree, only the seq tells. */
    k = tu_key(x, 1);
    tu_fill(&k, other, SHARD);
    /* Release: the odd seq is visible before any byte of the body. */
    atomic_store_explicit(&s->seq, seq + 1, memory_order_release);
    write_slot_body(s, x, other, SHARD);
    peerfx_read_exact(1, x, 0);
    expect_clean(1, 0);
    cr_assert_eq(fsfx_stat(&H.fx[1], "shardfs_peer_hits_total"), 0);
    wait_b_publishes(1);
    cr_assert_eq(fsfx_stat(&H.fx[1], "shardfs_peer_writes_total"), 0,
                 "B wrote over a slot mid-write");
    cr_assert_eq(atomic_load_explicit(&s->seq, memory_order_acquire), seq + 1);

    /* Length: Z's key with half a shard, checksummed, under an even seq. */
    k = tu_key(z, 1);
    tu_fill(&k, other, SHARD);
    write_slot_body(s, z, other, SHARD / 2);
    /* Release: the body is visible before the even seq that publishes it. */
    atomic_store_explicit(&s->seq, seq + 2, memory_order_release);
    peerfx_read_exact(1, z, 0);
    expect_clean(1, 1);
    cr_assert_eq(fsfx_stat(&H.fx[1], "shardfs_peer_hits_total"), 0);
    wait_b_publishes(2);
    cr_log_info("B: torn %lld, length %lld, other_key %lld, unreachable %lld, hits %lld; its "
                "publishes: %lld written, %lld lost",
                clean(1, "torn"), clean(1, "length"), clean(1, "other_key"),
                clean(1, "unreachable"), fsfx_stat(&H.fx[1], "shardfs_peer_hits_total"),
                fsfx_stat(&H.fx[1], "shardfs_peer_writes_total"),
                fsfx_stat(&H.fx[1], "shardfs_peer_lost_writes_total"));
    k = tu_key(z, 0);
    h = peer_key_hash(&k);
    seq = atomic_load_explicit(&s->seq, memory_order_acquire);
    cr_assert(seq > 0 && !(seq & 1), "A's slot seq %llu after B's publish",
              (unsigned long long)seq);
    cr_assert(s->hash_lo == h.lo && s->hash_hi == h.hi && s->len == SHARD,
              "B's publish of block %llu is not in A's slot", (unsigned long long)z);
    munmap(s, STRIDE);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(fsfx_stop(&H.fx[i], false, 20.0), 0, "host %d", i);
}
