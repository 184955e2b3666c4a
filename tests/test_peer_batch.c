/* SPDX-License-Identifier: MIT */
/*
 * test_peer_batch.c - the peer tier's batch API (HiCache's batch_get,
 * batch_set, batch_exists) over real peer servers on loopback: the answers
 * per key across owners, one round trip per owner host per batch (two for
 * a set), a get in one round trip, and an owner that stops answering in the
 * middle of a batch: its keys are clean misses within the deadline, the
 * other owners' keys are served.
 */
#include "peer_fixture.h"
#include "peer_i.h"
#include "testutil.h"

#include <shardfs/backend.h>

#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define NK 48

static void ring_of(struct peer_ring *r, struct host *h, int n)
{
    char *names[8];

    for (int i = 0; i < n; i++)
        names[i] = h[i].addr;
    cr_assert_eq(peer_ring_build(r, names, (size_t)n), 0);
}

static int owner_of(const struct peer_ring *r, const struct sfs_key *k)
{
    struct peer_hash h = peer_key_hash(k);

    return peer_ring_owner(r, &h);
}

/* How many distinct members other than self own keys[0..n). */
static unsigned remote_owners(const struct peer_ring *r, const struct sfs_key *keys, size_t n,
                              int self)
{
    bool seen[8] = {false};
    unsigned c = 0;

    for (size_t i = 0; i < n; i++) {
        int o = owner_of(r, &keys[i]);

        if (o != self && !seen[o]) {
            seen[o] = true;
            c++;
        }
    }
    return c;
}

static uint64_t trips(struct sfs_backend *be)
{
    struct sfs_peer_stats st;

    cr_assert_eq(sfs_backend_peer_stats(be, &st), 0);
    return st.round_trips;
}

Test(peer_batch, get_set_exists_across_three_owners, .timeout = 60)
{
    struct host h[3];
    const char *members = tu_path("members");
    struct peer_ring ring;
    struct sfs_key keys[NK + 1];
    uint8_t *in = malloc((size_t)(NK + 1) * PAY), *out = malloc((size_t)(NK + 1) * PAY);
    const void *ib[NK + 1];
    void *ob[NK + 1];
    int res[NK + 1];
    unsigned owned[3] = {0};
    uint64_t t0;

    cr_assert(in && out);
    open_hosts(h, 3, members, "mem:");
    ring_of(&ring, h, 3);
    for (unsigned i = 0; i < NK + 1; i++) {
        keys[i] = tu_key(200 + i, i % 4);
        tu_fill(&keys[i], in + (size_t)i * PAY, PAY);
        ib[i] = in + (size_t)i * PAY;
        ob[i] = out + (size_t)i * PAY;
        owned[owner_of(&ring, &keys[i])]++;
    }
    for (int i = 0; i < 3; i++)
        cr_assert_gt(owned[i], 0, "host %d owns none of the keys", i);
    /* Host A publishes NK keys: two round trips per other owner host. */
    t0 = trips(h[0].be);
    cr_assert_eq(sfs_backend_peer_batch_set(h[0].be, keys, NK, ib, PAY, res), 0);
    for (unsigned i = 0; i < NK; i++)
        cr_assert_eq(res[i], 0, "set of key %u: %d", i, res[i]);
    cr_assert_eq(trips(h[0].be) - t0, 2 * remote_owners(&ring, keys, NK, 0));
    /* Host B reads them all back, and one key nobody wrote: one round trip
     * per other owner host for the whole batch. */
    memset(out, 0, (size_t)(NK + 1) * PAY);
    t0 = trips(h[1].be);
    cr_assert_eq(sfs_backend_peer_batch_get(h[1].be, keys, NK + 1, ob, PAY, res), 0);
    cr_assert_eq(trips(h[1].be) - t0, remote_owners(&ring, keys, NK + 1, 1));
    for (unsigned i = 0; i < NK; i++) {
        cr_assert_eq(res[i], (int)PAY, "get of key %u: %d", i, res[i]);
        cr_assert_eq(tu_check(&keys[i], ob[i], PAY), -1, "key %u bytes", i);
    }
    cr_assert_eq(res[NK], -ENOENT);
    /* batch_exists: how many in a row from the start. */
    cr_assert_eq(sfs_backend_peer_batch_exists(h[2].be, keys, NK, PAY), NK);
    {
        struct sfs_key part[6] = {keys[0], keys[1], keys[2], keys[NK], keys[3], keys[4]};

        cr_assert_eq(sfs_backend_peer_batch_exists(h[2].be, part, 6, PAY), 3);
        cr_assert_eq(sfs_backend_peer_batch_exists(h[2].be, part + 3, 3, PAY), 0);
        cr_assert_eq(sfs_backend_peer_batch_exists(h[2].be, part, 0, PAY), 0);
        /* Another length is not the key's page. */
        cr_assert_eq(sfs_backend_peer_batch_exists(h[2].be, part, 3, PAY / 2), 0);
    }
    t0 = trips(h[2].be);
    cr_assert_eq(sfs_backend_peer_batch_exists(h[2].be, keys, NK, PAY), NK);
    cr_assert_eq(trips(h[2].be) - t0, remote_owners(&ring, keys, NK, 2));
    /* Not a peer backend. */
    {
        struct sfs_backend_params p = {.shard_size = PAY};
        int e;
        struct sfs_backend *mem = sfs_backend_open("mem:", &p, NULL, 0, &e);

        cr_assert_eq(sfs_backend_peer_batch_get(mem, keys, 1, ob, PAY, res), -EINVAL);
        sfs_backend_close(mem);
    }
    peer_ring_free(&ring);
    for (int i = 0; i < 3; i++)
        sfs_backend_close(h[i].be);
    unlink(members);
    free(in);
    free(out);
}

