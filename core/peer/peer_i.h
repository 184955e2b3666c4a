/* SPDX-License-Identifier: MIT */
/*
 * peer_i.h - the peer tier (design.md, section 11): the slot region one
 * daemon serves to the other hosts, the placement every host computes alike,
 * the wire protocol, and the server and client that speak it.
 *
 * Region: num_buckets x ways x stride bytes in a memfd of its own (not the
 * CacheBuffer). A slot is a 64-byte header then at most max_payload bytes;
 * stride = 64 + max_payload rounded up to 64. The header is a seqlock:
 * `seq` is odd while a write is in progress, and a reader copies the header
 * and payload and re-reads `seq` AFTER the copy (peer_slot_read); only an
 * unchanged even seq with a matching key hash, length and payload checksum
 * is a hit (peer_slot_matches). Every other outcome is a clean miss with a
 * reason, never bytes.
 *
 * Placement: owner = a consistent-hash ring over the members (64 virtual
 * nodes each), bucket = an independent hash of the key modulo the owner's
 * announced num_buckets, way = an empty slot, else the same key, else the
 * oldest stamp. Writes are compare-and-swap on the seq the writer read.
 *
 * Wire (TCP, every integer little-endian whatever the host: peer_*_enc /
 * peer_*_dec convert at the socket, nothing else sees wire bytes): the
 * server sends a peer_hello with its geometry and a fresh nonce on accept;
 * with a members' key (peer_auth_i.h) the client answers with its nonce and
 * proof and the server with its proof, and each request then carries a tag;
 * then each request is one 64-byte peer_req (its tag after it, then `len`
 * payload bytes for a write) and each answer one peer_rep plus data. Every
 * field is checked against the announced geometry; a request that fails a
 * check, or whose tag is wrong, closes its connection.
 */
#ifndef SHARDFS_PEER_I_H
#define SHARDFS_PEER_I_H

#include "peer_auth_i.h"

#include <shardfs/backend.h>

#include <endian.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PEER_HDR_SIZE    64u
#define PEER_WAYS_MAX    64u
#define PEER_VNODES      64u
#define PEER_MEMBERS_MAX 256u
#define PEER_MAGIC       0x53465031u /* "SFP1" */
/* 2: READ_GET, the four-lane checksum; 3: little-endian on the wire, and
 * the key hash and checksum read the bytes as little-endian words; 4: the
 * eight-lane checksum (two words a multiply: another value for the same
 * payload); 5: members authenticate each other (the hello's flags and
 * nonce, the handshake, a tag per request). A peer of another version is
 * refused at the hello (client) or its first request (server). */
#define PEER_VERSION 5u
/* peer_hello.flags: the server wants the handshake and tagged requests. */
#define PEER_HELLO_AUTH 1u
/* Largest payload a slot can hold (one shard); bounds every length on the
 * wire together with the announced geometry. */
#define PEER_PAYLOAD_MAX (64u << 20)

/* 128-bit key hash: what a slot header names its key by. */
struct peer_hash {
    uint64_t lo, hi;
};

/* The slot header, at the start of every slot. `seq` is the seqlock word;
 * the other fields are plain and only meaningful between two equal even
 * reads of seq. */
struct peer_slot_hdr {
    _Atomic uint64_t seq; /* odd: a write is in progress; 0: never written */
    uint64_t hash_lo, hash_hi;
    uint32_t len;   /* payload bytes, <= max_payload */
    uint32_t magic; /* PEER_MAGIC once written */
    uint64_t csum;  /* peer_checksum(payload, len) */
    uint64_t stamp; /* CLOCK_REALTIME ns of the write: "oldest" for eviction */
    uint64_t pad[2];
};
_Static_assert(sizeof(struct peer_slot_hdr) == PEER_HDR_SIZE, "slot header is 64 bytes");

struct peer_geometry {
    uint64_t num_buckets;
    uint32_t ways;
    uint32_t max_payload;
    uint64_t stride; /* PEER_HDR_SIZE + max_payload, rounded up to 64 */
};

