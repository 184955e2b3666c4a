/* SPDX-License-Identifier: MIT */
/*
 * fuzz_fs.c - a fake libfuse request and the daemon's state, for the fs fuzz
 * targets (see fuzz_fs.h).
 *
 * Every reply function the rooms of fs/ call is defined here, so the linker
 * binds the rooms to these and not to libfuse3's: a handler's answer lands
 * in the struct fuse_req the harness passed. The replies a harness does not
 * expect (open, create, write, statfs) abort: reaching them from a lookup or
 * an xattr handler would itself be a finding.
 */
#include "fuzz_fs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fz_req_init(struct fuse_req *req, struct fs *fs)
{
    memset(req, 0, sizeof(*req));
    req->fs = fs;
}

void fz_req_check_one(const struct fuse_req *req, const char *op)
{
    if (req->nreplies != 1)
        fz_fail("%s answered %d times (exactly one fuse_reply_* per handler)", op, req->nreplies);
}

static void note(fuse_req_t req, enum fz_reply_kind kind)
{
    req->nreplies++;
    req->kind = kind;
}

/* ---------------------------------------------------------------------------
 * libfuse, as the handlers see it.
 */

void *fuse_req_userdata(fuse_req_t req)
{
    return req->fs;
}

int fuse_reply_err(fuse_req_t req, int err)
{
    note(req, FZ_ERR);
    req->err = err;
    return 0;
}

void fuse_reply_none(fuse_req_t req)
{
    note(req, FZ_NOREPLY);
}

int fuse_reply_entry(fuse_req_t req, const struct fuse_entry_param *e)
{
    note(req, FZ_ENTRY);
    req->ino = e->ino;
    req->attr = e->attr;
    return 0;
}

int fuse_reply_attr(fuse_req_t req, const struct stat *attr, double attr_timeout)
{
    note(req, FZ_ATTR);
    req->attr = *attr;
    return 0;
}

int fuse_reply_buf(fuse_req_t req, const char *buf, size_t size)
{
    note(req, FZ_BUF);
    req->size = size;
    if (size) /* an empty reply may come with no buffer at all */
        memcpy(req->buf, buf, size < sizeof(req->buf) ? size : sizeof(req->buf));
    return 0;
}

int fuse_reply_xattr(fuse_req_t req, size_t count)
{
    note(req, FZ_XATTR);
    req->size = count;
    return 0;
}

int fuse_reply_open(fuse_req_t req, const struct fuse_file_info *fi)
{
    fz_fail("unexpected fuse_reply_open");
}

int fuse_reply_create(fuse_req_t req, const struct fuse_entry_param *e,
                      const struct fuse_file_info *fi)
{
    fz_fail("unexpected fuse_reply_create");
}

int fuse_reply_write(fuse_req_t req, size_t count)
{
    fz_fail("unexpected fuse_reply_write");
}

int fuse_reply_statfs(fuse_req_t req, const struct statvfs *stbuf)
{
    fz_fail("unexpected fuse_reply_statfs");
}

/* ---------------------------------------------------------------------------
 * The daemon's state.
 */

struct fs *fz_fs_setup(const char *spec)
{
    static struct fs fs;
    struct sfs_cache_config cfg = {.shard_size = FZ_SHARD_SIZE,
                                   .nslots = 64,
                                   .max_procs = 4,
                                   .max_leases = 256,
                                   .hugepages = SFS_HUGEPAGES_OFF};
    struct sfs_backend_params bp = {.shard_size = FZ_SHARD_SIZE};
    char errbuf[256] = "";
    int err = 0;

    memset(&fs, 0, sizeof(fs));
    fs.shard_size = FZ_SHARD_SIZE;
    fs.max_read = 128u << 10;
    fs.wait_ns = 1000 * 1000 * 1000ll;
    snprintf(fs.socket_path, sizeof(fs.socket_path), "/run/shardfs/fuzz.sock");
    clock_gettime(CLOCK_REALTIME, &fs.start);
    if (fs_table_init(&fs) < 0)
        fz_fail("fs_table_init");
    fs.be = sfs_backend_open(spec, &bp, errbuf, sizeof(errbuf), &err);
    if (!fs.be)
        fz_fail("backend %s: %s (%d)", spec, errbuf, err);
    fs.cache = sfs_cache_create(&cfg, &err);
    if (!fs.cache)
        fz_fail("sfs_cache_create: %d", err);
    return &fs;
}

void fz_fs_store(struct fs *fs, const struct sfs_block_id *block, uint32_t shard, int fill)
{
    static uint8_t buf[FZ_SHARD_SIZE];
    struct sfs_key k = {.block = *block, .shard = shard};
    int r;

    memset(buf, fill, sizeof(buf));
    r = sfs_backend_dump_sync(fs->be, &k, buf, sizeof(buf));
    if (r < 0)
        fz_fail("storing shard %u: %d", shard, r);
}
