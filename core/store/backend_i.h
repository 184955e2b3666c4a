/* SPDX-License-Identifier: MIT */
/*
 * backend_i.h - private glue between the backend dispatcher (backend.c) and
 * the backends it opens (posix, mem, fault).
 *
 * backend.c parses spec strings and hands each backend an already-validated
 * option struct; the constructors here only check what needs the system (a
 * directory exists, a ring can be set up). Error text goes to the caller's
 * errbuf as one line; the library never prints.
 */
#ifndef SHARDFS_BACKEND_I_H
#define SHARDFS_BACKEND_I_H

#include <shardfs/backend.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

/* Options of the posix backend, from the spec and the params. */
struct sfs_posix_opts {
    unsigned dir_prefix; /* 0: <root>/data/; 1..32: <root>/<N hex chars>/ */
    unsigned depth;      /* io_uring entries, 1..32768 */
    bool direct;         /* O_DIRECT loads where buffers and offsets allow */
    bool sync;           /* fsync the tmp file and directory before commit */
    bool read_only;      /* dumps and removes fail with -EROFS */
    unsigned timeout_ms; /* deadline of a synchronous call (posix_call.c), > 0 */
};

#define SFS_POSIX_DEPTH_DEFAULT 64u
#define SFS_POSIX_DEPTH_MAX     32768u
#define SFS_DIR_PREFIX_MAX      32u

/* Options of the fault backend (the part of the spec between "fault:" and
 * the inner spec). Probabilities are in [0, 1]. */
struct sfs_fault_opts {
    uint64_t latency_us;  /* added to every completion */
    uint64_t jitter_us;   /* plus a uniform extra in [0, jitter_us] */
    double eio;           /* fail a request with -EIO (it never reaches the inner) */
    double short_read;    /* load: inner reads a prefix only; result -EIO */
    uint64_t stall_ms;    /* extra delay of every stall_every-th request */
    uint64_t stall_every; /* 0 or 1: every request */
    uint64_t seed;
};

/* Options of the peer backend (peer:k=v,...:<inner>), backend_peer.c. */
struct sfs_peer_opts {
    char listen[256];     /* ADDR:PORT the slot region is served on */
    char members[256];    /* members file; empty: no other hosts */
    uint32_t ways;        /* 1..PEER_WAYS_MAX, default 4 */
    uint64_t capacity;    /* slot region bytes */
    uint32_t slot;        /* max payload; 0: the shard size */
    unsigned deadline_ms; /* per call to a member, default 200 */
    char key[256];        /* the members' key file; empty: none (loopback only) */
};

/* Parse the peer options of s (after "peer:"); *inner points at the inner
 * spec on success. 0 or -EINVAL with a reason. */
/* backend_peer.c: the mark a peer hit leaves in its io's priv[3]. */
extern const char sfs_peer_io_tag;
int sfs_peer_parse(const char *s, struct sfs_peer_opts *o, const char **inner, char *errbuf,
                   size_t errlen);

/* Wrap inner; on success the peer backend owns it. */
struct sfs_backend *sfs_peer_wrap(struct sfs_backend *inner, const struct sfs_peer_opts *o,
                                  char *errbuf, size_t errlen, int *err);

struct sfs_backend *sfs_posix_open(const char *root, const struct sfs_posix_opts *o,
                                   uint64_t shard_size, char *errbuf, size_t errlen, int *err);

struct sfs_backend *sfs_mem_open(uint64_t shard_size, bool read_only, int *err);

/* Parse fault options from s[0..len). Returns 0 or -EINVAL with a reason in
 * errbuf. Unnamed options are zero. */
int sfs_fault_parse(const char *s, size_t len, struct sfs_fault_opts *o, char *errbuf,
                    size_t errlen);

/* Wrap `inner`. On success the fault backend owns inner (closes it on close);
 * on failure the caller still does. */
struct sfs_backend *sfs_fault_wrap(struct sfs_backend *inner, const struct sfs_fault_opts *o,
                                   int *err);

/*
 * The vtable calls, one place: the public entry points (backend.c) check
 * their arguments and call these; a wrapper (backend_fault.c) calls these on
 * its inner backend directly, so calls between the files flow one way
 * (backend.c -> backend_fault.c, never back). An optional op that is absent
 * reads as -EOPNOTSUPP, except touch (a hint: nothing to do is success).
 * Arguments are the caller's to check (n > 0, pointers set).
 */
