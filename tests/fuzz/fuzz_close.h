/* SPDX-License-Identifier: MIT */
/*
 * fuzz_close.h - close(), interposed: closing a descriptor that is not open
 * fails the run.
 *
 * A double close is silent in one thread and a bug in many: the second close
 * hits whatever another thread opened in between (in a rank, a copier's file;
 * in the daemon, a client's socket). The product code linked into a target
 * binds to this close() (an executable's definition takes precedence over
 * libc's), so a close of a number that is not open, anywhere in the process,
 * is reported with its stack. close(-1) is not a double close and passes.
 * Include it in exactly one file of a target.
 */
#ifndef SHARDFS_FUZZ_CLOSE_H
#define SHARDFS_FUZZ_CLOSE_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

int close(int fd)
{
    long r = syscall(SYS_close, fd); /* -1 and errno, as close() */

    if (r < 0 && errno == EBADF && fd >= 0) {
        fprintf(stderr,
                "fuzz: property failed: descriptor %d closed, but it was not open "
                "(a double close)\n",
                fd);
        abort();
    }
    return (int)r;
}

#endif /* SHARDFS_FUZZ_CLOSE_H */
