/* SPDX-License-Identifier: MIT */
/*
 * backend.c - naming backends by spec string, and the thin wrappers callers
 * use instead of the vtable.
 *
 * The grammar (see shardfs/backend.h):
 *
 *   spec   := "mem:" | "mem"
 *           | "fault:" fopts ":" spec          fopts: k=v,k=v (no ':')
 *           | "peer:" popts ":" spec           popts: listen=ADDR:PORT,members=FILE,
 *                                              ways=N,capacity=SIZE[,slot=SIZE]
 *                                              [,deadline_ms=N] (backend_peer.c)
 *           | "posix:" path [ "?" k=v ("&" k=v)* ]
 *           | path                             anything else that is not
 *                                              "<word>:..." with an unknown word
 *   posix keys: dir_prefix=0..32, direct=0|1, depth=1..32768, sync=0|1,
 *               read_only=0|1
 *   direct defaults to 1: O_DIRECT loads wherever the file system and the
 *   buffers allow, buffered otherwise (backend_posix.c detects it and logs
 *   the fallback once); direct=0 asks for buffered loads always.
 *
 * Parsing is strict: an unknown key, a value out of range or trailing junk
 * is -EINVAL with one line in errbuf naming the offending part, so a daemon
 * can print it and exit. A relative path that contains ':' before its first
 * '/' must be written as "./name" or "posix:name".
 *
 * The *_sync helpers submit one request whose done() signals a condition
 * variable; done may run inline (before submit returns) or on a backend
 * thread, and both are handled by the same flag.
 */
#include "backend_i.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static bool parse_u64(const char *s, size_t len, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;

    if (len == 0)
        return false;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        if (v > (max - (uint64_t)(s[i] - '0')) / 10)
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return true;
}

static bool parse_bool01(const char *s, size_t len, bool *out)
{
    if (len == 1 && (s[0] == '0' || s[0] == '1')) {
        *out = s[0] == '1';
        return true;
    }
    return false;
}

/* Parse "k=v&k=v" of a posix spec into o. */
static int parse_posix_query(const char *q, struct sfs_posix_opts *o, char *errbuf, size_t errlen)
{
    while (*q) {
        const char *amp = strchr(q, '&');
        size_t plen = amp ? (size_t)(amp - q) : strlen(q);
        const char *eq = memchr(q, '=', plen);
        size_t klen, vlen;
        const char *v;
        uint64_t n;

        if (!eq) {
            sfs_errf(errbuf, errlen, "posix spec: option '%.*s' has no '=value'", (int)plen, q);
            return -EINVAL;
        }
        klen = (size_t)(eq - q);
        v = eq + 1;
        vlen = plen - klen - 1;
#define KEY_IS(name) (klen == sizeof(name) - 1 && memcmp(q, name, klen) == 0)
        if (KEY_IS("dir_prefix")) {
            if (!parse_u64(v, vlen, SFS_DIR_PREFIX_MAX, &n))
                goto bad_value;
            o->dir_prefix = (unsigned)n;
        } else if (KEY_IS("depth")) {
            if (!parse_u64(v, vlen, SFS_POSIX_DEPTH_MAX, &n) || n == 0)
                goto bad_value;
            o->depth = (unsigned)n;
        } else if (KEY_IS("direct")) {
            if (!parse_bool01(v, vlen, &o->direct))
                goto bad_value;
        } else if (KEY_IS("sync")) {
            if (!parse_bool01(v, vlen, &o->sync))
                goto bad_value;
        } else if (KEY_IS("read_only")) {
            if (!parse_bool01(v, vlen, &o->read_only))
                goto bad_value;
        } else {
            sfs_errf(errbuf, errlen,
                     "posix spec: unknown option '%.*s' (dir_prefix, direct, depth, sync, "
                     "read_only)",
                     (int)klen, q);
            return -EINVAL;
        }
#undef KEY_IS
        if (!amp)
            break;
        q = amp + 1;
        continue;
    bad_value:
        sfs_errf(errbuf, errlen,
                 "posix spec: bad value in '%.*s' (dir_prefix 0..%u, depth 1..%u, "
                 "direct/sync/read_only 0|1)",
                 (int)plen, q, SFS_DIR_PREFIX_MAX, SFS_POSIX_DEPTH_MAX);
        return -EINVAL;
    }
    return 0;
}

