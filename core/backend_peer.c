/* SPDX-License-Identifier: MIT */
/*
 * backend_peer.c - the peer tier as a backend wrapping another:
 * cache -> peer -> posix (DESIGN section 12, docs/peer.md).
 *
 *   peer:listen=ADDR:PORT,members=FILE,ways=N,capacity=SIZE[,slot=SIZE]
 *        [,deadline_ms=N]:<inner spec>
 *
 * Load: a pool of PEER_WORKERS threads takes each request from a queue (a
 * submitter never waits on the network). The key's owner comes from the
 * ring over the members file; the owner's region is read (the local region
 * directly, a remote one with a header read of the bucket, then the payload
 * of the one way that names the key, under peer_slot_matches). A hit
 * completes the request; any miss (counted, with its reason) forwards it to
 * the inner backend, and what the inner loads is copied onto the publish
 * queue (bounded: PEER_PUBLISH_MAX entries, a full queue drops the copy, the
 * reader never waits) that one thread writes to the owner.
 * Dump: the inner dump first; when it succeeds the shard is published the
 * same way (write-through to both). exists, shard_count: the inner, then the
 * peer tier for what the inner has not. touch, remove, list: the inner.
 *
 * The members file is re-read when its mtime changes (checked at most once
 * a second, on use and by the idle publisher thread), so an edit takes
 * effect without a signal; the daemon need not forward SIGHUP. A member that does not answer within
 * deadline_ms is a clean miss ("unreachable") and is skipped for a second (peer_net.c).
 */

#include "backend_i.h"
#include "peer_i.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define PEER_WORKERS     4
#define PEER_PUBLISH_MAX 64
#define PEER_DEADLINE_MS 200u
#define PEER_SHARD_PROBE 4096u /* shard_count: most shards probed in the peer tier */

struct peer_member {
    pthread_mutex_t lock; /* one call at a time on conn */
    struct peer_conn conn;
};

struct pub {
    struct pub *next;
    struct sfs_key key;
    uint32_t len;
    uint8_t data[];
};

struct peer_backend {
    struct sfs_backend be;
    struct sfs_backend *inner;
    struct sfs_peer_opts o;
    struct peer_region region;
    struct peer_server *srv;

    /* Membership: ring, self and members are replaced whole under ring_lock
     * (write) and read under it (read). */
    pthread_rwlock_t ring_lock;
    struct peer_ring ring;
    struct peer_member *mem; /* ring.nmembers entries */
    int self;                /* index of listen in the ring, or -1 */
    struct timespec members_mtime;
    int64_t members_checked_ns;
    pthread_mutex_t reload_lock;

    /* Load queue and publish queue, one lock. */
    pthread_mutex_t qlock;
    pthread_cond_t qcond, pcond;
    struct sfs_io *qhead, *qtail; /* via priv[0] */
    struct pub *phead, *ptail;
    unsigned npub;
    bool stop;
    pthread_t workers[PEER_WORKERS], publisher;

    struct peer_ctrs {
        _Atomic uint64_t hits, misses, clean_torn, clean_other_key, clean_length, clean_unreachable,
            bytes_read, bytes_written, writes, lost_writes, round_trips;
    } st; /* relaxed counters (CTR_ADD) */
};

static const struct sfs_backend_ops peer_ops;

/* Relaxed: counters read by /stats, no ordering with anything. */
#define CTR_ADD(pb, f, n) atomic_fetch_add_explicit(&(pb)->st.f, (n), memory_order_relaxed)

static int64_t mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t realtime_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* --- options --- */

static int parse_size(const char *v, size_t n, uint64_t *out)
{
    uint64_t x = 0, mul = 1;
    size_t i = 0;

    if (n == 0 || !isdigit((unsigned char)v[0]))
        return -EINVAL;
    for (; i < n && isdigit((unsigned char)v[i]); i++) {
        if (x > (UINT64_MAX - 9) / 10)
            return -EINVAL;
        x = x * 10 + (uint64_t)(v[i] - '0');
    }
    if (i < n) {
        switch (v[i] | 0x20) {
        case 'k':
            mul = 1ull << 10;
            break;
        case 'm':
            mul = 1ull << 20;
            break;
        case 'g':
            mul = 1ull << 30;
            break;
        case 't':
            mul = 1ull << 40;
            break;
        default:
            return -EINVAL;
        }
        if (i + 1 != n)
            return -EINVAL;
    }
    if (x > UINT64_MAX / mul)
        return -EINVAL;
    *out = x * mul;
    return 0;
}

