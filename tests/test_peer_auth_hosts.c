/* SPDX-License-Identifier: MIT */
/*
 * test_peer_auth_hosts.c - who may use a member's peer port: only members.
 * Two real daemons on two "hosts" (network namespaces, tests/peerfx.h), and
 * a real unprivileged user (nobody, by setuid in a forked child) on member
 * B's host, so from a member's own address: it speaks the peer protocol to
 * each key's owner and tries both to read the slots and to rewrite them
 * with bytes of its own. It must get no slot byte and land no write, while
 * the members keep serving each other byte-exact through both mounts.
 *
 * Without root or the `ip` tool the test is skipped (peerfx says which).
 */
#include "peerfx.h"
#include "peer_fixture.h"
#include "peer_i.h"
#include "testutil.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NB 8 /* blocks of one shard: one key each */

TestSuite(peer_auth_hosts, .init = peerfx_setup, .fini = peerfx_teardown, .timeout = 180);

static const char *const MEMBER[2] = {"10.77.0.1:7001", "10.77.0.2:7001"};

/* What the intruder got: slot reads that gave bytes, and writes the owner
 * took. */
struct loot {
    int reads, writes, key_readable, opened;
};

/* The intruder's attempts on key k at its owner: a get, then a write of
 * bytes of its own over the slot that names the key (or any way). */
static void intrude(struct loot *l, const struct sfs_key *k, const char *owner)
{
    static uint8_t buf[SHARD], evil[SHARD];
    struct peer_slot_hdr hdrs[PEER_WAYS_MAX];
    uint64_t after[PEER_WAYS_MAX], found = 0;
    struct peer_hash h = peer_key_hash(k);
    struct peer_conn c;
    int way;

    peer_conn_init(&c);
    if (peer_conn_open(&c, owner, 1000) == 0)
        l->opened++;
    if (peer_conn_get(&c, owner, 1000, &h, SHARD, buf) == PEER_HIT)
        l->reads++;
    peer_conn_close(&c);
    peer_conn_init(&c);
    if (peer_conn_open(&c, owner, 1000) < 0)
        return;
    uint64_t bucket = peer_bucket_of(&h, c.g.num_buckets);

    if (peer_conn_read_hdrs(&c, owner, 1000, bucket, hdrs, after) < 0)
        goto out;
    way = peer_find_way(hdrs, after, c.g.ways, &h, SHARD);
    if (way < 0)
        way = peer_pick_way(hdrs, after, c.g.ways, &h);
    if (way < 0)
        goto out;
    memset(evil, 0xEE, sizeof(evil));
    if (peer_conn_write(&c, owner, 1000, bucket, (uint32_t)way, after[way], &h, evil, SHARD,
                        UINT64_MAX / 2, &found) == 0)
        l->writes++;
out:
    peer_conn_close(&c);
}

/* In a child: enter host B's network namespace, become nobody, attack every
 * key at its owner; the loot comes back through a pipe. */
static struct loot intruder_on_b(const char *keyfile)
{
    struct loot l = {0};
    int p[2], st = 0, saved;
    pid_t pid;

    cr_assert_eq(pipe(p), 0);
    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        struct passwd *pw = getpwnam("nobody");

        close(p[0]);
        if (!pw || peerfx_in_netns(H.ns[1], &saved) < 0 || setgroups(0, NULL) < 0 ||
            setgid(pw->pw_gid) < 0 || setuid(pw->pw_uid) < 0 || getuid() == 0)
            tu_exit(2);
        /* The key is the daemons' alone. */
        if (keyfile) {
            int fd = open(keyfile, O_RDONLY);

            l.key_readable = fd >= 0;
            if (fd >= 0)
                close(fd);
        }
        for (uint64_t b = 0; b < NB; b++) {
            struct sfs_key k = tu_key(700 + b, 0);

            intrude(&l, &k, MEMBER[peerfx_owner_of(700 + b, 0, 2)]);
        }
        tu_exit(write(p[1], &l, sizeof(l)) == (ssize_t)sizeof(l) ? 0 : 3);
    }
    close(p[1]);
    cr_assert_eq(read(p[0], &l, sizeof(l)), (ssize_t)sizeof(l), "the intruder reported nothing");
    close(p[0]);
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "intruder status %#x", st);
    return l;
}

Test(peer_auth_hosts, a_local_user_on_a_member_host_can_neither_read_nor_write_slots,
     .timeout = 180)
{
    struct loot l;
    struct stat st;

    peerfx_start_host(0);
    peerfx_start_host(1);
    peerfx_publish_blocks(700, NB);

    l = intruder_on_b(peerfx_key_path());
    cr_log_info("intruder as nobody on host B: %d connections, %d of %d slot reads, %d of %d "
                "writes",
                l.opened, l.reads, NB, l.writes, NB);
    cr_assert_eq(l.key_readable, 0, "nobody can read the peer key");
    cr_assert_eq(l.reads, 0, "nobody read %d of %d slots", l.reads, NB);
    cr_assert_eq(l.writes, 0, "nobody rewrote %d of %d slots", l.writes, NB);
    cr_assert_eq(l.opened, 0, "a non-member was let past the hello");

    /* The members still serve each other every byte: B (whose store has
     * none of these blocks) from the peer tier, A from its cache. */
    for (uint64_t b = 0; b < NB; b++) {
        peerfx_read_exact(1, 700 + b, 0);
        peerfx_read_exact(0, 700 + b, 0);
    }
    cr_assert_neq(stat(fsfx_block_file(H.store[1], 700), &st), 0,
                  "host B's store has the block: the test proves nothing");
    cr_assert_eq(fsfx_stat(&H.fx[1], "shardfs_peer_hits_total"), NB);
    /* Where B's reads were served from: the peer tier, each one get. */
    cr_assert_eq(fsfx_stat(&H.fx[1], "shardfs_served_total{tier=\"peer\"}"), NB);
    cr_assert_eq(fsfx_stat(&H.fx[1], "shardfs_served_total{tier=\"store\"}"), 0);
    cr_assert_geq(fsfx_stat(&H.fx[1], "shardfs_peer_get_duration_seconds_count"), NB);
}
