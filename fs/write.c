/* SPDX-License-Identifier: MIT */
/*
 * write.c - the write path: open files, and shards written whole.
 *
 * A write handle buffers the whole shard in private memory (starting from the
 * stored bytes, or zeros for a new shard or O_TRUNC) and records, one bit per
 * byte, which bytes were written through it. A shard is replaced only by a
 * whole new shard: a FLUSH (any close(2) of the open file: a dup's, a child's
 * inherited copy at exec or exit) or an fsync stores the buffer only once
 * every byte [0, shard_size) was written through that open file; before
 * that it stores nothing, fails with ENODATA (the writer learns it from
 * close(2)) and keeps the bytes for a completing close of another
 * descriptor, and the last RELEASE discards an incomplete buffer with one
 * log line. A store that fails is reported to that close/fsync and is
 * final: the handle stores nothing after it.
 *
 * A store: a Get with SFS_GET_WRITE takes the slot (the cache's per-key
 * writer lock, shared with the ranks' dumps), the bytes go in, the backend
 * writes them through (its tmp + rename commit), and the slot is published
 * as written. create, mknod and setattr (truncate) end in the same store.
 * Nothing is ever written around the cache: a store that cannot take the
 * key's slot stores nothing and fails (EAGAIN, EBUSY).
 * Open files are listed so that those the kernel never releases are freed at
 * exit.
 */
#include "fs_i.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>

/* ---------------------------------------------------------------------------
 * The write path: whole shards, written through.
 */

/* One try at the key's slot for writing: its lease, or -EBUSY while a
 * reader holds the old bytes. */
static int take_for_store(struct fs *fs, const struct sfs_key *key, void *arg)
{
    struct fs_take *t = arg;
    int r;

    /* Our own page-cache pin would make the slot busy: drop it (the
     * kernel's pages of the old bytes go with it). Again each try: a reader
     * may have pinned it anew. */
    fs_pin_drop(fs, key, false);
    r = sfs_cache_get(fs->cache, key, SFS_GET_WRITE, t->deadline, t->lease);
    if (r >= 0 && r != SFS_OWNER) {
        sfs_cache_release(fs->cache, t->lease); /* not ours to write: try again */
        r = -EBUSY;
    }
    return r;
}

/* Store one whole shard: take the slot for writing, fill it, dump it to the
 * backend (tmp + rename there), publish it as written. Returns 0 or -errno:
 * -EBUSY when the key stayed leased, -EAGAIN when no slot could be had,
 * until wait_timeout; either way nothing was stored. */
static int store_shard(struct fs *fs, const struct sfs_key *key, const void *buf)
{
    uint32_t len = (uint32_t)fs->shard_size;
    struct sfs_lease l;
    struct fs_take t = {&l, sfs_deadline_after(fs->wait_ns)};
    void *data;
    int r;

    r = fs_retry_busy(fs, key, t.deadline, 0, take_for_store, &t);
    if (r == -EBUSY)
        return r; /* leased until the deadline: nothing stored */
    if (r == -ENOSPC || r == -ENOBUFS) {
        /* Every slot leased until the deadline: store nothing, the writer's
         * error, as a read's (EAGAIN) and a rank's dump (-ENOSPC) are. Never
         * around the cache: without the key's slot (its writer lock) a
         * reader could take a slot released meanwhile, load the previous
         * block file and publish those bytes after this commit, so the
         * cache would serve an older version than the store's. */
        return -EAGAIN;
    }
    if (r < 0)
        return r;
    data = sfs_cache_data(fs->cache, &l);
    if (!data) {
        r = -EIO;
    } else {
        memcpy(data, buf, len);
        r = sfs_backend_dump_sync(fs->be, key, data, len);
    }
    if (r == (int)len) {
        CTR_ADD(fs, writes, 1);
        fs_storecap_note(fs, len);
    } else
        CTR_ADD(fs, backend_errors, 1);
    /* Published only when the store has every byte; a publish refused
     * (-EPERM) is the writer's error too. */
    r = sfs_cache_settle(fs->cache, &l, r, len, SFS_PUBLISH_WRITTEN);
    sfs_cache_release(fs->cache, &l);
    return r;
}

/* Mark bytes [from, to) written; returns how many were not marked before. */
static uint64_t bits_set(uint64_t *w, uint64_t from, uint64_t to)
{
    uint64_t added = 0;

    while (from < to) {
        uint64_t i = from / 64, b = from % 64, n = to - from < 64 - b ? to - from : 64 - b;
        uint64_t mask = (n == 64 ? ~0ull : ((1ull << n) - 1)) << b;

        added += (uint64_t)__builtin_popcountll(mask & ~w[i]);
        w[i] |= mask;
        from += n;
    }
    return added;
}

