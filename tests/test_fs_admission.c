/* SPDX-License-Identifier: MIT */
/*
 * test_fs_admission.c - -o admission=clock|scan through a real mount.
 *
 * A cache of 32 shards; a hot set of 8 shards read twice through the mount,
 * then a scan that reads 128 other shards once. With admission=scan every hot
 * shard is still Ready afterwards (user.shardfs.state), with admission=clock
 * none is: the same reads, the option the only difference. Without the
 * option the daemon's default, scan, keeps them. A bad value is refused at
 * mount.
 */
#include "fsfixture.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary (tests/CMakeLists.txt)"
#endif

#define SHARD (64u << 10)
#define NSLOT 32u
#define HOT   (NSLOT / 4)
#define COLD  (4 * NSLOT)
#define HOT0  1u   /* hot blocks [HOT0, HOT0 + HOT) */
#define COLD0 100u /* cold blocks [COLD0, COLD0 + COLD) */

static struct {
    char store[128];
    struct fsfx fx;
} A;

static void setup(void)
{
    if (!fsfx_usable())
        cr_skip_test("no usable /dev/fuse or fusermount3");
    snprintf(A.store, sizeof(A.store), "%s", tu_path("store"));
    snprintf(A.fx.mnt, sizeof(A.fx.mnt), "%s", tu_path("mnt"));
    snprintf(A.fx.log, sizeof(A.fx.log), "%s", tu_path("log"));
    A.fx.bin = fsfx_daemon_bin(SHARDFS_BIN);
    cr_assert_eq(tu_store_write(A.store, HOT0, HOT, 1, SHARD, NULL, NULL, false), 0);
    cr_assert_eq(tu_store_write(A.store, COLD0, COLD, 1, SHARD, NULL, NULL, false), 0);
}

static void teardown(void)
{
    if (A.fx.pid)
        fsfx_stop(&A.fx, true, 10.0);
    fsfx_cleanup(&A.fx, A.store);
}

static void read_shard(uint64_t b, void *buf)
{
    struct sfs_key k = tu_key(b, 0);
    long n = fsfx_read_all(fsfx_shard_path(&A.fx, b, 0), buf, SHARD + 1);

    cr_assert_eq(n, (long)SHARD, "block %llu: %ld", (unsigned long long)b, n);
    cr_assert_eq(tu_check(&k, buf, SHARD), -1, "block %llu: wrong bytes", (unsigned long long)b);
}

static bool ready(uint64_t b)
{
    char v[64];
    ssize_t n = getxattr(fsfx_shard_path(&A.fx, b, 0), "user.shardfs.state", v, sizeof(v) - 1);

    cr_assert_geq(n, 0, "getxattr: %s", strerror(errno));
    v[n] = '\0';
    return strncmp(v, "ready", 5) == 0;
}

/* Mount with admission=mode (NULL: the default), read the hot set twice,
 * scan: hot shards left. */
static unsigned hot_left(const char *mode)
{
    char opts[160];
    void *buf = malloc(SHARD + 1);
    unsigned left = 0;

    cr_assert_not_null(buf);
    snprintf(opts, sizeof(opts), "shard_size=%u,capacity=%u,reserved=0,readahead=0,warm=0%s%s",
             SHARD, SHARD * NSLOT, mode ? ",admission=" : "", mode ? mode : "");
    cr_assert_eq(fsfx_start(&A.fx, A.store, opts, 20.0, NULL), 0, "mount with %s", opts);
    for (int pass = 0; pass < 2; pass++)
        for (uint64_t b = HOT0; b < HOT0 + HOT; b++)
            read_shard(b, buf);
    for (uint64_t b = COLD0; b < COLD0 + COLD; b++)
        read_shard(b, buf);
    for (uint64_t b = HOT0; b < HOT0 + HOT; b++)
        left += ready(b);
    free(buf);
    cr_assert_eq(fsfx_stop(&A.fx, false, 10.0), 0);
    return left;
}

TestSuite(fs_admission, .init = setup, .fini = teardown, .timeout = 120);

Test(fs_admission, scan_keeps_hot_shards_through_a_scan)
{
    unsigned left = hot_left("scan");

    cr_assert_eq(left, HOT, "admission=scan: %u of %u hot shards left after the scan", left, HOT);
}

Test(fs_admission, clock_loses_hot_shards_to_a_scan)
{
    unsigned left = hot_left("clock");

    cr_assert_eq(left, 0, "admission=clock: %u hot shards left after the scan", left);
}

Test(fs_admission, the_default_is_scan)
{
    unsetenv("SHARDFS_TEST_ADMISSION"); /* the fixture would name a mode */
    unsigned left = hot_left(NULL);

    cr_assert_eq(left, HOT, "default admission: %u of %u hot shards left after the scan", left,
                 HOT);
}

Test(fs_admission, bad_value_refused)
{
    int st = 0;

    cr_assert_eq(fsfx_start(&A.fx, A.store, "admission=lru", 20.0, &st), -ECHILD);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "status %#x", st);
    cr_assert_geq(fsfx_log_lines_with(&A.fx, "admission=lru"), 1);
}
