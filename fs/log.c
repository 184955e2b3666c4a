/* SPDX-License-Identifier: MIT */
/*
 * log.c - the daemon's log: one line to stderr in the foreground, to syslog
 * once detached.
 *
 * The bottom room of fs/: every other room may call it, it calls none of
 * them. The core and backend libraries are silent by default and log through
 * the callback main() installs (fs_log_msg); the daemon's own rooms use
 * fs_log().
 */
#include "fs_i.h"

#include <stdarg.h>
#include <stdio.h>
#include <syslog.h>

/* Set once, by the daemonizing child, before any thread but main logs. */
static bool log_syslog;

void fs_log_msg(int level, const char *msg, void *arg)
{
    (void)arg;
    if (log_syslog)
        syslog(level, "%s", msg);
    else
        fprintf(stderr, "shardfs: %s\n", msg);
}

void fs_log(int level, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fs_log_msg(level, msg, NULL);
}

void fs_log_to_syslog(void)
{
    log_syslog = true;
}