/* Under h->lock, on a write handle counted by fs_writers_add: mark whether it
 * holds bytes not yet stored. */
static void handle_set_dirty(struct fs *fs, struct fs_handle *h, bool dirty)
{
    if (h->dirty == dirty)
        return;
    h->dirty = dirty;
    fs_writers_add(fs, &h->obj, 0, dirty ? 1 : -1);
}

/* Put h on fs->handles: call before answering the open. */
static void handle_track(struct fs *fs, struct fs_handle *h)
{
    pthread_mutex_lock(&fs->lock);
    h->fs = fs;
    h->prev = NULL;
    h->next = fs->handles;
    if (h->next)
        h->next->prev = h;
    fs->handles = h;
    pthread_mutex_unlock(&fs->lock);
}

static void handle_free(struct fs_handle *h)
{
    if (!h)
        return;
    if (h->fs) {
        struct fs *fs = h->fs;

        pthread_mutex_lock(&fs->lock);
        if (h->prev)
            h->prev->next = h->next;
        else
            fs->handles = h->next;
        if (h->next)
            h->next->prev = h->prev;
        pthread_mutex_unlock(&fs->lock);
    }
    if (h->writable)
        pthread_mutex_destroy(&h->lock);
    free(h->buf);
    free(h->written);
    free(h->text);
    free(h);
}

/* Files still open when the session ended: the kernel will not release
 * them any more. Bytes written and not stored are lost: say so. */
void fs_handles_drop(struct fs *fs)
{
    while (fs->handles) {
        struct fs_handle *h = fs->handles;

        if (h->writable && h->dirty) {
            char hex[SFS_BLOCK_HEX_LEN + 1];

            sfs_block_to_hex(&h->obj.key.block, hex);
            fprintf(stderr,
                    "shardfs: stopping: block %s shard %u was open for writing; "
                    "bytes not yet stored are lost\n",
                    hex, h->obj.key.shard);
        }
        handle_free(h);
    }
}

/* A write handle on shard o: the buffer starts from the stored bytes unless
 * truncating or new. */
static int open_writer(struct fs *fs, const struct fs_obj *o, int flags, bool creating,
                       struct fs_handle **out)
{
    struct fs_handle *h = calloc(1, sizeof(*h));
    int r = 0;

    if (!h)
        return -ENOMEM;
    h->obj = *o;
    h->writable = true;
    /* Bound: shard_size bytes plus shard_size / 8 for the map, per handle. */
    h->buf = calloc(1, fs->shard_size);
    h->written = calloc((fs->shard_size + 63) / 64, sizeof(*h->written));
    if (!h->buf || !h->written) {
        free(h->buf);
        free(h->written);
        free(h);
        return -ENOMEM;
    }
    pthread_mutex_init(&h->lock, NULL);
    /* The stored bytes, for reading back (O_RDWR) and for a truncate. They
     * do not count as written: a new shard is whatever this file writes. */
    h->from_zeros = true;
    if (!(flags & O_TRUNC) && !creating && fs_shard_exists(fs, &o->key)) {
        r = fs_load_copy(fs, &o->key, h->buf);
        if (r == -ENOENT)
            r = 0; /* removed meanwhile: starts as zeros */
        else
            h->from_zeros = false;
    }
    /* A new name is stored as zeros on the first FLUSH if nothing is
     * written (touch, like mknod); an existing one only by a whole shard. */
    h->creating = creating;
    h->dirty = creating;
    if (r < 0) {
        handle_free(h);
        return r;
    }
    *out = h;
    return 0;
}

/* Under h->lock: the buffer is a whole new shard (every byte written through
 * this file, or a created name with nothing written). */
static bool handle_whole(struct fs *fs, const struct fs_handle *h)
{
    return h->nwritten == fs->shard_size || (h->creating && !h->wrote);
}

/* Under h->lock: store the buffer. A failure is final: it is the outcome
 * reported to the writer, so the bytes are dropped and nothing is stored
 * after it (a later FLUSH or RELEASE answers the same error). */
static int handle_store(struct fs *fs, struct fs_handle *h)
{
    int r = store_shard(fs, &h->obj.key, h->buf);

    if (r < 0)
        h->error = r;
    h->kept = false;
    handle_set_dirty(fs, h, false);
    return r;
}

