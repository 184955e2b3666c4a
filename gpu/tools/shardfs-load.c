/* SPDX-License-Identifier: MIT */
/*
 * shardfs-load - load a task of shards through N rank processes, the way a
 * tensor-parallel engine does, and report who loaded what.
 *
 * Each rank is a forked process that links libshardfs-rank, attaches to a
 * running shardfs (by its mount point or socket), and loads the same task
 * (one shard of each named block) into host buffers with the rotated
 * LoadQueue. With --verify, every byte is compared with the store's block
 * file. It prints, per rank, how many keys it loaded from the backend as
 * owner, how many it found ready and how many it waited for; the owner loads
 * add up to the number of keys missing from the cache, however many ranks
 * there are.
 *
 * Useful to warm a cache before traffic, and to see owner/waiter arbitration
 * at work.
 *
 * On a terminal (standard error a tty) the parent draws a progress bar of
 * the shards every rank has finished, redrawn ten times a second on one
 * line: each rank publishes its count in a shared anonymous mapping as its
 * task goes (its copies and failures so far), and clears the bar's line
 * before it prints its own. Piped, nothing but the ranks' lines.
 */
#include <shardfs/backend.h>
#include <shardfs/rank.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_BLOCKS  4096
#define TICK_MS     100 /* the bar's redraw, and a rank's look at its count */
#define WAIT_MS     60000
#define BAR_WIDTH   40
#define DONE_STRIDE 8 /* one cache line of uint64_t per rank's count */

struct opts {
    const char *mount;
    const char *socket;
    const char *backend;
    int ranks;
    uint32_t shard;
    bool verify;
    bool natural;
    bool progress;  /* standard error is a terminal: draw the bar */
    uint64_t *done; /* shared: done[r * DONE_STRIDE], rank r's shards finished */
    size_t nblocks;
    struct sfs_block_id blocks[MAX_BLOCKS];
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: shardfs-load (-m MOUNT | -S SOCKET) -b BACKEND_DIR [options] BLOCK_ID...\n"
            "Load shard N of each block through R rank processes sharing one cache.\n\n"
            "  -m, --mount MOUNT      a shardfs mount point (its attach socket is read from it)\n"
            "  -S, --socket PATH      the attach socket instead\n"
            "  -b, --backend SPEC     the store the ranks load misses from (as given to shardfs)\n"
            "  -r, --ranks R          rank processes (default 2)\n"
            "  -n, --shard N          shard index to load from each block (default 0)\n"
            "  -V, --verify           compare every byte with the store's block file\n"
            "      --natural          walk tasks in natural order instead of RearrangeIndex\n"
            "  -h, --help\n"
            "BLOCK_ID is 32 hex characters; '-' reads ids from standard input, one a line.\n");
}

static int add_block(struct opts *o, const char *hex)
{
    size_t len = strcspn(hex, "\r\n");

    if (o->nblocks >= MAX_BLOCKS) {
        fprintf(stderr, "shardfs-load: at most %d blocks\n", MAX_BLOCKS);
        return -1;
    }
    if (sfs_block_from_hex(hex, len, &o->blocks[o->nblocks]) < 0) {
        fprintf(stderr, "shardfs-load: not a block id (32 hex characters): %.*s\n", (int)len, hex);
        return -1;
    }
    o->nblocks++;
    return 0;
}

/* Read the expected bytes from the store through a backend of our own. */
static int verify(const struct opts *o, struct sfs_rank *rank, uint8_t *buf, uint64_t ss)
{
    struct sfs_backend *be = sfs_rank_backend(rank);
    uint8_t *want = malloc(ss);
    int bad = 0;

    if (!be || !want) {
        free(want);
        return -1;
    }
    for (size_t i = 0; i < o->nblocks; i++) {
        struct sfs_key k = {.block = o->blocks[i], .shard = o->shard};

        if (sfs_backend_load_sync(be, &k, want, (uint32_t)ss) != (int)ss ||
            memcmp(want, buf + i * ss, ss) != 0)
            bad++;
    }
    free(want);
    return bad;
}

/* Before a rank writes a line to f (a terminal while the bar is drawn):
 * clear the bar's line, which the parent redraws below. */
static void clear_bar(const struct opts *o, FILE *f)
{
    if (o->progress && isatty(fileno(f)))
        fputs("\r\033[K", f);
}