int sfs_peer_parse(const char *s, struct sfs_peer_opts *o, const char **inner, char *errbuf,
                   size_t errlen)
{
    const char *p = s;

    memset(o, 0, sizeof(*o));
    o->ways = 4;
    o->deadline_ms = PEER_DEADLINE_MS;
    for (;;) {
        const char *eq = strchr(p, '='), *v, *end;
        size_t klen, vlen;
        uint64_t x;

        if (!eq || strcspn(p, ",:") < (size_t)(eq - p)) {
            sfs_errf(errbuf, errlen, "peer spec: expected key=value at '%.40s'", p);
            return -EINVAL;
        }
        klen = (size_t)(eq - p);
        v = eq + 1;
        if (klen == 6 && strncmp(p, "listen", 6) == 0) {
            /* host:port or [v6]:port; the port is digits. */
            const char *c = v[0] == '[' ? strchr(v, ']') : v;

            c = c ? strchr(c, ':') : NULL;
            if (!c || !isdigit((unsigned char)c[1])) {
                sfs_errf(errbuf, errlen, "peer spec: listen= wants ADDR:PORT");
                return -EINVAL;
            }
            end = c + 1;
            while (isdigit((unsigned char)*end))
                end++;
        } else {
            end = v + strcspn(v, ",:");
        }
        vlen = (size_t)(end - v);
        if (vlen == 0 || vlen >= sizeof(o->listen)) {
            sfs_errf(errbuf, errlen, "peer spec: empty or too long value for '%.*s'", (int)klen, p);
            return -EINVAL;
        }
        if (klen == 6 && strncmp(p, "listen", 6) == 0) {
            memcpy(o->listen, v, vlen);
        } else if (klen == 7 && strncmp(p, "members", 7) == 0) {
            memcpy(o->members, v, vlen);
        } else if (klen == 4 && strncmp(p, "ways", 4) == 0) {
            if (parse_size(v, vlen, &x) < 0 || x == 0 || x > PEER_WAYS_MAX)
                goto bad;
            o->ways = (uint32_t)x;
        } else if (klen == 8 && strncmp(p, "capacity", 8) == 0) {
            if (parse_size(v, vlen, &x) < 0 || x == 0)
                goto bad;
            o->capacity = x;
        } else if (klen == 4 && strncmp(p, "slot", 4) == 0) {
            if (parse_size(v, vlen, &x) < 0 || x == 0 || x > PEER_PAYLOAD_MAX)
                goto bad;
            o->slot = (uint32_t)x;
        } else if (klen == 11 && strncmp(p, "deadline_ms", 11) == 0) {
            if (parse_size(v, vlen, &x) < 0 || x == 0 || x > 600000)
                goto bad;
            o->deadline_ms = (unsigned)x;
        } else {
            sfs_errf(errbuf, errlen,
                     "peer spec: unknown option '%.*s' (listen, members, ways, capacity, slot, "
                     "deadline_ms)",
                     (int)klen, p);
            return -EINVAL;
        }
        if (*end == ',') {
            p = end + 1;
            continue;
        }
        if (*end == ':') {
            *inner = end + 1;
            break;
        }
        sfs_errf(errbuf, errlen, "peer spec: missing ':<inner spec>'");
        return -EINVAL;
    bad:
        sfs_errf(errbuf, errlen, "peer spec: bad value '%.*s' for '%.*s'", (int)vlen, v, (int)klen,
                 p);
        return -EINVAL;
    }
    if (!o->listen[0] || !o->capacity) {
        sfs_errf(errbuf, errlen, "peer spec: listen= and capacity= are required");
        return -EINVAL;
    }
    return 0;
}

/* --- membership --- */

static void members_free(struct peer_member *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        peer_conn_close(&m[i].conn);
        pthread_mutex_destroy(&m[i].lock);
    }
    free(m);
}

