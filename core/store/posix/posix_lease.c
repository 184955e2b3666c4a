/* SPDX-License-Identifier: MIT */
/*
 * posix_lease.c - store-wide leases: one holder at a time of a named role
 * for every host on the store (the store's collector: docs/eviction.md),
 * decided by the store, as a block's owner file decides its writer.
 *
 * The lease is a file at the store's root, .shardfs_lease.<name>, holding
 * its holder's token (host, pid, a random word). It is live while its
 * mtime, on the file system's clock, is younger than the ttl: the holder
 * renews it by setting its mtime to now at every call. Ages are measured
 * against the mtime of a probe file the caller creates (the file system's
 * clock, as the sweep of stale temporary files measures), so host clocks
 * need not agree.
 *   - No file: the caller writes its token into a temporary file and links
 *     it to the lease's name; link(2) fails with EEXIST when another got
 *     there first (atomic on local, NFS and FUSE stores alike).
 *   - A file with the caller's token: renewed; held.
 *   - Another's, live: not held (stand by).
 *   - Another's, older than the ttl (its holder died or hangs): the caller
 *     renames its own token file over it, then reads it back. Two callers
 *     breaking the same stale lease at once may both see their token for a
 *     moment; the later rename wins, and the other finds out at its next
 *     call (its token gone): so at most one ttl with two holders, after a
 *     holder's death. Callers that remove whole files under a lock (the
 *     collector) stay safe through it.
 * Drop (ttl 0): unlink it if it still holds the caller's token.
 */
#include "posix_i.h"
#include "util_i.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LEASE_PREFIX   ".shardfs_lease."
#define LEASE_NAME_MAX 32

/* The lease file's content: the token, at most this long. */
static int read_token(struct posix_backend *p, const char *name, char *out, size_t len,
                      struct stat *st)
{
    int fd = openat(p->root_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    ssize_t n;

    if (fd < 0)
        return -errno;
    n = pread(fd, out, len - 1, 0);
    if (n < 0 || fstat(fd, st) < 0) {
        int e = -errno;

        close(fd);
        return e;
    }
    close(fd);
    out[n] = '\0';
    return 0;
}

/* A file of ours, holding our token, at tmp: its fd's mtime is the file
 * system's now. 0 or -errno. */
static int write_tmp(struct posix_backend *p, const char *tmp, struct timespec *now)
{
    size_t len = strlen(p->lease_token);
    struct stat st;
    int fd = openat(p->root_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);

    if (fd < 0)
        return -errno;
    if (write(fd, p->lease_token, len) != (ssize_t)len || fstat(fd, &st) < 0) {
        int e = errno ? -errno : -EIO;

        close(fd);
        unlinkat(p->root_fd, tmp, 0);
        return e;
    }
    close(fd);
    *now = st.st_mtim;
    return 0;
}

static int64_t ts_ns(const struct timespec *t)
{
    return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

int sfs_posix_lease(struct sfs_backend *be, const char *role, uint32_t ttl_ms)
{
    struct posix_backend *p = (struct posix_backend *)be;
    char name[sizeof(LEASE_PREFIX) + LEASE_NAME_MAX], tmp[sizeof(name) + 96 + 8];
    char tok[sizeof(p->lease_token)];
    struct timespec now = {0, 0};
    struct stat st;
    int r;

    if (!role || !*role || strlen(role) > LEASE_NAME_MAX || strchr(role, '/'))
        return -EINVAL;
    if (p->o.read_only)
        return -EROFS;
    if (!p->lease_token[0])
        snprintf(p->lease_token, sizeof(p->lease_token), "%s.%d.%016llx", p->host, (int)getpid(),
                 (unsigned long long)(sfs_now_ns() ^ ((uint64_t)(uintptr_t)p << 16)));
    snprintf(name, sizeof(name), LEASE_PREFIX "%s", role);
    r = read_token(p, name, tok, sizeof(tok), &st);
    if (r < 0 && r != -ENOENT)
        return r;
    if (ttl_ms == 0) { /* drop */
        if (r == 0 && strcmp(tok, p->lease_token) == 0)
            unlinkat(p->root_fd, name, 0);
        return 0;
    }
    if (r == 0 && strcmp(tok, p->lease_token) == 0) {
        /* Ours: renew (mtime = the file system's now). */
        int fd = openat(p->root_fd, name, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);

        if (fd < 0)
            return -errno;
        r = futimens(fd, NULL) < 0 ? -errno : 1;
        close(fd);
        return r;
    }
    snprintf(tmp, sizeof(tmp), "%s.%s.tmp", name, p->lease_token);
    r = r == 0 ? 0 : -ENOENT; /* the lease file: there, or not */
    {
        int w = write_tmp(p, tmp, &now);

        if (w < 0)
            return w;
    }
    if (r == -ENOENT) {
        /* None: link ours to the name; EEXIST: another was first. */
        r = linkat(p->root_fd, tmp, p->root_fd, name, 0) == 0 ? 1 : errno == EEXIST ? 0 : -errno;
        unlinkat(p->root_fd, tmp, 0);
        return r;
    }
    if (ts_ns(&now) - ts_ns(&st.st_mtim) < (int64_t)ttl_ms * 1000000) {
        unlinkat(p->root_fd, tmp, 0);
        return 0; /* another's, live */
    }
    /* Another's, stale: ours over it, then whose it is now. */
    if (renameat(p->root_fd, tmp, p->root_fd, name) < 0) {
        r = -errno;
        unlinkat(p->root_fd, tmp, 0);
        return r;
    }
    sfs_log(LOG_NOTICE, "posix: took over the store's %s lease from %s (%lld ms without renewal)",
            role, tok, (long long)((ts_ns(&now) - ts_ns(&st.st_mtim)) / 1000000));
    r = read_token(p, name, tok, sizeof(tok), &st);
    if (r < 0)
        return r == -ENOENT ? 0 : r;
    return strcmp(tok, p->lease_token) == 0;
}
