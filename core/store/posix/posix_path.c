/* SPDX-License-Identifier: MIT */
/*
 * posix_path.c - a block file's place in the store, and opening it there.
 *
 * Layout: block file <root>/data/<32 lowercase hex id> (dir_prefix=0), or
 * <root>/<first N hex chars of the id>/<32 hex id> (dir_prefix=N, 1..32).
 * Block files are opened beneath the root only (symlinks that leave the
 * store are refused) and without waiting (O_NONBLOCK, then a regular-file
 * check), so a FIFO or a device in the store never holds a loader or a
 * writer. Loads (backend_posix.c) and commits (posix_commit.c) both open
 * through here, so a commit reads the block it rewrites as a load does.
 */
#include "posix_i.h"
#include "testpoint_i.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <string.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

size_t sfs_posix_block_rel(const struct posix_backend *p, const struct sfs_block_id *id, bool tmp,
                           char out[PATH_REL_MAX])
{
    char hex[SFS_BLOCK_HEX_LEN + 1];
    size_t dlen;

    sfs_hex_encode(id, hex);
    if (p->o.dir_prefix == 0) {
        memcpy(out, "data", 4);
        dlen = 4;
    } else {
        memcpy(out, hex, p->o.dir_prefix);
        dlen = p->o.dir_prefix;
    }
    out[dlen] = '/';
    memcpy(out + dlen + 1, hex, SFS_BLOCK_HEX_LEN);
    if (tmp)
        memcpy(out + dlen + 1 + SFS_BLOCK_HEX_LEN, ".lock", 6);
    else
        out[dlen + 1 + SFS_BLOCK_HEX_LEN] = '\0';
    return dlen;
}

int sfs_posix_errno_of_open(int e)
{
    /* ESTALE still after retries: the name names nothing we can read. */
    return (e == ENOENT || e == ENOTDIR || e == ESTALE) ? -ENOENT : -e;
}

/*
 * Open rel below the root, never outside it and never waiting on what is not
 * a regular file. Symlinks inside the store are followed while they resolve
 * beneath the root (openat2 RESOLVE_BENEATH): a relative link to another
 * file of the store works; an absolute link, or one that climbs above the
 * root, is -EXDEV. Kernels before 5.6 (no openat2) refuse every symlink in
 * the last component instead (O_NOFOLLOW: -ELOOP). O_NONBLOCK: a FIFO in
 * place of a block file would otherwise hold the open until a writer came.
 * Returns the fd or -errno (sfs_posix_errno_of_open's mapping).
 */
int sfs_posix_open_beneath(struct posix_backend *p, const char *rel, int flags)
{
    /* openat2 refuses O_PATH with anything but O_CLOEXEC/O_DIRECTORY/
     * O_NOFOLLOW; an O_PATH open never waits anyway. */
    int extra = (flags & O_PATH) ? O_CLOEXEC : O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
    struct open_how how = {
        .flags = (uint64_t)(flags | extra),
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
    };
    int fd;

    /* -ESTALE: a cached handle of a directory or file another host
     * replaced or removed (NFS); a new lookup resolves the name afresh. */
    for (int stale = 0;; stale++) {
        fd = (int)syscall(SYS_openat2, p->root_fd, rel, &how, sizeof(how));
        if (fd < 0 && errno == ENOSYS)
            fd = openat(p->root_fd, rel, flags | extra | O_NOFOLLOW);
        if (fd >= 0 || errno != ESTALE || stale >= 8)
            break;
    }
    return fd >= 0 ? fd : sfs_posix_errno_of_open(errno);
}

/* sfs_posix_open_beneath() of a block file, which must be a regular file:
 * anything else (a FIFO, a device, a directory) is no block we can read,
 * -EIO. O_NONBLOCK is cleared again on success: io_uring would otherwise
 * answer -EAGAIN for every read not already in the page cache. Returns the
 * fd or -errno. */
int sfs_posix_open_block_file(struct posix_backend *p, const char *rel, int flags, struct stat *out)
{
    struct stat st;
    int fd = sfs_posix_open_beneath(p, rel, flags), ret;

    if (fd < 0)
        return fd;
    if (fstat(fd, &st) < 0) {
        ret = -errno;
        goto out_close;
    }
    if (!S_ISREG(st.st_mode)) {
        ret = -EIO;
        goto out_close;
    }
    ret = fcntl(fd, F_GETFL);
    if (ret < 0 || fcntl(fd, F_SETFL, ret & ~O_NONBLOCK) < 0) {
        ret = -errno;
        goto out_close;
    }
    if (out)
        *out = st;
    return fd;
out_close:
    close(fd);
    return ret;
}

