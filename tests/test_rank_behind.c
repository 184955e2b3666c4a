/* SPDX-License-Identifier: MIT */
/*
 * test_rank_behind.c - write-behind dumps (sfs_rank_set_dump_mode): an
 * entry ends once its shard is Ready in the cache, the store write follows
 * under the writer's lease. Real forked ranks on a cache this process
 * serves (rankenv.c), a real posix store (or the fault backend over it).
 * The background write is held deterministically with the test build's
 * hook SHARDFS_RANK_BEHIND_HOLD_FD: each store write reads one byte from
 * that descriptor (a pipe the test writes to) before it starts.
 */
#include "rankenv.h"
#include "testutil.h"

#include <shardfs/rank.h>

#include <criterion/criterion.h>

#include <dirent.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NK 4 /* keys a writer dumps: blocks 0..NK-1, shard 0 (one per worker) */

/* A writer rank in a child: dumps blocks [first, first + NK) with `mode`,
 * reports each step on `up` and takes commands from `cmd`. */
struct writer {
    const char *sock;
    char spec[256];
    int mode;
    int hold_fd; /* the hook's descriptor; -1: no hold */
    int up[2];   /* child -> test: 'd' dumped (statuses 0), 'c' closed, 'x' failed */
    int cmd[2];  /* test -> child: 'c' close */
    uint64_t first;
    uint8_t fill; /* 0: tu_fill's bytes; else every byte this value */
};

static void fill_key(const struct writer *w, const struct sfs_key *k, void *buf)
{
    if (w->fill)
        memset(buf, w->fill, SHARD);
    else
        tu_fill(k, buf, SHARD);
}

static int writer_main(void *arg)
{
    struct writer *w = arg;
    struct sfs_rank_config cfg;
    struct sfs_rank_entry ent[NK];
    struct sfs_task *t;
    int st[NK], err = 0;
    char c;
    uint8_t *src = malloc((size_t)NK * SHARD);

    close(w->up[0]);
    close(w->cmd[1]);
    if (w->hold_fd >= 0) {
        char num[16];

        snprintf(num, sizeof(num), "%d", w->hold_fd);
        setenv("SHARDFS_RANK_BEHIND_HOLD_FD", num, 1);
    }
    sfs_rank_config_init(&cfg);
    cfg.socket_path = w->sock;
    cfg.backend = w->spec;
    cfg.copier = SFS_COPIER_HOST;
    struct sfs_rank *rk = sfs_rank_open(&cfg, &err);

    TU_CK(rk && src);
    TU_CK(sfs_rank_set_dump_mode(rk, w->mode) == 0);
    for (int i = 0; i < NK; i++) {
        struct sfs_key k = tu_key(w->first + i, 0);

        fill_key(w, &k, src + (size_t)i * SHARD);
        ent[i] = (struct sfs_rank_entry){k.block, 0, src + (size_t)i * SHARD};
    }
    TU_CK(sfs_rank_dump(rk, ent, NK, &t) == 0);
    TU_CK(sfs_rank_wait(t, 20000, st) == 0);
    for (int i = 0; i < NK; i++)
        TU_CK(st[i] == 0);
    sfs_rank_task_free(t);
    TU_CK(write(w->up[1], "d", 1) == 1);
    TU_CK(read(w->cmd[0], &c, 1) == 1 && c == 'c');
    sfs_rank_close(rk);
    TU_CK(write(w->up[1], "c", 1) == 1);
    free(src);
    return 0;
}

static pid_t writer_start(struct writer *w)
{
    cr_assert_eq(pipe(w->up), 0);
    cr_assert_eq(pipe(w->cmd), 0);
    pid_t pid = tu_fork(writer_main, w);

    close(w->up[1]);
    close(w->cmd[0]);
    return pid;
}

/* A write-behind writer on e over its store, its store writes held on the
 * pipe hold (hold[1] the test's end: a byte lets one write go). */
static pid_t held_writer_start(struct env *e, struct writer *w, int hold[2])
{
    pid_t pid;

    cr_assert_eq(pipe(hold), 0);
    w->sock = e->sock;
    w->hold_fd = hold[0];
    snprintf(w->spec, sizeof(w->spec), "%s", e->dir);
    pid = writer_start(w);
    close(hold[0]);
    return pid;
}

/* The next byte the writer reports, within 20 s ('?' when none came). */
static char writer_says(struct writer *w, int ms)
{
    struct pollfd pf = {.fd = w->up[0], .events = POLLIN};
    char c = '?';

    if (poll(&pf, 1, ms) == 1 && read(w->up[0], &c, 1) != 1)
        c = '?';
    return c;
}

