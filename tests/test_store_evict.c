/* SPDX-License-Identifier: MIT */
/*
 * test_store_evict.c - the store's side of a bounded store: the scan of
 * every block file (sfs_backend_scan) and the eviction of a whole block
 * (sfs_backend_evict) in the posix backend.
 *
 * The scan visits each block file once with its bytes on disk, whatever the
 * layout, and nothing else (temporary and lock files, directories). An
 * eviction removes a block only when its file is still the one the scan
 * stamped, waits for a commit that holds the block's lock and then keeps
 * what that commit wrote, leaves a reader that has the file open the whole
 * old block, and changes nothing on a read-only backend. The store-wide
 * lease (sfs_backend_lease) has one holder among the backends on a store
 * (two backends here stand for two hosts), is renewed by its holder's
 * calls, passes on when its holder stops renewing it (and only then: a
 * lease renewed before its break stays), is taken back by its holder when
 * put back after a taker moved it, and goes when dropped by its holder;
 * what is not a regular file at its name is no lease and holds no caller.
 */
#include <shardfs/backend.h>

#include "backendfx.h"
#include "testpoint_i.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <ftw.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

TestSuite(store_evict, .init = mkroot, .fini = rmroot, .timeout = 30);

struct seen {
    uint32_t n;
    uint64_t bytes;
    struct sfs_block_scan last[64];
};

static int scan_fn(const struct sfs_block_scan *b, void *arg)
{
    struct seen *s = arg;

    if (s->n < 64)
        s->last[s->n] = *b;
    s->n++;
    s->bytes += b->bytes;
    return 0;
}

static const struct sfs_block_scan *find(const struct seen *s, uint64_t blk)
{
    struct sfs_block_id id = mkid(blk);

    for (uint32_t i = 0; i < s->n && i < 64; i++)
        if (memcmp(&s->last[i].id, &id, sizeof(id)) == 0)
            return &s->last[i];
    return NULL;
}

static void scan_layout(unsigned prefix)
{
    struct sfs_backend *be = open_spec("posix:%s?dir_prefix=%u", g_root, prefix);
    struct sfs_block_id id = mkid(1);
    struct seen s = {0};
    char path[400], other[450];

    for (uint64_t b = 1; b <= 10; b++)
        write_block(prefix, b, (uint32_t)b, S_SMALL);
    /* Leftovers of commits and strangers: not block files. */
    block_path(prefix, &id, path, sizeof(path), false);
    snprintf(other, sizeof(other), "%s.tmp.h.1.1", path);
    close(open(other, O_CREAT | O_WRONLY, 0644));
    snprintf(other, sizeof(other), "%s.lock", path);
    close(open(other, O_CREAT | O_WRONLY, 0644));
    cr_assert_eq(sfs_backend_scan(be, scan_fn, &s), 0);
    cr_assert_eq(s.n, 10, "prefix %u: %u files", prefix, s.n);
    for (uint64_t b = 1; b <= 10; b++) {
        const struct sfs_block_scan *f = find(&s, b);

        cr_assert_not_null(f, "block %llu not scanned", (unsigned long long)b);
        cr_assert_eq(f->stamp.size, b * S_SMALL);
        cr_assert_geq(f->bytes, b * S_SMALL, "bytes on disk %llu", (unsigned long long)f->bytes);
        cr_assert(!(f->stamp.flags & SFS_STAMP_ABSENT));
    }
    sfs_backend_close(be);
}

Test(store_evict, scan_visits_every_block_file_once_with_its_bytes)
{
    scan_layout(0);
    rmroot();
    mkroot();
    scan_layout(2);
}

static struct sfs_block_scan scan_one(struct sfs_backend *be, uint64_t blk)
{
    struct seen s = {0};
    const struct sfs_block_scan *f;

    cr_assert_eq(sfs_backend_scan(be, scan_fn, &s), 0);
    f = find(&s, blk);
    cr_assert_not_null(f);
    return *f;
}