static struct sfs_backend *open_posix(const char *body, const struct sfs_backend_params *p,
                                      char *errbuf, size_t errlen, int *err)
{
    struct sfs_posix_opts o = {
        .dir_prefix = p->dir_prefix,
        .depth = SFS_POSIX_DEPTH_DEFAULT,
        .direct = true, /* params.direct predates this default */
        .read_only = p->read_only,
        .timeout_ms = p->timeout_ms ? p->timeout_ms : SFS_BACKEND_TIMEOUT_MS_DEFAULT,
    };
    const char *qm = strchr(body, '?');
    size_t plen = qm ? (size_t)(qm - body) : strlen(body);
    struct sfs_backend *be;
    char *root;
    int ret;

    if (o.dir_prefix > SFS_DIR_PREFIX_MAX) {
        sfs_errf(errbuf, errlen, "dir_prefix=%u out of range (0..%u)", o.dir_prefix,
                 SFS_DIR_PREFIX_MAX);
        *err = -EINVAL;
        return NULL;
    }
    if (plen == 0) {
        sfs_errf(errbuf, errlen, "posix spec: empty directory path");
        *err = -EINVAL;
        return NULL;
    }
    if (qm) {
        ret = parse_posix_query(qm + 1, &o, errbuf, errlen);
        if (ret < 0) {
            *err = ret;
            return NULL;
        }
    }
    /* A read-only mount stays read-only whatever the spec says. */
    if (p->read_only)
        o.read_only = true;
    root = strndup(body, plen);
    if (!root) {
        *err = -ENOMEM;
        return NULL;
    }
    be = sfs_posix_open(root, &o, p->shard_size, errbuf, errlen, err);
    free(root);
    return be;
}

/* "<word>:" with an unknown word: a typo of a backend type, not a path. */
static bool looks_like_scheme(const char *spec, size_t *wlen)
{
    size_t i = 0;

    while ((spec[i] >= 'a' && spec[i] <= 'z') || (spec[i] >= '0' && spec[i] <= '9') ||
           spec[i] == '_' || spec[i] == '-')
        i++;
    *wlen = i;
    return i > 0 && spec[i] == ':';
}