/* Why a read was not a hit. */
enum peer_miss {
    PEER_HIT = 0,
    PEER_MISS_EMPTY,       /* never written, or no slot of the bucket has the key */
    PEER_MISS_TORN,        /* odd seq, or seq changed during the copy */
    PEER_MISS_OTHER_KEY,   /* the slot holds another key */
    PEER_MISS_LENGTH,      /* the key, but another length */
    PEER_MISS_CHECKSUM,    /* the key and length, but the payload does not match */
    PEER_MISS_UNREACHABLE, /* the owner did not answer within the deadline */
};

struct peer_region {
    int memfd;
    uint8_t *base;
    size_t size;
    struct peer_geometry g;
};

/* --- hashing and placement (peer_region.c) --- */
struct peer_hash peer_key_hash(const struct sfs_key *key);
uint64_t peer_bucket_of(const struct peer_hash *h, uint64_t num_buckets);
uint64_t peer_checksum(const void *p, size_t len);

/* A ring of members; each member is "host:port". */
struct peer_ring {
    size_t nmembers;
    char **members;
    size_t npoints;
    struct peer_point {
        uint64_t h;
        uint32_t member;
    } * points;
};

int peer_ring_build(struct peer_ring *r, char *const *members, size_t n);
void peer_ring_free(struct peer_ring *r);
/* The member index owning the key; -ENOENT with no members. */
int peer_ring_owner(const struct peer_ring *r, const struct peer_hash *h);

/* --- the region (peer_region.c) --- */

/* Geometry from a capacity in bytes, ways and max payload; -EINVAL when it
 * gives no bucket. */
int peer_geometry_make(uint64_t capacity, uint32_t ways, uint32_t max_payload,
                       struct peer_geometry *g);
/* Check a geometry a peer announced: bounded, self-consistent. */
int peer_geometry_check(const struct peer_geometry *g);

int peer_region_create(struct peer_region *r, const struct peer_geometry *g);
void peer_region_destroy(struct peer_region *r);

static inline struct peer_slot_hdr *peer_slot(const struct peer_region *r, uint64_t bucket,
                                              uint32_t way)
{
    return (struct peer_slot_hdr *)(r->base + (bucket * r->g.ways + way) * r->g.stride);
}

/*
 * The single gate. `hdr` is a COPY of a header taken with seq `seq_before`,
 * and `seq_after` the seq read again after the payload was copied; `payload`
 * the copied payload (NULL: header only, the checksum is not checked).
 */
enum peer_miss peer_slot_matches(const struct peer_slot_hdr *hdr, uint64_t seq_before,
                                 uint64_t seq_after, const struct peer_hash *h,
                                 uint32_t expected_len, const void *payload);

/*
 * Seqlock copy of one slot of the local region: the header into *hdr and up
 * to `cap` payload bytes into buf (NULL: header only), then seq again.
 * Returns the seq read after the copy; *seq_before the one before.
 */
uint64_t peer_slot_copy(const struct peer_region *r, uint64_t bucket, uint32_t way,
                        struct peer_slot_hdr *hdr, uint64_t *seq_before, void *buf, size_t cap);

/* Look up key in the local region: PEER_HIT with len bytes in buf, or why
 * not (the most telling reason across the ways). buf NULL: the header only
 * (a slot names the key with this length; no payload checksum). */
enum peer_miss peer_local_get(const struct peer_region *r, const struct peer_hash *h, void *buf,
                              uint32_t len);

/* The first way whose header copy (hdrs[w], seq after it after[w]) names h
 * with length len under a stable even seq; -1 when none. The server's filter
 * for READ_GET over the one bucket it was asked for (no index, no per-key
 * state); the client still judges the payload with peer_slot_matches. */
int peer_find_way(const struct peer_slot_hdr *hdrs, const uint64_t *after, uint32_t ways,
                  const struct peer_hash *h, uint32_t len);

/* Choose a way given the bucket's header copies (seqs[i] the seq read):
 * empty, then the same key, then the oldest stamp; slots with an odd seq
 * (write in progress) are skipped. -EBUSY when every way is busy. */
