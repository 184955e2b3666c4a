/* SPDX-License-Identifier: MIT */
/*
 * fuzz_xattr_value.c - libFuzzer target: the mount's extended attributes
 * (fs/xattr.c), names and values.
 *
 * Input: one byte choosing the inode (root, block/, stats, a block, its shard
 * directory, a stored shard, a shard the backend lacks, a stale number), one
 * byte choosing the call (set, get, list, remove) and the buffer size a get
 * or list passes, then the attribute's name up to a NUL and its value (the
 * rest). The harness calls the daemon's real handlers on a real cache over a
 * fault backend (fault over mem, so user.shardfs.fault parses real options)
 * and checks every answer against docs/fs.md: touch and prefetch on a block
 * take exactly "1" or "1\n" (else EINVAL); state on a shard is one of five
 * words; socket on the root is the socket path; a get or list with size 0
 * answers the length, with a smaller buffer ERANGE; unknown names ENODATA on
 * get and ENOTSUP on set; a stale inode ESTALE; exactly one reply each time.
 */
#include "fuzz_fs.h"

#include <shardfs/fault.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum { OP_SET, OP_GET, OP_LIST, OP_REMOVE };
enum { T_ROOT, T_BLOCKS, T_STATS, T_BLOCK, T_SHARDDIR, T_SHARD, T_SHARD_ABSENT, T_STALE, T_COUNT };

#define STALE_INO 0x7fffffffull

static struct fs *fs;
static fuse_ino_t inos[T_COUNT];
static int kinds[T_COUNT];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    static const struct sfs_block_id block = {{0xab, 0xcd}};
    struct fs_obj o;

    fs = fz_fs_setup("fault::mem");
    /* Two shards: prefetch and touch have something to do, and little. */
    fz_fs_store(fs, &block, 0, 1);
    fz_fs_store(fs, &block, 1, 2);
    inos[T_ROOT] = FS_INO_ROOT;
    kinds[T_ROOT] = FS_ROOT;
    inos[T_BLOCKS] = FS_INO_BLOCKS;
    kinds[T_BLOCKS] = FS_BLOCKS;
    inos[T_STATS] = FS_INO_STATS;
    kinds[T_STATS] = FS_STATS;
    /* The others hold one reference each for the life of the process. */
    o = fs_make_obj(FS_BLOCK, &block, 0);
    inos[T_BLOCK] = fs_obj_ref(fs, &o, false);
    kinds[T_BLOCK] = FS_BLOCK;
    o = fs_make_obj(FS_SHARDDIR, &block, 0);
    inos[T_SHARDDIR] = fs_obj_ref(fs, &o, false);
    kinds[T_SHARDDIR] = FS_SHARDDIR;
    o = fs_make_obj(FS_SHARD, &block, 0);
    inos[T_SHARD] = fs_obj_ref(fs, &o, false);
    kinds[T_SHARD] = FS_SHARD;
    o = fs_make_obj(FS_SHARD, &block, 123456);
    inos[T_SHARD_ABSENT] = fs_obj_ref(fs, &o, false);
    kinds[T_SHARD_ABSENT] = FS_SHARD;
    inos[T_STALE] = STALE_INO;
    kinds[T_STALE] = 0;
    for (int i = 0; i < T_COUNT; i++)
        if (!inos[i])
            fz_fail("no inode for target %d", i);
    return 0;
}

static bool value_is_one(const char *v, size_t n)
{
    return (n == 1 && v[0] == '1') || (n == 2 && v[0] == '1' && v[1] == '\n');
}

/* A get or list answer of the text want (len bytes) to a buffer of size. */
static void check_sized(const struct fuse_req *req, const char *want, size_t len, size_t size,
                        const char *what)
{
    if (size == 0) {
        if (req->kind != FZ_XATTR || req->size != len)
            fz_fail("%s, size 0: reply %d size %zu, want the length %zu", what, req->kind,
                    req->size, len);
    } else if (size < len) {
        if (req->kind != FZ_ERR || req->err != ERANGE)
            fz_fail("%s, size %zu < %zu: reply %d errno %d, want ERANGE", what, size, len,
                    req->kind, req->err);
    } else if (req->kind != FZ_BUF || req->size != len ||
               (want && memcmp(req->buf, want, len) != 0)) {
        fz_fail("%s, size %zu: reply %d of %zu bytes, want %zu bytes", what, size, req->kind,
                req->size, len);
    }
}

static void check_err(const struct fuse_req *req, int want, const char *what)
{
    if (req->kind != FZ_ERR || req->err != want)
        fz_fail("%s: reply %d errno %d, want errno %d", what, req->kind, req->err, want);
}