/* FLUSH (closing) and fsync: store the buffer once it is a whole shard. An
 * incomplete one is not stored, and that is the writer's error, -ENODATA: a
 * close(2) (or fsync(2)) that returns 0 stored the shard. The bytes are
 * kept all the same, since the kernel sends a FLUSH for every close of any
 * copy of the file and does not say which is the last: more may still come
 * through another descriptor and complete the shard, and a later close then
 * stores it. A FLUSH that reports an incomplete shard stops counting the
 * handle as a holder of unstored bytes (until it is written again): the
 * writer was told, so a name never stored is absent again at once (its
 * entries carry no timeout while a writer holds it: attr.c), and an unlink
 * is not refused for it. */
static int flush_handle(struct fs *fs, struct fs_handle *h, bool closing)
{
    int r = 0;

    if (!h || !h->writable)
        return 0;
    pthread_mutex_lock(&h->lock);
    if (h->error) {
        r = h->error;
    } else if (h->dirty && handle_whole(fs, h)) {
        r = handle_store(fs, h);
    } else if (h->dirty || h->kept) {
        r = -ENODATA;
        if (closing && h->dirty) {
            h->kept = true;
            handle_set_dirty(fs, h, false);
        }
    }
    pthread_mutex_unlock(&h->lock);
    return r;
}

void fs_op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct fs_handle *h = NULL;
    struct fs_obj o;
    bool wr = (fi->flags & O_ACCMODE) != O_RDONLY;
    int r = fs_resolve(fs, ino, &o);

    if (r < 0)
        goto out_err;
    switch (o.kind) {
    case FS_STATS: {
        char buf[STATS_MAX];

        if (wr) {
            r = -EACCES;
            goto out_err;
        }
        h = calloc(1, sizeof(*h));
        if (!h) {
            r = -ENOMEM;
            goto out_err;
        }
        h->obj = o;
        h->text_len = fs_stats_text(fs, buf, sizeof(buf));
        if (h->text_len >= sizeof(buf))
            h->text_len = sizeof(buf) - 1;
        h->text = strndup(buf, h->text_len);
        if (!h->text) {
            free(h);
            r = -ENOMEM;
            goto out_err;
        }
        break;
    }
    case FS_SHARD:
        if (wr) {
            if (fs->ro) {
                r = -EROFS;
                goto out_err;
            }
            r = open_writer(fs, &o, fi->flags, false, &h);
            if (r < 0)
                goto out_err;
            fs_writers_add(fs, &o, 1, h->dirty ? 1 : 0);
        } else {
            h = calloc(1, sizeof(*h));
            if (!h) {
                r = -ENOMEM;
                goto out_err;
            }
            h->obj = o;
        }
        break;
    default:
        r = -EISDIR;
        goto out_err;
    }
    fi->fh = (uintptr_t)h;
    /* -o page_cache: a shard opened for reading is served by the kernel's
     * page cache, kept across opens (pagecache.c keeps it coherent); not
     * while the mount has it open for writing: the kernel tracks the size
     * the writer's O_TRUNC and writes leave, and a cached read would stop
     * there (a direct_io read does not). */
    fi->direct_io =
        !(fs->pc_max && o.kind == FS_SHARD && !h->writable && !fs_has_write_handles(fs, &o));
    fi->keep_cache = !fi->direct_io;
    if (!fi->direct_io) {
        /* Counted on its node, which keeps the version it reads; an old
         * version's node opens no more files (ESTALE: the kernel looks the
         * name up again and finds the new one). */
        r = fs_reader_open(fs, ino);
        if (r < 0) {
            handle_free(h);
            goto out_err;
        }
        h->cached = true;
        h->ino = ino;
    }
    /* Closing a reader has nothing to store: spare the FLUSH round trip. */
    fi->noflush = !h->writable;
    handle_track(fs, h);
    if (fuse_reply_open(req, fi) != 0) {
        if (h->writable)
            fs_writers_add(fs, &o, -1, h->dirty ? -1 : 0);
        if (h->cached && fs_reader_close(fs, ino) && fs->se)
            fuse_lowlevel_notify_inval_inode(fs->se, ino, 0, 0);
        handle_free(h);
    }
    return;
out_err:
    fuse_reply_err(req, -r);
}

/* The shard a create or mknod names: a regular file in a shard/ directory
 * of a writable mount. */