/*
 * Holes. A block file has one place per shard and no mark of a shard's
 * absence: a commit that finds no block file (the collector removed it, or
 * an unlink through the mount) and writes shard n alone leaves shards
 * 0..n-1 as a hole, which reads as zeros. A shard that lies wholly in a
 * hole is a miss (docs/layout.md). Written bytes, zeros too, are data: a
 * commit writes every shard it stores (pwrite, or an in-kernel copy of
 * the old file's data extents, which shares or copies extents and never
 * punches a hole). Asked only of a file with fewer bytes on disk than its
 * size (sfs_posix_may_have_holes), so a dense file costs nothing more.
 */
bool sfs_posix_may_have_holes(uint64_t size, uint64_t blocks512)
{
    return blocks512 < (size + 511) / 512;
}

#ifdef SFS_TEST_HOOKS
/* The test build only: SHARDFS_TEST_NO_SEEK_DATA=1 makes the store a file
 * system without SEEK_DATA (its seeks fail EINVAL), for a daemon's tests
 * of blocks spanning more shards than a test can write (a sparse file
 * whose span reads as zeros there). */
static bool test_no_seek_data(void)
{
    static atomic_int v = -1;
    int x = atomic_load_explicit(&v, memory_order_relaxed);

    if (x < 0) {
        const char *e = getenv("SHARDFS_TEST_NO_SEEK_DATA");

        x = e && *e == '1';
        atomic_store_explicit(&v, x, memory_order_relaxed);
    }
    return x == 1;
}
#else
#define test_no_seek_data() false
#endif

off_t sfs_posix_seek_data(int fd, uint64_t off)
{
    /* Tests: a file system without SEEK_DATA (-EINVAL: its answer), or
     * one whose seek fails. */
    int fail = test_no_seek_data() ? -EINVAL : SFS_TEST_RESULT("posix:seek_data", 0);

    return fail < 0 ? (errno = -fail, (off_t)-1) : lseek(fd, (off_t)off, SEEK_DATA);
}

bool sfs_posix_range_in_hole(int fd, uint64_t off, uint64_t len)
{
    off_t d = sfs_posix_seek_data(fd, off);

    if (d < 0)
        return errno == ENXIO; /* no data at or past off; else it cannot tell: data */
    return (uint64_t)d >= off + len;
}

bool sfs_posix_all_zero(const void *buf, size_t len)
{
    const unsigned char *c = buf;

    /* A byte not zero is data; only a shard of zeros asks the file. */
    return len > 0 && c[0] == 0 && memcmp(c, c + 1, len - 1) == 0;
}

bool sfs_posix_fuse_fs(int dirfd)
{
    struct statfs sf;

#ifdef SFS_TEST_HOOKS
    /* Test hook: a local directory locked as a FUSE store (1), or not (0). */
    const char *force = getenv("SHARDFS_POSIX_HOST_LOCKS");

    if (force && *force)
        return *force == '1';
#endif
    return fstatfs(dirfd, &sf) == 0 && (unsigned long)sf.f_type == 0x65735546;
}

bool sfs_posix_remote_fs(int dirfd)
{
    static const unsigned long remote[] = {
        0x65735546, /* FUSE: GlusterFS, ceph-fuse, 3FS, ... */
        0x6969,     /* NFS */
        0x00c36400, /* CephFS */
        0x0bd00bd0, /* Lustre */
        0xff534d42, /* CIFS */
        0xfe534d42, /* SMB2 */
        0x01021997, /* 9P */
        0x47504653, /* GPFS */
    };
    struct statfs sf;

#ifdef SFS_TEST_HOOKS
    /* Test hook: a local directory treated as remote (1), or not (0). */
    const char *force = getenv("SHARDFS_POSIX_REMOTE");

    if (force && *force)
        return *force == '1';
#endif
    if (fstatfs(dirfd, &sf) < 0)
        return false;
    for (size_t i = 0; i < sizeof(remote) / sizeof(remote[0]); i++) {
        if ((unsigned long)sf.f_type == remote[i])
            return true;
    }
    return false;
}