/* Ask the writer to close its rank (it reports 'c' once close returned). */
static void writer_close(struct writer *w)
{
    cr_assert_eq(write(w->cmd[1], "c", 1), 1);
}

static void writer_end(struct writer *w, pid_t pid)
{
    cr_assert_eq(tu_wait(pid), 0, "the writer failed");
    close(w->up[0]);
    close(w->cmd[1]);
}

/* A reader rank in a child: loads blocks [first, first + NK) over the
 * store at spec; exits 0 when each has the bytes expected (fill as
 * writer.fill) and none came from the store (every entry a hit). */
struct reader {
    const char *sock;
    const char *spec;
    uint64_t first;
    uint8_t fill;
};

static int reader_main(void *arg)
{
    struct reader *rd = arg;
    struct sfs_rank_config cfg;
    struct sfs_rank_entry ent[NK];
    struct sfs_rank_stats rs;
    struct sfs_task *t;
    int st[NK], err = 0;
    uint8_t *bufs = malloc((size_t)NK * SHARD);
    uint8_t *want = malloc(SHARD);

    sfs_rank_config_init(&cfg);
    cfg.socket_path = rd->sock;
    cfg.backend = rd->spec;
    cfg.copier = SFS_COPIER_HOST;
    struct sfs_rank *rk = sfs_rank_open(&cfg, &err);

    TU_CK(rk && bufs && want);
    for (int i = 0; i < NK; i++)
        ent[i] = (struct sfs_rank_entry){tu_block(rd->first + i), 0, bufs + (size_t)i * SHARD};
    TU_CK(sfs_rank_load(rk, ent, NK, &t) == 0);
    TU_CK(sfs_rank_wait(t, 20000, st) == 0);
    sfs_rank_task_free(t);
    for (int i = 0; i < NK; i++) {
        struct sfs_key k = tu_key(rd->first + i, 0);

        TU_CK(st[i] == 0);
        if (rd->fill)
            memset(want, rd->fill, SHARD);
        else
            tu_fill(&k, want, SHARD);
        TU_CK(memcmp(bufs + (size_t)i * SHARD, want, SHARD) == 0);
    }
    sfs_rank_stats(rk, &rs);
    TU_CK(rs.owner_loads == 0 && rs.hits == NK);
    sfs_rank_close(rk);
    free(bufs);
    free(want);
    return 0;
}

static void read_from_memory(struct env *e, uint64_t first, uint8_t fill)
{
    struct reader rd = {.sock = e->sock, .spec = e->dir, .first = first, .fill = fill};

    cr_assert_eq(tu_wait(tu_fork(reader_main, &rd)), 0,
                 "another rank did not load the shards from memory");
}

/* Does the store hold shard 0 of `block`, with these bytes (fill as
 * writer.fill)? */
static bool store_has(struct env *e, uint64_t block, uint8_t fill)
{
    char path[512];
    uint8_t *buf = malloc(SHARD), *want = malloc(SHARD);
    struct sfs_key k = tu_key(block, 0);
    bool ok = false;

    tu_store_path(e->dir, block, path, sizeof(path));
    int fd = open(path, O_RDONLY);

    if (fd >= 0) {
        if (fill)
            memset(want, fill, SHARD);
        else
            tu_fill(&k, want, SHARD);
        ok = pread(fd, buf, SHARD, 0) == SHARD && memcmp(buf, want, SHARD) == 0;
        close(fd);
    }
    free(buf);
    free(want);
    return ok;
}

static bool store_lacks(struct env *e, uint64_t block)
{
    char path[512];
    struct stat sb;

    tu_store_path(e->dir, block, path, sizeof(path));
    return stat(path, &sb) < 0 && errno == ENOENT;
}

/* The cache holds `block`'s shard 0 Ready with these bytes. */
static void assert_resident(struct env *e, uint64_t block, uint8_t fill)
{
    struct sfs_key k = tu_key(block, 0);
    struct sfs_lease l;
    uint8_t *want = malloc(SHARD);

    cr_assert_eq(sfs_cache_get(e->c, &k, 0, sfs_deadline_after(1000000000), &l), SFS_HIT,
                 "block %lu is not resident", (unsigned long)block);
    if (fill)
        memset(want, fill, SHARD);
    else
        tu_fill(&k, want, SHARD);
    cr_assert(memcmp(sfs_cache_data(e->c, &l), want, SHARD) == 0, "block %lu: wrong bytes",
              (unsigned long)block);
    sfs_cache_release(e->c, &l);
    free(want);
}

