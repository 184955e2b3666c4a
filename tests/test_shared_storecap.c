/* SPDX-License-Identifier: MIT */
/*
 * test_shared_storecap.c - -o store_capacity with two hosts on one
 * GlusterFS store (docs/shared-store.md, docs/eviction.md): one daemon a
 * host, both with the bound.
 *
 * The volume is mounted twice (glusterfx.h: two "hosts"); each host's
 * daemon serves its own mount of the store. Both write blocks through
 * their mounts past the bound while a reader on each host checks every
 * byte it reads (whole shards or misses). Exactly one daemon says it
 * collects; the store ends within the bound. Then the collecting daemon is
 * SIGKILLed while it removes, more blocks arrive, and the other takes
 * over and keeps the bound; every block file left is whole.
 *
 * Machine-wide (a GlusterFS volume, glusterd): run on its own, as
 * test_shared_store is. Needs root, GlusterFS and /dev/fuse; skips
 * without them.
 */
#include "fsfixture.h"
#include "glusterfx.h"
#include "testutil.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD (64u << 10)
#define CAP   (32ull * SHARD)
#define OPTS  "hugepages=off,capacity=4M,shard_size=64K,readahead=0,store_capacity=2M"

struct host {
    struct fsfx fx;
    char store[300];
};

static struct host H[2];

/* Store block b (one shard, tu_fill's bytes) through host h's mount: 0 or
 * -errno (a write refused while the other host holds the block is not the
 * test's subject: the caller counts it). */
