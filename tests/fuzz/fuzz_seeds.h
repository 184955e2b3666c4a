/* SPDX-License-Identifier: MIT */
/*
 * fuzz_seeds.h - seed inputs a harness writes itself.
 *
 * Some seeds depend on the build (the layout format word, a control plane's
 * header): they cannot be checked in. A harness writes them from
 * LLVMFuzzerInitialize, which libFuzzer calls before it reads the corpus,
 * into the directory named by SHARDFS_FUZZ_SEEDS (tests/fuzz/run.sh sets it
 * to the target's working corpus). Without the variable nothing is written.
 */
#ifndef SHARDFS_FUZZ_SEEDS_H
#define SHARDFS_FUZZ_SEEDS_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static inline void fz_seed(const char *name, const void *data, size_t len)
{
    const char *dir = getenv("SHARDFS_FUZZ_SEEDS");
    char path[4096];
    int fd;

    if (!dir || !*dir)
        return;
    mkdir(dir, 0755);
    snprintf(path, sizeof(path), "%s/seed-%s", dir, name);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    if (write(fd, data, len) != (ssize_t)len)
        fprintf(stderr, "fuzz: seed %s not written\n", path);
    close(fd);
}

#endif /* SHARDFS_FUZZ_SEEDS_H */