int peer_pick_way(const struct peer_slot_hdr *hdrs, const uint64_t *seqs, uint32_t ways,
                  const struct peer_hash *h);

/*
 * Conditional write of one slot: only if its seq is still `expect` (even).
 * 0, -EAGAIN when the seq moved (another writer), -EINVAL on bad sizes.
 */
int peer_slot_write(struct peer_region *r, uint64_t bucket, uint32_t way, uint64_t expect,
                    const struct peer_hash *h, const void *payload, uint32_t len, uint64_t stamp);

/* Local set: pick a way under CAS, retry once. 0, or -EAGAIN (lost). */
int peer_local_set(struct peer_region *r, const struct peer_hash *h, const void *payload,
                   uint32_t len);

/* --- wire (peer_net.c) --- */
enum peer_op {
    PEER_OP_READ_HDRS = 1,       /* headers of ways [way, way + nways) of a bucket */
    PEER_OP_READ_SLOT = 2,       /* header + payload (len bytes) of one slot */
    PEER_OP_WRITE = 3,           /* conditional write of one slot; len payload bytes follow */
    PEER_OP_READ_HDRS_MULTI = 4, /* all headers of nways (1..PEER_BATCH_MAX) buckets, whose
                                  * numbers follow as len = 8 x nways bytes */
    PEER_OP_READ_GET = 5,        /* a get in one trip: all headers of a bucket, then the
                                  * header and len payload bytes of the way whose header
                                  * names (hash_lo, hash_hi) with length len, if any */
};

/* Buckets one READ_HDRS_MULTI names: a batch's keys of one owner host go in
 * as few requests of this many as they need. */
#define PEER_BATCH_MAX 64u

struct peer_hello {
    uint32_t magic, version;
    struct peer_geometry g;
    uint32_t flags; /* PEER_HELLO_AUTH */
    uint32_t pad;
    uint8_t nonce[PEER_NONCE]; /* fresh per connection (zeros without a key) */
};

struct peer_req {
    uint32_t magic;
    uint16_t version, op;
    uint64_t bucket;
    uint32_t way, nways;
    uint64_t expect; /* WRITE: the seq read */
    uint64_t hash_lo, hash_hi;
    uint32_t len; /* READ_SLOT: payload bytes wanted; WRITE: bytes that follow */
    uint32_t pad;
    uint64_t stamp;
};
_Static_assert(sizeof(struct peer_req) == 64, "request is 64 bytes");

/* The start every request shares: magic, version, op, bucket. */
static inline struct peer_req peer_req_at(uint16_t op, uint64_t bucket)
{
    return (struct peer_req){
        .magic = PEER_MAGIC, .version = PEER_VERSION, .op = op, .bucket = bucket};
}

/* A request about key h to an owner of geometry g: its bucket there and its
 * hash (which READ_HDRS carries and the server ignores). */
static inline struct peer_req peer_req_for(uint16_t op, const struct peer_hash *h,
                                           const struct peer_geometry *g)
{
    struct peer_req q = peer_req_at(op, peer_bucket_of(h, g->num_buckets));

    q.hash_lo = h->lo;
    q.hash_hi = h->hi;
    return q;
}

/* Answer: status 0 or -errno; then for READ_HDRS nways x (header, seq_after);
 * for READ_SLOT (header, seq_after) then len payload bytes; for WRITE
 * nothing (status -EAGAIN: the seq moved); for READ_GET status is the way
 * that names the key or -ENOENT, then ways x (header, seq_after), then the
 * way's (header, seq_after) (zeros for none), then with a way len payload
 * bytes. */
struct peer_rep {
    uint32_t magic;
    int32_t status;
    uint64_t seq; /* WRITE -EAGAIN: the seq found */
};

/*
 * Wire images: each message as bytes on the wire, every integer
 * little-endian at the offset its field has in the struct on a
 * little-endian host (the tables in peer_net.c; a header's pad is sent as
 * zeros). An encoder writes every field, a decoder reads every field and
 * judges nothing (peer_req_check and peer_geometry_check do).
 */