/* A single get of a key another host owns is one round trip (READ_GET). */
Test(peer_batch, a_get_is_one_round_trip, .timeout = 60)
{
    struct host h[2];
    const char *members = tu_path("members");
    struct peer_ring ring;
    uint8_t in[PAY], out[PAY];
    struct sfs_key k;
    uint64_t t0;
    unsigned i = 0;

    open_hosts(h, 2, members, "mem:");
    ring_of(&ring, h, 2);
    do
        k = tu_key(900 + i++, 0);
    while (owner_of(&ring, &k) != 0);
    tu_fill(&k, in, PAY);
    cr_assert_eq(sfs_backend_dump_sync(h[0].be, &k, in, PAY), PAY);
    wait_writes(h[0].be, 1);
    t0 = trips(h[1].be);
    cr_assert_eq(sfs_backend_load_sync(h[1].be, &k, out, PAY), PAY);
    cr_assert_eq(tu_check(&k, out, PAY), -1);
    cr_assert_eq(trips(h[1].be) - t0, 1);
    peer_ring_free(&ring);
    sfs_backend_close(h[0].be);
    sfs_backend_close(h[1].be);
    unlink(members);
}

/* Two keys of one batch that land in the same bucket of the same owner
 * take two ways: one header read and one write round, no retry. */
Test(peer_batch, keys_of_one_bucket_in_a_batch_take_distinct_ways, .timeout = 60)
{
    struct host h[2];
    const char *members = tu_path("members");
    struct peer_ring ring;
    struct sfs_key keys[2];
    uint8_t in[2][PAY], out[2][PAY];
    const void *ib[2] = {in[0], in[1]};
    void *ob[2] = {out[0], out[1]};
    int res[2];
    char geom[64];
    uint64_t t0;
    unsigned found = 0;

    /* One bucket of two ways: every key of an owner lands in it. */
    snprintf(geom, sizeof(geom), "ways=2,capacity=%u", 2u * ((PEER_HDR_SIZE + PAY + 63) & ~63u));
    open_hosts_geom(h, 2, members, "mem:", geom);
    ring_of(&ring, h, 2);
    for (unsigned i = 0; found < 2; i++) {
        struct sfs_key k = tu_key(4000 + i, 0);

        if (owner_of(&ring, &k) == 1)
            keys[found++] = k;
    }
    for (int i = 0; i < 2; i++)
        tu_fill(&keys[i], in[i], PAY);
    t0 = trips(h[0].be);
    cr_assert_eq(sfs_backend_peer_batch_set(h[0].be, keys, 2, ib, PAY, res), 0);
    cr_assert_eq(res[0], 0);
    cr_assert_eq(res[1], 0);
    cr_assert_eq(trips(h[0].be) - t0, 2, "the second key retried");
    cr_assert_eq(sfs_backend_peer_batch_get(h[0].be, keys, 2, ob, PAY, res), 0);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(res[i], (int)PAY);
        cr_assert_eq(tu_check(&keys[i], out[i], PAY), -1);
    }
    peer_ring_free(&ring);
    sfs_backend_close(h[0].be);
    sfs_backend_close(h[1].be);
    unlink(members);
}

/* A member that greets and then never reads nor answers (a stopped
 * process, a dead link): held open until the test ends. */
struct mute {
    int lfd, fd;
    pthread_t t;
    _Atomic bool stop;
    bool half;    /* reads one request, answers it up to half its payload */
    bool trickle; /* then one more byte every 50 ms */
};