/* The entries of this rank's task that are finished: copied or failed. */
static uint64_t finished(struct sfs_rank *rank)
{
    struct sfs_rank_stats st;

    sfs_rank_stats(rank, &st);
    return st.copies + st.failed;
}

/* Wait for the task (at most WAIT_MS), publishing the count finished so far
 * (beyond base, the count before it was queued) for the parent's bar each
 * TICK_MS. */
static int wait_task(const struct opts *o, struct sfs_rank *rank, int r, struct sfs_task *task,
                     uint64_t base, int *status)
{
    uint64_t n;
    int err;

    if (!o->progress)
        return sfs_rank_wait(task, WAIT_MS, status);
    for (int waited = 0;; waited += TICK_MS) {
        err = sfs_rank_wait(task, TICK_MS, status);
        if (err != -ETIMEDOUT || waited + TICK_MS >= WAIT_MS)
            break;
        n = finished(rank) - base;
        /* Relaxed: a count for the bar, read by the parent alone. */
        __atomic_store_n(&o->done[(size_t)r * DONE_STRIDE], n < o->nblocks ? n : o->nblocks,
                         __ATOMIC_RELAXED);
    }
    if (err == 0)
        __atomic_store_n(&o->done[(size_t)r * DONE_STRIDE], (uint64_t)o->nblocks, __ATOMIC_RELAXED);
    return err;
}

static int run_rank(const struct opts *o, int r)
{
    struct sfs_rank_config cfg;
    struct sfs_rank_stats st;
    struct sfs_rank *rank;
    struct sfs_task *task;
    int err = 0, failed = 0, bad = 0;
    uint64_t base;

    /* A line, cleared bar and all, in one write: the parent's bar never
     * lands inside it. */
    if (o->progress)
        setvbuf(stderr, NULL, _IOLBF, BUFSIZ);
    sfs_rank_config_init(&cfg);
    cfg.mount_point = o->mount;
    cfg.socket_path = o->mount ? NULL : o->socket;
    cfg.device_id = r;
    cfg.local_rank_size = o->ranks;
    cfg.backend = o->backend;
    cfg.rotate = !o->natural;
    cfg.copier = SFS_COPIER_HOST;
    rank = sfs_rank_open(&cfg, &err);
    if (!rank) {
        clear_bar(o, stderr);
        fprintf(stderr, "rank %d: cannot attach: %s\n", r, strerror(-err));
        return 2;
    }
    uint64_t ss = sfs_rank_shard_size(rank);
    uint8_t *buf = malloc(ss * o->nblocks);
    struct sfs_rank_entry *e = calloc(o->nblocks, sizeof(*e));
    int *status = calloc(o->nblocks, sizeof(*status));
    if (!buf || !e || !status) {
        fprintf(stderr, "rank %d: out of memory\n", r);
        return 2;
    }
    for (size_t i = 0; i < o->nblocks; i++) {
        e[i].block = o->blocks[i];
        e[i].shard = o->shard;
        e[i].addr = buf + i * ss;
    }
    base = finished(rank);
    err = sfs_rank_load(rank, e, o->nblocks, &task);
    if (err == 0) {
        err = wait_task(o, rank, r, task, base, status);
        sfs_rank_task_free(task);
    }
    if (err < 0) {
        clear_bar(o, stderr);
        fprintf(stderr, "rank %d: load: %s\n", r, strerror(-err));
        return 2;
    }
    for (size_t i = 0; i < o->nblocks; i++) {
        if (status[i] < 0) {
            char hex[SFS_BLOCK_HEX_LEN + 1];

            sfs_block_to_hex(&o->blocks[i], hex);
            clear_bar(o, stderr);
            fprintf(stderr, "rank %d: %s/shard/%u: %s\n", r, hex, o->shard, strerror(-status[i]));
            failed++;
        }
    }
    if (o->verify)
        bad = verify(o, rank, buf, ss);
    sfs_rank_stats(rank, &st);
    clear_bar(o, stdout);
    printf("rank %d: %zu shards, %llu loaded from the backend as owner, %llu ready, %llu waited, "
           "%d failed%s\n",
           r, o->nblocks, (unsigned long long)st.owner_loads, (unsigned long long)st.hits,
           (unsigned long long)st.waits, failed,
           o->verify ? (bad ? ", BYTES WRONG" : ", bytes verified") : "");
    fflush(stdout);
    sfs_rank_close(rank);
    free(buf);
    free(e);
    free(status);
    return failed || bad ? 1 : 0;
}