#define PEER_HELLO_WIRE    72u
#define PEER_HELLO_V4_WIRE 32u /* the start every version shares */
#define PEER_REQ_WIRE   64u
#define PEER_REP_WIRE   16u
#define PEER_HDR_WIRE   72u /* a slot header copy, then the seq read after it */

/* A little-endian 64-bit word at p (any alignment). */
static inline void peer_put64(uint8_t *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, 8);
}

static inline uint64_t peer_get64(const uint8_t *p)
{
    uint64_t v;

    memcpy(&v, p, 8);
    return le64toh(v);
}

_Static_assert(PEER_HDR_SIZE + 8 == PEER_HDR_WIRE, "header image: the header, then a seq");

void peer_hello_enc(uint8_t *out, const struct peer_hello *m);
void peer_hello_dec(struct peer_hello *m, const uint8_t *in);
void peer_req_enc(uint8_t *out, const struct peer_req *q);
void peer_req_dec(struct peer_req *q, const uint8_t *in);
void peer_rep_enc(uint8_t *out, const struct peer_rep *r);
void peer_rep_dec(struct peer_rep *r, const uint8_t *in);
void peer_hdr_enc(uint8_t *out, const struct peer_slot_hdr *h, uint64_t after);
void peer_hdr_dec(struct peer_slot_hdr *h, uint64_t *after, const uint8_t *in);

/* Validate a request against the geometry; 0 or -EINVAL. (Fuzzable.) */
int peer_req_check(const struct peer_req *q, const struct peer_geometry *g);

struct peer_server;
/* Serve region r on addr ("host:port"), from any address until
 * peer_server_allow. With key (the caller keeps it until the stop), only to
 * a client that proves it holds the key, and only requests with its tag;
 * NULL: to anyone (a client with a key refuses such a server). */
int peer_server_start(struct peer_server **out, struct peer_region *r, const char *addr,
                      const struct peer_key *key, char *errbuf, size_t errlen);
void peer_server_stop(struct peer_server *s);
/* Serve only connections from the hosts of these members ("host:port",
 * resolved now; n == 0: from anyone). 0, or -errno (the old list stays). */
int peer_server_allow(struct peer_server *s, char *const *members, size_t n);

/* Serve one connected stream fd (the hello, the handshake with a key, then
 * requests until it ends or one is refused) as a server's connection
 * thread does, in the caller's thread; closes fd. 0 or -ENOMEM. (The fuzz
 * target of the request loop, and test_peer_serve's entry.) */
int peer_serve_stream(struct peer_region *r, const struct peer_key *key, int fd);

/* One connection to a member, with a deadline per call. */
struct peer_conn {
    int fd;
    struct peer_geometry g;     /* what the member announced */
    int64_t down_until_ns;      /* after a failure: a clean miss until then */
    unsigned rcvtimeo_ms;       /* the SO_RCVTIMEO set on fd (0: none yet) */
    const struct peer_key *key; /* the members' key (NULL: none), the caller's */
    struct peer_sess sess;      /* with a key, once fd is through the handshake */
};

/* A connection with no key (a member with a key sets c->key after it). */
void peer_conn_init(struct peer_conn *c);
/* Bytes of a request's image and its tag on c. */
static inline size_t peer_conn_req_wire(const struct peer_conn *c)
{
    return PEER_REQ_WIRE + (c->sess.on ? PEER_TAG : 0);
}
void peer_conn_close(struct peer_conn *c);
/* Read headers of a whole bucket; hdrs/seq_after have g.ways entries. */
int peer_conn_read_hdrs(struct peer_conn *c, const char *member, unsigned deadline_ms,
                        uint64_t bucket, struct peer_slot_hdr *hdrs, uint64_t *seq_after);
int peer_conn_read_slot(struct peer_conn *c, const char *member, unsigned deadline_ms,
                        uint64_t bucket, uint32_t way, uint32_t len, struct peer_slot_hdr *hdr,
                        uint64_t *seq_after, void *buf);
