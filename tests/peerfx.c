/* SPDX-License-Identifier: MIT */
/*
 * peerfx.c - the peer tier's hosts: network namespaces joined by veth pairs
 * to a bridge, a shardfs daemon per host (see peerfx.h).
 */
#include "peerfx.h"
#include "peer_fixture.h"
#include "testutil.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct peerfx H;

static const char *const ADDR[NHOST] = {"10.77.0.1:7001", "10.77.0.2:7001", "10.77.0.3:7001"};

/* The members file: the first n hosts. */
void peerfx_members_first(int n)
{
    FILE *f = fopen(H.members, "w");

    cr_assert(f);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s\n", ADDR[i]);
    fclose(f);
}

const char *peerfx_key_path(void)
{
    return H.key[0] ? H.key : NULL;
}

int peerfx_in_netns(const char *ns, int *saved)
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

void peerfx_back_to(int saved)
{
    cr_assert_eq(setns(saved, CLONE_NEWNET), 0, "setns back: %s", strerror(errno));
    close(saved);
}

static void netns_del_all(void)
{
    for (int i = 0; i < NHOST; i++)
        fsfx_sh("ip netns del %s 2>/dev/null", H.ns[i]);
    fsfx_sh("ip netns del %s 2>/dev/null", H.sw);
}

/* NHOST host namespaces, each with a veth pair to a bridge in a "switch"
 * namespace: 10.77.0.(i+1)/24 on host i. */
void peerfx_setup(void)
{
    int pid = getpid();
    bool ok;

    memset(&H, 0, sizeof(H));
    if (geteuid() != 0)
        cr_skip_test("needs root (network namespaces and veth pairs)");
    if (!fsfx_usable())
        cr_skip_test("FUSE is not usable here");
    if (fsfx_sh("command -v ip >/dev/null 2>&1") != 0)
        cr_skip_test("the `ip` tool (iproute2) is missing");
    snprintf(H.sw, sizeof(H.sw), "sfpsw%d", pid);
    ok = fsfx_sh("ip netns add %s && ip -n %s link add br0 type bridge && "
                 "ip -n %s link set br0 up",
                 H.sw, H.sw, H.sw) == 0;
    for (int i = 0; ok && i < NHOST; i++) {
        snprintf(H.ns[i], sizeof(H.ns[i]), "sfp%c%d", 'a' + i, pid);
        ok = fsfx_sh("ip netns add %s && ip link add sfh%d%d type veth peer name sfs%d%d && "
                     "ip link set sfh%d%d netns %s && ip link set sfs%d%d netns %s && "
                     "ip -n %s link set sfs%d%d master br0 && ip -n %s link set sfs%d%d up && "
                     "ip -n %s addr add 10.77.0.%d/24 dev sfh%d%d && "
                     "ip -n %s link set sfh%d%d up && ip -n %s link set lo up",
                     H.ns[i], i, pid, i, pid, i, pid, H.ns[i], i, pid, H.sw, H.sw, i, pid, H.sw, i,
                     pid, H.ns[i], i + 1, i, pid, H.ns[i], i, pid, H.ns[i]) == 0;
    }
    if (!ok) {
        netns_del_all();
        cr_skip_test("cannot create network namespaces, veth pairs and a bridge here");
    }
    H.up = true;
    /* The members' key: root's, 0600 (the daemons refuse a key others may
     * read). */
    snprintf(H.key, sizeof(H.key), "%s", fx_key_file());
    snprintf(H.members, sizeof(H.members), "%s", tu_path("members"));
    peerfx_members_first(2);
    for (int i = 0; i < NHOST; i++) {
        char tag[16];

        snprintf(tag, sizeof(tag), "store%c", 'A' + i);
        snprintf(H.store[i], sizeof(H.store[i]), "%s", tu_path(tag));
        cr_assert_eq(mkdir(H.store[i], 0755), 0);
        snprintf(tag, sizeof(tag), "mnt%c", 'A' + i);
        snprintf(H.fx[i].mnt, sizeof(H.fx[i].mnt), "%s", tu_path(tag));
        snprintf(tag, sizeof(tag), "log%c", 'A' + i);
        snprintf(H.fx[i].log, sizeof(H.fx[i].log), "%s", tu_path(tag));
        H.fx[i].bin = fsfx_daemon_bin(SHARDFS_BIN);
    }
}