/* A cache of 16 slots and an empty posix store. */
static void up(struct env *e)
{
    char data[256];

    env_up(e, 16, 0);
    snprintf(data, sizeof(data), "%s/data", e->dir);
    cr_assert_eq(mkdir(e->dir, 0700), 0);
    cr_assert_eq(mkdir(data, 0700), 0);
}

static void behind_stats_wait(struct env *e, uint64_t written, uint64_t failed)
{
    struct sfs_behind_stats wb = {0};

    for (int i = 0; i < 2000; i++) {
        sfs_cache_behind_stats(e->c, &wb);
        if (wb.written == written && wb.failed == failed)
            return;
        usleep(10000);
    }
    cr_assert_fail("write-behind counters: written %lu failed %lu, want %lu %lu",
                   (unsigned long)wb.written, (unsigned long)wb.failed, (unsigned long)written,
                   (unsigned long)failed);
}

Test(rank_behind, mode_is_checked, .timeout = 30)
{
    struct env e;

    up(&e);
    struct sfs_rank *rk = rank_here(&e, e.dir, 0, 0);

    cr_assert_eq(sfs_rank_set_dump_mode(rk, 2), -EINVAL);
    cr_assert_eq(sfs_rank_set_dump_mode(rk, -1), -EINVAL);
    cr_assert_eq(sfs_rank_set_dump_mode(NULL, SFS_DUMP_WRITE_BEHIND), -EINVAL);
    cr_assert_eq(sfs_rank_set_dump_mode(rk, SFS_DUMP_WRITE_BEHIND), 0);
    cr_assert_eq(sfs_rank_set_dump_mode(rk, SFS_DUMP_WRITE_THROUGH), 0);
    sfs_rank_close(rk);
    env_down(&e);
}

Test(rank_behind, entry_ends_before_the_store_has_it_and_close_waits, .timeout = 120)
{
    /* 16 slots: NK held by the writer, the flood of 64 keys evicts around
     * them. */
    struct env e;
    int hold[2];
    struct writer w = {.mode = SFS_DUMP_WRITE_BEHIND};
    struct sfs_stats cs;

    up(&e);
    pid_t pid = held_writer_start(&e, &w, hold);
    /* Every entry ended with status 0 while no store write has started. */
    cr_assert_eq(writer_says(&w, 20000), 'd');
    for (int i = 0; i < NK; i++)
        cr_assert(store_lacks(&e, i), "block %d is in the store already", i);
    /* Another rank loads them, from memory: no load of its own. */
    read_from_memory(&e, 0, 0);
    /* A flood four times the cache: the leased slots stay. */
    for (int i = 0; i < 64; i++) {
        struct sfs_key k = tu_key(1000 + i, 0);

        cr_assert_eq(tu_load(e.c, &k), SFS_OWNER);
    }
    sfs_cache_stats(e.c, &cs);
    cr_assert_geq(cs.evictions, 48, "the flood evicted %lu", (unsigned long)cs.evictions);
    for (int i = 0; i < NK; i++) {
        cr_assert(store_lacks(&e, i));
        assert_resident(&e, i, 0);
    }
    /* Close waits for the held writes (no 'c' while they are held: a
     * close that did not wait would report at once). */
    writer_close(&w);
    cr_assert_eq(writer_says(&w, 300), '?', "close returned with store writes held");
    for (int i = 0; i < NK; i++)
        cr_assert_eq(write(hold[1], "g", 1), 1);
    cr_assert_eq(writer_says(&w, 20000), 'c');
    writer_end(&w, pid);
    close(hold[1]);
    /* The store has the exact bytes, the cache the same, the slots are
     * free to go (env_down: no lease left). */
    for (int i = 0; i < NK; i++) {
        cr_assert(store_has(&e, i, 0), "block %d: the store lacks the bytes", i);
        assert_resident(&e, i, 0);
    }
    behind_stats_wait(&e, NK, 0);
    env_down(&e);
}

/* The nice value of a thread (field 19 of /proc/PID/task/TID/stat). */
static int thread_nice(pid_t pid, const char *tid)
{
    char path[96], buf[1024], *p;
    int nice = 99;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/task/%s/stat", (int)pid, tid);
    f = fopen(path, "r");
    if (!f)
        return 99;
    if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')) &&
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %d",
               &nice) != 1)
        nice = 99;
    fclose(f);
    return nice;
}

