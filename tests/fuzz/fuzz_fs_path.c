/* SPDX-License-Identifier: MIT */
/*
 * fuzz_fs_path.c - libFuzzer target: the mount's names (fs/names.c, the
 * lookup of fs/ops.c).
 *
 * The input is a path: components separated by '/' or NUL. The harness walks
 * it from the root with the daemon's real lookup handler (fs_ops.lookup, on a
 * real cache and a mem backend holding a few shards), as the kernel would one
 * component at a time, and checks each answer against an independent model of
 * the tree (docs/fs.md): "block" and "stats" under the root, exactly 32
 * lowercase hex characters under block/, "shard" under a block, a canonical
 * decimal below 2^32 that names a stored shard under shard/; ENOENT for any
 * other name, ENOTDIR under a file. Every component is also given to the
 * parsers directly (fs_parse_block, fs_parse_shard, sfs_block_from_hex), which
 * must agree with the model and print back to the very name they accepted.
 * At the end every reference is forgotten and the inode table must be empty.
 */
#include "fuzz_fs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_COMPONENTS 32

static struct fs *fs;
static const struct sfs_block_id block_a = {{0}};
static const struct sfs_block_id block_b = {{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe,
                                             0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10}};
static const struct {
    const struct sfs_block_id *block;
    uint32_t shard;
} stored[] = {{&block_a, 0}, {&block_a, 1}, {&block_a, 7}, {&block_a, UINT32_MAX}, {&block_b, 12}};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fs = fz_fs_setup("mem");
    for (size_t i = 0; i < sizeof(stored) / sizeof(stored[0]); i++)
        fz_fs_store(fs, stored[i].block, stored[i].shard, (int)i + 1);
    return 0;
}

/* ---------------------------------------------------------------------------
 * The model: what docs/fs.md says exists.
 */

