/* SPDX-License-Identifier: MIT */
/*
 * test_posix_locks.c - the posix commit's block lock and what it leaves
 * (posix_lock.c), where the store does not behave: a lock file that is no
 * regular file, a lock the file system refuses or answers stale, a lock
 * held past the poll of a remote store, a lock file replaced while we
 * waited, another user's lock file, a host lock directory that cannot be
 * made, owner files that fail, change or are broken under their writer,
 * temporary names already taken, the sweep of every kind of leftover, and
 * a host name that needs quoting.
 *
 * Key idea: a local directory poses as remote (SHARDFS_POSIX_REMOTE) or as
 * a FUSE store (SHARDFS_POSIX_HOST_LOCKS, SHARDFS_LOCK_DIR), and the
 * failures no local file system gives on demand (a stale handle, ENOLCK,
 * ENOSPC) are made at result points of the test build ("lock:open",
 * "lock:flock", "own:create", "commit:tmp", "commit:mkdir"). Every dump
 * that succeeds is checked by reading its bytes back.
 */
#include "backendfx.h"
#include "testpoint_i.h"

#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/file.h>
#include <sys/fsuid.h>
#include <sys/wait.h>
#include <syslog.h>
#include <time.h>

TestSuite(posix_locks, .init = mkroot, .fini = rmroot, .timeout = 60);

/* The backend on g_root with a deadline of timeout_ms, posing as remote
 * and as a FUSE store as asked; lockdir: SHARDFS_LOCK_DIR (NULL: unset). */
static struct sfs_backend *open_as(bool remote, bool fuse, const char *lockdir, uint32_t timeout_ms)
{
    struct sfs_backend_params bp = {.shard_size = S_SMALL, .timeout_ms = timeout_ms};
    char err[256] = "";
    struct sfs_backend *be;
    int e = 0;

    setenv("SHARDFS_POSIX_REMOTE", remote ? "1" : "0", 1);
    setenv("SHARDFS_POSIX_HOST_LOCKS", fuse ? "1" : "0", 1);
    if (lockdir)
        setenv("SHARDFS_LOCK_DIR", lockdir, 1);
    be = sfs_backend_open(g_root, &bp, err, sizeof(err), &e);
    unsetenv("SHARDFS_POSIX_REMOTE");
    unsetenv("SHARDFS_POSIX_HOST_LOCKS");
    unsetenv("SHARDFS_LOCK_DIR");
    cr_assert_not_null(be, "open: %d %s", e, err);
    return be;
}

/* Dump shard s of block b as version v: the dump's result. */
static int dump(struct sfs_backend *be, uint64_t b, uint32_t s, uint32_t v)
{
    struct sfs_key k = mkkey(b, s);
    char *buf = xalloc(S_SMALL);
    int r;

    fill(&k.block, s, v, buf, S_SMALL);
    r = sfs_backend_dump_sync(be, &k, buf, S_SMALL);
    free(buf);
    return r;
}

/* Does shard s of block b read as version v? */
static bool reads_as(struct sfs_backend *be, uint64_t b, uint32_t s, uint32_t v)
{
    struct sfs_key k = mkkey(b, s);
    char *buf = xalloc(S_SMALL);
    bool ok;

    memset(buf, 0xee, S_SMALL);
    ok = sfs_backend_load_sync(be, &k, buf, S_SMALL) == (int)S_SMALL &&
         matches(&k.block, s, v, buf, S_SMALL);
    free(buf);
    return ok;
}

/* The path of block b's file plus suffix. */
static void path_of(uint64_t b, const char *suffix, char out[450])
{
    struct sfs_block_id id = mkid(b);
    char p[400];

    block_path(0, &id, p, sizeof(p), true);
    snprintf(out, 450, "%s%s", p, suffix);
}

/* Evict block b as the scan would, stamping it first: evict's result. */
static int evict(struct sfs_backend *be, uint64_t b)
{
    struct sfs_block_id id = mkid(b);
    struct sfs_block_stamp st;
    uint64_t freed = 0;

    cr_assert_eq(sfs_backend_stamp(be, &id, &st), 0);
    return sfs_backend_evict(be, &id, &st, &freed);
}

/* The host part of this process's temporary names (posix_lock.c's
 * filter of gethostname). */