static int new_shard_obj(struct fs *fs, fuse_ino_t parent, const char *name, mode_t mode,
                         struct fs_obj *o)
{
    struct fs_obj p;
    int r = fs_resolve(fs, parent, &p);

    if (r < 0)
        return r;
    if (fs->ro)
        return -EROFS;
    if (!S_ISREG(mode) || p.kind != FS_SHARDDIR)
        return p.kind == FS_SHARDDIR ? -EINVAL : -ENOENT;
    return fs_child_obj(fs, &p, name, false, o);
}

void fs_op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                  struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct fuse_entry_param e;
    struct fs_handle *h = NULL;
    struct fs_obj o;
    int r = new_shard_obj(fs, parent, name, mode, &o);

    if (r < 0)
        goto out_err;
    r = open_writer(fs, &o, fi->flags, true, &h);
    if (r < 0)
        goto out_err;
    memset(&e, 0, sizeof(e));
    e.ino = fs_obj_ref(fs, &o, true);
    if (!e.ino) {
        handle_free(h);
        r = -ENOMEM;
        goto out_err;
    }
    fs_fill_attr(fs, &o, e.ino, &e.attr);
    /* No timeout: the name exists only while this writer holds it, until
     * a store (attr.c, fs_reply_entry). */
    e.attr_timeout = 0.0;
    e.entry_timeout = 0.0;
    fi->fh = (uintptr_t)h;
    fi->direct_io = 1;
    handle_track(fs, h);
    if (fuse_reply_create(req, &e, fi) != 0) {
        fs_writers_add(fs, &o, -1, -1);
        fs_forget_one(fs, e.ino, 1);
        handle_free(h);
    }
    return;
out_err:
    fuse_reply_err(req, -r);
}

void fs_op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
    struct fs *fs = fs_of(req);
    struct fs_obj o;
    void *zeros;
    int r = new_shard_obj(fs, parent, name, mode, &o);

    if (r < 0)
        goto out_err;
    if (fs_shard_exists(fs, &o.key)) {
        r = -EEXIST;
        goto out_err;
    }
    zeros = calloc(1, fs->shard_size);
    if (!zeros) {
        r = -ENOMEM;
        goto out_err;
    }
    r = store_shard(fs, &o.key, zeros);
    free(zeros);
    if (r < 0)
        goto out_err;
    fs_reply_entry(req, fs, &o);
    return;
out_err:
    fuse_reply_err(req, -r);
}

void fs_op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                 struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct fs_handle *h = fs_fh_of(fi);

    if (!h || !h->writable) {
        fuse_reply_err(req, EBADF);
        return;
    }
    if (size == 0) {
        fuse_reply_write(req, 0);
        return;
    }
    if (off < 0 || (uint64_t)off >= fs->shard_size) {
        fuse_reply_err(req, EFBIG); /* a shard file never grows */
        return;
    }
    if (size > fs->shard_size - (uint64_t)off)
        size = fs->shard_size - (size_t)off; /* a short write; the rest gets EFBIG */
    pthread_mutex_lock(&h->lock);
    if (h->error) {
        /* A store of this file failed and was reported: it is over. */
        int e = -h->error;

        pthread_mutex_unlock(&h->lock);
        fuse_reply_err(req, e);
        return;
    }
    memcpy(h->buf + off, buf, size);
    h->nwritten += bits_set(h->written, (uint64_t)off, (uint64_t)off + size);
    h->wrote = true;
    handle_set_dirty(fs, h, true);
    pthread_mutex_unlock(&h->lock);
    fuse_reply_write(req, size);
}

void fs_op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    int r = flush_handle(fs_of(req), fs_fh_of(fi), true);

    fuse_reply_err(req, -r);
}

void fs_op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    int r = flush_handle(fs_of(req), fs_fh_of(fi), false);

    fuse_reply_err(req, -r);
}

