/* SPDX-License-Identifier: MIT */
/*
 * test_peer_hosts.c - the peer tier between real daemons on "hosts": three
 * network namespaces (10.77.0.1..3), each with a veth pair to a bridge in a
 * fourth, "switch" namespace, each running its own shardfs daemon (the real
 * binary, through fsfixture) with its own posix store and -o peer_listen on
 * its own address.
 *
 * The hosts (namespaces, veth pairs, bridge, daemons) are tests/peerfx.h's,
 * created by the suite's init and removed by its fini; without root or the
 * `ip` tool every test is skipped with a message saying which is missing.
 */
#include "peerfx.h"
#include "peer_fixture.h"
#include "peer_i.h"
#include "testutil.h"

#include <shardfs/backend.h>

#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NSHARD 4

TestSuite(peer_hosts, .init = peerfx_setup, .fini = peerfx_teardown, .timeout = 180);

Test(peer_hosts, written_on_a_read_on_b_then_a_dies, .timeout = 180)
{
    const uint64_t B0 = 100, LATE = 500;
    struct stat st;
    long long hits, unreach;
    unsigned owned_by_a = 0;

    /* Host B's store has block LATE (and nothing of B0): it is read only
     * after host A is gone. */
    cr_assert_eq(tu_store_write(H.store[1], LATE, 1, NSHARD, SHARD, NULL, NULL, false), 0);
    peerfx_start_host(0);
    peerfx_start_host(1);

    for (uint32_t s = 0; s < NSHARD; s++)
        peerfx_write_shard(0, B0, s);
    /* The publish is asynchronous: wait for host A to have written all. */
    for (int i = 0; i < 2000 && fsfx_stat(&H.fx[0], "shardfs_peer_writes_total") < NSHARD; i++)
        fsfx_sleep_ms(10);
    cr_assert_geq(fsfx_stat(&H.fx[0], "shardfs_peer_writes_total"), NSHARD);

    /* Host B reads every byte; its store never had the block. */
    for (uint32_t s = 0; s < NSHARD; s++)
        peerfx_read_exact(1, B0, s);
    cr_assert_neq(stat(fsfx_block_file(H.store[1], B0), &st), 0,
                  "host B's store has the block: the test proves nothing");
    hits = fsfx_stat(&H.fx[1], "shardfs_peer_hits_total");
    cr_assert_eq(hits, NSHARD, "peer hits on host B: %lld", hits);

    /* Host A dies and its link goes down: its keys are clean misses on B,
     * served from B's store, each read well within a liveness bound. */
    for (uint32_t s = 0; s < NSHARD; s++)
        owned_by_a += peerfx_owner_of(LATE, s, 2) == 0;
    cr_assert_eq(kill(H.fx[0].pid, SIGKILL), 0);
    fsfx_sh("ip -n %s link set sfh0%d down", H.ns[0], getpid());
    for (uint32_t s = 0; s < NSHARD; s++) {
        double t0 = fsfx_now_s();

        peerfx_read_exact(1, LATE, s);
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

/* A third host joins: it finds every key the two others published where the
 * ring of three still puts it (with the others), and only its own share is
 * a miss (its region is new and empty; its store has nothing). */
Test(peer_hosts, a_joining_host_moves_only_its_share, .timeout = 180)
{
    const uint64_t B0 = 200;
    const unsigned NB = 24; /* blocks of one shard: one key each */
    unsigned mine = 0, others = 0;
    long long hits;

    peerfx_start_host(0);
    peerfx_start_host(1);
    peerfx_publish_blocks(B0, NB);

    /* C joins: only SIGHUP makes A and B re-read the file and let C in. The
     * daemons take SIGHUP as "re-read", not as a stop. */
    peerfx_members_change(3);
    peerfx_start_host(2);
    for (unsigned i = 0; i < NB; i++) {
        uint64_t b = B0 + i;

        if (peerfx_owner_of(b, 0, 3) == 2) {
            char *path = (char *)fsfx_shard_path(&H.fx[2], b, 0);
            static uint8_t buf[SHARD];

            /* Its share: a clean miss, and its store has nothing. */
            cr_assert_lt(fsfx_read_all(path, buf, SHARD), 0, "block %llu", (unsigned long long)b);
            mine++;
        } else {
            peerfx_read_exact(2, b, 0);
            others++;
        }
    }
    hits = fsfx_stat(&H.fx[2], "shardfs_peer_hits_total");
    cr_log_info("joiner: %u keys moved to it, %u found on the others, %lld peer hits", mine, others,
                hits);
    cr_assert_gt(others, 0);
    cr_assert_eq(hits, (long long)others);
    cr_assert_eq(fsfx_stop(&H.fx[2], false, 20.0), 0);
}

/* Host C leaves the members (the file loses it, SIGHUP) and comes back. While
 * it is out, only its share of the keys moves: every other key keeps its
 * owner and is a peer hit on B, byte-exact; C's keys are clean misses (the
 * owners the ring of two gives them never had them) and nobody asks C.
 * Once C is back, its keys go to it again, and its region, kept all along,
 * serves them to B byte-exact. */
Test(peer_hosts, a_host_leaving_and_rejoining_moves_only_its_share_and_back, .timeout = 180)
{
    const uint64_t B0 = 300;
    const unsigned NB = 24; /* blocks of one shard: one key each */
    unsigned c_share = 0;
    bool of_c[24];
    long long hits, unreach;

    peerfx_members_first(3);
    for (int i = 0; i < NHOST; i++)
        peerfx_start_host(i);
    peerfx_publish_blocks(B0, NB);

    peerfx_members_change(2);
    for (unsigned i = 0; i < NB; i++) {
        uint64_t b = B0 + i;
        int o3 = peerfx_owner_of(b, 0, 3), o2 = peerfx_owner_of(b, 0, 2);

        of_c[i] = o3 == 2;
        if (of_c[i]) {
            char *path = (char *)fsfx_shard_path(&H.fx[1], b, 0);
            static uint8_t buf[SHARD];

            cr_assert_lt(fsfx_read_all(path, buf, SHARD), 0, "block %llu", (unsigned long long)b);
            c_share++;
        } else {
            cr_assert_eq(o2, o3, "block %llu moved from host %d to %d", (unsigned long long)b, o3,
                         o2);
            peerfx_read_exact(1, b, 0);
        }
    }
    hits = fsfx_stat(&H.fx[1], "shardfs_peer_hits_total");
    unreach = fsfx_stat(&H.fx[1], "shardfs_peer_clean_misses_total{reason=\"unreachable\"}");
    cr_log_info("C out: %u of %u keys were C's (misses on B), %lld peer hits on B", c_share, NB,
                hits);
    cr_assert_gt(c_share, 0, "the ring gives C none of the %u keys: the test proves nothing", NB);
    cr_assert_lt(c_share, NB);
    cr_assert_eq(hits, (long long)(NB - c_share));
    cr_assert_eq(unreach, 0, "B asked a host that left");

    peerfx_members_change(3);
    for (unsigned i = 0; i < NB; i++)
        if (of_c[i])
            peerfx_read_exact(1, B0 + i, 0);
    hits = fsfx_stat(&H.fx[1], "shardfs_peer_hits_total") - hits;
    cr_log_info("C back: %lld of its %u keys served to B by it", hits, c_share);
    cr_assert_eq(hits, (long long)c_share);
    for (int i = 0; i < NHOST; i++)
        cr_assert_eq(fsfx_stop(&H.fx[i], false, 20.0), 0, "host %d", i);
}

/* The peer options are checked before anything starts: one line naming the
 * option, exit status 1, no mount (no namespaces needed). */
Test(peer_opts, bad_peer_options_are_refused_with_one_line, .timeout = 60)
{
    char store[128], key[160], loose[256];

    snprintf(store, sizeof(store), "%s", tu_path("store"));
    snprintf(key, sizeof(key), "%s/key", store);
    snprintf(loose, sizeof(loose), "peer_listen=127.0.0.1:7001,peer_key=%s", key);
    const char *bad[][2] = {
        {"peers=/nonexistent", "need -o peer_listen"},
        {"peer_listen=127.0.0.1:7001,peer_ways=0x", "peer_ways=0x"},
        {"peer_listen=127.0.0.1:7001,peer_capacity=lots", "peer_capacity=lots"},
        {"peer_listen=127.0.0.1:7001,peers=/nonexistent/members", "peers=/nonexistent"},
        {"peer_listen=127.0.0.1,peer_capacity=1M,peer_key=/dev/null",
         "-o peer_listen=127.0.0.1: peer spec: listen= wants"},
        /* Members authenticate each other: no key, no peer port. */
        {"peer_listen=127.0.0.1:7001", "needs -o peer_key=FILE"},
        {"peer_key=/dev/null", "need -o peer_listen"},
        {"peer_listen=127.0.0.1:7001,peer_key=/dev/null", "peer key /dev/null: not a regular"},
        {loose, "lets group or others at it"},
    };
    struct fsfx fx;
    int kfd;

    if (!fsfx_usable())
        cr_skip_test("FUSE is not usable here");
    cr_assert_eq(mkdir(store, 0755), 0);
    /* A key others may read is refused. */
    kfd = open(key, O_WRONLY | O_CREAT | O_EXCL, 0644);
    cr_assert_geq(kfd, 0);
    cr_assert_eq(write(kfd, "0123456789abcdef0123456789abcdef", 32), 32);
    cr_assert_eq(fchmod(kfd, 0644), 0);
    close(kfd);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int st = 0, r;

        memset(&fx, 0, sizeof(fx));
        snprintf(fx.mnt, sizeof(fx.mnt), "%s", tu_path("mnt"));
        snprintf(fx.log, sizeof(fx.log), "%s", tu_path("log"));
        fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
        r = fsfx_start(&fx, store, bad[i][0], 10.0, &st);
        cr_assert_eq(r, -ECHILD, "%s: started (%d)", bad[i][0], r);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "%s: status %d", bad[i][0], st);
        cr_assert_eq(fsfx_log_lines_with(&fx, bad[i][1]), 1, "%s: no line with '%s'", bad[i][0],
                     bad[i][1]);
        fsfx_cleanup(&fx, NULL);
    }
    unlink(key);
    fsfx_cleanup(&fx, store);
}