static void host_part(char out[64])
{
    char h[256] = "";
    size_t n = 0;

    gethostname(h, sizeof(h));
    for (size_t i = 0; h[i] && n < 40; i++) {
        char c = h[i];

        if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
            c == '-' || c == '_')
            out[n++] = c;
    }
    if (n == 0)
        out[n++] = '_';
    out[n] = '\0';
}

static atomic_int log_hits;
static char log_want[64];

static void count_log(int level, const char *msg, void *arg)
{
    (void)level;
    (void)arg;
    if (strstr(msg, log_want))
        atomic_fetch_add(&log_hits, 1);
}

static void watch_log(const char *want)
{
    snprintf(log_want, sizeof(log_want), "%s", want);
    atomic_store(&log_hits, 0);
    sfs_set_log(count_log, NULL, LOG_DEBUG);
}

/*
 * A FIFO, or a directory, at a block's lock-file name is no lock: the
 * commit never waits on it (its helper would be held until a writer came)
 * and goes on as where the file system refuses the lock; the thing stays
 * as it was. An eviction never goes on without the lock: it removes
 * nothing (-EBUSY).
 */
Test(posix_locks, a_lock_name_that_is_no_regular_file_holds_no_commit)
{
    struct sfs_backend *be = open_as(false, false, NULL, 4000);
    char lock[450];
    struct stat st;

    path_of(1, ".lock", lock);
    cr_assert_eq(mkfifo(lock, 0644), 0, "mkfifo: %s", strerror(errno));
    cr_assert_eq(dump(be, 1, 0, 1), (int)S_SMALL, "a FIFO at the lock's name failed the dump");
    cr_assert(reads_as(be, 1, 0, 1));
    cr_assert_eq(stat(lock, &st), 0);
    cr_assert(S_ISFIFO(st.st_mode), "the FIFO was replaced");
    cr_assert_eq(evict(be, 1), -EBUSY, "an eviction went on without the lock");
    cr_assert(reads_as(be, 1, 0, 1), "the block was evicted without its lock");
    cr_assert_eq(unlink(lock), 0);

    cr_assert_eq(mkdir(lock, 0755), 0);
    cr_assert_eq(dump(be, 1, 1, 1), (int)S_SMALL, "a directory at the lock's name failed the dump");
    cr_assert(reads_as(be, 1, 0, 1) && reads_as(be, 1, 1, 1));
    cr_assert_eq(stat(lock, &st), 0);
    cr_assert(S_ISDIR(st.st_mode));
    sfs_backend_close(be);
}

/* At "lock:flocked" (the flock answered): the lock file's path made to
 * name another file than the one locked, once: unlinked (a local holder
 * done with it) or, with a file to put there, renamed over. */
struct moved_lock {
    char lock[450], other[460];
    int hits;
};

static void tp_move_lock(const char *name, void *arg)
{
    struct moved_lock *m = arg;

    (void)name;
    if (m->hits++ != 0)
        return;
    if (m->other[0]) {
        int fd = open(m->other, O_WRONLY | O_CREAT | O_TRUNC, 0644);

        close(fd);
        rename(m->other, m->lock);
    } else {
        unlink(m->lock);
    }
}

/*
 * A local store's lock where the file system fails it: an interrupted
 * flock is taken again; a lock the file system refuses (ENOLCK, NFS
 * without a lock manager) or an open that fails is no lock, and the commit
 * goes on without it; a stale handle at the open is opened again, and a
 * lasting one given up after the retries (the commit goes on); a lock file
 * unlinked by its holder while we waited is taken again from its new
 * file. Each commit keeps every shard.
 */