/* Read the members file: one host:port a line, '#' comments, blanks. */
static int members_read(const char *path, char ***out, size_t *n, struct timespec *mtime)
{
    FILE *f = fopen(path, "re");
    char line[512], **v = NULL;
    struct stat st;
    size_t k = 0;

    *out = NULL;
    *n = 0;
    if (!f)
        return -errno;
    if (fstat(fileno(f), &st) == 0)
        *mtime = st.st_mtim;
    while (fgets(line, sizeof(line), f)) {
        char *s = line, *e;

        while (isspace((unsigned char)*s))
            s++;
        e = s + strcspn(s, "#\r\n");
        while (e > s && isspace((unsigned char)e[-1]))
            e--;
        *e = '\0';
        if (!*s)
            continue;
        if (k == PEER_MEMBERS_MAX)
            break;
        char **nv = realloc(v, (k + 1) * sizeof(*v));

        if (!nv || !(nv[k] = strdup(s))) {
            v = nv ? nv : v;
            break;
        }
        v = nv;
        k++;
    }
    fclose(f);
    *out = v;
    *n = k;
    return 0;
}

static int members_load(struct peer_backend *pb)
{
    char **names;
    size_t n;
    struct peer_ring ring;
    struct peer_member *mem;
    struct timespec mt = {0};
    int ret = members_read(pb->o.members, &names, &n, &mt), self = -1;

    if (ret < 0)
        return ret;
    ret = peer_ring_build(&ring, names, n);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (ret < 0)
        return ret;
    mem = calloc(ring.nmembers ? ring.nmembers : 1, sizeof(*mem));
    if (!mem) {
        peer_ring_free(&ring);
        return -ENOMEM;
    }
    for (size_t i = 0; i < ring.nmembers; i++) {
        pthread_mutex_init(&mem[i].lock, NULL);
        peer_conn_init(&mem[i].conn);
        if (strcmp(ring.members[i], pb->o.listen) == 0)
            self = (int)i;
    }
    pthread_rwlock_wrlock(&pb->ring_lock);
    members_free(pb->mem, pb->ring.nmembers);
    peer_ring_free(&pb->ring);
    pb->ring = ring;
    pb->mem = mem;
    pb->self = self;
    pb->members_mtime = mt;
    /* Only members may read or write our region. */
    if (pb->srv)
        peer_server_allow(pb->srv, pb->ring.members, pb->ring.nmembers);
    pthread_rwlock_unlock(&pb->ring_lock);
    return 0;
}

static void members_maybe_reload(struct peer_backend *pb)
{
    struct stat st;
    int64_t now = mono_ns();

    if (!pb->o.members[0] || pthread_mutex_trylock(&pb->reload_lock) != 0)
        return;
    if (now - pb->members_checked_ns >= 1000000000) {
        pb->members_checked_ns = now;
        if (stat(pb->o.members, &st) == 0 && (st.st_mtim.tv_sec != pb->members_mtime.tv_sec ||
                                              st.st_mtim.tv_nsec != pb->members_mtime.tv_nsec))
            members_load(pb);
    }
    pthread_mutex_unlock(&pb->reload_lock);
}

/* --- get / set against the owner (caller holds ring_lock for reading) --- */

static void count_miss(struct peer_backend *pb, enum peer_miss m)
{
    CTR_ADD(pb, misses, 1);
    switch (m) {
    case PEER_MISS_TORN:
    case PEER_MISS_CHECKSUM:
        CTR_ADD(pb, clean_torn, 1);
        break;
    case PEER_MISS_OTHER_KEY:
        CTR_ADD(pb, clean_other_key, 1);
        break;
    case PEER_MISS_LENGTH:
        CTR_ADD(pb, clean_length, 1);
        break;
    case PEER_MISS_UNREACHABLE:
        CTR_ADD(pb, clean_unreachable, 1);
        break;
    default:
        break;
    }
}

