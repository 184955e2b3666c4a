/* SPDX-License-Identifier: MIT */
/*
 * posix_lease.c - store-wide leases: one holder at a time of a named role
 * for every host on the store (the store's collector: docs/eviction.md),
 * decided by the store, as a block's owner file decides its writer.
 *
 * The lease is a file at the store's root, .shardfs_lease.<name>, holding
 * its holder's token (host, pid, a random word); its holder knows it by its
 * inode. It is live while its mtime, on the file system's clock, is younger
 * than the ttl: the holder renews it by setting its mtime to now, a quarter
 * of the ttl after the last renewal. Ages are measured against the mtime of
 * a file the caller creates (the file system's clock, as the sweep of stale
 * temporary files measures), so host clocks need not agree. One holder at a
 * time, whatever the timing (docs/eviction.md argues it for local file
 * systems and GlusterFS): a daemon holds the lease while the name holds
 * the inode it linked there, and each step below changes what the name
 * holds only by an operation the store decides for one caller alone.
 *   - No file: the caller writes its token into a temporary file and links
 *     it to the lease's name; link(2) fails with EEXIST when another got
 *     there first.
 *   - Held (the caller's inode under the name, holding its token): a look
 *     checks it, at every call (the collector calls before each removal),
 *     and renews it. Another inode, another token (a file system may give
 *     a broken lease's freed inode number to a later holder's file), or
 *     none: lost, for good.
 *   - Another's, live: not held (stand by).
 *   - Another's, older than the ttl (its holder died or hangs): the caller
 *     renames the file away to a name of its own (.<token>.brk). Of several
 *     takers, one rename takes that file off the name; the others' find
 *     nothing (ENOENT) or a newer file. The caller checks that the file it
 *     moved is the one it found stale (the same inode and mtime): then it
 *     links its own file to the free name (EEXIST: another that found no
 *     file was first) and removes the stale one. Otherwise (renewed since,
 *     or a newer holder's) it links it back under the name (unless a newer
 *     one is there) and stands by: a holder whose file was off the name for
 *     that moment sees it lost at its next look, and takes it again (its
 *     token) at its next call when it was put back.
 * Drop (ttl 0): the caller's file is renamed away and removed (another's,
 * moved by mistake, is put back).
 * A taker or a holder killed between its rename and its unlink leaves a
 * .brk or .tmp file at the root: a few bytes, named by its token. The
 * holder sweeps them (sweep_leftovers): when it takes the lease, and at a
 * renewal at most every SWEEP_TTLS ttls. It removes another token's file
 * only once its ctime (its creation, or the rename that made it a .brk) is
 * older than the ttl on the file system's clock: a live taker's file lives
 * for a few system calls, and one stopped past the ttl has lost its turn
 * anyway (its break then finds nothing at its .brk: it stands by).
 */
#include "posix_i.h"
#include "testpoint_i.h"
#include "util_i.h"

#include <dirent.h>
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
/* The holder sweeps leftovers at most once in this many ttls. */
#define SWEEP_TTLS 4

/* The lease file's content: the token, at most this long. What is not a
 * regular file at the name is no lease: -EIO, and a FIFO there never
 * holds the open (O_NONBLOCK) until a writer comes. */
static int read_token(struct posix_backend *p, const char *name, char *out, size_t len,
                      struct stat *st)
{
    int fd = openat(p->root_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    ssize_t n = -1;
    int e = 0;

    if (fd < 0)
        return -errno;
    if (fstat(fd, st) < 0)
        e = -errno;
    else if (!S_ISREG(st->st_mode))
        e = -EIO;
    else if ((n = pread(fd, out, len - 1, 0)) < 0)
        e = -errno;
    close(fd);
    if (e < 0)
        return e;
    out[n] = '\0';
    return 0;
}

/* A file of ours, holding our token, at tmp: its fd's mtime is the file
 * system's now. 0 or -errno. */
static int write_tmp(struct posix_backend *p, const char *tmp, struct timespec *now,
                     struct stat *out)
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
    *out = st;
    return 0;
}

