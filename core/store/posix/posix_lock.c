/* SPDX-License-Identifier: MIT */
/*
 * posix_lock.c - the file-system side of the posix backend's commit: block
 * directories, the block held for a commit behind one interface whatever
 * the store needs (sfs_posix_hold_block: the lock file's flock, polled on
 * remote file systems; on a FUSE store the host lock and the owner file),
 * the record a kept lock file holds, each writer's own temporary names,
 * and the age sweep of what dead writers left. Why each step is as it is:
 * the commit protocol in posix_commit.c's header and docs/shared-store.md.
 */
#include "posix_lock_i.h"
#include "testpoint_i.h"
#include "util_i.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* 0, or in the test build -1 with errno while the result point name is
 * armed to fail: a system call's failure that no local file system gives
 * on demand (a stale handle, a lock manager missing, a full store). */
static int test_fails(const char *name)
{
    int fail = SFS_TEST_RESULT(name, 0);

    if (fail < 0) {
        errno = -fail;
        return -1;
    }
    return 0;
}

int sfs_posix_ensure_dir(struct posix_backend *p, const char *rel, size_t dlen)
{
    char dir[PATH_REL_MAX];
    int tries = 0;

    memcpy(dir, rel, dlen);
    dir[dlen] = '\0';
    while ((test_fails("commit:mkdir") || mkdirat(p->root_fd, dir, 0755) < 0) && errno != EEXIST) {
        if (errno != ESTALE || ++tries > STALE_TRIES)
            return -errno;
    }
    return 0;
}

int sfs_posix_sync_dir(struct posix_backend *p, const char *rel, size_t dlen)
{
    char dir[PATH_REL_MAX];
    int fd, ret = 0;

    memcpy(dir, rel, dlen);
    dir[dlen] = '\0';
    fd = openat(p->root_fd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (fsync(fd) < 0)
        ret = -errno;
    close(fd);
    return ret;
}

/* Sleep before the next retry of a stale handle: *us doubles from
 * STALE_SLEEP_MIN_US to STALE_SLEEP_MAX_US. False once the budget (from
 * start_ns) is spent: give up. */
bool sfs_posix_stale_backoff(int64_t start_ns, int64_t budget_ns, unsigned *us)
{
    if (sfs_now_ns() - start_ns >= budget_ns)
        return false;
    *us = *us ? (*us * 2 > STALE_SLEEP_MAX_US ? STALE_SLEEP_MAX_US : *us * 2) : STALE_SLEEP_MIN_US;
    usleep(*us);
    return true;
}

/* flock(fd, op) (in the test build, failed at "lock:flock" on demand). */
static int flock_op(int fd, int op)
{
    return test_fails("lock:flock") ? -1 : flock(fd, op);
}

/* flock(LOCK_EX) of fd: blocking on a local file system; on a remote one
 * (p->remote_fs), polled without blocking for at most a quarter of the
 * deadline (LOCK_POLL_MAX_NS at most). A blocking flock on a FUSE client
 * is a SETLKW request that, once the client daemon has read it, the kernel
 * waits for uninterruptibly: a writer SIGKILLed there cannot exit until
 * the lock is granted, and on GlusterFS it was not (a hang seen there:
 * a zombie holding the mount; docs/shared-store.md). A FUSE store normally takes no lock here
 * at all (the host locks, below). 0, or -1 with errno (EWOULDBLOCK: still
 * held when the poll ended). */
static int flock_ex(struct posix_backend *p, int fd, bool remote)
{
    int64_t budget = (int64_t)p->o.timeout_ms * 1000000 / 4, start = sfs_now_ns();
    unsigned us = 0;
    int r;

    if (!remote) {
        while ((r = flock_op(fd, LOCK_EX)) < 0 && errno == EINTR)
            ;
        return r;
    }
    if (budget > LOCK_POLL_MAX_NS)
        budget = LOCK_POLL_MAX_NS;
    while ((r = flock_op(fd, LOCK_EX | LOCK_NB)) < 0 && (errno == EWOULDBLOCK || errno == EINTR)) {
        if (errno == EWOULDBLOCK && !sfs_posix_stale_backoff(start, budget, &us)) {
            errno = EWOULDBLOCK;
            return -1;
        }
    }
    return r;
}

/* Open and exclusively lock <file>.lock, making sure the locked inode is the
 * one the path names (on a local file system a writer that held the lock
 * before us unlinks it when done; on a remote one the lock file stays, see
 * commit_block_once, and only the sweep removes it). The lock only keeps
 * writers of one block from losing each other's shards; nothing written
 * depends on it (see the header). Where the file system refuses it
 * (ENOLCK: NFS without a lock manager), or a remote holder keeps it past
 * the poll (flock_ex), the commit goes on without it. -ESTALE (the lock
 * file unlinked meanwhile, while the client still caches its handle) is a
 * lock that moved on: start again, within STALE_BUDGET_NS. Returns the fd of
 * the held lock, or -1: no lock. */
/* fd, opened O_NONBLOCK, if it is a regular file: O_NONBLOCK cleared, fd
 * returned; else closed, -1 with errno EIO. What is not a regular file (a
 * FIFO, a device) is never waited on nor used. */
static int regular_or_close(int fd)
{
    struct stat st;
    int fl;

    if (fd < 0)
        return fd;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (fl = fcntl(fd, F_GETFL)) >= 0 &&
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == 0)
        return fd;
    close(fd);
    errno = EIO;
    return -1;
}

