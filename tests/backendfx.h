/* SPDX-License-Identifier: MIT */
/*
 * backendfx.h - what the backend suites share (test_backend.c,
 * test_backend_remote.c): a store directory per test (g_root, made and
 * removed by the suite's init and fini), block paths in the UCM layout,
 * and shard bytes that are a pure function of (block, shard, version), so
 * a test tells a right shard from a wrong or torn one without keeping
 * copies. Header-only: each suite is its own program.
 */
#ifndef SHARDFS_BACKENDFX_H
#define SHARDFS_BACKENDFX_H

#include "testutil.h"

#include <shardfs/backend.h>

#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_SMALL (16u * 1024)

static inline uint64_t mix(uint64_t *st)
{
    uint64_t z = (*st += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline struct sfs_block_id mkid(uint64_t i)
{
    struct sfs_block_id id;
    uint64_t st = i * 7919 + 1, a = mix(&st), b = mix(&st);

    memcpy(id.b, &a, 8);
    memcpy(id.b + 8, &b, 8);
    return id;
}

static inline struct sfs_key mkkey(uint64_t block, uint32_t shard)
{
    struct sfs_key k = {.block = mkid(block), .shard = shard};

    return k;
}

/* The bytes of (block, shard) at `version`. */
static inline void fill(const struct sfs_block_id *id, uint32_t shard, uint32_t version, void *buf,
                        size_t len)
{
    uint64_t st, w;
    uint8_t *p = buf;

    memcpy(&st, id->b, 8);
    st ^= ((uint64_t)shard << 32) ^ ((uint64_t)version << 20) ^ 0x5151;
    for (size_t i = 0; i < len; i += 8) {
        w = mix(&st);
        memcpy(p + i, &w, len - i < 8 ? len - i : 8);
    }
}

static inline bool matches(const struct sfs_block_id *id, uint32_t shard, uint32_t version,
                           const void *buf, size_t len)
{
    void *want = malloc(len);
    bool ok;

    fill(id, shard, version, want, len);
    ok = memcmp(want, buf, len) == 0;
    free(want);
    return ok;
}

static inline void hex(const struct sfs_block_id *id, char out[33])
{
    for (int i = 0; i < 16; i++)
        sprintf(out + 2 * i, "%02x", id->b[i]);
}

static char g_root[256];

static inline void mkroot(void)
{
    static int n;

    snprintf(g_root, sizeof(g_root), "/tmp/sfs_test_backend_%d_%d", (int)getpid(), n++);
    cr_assert_eq(mkdir(g_root, 0755), 0, "mkdir %s: %s", g_root, strerror(errno));
}

static inline int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static inline void rmroot(void)
{
    if (g_root[0])
        nftw(g_root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    g_root[0] = '\0';
}

static inline void block_path(unsigned dir_prefix, const struct sfs_block_id *id, char *out,
                              size_t len, bool mkdirs)
{
    char h[33], dir[300];

    hex(id, h);
    if (dir_prefix == 0)
        snprintf(dir, sizeof(dir), "%s/data", g_root);
    else
        snprintf(dir, sizeof(dir), "%s/%.*s", g_root, (int)dir_prefix, h);
    if (mkdirs)
        mkdir(dir, 0755);
    snprintf(out, len, "%s/%s", dir, h);
}

/* Write a block file of `nshards` shards (version 0) straight to disk. */
static inline void write_block(unsigned dir_prefix, uint64_t block, uint32_t nshards, uint32_t S)
{
    struct sfs_block_id id = mkid(block);
    char path[400];
    char *buf = malloc(S);
    int fd;

    block_path(dir_prefix, &id, path, sizeof(path), true);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
    for (uint32_t n = 0; n < nshards; n++) {
        fill(&id, n, 0, buf, S);
        cr_assert_eq(pwrite(fd, buf, S, (off_t)n * S), (ssize_t)S);
    }
    close(fd);
    free(buf);
}

static inline off_t file_size(unsigned dir_prefix, uint64_t block)
{
    struct sfs_block_id id = mkid(block);
    char path[400];
    struct stat st;

    block_path(dir_prefix, &id, path, sizeof(path), false);
    return stat(path, &st) == 0 ? st.st_size : -1;
}

/* len bytes aligned for O_DIRECT; asserts. */
static inline void *xalloc(size_t len)
{
    void *p = NULL;

    cr_assert_eq(posix_memalign(&p, 4096, len), 0);
    return p;
}

/* The backend of spec with S-byte shards (read-only: ro); asserts. */
static inline struct sfs_backend *open_be(const char *spec, uint64_t S, bool ro)
{
    struct sfs_backend_params p = {.shard_size = S, .read_only = ro};
    char err[256] = "";
    int e = 0;
    struct sfs_backend *be = sfs_backend_open(spec, &p, err, sizeof(err), &e);

    cr_assert_not_null(be, "open '%s': %d %s", spec, e, err);
    return be;
}

/* open_be (S_SMALL shards, writable) on the spec fmt formats. */
__attribute__((format(printf, 1, 2))) static inline struct sfs_backend *open_spec(const char *fmt,
                                                                                  ...)
{
    char spec[400];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(spec, sizeof(spec), fmt, ap);
    va_end(ap);
    return open_be(spec, S_SMALL, false);
}

#endif /* SHARDFS_BACKENDFX_H */