/* --- a stress across the namespaces: peer backends in processes of their
 * own, one per host, over mem: stores (no mounts: the peer tier alone) --- */

#define XS_PAY  (64u << 10)
#define XS_KEYS 6

struct xs {
    _Atomic bool stop;
    _Atomic uint64_t version, loads, hits, bad, wrote;
};

struct xs_thread {
    struct sfs_backend *be;
    struct xs *x;
    uint64_t seed;
};

static void *xs_writer(void *arg)
{
    struct xs_thread *t = arg;
    uint8_t *buf = malloc(XS_PAY);
    uint64_t st = t->seed;

    while (buf && !atomic_load(&t->x->stop)) {
        struct sfs_key k = tu_key(9000 + tu_rng_next(&st) % XS_KEYS, 0);
        const void *b = buf;
        int r;

        fx_vfill(&k, atomic_fetch_add(&t->x->version, 1) + 1, buf, XS_PAY);
        if (sfs_backend_peer_batch_set(t->be, &k, 1, &b, XS_PAY, &r) == 0 && r == 0)
            atomic_fetch_add(&t->x->wrote, 1);
    }
    free(buf);
    return NULL;
}

static void *xs_reader(void *arg)
{
    struct xs_thread *t = arg;
    uint8_t *buf = malloc(XS_PAY), *want = malloc(XS_PAY);
    uint64_t st = t->seed;

    while (buf && want && !atomic_load(&t->x->stop)) {
        struct sfs_key k = tu_key(9000 + tu_rng_next(&st) % XS_KEYS, 0);
        void *b = buf;
        int r;

        if (sfs_backend_peer_batch_get(t->be, &k, 1, &b, XS_PAY, &r) != 0)
            continue;
        atomic_fetch_add(&t->x->loads, 1);
        if (r != (int)XS_PAY)
            continue; /* a clean miss */
        if (!fx_vcheck(&k, buf, XS_PAY, want))
            atomic_fetch_add(&t->x->bad, 1);
        atomic_fetch_add(&t->x->hits, 1);
    }
    free(buf);
    free(want);
    return NULL;
}

