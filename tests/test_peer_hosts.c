/* SPDX-License-Identifier: MIT */
/*
 * test_peer_hosts.c - the peer tier between real daemons on "hosts": two
 * network namespaces joined by a veth pair (10.77.0.1 and 10.77.0.2), each
 * running its own shardfs daemon (the real binary, through fsfixture) with
 * its own posix store and -o peer_listen on its own address.
 *
 * The namespaces and the veth pair are created by the test and removed by
 * its teardown (ip netns del takes the veth ends with it). Traffic stays on
 * the veth. The test needs root and the `ip` tool; without them it is
 * skipped with a message saying which is missing. The daemons' mounts live
 * in the test's mount namespace; only their network is the namespace's
 * (the test enters it with setns() around the fork of each daemon).
 */
#include "fsfixture.h"
#include "peer_i.h"
#include "testutil.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARD  (64u * 1024)
#define NSHARD 4

static struct {
    bool up;
    char ns[2][32], members[128], store[2][128];
    struct fsfx fx[2];
} H;

static const char *const ADDR[2] = {"10.77.0.1:7001", "10.77.0.2:7001"};

static int in_netns(const char *ns, int *saved)
{
    char p[64];
    int fd;

    *saved = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    snprintf(p, sizeof(p), "/var/run/netns/%s", ns);
    fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || *saved < 0 || setns(fd, CLONE_NEWNET) < 0) {
        if (fd >= 0)
            close(fd);
        return -errno;
    }
    close(fd);
    return 0;
}

static void back_to(int saved)
{
    cr_assert_eq(setns(saved, CLONE_NEWNET), 0, "setns back: %s", strerror(errno));
    close(saved);
}

static void setup(void)
{
    int pid = getpid();

    memset(&H, 0, sizeof(H));
    if (geteuid() != 0)
        cr_skip_test("needs root (network namespaces and veth pairs)");
    if (!fsfx_usable())
        cr_skip_test("FUSE is not usable here");
    if (fsfx_sh("command -v ip >/dev/null 2>&1") != 0)
        cr_skip_test("the `ip` tool (iproute2) is missing");
    snprintf(H.ns[0], sizeof(H.ns[0]), "sfspa%d", pid);
    snprintf(H.ns[1], sizeof(H.ns[1]), "sfspb%d", pid);
    if (fsfx_sh("ip netns add %s && ip netns add %s && "
                "ip link add sfa%d type veth peer name sfb%d && "
                "ip link set sfa%d netns %s && ip link set sfb%d netns %s && "
                "ip -n %s addr add 10.77.0.1/24 dev sfa%d && "
                "ip -n %s addr add 10.77.0.2/24 dev sfb%d && "
                "ip -n %s link set sfa%d up && ip -n %s link set sfb%d up && "
                "ip -n %s link set lo up && ip -n %s link set lo up",
                H.ns[0], H.ns[1], pid, pid, pid, H.ns[0], pid, H.ns[1], H.ns[0], pid, H.ns[1], pid,
                H.ns[0], pid, H.ns[1], pid, H.ns[0], H.ns[1]) != 0) {
        fsfx_sh("ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", H.ns[0], H.ns[1]);
        cr_skip_test("cannot create network namespaces and a veth pair here");
    }
    H.up = true;
    snprintf(H.members, sizeof(H.members), "%s", tu_path("members"));
    {
        FILE *f = fopen(H.members, "w");

        cr_assert(f);
        fprintf(f, "%s\n%s\n", ADDR[0], ADDR[1]);
        fclose(f);
    }
    for (int i = 0; i < 2; i++) {
        snprintf(H.store[i], sizeof(H.store[i]), "%s", tu_path(i ? "storeB" : "storeA"));
        cr_assert_eq(mkdir(H.store[i], 0755), 0);
        snprintf(H.fx[i].mnt, sizeof(H.fx[i].mnt), "%s", tu_path(i ? "mntB" : "mntA"));
        snprintf(H.fx[i].log, sizeof(H.fx[i].log), "%s", tu_path(i ? "logB" : "logA"));
        H.fx[i].bin = fsfx_daemon_bin(SHARDFS_BIN);
    }
}

static void teardown(void)
{
    for (int i = 0; i < 2; i++) {
        if (H.fx[i].pid)
            fsfx_stop(&H.fx[i], true, 10.0);
        if (H.fx[i].mnt[0])
            fsfx_cleanup(&H.fx[i], H.store[i][0] ? H.store[i] : NULL);
    }
    if (H.members[0])
        unlink(H.members);
    if (H.up)
        fsfx_sh("ip netns del %s; ip netns del %s", H.ns[0], H.ns[1]);
}