/* How many threads of pid are in read(fd), and the nice of the last. */
static int threads_reading(pid_t pid, int fd, int *nice)
{
    char dir[64], path[64 + 256 + 16], want[48], buf[256];
    struct dirent *de;
    DIR *d;
    int n = 0;

    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
    snprintf(want, sizeof(want), "%ld 0x%x ", (long)SYS_read, fd);
    d = opendir(dir);
    if (!d)
        return 0;
    while ((de = readdir(d))) {
        FILE *f;

        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s/syscall", dir, de->d_name);
        f = fopen(path, "r");
        if (!f)
            continue;
        if (fgets(buf, sizeof(buf), f) && strncmp(buf, want, strlen(want)) == 0) {
            n++;
            *nice = thread_nice(pid, de->d_name);
        }
        fclose(f);
    }
    closedir(d);
    return n;
}

Test(rank_behind, store_writes_run_nicer_than_the_application, .timeout = 120)
{
    /* The writer's store writes are held in the test hook's read(): each
     * is then in a background thread, whose nice must be 10 above the
     * writer's own (19 at most). */
    struct env e;
    int hold[2], nice = 99, n = 0;
    struct writer w = {.mode = SFS_DUMP_WRITE_BEHIND};

    up(&e);
    pid_t pid = held_writer_start(&e, &w, hold);
    cr_assert_eq(writer_says(&w, 20000), 'd');
    for (int i = 0; i < 2000 && (n = threads_reading(pid, w.hold_fd, &nice)) == 0; i++)
        usleep(10000);
    cr_assert_geq(n, 1, "no store write reached the hold");
    char main_tid[16];
    int base, want;

    snprintf(main_tid, sizeof(main_tid), "%d", (int)pid);
    base = thread_nice(pid, main_tid);
    want = base + 10 > 19 ? 19 : base + 10;
    cr_assert_eq(nice, want, "a store write runs at nice %d, the writer at %d", nice, base);
    writer_close(&w);
    for (int i = 0; i < NK; i++)
        cr_assert_eq(write(hold[1], "g", 1), 1);
    cr_assert_eq(writer_says(&w, 20000), 'c');
    writer_end(&w, pid);
    close(hold[1]);
    behind_stats_wait(&e, NK, 0);
    env_down(&e);
}

Test(rank_behind, store_writes_of_a_task_nobody_looks_at_start_after_a_grace, .timeout = 120)
{
    /* A task's store writes wait for its end to be seen (a wait or a
     * done() that returns it), at most a short grace: a task nobody waits
     * for, polls or frees still reaches the store. */
    struct env e;
    struct sfs_rank_entry ent[NK];
    struct sfs_task *t;
    int st[NK];
    uint8_t *src = malloc((size_t)NK * SHARD);
    bool all = false;

    up(&e);
    cr_assert(src);
    struct sfs_rank *rk = rank_here(&e, e.dir, 0, 0);

    cr_assert_eq(sfs_rank_set_dump_mode(rk, SFS_DUMP_WRITE_BEHIND), 0);
    for (int i = 0; i < NK; i++) {
        struct sfs_key k = tu_key(i, 0);

        tu_fill(&k, src + (size_t)i * SHARD, SHARD);
        ent[i] = (struct sfs_rank_entry){k.block, 0, src + (size_t)i * SHARD};
    }
    cr_assert_eq(sfs_rank_dump(rk, ent, NK, &t), 0);
    for (int r = 0; r < 1000 && !all; r++) {
        all = true;
        for (int i = 0; i < NK; i++)
            all = all && store_has(&e, i, 0);
        if (!all)
            usleep(10000);
    }
    cr_assert(all, "the store writes of a task nobody looked at did not start");
    cr_assert_eq(sfs_rank_wait(t, 20000, st), 0);
    for (int i = 0; i < NK; i++)
        cr_assert_eq(st[i], 0);
    sfs_rank_task_free(t);
    sfs_rank_close(rk);
    behind_stats_wait(&e, NK, 0);
    free(src);
    env_down(&e);
}

/*
 * A write-behind task whose last entry to end is a failure, not a publish:
 * 15 of the 16 slots are leased here (loads this process owns), so the
 * task's first key takes the last free slot, is copied, published and held
 * back on the task, and its other keys find no slot until their deadline.
 * The held store write must still run once the task ends, and close must
 * not wait for it forever.
 */