/* A child in host i's namespace: a peer backend listening on addr, a writer
 * and (unless write_only) a reader, until x->stop. */
static pid_t xs_child(int i, const char *addr, const char *members, bool write_only, struct xs *x)
{
    int saved;
    pid_t pid;

    cr_assert_eq(peerfx_in_netns(H.ns[i], &saved), 0);
    pid = fork();
    if (pid == 0) {
        struct sfs_backend_params p = {.shard_size = XS_PAY};
        char spec[512];
        int e;
        struct sfs_backend *be;
        struct xs_thread t[4];
        pthread_t th[4];
        int nt = write_only ? 1 : 4;

        /* 4 buckets x 2 ways for 6 keys: constant evictions and write races. */
        snprintf(spec, sizeof(spec),
                 "peer:listen=%s,members=%s,key=%s,ways=2,capacity=%u,deadline_ms=300:mem:", addr,
                 members, peerfx_key_path(), 8u * (PEER_HDR_SIZE + XS_PAY));
        be = sfs_backend_open(spec, &p, NULL, 0, &e);
        if (!be)
            tu_exit(2);
        /* Two writers and two readers (the stopped writer: one writer). */
        for (int j = 0; j < nt; j++) {
            t[j] = (struct xs_thread){.be = be, .x = x, .seed = 11u + (unsigned)(i * 8 + j)};
            pthread_create(&th[j], NULL, j % 2 ? xs_reader : xs_writer, &t[j]);
        }
        for (int j = 0; j < nt; j++)
            pthread_join(th[j], NULL);
        sfs_backend_close(be);
        tu_exit(0);
    }
    peerfx_back_to(saved);
    cr_assert_gt(pid, 0);
    return pid;
}