Test(store_evict, a_block_rewritten_since_the_scan_stays)
{
    struct sfs_backend *be = open_spec("%s", g_root);
    struct sfs_block_scan old;
    uint64_t freed = 1;
    char *buf = xalloc(S_SMALL);

    write_block(0, 7, 2, S_SMALL);
    old = scan_one(be, 7);
    fill(&old.id, 1, 1, buf, S_SMALL);
    cr_assert_eq(sfs_backend_dump_sync(be, &(struct sfs_key){old.id, 1}, buf, S_SMALL),
                 (int)S_SMALL);
    cr_assert_eq(sfs_backend_evict(be, &old.id, &old.stamp, &freed), -ESTALE);
    cr_assert_eq(freed, 0);
    cr_assert_eq(file_size(0, 7), 2 * S_SMALL, "a fresh commit was removed");
    /* With the stamp of what is there now, it goes, and loads miss. */
    old = scan_one(be, 7);
    cr_assert_eq(sfs_backend_evict(be, &old.id, &old.stamp, &freed), 0);
    cr_assert_geq(freed, 2 * S_SMALL);
    cr_assert_eq(file_size(0, 7), -1);
    cr_assert_eq(sfs_backend_load_sync(be, &(struct sfs_key){old.id, 0}, buf, S_SMALL), -ENOENT);
    cr_assert_eq(sfs_backend_evict(be, &old.id, &old.stamp, &freed), -ENOENT);
    free(buf);
    sfs_backend_close(be);
}

Test(store_evict, a_reader_with_the_file_open_reads_the_whole_old_block)
{
    struct sfs_backend *be = open_spec("%s", g_root);
    struct sfs_block_id id = mkid(3);
    struct sfs_block_scan b;
    char path[400];
    char *buf = xalloc(S_SMALL);
    int fd;

    write_block(0, 3, 4, S_SMALL);
    b = scan_one(be, 3);
    block_path(0, &id, path, sizeof(path), false);
    fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(sfs_backend_evict(be, &id, &b.stamp, NULL), 0);
    for (uint32_t n = 0; n < 4; n++) {
        cr_assert_eq(pread(fd, buf, S_SMALL, (off_t)n * S_SMALL), (ssize_t)S_SMALL);
        cr_assert(matches(&id, n, 0, buf, S_SMALL), "shard %u torn after the eviction", n);
    }
    close(fd);
    free(buf);
    sfs_backend_close(be);
}

struct evict_arg {
    struct sfs_backend *be;
    struct sfs_block_scan b;
    int ret;
};

static void *evict_thread(void *arg)
{
    struct evict_arg *a = arg;

    a->ret = sfs_backend_evict(a->be, &a->b.id, &a->b.stamp, NULL);
    return NULL;
}

/* A commit holds the block's lock (as posix_commit.c takes it): the
 * eviction waits for it, then keeps what it committed. */
Test(store_evict, an_eviction_waits_for_a_commit_in_flight_and_keeps_its_block)
{
    struct sfs_backend *be = open_spec("%s", g_root);
    struct evict_arg a = {.be = be};
    struct sfs_block_id id = mkid(5);
    char path[400], lock[450], tmp[450];
    pthread_t t;
    int lfd, fd;

    write_block(0, 5, 1, S_SMALL);
    a.b = scan_one(be, 5);
    block_path(0, &id, path, sizeof(path), false);
    snprintf(lock, sizeof(lock), "%s.lock", path);
    lfd = open(lock, O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    cr_assert_geq(lfd, 0);
    cr_assert_eq(flock(lfd, LOCK_EX), 0);
    cr_assert_eq(pthread_create(&t, NULL, evict_thread, &a), 0);
    usleep(100 * 1000); /* whether it waits yet or not, it must wait */
    /* The commit: a new file renamed over the block, then the lock let go
     * the way a commit lets it go (unlinked first). */
    snprintf(tmp, sizeof(tmp), "%s.tmp.test.1.1", path);
    fd = open(tmp, O_CREAT | O_WRONLY, 0644);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, 2 * S_SMALL), 0);
    close(fd);
    cr_assert_eq(rename(tmp, path), 0);
    unlink(lock);
    close(lfd);
    pthread_join(t, NULL);
    cr_assert_eq(a.ret, -ESTALE, "evict: %d", a.ret);
    cr_assert_eq(file_size(0, 5), 2 * S_SMALL, "the committed block was removed");
    sfs_backend_close(be);
}

/* At lock:flocked (the eviction holds the block's lock): the block file
 * removed meanwhile, or replaced by a FIFO (arg: its path). */
static void block_removed(const char *name, void *arg)
{
    (void)name;
    unlink(arg);
}

static void block_made_fifo(const char *name, void *arg)
{
    (void)name;
    unlink(arg);
    mkfifo(arg, 0644);
}

/*
 * The block removed (another collector, a remove of shard 0) or replaced
 * by what is no block file while the eviction waited for its lock: gone
 * (-ENOENT), nothing else removed. On a remote store an eviction records
 * the block removed in its lock file, drops the second name of the file
 * it removed, and a later commit of the block starts from nothing.
 */