/* The bar, on standard error's line: one write, so a rank's line never
 * lands inside it. At most 80 columns. */
static void draw_bar(const struct opts *o, bool last)
{
    uint64_t total = (uint64_t)o->nblocks * (uint64_t)o->ranks, done = 0;
    char line[160], bar[BAR_WIDTH + 1];
    unsigned pct, fill;
    int n;

    for (int r = 0; r < o->ranks; r++)
        done += __atomic_load_n(&o->done[(size_t)r * DONE_STRIDE], __ATOMIC_RELAXED);
    pct = total ? (unsigned)(done * 100 / total) : 100;
    fill = total ? (unsigned)(done * BAR_WIDTH / total) : BAR_WIDTH;
    memset(bar, '#', fill);
    memset(bar + fill, '.', BAR_WIDTH - fill);
    bar[BAR_WIDTH] = '\0';
    n = snprintf(line, sizeof(line), "\r\033[K[%s] %3u%% %llu/%llu shards%s", bar, pct,
                 (unsigned long long)done, (unsigned long long)total, last ? "\n" : "");
    if (write(STDERR_FILENO, line, (size_t)n) < 0)
        return; /* the terminal went away: the load goes on without its bar */
}

/* Reap the ranks: 0 when each exited 0. With the bar, redraw it each
 * TICK_MS meanwhile, and a last time when they are all gone. */
static int reap(const struct opts *o, pid_t *pids)
{
    int left = o->ranks, rc = 0;

    while (left > 0) {
        for (int r = 0; r < o->ranks; r++) {
            int st;
            pid_t p;

            if (pids[r] <= 0)
                continue;
            p = waitpid(pids[r], &st, o->progress ? WNOHANG : 0);
            if (p == 0)
                continue;
            if (p < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
                rc = 1;
            pids[r] = 0;
            left--;
        }
        if (left > 0 && o->progress) {
            struct timespec ts = {0, TICK_MS * 1000000L};

            draw_bar(o, false);
            nanosleep(&ts, NULL);
        }
    }
    if (o->progress)
        draw_bar(o, true);
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"mount", required_argument, NULL, 'm'},
                                       {"socket", required_argument, NULL, 'S'},
                                       {"backend", required_argument, NULL, 'b'},
                                       {"ranks", required_argument, NULL, 'r'},
                                       {"shard", required_argument, NULL, 'n'},
                                       {"verify", no_argument, NULL, 'V'},
                                       {"natural", no_argument, NULL, 'N'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
    static struct opts o = {.ranks = 2};
    int c, rc = 0;

    while ((c = getopt_long(argc, argv, "m:S:b:r:n:Vh", lo, NULL)) != -1) {
        switch (c) {
        case 'm':
            o.mount = optarg;
            break;
        case 'S':
            o.socket = optarg;
            break;
        case 'b':
            o.backend = optarg;
            break;
        case 'r':
            o.ranks = atoi(optarg);
            break;
        case 'n':
            o.shard = (uint32_t)strtoul(optarg, NULL, 10);
            break;
        case 'V':
            o.verify = true;
            break;
        case 'N':
            o.natural = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 1;
        }
    }
    if ((!o.mount == !o.socket) || !o.backend || o.ranks < 1 || o.ranks > 64 || optind >= argc) {
        usage(stderr);
        return 1;
    }
    for (int i = optind; i < argc; i++) {
        if (strcmp(argv[i], "-") == 0) {
            char line[128];

            while (fgets(line, sizeof(line), stdin))
                if (line[0] != '\n' && add_block(&o, line) < 0)
                    return 1;
        } else if (add_block(&o, argv[i]) < 0) {
            return 1;
        }
    }
    pid_t *pids = calloc((size_t)o.ranks, sizeof(*pids));
    if (!pids)
        return 1;
    o.progress = isatty(STDERR_FILENO);
    if (o.progress) {
        size_t len = (size_t)o.ranks * DONE_STRIDE * sizeof(uint64_t);

        o.done = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (o.done == MAP_FAILED) {
            o.done = NULL;
            o.progress = false;
        }
    }
    for (int r = 0; r < o.ranks; r++) {
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(run_rank(&o, r));
        if (pids[r] < 0) {
            perror("shardfs-load: fork");
            return 1;
        }
    }
    rc = reap(&o, pids);
    free(pids);
    return rc;
}