Test(posix_locks, a_local_lock_that_fails_is_taken_again_or_gone_without)
{
    struct sfs_backend *be = open_as(false, false, NULL, 4000);
    static struct moved_lock m;
    uint32_t s = 0;

    cr_assert_eq(sfs_testpoint_arm_fail("lock:flock", EINTR, 1), 0);
    cr_assert_eq(dump(be, 2, s++, 1), (int)S_SMALL);
    cr_assert_eq(sfs_testpoint_hits("lock:flock"), 2, "an interrupted flock was not taken again");

    cr_assert_eq(sfs_testpoint_arm_fail("lock:flock", ENOLCK, 1), 0);
    cr_assert_eq(dump(be, 2, s++, 1), (int)S_SMALL, "a refused lock failed the commit");
    cr_assert_eq(sfs_testpoint_hits("lock:flock"), 1);

    cr_assert_eq(sfs_testpoint_arm_fail("lock:open", EMFILE, 1), 0);
    cr_assert_eq(dump(be, 2, s++, 1), (int)S_SMALL, "a failed open of the lock failed the commit");

    cr_assert_eq(sfs_testpoint_arm_fail("lock:open", ESTALE, 2), 0);
    cr_assert_eq(dump(be, 2, s++, 1), (int)S_SMALL);
    cr_assert_eq(sfs_testpoint_hits("lock:open"), 3, "a stale lock file was not opened again");
    sfs_testpoint_disarm_all();

    path_of(2, ".lock", m.lock);
    cr_assert_eq(sfs_testpoint_arm("lock:flocked", SFS_TP_CALL, tp_move_lock, &m), 0);
    cr_assert_eq(dump(be, 2, s++, 1), (int)S_SMALL);
    sfs_testpoint_disarm_all();
    cr_assert_eq(m.hits, 2, "a lock whose file was unlinked meanwhile was kept (%d)", m.hits);

    cr_assert_eq(sfs_testpoint_arm_fail("lock:open", ESTALE, 1000000), 0);
    cr_assert_eq(dump(be, 2, s++, 1), (int)S_SMALL, "a lock file stale for good failed the commit");
    cr_assert_gt(sfs_testpoint_hits("lock:open"), 3);
    sfs_testpoint_disarm_all();
    for (uint32_t i = 0; i < s; i++)
        cr_assert(reads_as(be, 2, i, 1), "shard %u lost", i);
    sfs_backend_close(be);
}

/*
 * A remote store's lock (polled, never waited for in the kernel): held by
 * another writer past the poll (a quarter of the deadline), the commit
 * goes on without it and the holder keeps it (the lock file's record is
 * then out of date: the next partial commit's one refusal, as
 * test_backend_remote shows, so the rest is on another block); an
 * interrupted or stale flock is tried again; a lock file replaced while
 * we polled (its inode no longer the path's) is taken again from the new
 * file.
 */
Test(posix_locks, a_remote_lock_held_stale_or_replaced)
{
    struct sfs_backend *be = open_as(true, false, NULL, 2000);
    static struct moved_lock m;
    char lock[450];
    int held, probe;

    cr_assert_eq(dump(be, 3, 0, 1), (int)S_SMALL);
    path_of(3, ".lock", lock);
    held = open(lock, O_RDWR);
    cr_assert_geq(held, 0, "a remote store's lock file is kept: %s", strerror(errno));
    cr_assert_eq(flock(held, LOCK_EX | LOCK_NB), 0);
    cr_assert_eq(sfs_testpoint_arm("lock:flocked", SFS_TP_CALL, NULL, NULL), 0);
    cr_assert_eq(dump(be, 3, 1, 1), (int)S_SMALL, "a lock held past the poll failed the commit");
    cr_assert_eq(sfs_testpoint_hits("lock:flocked"), 0, "a held lock was taken");
    sfs_testpoint_disarm_all();
    probe = open(lock, O_RDONLY);
    cr_assert_geq(probe, 0);
    cr_assert_neq(flock(probe, LOCK_EX | LOCK_NB), 0, "the holder lost its lock");
    close(probe);
    close(held);
    cr_assert(reads_as(be, 3, 0, 1) && reads_as(be, 3, 1, 1));

    cr_assert_eq(dump(be, 14, 0, 1), (int)S_SMALL);
    cr_assert_eq(sfs_testpoint_arm_fail("lock:flock", EINTR, 1), 0);
    cr_assert_eq(dump(be, 14, 1, 1), (int)S_SMALL);
    cr_assert_eq(sfs_testpoint_hits("lock:flock"), 2);
    cr_assert_eq(sfs_testpoint_arm_fail("lock:flock", ESTALE, 1), 0);
    cr_assert_eq(dump(be, 14, 2, 1), (int)S_SMALL);
    cr_assert_eq(sfs_testpoint_hits("lock:flock"), 2, "a stale lock was not taken again");
    sfs_testpoint_disarm_all();

    path_of(14, ".lock", m.lock);
    snprintf(m.other, sizeof(m.other), "%s.new", m.lock);
    cr_assert_eq(sfs_testpoint_arm("lock:flocked", SFS_TP_CALL, tp_move_lock, &m), 0);
    cr_assert_eq(dump(be, 14, 3, 1), (int)S_SMALL);
    sfs_testpoint_disarm_all();
    cr_assert_eq(m.hits, 2, "a lock whose file was replaced meanwhile was kept (%d)", m.hits);
    for (uint32_t i = 0; i < 4; i++)
        cr_assert(reads_as(be, 14, i, 1), "shard %u lost", i);
    sfs_backend_close(be);
}

