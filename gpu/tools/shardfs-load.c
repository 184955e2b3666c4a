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
 */
#include <shardfs/backend.h>
#include <shardfs/rank.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_BLOCKS 4096

struct opts {
    const char *mount;
    const char *socket;
    const char *backend;
    int ranks;
    uint32_t shard;
    bool verify;
    bool natural;
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

static int run_rank(const struct opts *o, int r)
{
    struct sfs_rank_config cfg;
    struct sfs_rank_stats st;
    struct sfs_rank *rank;
    struct sfs_task *task;
    int err = 0, failed = 0, bad = 0;

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
    err = sfs_rank_load(rank, e, o->nblocks, &task);
    if (err == 0) {
        err = sfs_rank_wait(task, 60000, status);
        sfs_rank_task_free(task);
    }
    if (err < 0) {
        fprintf(stderr, "rank %d: load: %s\n", r, strerror(-err));
        return 2;
    }
    for (size_t i = 0; i < o->nblocks; i++) {
        if (status[i] < 0) {
            char hex[SFS_BLOCK_HEX_LEN + 1];

            sfs_block_to_hex(&o->blocks[i], hex);
            fprintf(stderr, "rank %d: %s/shard/%u: %s\n", r, hex, o->shard, strerror(-status[i]));
            failed++;
        }
    }
    if (o->verify)
        bad = verify(o, rank, buf, ss);
    sfs_rank_stats(rank, &st);
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
    for (int r = 0; r < o.ranks; r++) {
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(run_rank(&o, r));
        if (pids[r] < 0) {
            perror("shardfs-load: fork");
            return 1;
        }
    }
    for (int r = 0; r < o.ranks; r++) {
        int st;

        if (waitpid(pids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            rc = 1;
    }
    free(pids);
    return rc;
}
