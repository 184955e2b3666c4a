/* SPDX-License-Identifier: MIT */
/*
 * consumer.c - an out-of-tree program built against the installed shardfs
 * packages (tests/install/run.sh compiles it twice: with pkg-config
 * shardfs-rank, and as a CMake project through find_package(shardfs)).
 *
 *   consumer MOUNTPOINT BACKEND_DIR BLOCK_HEX NSHARDS
 *
 * Attaches to the daemon serving MOUNTPOINT (through the socket its
 * user.shardfs.socket xattr names), loads shards 0..NSHARDS-1 of BLOCK_HEX
 * into host memory with one task and checks every byte against the pattern
 * run.sh wrote into the posix store: byte i of shard n is (7 i + 13 n + 1)
 * mod 256. Prints one line and exits 0 when all match, 1 otherwise.
 * NSHARDS is bounded by 64 (the test uses a few).
 *
 * It includes every installed header, so that each one is shown to compile
 * in a program of its own with only the installed include directory.
 */
#include <shardfs/backend.h>
#include <shardfs/cache.h>
#include <shardfs/fault.h>
#include <shardfs/rank.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SHARDS 64

static unsigned char expected(size_t i, unsigned n)
{
    return (unsigned char)((7u * i + 13u * n + 1u) & 0xffu);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s MOUNTPOINT BACKEND_DIR BLOCK_HEX NSHARDS\n", argv[0]);
        return 2;
    }
    unsigned nshards = (unsigned)strtoul(argv[4], NULL, 10);
    if (nshards == 0 || nshards > MAX_SHARDS) {
        fprintf(stderr, "consumer: NSHARDS must be 1..%d\n", MAX_SHARDS);
        return 2;
    }
    struct sfs_block_id block;
    if (sfs_block_from_hex(argv[3], strlen(argv[3]), &block) != 0) {
        fprintf(stderr, "consumer: bad block id %s\n", argv[3]);
        return 2;
    }

    struct sfs_rank_config cfg;
    sfs_rank_config_init(&cfg);
    cfg.mount_point = argv[1];
    cfg.backend = argv[2];
    cfg.copier = SFS_COPIER_HOST;
    int err = 0;
    struct sfs_rank *rank = sfs_rank_open(&cfg, &err);
    if (!rank) {
        fprintf(stderr, "consumer: sfs_rank_open: %s\n", strerror(-err));
        return 1;
    }
    size_t ss = (size_t)sfs_rank_shard_size(rank);
    unsigned char *buf = malloc(ss * nshards);
    struct sfs_rank_entry e[MAX_SHARDS];
    int status[MAX_SHARDS];
    if (!buf) {
        sfs_rank_close(rank);
        return 1;
    }
    memset(buf, 0, ss * nshards);
    for (unsigned n = 0; n < nshards; n++)
        e[n] = (struct sfs_rank_entry){ .block = block, .shard = n, .addr = buf + n * ss };

    struct sfs_task *task = NULL;
    int rc = sfs_rank_load(rank, e, nshards, &task);
    if (rc == 0)
        rc = sfs_rank_wait(task, 30000, status);
    int bad = 0;
    for (unsigned n = 0; rc == 0 && n < nshards; n++) {
        if (status[n] != 0) {
            fprintf(stderr, "consumer: shard %u: %s\n", n, strerror(-status[n]));
            bad++;
            continue;
        }
        for (size_t i = 0; i < ss; i++) {
            if (buf[n * ss + i] != expected(i, n)) {
                fprintf(stderr, "consumer: shard %u byte %zu: %u, expected %u\n", n, i,
                        buf[n * ss + i], expected(i, n));
                bad++;
                break;
            }
        }
    }
    if (rc != 0)
        fprintf(stderr, "consumer: load: %s\n", strerror(-rc));
    sfs_rank_task_free(task);
    sfs_rank_close(rank);
    free(buf);
    if (rc != 0 || bad)
        return 1;
    printf("consumer: %u shards of %zu bytes verified\n", nshards, ss);
    return 0;
}