/*
 * A FUSE store whose host lock directory cannot be made (its parent is
 * missing): said once, and the block locks are taken on the store, as
 * without host locks; commits and evictions go on.
 */
Test(posix_locks, a_host_lock_directory_that_cannot_be_made_locks_on_the_store)
{
    char dir[400];
    struct sfs_backend *be;

    snprintf(dir, sizeof(dir), "%s/no/such/dir", g_root);
    watch_log("no lock directory");
    be = open_as(true, true, dir, 4000);
    sfs_set_log(NULL, NULL, 0);
    cr_assert_eq(atomic_load(&log_hits), 1, "the missing lock directory was not said");
    cr_assert_eq(sfs_testpoint_arm("lock:flocked", SFS_TP_CALL, NULL, NULL), 0);
    cr_assert_eq(dump(be, 4, 0, 1), (int)S_SMALL);
    cr_assert_eq(dump(be, 4, 1, 1), (int)S_SMALL);
    cr_assert_eq(sfs_testpoint_hits("lock:flocked"), 2, "the store's lock was not taken");
    sfs_testpoint_disarm_all();
    cr_assert(reads_as(be, 4, 0, 1) && reads_as(be, 4, 1, 1));
    cr_assert_eq(evict(be, 4), 0);
    cr_assert_eq(file_size(0, 4), -1);
    sfs_backend_close(be);
}

/* The owner file of block 5 played by a writer of another host: at
 * "own:taken", rewritten with a new token at every hit (a live writer
 * committing again and again: rewrite), or removed once it changed (its
 * writer done: gone); at "own:judged" or "commit:written", rewritten once
 * (a writer that took it over meanwhile). */
struct owner_play {
    char own[450], text[128];
    int hits;
    bool rewrite, changed;
};

static void put_owner(const char *own, const char *text)
{
    char tmp[470];
    int fd;

    snprintf(tmp, sizeof(tmp), "%s.x", own);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return; /* asserted by what the commit then does */
    if (write(fd, text, strlen(text)) == (ssize_t)strlen(text))
        rename(tmp, own);
    close(fd);
}

static void tp_owner_taken(const char *name, void *arg)
{
    struct owner_play *o = arg;
    char text[128];

    (void)name;
    o->hits++;
    if (o->changed) {
        unlink(o->own);
    } else if (o->rewrite) {
        snprintf(text, sizeof(text), "otherhost 00000000000000aa 77 %d\n", o->hits);
        put_owner(o->own, text);
    }
}

static void tp_read_owner(const char *name, void *arg)
{
    struct owner_play *o = arg;
    int fd = open(o->own, O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, o->text, sizeof(o->text) - 1) : -1;

    (void)name;
    o->text[n > 0 ? n : 0] = '\0';
    if (fd >= 0)
        close(fd);
}

static void tp_owner_changes(const char *name, void *arg)
{
    struct owner_play *o = arg;

    (void)name;
    if (o->changed)
        return;
    o->changed = true;
    put_owner(o->own, "otherhost 00000000000000aa 77 changed\n");
}

static bool file_says(const char *path, const char *want)
{
    char got[256] = "";
    int fd = open(path, O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, got, sizeof(got) - 1) : -1;

    if (fd >= 0)
        close(fd);
    return n >= 0 && strcmp(got, want) == 0;
}

/*
 * The owner file of a FUSE store (it keeps other hosts' writers out):
 * a create the store refuses is no owner, and the commit goes on (an
 * eviction does not: -EBUSY); a stale one is made again. Another host's
 * owner file that keeps changing is a live writer: never broken, and the
 * commit goes on after its wait; one that changed between its judgement
 * and its break is not broken; one that took ours over while we committed
 * is not removed by our release.
 */
