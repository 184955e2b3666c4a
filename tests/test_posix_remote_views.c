/* SPDX-License-Identifier: MIT */
/*
 * test_posix_remote_views.c - a remote store's partial commit when the
 * block's name shows a file other than the one the lock file's record
 * names, and the second name (<file>.ref.<inode>) cannot stand in for it
 * (posix_remote.c's recorded_file): the second name gone, another file
 * under it, or a file under the block's name newer than the recorded one
 * (put there outside the protocol). Each such commit is looked up again
 * for the retries' 3 s, then refused (-EIO, nothing written) and the
 * record cleared: the next commit starts from the file as it is.
 *
 * Key idea: a local directory poses as remote (SHARDFS_POSIX_REMOTE); at
 * the commit's open of the block ("commit:open_committed") the block's
 * name is given another file once, as a client with stale lookups shows
 * it for longer than the retries.
 */
#include "backendfx.h"
#include "testpoint_i.h"

#include <time.h>

TestSuite(posix_remote_views, .init = mkroot, .fini = rmroot, .timeout = 60);

enum view { REF_GONE, REF_OTHER, NAME_NEWER };

struct swap {
    char block[400], older[420], ref[440], other[440];
    enum view v;
    int hits;
};

/* A copy of src at dst (a new inode), its mtime an hour back or ahead. */
static void copy_file(const char *src, const char *dst, bool ahead)
{
    char *buf = malloc(4 * S_SMALL);
    int in = open(src, O_RDONLY), out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    struct timespec ts[2];
    ssize_t n;

    cr_assert(in >= 0 && out >= 0);
    n = read(in, buf, 4 * S_SMALL);
    cr_assert_gt(n, 0);
    cr_assert_eq(write(out, buf, (size_t)n), n);
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec += ahead ? 3600 : -3600;
    ts[1] = ts[0];
    cr_assert_eq(futimens(out, ts), 0);
    close(in);
    close(out);
    free(buf);
}

static void tp_swap(const char *name, void *arg)
{
    struct swap *s = arg;

    (void)name;
    if (s->hits++ != 0)
        return;
    rename(s->older, s->block);
    if (s->v == REF_GONE)
        unlink(s->ref);
    else if (s->v == REF_OTHER)
        rename(s->other, s->ref);
}

Test(posix_remote_views, a_name_the_second_name_cannot_stand_in_for_is_refused_once)
{
    static const char *what[] = {"the second name gone", "another file under the second name",
                                 "a newer file under the name"};
    struct sfs_backend_params bp = {.shard_size = S_SMALL, .timeout_ms = 10000};
    char err[256] = "", *buf = xalloc(S_SMALL);
    static struct swap s;
    struct sfs_backend *be;
    int e = 0;

    setenv("SHARDFS_POSIX_REMOTE", "1", 1);
    be = sfs_backend_open(g_root, &bp, err, sizeof(err), &e);
    unsetenv("SHARDFS_POSIX_REMOTE");
    cr_assert_not_null(be, "%s", err);
    for (int v = REF_GONE; v <= NAME_NEWER; v++) {
        uint64_t b = 50 + (uint64_t)v;
        struct sfs_block_id id = mkid(b);
        struct stat st;

        for (uint32_t n = 0; n < 3; n++) {
            fill(&id, n, 1, buf, S_SMALL);
            cr_assert_eq(sfs_backend_dump_sync(be, &(struct sfs_key){id, n}, buf, S_SMALL),
                         (int)S_SMALL);
        }
        memset(&s, 0, sizeof(s));
        s.v = (enum view)v;
        block_path(0, &id, s.block, sizeof(s.block), false);
        cr_assert_eq(stat(s.block, &st), 0);
        snprintf(s.ref, sizeof(s.ref), "%s.ref.%016llx", s.block, (unsigned long long)st.st_ino);
        cr_assert_eq(access(s.ref, F_OK), 0, "no second name %s", s.ref);
        snprintf(s.older, sizeof(s.older), "%s.older", s.block);
        snprintf(s.other, sizeof(s.other), "%s.other", s.block);
        copy_file(s.block, s.older, v == NAME_NEWER);
        copy_file(s.block, s.other, false);
        cr_assert_eq(sfs_testpoint_arm("commit:open_committed", SFS_TP_CALL, tp_swap, &s), 0);
        fill(&id, 3, 1, buf, S_SMALL);
        cr_assert_eq(sfs_backend_dump_sync(be, &(struct sfs_key){id, 3}, buf, S_SMALL), -EIO,
                     "%s: not refused", what[v]);
        cr_assert_gt(s.hits, 1, "%s: not looked up again", what[v]);
        sfs_testpoint_disarm_all();
        cr_assert_eq(file_size(0, b), (off_t)3 * S_SMALL, "%s: a refused commit wrote", what[v]);
        /* The record cleared: the next commit starts from the file there. */
        cr_assert_eq(sfs_backend_dump_sync(be, &(struct sfs_key){id, 3}, buf, S_SMALL),
                     (int)S_SMALL, "%s: refused again", what[v]);
        for (uint32_t n = 0; n < 4; n++) {
            memset(buf, 0, S_SMALL);
            cr_assert_eq(sfs_backend_load_sync(be, &(struct sfs_key){id, n}, buf, S_SMALL),
                         (int)S_SMALL);
            cr_assert(matches(&id, n, 1, buf, S_SMALL), "%s: shard %u", what[v], n);
        }
        unlink(s.other);
    }
    sfs_backend_close(be);
    free(buf);
}
