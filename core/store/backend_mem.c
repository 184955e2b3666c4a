/* SPDX-License-Identifier: MIT */
/*
 * backend_mem.c - an in-process store, for tests.
 *
 * A chained hash map from key to a copy of the dumped bytes, behind one
 * mutex. Loads and dumps complete inline: done() runs before submit returns.
 * Unlike the posix layout it stores each shard on its own, so removing a
 * shard removes exactly that shard, and shard_count is the highest present
 * index plus one. A load asking for more bytes than were dumped is a short
 * read (-EIO); a dump larger than shard_size is -EINVAL.
 */
#include "backend_i.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct mem_entry {
    struct mem_entry *next;
    struct sfs_key key;
    uint32_t len;
    uint8_t data[];
};

struct mem_backend {
    struct sfs_backend be;
    pthread_mutex_t lock;
    struct mem_entry **buckets; /* protected by lock */
    size_t nbuckets;            /* protected by lock; a power of two */
    size_t count;               /* protected by lock */
    bool read_only;
};

static uint64_t key_hash(const struct sfs_key *k)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (int i = 0; i < SFS_BLOCK_ID_LEN; i++)
        h = (h ^ k->block.b[i]) * 0x100000001b3ull;
    h = (h ^ k->shard) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static bool key_eq(const struct sfs_key *a, const struct sfs_key *b)
{
    return a->shard == b->shard && memcmp(&a->block, &b->block, sizeof(a->block)) == 0;
}

/* Caller holds lock. Returns the link that points at the key's entry (or at
 * the NULL that ends its chain). */
static struct mem_entry **find_link(struct mem_backend *m, const struct sfs_key *k)
{
    struct mem_entry **pp = &m->buckets[key_hash(k) & (m->nbuckets - 1)];

    while (*pp && !key_eq(&(*pp)->key, k))
        pp = &(*pp)->next;
    return pp;
}

/* Caller holds lock. Doubling failure is harmless: chains just grow. */
static void maybe_grow(struct mem_backend *m)
{
    size_t nb = m->nbuckets * 2;
    struct mem_entry **nbk;

    if (m->count < m->nbuckets * 2)
        return;
    nbk = calloc(nb, sizeof(*nbk));
    if (!nbk)
        return;
    for (size_t i = 0; i < m->nbuckets; i++) {
        struct mem_entry *e = m->buckets[i], *next;

        for (; e; e = next) {
            size_t b = key_hash(&e->key) & (nb - 1);

            next = e->next;
            e->next = nbk[b];
            nbk[b] = e;
        }
    }
    free(m->buckets);
    m->buckets = nbk;
    m->nbuckets = nb;
}

static int mem_load(struct sfs_backend *be, struct sfs_io **ios, size_t n)
{
    struct mem_backend *m = (struct mem_backend *)be;

    for (size_t i = 0; i < n; i++) {
        struct sfs_io *io = ios[i];
        struct mem_entry *e;

        if (!io->buf || io->len == 0 || io->len > be->shard_size) {
            io->result = -EINVAL;
        } else {
            pthread_mutex_lock(&m->lock);
            e = *find_link(m, &io->key);
            if (!e)
                io->result = -ENOENT;
            else if (e->len < io->len)
                io->result = -EIO;
            else {
                memcpy(io->buf, e->data, io->len);
                io->result = (int)io->len;
            }
            pthread_mutex_unlock(&m->lock);
        }
        io->done(io);
    }
    return (int)n;
}

static int mem_dump(struct sfs_backend *be, struct sfs_io **ios, size_t n)
{
    struct mem_backend *m = (struct mem_backend *)be;

    if (m->read_only)
        return -EROFS;
    for (size_t i = 0; i < n; i++) {
        struct sfs_io *io = ios[i];
        struct mem_entry *e, **pp;

        if (!io->buf || io->len == 0 || io->len > be->shard_size) {
            io->result = -EINVAL;
            io->done(io);
            continue;
        }
        e = malloc(sizeof(*e) + io->len);
        if (!e) {
            io->result = -ENOMEM;
            io->done(io);
            continue;
        }
        e->key = io->key;
        e->len = io->len;
        memcpy(e->data, io->buf, io->len);
        pthread_mutex_lock(&m->lock);
        pp = find_link(m, &io->key);
        if (*pp) {
            e->next = (*pp)->next;
            free(*pp);
            *pp = e;
        } else {
            e->next = NULL;
            *pp = e;
            m->count++;
            maybe_grow(m);
        }
        pthread_mutex_unlock(&m->lock);
        io->result = (int)io->len;
        io->done(io);
    }
    return (int)n;
}