Test(posix_locks, owner_files_refused_stale_live_or_taken_over)
{
    char dir[400], own[450];
    static struct owner_play o;
    struct sfs_backend *be;
    struct stat st;
    uint32_t s = 0;

    snprintf(dir, sizeof(dir), "%s.locks", g_root);
    be = open_as(true, true, dir, 4000);
    path_of(5, ".own", own);
    cr_assert_eq(dump(be, 5, s++, 1), (int)S_SMALL);

    cr_assert_eq(sfs_testpoint_arm_fail("own:create", EACCES, 1), 0);
    cr_assert_eq(dump(be, 5, s++, 1), (int)S_SMALL, "a refused owner file failed the commit");
    cr_assert_eq(sfs_testpoint_arm_fail("own:create", EACCES, 1), 0);
    cr_assert_eq(evict(be, 5), -EBUSY, "an eviction went on without its owner file");
    cr_assert_eq(sfs_testpoint_arm_fail("own:create", ESTALE, 2), 0);
    cr_assert_eq(dump(be, 5, s++, 1), (int)S_SMALL);
    cr_assert_eq(sfs_testpoint_hits("own:create"), 3, "a stale owner file was not made again");
    sfs_testpoint_disarm_all();
    cr_assert_neq(stat(own, &st), 0, "an owner file is left");

    /* A live writer of another host, committing again and again. */
    memset(&o, 0, sizeof(o));
    memcpy(o.own, own, sizeof(o.own));
    o.rewrite = true;
    put_owner(own, "otherhost 00000000000000aa 77 0\n");
    cr_assert_eq(sfs_testpoint_arm("own:taken", SFS_TP_CALL, tp_owner_taken, &o), 0);
    cr_assert_eq(sfs_testpoint_arm("own:judged", SFS_TP_CALL, NULL, NULL), 0);
    cr_assert_eq(dump(be, 5, s++, 1), (int)S_SMALL, "a live owner's wait failed the commit");
    cr_assert_eq(sfs_testpoint_hits("own:judged"), 0, "a live owner file was judged stale");
    cr_assert_gt(o.hits, 1, "a live owner file was not waited for");
    sfs_testpoint_disarm_all();
    cr_assert_eq(stat(own, &st), 0, "a live owner file was broken");

    /* Judged stale, changed before its break (not broken), then gone. A
     * dead writer of our own lock domain's, so judged at its first look:
     * its host and domain read from one of ours. */
    memset(&o, 0, sizeof(o));
    memcpy(o.own, own, sizeof(o.own));
    cr_assert_eq(sfs_testpoint_arm("commit:written", SFS_TP_CALL, tp_read_owner, &o), 0);
    cr_assert_eq(dump(be, 5, s++, 1), (int)S_SMALL);
    sfs_testpoint_disarm_all();
    char *sp = strchr(o.text, ' ');
    cr_assert(sp && (sp = strchr(sp + 1, ' ')), "no owner file while we commit: '%s'", o.text);
    strcpy(sp, " 1 0\n"); /* pid 1: never one of our writers */
    put_owner(own, o.text);
    watch_log("broke a stale owner file");
    cr_assert_eq(sfs_testpoint_arm("own:taken", SFS_TP_CALL, tp_owner_taken, &o), 0);
    cr_assert_eq(sfs_testpoint_arm("own:judged", SFS_TP_CALL, tp_owner_changes, &o), 0);
    cr_assert_eq(dump(be, 5, s++, 1), (int)S_SMALL);
    cr_assert_eq(sfs_testpoint_hits("own:judged"), 1);
    sfs_testpoint_disarm_all();
    sfs_set_log(NULL, NULL, 0);
    cr_assert(o.changed);
    cr_assert_eq(atomic_load(&log_hits), 0, "an owner file that changed was broken");
    cr_assert_neq(stat(own, &st), 0, "an owner file is left");

    /* Taken over while we commit (ours judged stale elsewhere). */
    memset(&o, 0, sizeof(o));
    memcpy(o.own, own, sizeof(o.own));
    cr_assert_eq(sfs_testpoint_arm("commit:written", SFS_TP_CALL, tp_owner_changes, &o), 0);
    cr_assert_eq(dump(be, 5, s++, 1), (int)S_SMALL);
    sfs_testpoint_disarm_all();
    cr_assert(file_says(own, "otherhost 00000000000000aa 77 changed\n"),
              "another writer's owner file was removed by our release");
    unlink(own);
    for (uint32_t i = 0; i < s; i++)
        cr_assert(reads_as(be, 5, i, 1), "shard %u lost", i);
    sfs_backend_close(be);
    rmdir(dir);
}

/*
 * This writer's temporary names are its own: a name an earlier process
 * with our pid left is passed over for the next counter, and when every
 * one tried is taken the dump fails (-EEXIST), the block unchanged; a
 * create the store fails (ENOSPC) fails the dump with it, a stale one is
 * made again; so is a stale directory create (one stale for good is
 * given up after the retries, -EIO), and a failed one fails the dump.
 * None of these leaves a temporary file of its own behind.
 */