static struct sfs_backend *open_spec(const char *spec, const struct sfs_backend_params *p,
                                     char *errbuf, size_t errlen, int *err, unsigned nest)
{
    size_t wlen;

    if (nest > 8) {
        sfs_errf(errbuf, errlen, "spec: fault backends nested too deeply");
        *err = -EINVAL;
        return NULL;
    }
    if (spec[0] == '\0') {
        sfs_errf(errbuf, errlen, "spec: empty backend spec");
        *err = -EINVAL;
        return NULL;
    }
    if (strcmp(spec, "mem") == 0 || strncmp(spec, "mem:", 4) == 0) {
        if (spec[3] == ':' && spec[4] != '\0') {
            sfs_errf(errbuf, errlen, "mem spec: takes no options, got '%s'", spec + 4);
            *err = -EINVAL;
            return NULL;
        }
        return sfs_mem_open(p->shard_size, p->read_only, err);
    }
    if (strncmp(spec, "fault:", 6) == 0) {
        const char *opts = spec + 6;
        const char *colon = strchr(opts, ':');
        struct sfs_fault_opts fo;
        struct sfs_backend *inner, *be;
        int ret;

        if (!colon) {
            sfs_errf(errbuf, errlen, "fault spec: missing ':<inner spec>' after '%s'", opts);
            *err = -EINVAL;
            return NULL;
        }
        ret = sfs_fault_parse(opts, (size_t)(colon - opts), &fo, errbuf, errlen);
        if (ret < 0) {
            *err = ret;
            return NULL;
        }
        inner = open_spec(colon + 1, p, errbuf, errlen, err, nest + 1);
        if (!inner)
            return NULL;
        be = sfs_fault_wrap(inner, &fo, err);
        if (!be)
            sfs_be_close(inner);
        return be;
    }
    if (strncmp(spec, "peer:", 5) == 0) {
        struct sfs_peer_opts po;
        const char *inner_spec = NULL;
        struct sfs_backend *inner, *be;
        int ret = sfs_peer_parse(spec + 5, &po, &inner_spec, errbuf, errlen);

        if (ret < 0) {
            *err = ret;
            return NULL;
        }
        inner = open_spec(inner_spec, p, errbuf, errlen, err, nest + 1);
        if (!inner)
            return NULL;
        be = sfs_peer_wrap(inner, &po, errbuf, errlen, err);
        if (!be)
            sfs_be_close(inner);
        return be;
    }
    if (strncmp(spec, "posix:", 6) == 0)
        return open_posix(spec + 6, p, errbuf, errlen, err);
    if (looks_like_scheme(spec, &wlen)) {
        sfs_errf(
            errbuf, errlen,
            "spec: unknown backend type '%.*s' (posix:, mem:, fault:, peer:, or a directory path)",
            (int)wlen, spec);
        *err = -EINVAL;
        return NULL;
    }
    /* A plain path: no query string, it is all path. */
    {
        struct sfs_posix_opts o = {
            .dir_prefix = p->dir_prefix,
            .depth = SFS_POSIX_DEPTH_DEFAULT,
            .direct = true, /* params.direct predates this default */
            .read_only = p->read_only,
            .timeout_ms = p->timeout_ms ? p->timeout_ms : SFS_BACKEND_TIMEOUT_MS_DEFAULT,
        };

        if (o.dir_prefix > SFS_DIR_PREFIX_MAX) {
            sfs_errf(errbuf, errlen, "dir_prefix=%u out of range (0..%u)", o.dir_prefix,
                     SFS_DIR_PREFIX_MAX);
            *err = -EINVAL;
            return NULL;
        }
        return sfs_posix_open(spec, &o, p->shard_size, errbuf, errlen, err);
    }
}

struct sfs_backend *sfs_backend_open(const char *spec, const struct sfs_backend_params *params,
                                     char *errbuf, size_t errlen, int *err)
{
    int dummy;
    struct sfs_backend *be;

    if (!err)
        err = &dummy;
    *err = 0;
    if (errbuf && errlen)
        errbuf[0] = '\0';
    if (!spec) {
        sfs_errf(errbuf, errlen, "spec: no backend spec given");
        *err = -EINVAL;
        return NULL;
    }
    if (!params || params->shard_size == 0) {
        sfs_errf(errbuf, errlen, "shard_size: must be given and > 0");
        *err = -EINVAL;
        return NULL;
    }
    if (params->shard_size > INT_MAX) {
        /* Results are int: bytes moved or -errno. */
        sfs_errf(errbuf, errlen, "shard_size=%llu: larger than 2 GiB - 1",
                 (unsigned long long)params->shard_size);
        *err = -EINVAL;
        return NULL;
    }
    be = open_spec(spec, params, errbuf, errlen, err, 0);
    if (!be && *err == 0)
        *err = -EINVAL;
    return be;
}

int sfs_backend_load(struct sfs_backend *be, struct sfs_io **ios, size_t n)
{
    if (!be || (n && !ios))
        return -EINVAL;
    if (n == 0)
        return 0;
    if (n > INT_MAX)
        return -E2BIG;
    for (size_t i = 0; i < n; i++)
        ios[i]->priv[3] = NULL; /* the peer tier marks what it answers */
    return sfs_be_load(be, ios, n);
}

int sfs_backend_dump(struct sfs_backend *be, struct sfs_io **ios, size_t n)
{
    if (!be || (n && !ios))
        return -EINVAL;
    if (n == 0)
        return 0;
    if (n > INT_MAX)
        return -E2BIG;
    return sfs_be_dump(be, ios, n);
}

int sfs_backend_exists(struct sfs_backend *be, const struct sfs_key *keys, size_t n, bool *present)
{
    if (!be || (n && (!keys || !present)))
        return -EINVAL;
    if (n == 0)
        return 0;
    return sfs_be_exists(be, keys, n, present);
}