Test(rank_behind, a_task_ended_by_a_failure_still_writes_its_held_blocks, .timeout = 120)
{
    struct env e;
    struct sfs_lease held[15];
    struct sfs_rank_entry ent[3];
    struct sfs_task *t;
    int st[3];
    uint8_t *src = malloc(3 * (size_t)SHARD);

    up(&e);
    cr_assert(src);
    for (int i = 0; i < 15; i++) {
        struct sfs_key k = tu_key(2000 + (uint64_t)i, 0);

        cr_assert_eq(sfs_cache_get(e.c, &k, 0, 0, &held[i]), SFS_OWNER);
    }
    struct sfs_rank *rk = rank_here(&e, e.dir, 0, 300); /* key timeout 300 ms */

    cr_assert_eq(sfs_rank_set_dump_mode(rk, SFS_DUMP_WRITE_BEHIND), 0);
    for (int i = 0; i < 3; i++) {
        struct sfs_key k = tu_key((uint64_t)i, 0);

        tu_fill(&k, src + (size_t)i * SHARD, SHARD);
        ent[i] = (struct sfs_rank_entry){k.block, 0, src + (size_t)i * SHARD};
    }
    cr_assert_eq(sfs_rank_dump(rk, ent, 3, &t), 0);
    cr_assert_eq(sfs_rank_wait(t, 20000, st), 0);
    cr_assert_eq(st[0], 0, "the first key: %s", strerror(-st[0]));
    cr_assert_lt(st[1], 0, "the second key found a slot");
    cr_assert_lt(st[2], 0, "the third key found a slot");
    sfs_rank_task_free(t);
    behind_stats_wait(&e, 1, 0); /* the held block's store write ran */
    cr_assert(store_has(&e, 0, 0), "the held block is not in the store");
    for (int i = 0; i < 15; i++)
        publish_owned(e.c, 2000 + (uint64_t)i, &held[i]);
    sfs_rank_close(rk);
    free(src);
    env_down(&e);
}

Test(rank_behind, failed_store_write_is_counted_and_stays_loadable, .timeout = 120)
{
    struct env e;
    struct writer w = {.mode = SFS_DUMP_WRITE_BEHIND, .hold_fd = -1};

    up(&e);
    w.sock = e.sock;
    /* Every store write fails, none reaches the store. */
    snprintf(w.spec, sizeof(w.spec), "fault:eio=1:%s", e.dir);
    pid_t pid = writer_start(&w);

    cr_assert_eq(writer_says(&w, 20000), 'd');
    behind_stats_wait(&e, 0, NK);
    for (int i = 0; i < NK; i++)
        cr_assert(store_lacks(&e, i));
    /* Resident in memory only, loadable by any rank, with the writer
     * still open and after it closed. */
    read_from_memory(&e, 0, 0);
    writer_close(&w);
    cr_assert_eq(writer_says(&w, 20000), 'c');
    writer_end(&w, pid);
    read_from_memory(&e, 0, 0);
    for (int i = 0; i < NK; i++)
        assert_resident(&e, i, 0);
    env_down(&e);
}

Test(rank_behind, next_writer_waits_and_store_ends_with_the_last_version, .timeout = 120)
{
    /* Writer A dumps behind (0xa1), held; writer B dumps the same keys
     * write-through (0xb2) meanwhile: B waits for A's lease, so A's store
     * write commits first and B's after it: cache and store end with B. */
    struct env e;
    int hold[2];
    struct writer a = {.mode = SFS_DUMP_WRITE_BEHIND, .fill = 0xa1};
    struct writer b = {.mode = SFS_DUMP_WRITE_THROUGH, .hold_fd = -1, .fill = 0xb2};

    up(&e);
    cr_assert_eq(pipe(hold), 0);
    a.sock = b.sock = e.sock;
    a.hold_fd = hold[0];
    snprintf(a.spec, sizeof(a.spec), "%s", e.dir);
    snprintf(b.spec, sizeof(b.spec), "%s", e.dir);
    pid_t pa = writer_start(&a);

    cr_assert_eq(writer_says(&a, 20000), 'd');
    pid_t pb = writer_start(&b);

    close(hold[0]);
    /* B's entries cannot end while A holds the keys. */
    cr_assert_eq(writer_says(&b, 300), '?', "the second writer did not wait");
    for (int i = 0; i < NK; i++) {
        cr_assert(store_lacks(&e, i));
        assert_resident(&e, i, 0xa1);
    }
    for (int i = 0; i < NK; i++)
        cr_assert_eq(write(hold[1], "g", 1), 1);
    cr_assert_eq(writer_says(&b, 20000), 'd');
    writer_close(&a);
    writer_close(&b);
    cr_assert_eq(writer_says(&a, 20000), 'c');
    cr_assert_eq(writer_says(&b, 20000), 'c');
    writer_end(&a, pa);
    writer_end(&b, pb);
    close(hold[1]);
    for (int i = 0; i < NK; i++) {
        cr_assert(store_has(&e, i, 0xb2), "block %d: the store does not end with B", i);
        assert_resident(&e, i, 0xb2);
    }
    behind_stats_wait(&e, NK, 0);
    env_down(&e);
}