void peerfx_teardown(void)
{
    for (int i = 0; i < NHOST; i++) {
        if (H.fx[i].pid)
            fsfx_stop(&H.fx[i], true, 10.0);
        if (H.fx[i].mnt[0])
            fsfx_cleanup(&H.fx[i], H.store[i][0] ? H.store[i] : NULL);
    }
    if (H.members[0])
        unlink(H.members);
    if (H.up)
        netns_del_all();
}

/* Host i's daemon with the cache and peer region `sizes` (capacity,
 * peer_capacity, peer_ways). */
void peerfx_start_host_with(int i, const char *sizes)
{
    char o[512];
    int saved, st = 0, r;

    snprintf(o, sizeof(o), "shard_size=%u,wait_timeout=20,peer_listen=%s,peers=%s,peer_key=%s,%s",
             SHARD, ADDR[i], H.members, H.key, sizes);
    cr_assert_eq(peerfx_in_netns(H.ns[i], &saved), 0, "setns %s", H.ns[i]);
    r = fsfx_start(&H.fx[i], H.store[i], o, 20.0, &st);
    peerfx_back_to(saved);
    cr_assert_eq(r, 0, "daemon %d did not mount (%d, status %d)", i, r, st);
}

void peerfx_start_host(int i)
{
    peerfx_start_host_with(i, "capacity=16M,peer_capacity=8M,peer_ways=4");
}

void peerfx_write_shard(int host, uint64_t b, uint32_t s)
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

void peerfx_read_exact(int host, uint64_t b, uint32_t s)
{
    static uint8_t buf[SHARD + 1];
    struct sfs_key k = tu_key(b, s);
    long n = fsfx_read_all(fsfx_shard_path(&H.fx[host], b, s), buf, sizeof(buf));

    cr_assert_eq(n, (long)SHARD, "block %llu shard %u: %ld", (unsigned long long)b, s, n);
    cr_assert_eq(tu_check(&k, buf, SHARD), -1, "block %llu shard %u: wrong bytes",
                 (unsigned long long)b, s);
}

/* Blocks b0 .. b0 + n - 1, one shard each, written through host A's mount;
 * returns once A has published them all (the publish is asynchronous). */
void peerfx_publish_blocks(uint64_t b0, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        peerfx_write_shard(0, b0 + i, 0);
    for (int i = 0; i < 2000 && fsfx_stat(&H.fx[0], "shardfs_peer_writes_total") < n; i++)
        fsfx_sleep_ms(10);
    cr_assert_geq(fsfx_stat(&H.fx[0], "shardfs_peer_writes_total"), n);
}

/* The owner of a key, as every host computes it. */
int peerfx_owner_of(uint64_t b, uint32_t s, int nmembers)
{
    char *m[] = {(char *)ADDR[0], (char *)ADDR[1], (char *)ADDR[2]};
    struct sfs_key k = tu_key(b, s);

    return fx_owner(m, (size_t)nmembers, &k);
}

/* The members file becomes the first n hosts with its mtime kept (only
 * SIGHUP, not the mtime check, makes a daemon re-read it), and every
 * running daemon is sent SIGHUP; they take it within a second. */
void peerfx_members_change(int n)
{
    struct stat st0;
    struct timespec t[2];

    cr_assert_eq(stat(H.members, &st0), 0);
    peerfx_members_first(n);
    t[0] = st0.st_atim;
    t[1] = st0.st_mtim;
    cr_assert_eq(utimensat(AT_FDCWD, H.members, t, 0), 0);
    for (int i = 0; i < NHOST; i++)
        if (H.fx[i].pid)
            cr_assert_eq(kill(H.fx[i].pid, SIGHUP), 0);
    /* Generous for a loaded machine. */
    fsfx_sleep_ms(3000);
    for (int i = 0; i < NHOST; i++)
        if (H.fx[i].pid)
            cr_assert_eq(kill(H.fx[i].pid, 0), 0, "host %d ended on SIGHUP", i);
}