/* Writers and readers on the three hosts rewrite and read 12 keys of 64 KiB
 * (every byte read checked: a whole version or a clean miss), while a fourth
 * writer, on host A, is stopped with SIGSTOP in the middle of its stream of
 * payloads (a 64 KiB write is mostly payload on the wire) and held: the
 * owner never applies a write whose payload did not all arrive, the readers
 * see no partial bytes, and the hosts keep serving each other. */
Test(peer_hosts, writers_and_readers_across_hosts_with_a_writer_stopped_mid_payload, .timeout = 180)
{
    struct xs *x =
        mmap(NULL, sizeof(*x), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    char members[128], addr[NHOST][32];
    pid_t pid[NHOST], w;
    uint64_t loads0, hits0;
    FILE *f;

    cr_assert_neq(x, MAP_FAILED);
    memset(x, 0, sizeof(*x));
    snprintf(members, sizeof(members), "%s", tu_path("xmembers"));
    f = fopen(members, "w");
    cr_assert(f);
    for (int i = 0; i < NHOST; i++) {
        snprintf(addr[i], sizeof(addr[i]), "10.77.0.%d:7101", i + 1);
        fprintf(f, "%s\n", addr[i]);
    }
    fclose(f);
    for (int i = 0; i < NHOST; i++)
        pid[i] = xs_child(i, addr[i], members, false, x);
    /* Not a member itself (its own region is never asked), on A's address. */
    w = xs_child(0, "10.77.0.1:7102", members, true, x);
    for (int i = 0; i < 3000 && atomic_load(&x->hits) < 1500; i++)
        fsfx_sleep_ms(10);
    cr_assert_eq(kill(w, SIGSTOP), 0);
    loads0 = atomic_load(&x->loads);
    hits0 = atomic_load(&x->hits);
    /* Served on while the stopped writer holds its connections (a liveness
     * bound, not a timing). */
    for (int i = 0; i < 3000 && atomic_load(&x->hits) < hits0 + 1500; i++)
        fsfx_sleep_ms(10);
    cr_assert_gt(atomic_load(&x->hits), hits0, "no hit while a writer was stopped");
    cr_assert_gt(atomic_load(&x->loads), loads0);
    kill(w, SIGKILL);
    waitpid(w, NULL, 0);
    atomic_store(&x->stop, true);
    for (int i = 0; i < NHOST; i++) {
        int st = 0;

        cr_assert_eq(waitpid(pid[i], &st, 0), pid[i]);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "host %d: status %d", i, st);
    }
    cr_log_info(
        "stress: %llu loads, %llu hits, %llu writes", (unsigned long long)atomic_load(&x->loads),
        (unsigned long long)atomic_load(&x->hits), (unsigned long long)atomic_load(&x->wrote));
    cr_assert_eq(atomic_load(&x->bad), 0, "%llu loads returned mixed bytes",
                 (unsigned long long)atomic_load(&x->bad));
    unlink(members);
    munmap(x, sizeof(*x));
}

/* --- a stress through the daemons and their mounts: writers through host
 * A's mount, readers through B's and C's, every byte checked --- */

#define DS_RECENT 96 /* readers pick among the last this many blocks written */

struct ds {
    _Atomic bool stop;
    _Atomic uint64_t next, written, reads, full, missing, bad, other;
    _Atomic int other_err;
};

struct ds_thread {
    struct ds *d;
    int host;
    uint64_t seed;
};

static const uint64_t DS_B0 = 1000000;