static void start_host(int i)
{
    char o[512];
    int saved, st = 0, r;

    snprintf(o, sizeof(o),
             "shard_size=%u,capacity=16M,wait_timeout=20,peer_listen=%s,peers=%s,"
             "peer_capacity=8M,peer_ways=4",
             SHARD, ADDR[i], H.members);
    cr_assert_eq(in_netns(H.ns[i], &saved), 0, "setns %s", H.ns[i]);
    r = fsfx_start(&H.fx[i], H.store[i], o, 20.0, &st);
    back_to(saved);
    cr_assert_eq(r, 0, "daemon %d did not mount (%d, status %d)", i, r, st);
}

static void write_shard(int host, uint64_t b, uint32_t s)
{
    static uint8_t buf[SHARD];
    struct sfs_key k = tu_key(b, s);
    int fd;

    tu_fill(&k, buf, SHARD);
    cr_assert_eq(fsfx_sh("mkdir -p %s", fsfx_shard_path(&H.fx[host], b, -1)), 0);
    fd = open(fsfx_shard_path(&H.fx[host], b, s), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_geq(fd, 0, "open: %s", strerror(errno));
    cr_assert_eq(write(fd, buf, SHARD), (ssize_t)SHARD);
    cr_assert_eq(close(fd), 0);
}

static void read_exact(int host, uint64_t b, uint32_t s)
{
    static uint8_t buf[SHARD + 1];
    struct sfs_key k = tu_key(b, s);
    long n = fsfx_read_all(fsfx_shard_path(&H.fx[host], b, s), buf, sizeof(buf));

    cr_assert_eq(n, (long)SHARD, "block %llu shard %u: %ld", (unsigned long long)b, s, n);
    cr_assert_eq(tu_check(&k, buf, SHARD), -1, "block %llu shard %u: wrong bytes",
                 (unsigned long long)b, s);
}

/* The owner of a key, as every host computes it. */
static int owner_of(uint64_t b, uint32_t s)
{
    char *m[] = {(char *)ADDR[0], (char *)ADDR[1]};
    struct peer_ring r;
    struct sfs_key k = tu_key(b, s);
    struct peer_hash h = peer_key_hash(&k);
    int o;

    cr_assert_eq(peer_ring_build(&r, m, 2), 0);
    o = peer_ring_owner(&r, &h);
    peer_ring_free(&r);
    return o;
}

TestSuite(peer_hosts, .init = setup, .fini = teardown, .timeout = 180);

Test(peer_hosts, written_on_a_read_on_b_then_a_dies, .timeout = 180)
{
    const uint64_t B0 = 100, LATE = 500;
    struct stat st;
    long long hits, unreach;
    unsigned owned_by_a = 0;

    /* Host B's store has block LATE (and nothing of B0): it is read only
     * after host A is gone. */
    cr_assert_eq(tu_store_write(H.store[1], LATE, 1, NSHARD, SHARD, NULL, NULL, false), 0);
    start_host(0);
    start_host(1);

    for (uint32_t s = 0; s < NSHARD; s++)
        write_shard(0, B0, s);
    /* The publish is asynchronous: wait for host A to have written all. */
    for (int i = 0; i < 2000 && fsfx_stat(&H.fx[0], "shardfs_peer_writes_total") < NSHARD; i++)
        fsfx_sleep_ms(10);
    cr_assert_geq(fsfx_stat(&H.fx[0], "shardfs_peer_writes_total"), NSHARD);

    /* Host B reads every byte; its store never had the block. */
    for (uint32_t s = 0; s < NSHARD; s++)
        read_exact(1, B0, s);
    cr_assert_neq(stat(fsfx_block_file(H.store[1], B0), &st), 0,
                  "host B's store has the block: the test proves nothing");
    hits = fsfx_stat(&H.fx[1], "shardfs_peer_hits_total");
    cr_assert_eq(hits, NSHARD, "peer hits on host B: %lld", hits);

    /* Host A dies and its link goes down: its keys are clean misses on B,
     * served from B's store, each read well within a liveness bound. */
    for (uint32_t s = 0; s < NSHARD; s++)
        owned_by_a += owner_of(LATE, s) == 0;
    cr_assert_eq(kill(H.fx[0].pid, SIGKILL), 0);
    fsfx_sh("ip -n %s link set sfa%d down", H.ns[0], getpid());
    for (uint32_t s = 0; s < NSHARD; s++) {
        double t0 = fsfx_now_s();

        read_exact(1, LATE, s);
        /* Generous: the per-member deadline is 200 ms. */
        cr_assert_lt(fsfx_now_s() - t0, 5.0, "shard %u took %.1f s", s, fsfx_now_s() - t0);
    }
    unreach = fsfx_stat(&H.fx[1], "shardfs_peer_clean_misses_total{reason=\"unreachable\"}");
    cr_log_info("peer hits on B %lld; after A died: %u of %u keys owned by A, %lld unreachable",
                hits, owned_by_a, NSHARD, unreach);
    if (owned_by_a)
        cr_assert_gt(unreach, 0, "no unreachable miss counted (%u keys owned by A)", owned_by_a);
    /* Host B stops cleanly (a sanitizer daemon's report would make it fail). */
    cr_assert_eq(fsfx_stop(&H.fx[1], false, 20.0), 0);
}