Test(posix_locks, temporary_names_taken_or_failing)
{
    struct sfs_backend *be = open_as(false, false, NULL, 4000);
    char host[64], name[450], suffix[160];
    int fd;

    host_part(host);
    for (int seq = 0; seq < 2; seq++) {
        snprintf(suffix, sizeof(suffix), ".tmp.%s.%d.%d", host, (int)getpid(), seq);
        path_of(6, suffix, name);
        fd = open(name, O_WRONLY | O_CREAT | O_EXCL, 0644);
        cr_assert_geq(fd, 0, "%s: %s", name, strerror(errno));
        close(fd);
    }
    cr_assert_eq(dump(be, 6, 0, 1), (int)S_SMALL, "a name left with our pid failed the dump");
    cr_assert(reads_as(be, 6, 0, 1));
    /* The next dump's counter starts at 3: take all it tries. */
    for (int seq = 3; seq < 3 + 64; seq++) {
        snprintf(suffix, sizeof(suffix), ".tmp.%s.%d.%d", host, (int)getpid(), seq);
        path_of(6, suffix, name);
        fd = open(name, O_WRONLY | O_CREAT | O_EXCL, 0644);
        cr_assert_geq(fd, 0);
        close(fd);
    }
    cr_assert_eq(dump(be, 6, 1, 1), -EEXIST);
    cr_assert_eq(file_size(0, 6), (off_t)S_SMALL, "a failed dump changed the block");

    cr_assert_eq(sfs_testpoint_arm_fail("commit:tmp", ENOSPC, 1), 0);
    cr_assert_eq(dump(be, 6, 1, 1), -ENOSPC);
    cr_assert_eq(sfs_testpoint_arm_fail("commit:tmp", ESTALE, 2), 0);
    cr_assert_eq(dump(be, 6, 1, 1), (int)S_SMALL, "a stale temporary file failed the dump");
    cr_assert_eq(sfs_testpoint_arm_fail("commit:mkdir", ESTALE, 2), 0);
    cr_assert_eq(dump(be, 7, 0, 1), (int)S_SMALL, "a stale block directory failed the dump");
    cr_assert_eq(sfs_testpoint_hits("commit:mkdir"), 3);
    cr_assert_eq(sfs_testpoint_arm_fail("commit:mkdir", ENOSPC, 1), 0);
    cr_assert_eq(dump(be, 7, 1, 1), -ENOSPC);
    /* Stale for good: given up after the retries (-EIO), nothing made. */
    cr_assert_eq(sfs_testpoint_arm_fail("commit:mkdir", ESTALE, 1000000), 0);
    cr_assert_eq(dump(be, 7, 1, 1), -EIO);
    sfs_testpoint_disarm_all();
    cr_assert(reads_as(be, 6, 0, 1) && reads_as(be, 6, 1, 1) && reads_as(be, 7, 0, 1));
    cr_assert_eq(file_size(0, 7), (off_t)S_SMALL);
    sfs_backend_close(be);
}

/* Make (or replace) the file name in block b's directory, its mtime two
 * hours back (before_now) or one ahead. */
static void leftover(uint64_t b, const char *suffix, bool old)
{
    struct timespec ts[2];
    char name[450];
    int fd;

    path_of(b, suffix, name);
    fd = open(name, O_WRONLY | O_CREAT, 0644);
    cr_assert_geq(fd, 0, "%s: %s", name, strerror(errno));
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec += old ? -7200 : 3600;
    ts[1] = ts[0];
    cr_assert_eq(futimens(fd, ts), 0);
    close(fd);
}

static bool there(uint64_t b, const char *suffix)
{
    char name[450];
    struct stat st;

    path_of(b, suffix, name);
    return lstat(name, &st) == 0;
}

/* A pid no process has (a child of ours, reaped). */
static pid_t dead_pid(void)
{
    pid_t pid = fork();

    if (pid == 0)
        _exit(0);
    cr_assert_gt(pid, 0);
    waitpid(pid, NULL, 0);
    return pid;
}