static int write_mount(int h, uint64_t b)
{
    static _Thread_local uint8_t buf[SHARD];
    struct sfs_key k = tu_key(b, 0);
    int fd = open(fsfx_shard_path(&H[h].fx, b, 0), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int r = 0;

    if (fd < 0)
        return -errno;
    tu_fill(&k, buf, SHARD);
    if (write(fd, buf, SHARD) != (ssize_t)SHARD)
        r = -errno;
    if (close(fd) < 0 && r == 0)
        r = -errno;
    return r;
}

/* The block files' bytes on disk through host 0's mount of the volume;
 * *torn counts files that are not one whole block. */
static uint64_t store_bytes(unsigned *torn)
{
    char dir[320];
    struct dirent *de;
    uint64_t sum = 0;
    DIR *d;

    snprintf(dir, sizeof(dir), "%s/data", H[0].store);
    d = opendir(dir);
    if (!d)
        return 0;
    while ((de = readdir(d)) != NULL) {
        struct stat st;

        if (strlen(de->d_name) != SFS_BLOCK_HEX_LEN || fstatat(dirfd(d), de->d_name, &st, 0) < 0)
            continue;
        sum += (uint64_t)st.st_blocks * 512;
        if (torn && st.st_size != (off_t)SHARD)
            (*torn)++;
    }
    closedir(d);
    return sum;
}

struct reader {
    pthread_t t;
    int h;
    _Atomic bool *stop;
    unsigned whole, misses, bad;
    long bad_n;
};

static void *reader_main(void *arg)
{
    struct reader *r = arg;
    uint8_t *buf = malloc(SHARD + 1);
    uint64_t b = 1;

    while (buf && !atomic_load(r->stop)) {
        struct sfs_key k = tu_key(b, 0);
        long n = fsfx_read_all(fsfx_shard_path(&H[r->h].fx, b, 0), buf, SHARD + 1);

        if (n == (long)SHARD && tu_check(&k, buf, SHARD) == -1)
            r->whole++;
        else if (n == -ENOENT)
            r->misses++;
        else if (r->bad++ == 0)
            r->bad_n = n;
        b = b % 120 + 1;
    }
    free(buf);
    return NULL;
}

/* 0 or 1: the host whose daemon says it collects, when exactly one does
 * within 60 s (skip: a host whose daemon is gone); -1 otherwise. */
static int the_collector(bool skip[2])
{
    double t0 = fsfx_now_s();

    while (fsfx_now_s() - t0 < 60.0) {
        long long c[2];

        for (int h = 0; h < 2; h++)
            c[h] = skip[h] ? 0 : fsfx_stat(&H[h].fx, "shardfs_store_collector");
        if (c[0] + c[1] == 1)
            return c[0] == 1 ? 0 : 1;
        fsfx_sleep_ms(100);
    }
    return -1;
}

/* Wait up to 60 s for the store to hold at most the bound. */
static bool within_bound(void)
{
    double t0 = fsfx_now_s();

    while (fsfx_now_s() - t0 < 60.0) {
        if (store_bytes(NULL) <= CAP)
            return true;
        fsfx_sleep_ms(100);
    }
    return false;
}

static int run(struct glfx *g)
{
    _Atomic bool stop = false;
    struct reader rd[2] = {{.h = 0, .stop = &stop}, {.h = 1, .stop = &stop}};
    bool gone[2] = {false, false};
    unsigned torn = 0, refused = 0;
    int who, rc = 0, st;

    for (int h = 0; h < 2; h++) {
        int r;

        snprintf(H[h].store, sizeof(H[h].store), "%s/store", glfx_mount(g, h));
        snprintf(H[h].fx.mnt, sizeof(H[h].fx.mnt), "%s", tu_path(h ? "mnt1" : "mnt0"));
        snprintf(H[h].fx.sock, sizeof(H[h].fx.sock), "%s", tu_path(h ? "sock1" : "sock0"));
        snprintf(H[h].fx.log, sizeof(H[h].fx.log), "%s", tu_path(h ? "log1" : "log0"));
        H[h].fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
        if (h == 0)
            mkdir(H[0].store, 0755);
        else
            fsfx_sleep_ms(1500); /* host b's lookup cache */
        r = fsfx_start(&H[h].fx, H[h].store, OPTS, 30.0, &st);
        if (r < 0) {
            fprintf(stderr, "host %d: shardfs did not mount (%d, status %#x), see %s\n", h, r, st,
                    H[h].fx.log);
            return 1;
        }
    }
    who = the_collector(gone);
    if (who < 0) {
        fprintf(stderr, "not exactly one collector\n");
        return 1;
    }
    for (int i = 0; i < 2; i++)
        pthread_create(&rd[i].t, NULL, reader_main, &rd[i]);
    /* Both hosts fill the store, each its own blocks. */
    for (uint64_t b = 1; b <= 120; b++)
        refused += write_mount((int)(b & 1), b) != 0;
    if (!within_bound()) {
        fprintf(stderr, "the store is above its bound (%llu bytes)\n",
                (unsigned long long)store_bytes(NULL));
        rc = 1;
    }
    if (fsfx_stat(&H[1 - who].fx, "shardfs_store_evicted_blocks_total") != 0) {
        fprintf(stderr, "host %d removed blocks while standing by\n", 1 - who);
        rc = 1;
    }
    /* More blocks, written behind both daemons; the collector is killed as
     * soon as it starts removing them. */
    {
        long long before = fsfx_stat(&H[who].fx, "shardfs_store_evicted_blocks_total");
        double t0 = fsfx_now_s();

        tu_store_write(H[0].store, 1000, 60, 1, SHARD, NULL, NULL, false);
        while (fsfx_stat(&H[who].fx, "shardfs_store_evicted_blocks_total") == before &&
               fsfx_now_s() - t0 < 30.0)
            ;
        kill(H[who].fx.pid, SIGKILL);
        waitpid(H[who].fx.pid, &st, 0);
        H[who].fx.pid = 0;
        fsfx_sh("fusermount3 -uz %s 2>/dev/null", H[who].fx.mnt);
        gone[who] = true;
    }
    if (the_collector(gone) != 1 - who) {
        fprintf(stderr, "host %d did not take over\n", 1 - who);
        rc = 1;
    }
    if (!within_bound()) {
        fprintf(stderr, "after the takeover, the store is above its bound\n");
        rc = 1;
    }
    atomic_store(&stop, true);
    for (int i = 0; i < 2; i++) {
        pthread_join(rd[i].t, NULL);
        if (rd[i].bad) {
            fprintf(stderr, "host %d's reader: %u reads neither whole nor a miss (first %ld)\n", i,
                    rd[i].bad, rd[i].bad_n);
            rc = 1;
        }
    }
    store_bytes(&torn);
    if (torn) {
        fprintf(stderr, "%u block files are not whole\n", torn);
        rc = 1;
    }
    fprintf(stderr, "store_capacity on GlusterFS: collector host %d, %u writes refused\n", who,
            refused);
    return rc;
}

TestSuite(shared_storecap);

Test(shared_storecap, gluster_two_hosts_one_collector, .timeout = 400)
{
    struct glfx g;
    char why[300] = "";
    int up, rc = -1;

    if (geteuid() != 0 || !fsfx_usable())
        cr_skip_test("needs root and FUSE");
    cr_assert_eq(setenv("SHARDFS_TEST_STORE_PERIOD_MS", "500", 1), 0);
    up = glfx_up(&g, 1, why, sizeof(why));
    if (up == -1) {
        glfx_down(&g);
        cr_skip_test("GlusterFS: %s", why);
    }
    if (up == 0)
        rc = run(&g);
    if (rc != 0) {
        glfx_report(&g);
        glfx_kill_clients(&g);
    }
    for (int h = 0; h < 2; h++) {
        if (!H[h].fx.mnt[0])
            continue;
        fsfx_stop(&H[h].fx, true, 10.0);
        fsfx_cleanup(&H[h].fx, NULL);
        unlink(H[h].fx.sock);
    }
    glfx_down(&g);
    cr_assert_eq(up, 0, "GlusterFS: %s", why);
    cr_assert_eq(rc, 0);
}