static enum peer_miss remote_get(struct peer_backend *pb, struct peer_member *m, const char *name,
                                 const struct peer_hash *h, void *buf, uint32_t len)
{
    struct peer_slot_hdr hdrs[PEER_WAYS_MAX];
    uint64_t after[PEER_WAYS_MAX];
    enum peer_miss best = PEER_MISS_EMPTY;
    struct peer_conn *c = &m->conn;
    uint64_t bucket;

    pthread_mutex_lock(&m->lock);
    if (peer_conn_open(c, name, pb->o.deadline_ms) < 0 || len > c->g.max_payload) {
        enum peer_miss r = c->fd < 0 ? PEER_MISS_UNREACHABLE : PEER_MISS_LENGTH;

        pthread_mutex_unlock(&m->lock);
        return r;
    }
    bucket = peer_bucket_of(h, c->g.num_buckets);
    CTR_ADD(pb, round_trips, 1);
    if (peer_conn_read_hdrs(c, name, pb->o.deadline_ms, bucket, hdrs, after) < 0) {
        pthread_mutex_unlock(&m->lock);
        return PEER_MISS_UNREACHABLE;
    }
    CTR_ADD(pb, bytes_read, (uint64_t)c->g.ways * (PEER_HDR_SIZE + 8));
    for (uint32_t w = 0; w < c->g.ways; w++) {
        /* Relaxed: hdrs are a private copy off the wire. */
        uint64_t before = atomic_load_explicit(&hdrs[w].seq, memory_order_relaxed);
        enum peer_miss r = peer_slot_matches(&hdrs[w], before, after[w], h, len, NULL);
        struct peer_slot_hdr hdr;
        uint64_t a2;

        if (r == PEER_MISS_EMPTY || r == PEER_MISS_OTHER_KEY) {
            if (best == PEER_MISS_EMPTY)
                best = r;
            continue;
        }
        if (r == PEER_HIT && !buf) {
            pthread_mutex_unlock(&m->lock);
            return PEER_HIT; /* exists: the header names the key and length */
        }
        if (r == PEER_HIT) {
            CTR_ADD(pb, round_trips, 1);
            if (peer_conn_read_slot(c, name, pb->o.deadline_ms, bucket, w, len, &hdr, &a2, buf) <
                0) {
                pthread_mutex_unlock(&m->lock);
                return PEER_MISS_UNREACHABLE;
            }
            CTR_ADD(pb, bytes_read, PEER_HDR_SIZE + 8 + (uint64_t)len);
            /* Relaxed: a private copy. */
            before = atomic_load_explicit(&hdr.seq, memory_order_relaxed);
            r = peer_slot_matches(&hdr, before, a2, h, len, buf);
            if (r == PEER_HIT) {
                pthread_mutex_unlock(&m->lock);
                return PEER_HIT;
            }
        }
        best = r;
    }
    pthread_mutex_unlock(&m->lock);
    return best;
}

static enum peer_miss peer_get(struct peer_backend *pb, const struct sfs_key *key, void *buf,
                               uint32_t len)
{
    struct peer_hash h = peer_key_hash(key);
    enum peer_miss r;
    int owner;

    members_maybe_reload(pb);
    pthread_rwlock_rdlock(&pb->ring_lock);
    owner = peer_ring_owner(&pb->ring, &h);
    if (owner < 0 || owner == pb->self)
        r = peer_local_get(&pb->region, &h, buf, len);
    else
        r = remote_get(pb, &pb->mem[owner], pb->ring.members[owner], &h, buf, len);
    pthread_rwlock_unlock(&pb->ring_lock);
    return r;
}

static int remote_set(struct peer_backend *pb, struct peer_member *m, const char *name,
                      const struct peer_hash *h, const void *buf, uint32_t len)
{
    struct peer_slot_hdr hdrs[PEER_WAYS_MAX];
    uint64_t after[PEER_WAYS_MAX], found;
    struct peer_conn *c = &m->conn;
    int ret = -EAGAIN;

    pthread_mutex_lock(&m->lock);
    if ((ret = peer_conn_open(c, name, pb->o.deadline_ms)) < 0)
        goto out;
    if (len > c->g.max_payload) {
        ret = -EMSGSIZE;
        goto out;
    }
    /* Read, choose, write conditionally on the seq read; once more if
     * another writer moved it; then report (lost_writes). */
    for (int attempt = 0; attempt < 2; attempt++) {
        uint64_t bucket = peer_bucket_of(h, c->g.num_buckets);
        int w;

        CTR_ADD(pb, round_trips, 1);
        if ((ret = peer_conn_read_hdrs(c, name, pb->o.deadline_ms, bucket, hdrs, after)) < 0)
            goto out;
        for (uint32_t i = 0; i < c->g.ways; i++)
            /* Relaxed: private copies. */
            if (atomic_load_explicit(&hdrs[i].seq, memory_order_relaxed) != after[i])
                after[i] |= 1;
        w = peer_pick_way(hdrs, after, c->g.ways, h);
        if (w < 0) {
            ret = -EAGAIN;
            continue;
        }
        CTR_ADD(pb, round_trips, 1);
        ret = peer_conn_write(c, name, pb->o.deadline_ms, bucket, (uint32_t)w, after[w], h, buf,
                              len, realtime_ns(), &found);
        if (ret != -EAGAIN)
            break;
    }
out:
    pthread_mutex_unlock(&m->lock);
    return ret;
}