/*
 * The sweep of a block directory (once per quarter of the age, by the
 * file system's clock) removes what dead writers left older than the age:
 * temporary files of other hosts, of this host's dead processes or with
 * no pid in their name, second names, owner files, and lock files no one
 * holds; it keeps a live writer's temporary file (ours, pid 1's), a lock
 * file held, young files, what is not a regular file and what is not a
 * commit's. A remote store's lock file is removed by age alone (flock does
 * not tell there). A sweep within a quarter of the age of the last one
 * does not run.
 */
Test(posix_locks, the_sweep_takes_every_dead_writers_leftover_and_nothing_else)
{
    static const char *gone[] = {".tmp.otherhost.123.0",
                                 ".tmp.HOST.DEAD.0",
                                 ".tmp.HOST.abc.0",
                                 ".tmp.HOST.0.0",
                                 ".tmp.HOST.99999999999.0",
                                 ".tmp.HOST",
                                 ".tmp.HOSTX.5.0",
                                 ".tmp.HOST.7",
                                 ".ref.00000000000000ab",
                                 ".own",
                                 ".lock"};
    static const char *kept[] = {".tmp.HOST.SELF.0", ".tmp.HOST.1.0", ".other", ".tmp.young.1.0"};
    char host[64], sfx[40][160], held_lock[450], dirlock[450];
    struct sfs_backend *be;
    struct stat st;
    pid_t dead = dead_pid();
    int n = 0, held;

    host_part(host);
    setenv("SHARDFS_POSIX_TMP_AGE_MS", "3600000", 1);
    be = open_as(false, false, NULL, 4000);
    unsetenv("SHARDFS_POSIX_TMP_AGE_MS");
    /* Names with HOST, DEAD and SELF filled in. */
    for (size_t i = 0; i < sizeof(gone) / sizeof(gone[0]) + sizeof(kept) / sizeof(kept[0]); i++) {
        const char *t =
            i < sizeof(gone) / sizeof(gone[0]) ? gone[i] : kept[i - sizeof(gone) / sizeof(gone[0])];
        char *o = sfx[n++];

        o[0] = '\0';
        for (const char *c = t; *c;) {
            if (strncmp(c, "HOST", 4) == 0) {
                strcat(o, host);
                c += 4;
            } else if (strncmp(c, "DEAD", 4) == 0) {
                sprintf(o + strlen(o), "%d", (int)dead);
                c += 4;
            } else if (strncmp(c, "SELF", 4) == 0) {
                sprintf(o + strlen(o), "%d", (int)getpid());
                c += 4;
            } else {
                strncat(o, c++, 1);
            }
        }
        leftover(8, o, strstr(t, "young") == NULL);
    }
    /* A held lock file (of another block) and a directory at a lock's name. */
    leftover(9, ".lock", true);
    path_of(9, ".lock", held_lock);
    held = open(held_lock, O_RDONLY);
    cr_assert_eq(flock(held, LOCK_EX), 0);
    path_of(10, ".lock", dirlock);
    cr_assert_eq(mkdir(dirlock, 0755), 0);

    cr_assert_eq(dump(be, 8, 0, 1), (int)S_SMALL);
    for (int i = 0; i < n; i++) {
        bool keep = i >= (int)(sizeof(gone) / sizeof(gone[0]));

        cr_assert_eq(there(8, sfx[i]), keep, "%s: %s", sfx[i], keep ? "swept" : "left");
    }
    cr_assert_eq(stat(held_lock, &st), 0, "a held lock file was swept");
    cr_assert_eq(stat(dirlock, &st), 0);
    close(held);

    /* Within a quarter of the age: no sweep. */
    leftover(8, ".own", true);
    cr_assert_eq(dump(be, 8, 1, 1), (int)S_SMALL);
    cr_assert(there(8, ".own"), "a sweep ran again at once");
    sfs_backend_close(be);

    /* A remote store: an old lock file goes by its age. */
    setenv("SHARDFS_POSIX_TMP_AGE_MS", "3600000", 1);
    be = open_as(true, false, NULL, 4000);
    unsetenv("SHARDFS_POSIX_TMP_AGE_MS");
    leftover(13, ".lock", true);
    cr_assert_eq(dump(be, 9, 0, 1), (int)S_SMALL);
    cr_assert_not(there(13, ".lock"), "an old lock file of a remote store was left");
    cr_assert_not(there(8, ".own"), "an old owner file was left");
    cr_assert(reads_as(be, 9, 0, 1));
    for (uint32_t i = 0; i < 2; i++)
        cr_assert(reads_as(be, 8, i, 1), "shard %u", i);
    sfs_backend_close(be);
}