static void *mute_main(void *arg)
{
    struct mute *m = arg;
    struct peer_hello hello = {.magic = PEER_MAGIC, .version = PEER_VERSION};
    uint8_t hw[PEER_HELLO_WIRE];

    cr_assert_eq(
        peer_geometry_make(16 * 4 * ((PEER_HDR_SIZE + PAY + 63) & ~63ull), 4, PAY, &hello.g), 0);
    peer_hello_enc(hw, &hello);
    while (!atomic_load(&m->stop)) {
        int fd = accept(m->lfd, NULL, NULL);

        if (fd < 0)
            continue;
        send(fd, hw, sizeof(hw), MSG_NOSIGNAL);
        if (m->half) {
            uint8_t q[PEER_REQ_WIRE], *a = calloc(1, PEER_REP_WIRE + 5 * PEER_HDR_WIRE + PAY / 2);
            struct peer_rep rep = {.magic = PEER_MAGIC, .status = 0};

            cr_assert(a);
            peer_rep_enc(a, &rep);
            if (recv(fd, q, sizeof(q), MSG_WAITALL) == (ssize_t)sizeof(q))
                send(fd, a, PEER_REP_WIRE + 5 * PEER_HDR_WIRE + PAY / 2, MSG_NOSIGNAL);
            for (int i = 0; m->trickle && i < 200 && !atomic_load(&m->stop); i++) {
                usleep(50 * 1000);
                if (send(fd, a, 1, MSG_NOSIGNAL) != 1)
                    break;
            }
            free(a);
        }
        if (m->fd >= 0)
            close(m->fd);
        m->fd = fd; /* held, never read */
    }
    return NULL;
}