static int hexval(char c, bool upper_ok)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (upper_ok && c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static bool model_block(const char *s, size_t n, bool upper_ok, struct sfs_block_id *out)
{
    if (n != SFS_BLOCK_HEX_LEN)
        return false;
    for (size_t i = 0; i < n; i += 2) {
        int hi = hexval(s[i], upper_ok), lo = hexval(s[i + 1], upper_ok);

        if (hi < 0 || lo < 0)
            return false;
        out->b[i / 2] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

static bool model_shard(const char *s, size_t n, uint32_t *out)
{
    uint64_t v = 0;

    if (n == 0 || n > 10 || (n > 1 && s[0] == '0'))
        return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    return true;
}

static bool model_stored(const struct sfs_block_id *block, uint32_t shard)
{
    for (size_t i = 0; i < sizeof(stored) / sizeof(stored[0]); i++)
        if (stored[i].shard == shard && memcmp(stored[i].block, block, sizeof(*block)) == 0)
            return true;
    return false;
}

/* The child `name` of parent in the model: 0 and *out, or a positive errno. */
static int model_child(const struct fs_obj *parent, const char *name, struct fs_obj *out)
{
    size_t n = strlen(name);
    struct sfs_block_id id;
    uint32_t shard;

    memset(out, 0, sizeof(*out));
    switch (parent->kind) {
    case FS_ROOT:
        if (strcmp(name, "block") == 0)
            out->kind = FS_BLOCKS;
        else if (strcmp(name, "stats") == 0)
            out->kind = FS_STATS;
        else
            return ENOENT;
        return 0;
    case FS_BLOCKS:
        if (!model_block(name, n, false, &id))
            return ENOENT;
        out->kind = FS_BLOCK;
        out->key.block = id;
        return 0;
    case FS_BLOCK:
        if (strcmp(name, "shard") != 0)
            return ENOENT;
        out->kind = FS_SHARDDIR;
        out->key.block = parent->key.block;
        return 0;
    case FS_SHARDDIR:
        if (!model_shard(name, n, &shard) || !model_stored(&parent->key.block, shard))
            return ENOENT;
        out->kind = FS_SHARD;
        out->key.block = parent->key.block;
        out->key.shard = shard;
        return 0;
    default:
        return ENOTDIR;
    }
}

static bool obj_same(const struct fs_obj *x, const struct fs_obj *y)
{
    return x->kind == y->kind && x->key.shard == y->key.shard &&
           memcmp(&x->key.block, &y->key.block, sizeof(x->key.block)) == 0;
}

/* ---------------------------------------------------------------------------
 * The parsers, directly.
 */

static void check_parsers(const char *name, size_t n)
{
    struct sfs_block_id want, got;
    uint32_t ws = 0, gs = 0;
    bool wb = model_block(name, n, false, &want), gb = fs_parse_block(name, &got);
    char back[SFS_BLOCK_HEX_LEN + 1], dec[16];

    if (wb != gb)
        fz_fail("fs_parse_block(\"%s\") = %d, model %d", name, gb, wb);
    if (gb) {
        if (memcmp(&want, &got, sizeof(got)) != 0)
            fz_fail("fs_parse_block(\"%s\"): wrong id", name);
        sfs_block_to_hex(&got, back);
        if (strcmp(back, name) != 0)
            fz_fail("block \"%s\" prints back as \"%s\"", name, back);
    }
    /* The core's parser takes either case and a length, not a C string. */
    wb = model_block(name, n, true, &want);
    gb = sfs_block_from_hex(name, n, &got) == 0;
    if (wb != gb || (gb && memcmp(&want, &got, sizeof(got)) != 0))
        fz_fail("sfs_block_from_hex(\"%s\", %zu) = %d, model %d", name, n, gb, wb);

    bool wsh = model_shard(name, n, &ws), gsh = fs_parse_shard(name, &gs);
    if (wsh != gsh || (gsh && ws != gs))
        fz_fail("fs_parse_shard(\"%s\") = %d (%u), model %d (%u)", name, gsh, gs, wsh, ws);
    if (gsh) {
        snprintf(dec, sizeof(dec), "%u", gs);
        if (strcmp(dec, name) != 0)
            fz_fail("shard \"%s\" prints back as \"%s\"", name, dec);
    }
}

/* ---------------------------------------------------------------------------
 * The walk.
 */

static bool is_dir(int kind)
{
    return kind == FS_ROOT || kind == FS_BLOCKS || kind == FS_BLOCK || kind == FS_SHARDDIR;
}

static void check_attr(const struct stat *st, fuse_ino_t ino, int kind, const char *name)
{
    /* Fixed objects show their node number; the others a number derived
     * from what they name (attr.c), never one of the fixed ones. */
    if (ino < FS_INO_DYNAMIC ? st->st_ino != ino : st->st_ino < FS_INO_DYNAMIC)
        fz_fail("\"%s\": attr of inode %llu says %llu", name, (unsigned long long)ino,
                (unsigned long long)st->st_ino);
    if (is_dir(kind) ? !S_ISDIR(st->st_mode) : !S_ISREG(st->st_mode))
        fz_fail("\"%s\": kind %d has mode %o", name, kind, st->st_mode);
    if (kind == FS_SHARD && st->st_size != (off_t)FZ_SHARD_SIZE)
        fz_fail("\"%s\": a shard of %lld bytes", name, (long long)st->st_size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuse_ino_t refs[MAX_COMPONENTS];
    struct fuse_forget_data forgets[MAX_COMPONENTS];
    unsigned nrefs = 0;
    struct fs_obj cur = {.kind = FS_ROOT};
    fuse_ino_t ino = FS_INO_ROOT;
    char *path = malloc(size + 1);

    if (!path)
        return 0;
    memcpy(path, data, size);
    path[size] = '\0';
    for (size_t i = 0; i < size; i++)
        if (path[i] == '/')
            path[i] = '\0';

    bool walking = true;
    for (size_t at = 0; at < size && nrefs < MAX_COMPONENTS;) {
        const char *name = path + at;
        size_t n = strlen(name);

        at += n + 1;
        if (n == 0)
            continue; /* "//": the kernel never sends an empty name */
        check_parsers(name, n);
        if (!walking)
            continue;

        struct fs_obj want;
        int werr = model_child(&cur, name, &want);
        struct fuse_req req;

        fz_req_init(&req, fs);
        fs_ops.lookup(&req, ino, name);
        fz_req_check_one(&req, "lookup");
        if (werr) {
            if (req.kind != FZ_ERR || req.err != werr)
                fz_fail("lookup \"%s\" in kind %d: reply %d errno %d, model errno %d", name,
                        cur.kind, req.kind, req.err, werr);
            walking = false; /* the kernel stops at the first error */
            continue;
        }
        if (req.kind != FZ_ENTRY)
            fz_fail("lookup \"%s\" in kind %d: reply %d errno %d, model: an entry", name, cur.kind,
                    req.kind, req.err);
        check_attr(&req.attr, req.ino, want.kind, name);
        refs[nrefs++] = req.ino;

        /* The number resolves to what was looked up, and getattr agrees. */
        struct fs_obj back;
        if (fs_resolve(fs, req.ino, &back) != 0 || !obj_same(&back, &want))
            fz_fail("\"%s\": inode %llu does not resolve to its object", name,
                    (unsigned long long)req.ino);
        ino = req.ino;
        cur = want;
        fz_req_init(&req, fs);
        fs_ops.getattr(&req, ino, NULL);
        fz_req_check_one(&req, "getattr");
        if (req.kind != FZ_ATTR)
            fz_fail("getattr \"%s\": reply %d errno %d", name, req.kind, req.err);
        check_attr(&req.attr, ino, want.kind, name);
    }

    /* Forget every reference, half one by one and half in a batch, as the
     * kernel does: the table must be empty again. */
    unsigned half = nrefs / 2, nf = 0;
    for (unsigned i = 0; i < half; i++) {
        struct fuse_req req;

        fz_req_init(&req, fs);
        fs_ops.forget(&req, refs[i], 1);
        fz_req_check_one(&req, "forget");
    }
    for (unsigned i = half; i < nrefs; i++)
        forgets[nf++] = (struct fuse_forget_data){.ino = refs[i], .nlookup = 1};
    if (nf) {
        struct fuse_req req;

        fz_req_init(&req, fs);
        fs_ops.forget_multi(&req, nf, forgets);
        fz_req_check_one(&req, "forget_multi");
    }
    pthread_mutex_lock(&fs->lock);
    size_t left = fs->nnodes;
    pthread_mutex_unlock(&fs->lock);
    if (left != 0)
        fz_fail("%zu inode table nodes left after every reference was forgotten", left);
    for (unsigned i = 0; i < nrefs; i++) {
        struct fs_obj o;

        if (refs[i] >= FS_INO_DYNAMIC && fs_resolve(fs, refs[i], &o) != -ESTALE)
            fz_fail("inode %llu still resolves after its last forget", (unsigned long long)refs[i]);
    }
    free(path);
    return 0;
}