Test(store_evict, a_block_gone_while_its_eviction_waited_and_a_remote_eviction)
{
    struct sfs_backend *be = open_spec("%s", g_root);
    struct sfs_block_id id = mkid(11);
    static char path[400];
    char dir[400];
    struct sfs_block_scan b;
    struct dirent *de;
    struct stat st;
    char *buf = xalloc(S_SMALL);
    DIR *d;

    block_path(0, &id, path, sizeof(path), false);
    write_block(0, 11, 2, S_SMALL);
    b = scan_one(be, 11);
    cr_assert_eq(sfs_testpoint_arm("lock:flocked", SFS_TP_CALL, block_removed, path), 0);
    cr_assert_eq(sfs_backend_evict(be, &id, &b.stamp, NULL), -ENOENT);
    write_block(0, 11, 2, S_SMALL);
    b = scan_one(be, 11);
    cr_assert_eq(sfs_testpoint_arm("lock:flocked", SFS_TP_CALL, block_made_fifo, path), 0);
    cr_assert_eq(sfs_backend_evict(be, &id, &b.stamp, NULL), -ENOENT);
    sfs_testpoint_disarm_all();
    cr_assert(stat(path, &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO was removed");
    cr_assert_eq(unlink(path), 0);
    sfs_backend_close(be);

    setenv("SHARDFS_POSIX_REMOTE", "1", 1);
    be = open_spec("%s", g_root);
    unsetenv("SHARDFS_POSIX_REMOTE");
    for (uint32_t n = 0; n < 2; n++) { /* shard by shard: each commit links its second name */
        fill(&id, n, 1, buf, S_SMALL);
        cr_assert_eq(sfs_backend_dump_sync(be, &(struct sfs_key){id, n}, buf, S_SMALL),
                     (int)S_SMALL);
    }
    b = scan_one(be, 11);
    cr_assert_eq(sfs_backend_evict(be, &id, &b.stamp, NULL), 0);
    cr_assert_eq(file_size(0, 11), -1);
    snprintf(dir, sizeof(dir), "%s", path);
    d = opendir(dirname(dir));
    cr_assert_not_null(d);
    while ((de = readdir(d)))
        cr_assert_null(strstr(de->d_name, ".ref."), "a second name is left: %s", de->d_name);
    closedir(d);
    /* Started from nothing: shard 0 alone, shard 1 a miss. */
    fill(&id, 0, 2, buf, S_SMALL);
    cr_assert_eq(sfs_backend_dump_sync(be, &(struct sfs_key){id, 0}, buf, S_SMALL), (int)S_SMALL);
    cr_assert_eq(file_size(0, 11), (off_t)S_SMALL);
    cr_assert_eq(sfs_backend_load_sync(be, &(struct sfs_key){id, 1}, buf, S_SMALL), -ENOENT);
    free(buf);
    sfs_backend_close(be);
}

Test(store_evict, a_read_only_backend_removes_nothing)
{
    struct sfs_backend *be;
    struct sfs_block_scan b;

    write_block(0, 9, 1, S_SMALL);
    be = open_be(g_root, S_SMALL, true);
    b = scan_one(be, 9);
    cr_assert_eq(sfs_backend_evict(be, &b.id, &b.stamp, NULL), -EROFS);
    cr_assert_eq(file_size(0, 9), S_SMALL);
    cr_assert_eq(sfs_backend_lease(be, "collector", 60000), -EROFS, "a read-only lease");
    sfs_backend_close(be);
    be = open_be("mem:", S_SMALL, false);
    cr_assert_eq(sfs_backend_scan(be, scan_fn, &(struct seen){0}), -EOPNOTSUPP);
    sfs_backend_close(be);
}

Test(store_evict, a_store_wide_lease_has_one_holder_and_passes_on_when_stale)
{
    struct sfs_backend *a = open_spec("%s", g_root), *b = open_spec("%s", g_root);
    struct timespec old[2] = {{0, UTIME_OMIT}, {0, 0}};
    char path[400];

    snprintf(path, sizeof(path), "%s/.shardfs_lease.collector", g_root);
    cr_assert_eq(sfs_backend_lease(a, "collector", 60000), 1);
    cr_assert_eq(sfs_backend_lease(b, "collector", 60000), 0, "two holders");
    cr_assert_eq(sfs_backend_lease(a, "collector", 60000), 1, "the holder's renewal");
    cr_assert_eq(sfs_backend_lease(b, "collector", 60000), 0);
    /* Its holder stopped renewing it an hour ago (killed, hung). */
    old[1].tv_sec = time(NULL) - 3600;
    cr_assert_eq(utimensat(AT_FDCWD, path, old, 0), 0);
    cr_assert_eq(sfs_backend_lease(b, "collector", 60000), 1, "a stale lease was not taken");
    cr_assert_eq(sfs_backend_lease(a, "collector", 60000), 0, "the old holder still holds it");
    /* Dropped by its holder only. */
    cr_assert_eq(sfs_backend_lease(a, "collector", 0), 0);
    cr_assert_eq(access(path, F_OK), 0, "dropped by one that did not hold it");
    cr_assert_eq(sfs_backend_lease(b, "collector", 0), 0);
    cr_assert_eq(access(path, F_OK), -1);
    cr_assert_eq(sfs_backend_lease(a, "collector", 60000), 1);
    cr_assert_eq(sfs_backend_lease(a, "../x", 60000), -EINVAL);
    sfs_backend_close(a);
    sfs_backend_close(b);
}

/*
 * Two takers of one stale lease: b finds it stale, and before b breaks it
 * (the point lease:break) c finds it stale too, breaks it and holds it.
 * b's rename then takes c's new file off the name, sees it is not the
 * file it found stale, and puts it back: c alone holds it, b stands by,
 * and the old holder a learns it lost it at its next look.
 */
static struct sfs_backend *g_c;
static int g_c_took = -1;

static void c_breaks_first(const char *name, void *arg)
{
    (void)arg;
    sfs_testpoint_arm(name, SFS_TP_OFF, NULL, NULL); /* c's own break runs through */
    g_c_took = sfs_backend_lease(g_c, "collector", 60000);
}

Test(store_evict, two_takers_of_a_stale_lease_one_wins)
{
    struct sfs_backend *a = open_spec("%s", g_root), *b = open_spec("%s", g_root);
    struct timespec old[2] = {{0, UTIME_OMIT}, {0, 0}};
    char path[400];
    DIR *d;
    struct dirent *de;

    g_c = open_spec("%s", g_root);
    snprintf(path, sizeof(path), "%s/.shardfs_lease.collector", g_root);
    cr_assert_eq(sfs_backend_lease(a, "collector", 60000), 1);
    old[1].tv_sec = time(NULL) - 3600;
    cr_assert_eq(utimensat(AT_FDCWD, path, old, 0), 0);
    cr_assert_eq(sfs_testpoint_arm("lease:break", SFS_TP_CALL, c_breaks_first, NULL), 0);
    cr_assert_eq(sfs_backend_lease(b, "collector", 60000), 0, "both takers hold the lease");
    cr_assert_eq(g_c_took, 1, "the first taker did not take the stale lease");
    cr_assert_eq(sfs_backend_lease(g_c, "collector", 60000), 1, "the winner lost it");
    cr_assert_eq(sfs_backend_lease(b, "collector", 60000), 0);
    cr_assert_eq(sfs_backend_lease(a, "collector", 60000), 0, "the old holder still holds it");
    /* Nothing left beside the lease itself. */
    d = opendir(g_root);
    cr_assert_not_null(d);
    while ((de = readdir(d)) != NULL)
        cr_assert(strncmp(de->d_name, ".shardfs_lease.collector.", 25) != 0, "left behind: %s",
                  de->d_name);
    closedir(d);
    sfs_backend_close(a);
    sfs_backend_close(b);
    sfs_backend_close(g_c);
}

static struct stat lease_stat(const char *path)
{
    struct stat st;

    cr_assert_eq(stat(path, &st), 0, "%s: %s", path, strerror(errno));
    return st;
}

/*
 * A file system may give a freed inode number to the next file it makes:
 * after a taker broke a paused holder's lease and removed its file, a
 * later holder's file can come under the name with the paused holder's
 * old inode number. The holder then must not count it as its own: it
 * checks its token too. Modelled here by another token written into the
 * holder's file in place (the same inode), at its renewal and between two.
 */
Test(store_evict, a_lease_file_with_our_inode_but_another_token_is_not_ours)
{
    struct sfs_backend *a = open_spec("%s", g_root);
    const char other[] = "another-host.4242.0123456789abcdef";
    char path[400];
    int fd;

    snprintf(path, sizeof(path), "%s/.shardfs_lease.collector", g_root);
    for (int at_renewal = 0; at_renewal < 2; at_renewal++) {
        cr_assert_eq(sfs_backend_lease(a, "collector", 60000), 1);
        ino_t ino = lease_stat(path).st_ino;

        fd = open(path, O_WRONLY | O_TRUNC);
        cr_assert_geq(fd, 0);
        cr_assert_eq(write(fd, other, strlen(other)), (ssize_t)strlen(other));
        close(fd);
        cr_assert_eq(lease_stat(path).st_ino, ino);
        if (at_renewal)
            usleep(2000); /* past a quarter of a 1 ms ttl: the call renews */
        cr_assert_eq(sfs_backend_lease(a, "collector", at_renewal ? 1 : 60000), 0,
                     "another's token under our inode number counted as ours (%s)",
                     at_renewal ? "at a renewal" : "between renewals");
        cr_assert_eq(unlink(path), 0);
    }
    sfs_backend_close(a);
}

/*
 * The holder's own calls: each one a quarter of the ttl after the last
 * renews the lease (its mtime to the store's now); a lease moved off its
 * name (a taker's rename) is lost at the holder's next look, and taken
 * again, with its token, once it is back; a drop that finds another's
 * file under the name puts it back; a role that cannot name a file is
 * refused.
 */
Test(store_evict, a_held_lease_is_renewed_lost_and_taken_back)
{
    struct sfs_backend *a = open_spec("%s", g_root), *b = open_spec("%s", g_root);
    struct timespec old[2] = {{0, UTIME_OMIT}, {0, 0}};
    char path[400], aside[420];
    struct stat st;
    ino_t ino;

    snprintf(path, sizeof(path), "%s/.shardfs_lease.collector", g_root);
    snprintf(aside, sizeof(aside), "%s.aside", path);
    cr_assert_eq(sfs_backend_lease(a, "", 60000), -EINVAL);
    cr_assert_eq(sfs_backend_lease(a, "a-role-name-longer-than-32-chars!", 60000), -EINVAL);
    cr_assert_eq(sfs_backend_lease(a, "collector", 60000), 1);
    ino = lease_stat(path).st_ino;

    /* Renewed: an hour old, then a call past a quarter of its ttl (1 ms). */
    old[1].tv_sec = time(NULL) - 3600;
    cr_assert_eq(utimensat(AT_FDCWD, path, old, 0), 0);
    usleep(2000);
    cr_assert_eq(sfs_backend_lease(a, "collector", 1), 1);
    st = lease_stat(path);
    cr_assert_gt(st.st_mtim.tv_sec, time(NULL) - 600, "the holder's call did not renew it");
    cr_assert_eq(st.st_ino, ino);

    /* Moved off its name: lost; put back: taken again. */
    cr_assert_eq(rename(path, aside), 0);
    usleep(2000);
    cr_assert_eq(sfs_backend_lease(a, "collector", 1), 0, "a lease off its name is still held");
    cr_assert_eq(rename(aside, path), 0);
    cr_assert_eq(sfs_backend_lease(a, "collector", 60000), 1, "its own lease not taken back");
    cr_assert_eq(lease_stat(path).st_ino, ino);
    cr_assert_eq(sfs_backend_lease(b, "collector", 60000), 0);

    /* b's file under the name while a believes it holds it: a's drop
     * leaves b's in place. */
    cr_assert_eq(rename(path, aside), 0);
    usleep(2000);
    cr_assert_eq(sfs_backend_lease(b, "collector", 60000), 1);
    ino = lease_stat(path).st_ino;
    cr_assert_eq(sfs_backend_lease(a, "collector", 0), 0);
    cr_assert_eq(lease_stat(path).st_ino, ino, "a drop removed another's lease");
    cr_assert_eq(sfs_backend_lease(b, "collector", 60000), 1, "a drop took another's lease");
    unlink(aside);
    sfs_backend_close(a);
    sfs_backend_close(b);
}

/* At lease:break: the stale lease renewed by its holder (rather late), or
 * dropped, between the taker's look and its break. */
static void holder_renews(const char *name, void *arg)
{
    (void)name;
    utimensat(AT_FDCWD, arg, NULL, 0);
}

static void holder_drops(const char *name, void *arg)
{
    char aside[420];

    (void)name;
    /* Kept aside, not removed: a new file could reuse its inode number. */
    snprintf(aside, sizeof(aside), "%s.aside", (const char *)arg);
    rename(arg, aside);
}

/*
 * A lease found stale whose holder renews it before the taker breaks it
 * is not broken: the taker puts it back and stands by, the holder keeps
 * it. One dropped meanwhile is not taken by that call (another may have
 * been first); the next call takes it.
 */
Test(store_evict, a_stale_lease_renewed_or_dropped_before_its_break)
{
    struct sfs_backend *a = open_spec("%s", g_root), *b = open_spec("%s", g_root);
    struct timespec old[2] = {{0, UTIME_OMIT}, {0, 0}};
    static char path[400];
    ino_t ino;

    snprintf(path, sizeof(path), "%s/.shardfs_lease.collector", g_root);
    cr_assert_eq(sfs_backend_lease(a, "collector", 60000), 1);
    ino = lease_stat(path).st_ino;
    old[1].tv_sec = time(NULL) - 3600;
    cr_assert_eq(utimensat(AT_FDCWD, path, old, 0), 0);
    cr_assert_eq(sfs_testpoint_arm("lease:break", SFS_TP_CALL, holder_renews, path), 0);
    cr_assert_eq(sfs_backend_lease(b, "collector", 60000), 0, "a renewed lease was broken");
    sfs_testpoint_disarm_all();
    cr_assert_eq(lease_stat(path).st_ino, ino, "the renewed lease was not put back");
    cr_assert_eq(sfs_backend_lease(a, "collector", 60000), 1, "its holder lost it");

    cr_assert_eq(utimensat(AT_FDCWD, path, old, 0), 0);
    cr_assert_eq(sfs_testpoint_arm("lease:break", SFS_TP_CALL, holder_drops, path), 0);
    cr_assert_eq(sfs_backend_lease(b, "collector", 60000), 0);
    sfs_testpoint_disarm_all();
    cr_assert_eq(sfs_backend_lease(b, "collector", 60000), 1, "a free lease was not taken");
    cr_assert_eq(sfs_backend_lease(a, "collector", 60000), 0);
    strcat(path, ".aside");
    unlink(path);
    sfs_backend_close(a);
    sfs_backend_close(b);
}

/* At lease:link (b about to link its file to the free name): a takes the
 * lease first. */
static struct sfs_backend *g_first;
static int g_first_took = -1;

static void other_links_first(const char *name, void *arg)
{
    (void)arg;
    sfs_testpoint_arm(name, SFS_TP_OFF, NULL, NULL); /* a's own link runs through */
    g_first_took = sfs_backend_lease(g_first, "collector", 60000);
}

/*
 * Two takers of a free lease: the one whose link comes second finds the
 * name taken (EEXIST) and stands by; the first holds it.
 */
Test(store_evict, two_takers_of_a_free_lease_one_wins)
{
    struct sfs_backend *b = open_spec("%s", g_root);

    g_first = open_spec("%s", g_root);
    cr_assert_eq(sfs_testpoint_arm("lease:link", SFS_TP_CALL, other_links_first, NULL), 0);
    cr_assert_eq(sfs_backend_lease(b, "collector", 60000), 0, "both takers hold the lease");
    sfs_testpoint_disarm_all();
    cr_assert_eq(g_first_took, 1, "the first taker did not take the free lease");
    cr_assert_eq(sfs_backend_lease(g_first, "collector", 60000), 1, "the winner lost it");
    cr_assert_eq(sfs_backend_lease(b, "collector", 60000), 0);
    sfs_backend_close(b);
    sfs_backend_close(g_first);
}

/*
 * What is no lease file at the lease's name: a directory is an error
 * (the lease cannot be had), and a FIFO too, at once: the look never
 * waits for a writer to open it (it held the collector's thread for
 * good). Neither is touched.
 */
Test(store_evict, a_fifo_or_a_directory_at_the_lease_name_holds_no_collector)
{
    struct sfs_backend *a = open_spec("%s", g_root);
    char path[400];
    struct stat st;

    snprintf(path, sizeof(path), "%s/.shardfs_lease.collector", g_root);
    cr_assert_eq(mkdir(path, 0755), 0);
    cr_assert_lt(sfs_backend_lease(a, "collector", 60000), 0, "a directory held as the lease");
    cr_assert(stat(path, &st) == 0 && S_ISDIR(st.st_mode));
    cr_assert_eq(rmdir(path), 0);
    cr_assert_eq(mkfifo(path, 0644), 0);
    cr_assert_lt(sfs_backend_lease(a, "collector", 60000), 0, "a FIFO held as the lease");
    cr_assert(stat(path, &st) == 0 && S_ISFIFO(st.st_mode));
    sfs_backend_close(a);
}