int sfs_backend_shard_count(struct sfs_backend *be, const struct sfs_block_id *block)
{
    if (!be || !block)
        return -EINVAL;
    return sfs_be_shard_count(be, block);
}

int sfs_backend_stamp(struct sfs_backend *be, const struct sfs_block_id *block,
                      struct sfs_block_stamp *out)
{
    if (!be || !out)
        return -EINVAL;
    return sfs_be_stamp(be, block, out);
}

int sfs_backend_scan(struct sfs_backend *be, sfs_scan_fn *fn, void *arg)
{
    if (!be || !fn)
        return -EINVAL;
    return sfs_be_scan(be, fn, arg);
}

int sfs_backend_evict(struct sfs_backend *be, const struct sfs_block_id *block,
                      const struct sfs_block_stamp *expect, uint64_t *freed)
{
    uint64_t dummy;

    if (!be || !block || !expect)
        return -EINVAL;
    return sfs_be_evict(be, block, expect, freed ? freed : &dummy);
}

int sfs_backend_lease(struct sfs_backend *be, const char *role, uint32_t ttl_ms)
{
    if (!be || !role)
        return -EINVAL;
    return sfs_be_lease(be, role, ttl_ms);
}

int sfs_backend_touch(struct sfs_backend *be, const struct sfs_block_id *blocks, size_t n)
{
    if (!be || (n && !blocks))
        return -EINVAL;
    if (n == 0)
        return 0;
    return sfs_be_touch(be, blocks, n); /* a hint: without readahead, nothing to do */
}

int sfs_backend_remove(struct sfs_backend *be, const struct sfs_key *key)
{
    if (!be || !key)
        return -EINVAL;
    return sfs_be_remove(be, key);
}

int sfs_backend_list(struct sfs_backend *be, int (*fn)(const struct sfs_block_id *block, void *arg),
                     void *arg)
{
    if (!be || !fn)
        return -EINVAL;
    return sfs_be_list(be, fn, arg);
}

void sfs_backend_close(struct sfs_backend *be)
{
    if (be)
        sfs_be_close(be);
}

/* One synchronous request: done() may run inline or on a backend thread. */
struct sync_wait {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done; /* protected by lock */
};

static void sync_done(struct sfs_io *io)
{
    struct sync_wait *w = io->arg;

    pthread_mutex_lock(&w->lock);
    w->done = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

static int submit_sync(struct sfs_backend *be, const struct sfs_key *key, void *buf, uint32_t len,
                       bool dump)
{
    struct sync_wait w = {.done = false};
    struct sfs_io io = {.buf = buf, .len = len, .done = sync_done, .arg = &w};
    struct sfs_io *p = &io;
    int ret;

    if (!be || !key || (!buf && len))
        return -EINVAL;
    io.key = *key;
    pthread_mutex_init(&w.lock, NULL);
    pthread_cond_init(&w.cond, NULL);
    ret = dump ? sfs_backend_dump(be, &p, 1) : sfs_backend_load(be, &p, 1);
    if (ret < 0)
        goto out_destroy;
    pthread_mutex_lock(&w.lock);
    while (!w.done)
        pthread_cond_wait(&w.cond, &w.lock);
    pthread_mutex_unlock(&w.lock);
    ret = io.result;
out_destroy:
    pthread_cond_destroy(&w.cond);
    pthread_mutex_destroy(&w.lock);
    return ret;
}

int sfs_backend_load_sync(struct sfs_backend *be, const struct sfs_key *key, void *buf,
                          uint32_t len)
{
    return submit_sync(be, key, buf, len, false);
}

int sfs_backend_dump_sync(struct sfs_backend *be, const struct sfs_key *key, const void *buf,
                          uint32_t len)
{
    return submit_sync(be, key, (void *)buf, len, true);
}

bool sfs_io_from_peer(const struct sfs_io *io)
{
    return io && io->priv[3] == (const void *)&sfs_peer_io_tag;
}