/* Open (O_CREAT) the lock file rel of dirfd: the fd, or -1 with errno. */
static int open_lock_file(int dirfd, const char *rel)
{
    /* O_NOFOLLOW: a link planted at the lock's name never makes us create
     * a file outside the store. O_NONBLOCK: a FIFO there (in a host lock
     * directory anyone may write to) never holds the open. */
    int fd = test_fails("lock:open")
                 ? -1
                 : openat(dirfd, rel, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);

    /* Another user's lock file: lock it all the same, without a record. */
    if (fd < 0 && errno == EACCES)
        fd = openat(dirfd, rel, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    return regular_or_close(fd);
}

static int lock_in(struct posix_backend *p, int dirfd, const char *lock_rel, bool remote)
{
    int64_t start = sfs_now_ns();
    unsigned us = 0;

    for (int tries = 0; tries < LOCK_TRIES; tries++) {
        struct stat a, b;
        int fd = open_lock_file(dirfd, lock_rel), r;

        if (fd < 0 && errno == ESTALE) {
            if (!sfs_posix_stale_backoff(start, STALE_BUDGET_NS, &us))
                return -1;
            continue;
        }
        if (fd < 0)
            return -1;
        r = flock_ex(p, fd, remote);
        if (r < 0 && errno != ESTALE) {
            close(fd);
            return -1;
        }
        if (r == 0)
            SFS_TEST_POINT("lock:flocked"); /* tests: its path moved on meanwhile */
        if (r == 0 && fstat(fd, &a) == 0 && fstatat(dirfd, lock_rel, &b, 0) == 0 &&
            a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
            /* A lock left by a killed writer is taken over: fresh again
             * for the sweep's age test. */
            futimens(fd, NULL);
            return fd;
        }
        close(fd);
        if (remote && !sfs_posix_stale_backoff(start, STALE_BUDGET_NS, &us))
            return -1;
    }
    return -1;
}

int sfs_posix_lock_block(struct posix_backend *p, const char *lock_rel)
{
    return lock_in(p, p->root_fd, lock_rel, p->remote_fs);
}

/*
 * Host locks (FUSE stores). A lock request to a FUSE client is the request
 * a killed process can wedge the mount with: GlusterFS's client up to 10
 * answers an interrupted SETLK only once its interrupt handler's request
 * is answered, waiting in an event thread, and the mount never answers
 * again (gluster/glusterfs#4371; one lock request at a time per process
 * was tried and still wedged it, docs/shared-store.md). So
 * on a FUSE store the block lock is an flock of a file in a local
 * directory, /run/lock/shardfs (/tmp/shardfs-locks without /run/lock; in
 * the test build, SHARDFS_LOCK_DIR when set), named by a hash of the
 * store's root and the block:
 * no lock request ever goes to the FUSE client. It excludes every writer
 * of the store on this host (the processes that share the directory: a
 * rank in a container needs it mounted in); writers on other hosts are not
 * excluded, as where flock does not cross clients (docs/shared-store.md).
 * The lock file is local, so the local protocol holds: unlinked by its
 * holder, a waiter finds the path moved on and starts again.
 */
int sfs_posix_host_locks_open(struct posix_backend *p)
{
    const char *env = NULL, *dir = HOST_LOCK_DIR;
    struct stat st;
    int fd;

#ifdef SFS_TEST_HOOKS
    /* Test hook: a lock directory of the test's own. */
    env = getenv("SHARDFS_LOCK_DIR");
    if (env && *env)
        dir = env;
#endif
    if (fstat(p->root_fd, &st) == 0)
        p->store_id = ((uint64_t)st.st_dev * 0x9e3779b97f4a7c15ull) ^ (uint64_t)st.st_ino;
    if (!env && access("/run/lock", F_OK) != 0)
        dir = HOST_LOCK_DIR_TMP;
    /* Shared by every user's writers: sticky and open to all, as /tmp. */
    if (mkdir(dir, 0755) == 0)
        chmod(dir, 01777);
    fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    /* The lock domain: the writers one host lock excludes, those that
     * share this lock directory and this mount of the store. */
    p->lock_domain = p->store_id;
    if (fd >= 0 && fstat(fd, &st) == 0)
        p->lock_domain ^= ((uint64_t)st.st_dev << 32 ^ (uint64_t)st.st_ino) * 0xff51afd7ed558ccdull;
    if (fd < 0)
        sfs_log(LOG_WARNING,
                "posix: FUSE store, and no lock directory %s (errno %d): the block locks are "
                "taken on the store",
                dir, errno);
    return fd;
}

int sfs_posix_host_lock(struct posix_backend *p, const char *lock_rel,
                        char name[HOST_LOCK_NAME_MAX])
{
    uint64_t h = 0xcbf29ce484222325ull ^ p->store_id;

    for (const char *c = lock_rel; *c; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    snprintf(name, HOST_LOCK_NAME_MAX, "%016llx.lock", (unsigned long long)h);
    return lock_in(p, p->host_lock_fd, name, false);
}

void sfs_posix_host_unlock(struct posix_backend *p, int fd, const char *name)
{
    unlinkat(p->host_lock_fd, name, 0);
    close(fd);
}

int sfs_posix_open_record(struct posix_backend *p, const char *lock_rel)
{
    int64_t start = sfs_now_ns();
    unsigned us = 0;

    for (;;) {
        int fd = open_lock_file(p->root_fd, lock_rel);

        if (fd >= 0 || errno != ESTALE || !sfs_posix_stale_backoff(start, STALE_BUDGET_NS, &us))
            return fd;
    }
}

/*
 * Owner files (FUSE stores). The host lock excludes this host's writers
 * only; writers on other hosts are kept out by <file>.own, created with
 * O_CREAT | O_EXCL under the host lock and removed before it is let go:
 * an exclusive create is decided by the file system's servers (on
 * GlusterFS, by the brick), so it crosses clients without a lock request,
 * and a writer killed while it waits for one has nothing in the client to
 * wedge. What it holds: "<host> <lock domain> <pid> <seq>", new for every
 * commit. An owner file of this host's lock domain is stale (its writer
 * is gone: the host lock we hold was its); one of another host is waited
 * for, and broken once the waiter has seen the same one for half its
 * wait, so a dead writer's is always broken before the wait ends (a live
 * commit holds it for milliseconds: its writer is dead, or stopped, or
 * very slow, and then the commit is as without it). No clock is compared
 * across hosts: only what the waiter itself saw, and for how long. A
 * client that still caches the name of an owner file already removed
 * answers EEXIST until its entry times out (about 1 s on GlusterFS): the
 * wait covers it.
 */
static void own_name(const char *lock_rel, char out[PATH_REL_MAX])
{
    size_t n = strlen(lock_rel) - (sizeof(".lock") - 1);

    memcpy(out, lock_rel, n);
    memcpy(out + n, OWN_SUFFIX, sizeof(OWN_SUFFIX));
}

/* What the owner file own holds, NUL-terminated in buf; false when it
 * cannot be read (gone meanwhile, or a stale handle). */
static bool own_read(struct posix_backend *p, const char *own, char buf[OWN_TOKEN_MAX])
{
    /* O_NONBLOCK, regular files only: a FIFO at the name would hold the
     * open (and the commit's helper) until a writer came. */
    int fd = regular_or_close(
        openat(p->root_fd, own, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY));
    ssize_t n;

    if (fd < 0)
        return false;
    n = pread(fd, buf, OWN_TOKEN_MAX - 1, 0);
    close(fd);
    if (n < 0)
        return false;
    buf[n] = '\0';
    return true;
}

/* Was the owner file whose text is text made by a writer of this host's
 * lock domain? */
static bool own_ours(struct posix_backend *p, const char *text)
{
    char ours[POSIX_HOST_MAX + 24];
    int n =
        snprintf(ours, sizeof(ours), "%s %016llx ", p->host, (unsigned long long)p->lock_domain);

    return strncmp(text, ours, (size_t)n) == 0;
}

bool sfs_posix_own_block(struct posix_backend *p, const char *lock_rel, char token[OWN_TOKEN_MAX])
{
    int64_t budget = (int64_t)p->o.timeout_ms * 1000000 / 4, start = sfs_now_ns(), since = -1;
    char own[PATH_REL_MAX], seen[OWN_TOKEN_MAX], last[OWN_TOKEN_MAX] = "";
    uint64_t seq;
    unsigned us = 0;
    int n;

    if (budget > LOCK_POLL_MAX_NS)
        budget = LOCK_POLL_MAX_NS;
    own_name(lock_rel, own);
    /* Relaxed: the counter only has to differ per call. */
    seq = atomic_fetch_add_explicit(&p->tmp_seq, 1, memory_order_relaxed);
    n = snprintf(token, OWN_TOKEN_MAX, "%s %016llx %ld %llu\n", p->host,
                 (unsigned long long)p->lock_domain, (long)getpid(), (unsigned long long)seq);
    for (;;) {
        int fd = test_fails("own:create")
                     ? -1
                     : openat(p->root_fd, own, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                              0644);

        if (fd >= 0) {
            bool ok = write(fd, token, (size_t)n) == n;

            close(fd);
            if (ok)
                return true;
            unlinkat(p->root_fd, own, 0); /* unreadable to others: not an owner file */
            return false;
        }
        if (errno != EEXIST && errno != ESTALE)
            return false; /* not allowed here, say: as without */
        SFS_TEST_POINT("own:taken");
        if (errno == EEXIST && own_read(p, own, seen)) {
            int64_t now = sfs_now_ns();

            if (since < 0 || strcmp(seen, last) != 0) {
                /* Another owner since we last looked: its time starts now.
                 * An empty file too: its writer made it and died before it
                 * wrote (or is writing now: it is judged as any other). */
                memcpy(last, seen, sizeof(last));
                since = now;
            }
            if (own_ours(p, seen) || now - since >= budget / 2) {
                char again[OWN_TOKEN_MAX];

                SFS_TEST_POINT("own:judged");
                /* Broken only if it is still the one judged stale. */
                if (own_read(p, own, again) && strcmp(again, seen) == 0) {
                    sfs_log(LOG_INFO, "posix: %s: broke a stale owner file (%.*s)", own,
                            (int)strcspn(seen, "\n"), seen);
                    unlinkat(p->root_fd, own, 0);
                }
                continue;
            }
        }
        if (!sfs_posix_stale_backoff(start, budget, &us))
            return false;
    }
}

void sfs_posix_disown_block(struct posix_backend *p, const char *lock_rel, const char *token)
{
    char own[PATH_REL_MAX], seen[OWN_TOKEN_MAX];

    own_name(lock_rel, own);
    if (own_read(p, own, seen) && strcmp(seen, token) == 0)
        unlinkat(p->root_fd, own, 0);
}

/* This writer's own temporary file for the block whose path is rel:
 * <file>.tmp.<host>.<pid>.<seq>, created exclusively, so no two writers (on
 * this host or any other) ever write the same file. Returns the fd (name in
 * tmp) or -errno. */
int sfs_posix_create_tmp(struct posix_backend *p, const char *rel, char tmp[PATH_REL_MAX])
{
    for (int tries = 0; tries < 64; tries++) {
        /* Relaxed: the counter only has to differ per call. */
        uint64_t seq = atomic_fetch_add_explicit(&p->tmp_seq, 1, memory_order_relaxed);
        int n = snprintf(tmp, PATH_REL_MAX, "%s" TMP_INFIX "%s.%ld.%llu", rel, p->host,
                         (long)getpid(), (unsigned long long)seq);
        int fd;

        if (n < 0 || n >= PATH_REL_MAX)
            return -ENAMETOOLONG;
        fd =
            test_fails("commit:tmp")
                ? -1
                : openat(p->root_fd, tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd >= 0)
            return fd;
        if (errno != EEXIST && errno != ESTALE)
            return -errno;
        /* A name left by an earlier process with our pid: next counter. */
    }
    return -EEXIST;
}

int sfs_posix_ref_rel(const char *rel, uint64_t ino, char out[PATH_REL_MAX])
{
    int n = snprintf(out, PATH_REL_MAX, "%s" REF_INFIX "%016llx", rel, (unsigned long long)ino);

    return n < 0 || n >= PATH_REL_MAX ? -ENAMETOOLONG : 0;
}

/* Is name (an entry of a block directory) a temporary, second, lock or
 * owner file of a block: <32 hex>.tmp.*, <32 hex>.ref.*, <32 hex>.lock or
 * <32 hex>.own? */
static bool is_commit_leftover(const char *name)
{
    for (int i = 0; i < SFS_BLOCK_HEX_LEN; i++) {
        char c = name[i];

        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
    }
    return strncmp(name + SFS_BLOCK_HEX_LEN, TMP_INFIX, sizeof(TMP_INFIX) - 1) == 0 ||
           strncmp(name + SFS_BLOCK_HEX_LEN, REF_INFIX, sizeof(REF_INFIX) - 1) == 0 ||
           strcmp(name + SFS_BLOCK_HEX_LEN, ".lock") == 0 ||
           strcmp(name + SFS_BLOCK_HEX_LEN, OWN_SUFFIX) == 0;
}

/* Is name (a commit leftover) the temporary file of a writer of this host
 * that is still alive? Its name carries the host and the pid
 * (sfs_posix_create_tmp): kill(pid, 0) answers for a process of our pid
 * namespace, EPERM included (alive, another user's). */
static bool tmp_of_live_writer(const struct posix_backend *p, const char *name)
{
    const char *h = name + SFS_BLOCK_HEX_LEN + sizeof(TMP_INFIX) - 1;
    size_t hl = strlen(p->host);
    char *end;

    if (strncmp(name + SFS_BLOCK_HEX_LEN, TMP_INFIX, sizeof(TMP_INFIX) - 1) != 0 ||
        strncmp(h, p->host, hl) != 0 || h[hl] != '.')
        return false;
    errno = 0;
    long pid = strtol(h + hl + 1, &end, 10);

    if (errno || end == h + hl + 1 || *end != '.' || pid <= 0 || pid > INT32_MAX)
        return false;
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* On a local file system, is the lock file name of directory dirfd held by
 * a writer? A flock(LOCK_EX | LOCK_NB) of our own says (flock is coherent
 * there; a lock held by this very process conflicts too, through another
 * open file). Not held: unlinked while we hold it, as a holder unlinks its
 * own (a writer waiting on it finds the path moved on). True when held or
 * when it cannot be told: the file stays. */
static bool lock_held_else_unlink(int dirfd, const char *name)
{
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    bool held = true;

    if (fd < 0)
        return true;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0) {
        held = false;
        unlinkat(dirfd, name, 0);
    }
    close(fd);
    return held;
}

/*
 * Remove the temporary, second and lock files of the block directory dir whose
 * mtime is more than tmp_age before now_ref. now_ref is the mtime of the
 * temporary file the caller just created: the file system's own clock, so
 * hosts whose clocks differ agree on ages. At most once per tmp_age / 4 per
 * backend (sweep_ns), so a commit rarely pays for a readdir. Errors are
 * ignored: a leftover not removed now is removed by a later sweep.
 *
 * The age alone would also take a live commit's files once it ran past
 * tmp_age (a writer stalled that long, or a test's short age): its rename
 * would answer ENOENT, or its held lock file go and a second writer commit
 * beside it. So a temporary file of a live writer of this host and, on a
 * local file system, a held lock file are never removed, whatever their age.
 */
void sfs_posix_sweep_dir(struct posix_backend *p, const char *rel, size_t dlen,
                         const struct timespec *now_ref)
{
    int64_t now = sfs_now_ns();
    /* Relaxed: sweep_ns only spaces sweeps out; two sweeps at once are
     * harmless (both unlink the same names; ENOENT is ignored). */
    int64_t last = atomic_load_explicit(&p->sweep_ns, memory_order_relaxed);
    int64_t ref = (int64_t)now_ref->tv_sec * 1000000000 + now_ref->tv_nsec;
    char dir[PATH_REL_MAX];
    struct dirent *de;
    DIR *d;
    int fd;

    if (last && now - last < p->tmp_age_ns / 4)
        return;
    if (!atomic_compare_exchange_strong_explicit(&p->sweep_ns, &last, now, memory_order_relaxed,
                                                 memory_order_relaxed))
        return;
    memcpy(dir, rel, dlen);
    dir[dlen] = '\0';
    fd = openat(p->root_fd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return;
    d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    while ((de = readdir(d))) {
        struct stat st;

        if (!is_commit_leftover(de->d_name))
            continue;
        if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
            continue;
        if (ref - ((int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec) <= p->tmp_age_ns ||
            tmp_of_live_writer(p, de->d_name))
            continue;
        if (!p->remote_fs && strcmp(de->d_name + SFS_BLOCK_HEX_LEN, ".lock") == 0)
            lock_held_else_unlink(fd, de->d_name);
        else
            unlinkat(fd, de->d_name, 0);
    }
    closedir(d);
}

void sfs_posix_commit_init(struct posix_backend *p)
{
    char host[256];
    size_t n = 0;

    if (gethostname(host, sizeof(host)) < 0)
        host[0] = '\0';
    host[sizeof(host) - 1] = '\0';
    /* Only characters that need no quoting anywhere, and no '.' (the
     * name's separator). */
    for (size_t i = 0; host[i] && n < POSIX_HOST_MAX; i++) {
        char c = host[i];

        if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
            c == '-' || c == '_')
            p->host[n++] = c;
    }
    if (n == 0)
        p->host[n++] = '_';
    p->host[n] = '\0';
    atomic_init(&p->tmp_seq, 0);
    atomic_init(&p->sweep_ns, 0);
    /* Stale: far older than any live commit can be (one deadline for the
     * copy and the writes, one more for the rename: posix_call.c). */
    p->tmp_age_ns = (int64_t)p->o.timeout_ms * 1000000 * TMP_AGE_DEADLINES;
    if (p->tmp_age_ns < TMP_AGE_MIN_NS)
        p->tmp_age_ns = TMP_AGE_MIN_NS;
#ifdef SFS_TEST_HOOKS
    /* Test hook: a stale age the tests can wait for. */
    const char *age = getenv("SHARDFS_POSIX_TMP_AGE_MS");

    if (age && *age)
        p->tmp_age_ns = strtoll(age, NULL, 10) * 1000000;
#endif
}

/* The record of the lock file lfd (held) into *r: true, or false when
 * there is none (a new lock file, one an older version left, one cleared,
 * a short read). */
bool sfs_posix_lock_record_read(int lfd, struct lock_record *r)
{
    return pread(lfd, r, sizeof(*r), 0) == (ssize_t)sizeof(*r) && r->magic == LOCK_RECORD_MAGIC;
}

/* Record *r in the held lock file lfd (magic 0 clears the record). Best
 * effort: a record not written leaves the one before, which the next
 * partial commit finds out of date (a refusal, then no record:
 * commit_block_once). */
void sfs_posix_lock_record_write(int lfd, const struct lock_record *r)
{
    if (pwrite(lfd, r, sizeof(*r), 0) != (ssize_t)sizeof(*r))
        return;
}

void sfs_posix_hold_block(struct posix_backend *p, const char *lock_rel, struct block_hold *h)
{
    h->hfd = -1;
    h->owned = false;
    if (p->host_lock_fd < 0) {
        h->lfd = sfs_posix_lock_block(p, lock_rel);
        return;
    }
    /* A FUSE store: no lock request reaches it (the host lock), the owner
     * file keeps other hosts' writers out, and the store's lock file holds
     * only the record, read once both are held. */
    h->hfd = sfs_posix_host_lock(p, lock_rel, h->hname);
    h->owned = h->hfd >= 0 && sfs_posix_own_block(p, lock_rel, h->token);
    h->lfd = h->hfd >= 0 ? sfs_posix_open_record(p, lock_rel) : -1;
}

void sfs_posix_release_block(struct posix_backend *p, const char *lock_rel, struct block_hold *h)
{
    /* Local: unlinked while we hold it, waiters find the path moved on and
     * start over on a new lock file. Remote: it stays (the sweep removes it
     * once idle for tmp_age): a client that cached the unlinked lock file's
     * handle would lock the dead inode, pass the inode test on its cached
     * attributes, and commit beside the next holder, or spin on -ESTALE
     * until its lookup cache expired (docs/shared-store.md). */
    if (h->lfd >= 0) {
        if (!p->remote_fs)
            unlinkat(p->root_fd, lock_rel, 0);
        close(h->lfd);
    }
    if (h->owned)
        sfs_posix_disown_block(p, lock_rel, h->token);
    if (h->hfd >= 0)
        sfs_posix_host_unlock(p, h->hfd, h->hname);
    h->lfd = h->hfd = -1;
    h->owned = false;
}