static void peer_set(struct peer_backend *pb, const struct sfs_key *key, const void *buf,
                     uint32_t len)
{
    struct peer_hash h = peer_key_hash(key);
    int owner, ret;

    members_maybe_reload(pb);
    pthread_rwlock_rdlock(&pb->ring_lock);
    owner = peer_ring_owner(&pb->ring, &h);
    if (owner < 0 || owner == pb->self)
        ret = peer_local_set(&pb->region, &h, buf, len);
    else
        ret = remote_set(pb, &pb->mem[owner], pb->ring.members[owner], &h, buf, len);
    pthread_rwlock_unlock(&pb->ring_lock);
    if (ret == 0) {
        CTR_ADD(pb, writes, 1);
        CTR_ADD(pb, bytes_written, len);
    } else if (ret == -EAGAIN) {
        CTR_ADD(pb, lost_writes, 1);
    }
}

/* --- publish queue --- */

static void publish(struct peer_backend *pb, const struct sfs_key *key, const void *buf,
                    uint32_t len)
{
    struct pub *p;

    if (len > pb->region.g.max_payload)
        return;
    pthread_mutex_lock(&pb->qlock);
    if (pb->npub >= PEER_PUBLISH_MAX || pb->stop) {
        pthread_mutex_unlock(&pb->qlock);
        return; /* bounded: a full queue drops, the reader never waits */
    }
    pb->npub++;
    pthread_mutex_unlock(&pb->qlock);
    p = malloc(sizeof(*p) + len);
    pthread_mutex_lock(&pb->qlock);
    if (!p) {
        pb->npub--;
    } else {
        p->next = NULL;
        p->key = *key;
        p->len = len;
        memcpy(p->data, buf, len);
        if (pb->ptail)
            pb->ptail->next = p;
        else
            pb->phead = p;
        pb->ptail = p;
        pthread_cond_signal(&pb->pcond);
    }
    pthread_mutex_unlock(&pb->qlock);
}

static void *publisher_main(void *arg)
{
    struct peer_backend *pb = arg;

    pthread_mutex_lock(&pb->qlock);
    for (;;) {
        struct pub *p = pb->phead;

        if (!p) {
            struct timespec ts;

            if (pb->stop)
                break;
            /* Idle: look at the members file once a second, so that a server
             * nobody asks still learns of a joiner (and lets it connect). */
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            if (pthread_cond_timedwait(&pb->pcond, &pb->qlock, &ts) == ETIMEDOUT) {
                pthread_mutex_unlock(&pb->qlock);
                members_maybe_reload(pb);
                pthread_mutex_lock(&pb->qlock);
            }
            continue;
        }
        pb->phead = p->next;
        if (!pb->phead)
            pb->ptail = NULL;
        pthread_mutex_unlock(&pb->qlock);
        peer_set(pb, &p->key, p->data, p->len);
        free(p);
        pthread_mutex_lock(&pb->qlock);
        pb->npub--;
        pthread_cond_broadcast(&pb->pcond);
    }
    pthread_mutex_unlock(&pb->qlock);
    return NULL;
}

/* --- load and dump --- */

struct shadow {
    struct sfs_io io; /* what the inner sees */
    struct sfs_io *outer;
    struct peer_backend *pb;
    bool dump;
};

static void shadow_done(struct sfs_io *sio)
{
    struct shadow *sh = sio->arg;
    struct sfs_io *outer = sh->outer;

    outer->result = sio->result;
    if (sio->result == (int)outer->len)
        publish(sh->pb, &outer->key, outer->buf, outer->len);
    free(sh);
    outer->done(outer);
}

static void forward(struct peer_backend *pb, struct sfs_io *io, bool dump)
{
    struct shadow *sh = calloc(1, sizeof(*sh));
    struct sfs_io *sio;
    int ret;

    if (!sh) {
        io->result = -ENOMEM;
        io->done(io);
        return;
    }
    sh->outer = io;
    sh->pb = pb;
    sh->dump = dump;
    sh->io.key = io->key;
    sh->io.buf = io->buf;
    sh->io.len = io->len;
    sh->io.done = shadow_done;
    sh->io.arg = sh;
    sio = &sh->io;
    ret = dump ? sfs_be_dump(pb->inner, &sio, 1) : sfs_be_load(pb->inner, &sio, 1);
    if (ret < 0) {
        free(sh);
        io->result = ret;
        io->done(io);
    }
}