static inline int sfs_be_load(struct sfs_backend *be, struct sfs_io **ios, size_t n)
{
    return be->ops->load(be, ios, n);
}

static inline int sfs_be_dump(struct sfs_backend *be, struct sfs_io **ios, size_t n)
{
    return be->ops->dump ? be->ops->dump(be, ios, n) : -EOPNOTSUPP;
}

static inline int sfs_be_exists(struct sfs_backend *be, const struct sfs_key *keys, size_t n,
                                bool *present)
{
    return be->ops->exists ? be->ops->exists(be, keys, n, present) : -EOPNOTSUPP;
}

static inline int sfs_be_shard_count(struct sfs_backend *be, const struct sfs_block_id *block)
{
    return be->ops->shard_count ? be->ops->shard_count(be, block) : -EOPNOTSUPP;
}

static inline int sfs_be_stamp(struct sfs_backend *be, const struct sfs_block_id *block,
                               struct sfs_block_stamp *out)
{
    return be->ops->stamp ? be->ops->stamp(be, block, out) : -EOPNOTSUPP;
}

static inline int sfs_be_scan(struct sfs_backend *be, sfs_scan_fn *fn, void *arg)
{
    return be->ops->scan ? be->ops->scan(be, fn, arg) : -EOPNOTSUPP;
}

static inline int sfs_be_evict(struct sfs_backend *be, const struct sfs_block_id *block,
                               const struct sfs_block_stamp *expect, uint64_t *freed)
{
    return be->ops->evict ? be->ops->evict(be, block, expect, freed) : -EOPNOTSUPP;
}

static inline int sfs_be_lease(struct sfs_backend *be, const char *role, uint32_t ttl_ms)
{
    return be->ops->lease ? be->ops->lease(be, role, ttl_ms) : -EOPNOTSUPP;
}

static inline int sfs_be_touch(struct sfs_backend *be, const struct sfs_block_id *blocks, size_t n)
{
    return be->ops->touch ? be->ops->touch(be, blocks, n) : 0;
}

static inline int sfs_be_remove(struct sfs_backend *be, const struct sfs_key *key)
{
    return be->ops->remove ? be->ops->remove(be, key) : -EOPNOTSUPP;
}

static inline int sfs_be_list(struct sfs_backend *be,
                              int (*fn)(const struct sfs_block_id *block, void *arg), void *arg)
{
    return be->ops->list ? be->ops->list(be, fn, arg) : -EOPNOTSUPP;
}

static inline void sfs_be_close(struct sfs_backend *be)
{
    be->ops->close(be);
}

/* One-line error text into errbuf, when the caller gave one. */
static inline void __attribute__((format(printf, 3, 4)))
sfs_errf(char *errbuf, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (!errbuf || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(errbuf, errlen, fmt, ap);
    va_end(ap);
}

/* Local hex helpers: the posix layout prints ids in lowercase and accepts
 * only lowercase names when listing (a name it would not write is not one of
 * its files). */
static inline void sfs_hex_encode(const struct sfs_block_id *id, char out[SFS_BLOCK_HEX_LEN + 1])
{
    static const char digits[] = "0123456789abcdef";

    for (int i = 0; i < SFS_BLOCK_ID_LEN; i++) {
        out[2 * i] = digits[id->b[i] >> 4];
        out[2 * i + 1] = digits[id->b[i] & 15];
    }
    out[SFS_BLOCK_HEX_LEN] = '\0';
}

static inline int sfs_hex_lower_val(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Exactly 32 lowercase hex characters followed by NUL. 0 or -EINVAL. */
static inline int sfs_hex_decode_name(const char *name, struct sfs_block_id *id)
{
    for (int i = 0; i < SFS_BLOCK_ID_LEN; i++) {
        int hi = sfs_hex_lower_val(name[2 * i]);
        int lo = hi < 0 ? -1 : sfs_hex_lower_val(name[2 * i + 1]);

        if (hi < 0 || lo < 0)
            return -EINVAL;
        id->b[i] = (uint8_t)(hi << 4 | lo);
    }
    return name[SFS_BLOCK_HEX_LEN] == '\0' ? 0 : -EINVAL;
}

/* splitmix64: the one PRNG of the backends (fault decisions, test data). */
static inline uint64_t sfs_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#endif /* SHARDFS_BACKEND_I_H */