Test(peer_batch, a_mute_owner_is_a_clean_miss_within_the_deadline, .timeout = 60)
{
    struct host h[3]; /* h[2]: the mute member */
    const char *members = tu_path("members");
    struct sfs_backend_params p = {.shard_size = PAY};
    struct peer_ring ring;
    struct mute mu = {.fd = -1};
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    struct sfs_key keys[NK];
    uint8_t *in = malloc((size_t)NK * PAY), *out = malloc((size_t)NK * PAY);
    const void *ib[NK];
    void *ob[NK];
    int res[NK];
    unsigned mute_keys = 0;
    struct sfs_peer_stats st;
    int64_t t0;

    cr_assert(in && out);
    mu.lfd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_eq(bind(mu.lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(listen(mu.lfd, 4), 0);
    cr_assert_eq(getsockname(mu.lfd, (struct sockaddr *)&a, &l), 0);
    {
        struct timeval tv = {.tv_sec = 0, .tv_usec = 100000};

        setsockopt(mu.lfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    }
    pthread_create(&mu.t, NULL, mute_main, &mu);
    for (int i = 0; i < 2; i++)
        snprintf(h[i].addr, sizeof(h[i].addr), "127.0.0.1:%u", free_port());
    snprintf(h[2].addr, sizeof(h[2].addr), "127.0.0.1:%u", ntohs(a.sin_port));
    write_members(members, h, 3);
    for (int i = 0; i < 2; i++) {
        char spec[512], err[256] = "";
        int e;

        snprintf(spec, sizeof(spec),
                 "peer:listen=%s,members=%s,ways=4,capacity=4M,deadline_ms=200:mem:", h[i].addr,
                 members);
        h[i].be = sfs_backend_open(spec, &p, err, sizeof(err), &e);
        cr_assert(h[i].be, "%s: %s", spec, err);
    }
    ring_of(&ring, h, 3);
    for (unsigned i = 0; i < NK; i++) {
        keys[i] = tu_key(600 + i, 0);
        tu_fill(&keys[i], in + (size_t)i * PAY, PAY);
        ib[i] = in + (size_t)i * PAY;
        ob[i] = out + (size_t)i * PAY;
        mute_keys += owner_of(&ring, &keys[i]) == 2;
    }
    cr_assert(mute_keys > 0 && mute_keys < NK);
    /* The mute owner's writes fail; the others land. */
    cr_assert_eq(sfs_backend_peer_batch_set(h[0].be, keys, NK, ib, PAY, res), 0);
    for (unsigned i = 0; i < NK; i++)
        cr_assert_eq(res[i], owner_of(&ring, &keys[i]) == 2 ? -EHOSTUNREACH : 0, "key %u: %d", i,
                     res[i]);
    /* Host B: the mute owner's keys are clean misses, the rest are served.
     * Its connection is open (the hello came): this is the batch's own
     * deadline at work, not the connect's. Wait out the down mark first. */
    usleep(1100000);
    memset(out, 0, (size_t)NK * PAY);
    t0 = now_ns();
    cr_assert_eq(sfs_backend_peer_batch_get(h[1].be, keys, NK, ob, PAY, res), 0);
    /* A liveness bound, not a timing: the deadline is 200 ms. */
    cr_assert_lt(now_ns() - t0, 5000000000ll);
    for (unsigned i = 0; i < NK; i++) {
        if (owner_of(&ring, &keys[i]) == 2) {
            cr_assert_eq(res[i], -ENOENT, "key %u of the mute owner: %d", i, res[i]);
        } else {
            cr_assert_eq(res[i], (int)PAY, "key %u: %d", i, res[i]);
            cr_assert_eq(tu_check(&keys[i], ob[i], PAY), -1, "key %u bytes", i);
        }
    }
    cr_assert_eq(sfs_backend_peer_stats(h[1].be, &st), 0);
    cr_assert_eq(st.clean_unreachable, mute_keys);
    cr_assert_eq(sfs_backend_peer_batch_exists(h[1].be, keys, NK, PAY) < (int)NK, true);
    atomic_store(&mu.stop, true);
    pthread_join(mu.t, NULL);
    close(mu.lfd);
    if (mu.fd >= 0)
        close(mu.fd);
    peer_ring_free(&ring);
    sfs_backend_close(h[0].be);
    sfs_backend_close(h[1].be);
    unlink(members);
    free(in);
    free(out);
}

/* One key of one owner (a single get, no poll), then a batch of three: an
 * owner that answers nothing after its hello, half a payload, or half a
 * payload and then a byte every 50 ms (under a 200 ms deadline: each recv
 * gets a byte within its timeout, so only the call's bound in all ends it:
 * the deadline for a get, four for a batch) is a clean miss within it,
 * never a hang. The trickle held both for its 10 s before that bound. */
Test(peer_batch, one_mute_owner_of_a_get_or_a_batch_is_a_clean_miss_within_the_deadline,
     .timeout = 60)
{
    for (int half = 0; half < 3; half++) {
        struct mute mu = {.fd = -1, .half = half > 0, .trickle = half == 2};
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        struct timeval tv = {.tv_sec = 0, .tv_usec = 100000};
        socklen_t l = sizeof(a);
        struct sfs_key k = tu_key(700, 0);
        struct peer_hash h = peer_key_hash(&k);
        struct peer_conn c;
        char addr[64];
        void *out = malloc(PAY);
        int64_t t0;

        cr_assert(out);
        mu.lfd = socket(AF_INET, SOCK_STREAM, 0);
        cr_assert_eq(bind(mu.lfd, (struct sockaddr *)&a, sizeof(a)), 0);
        cr_assert_eq(listen(mu.lfd, 4), 0);
        cr_assert_eq(getsockname(mu.lfd, (struct sockaddr *)&a, &l), 0);
        setsockopt(mu.lfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        snprintf(addr, sizeof(addr), "127.0.0.1:%u", ntohs(a.sin_port));
        pthread_create(&mu.t, NULL, mute_main, &mu);
        peer_conn_init(&c);
        cr_assert_eq(peer_conn_open(&c, addr, 200), 0);
        t0 = now_ns();
        cr_assert_eq(peer_conn_get(&c, addr, 200, &h, PAY, out), PEER_MISS_UNREACHABLE, "half %d",
                     half);
        /* A liveness bound, not a timing: the deadline is 200 ms. */
        cr_assert_lt(now_ns() - t0, 3000000000ll);
        cr_assert_eq(c.fd, -1, "the connection is closed and marked down");
        cr_assert_eq(peer_conn_get(&c, addr, 200, &h, PAY, out), PEER_MISS_UNREACHABLE);
        /* Three keys of the one owner: the batch blocks in recv once its
         * requests are out, under the same deadline. */
        c.down_until_ns = 0;
        cr_assert_eq(peer_conn_open(&c, addr, 200), 0);
        {
            static struct peer_slot_hdr hd[3][PEER_WAYS_MAX];
            static uint64_t af[3][PEER_WAYS_MAX];
            struct peer_call calls[3];
            struct peer_batch *b = calloc(1, sizeof(*b));

            cr_assert(b);
            for (int i = 0; i < 3; i++) {
                calls[i] = (struct peer_call){.buf = out, .hdrs = hd[i], .after = af[i]};
                calls[i].q = peer_req_for(PEER_OP_READ_GET, &h, &c.g);
                calls[i].q.len = PAY;
            }
            *b = (struct peer_batch){.c = &c, .member = addr, .calls = calls, .n = 3};
            t0 = now_ns();
            cr_assert_eq(peer_conn_batch_run(b, 1, 200), 0);
            cr_assert_lt(now_ns() - t0, 3000000000ll);
            for (int i = 0; i < 3; i++)
                cr_assert_eq(peer_call_judge(&calls[i], c.g.ways, &h, PAY, out),
                             PEER_MISS_UNREACHABLE);
            cr_assert_eq(c.fd, -1);
            free(b);
        }
        atomic_store(&mu.stop, true);
        pthread_join(mu.t, NULL);
        close(mu.lfd);
        if (mu.fd >= 0)
            close(mu.fd);
        free(out);
    }
}