static void *worker_main(void *arg)
{
    struct peer_backend *pb = arg;

    pthread_mutex_lock(&pb->qlock);
    for (;;) {
        struct sfs_io *io = pb->qhead;
        enum peer_miss m;

        if (!io) {
            if (pb->stop)
                break;
            pthread_cond_wait(&pb->qcond, &pb->qlock);
            continue;
        }
        pb->qhead = io->priv[0];
        if (!pb->qhead)
            pb->qtail = NULL;
        pthread_mutex_unlock(&pb->qlock);
        m = peer_get(pb, &io->key, io->buf, io->len);
        if (m == PEER_HIT) {
            CTR_ADD(pb, hits, 1);
            io->result = (int)io->len;
            io->done(io);
        } else {
            count_miss(pb, m);
            forward(pb, io, false);
        }
        pthread_mutex_lock(&pb->qlock);
    }
    pthread_mutex_unlock(&pb->qlock);
    return NULL;
}

static int peer_load(struct sfs_backend *be, struct sfs_io **ios, size_t n)
{
    struct peer_backend *pb = (struct peer_backend *)be;

    pthread_mutex_lock(&pb->qlock);
    for (size_t i = 0; i < n; i++) {
        ios[i]->priv[0] = NULL;
        if (pb->qtail)
            pb->qtail->priv[0] = ios[i];
        else
            pb->qhead = ios[i];
        pb->qtail = ios[i];
    }
    pthread_cond_broadcast(&pb->qcond);
    pthread_mutex_unlock(&pb->qlock);
    return (int)n;
}

static int peer_dump(struct sfs_backend *be, struct sfs_io **ios, size_t n)
{
    struct peer_backend *pb = (struct peer_backend *)be;

    for (size_t i = 0; i < n; i++)
        forward(pb, ios[i], true);
    return (int)n;
}

/*
 * Batch exists in the peer tier, headers only: for each key with
 * present[i] false, one round trip per owner host per PEER_BATCH_MAX keys
 * (READ_HDRS_MULTI), the local region read directly. A member that does
 * not answer leaves its keys absent.
 */
/* One READ_HDRS_MULTI for k keys (keys[idx[a]], in buckets[a]) of one
 * member (m->lock held, connection open); marks the ones found. false when
 * the member did not answer. */
static bool exists_flush(struct peer_backend *pb, struct peer_member *m, const char *name,
                         const struct sfs_key *keys, const size_t *idx, const uint64_t *buckets,
                         uint32_t k, struct peer_slot_hdr *hdrs, uint64_t *after, bool *present)
{
    uint32_t len = (uint32_t)pb->be.shard_size, ways;

    CTR_ADD(pb, round_trips, 1);
    if (peer_conn_read_hdrs_multi(&m->conn, name, pb->o.deadline_ms, buckets, k, hdrs, after) < 0)
        return false;
    ways = m->conn.g.ways;
    CTR_ADD(pb, bytes_read, (uint64_t)k * ways * (PEER_HDR_SIZE + 8));
    for (uint32_t a = 0; a < k; a++) {
        struct peer_hash h = peer_key_hash(&keys[idx[a]]);

        for (uint32_t w = 0; w < ways && !present[idx[a]]; w++) {
            struct peer_slot_hdr *x = &hdrs[a * ways + w];
            /* Relaxed: a private copy off the wire. */
            uint64_t before = atomic_load_explicit(&x->seq, memory_order_relaxed);

            present[idx[a]] =
                peer_slot_matches(x, before, after[a * ways + w], &h, len, NULL) == PEER_HIT;
        }
    }
    return true;
}