void fs_op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct fs_handle *h = fs_fh_of(fi);

    if (h && h->writable) {
        pthread_mutex_lock(&h->lock);
        if ((h->dirty || h->kept) && !h->error) {
            if (h->dirty && handle_whole(fs, h)) {
                /* Whole, and no FLUSH stored it (none came): store it now;
                 * a RELEASE cannot report an error, so log it. */
                int r = handle_store(fs, h);

                if (r < 0) {
                    char hex[SFS_BLOCK_HEX_LEN + 1];

                    sfs_block_to_hex(&h->obj.key.block, hex);
                    fs_log(LOG_WARNING, "block %s shard %u: storing on release: %s", hex,
                           h->obj.key.shard, strerror(-r));
                }
            } else {
                /* The last close: what was written is not a whole shard. */
                char hex[SFS_BLOCK_HEX_LEN + 1];

                sfs_block_to_hex(&h->obj.key.block, hex);
                fs_log(LOG_WARNING,
                       "block %s shard %u: closed after writing %llu of %llu bytes: not a whole "
                       "shard, discarded (the shard keeps its stored bytes)",
                       hex, h->obj.key.shard, (unsigned long long)h->nwritten,
                       (unsigned long long)fs->shard_size);
                h->kept = false;
                handle_set_dirty(fs, h, false);
            }
        }
        fs_writers_add(fs, &h->obj, -1, h->dirty ? -1 : 0);
        pthread_mutex_unlock(&h->lock);
    }
    fuse_reply_err(req, 0);
    /* The last file of an old version: nobody can read its pages again. */
    if (h && h->cached && fs_reader_close(fs, h->ino) && fs->se)
        fuse_lowlevel_notify_inval_inode(fs->se, h->ino, 0, 0);
    handle_free(h);
}

/* ftruncate(2) of a write handle to size (the file keeps its size; cut bytes
 * read as zeros). Before anything was written through the handle, a size
 * below shard_size is a whole shard of its own, as truncate(2) is: stored now
 * (the stored bytes up to size, zeros after), and the kept bytes count as
 * written, so that a writer that goes on (dd seek=N) completes the shard by
 * writing the rest. After writes, the cut bytes are written zeros; and on a
 * file that started empty (O_TRUNC, a new name), setting the size to
 * shard_size defines the bytes never written as the zeros POSIX gives a gap
 * (cp of a sparse file seeks over its holes, then sets the size). */
static int truncate_handle(struct fs *fs, struct fs_handle *h, uint64_t size)
{
    int r = 0;

    pthread_mutex_lock(&h->lock);
    if (size >= fs->shard_size) {
        if (!h->error && h->wrote && h->from_zeros) {
            h->nwritten += bits_set(h->written, 0, fs->shard_size);
            handle_set_dirty(fs, h, true);
        }
    } else if (h->error) {
        r = h->error;
    } else if (!h->wrote && h->nwritten == 0) {
        memset(h->buf + size, 0, fs->shard_size - size);
        r = handle_store(fs, h);
        if (r == 0)
            h->nwritten += bits_set(h->written, 0, size);
    } else {
        memset(h->buf + size, 0, fs->shard_size - size);
        h->nwritten += bits_set(h->written, size, fs->shard_size);
        handle_set_dirty(fs, h, true);
    }
    pthread_mutex_unlock(&h->lock);
    return r;
}

void fs_op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                   struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct fs_obj o;
    struct stat st;
    int r = fs_resolve(fs, ino, &o);

    if (r < 0)
        goto out_err;
    if (to_set & FUSE_SET_ATTR_SIZE) {
        uint64_t size = (uint64_t)attr->st_size;
        struct fs_handle *h = fi ? fs_fh_of(fi) : NULL;

        if (o.kind != FS_SHARD) {
            r = o.kind == FS_STATS ? -EACCES : -EISDIR;
            goto out_err;
        }
        if (fs->ro) {
            r = -EROFS;
            goto out_err;
        }
        if (attr->st_size < 0 || size > fs->shard_size) {
            r = -EFBIG;
            goto out_err;
        }
        if (h && h->writable) {
            r = truncate_handle(fs, h, size);
            if (r < 0)
                goto out_err;
        } else if (size < fs->shard_size) {
            /* truncate(2) with no handle: rewrite the shard, zero-filled. */
            uint8_t *buf = calloc(1, fs->shard_size);

            if (!buf) {
                r = -ENOMEM;
                goto out_err;
            }
            r = size ? fs_load_copy(fs, &o.key, buf) : 0;
            if (r == 0) {
                memset(buf + size, 0, fs->shard_size - size);
                r = store_shard(fs, &o.key, buf);
            }
            free(buf);
            if (r < 0)
                goto out_err;
        }
    }
    /* Modes, owners and times are fixed; accepted and ignored, so cp -p and
     * touch work. */
    fs_fill_attr(fs, &o, ino, &st);
    fuse_reply_attr(req, &st, o.kind == FS_STATS ? 0.0 : ATTR_TIMEOUT);
    return;
out_err:
    fuse_reply_err(req, -r);
}