Test(rank_behind, writer_killed_mid_write_leaves_the_shard_in_memory, .timeout = 120)
{
    struct env e;
    int hold[2];
    struct writer w = {.mode = SFS_DUMP_WRITE_BEHIND};

    up(&e);
    pid_t pid = held_writer_start(&e, &w, hold);
    cr_assert_eq(writer_says(&w, 20000), 'd');
    kill(pid, SIGKILL);
    cr_assert_eq(tu_wait(pid), 128 + SIGKILL);
    tu_wait_reaped(e.c, 1);
    close(w.up[0]);
    close(w.cmd[1]);
    close(hold[1]);
    /* The reaper dropped its leases (env_down checks); the shards stay
     * Ready, the store simply lacks them. */
    for (int i = 0; i < NK; i++) {
        cr_assert(store_lacks(&e, i));
        assert_resident(&e, i, 0);
    }
    read_from_memory(&e, 0, 0);
    env_down(&e);
}

Test(rank_behind, write_through_ends_after_the_store_has_it, .timeout = 120)
{
    /* The default: the hook holds no write-through dump, and each entry's
     * end finds its shard in the store. */
    struct env e;
    struct writer w = {.mode = SFS_DUMP_WRITE_THROUGH, .hold_fd = -1};

    up(&e);
    w.sock = e.sock;
    snprintf(w.spec, sizeof(w.spec), "%s", e.dir);
    pid_t pid = writer_start(&w);

    cr_assert_eq(writer_says(&w, 20000), 'd');
    for (int i = 0; i < NK; i++)
        cr_assert(store_has(&e, i, 0), "block %d not in the store at the entry's end", i);
    writer_close(&w);
    cr_assert_eq(writer_says(&w, 20000), 'c');
    writer_end(&w, pid);
    behind_stats_wait(&e, 0, 0);
    env_down(&e);
}

Test(rank_behind, same_key_twice_in_one_task_ends_and_agrees, .timeout = 60)
{
    /* The first entry's store write holds the slot; the second bounces and
     * waits for it: the task's held writes must not wait for the task's
     * end (which waits for the second). Both end well within the 5 s key
     * deadline, and the cache and the store agree on the version that
     * committed last. */
    struct env e;
    uint8_t *src = malloc(2 * SHARD);
    struct sfs_key k = tu_key(3, 0);
    struct sfs_rank_entry ent[2] = {{k.block, 0, src}, {k.block, 0, src + SHARD}};
    struct sfs_task *t;
    struct sfs_lease l;
    int st[2];

    up(&e);
    struct sfs_rank *rk = rank_here(&e, e.dir, 0, 5000);

    cr_assert_eq(sfs_rank_set_dump_mode(rk, SFS_DUMP_WRITE_BEHIND), 0);
    memset(src, 0x11, SHARD);
    memset(src + SHARD, 0x22, SHARD);
    cr_assert_eq(sfs_rank_dump(rk, ent, 2, &t), 0);
    cr_assert_eq(sfs_rank_wait(t, 20000, st), 0);
    cr_assert_eq(st[0], 0);
    cr_assert_eq(st[1], 0);
    sfs_rank_task_free(t);
    sfs_rank_close(rk); /* every store write ended */
    cr_assert_eq(sfs_cache_get(e.c, &k, 0, sfs_deadline_after(1000000000), &l), SFS_HIT);
    uint8_t v = *(const uint8_t *)sfs_cache_data(e.c, &l);

    cr_assert(v == 0x11 || v == 0x22);
    cr_assert(tu_all_bytes(sfs_cache_data(e.c, &l), SHARD, v));
    sfs_cache_release(e.c, &l);
    cr_assert(store_has(&e, 3, v), "the store does not hold the cache's version");
    behind_stats_wait(&e, 2, 0);
    free(src);
    env_down(&e);
}