static void peer_has_batch(struct peer_backend *pb, const struct sfs_key *keys, size_t n,
                           bool *present)
{
    size_t *idx = malloc(PEER_BATCH_MAX * sizeof(*idx));
    struct peer_slot_hdr *hdrs = malloc((size_t)PEER_BATCH_MAX * PEER_WAYS_MAX * sizeof(*hdrs));
    uint64_t *after = malloc((size_t)PEER_BATCH_MAX * PEER_WAYS_MAX * sizeof(*after));
    uint64_t buckets[PEER_BATCH_MAX];
    uint32_t len = (uint32_t)pb->be.shard_size;
    bool *done = calloc(n ? n : 1, sizeof(*done));

    if (!idx || !hdrs || !after || !done)
        goto out;
    members_maybe_reload(pb);
    pthread_rwlock_rdlock(&pb->ring_lock);
    for (size_t i = 0; i < n; i++) {
        struct peer_hash h;
        int owner;

        if (present[i] || done[i])
            continue;
        h = peer_key_hash(&keys[i]);
        owner = peer_ring_owner(&pb->ring, &h);
        if (owner < 0 || owner == pb->self) {
            present[i] = peer_local_get(&pb->region, &h, NULL, len) == PEER_HIT;
            done[i] = true;
            continue;
        }
        /* Gather this owner's keys from i on, PEER_BATCH_MAX at a time. */
        struct peer_member *m = &pb->mem[owner];
        const char *name = pb->ring.members[owner];
        uint32_t k = 0;

        pthread_mutex_lock(&m->lock);
        bool open = peer_conn_open(&m->conn, name, pb->o.deadline_ms) == 0;

        for (size_t j = i; j < n; j++) {
            struct peer_hash hj;

            if (present[j] || done[j])
                continue;
            hj = peer_key_hash(&keys[j]);
            if (peer_ring_owner(&pb->ring, &hj) != owner)
                continue;
            done[j] = true;
            if (!open || len > m->conn.g.max_payload)
                continue; /* absent: unreachable, or too long for its slots */
            idx[k] = j;
            buckets[k++] = peer_bucket_of(&hj, m->conn.g.num_buckets);
            if (k == PEER_BATCH_MAX) {
                open = exists_flush(pb, m, name, keys, idx, buckets, k, hdrs, after, present);
                k = 0;
            }
        }
        if (k && open)
            exists_flush(pb, m, name, keys, idx, buckets, k, hdrs, after, present);
        pthread_mutex_unlock(&m->lock);
    }
    pthread_rwlock_unlock(&pb->ring_lock);
out:
    free(idx);
    free(hdrs);
    free(after);
    free(done);
}

static int peer_exists(struct sfs_backend *be, const struct sfs_key *keys, size_t n, bool *present)
{
    struct peer_backend *pb = (struct peer_backend *)be;
    int ret = sfs_be_exists(pb->inner, keys, n, present);

    if (ret < 0)
        return ret;
    peer_has_batch(pb, keys, n, present);
    return 0;
}

/* The inner's count, else the shards 0, 1, ... the peer tier has in a row,
 * PEER_BATCH_MAX at a time (one round trip per owner host per batch). */
static int peer_shard_count(struct sfs_backend *be, const struct sfs_block_id *block)
{
    struct peer_backend *pb = (struct peer_backend *)be;
    int ret = sfs_be_shard_count(pb->inner, block);
    struct sfs_key keys[PEER_BATCH_MAX];
    bool present[PEER_BATCH_MAX];
    uint32_t k = 0;

    if (ret != -ENOENT)
        return ret;
    while (k < PEER_SHARD_PROBE) {
        uint32_t i;

        for (i = 0; i < PEER_BATCH_MAX; i++) {
            keys[i] = (struct sfs_key){.block = *block, .shard = k + i};
            present[i] = false;
        }
        peer_has_batch(pb, keys, PEER_BATCH_MAX, present);
        for (i = 0; i < PEER_BATCH_MAX && present[i]; i++)
            ;
        k += i;
        if (i < PEER_BATCH_MAX)
            break;
    }
    return k ? (int)k : -ENOENT;
}

static int peer_touch(struct sfs_backend *be, const struct sfs_block_id *b, size_t n)
{
    return sfs_be_touch(((struct peer_backend *)be)->inner, b, n);
}

static int peer_remove(struct sfs_backend *be, const struct sfs_key *key)
{
    return sfs_be_remove(((struct peer_backend *)be)->inner, key);
}

static int peer_list(struct sfs_backend *be, int (*fn)(const struct sfs_block_id *, void *),
                     void *arg)
{
    return sfs_be_list(((struct peer_backend *)be)->inner, fn, arg);
}

static void peer_close(struct sfs_backend *be)
{
    struct peer_backend *pb = (struct peer_backend *)be;

    pthread_mutex_lock(&pb->qlock);
    pb->stop = true;
    pthread_cond_broadcast(&pb->qcond);
    pthread_cond_broadcast(&pb->pcond);
    pthread_mutex_unlock(&pb->qlock);
    for (int i = 0; i < PEER_WORKERS; i++)
        pthread_join(pb->workers[i], NULL);
    pthread_join(pb->publisher, NULL);
    peer_server_stop(pb->srv);
    sfs_be_close(pb->inner);
    members_free(pb->mem, pb->ring.nmembers);
    peer_ring_free(&pb->ring);
    peer_region_destroy(&pb->region);
    pthread_rwlock_destroy(&pb->ring_lock);
    free(pb);
}