static void do_set(int t, const char *name, const char *value, size_t vlen)
{
    struct fuse_req req;
    int kind = kinds[t];

    fz_req_init(&req, fs);
    fs_op_setxattr(&req, inos[t], name, value, vlen, 0);
    fz_req_check_one(&req, "setxattr");
    if (t == T_STALE) {
        check_err(&req, ESTALE, "setxattr on a stale inode");
    } else if (kind == FS_BLOCK && (strcmp(name, "user.shardfs.touch") == 0 ||
                                    strcmp(name, "user.shardfs.prefetch") == 0)) {
        check_err(&req, value_is_one(value, vlen) ? 0 : EINVAL, name);
    } else if (kind == FS_BLOCK && strcmp(name, "user.shardfs.pin") == 0) {
        /* Decimal seconds, an optional newline, at most SFS_PIN_MAX_SECONDS
         * (fs.md); a good value may still meet the pin budget (EDQUOT), a
         * full pin table (ENOSPC) or pins turned off (EPERM). */
        size_t n = vlen && value[vlen - 1] == '\n' ? vlen - 1 : vlen;
        bool ok = n > 0 && n <= 10;
        uint64_t v = 0;

        for (size_t i = 0; ok && i < n; i++) {
            ok = value[i] >= '0' && value[i] <= '9';
            v = v * 10 + (uint64_t)(value[i] - '0');
        }
        ok = ok && v <= SFS_PIN_MAX_SECONDS;
        if (!ok)
            check_err(&req, EINVAL, name);
        else if (req.kind != FZ_ERR ||
                 (req.err != 0 && req.err != EDQUOT && req.err != ENOSPC && req.err != EPERM))
            fz_fail("user.shardfs.pin=%.*s: reply %d errno %d", (int)vlen, value, req.kind,
                    req.err);
    } else if (kind == FS_ROOT && strcmp(name, "user.shardfs.fault") == 0) {
        /* The option grammar is the fault backend's: any value is accepted
         * or EINVAL, nothing else; and "off" always clears. */
        if (req.kind != FZ_ERR || (req.err != 0 && req.err != EINVAL))
            fz_fail("user.shardfs.fault: reply %d errno %d", req.kind, req.err);
        if (req.err == 0) {
            fz_req_init(&req, fs);
            fs_op_setxattr(&req, inos[T_ROOT], name, "off", 3, 0);
            fz_req_check_one(&req, "setxattr fault off");
            check_err(&req, 0, "user.shardfs.fault=off");
        }
    } else {
        check_err(&req, ENOTSUP, "setxattr of an unknown name");
    }
}

static void do_get(int t, const char *name, size_t size)
{
    static const char *const words[] = {"absent", "idle",   "loading",
                                        "ready",  "failed", "ready,pinned"};
    struct fuse_req req;
    int kind = kinds[t];

    fz_req_init(&req, fs);
    fs_op_getxattr(&req, inos[t], name, size);
    fz_req_check_one(&req, "getxattr");
    if (t == T_STALE) {
        check_err(&req, ESTALE, "getxattr on a stale inode");
    } else if (kind == FS_SHARD && strcmp(name, "user.shardfs.state") == 0) {
        /* The state may change under us (a prefetch completes): any word,
         * each answered by its own length. */
        size_t len = req.kind == FZ_XATTR ? req.size : req.kind == FZ_BUF ? req.size : 0;
        const char *want = NULL;

        for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
            if (strlen(words[i]) == len &&
                (req.kind != FZ_BUF || memcmp(req.buf, words[i], len) == 0))
                want = words[i];
        if (req.kind == FZ_ERR && req.err == ERANGE && size > 0 && size < 12)
            return; /* shorter than some word ("ready,pinned" is the longest):
                     * which one is not ours to know */
        if (!want)
            fz_fail("user.shardfs.state: reply %d errno %d size %zu: not a state word", req.kind,
                    req.err, req.size);
        check_sized(&req, want, len, size, "user.shardfs.state");
    } else if (kind == FS_ROOT && strcmp(name, "user.shardfs.socket") == 0) {
        check_sized(&req, fs->socket_path, strlen(fs->socket_path), size, "user.shardfs.socket");
    } else {
        check_err(&req, ENODATA, "getxattr of an unknown name");
    }
}

static void do_list(int t, size_t size)
{
    struct fuse_req req;
    int kind = kinds[t];

    fz_req_init(&req, fs);
    fs_op_listxattr(&req, inos[t], size);
    fz_req_check_one(&req, "listxattr");
    if (t == T_STALE)
        check_err(&req, ESTALE, "listxattr on a stale inode");
    else if (kind == FS_SHARD)
        check_sized(&req, "user.shardfs.state", sizeof("user.shardfs.state"), size, "list");
    else if (kind == FS_ROOT)
        check_sized(&req, "user.shardfs.socket", sizeof("user.shardfs.socket"), size, "list");
    else
        check_sized(&req, "", 0, size, "list");
}

static void do_remove(int t, const char *name)
{
    struct fuse_req req;
    bool ours = strcmp(name, "user.shardfs.touch") == 0 ||
                strcmp(name, "user.shardfs.prefetch") == 0 ||
                strcmp(name, "user.shardfs.pin") == 0 || strcmp(name, "user.shardfs.state") == 0 ||
                strcmp(name, "user.shardfs.socket") == 0;

    fz_req_init(&req, fs);
    fs_op_removexattr(&req, inos[t], name);
    fz_req_check_one(&req, "removexattr");
    check_err(&req, ours ? ENOTSUP : ENODATA, "removexattr");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int t = data[0] % T_COUNT;
    int op = data[1] & 3;
    size_t bufsize = data[1] >> 2; /* 0..63: the sizes around every answer's length */
    const char *rest = (const char *)data + 2;
    size_t n = size - 2;
    const char *nul = memchr(rest, '\0', n);
    size_t name_len = nul ? (size_t)(nul - rest) : n;

    /* A C string for the name, as libfuse passes it (the kernel bounds it
     * at XATTR_NAME_MAX), and the value as bytes with no terminator. */
    char name[256];
    if (name_len >= sizeof(name))
        return 0;
    memcpy(name, rest, name_len);
    name[name_len] = '\0';
    size_t vlen = nul ? n - name_len - 1 : 0;
    char *value = malloc(vlen ? vlen : 1);
    if (!value)
        return 0;
    memcpy(value, nul ? nul + 1 : rest, vlen);

    switch (op) {
    case OP_SET:
        do_set(t, name, value, vlen);
        break;
    case OP_GET:
        do_get(t, name, bufsize);
        break;
    case OP_LIST:
        do_list(t, bufsize);
        break;
    default:
        do_remove(t, name);
        break;
    }
    free(value);
    return 0;
}