/* New blocks of one shard through A's mount (tu_fill: the key's bytes),
 * each written once; `written` counts those closed. */
static void *ds_writer(void *arg)
{
    struct ds_thread *t = arg;
    uint8_t *buf = malloc(SHARD);

    while (buf && !atomic_load(&t->d->stop)) {
        uint64_t i = atomic_fetch_add(&t->d->next, 1), b = DS_B0 + i;
        struct sfs_key k = tu_key(b, 0);
        const char *dir = fsfx_shard_path(&H.fx[t->host], b, -1);
        char blk[256];
        int fd;

        snprintf(blk, sizeof(blk), "%.*s", (int)(strlen(dir) - strlen("/shard")), dir);
        if ((mkdir(blk, 0755) < 0 && errno != EEXIST) || (mkdir(dir, 0755) < 0 && errno != EEXIST))
            break;
        tu_fill(&k, buf, SHARD);
        fd = open(fsfx_shard_path(&H.fx[t->host], b, 0), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            break;
        if (write(fd, buf, SHARD) != (ssize_t)SHARD || close(fd) != 0)
            break;
        /* Two writers finish out of order, so a reader may pick a block
         * still being written: an ENOENT like any other miss. */
        atomic_fetch_add(&t->d->written, 1);
    }
    free(buf);
    return NULL;
}

/* Reads of recent blocks through another host's mount: each read is the
 * whole shard, byte-exact, or ENOENT (not in the peer tier any more, and
 * not in that host's store). */
static void *ds_reader(void *arg)
{
    struct ds_thread *t = arg;
    uint8_t *buf = malloc(SHARD + 1);
    uint64_t st = t->seed;

    while (buf && !atomic_load(&t->d->stop)) {
        uint64_t w = atomic_load(&t->d->written), b;
        struct sfs_key k;
        long n;

        if (w == 0) {
            fsfx_sleep_ms(1);
            continue;
        }
        b = DS_B0 + (w > DS_RECENT ? w - DS_RECENT : 0) +
            tu_rng_next(&st) % (w < DS_RECENT ? w : DS_RECENT);
        k = tu_key(b, 0);
        n = fsfx_read_all(fsfx_shard_path(&H.fx[t->host], b, 0), buf, SHARD + 1);
        atomic_fetch_add(&t->d->reads, 1);
        if (n == (long)SHARD) {
            atomic_fetch_add(&t->d->full, 1);
            if (tu_check(&k, buf, SHARD) != -1)
                atomic_fetch_add(&t->d->bad, 1);
        } else if (n == -ENOENT) {
            atomic_fetch_add(&t->d->missing, 1);
        } else if (n >= 0) {
            atomic_fetch_add(&t->d->bad, 1); /* a short or long read: wrong bytes */
        } else {
            atomic_fetch_add(&t->d->other, 1);
            atomic_store(&t->d->other_err, (int)-n);
        }
    }
    free(buf);
    return NULL;
}

/* Three daemons over small caches (4 MiB: 64 shards of 64 KiB) and small
 * peer regions (2 MiB, 4 ways: 28 slots a host): constant evictions in
 * both. Two writers put new blocks through A's mount, as fast as they go;
 * two readers on B's mount and two on C's read recent ones, while A
 * publishes them to their owners, evicting older ones, and B and C evict
 * what they read. Every read through B or C is the block's bytes exactly or a clean
 * ENOENT; B and C read from the peer tier only (their stores stay empty). */
Test(peer_hosts, writers_on_a_mount_readers_on_the_others_see_every_byte_or_a_miss, .timeout = 180)
{
    struct ds d = {0};
    struct ds_thread t[6];
    pthread_t th[6];
    long long hb, hc;
    uint64_t w;
    DIR *dir;

    peerfx_members_first(3);
    for (int i = 0; i < NHOST; i++)
        peerfx_start_host_with(i, "capacity=4M,peer_capacity=2M,peer_ways=4");
    for (int j = 0; j < 6; j++) {
        t[j] =
            (struct ds_thread){.d = &d, .host = j < 2 ? 0 : 1 + j % 2, .seed = 77u + (unsigned)j};
        pthread_create(&th[j], NULL, j < 2 ? ds_writer : ds_reader, &t[j]);
    }
    /* A liveness bound, not a measurement: until enough reads were checked. */
    for (int i = 0; i < 1000 && (atomic_load(&d.reads) < 4000 || atomic_load(&d.written) < 400);
         i++)
        fsfx_sleep_ms(10);
    atomic_store(&d.stop, true);
    for (int j = 0; j < 6; j++)
        pthread_join(th[j], NULL);
    w = atomic_load(&d.written);
    hb = fsfx_stat(&H.fx[1], "shardfs_peer_hits_total");
    hc = fsfx_stat(&H.fx[2], "shardfs_peer_hits_total");
    cr_log_info(
        "%llu blocks written through A; %llu reads through B and C: %llu whole, %llu "
        "ENOENT, %llu wrong, %llu other; peer hits B %lld C %lld",
        (unsigned long long)w, (unsigned long long)atomic_load(&d.reads),
        (unsigned long long)atomic_load(&d.full), (unsigned long long)atomic_load(&d.missing),
        (unsigned long long)atomic_load(&d.bad), (unsigned long long)atomic_load(&d.other), hb, hc);
    cr_assert_eq(atomic_load(&d.bad), 0, "%llu reads returned wrong bytes",
                 (unsigned long long)atomic_load(&d.bad));
    cr_assert_eq(atomic_load(&d.other), 0, "%llu reads failed otherwise (last errno %d)",
                 (unsigned long long)atomic_load(&d.other), atomic_load(&d.other_err));
    cr_assert_gt(w, 0);
    cr_assert_gt(atomic_load(&d.full), 0);
    cr_assert_gt(hb, 0);
    cr_assert_gt(hc, 0);
    /* Whatever B and C read came from the peer tier: their stores hold no
     * block. */
    for (int i = 1; i < NHOST; i++) {
        char data[256];
        struct dirent *e;
        unsigned blocks = 0;

        snprintf(data, sizeof(data), "%s/data", H.store[i]);
        dir = opendir(data);
        while (dir && (e = readdir(dir)))
            blocks += e->d_name[0] != '.';
        if (dir)
            closedir(dir);
        cr_assert_eq(blocks, 0, "host %d's store has %u blocks", i, blocks);
    }
    for (int i = 0; i < NHOST; i++)
        cr_assert_eq(fsfx_stop(&H.fx[i], false, 20.0), 0, "host %d", i);
}

/* Another key in the slot, through the mounts: one-slot peer regions, so
 * block Y, published after block X by the same owner A, takes X's slot.
 * Host B's store has X: its read of Y (not in its store) is a peer hit;
 * its read of X asks A, finds Y's header, counts an `other_key` clean miss
 * and is served from the store, byte-exact, never Y's bytes. */
Test(peer_hosts, another_key_in_the_slot_is_a_clean_miss_served_from_the_store, .timeout = 180)
{
    uint64_t x = 0, y = 0;
    long long other, hits;
    char sizes[96];

    for (uint64_t b = 700; !y; b++)
        if (peerfx_owner_of(b, 0, 2) == 0) {
            if (!x)
                x = b;
            else
                y = b;
        }
    cr_assert_eq(tu_store_write(H.store[1], x, 1, 1, SHARD, NULL, NULL, false), 0);
    snprintf(sizes, sizeof(sizes), "capacity=16M,peer_capacity=%u,peer_ways=1",
             PEER_HDR_SIZE + SHARD); /* one bucket of one way */
    peerfx_start_host_with(0, sizes);
    peerfx_start_host_with(1, sizes);
    peerfx_write_shard(0, x, 0);
    peerfx_write_shard(0, y, 0);
    for (int i = 0; i < 2000 && fsfx_stat(&H.fx[0], "shardfs_peer_writes_total") < 2; i++)
        fsfx_sleep_ms(10);
    cr_assert_geq(fsfx_stat(&H.fx[0], "shardfs_peer_writes_total"), 2);

    /* Y first: B's read of X publishes X (what B's store gave it) into
     * that slot again. */
    peerfx_read_exact(1, y, 0);
    cr_assert_eq(fsfx_stat(&H.fx[1], "shardfs_peer_hits_total"), 1);
    peerfx_read_exact(1, x, 0);
    other = fsfx_stat(&H.fx[1], "shardfs_peer_clean_misses_total{reason=\"other_key\"}");
    hits = fsfx_stat(&H.fx[1], "shardfs_peer_hits_total");
    cr_assert_eq(other, 1, "other_key misses on B: %lld", other);
    cr_assert_eq(hits, 1, "B's read of X was a peer hit (%lld hits)", hits);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(fsfx_stop(&H.fx[i], false, 20.0), 0, "host %d", i);
}
