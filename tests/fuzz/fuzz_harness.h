/* SPDX-License-Identifier: MIT */
/*
 * fuzz_harness.h - what every libFuzzer target here shares: the two entry
 * points libFuzzer calls, a failed property (fz_fail: one line on stderr,
 * then abort, so libFuzzer keeps the input as a reproducer), the seeds a
 * harness writes itself (fuzz_seeds.h), and the prologue pieces the
 * targets that run a real cache repeat: a private directory, a cache made
 * or the run fails, and the check that an input leaked no descriptor.
 * Header-only (static inline): include it in every file of a target that
 * fails a property. (fuzz_close.h, the interposed close(), goes in exactly
 * one file of a target.)
 */
#ifndef SHARDFS_FUZZ_HARNESS_H
#define SHARDFS_FUZZ_HARNESS_H

#include "fuzz_seeds.h"

#include <shardfs/cache.h>

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static inline __attribute__((noreturn, format(printf, 1, 2))) void fz_fail(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    fprintf(stderr, "fuzz: property failed: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

/* A fresh private directory, /tmp/shardfs-fuzz-XXXXXX, into dir. */
static inline void fz_tmpdir(char *dir, size_t len)
{
    snprintf(dir, len, "/tmp/shardfs-fuzz-XXXXXX");
    if (!mkdtemp(dir))
        fz_fail("mkdtemp: %s", strerror(errno));
}

static inline struct sfs_cache *fz_cache_create(const struct sfs_cache_config *cfg)
{
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(cfg, &err);

    if (!c)
        fz_fail("sfs_cache_create: %d", err);
    return c;
}

/* The lowest free descriptor: compared before and after each input (not
 * across inputs: libFuzzer's symbolizer opens pipes of its own between
 * them). */
static inline int fz_lowest_free_fd(void)
{
    int probe = open("/dev/null", O_RDONLY | O_CLOEXEC);

    if (probe < 0)
        fz_fail("open /dev/null: %s", strerror(errno));
    close(probe);
    return probe;
}

/* The input leaked no descriptor: the lowest free one is `before` again.
 * Else the descriptors from there on are listed and the property fails. */
static inline void fz_check_no_fd_leak(int before)
{
    int after = fz_lowest_free_fd();

    if (after == before)
        return;
    for (int fd = before; fd < before + 32; fd++) {
        char link[64], what[256];
        ssize_t n;

        snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
        n = readlink(link, what, sizeof(what) - 1);
        if (n > 0) {
            what[n] = '\0';
            fprintf(stderr, "fuzz: descriptor %d is %s\n", fd, what);
        }
    }
    fz_fail("file descriptors leaked: the lowest free one is %d, was %d", after, before);
}

#endif /* SHARDFS_FUZZ_HARNESS_H */