#ifndef SFS_TEST_HOOKS
#define test_break_wait()      ((void)0)
#define test_break_noted(what) ((void)0)
#else
/* The test build only: SHARDFS_TEST_LEASE_BREAK_MS=N (1..5000) waits N ms
 * between finding a lease stale and breaking it, so that a test's standbys
 * all find it stale before the first breaks it. */
static void test_break_wait(void)
{
    const char *e = getenv("SHARDFS_TEST_LEASE_BREAK_MS");
    unsigned long v = e ? strtoul(e, NULL, 10) : 0;
    struct timespec ts = {(time_t)(v / 1000), (long)(v % 1000) * 1000000};

    if (v >= 1 && v <= 5000)
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
}

/* SHARDFS_TEST_LEASE_LOG=FILE: append "<what> <pid>" to FILE at the end
 * of each break of a stale lease ("broke", or "late": another was first),
 * so that a test sees its takers raced. */
static void test_break_noted(const char *what)
{
    const char *e = getenv("SHARDFS_TEST_LEASE_LOG");
    char line[48];
    int fd, n;

    if (!e || !*e)
        return;
    fd = open(e, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    n = snprintf(line, sizeof(line), "%s %d\n", what, (int)getpid());
    if (write(fd, line, (size_t)n) != n)
        sfs_log(LOG_WARNING, "posix: the test's lease log: %s", strerror(errno));
    close(fd);
}
#endif

static int64_t ts_ns(const struct timespec *t)
{
    return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

/* A token as sfs_posix_lease makes them: <host>.<pid>.<16 hex>. */
static bool token_like(const char *t, size_t len)
{
    size_t i = len, digits = 0;

    if (len < 20 || t[len - 17] != '.')
        return false;
    for (i = len - 16; i < len; i++)
        if (!((t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f')))
            return false;
    for (i = len - 18; i > 0 && t[i] >= '0' && t[i] <= '9'; i--)
        digits++;
    return digits > 0 && t[i] == '.' && i > 0;
}

/* Remove the .tmp and .brk files of role's lease (name) that other tokens
 * left at the root, once older than the ttl: their takers or holders were
 * killed between two steps. now: the file system's clock. */
static void sweep_leftovers(struct posix_backend *p, const char *name, const struct timespec *now,
                            uint32_t ttl_ms)
{
    size_t nlen = strlen(name), mine = strlen(p->lease_token);
    int dfd = openat(p->root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    unsigned swept = 0;
    struct dirent *de;
    DIR *d;

    p->lease_swept_ns = sfs_now_ns();
    if (dfd < 0)
        return;
    d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        size_t len = strlen(n), tlen;
        struct stat st;

        if (len < nlen + 6 || strncmp(n, name, nlen) != 0 || n[nlen] != '.' ||
            (strcmp(n + len - 4, ".tmp") != 0 && strcmp(n + len - 4, ".brk") != 0))
            continue;
        tlen = len - nlen - 5;
        if (!token_like(n + nlen + 1, tlen) ||
            (tlen == mine && strncmp(n + nlen + 1, p->lease_token, mine) == 0))
            continue; /* not a leftover, or ours */
        SFS_TEST_POINT("lease:sweep");
        if (fstatat(dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
            ts_ns(now) - ts_ns(&st.st_ctim) <= (int64_t)ttl_ms * 1000000)
            continue;
        if (unlinkat(dirfd(d), n, 0) == 0)
            swept++;
    }
    closedir(d);
    if (swept)
        sfs_log(LOG_NOTICE, "posix: swept %u file(s) left by killed takers of the store's lease %s",
                swept, name);
}

/* The lease's name holds our file: the inode we linked, holding our token.
 * The inode alone is not enough: a file system may give a freed inode
 * number to the next file, so after a taker broke our file and removed it,
 * another holder's file may come under the name with our old number.
 * 1, 0, -errno. */
static int is_ours(struct posix_backend *p, const char *name)
{
    char tok[sizeof(p->lease_token)];
    struct stat st;
    int r = read_token(p, name, tok, sizeof(tok), &st);

    if (r < 0)
        return r == -ENOENT || r == -EIO || r == -ELOOP ? 0 : r; /* not a regular file */
    return st.st_dev == p->lease_dev && st.st_ino == p->lease_ino &&
           strcmp(tok, p->lease_token) == 0;
}

/* Ours now: the lease's name holds the file st describes. */
static void hold(struct posix_backend *p, const char *role, const struct stat *st)
{
    snprintf(p->lease_role, sizeof(p->lease_role), "%s", role);
    p->lease_dev = st->st_dev;
    p->lease_ino = st->st_ino;
    p->lease_renewed_ns = sfs_now_ns();
}

/* Held: check that the name still holds our file, and renew it (its
 * mtime to the file system's now) a quarter of the ttl after the last
 * renewal. 1 (held), 0 (lost: another broke it), -errno. */
static int keep_held(struct posix_backend *p, const char *name, uint32_t ttl_ms)
{
    struct stat st;
    int fd, r = is_ours(p, name);

    if (r <= 0 || sfs_now_ns() - p->lease_renewed_ns < (int64_t)ttl_ms * 1000000 / 4)
        return r;
    fd = openat(p->root_fd, name, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return errno == ENOENT ? 0 : -errno;
    /* The stat after the renewal: its mtime is the file system's now. */
    if (futimens(fd, NULL) < 0 || fstat(fd, &st) < 0) {
        r = -errno;
        close(fd);
        return r;
    }
    {
        char tok[sizeof(p->lease_token)];
        ssize_t n = S_ISREG(st.st_mode) ? pread(fd, tok, sizeof(tok) - 1, 0) : -1;

        close(fd);
        if (n < 0 || st.st_dev != p->lease_dev || st.st_ino != p->lease_ino)
            return 0;
        tok[n] = '\0';
        if (strcmp(tok, p->lease_token) != 0)
            return 0; /* our old inode number, another's file */
    }
    /* Renewed our file: still under the name (a taker may have moved it
     * away between our look and the renewal)? */
    r = is_ours(p, name);
    if (r == 1) {
        p->lease_renewed_ns = sfs_now_ns();
        if (p->lease_renewed_ns - p->lease_swept_ns >= (int64_t)ttl_ms * 1000000 * SWEEP_TTLS)
            sweep_leftovers(p, name, &st.st_mtim, ttl_ms);
    }
    return r;
}

/* Move the lease's file away to brk (ours alone: only one rename of a
 * file can take it from the name), then check that it is the file `seen`
 * describes (the same inode, not renewed since). 1: it is, and brk holds
 * it; 0: another moved it first (nothing at brk), or it is another file,
 * put back under the name unless a newer one is there already. */
static int break_seen(struct posix_backend *p, const char *name, const char *brk,
                      const struct stat *seen)
{
    struct stat st;

    if (renameat(p->root_fd, name, p->root_fd, brk) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (fstatat(p->root_fd, brk, &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_dev == seen->st_dev &&
        st.st_ino == seen->st_ino && ts_ns(&st.st_mtim) == ts_ns(&seen->st_mtim))
        return 1;
    /* Not the file seen stale: renewed since, or a newer holder's. Back
     * under the name, unless a newer one is there (its holder, whose file
     * is no longer under the name, finds out at its next look). Nothing at
     * brk: a holder swept it, this taker having stopped past the ttl. */
    if (linkat(p->root_fd, brk, p->root_fd, name, 0) < 0 && errno != EEXIST && errno != ENOENT)
        sfs_log(LOG_WARNING, "posix: putting back the store's lease %s: %s", name, strerror(errno));
    unlinkat(p->root_fd, brk, 0);
    return 0;
}

int sfs_posix_lease(struct sfs_backend *be, const char *role, uint32_t ttl_ms)
{
    struct posix_backend *p = (struct posix_backend *)be;
    char name[sizeof(LEASE_PREFIX) + LEASE_NAME_MAX], tmp[sizeof(name) + 96 + 8];
    char brk[sizeof(tmp)], tok[sizeof(p->lease_token)];
    struct timespec now = {0, 0};
    struct stat st, mine = {0};
    bool held;
    int r;

    if (!role || !*role || strlen(role) > LEASE_NAME_MAX || strchr(role, '/'))
        return -EINVAL;
    if (p->o.read_only)
        return -EROFS;
    if (!p->lease_token[0])
        snprintf(p->lease_token, sizeof(p->lease_token), "%s.%d.%016llx", p->host, (int)getpid(),
                 (unsigned long long)(sfs_now_ns() ^ ((uint64_t)(uintptr_t)p << 16)));
    snprintf(name, sizeof(name), LEASE_PREFIX "%s", role);
    snprintf(tmp, sizeof(tmp), "%s.%s.tmp", name, p->lease_token);
    snprintf(brk, sizeof(brk), "%s.%s.brk", name, p->lease_token);
    held = p->lease_ino && strcmp(p->lease_role, role) == 0;
    if (ttl_ms == 0) { /* drop: our file away from the name, then removed */
        if (held && renameat(p->root_fd, name, p->root_fd, brk) == 0) {
            if (fstatat(p->root_fd, brk, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                (st.st_dev != p->lease_dev || st.st_ino != p->lease_ino))
                linkat(p->root_fd, brk, p->root_fd, name, 0); /* another's: put back */
            unlinkat(p->root_fd, brk, 0);
        }
        p->lease_ino = 0;
        return 0;
    }
    if (held) {
        r = keep_held(p, name, ttl_ms);
        if (r == 0) {
            p->lease_ino = 0;
            sfs_log(LOG_NOTICE, "posix: lost the store's %s lease (another took it over)", role);
        }
        return r;
    }
    p->lease_ino = 0;
    r = read_token(p, name, tok, sizeof(tok), &st);
    if (r < 0 && r != -ENOENT)
        return r;
    if (r == 0 && strcmp(tok, p->lease_token) == 0) {
        /* Ours (put back after a taker moved it by mistake): held again. */
        hold(p, role, &st);
        p->lease_renewed_ns = 0; /* renew now */
        r = keep_held(p, name, ttl_ms);
        if (r <= 0)
            p->lease_ino = 0;
        return r;
    }
    r = r == 0 ? 0 : -ENOENT; /* the lease file: there, or not */
    {
        int w = write_tmp(p, tmp, &now, &mine);

        if (w < 0)
            return w;
    }
    if (r == 0 && ts_ns(&now) - ts_ns(&st.st_mtim) < (int64_t)ttl_ms * 1000000) {
        unlinkat(p->root_fd, tmp, 0);
        return 0; /* another's, live */
    }
    if (r == 0) {
        /* Another's, stale: ours to break if our rename takes that very
         * file off the name. */
        test_break_wait();
        SFS_TEST_POINT("lease:break");
        r = break_seen(p, name, brk, &st);
        if (r <= 0) {
            unlinkat(p->root_fd, tmp, 0);
            if (r == 0) {
                test_break_noted("late");
                sfs_log(LOG_NOTICE, "posix: the store's %s lease: another took it over first",
                        role);
            }
            return r;
        }
        unlinkat(p->root_fd, brk, 0);
        test_break_noted("broke");
        sfs_log(LOG_NOTICE, "posix: broke the store's %s lease of %s (%lld ms without renewal)",
                role, tok, (long long)((ts_ns(&now) - ts_ns(&st.st_mtim)) / 1000000));
    }
    /* No lease under the name: link ours to it; EEXIST: another was first. */
    /* ENOENT: our own file was swept, as a stopped taker's: stand by. */
    SFS_TEST_POINT("lease:link");
    r = linkat(p->root_fd, tmp, p->root_fd, name, 0) == 0 ? 1 : -errno;
    if (r == -EEXIST || r == -ENOENT)
        r = 0;
    unlinkat(p->root_fd, tmp, 0);
    if (r == 1) {
        hold(p, role, &mine);
        sweep_leftovers(p, name, &now, ttl_ms);
    }
    return r;
}