/* 0, -EAGAIN (seq moved; *found set), or -errno. */
int peer_conn_write(struct peer_conn *c, const char *member, unsigned deadline_ms, uint64_t bucket,
                    uint32_t way, uint64_t expect, const struct peer_hash *h, const void *payload,
                    uint32_t len, uint64_t stamp, uint64_t *found);
/* All headers of `count` (1..PEER_BATCH_MAX) buckets in one round trip:
 * hdrs and seq_after get count x g.ways entries, bucket by bucket. The
 * connection must be open (the caller computed the buckets from c->g). */
int peer_conn_read_hdrs_multi(struct peer_conn *c, const char *member, unsigned deadline_ms,
                              const uint64_t *buckets, uint32_t count, struct peer_slot_hdr *hdrs,
                              uint64_t *seq_after);
/* Connect (if not connected), fetch the geometry and, when either end has
 * a key, go through the handshake: 0 or -errno (-EACCES: the member and
 * this end do not hold the same key, or one of them holds none). */
int peer_conn_open(struct peer_conn *c, const char *member, unsigned deadline_ms);
/* As peer_conn_open, but first drops an open connection the member has
 * closed meanwhile (it restarted): a batch does not lose its keys to it. */
int peer_conn_open_fresh(struct peer_conn *c, const char *member, unsigned deadline_ms);
/* A get in one round trip (READ_GET): PEER_HIT with len bytes in buf, or
 * why not (PEER_MISS_UNREACHABLE when the member did not answer). */
enum peer_miss peer_conn_get(struct peer_conn *c, const char *member, unsigned deadline_ms,
                             const struct peer_hash *h, uint32_t len, void *buf);

/*
 * Pipelined batches: every request of every member's batch is sent without
 * waiting for answers, and the answers of all members are read as they
 * come (one poll over all connections), so a batch costs one round trip per
 * member, all members at once. Each member's connection fails alone: after
 * deadline_ms with no byte moved on it, or on a bad answer; its calls not
 * yet answered get err < 0 (the connection is closed and marked down), the
 * other members' calls are unaffected.
 */
struct peer_call {
    struct peer_req q;                      /* READ_HDRS (nways = g.ways), READ_GET or WRITE */
    uint8_t wire[PEER_REQ_WIRE + PEER_TAG]; /* q's image and tag (peer_conn_batch_run's) */
    const void *payload;         /* WRITE: q.len bytes */
    void *buf;                   /* READ_GET: where the q.len payload bytes go */
    struct peer_slot_hdr *hdrs;  /* READ_HDRS, READ_GET: g.ways header copies ... */
    uint64_t *after;             /* ... and the seq read after each */
    struct peer_slot_hdr hdr;    /* READ_GET with a way: its header copy ... */
    uint64_t hdr_after;          /* ... and the seq after the payload */
    struct peer_rep rep;         /* the answer's status (and seq) */
    int err;                     /* 0: answered; -errno: not */
    size_t key;                  /* the caller's */
};

struct peer_batch {
    struct peer_conn *c; /* open (peer_conn_open), c->g known */
    const char *member;
    struct peer_call *calls;
    size_t n;
    /* progress (peer_conn_batch_run's) */
    size_t tx_call, tx_off, rx_call, rx_off;
    int tx_stage, rx_stage;
    int64_t last_ns;
    uint8_t scratch[(PEER_WAYS_MAX + 1) * PEER_HDR_WIRE]; /* answer images, decoded */
};

/* Run nb batches to distinct members at once. Returns the number of calls
 * answered over all batches. */
size_t peer_conn_batch_run(struct peer_batch *b, size_t nb, unsigned deadline_ms);
/* A call's outcome for a key: a READ_GET call judged against h and len
 * (buf: its payload), or a READ_HDRS call (buf NULL: headers only). */
enum peer_miss peer_call_judge(const struct peer_call *call, uint32_t ways,
                               const struct peer_hash *h, uint32_t len, const void *buf);

#endif /* SHARDFS_PEER_I_H */