static const struct sfs_backend_ops peer_ops = {
    .name = "peer",
    .load = peer_load,
    .dump = peer_dump,
    .exists = peer_exists,
    .shard_count = peer_shard_count,
    .touch = peer_touch,
    .remove = peer_remove,
    .list = peer_list,
    .close = peer_close,
};

struct sfs_backend *sfs_peer_wrap(struct sfs_backend *inner, const struct sfs_peer_opts *o,
                                  char *errbuf, size_t errlen, int *err)
{
    struct peer_backend *pb = calloc(1, sizeof(*pb));
    struct peer_geometry g;
    int ret, nw = 0;

    if (!pb) {
        *err = -ENOMEM;
        return NULL;
    }
    pb->be.ops = &peer_ops;
    pb->be.shard_size = inner->shard_size;
    pb->inner = inner;
    pb->o = *o;
    pb->self = -1;
    pb->region.memfd = -1;
    if (!pb->o.slot)
        pb->o.slot =
            (uint32_t)(inner->shard_size < PEER_PAYLOAD_MAX ? inner->shard_size : PEER_PAYLOAD_MAX);
    pthread_rwlock_init(&pb->ring_lock, NULL);
    pthread_mutex_init(&pb->reload_lock, NULL);
    pthread_mutex_init(&pb->qlock, NULL);
    pthread_cond_init(&pb->qcond, NULL);
    pthread_cond_init(&pb->pcond, NULL);
    ret = peer_geometry_make(o->capacity, pb->o.ways, pb->o.slot, &g);
    if (ret < 0) {
        sfs_errf(errbuf, errlen, "peer spec: capacity=%llu holds no bucket of %u ways x %u bytes",
                 (unsigned long long)o->capacity, pb->o.ways, pb->o.slot);
        goto fail;
    }
    ret = peer_region_create(&pb->region, &g);
    if (ret < 0) {
        sfs_errf(errbuf, errlen, "peer: slot region of %llu bytes: %s",
                 (unsigned long long)(g.num_buckets * g.ways * g.stride), strerror(-ret));
        goto fail;
    }
    if (pb->o.members[0]) {
        ret = members_load(pb);
        if (ret < 0) {
            sfs_errf(errbuf, errlen, "peer: members file '%s': %s", pb->o.members, strerror(-ret));
            goto fail;
        }
    }
    ret = peer_server_start(&pb->srv, &pb->region, pb->o.listen, errbuf, errlen);
    if (ret < 0)
        goto fail;
    if (pb->ring.nmembers)
        peer_server_allow(pb->srv, pb->ring.members, pb->ring.nmembers);
    for (; nw < PEER_WORKERS; nw++)
        if ((ret = -pthread_create(&pb->workers[nw], NULL, worker_main, pb)) < 0)
            goto fail_threads;
    if ((ret = -pthread_create(&pb->publisher, NULL, publisher_main, pb)) < 0)
        goto fail_threads;
    return &pb->be;
fail_threads:
    pthread_mutex_lock(&pb->qlock);
    pb->stop = true;
    pthread_cond_broadcast(&pb->qcond);
    pthread_mutex_unlock(&pb->qlock);
    while (nw--)
        pthread_join(pb->workers[nw], NULL);
    peer_server_stop(pb->srv);
fail:
    members_free(pb->mem, pb->ring.nmembers);
    peer_ring_free(&pb->ring);
    peer_region_destroy(&pb->region);
    free(pb);
    *err = ret;
    return NULL;
}

int sfs_backend_peer_stats(struct sfs_backend *be, struct sfs_peer_stats *out)
{
    struct peer_backend *pb = (struct peer_backend *)be;

    if (!be || be->ops != &peer_ops)
        return -ENOENT;
        /* Relaxed: a snapshot of counters. */
#define RD(f) out->f = atomic_load_explicit(&pb->st.f, memory_order_relaxed)
    RD(hits);
    RD(misses);
    RD(clean_torn);
    RD(clean_other_key);
    RD(clean_length);
    RD(clean_unreachable);
    RD(bytes_read);
    RD(bytes_written);
    RD(writes);
    RD(lost_writes);
    RD(round_trips);
#undef RD
    return 0;
}