static int mem_exists(struct sfs_backend *be, const struct sfs_key *keys, size_t n, bool *present)
{
    struct mem_backend *m = (struct mem_backend *)be;

    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < n; i++)
        present[i] = *find_link(m, &keys[i]) != NULL;
    pthread_mutex_unlock(&m->lock);
    return 0;
}

static int mem_shard_count(struct sfs_backend *be, const struct sfs_block_id *block)
{
    struct mem_backend *m = (struct mem_backend *)be;
    int64_t top = -1;

    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < m->nbuckets; i++)
        for (struct mem_entry *e = m->buckets[i]; e; e = e->next)
            if (memcmp(&e->key.block, block, sizeof(*block)) == 0 && (int64_t)e->key.shard > top)
                top = e->key.shard;
    pthread_mutex_unlock(&m->lock);
    if (top < 0)
        return -ENOENT;
    return top + 1 > INT32_MAX ? INT32_MAX : (int)(top + 1);
}

static int mem_remove(struct sfs_backend *be, const struct sfs_key *key)
{
    struct mem_backend *m = (struct mem_backend *)be;
    struct mem_entry **pp, *e;
    int ret = -ENOENT;

    if (m->read_only)
        return -EROFS;
    pthread_mutex_lock(&m->lock);
    pp = find_link(m, key);
    e = *pp;
    if (e) {
        *pp = e->next;
        free(e);
        m->count--;
        ret = 0;
    }
    pthread_mutex_unlock(&m->lock);
    return ret;
}

static int block_cmp(const void *a, const void *b)
{
    return memcmp(a, b, sizeof(struct sfs_block_id));
}

/* Visits a snapshot of the distinct blocks, outside the lock, so fn may call
 * back into the backend. */
static int mem_list(struct sfs_backend *be, int (*fn)(const struct sfs_block_id *, void *),
                    void *arg)
{
    struct mem_backend *m = (struct mem_backend *)be;
    struct sfs_block_id *ids;
    size_t k = 0;
    int ret = 0;

    pthread_mutex_lock(&m->lock);
    ids = malloc((m->count ? m->count : 1) * sizeof(*ids));
    if (!ids) {
        pthread_mutex_unlock(&m->lock);
        return -ENOMEM;
    }
    for (size_t i = 0; i < m->nbuckets; i++)
        for (struct mem_entry *e = m->buckets[i]; e; e = e->next)
            ids[k++] = e->key.block;
    pthread_mutex_unlock(&m->lock);
    qsort(ids, k, sizeof(*ids), block_cmp);
    for (size_t i = 0; i < k && ret == 0; i++) {
        if (i > 0 && block_cmp(&ids[i], &ids[i - 1]) == 0)
            continue;
        ret = fn(&ids[i], arg);
    }
    free(ids);
    return ret;
}

static void mem_close(struct sfs_backend *be)
{
    struct mem_backend *m = (struct mem_backend *)be;

    for (size_t i = 0; i < m->nbuckets; i++) {
        struct mem_entry *e = m->buckets[i], *next;

        for (; e; e = next) {
            next = e->next;
            free(e);
        }
    }
    free(m->buckets);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static const struct sfs_backend_ops mem_ops = {
    .name = "mem",
    .load = mem_load,
    .dump = mem_dump,
    .exists = mem_exists,
    .shard_count = mem_shard_count,
    .touch = NULL,
    .remove = mem_remove,
    .list = mem_list,
    .close = mem_close,
};

struct sfs_backend *sfs_mem_open(uint64_t shard_size, bool read_only, int *err)
{
    struct mem_backend *m = calloc(1, sizeof(*m));

    if (!m)
        goto out_nomem;
    m->nbuckets = 256;
    m->buckets = calloc(m->nbuckets, sizeof(*m->buckets));
    if (!m->buckets)
        goto out_free;
    pthread_mutex_init(&m->lock, NULL);
    m->be.ops = &mem_ops;
    m->be.shard_size = shard_size;
    m->read_only = read_only;
    return &m->be;
out_free:
    free(m);
out_nomem:
    *err = -ENOMEM;
    return NULL;
}