/* At "commit:written": the names in block 11's directory that hold
 * ".tmp.", into names. */
struct tmp_names {
    char dir[450], names[512];
};

static void tp_tmp_names(const char *name, void *arg)
{
    struct tmp_names *t = arg;
    DIR *d = opendir(t->dir);
    struct dirent *de;

    (void)name;
    t->names[0] = '\0';
    while (d && (de = readdir(d))) {
        if (strstr(de->d_name, ".tmp.") &&
            strlen(t->names) + strlen(de->d_name) + 2 < sizeof(t->names)) {
            strcat(t->names, de->d_name);
            strcat(t->names, " ");
        }
    }
    if (d)
        closedir(d);
}

/*
 * A host name with characters that need quoting (a '.', the temporary
 * name's separator; a '!') never reaches a file name: only letters,
 * digits, '-' and '_' of it do, and a name with none of them is "_". In
 * a UTS namespace of the test's own (root only).
 */
Test(posix_locks, a_host_name_that_needs_quoting_is_filtered)
{
    static const char *names[2][2] = {{"a.b!c_D-9", ".tmp.abc_D-9."}, {"..!", ".tmp._."}};
    static struct tmp_names t;

    if (unshare(CLONE_NEWUTS) != 0)
        cr_skip_test("no UTS namespace here (%s)", strerror(errno));
    path_of(11, "", t.dir);
    *strrchr(t.dir, '/') = '\0';
    for (int i = 0; i < 2; i++) {
        struct sfs_backend *be;
        char want[80];

        cr_assert_eq(sethostname(names[i][0], strlen(names[i][0])), 0);
        be = open_as(false, false, NULL, 4000);
        cr_assert_eq(sfs_testpoint_arm("commit:written", SFS_TP_CALL, tp_tmp_names, &t), 0);
        cr_assert_eq(dump(be, 11, (uint32_t)i, 1), (int)S_SMALL);
        sfs_testpoint_disarm_all();
        snprintf(want, sizeof(want), "%s%d.", names[i][1], (int)getpid());
        cr_assert(strstr(t.names, want), "host %s: temporary names '%s'", names[i][0], t.names);
        cr_assert(reads_as(be, 11, (uint32_t)i, 1));
        sfs_backend_close(be);
    }
}

/*
 * Another user's lock file on a shared remote store (a writer that may
 * not write it): locked all the same, read-only, and its record neither
 * read nor written (it could not be kept, nor cleared after a refusal):
 * every commit goes through, as without a record. The writer is this process with the
 * file-system identity of nobody (setfsuid), its backend's threads made
 * under it; root only.
 */
Test(posix_locks, another_users_lock_file_is_locked_without_a_record)
{
    struct sfs_backend *be = open_as(true, false, NULL, 4000);
    char data[400], lock[450];
    struct stat st;

    cr_assert_eq(dump(be, 12, 0, 1), (int)S_SMALL);
    sfs_backend_close(be);
    if (geteuid() != 0)
        cr_skip_test("needs root to act as another user");
    path_of(12, ".lock", lock);
    snprintf(data, sizeof(data), "%s/data", g_root);
    cr_assert_eq(chmod(g_root, 0777), 0);
    cr_assert_eq(chmod(data, 0777), 0);
    setfsgid(65534);
    setfsuid(65534);
    cr_assert_eq((int)setfsuid((uid_t)-1), 65534);
    be = open_as(true, false, NULL, 4000);
    int r1 = dump(be, 12, 1, 1), r2 = dump(be, 12, 2, 1), r3 = dump(be, 12, 3, 1);
    sfs_backend_close(be);
    setfsuid(0);
    setfsgid(0);
    cr_assert_eq(r1, (int)S_SMALL, "another user's lock file failed the commit");
    /* Refused (-EIO) once the retries were spent, each, when the record
     * it could not keep was read. */
    cr_assert_eq(r2, (int)S_SMALL, "the next commit was refused (%d)", r2);
    cr_assert_eq(r3, (int)S_SMALL, "the commit after was refused (%d)", r3);
    cr_assert_eq(stat(lock, &st), 0);
    cr_assert_eq(st.st_uid, 0u, "the lock file was replaced");
    be = open_as(true, false, NULL, 4000);
    for (uint32_t i = 0; i < 4; i++)
        cr_assert(reads_as(be, 12, i, 1), "shard %u", i);
    sfs_backend_close(be);
}
