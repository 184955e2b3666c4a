/* SPDX-License-Identifier: MIT */
/*
 * main.c - the shardfs daemon: setup and lifetime.
 *
 *   shardfs [options] BACKEND_DIR MOUNTPOINT
 *
 * The daemon creates the CacheBuffer, opens the backend below it, serves the
 * rank attach socket, mounts the tree of ops.c and runs the multi-threaded
 * FUSE loop until it is unmounted (fusermount3 -u, umount) or told to stop
 * (SIGTERM, SIGINT, SIGHUP). Then it unmounts, waits for loads in flight,
 * removes the socket and exits 0.
 *
 * Key idea: everything that can fail is checked before the parent returns.
 * Without -f the process forks first and the parent waits on a pipe until the
 * child has mounted (status 0) or failed (status 1, its one-line reason
 * already on stderr): `shardfs ... && use-it` is safe, and the threads of the
 * cache and the backend are only ever started in the process that keeps them.
 *
 * The command line is options.c's, the threads that run and stop the session
 * are session.c's; main() sets up in order and unwinds through labels named
 * for what they undo.
 */
#include "fs_i.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <syslog.h>
#include <unistd.h>

#ifndef SHARDFS_VERSION
#define SHARDFS_VERSION "0.1.0"
#endif

/* The test build only: SHARDFS_TEST_START_FAIL=STEP fails that step of
 * the start with EAGAIN, as a thread that cannot start or a session libfuse
 * cannot make would, so that the unwinding after each step is tested. STEP
 * is one of: session, signals, mount, reaper, settler, pagecache,
 * revalidate, storecap, loop. The steps' own functions are not called then
 * (nothing of theirs is left to undo, as after their own failures). */
#ifndef SFS_TEST_HOOKS
#define start_fault(step) 0
#else
static int start_fault(const char *step)
{
    const char *e = getenv("SHARDFS_TEST_START_FAIL");

    return e && strcmp(e, step) == 0 ? -EAGAIN : 0;
}
#endif

static void touch_hook(const struct sfs_block_id *blocks, size_t n, void *arg)
{
    sfs_backend_touch(arg, blocks, n);
}

/* ---------------------------------------------------------------------------
 * main
 */

/* With the peer tier, SIGHUP re-reads its members file (design.md, section 11)
 * instead of ending the session: the stop signals' thread takes it, and the
 * handler only raises the backend's flag. */
static struct sfs_backend *peer_hup_be;

static void peer_hup(int sig)
{
    (void)sig;
    sfs_backend_peer_reload(peer_hup_be);
}

static int peer_hup_start(struct sfs_backend *be)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = peer_hup;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    peer_hup_be = be;
    return sigaction(SIGHUP, &sa, NULL);
}

int main(int argc, char *argv[])
{
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    struct fuse_cmdline_opts co;
    struct fs_options o;
    struct fs_config cfg;
    /* Static: a backend may still complete an abandoned load while the
     * process exits (fs_loads_stop). */
    static struct fs fs;
    struct sfs_backend_params bp;
    struct fuse_session *se;
    struct fs_session_loop loop;
    struct fs_reaper reaper;
    sigset_t stopsigs;
    char errbuf[256] = "";
    int ret = 1, err = 0, ready_fd = -1;
    unsigned abandoned = 0;
    bool reval_stuck = false; /* a revalidation sweep or the collector still in the backend */
    bool cap_stuck = false;   /* the collector still in the backend */

    memset(&co, 0, sizeof(co));
    memset(&fs, 0, sizeof(fs));
    if (fs_options_parse(&args, &o) != 0)
        goto out_args;
    if (fuse_parse_cmdline(&args, &co) != 0)
        goto out_args; /* libfuse printed the reason */
    if (co.show_help) {
        fs_usage(argv[0]);
        printf("FUSE options:\n");
        fuse_cmdline_help();
        fuse_lowlevel_help();
        ret = 0;
        goto out_args;
    }
    if (co.show_version) {
        printf("shardfs version %s\n", SHARDFS_VERSION);
        fuse_lowlevel_version();
        ret = 0;
        goto out_args;
    }
    if (!o.backend || !co.mountpoint) {
        fprintf(stderr, "shardfs: missing %s (usage: %s [options] BACKEND_DIR MOUNTPOINT)\n",
                o.backend ? "MOUNTPOINT" : "BACKEND_DIR", argv[0]);
        goto out_args;
    }
    if (fs_options_check(&o, co.mountpoint, &cfg) < 0 || fs_options_mount_args(&o, &args) < 0)
        goto out_args;
    if (cfg.page_cache && co.singlethread) {
        /* An invalidation may wait for a read only another worker answers. */
        fprintf(stderr, "shardfs: page_cache=%s: needs the multi-threaded loop (not -s)\n",
                o.page_cache);
        goto out_args;
    }

    if (!co.foreground)
        ready_fd = fs_daemonize_start();
    /* Threads started from here on (backend, socket server, reaper) must not
     * take the stop signals: the FUSE loop's threads do. */
    fs_stop_signals(&stopsigs);
    pthread_sigmask(SIG_BLOCK, &stopsigs, NULL);
    sfs_set_log(fs_log_msg, NULL, co.debug ? LOG_DEBUG : LOG_WARNING);
    openlog("shardfs", LOG_PID, LOG_DAEMON);

    fs.shard_size = cfg.cache.shard_size;
    fs.max_read = o.max_read;
    fs.ro = o.ro;
    fs.wait_ns = cfg.wait_ns;
    fs.readahead = cfg.readahead;
    fs.store_capacity = cfg.store_capacity;
    fs.nslots = (uint32_t)(cfg.cache.capacity / cfg.cache.shard_size); /* < 2^30 (validate) */
    /* Pins: page_cache / shard_size, >= 1 (options.c), at most half the
     * slots (options.c) and PC_MAX_PINS leases. */
    fs.pc_max = (uint32_t)(cfg.page_cache / cfg.cache.shard_size);
    if (fs.pc_max > PC_MAX_PINS)
        fs.pc_max = PC_MAX_PINS;
    fs_inode_owner(o.backend, &fs);
    snprintf(fs.socket_path, sizeof(fs.socket_path), "%s", cfg.socket);
    clock_gettime(CLOCK_REALTIME, &fs.start);
    if (fs_table_init(&fs) < 0) {
        fprintf(stderr, "shardfs: out of memory\n");
        goto out_args;
    }

    memset(&bp, 0, sizeof(bp));
    bp.shard_size = cfg.cache.shard_size;
    bp.dir_prefix = cfg.dir_prefix;
    bp.read_only = o.ro;
    /* A call into a hung store answers ETIMEDOUT at a read's deadline. */
    bp.timeout_ms = (unsigned)(cfg.wait_ns / 1000000);
    {
        /* -o peer_listen wraps BACKEND_DIR in the peer tier (options.c). */
        char *spec = fs_backend_spec(&o);

        fs.be = spec ? sfs_backend_open(spec, &bp, errbuf, sizeof(errbuf), &err) : NULL;
        if (!spec)
            err = -ENOMEM;
        free(spec);
    }
    if (!fs.be) {
        /* The peer tier's reasons name its options (peer:...: the spec
         * the daemon built from -o peer_*). */
        if (o.peer_listen && strncmp(errbuf, "peer", 4) == 0)
            fprintf(stderr, "shardfs: -o peer_listen=%s: %s\n", o.peer_listen, errbuf);
        else
            fprintf(stderr, "shardfs: BACKEND_DIR %s: %s\n", o.backend,
                    errbuf[0] ? errbuf : strerror(-err));
        goto out_table;
    }
    if (cfg.store_capacity) {
        struct sfs_block_stamp st;

        if (sfs_backend_stamp(fs.be, NULL, &st) == -EOPNOTSUPP) {
            fprintf(stderr,
                    "shardfs: store_capacity=%s: BACKEND_DIR %s has no block files to "
                    "bound\n",
                    o.store_capacity, o.backend);
            goto out_backend;
        }
    }
    if (cfg.no_fallback) /* its one line says it all: the data plane's own is noise */
        sfs_set_log(fs_log_msg, NULL, co.debug ? LOG_DEBUG : LOG_CRIT);
    fs.cache = sfs_cache_create(&cfg.cache, &err);
    sfs_set_log(fs_log_msg, NULL, co.debug ? LOG_DEBUG : LOG_WARNING);
    if (!fs.cache && cfg.no_fallback) {
        fprintf(stderr,
                "shardfs: capacity=%s: no huge pages for the data plane (%s), and ordinary "
                "memory is above the memory limit of this process's cgroup (%" PRIu64
                " bytes, %s)\n",
                o.capacity ? o.capacity : DEFAULT_CAPACITY_TEXT, strerror(-err),
                cfg.memory_limit.bytes, cfg.memory_limit.where);
        goto out_backend;
    }
    if (!fs.cache) {
        fprintf(stderr,
                "shardfs: cannot create the cache (capacity=%" PRIu64 " shard_size=%" PRIu64
                " hugepages=%s): %s\n",
                cfg.cache.capacity, cfg.cache.shard_size, o.hugepages ? o.hugepages : "auto",
                strerror(-err));
        goto out_backend;
    }
    sfs_cache_set_class(fs.cache, "mount"); /* the class label of the mount's reads */
    sfs_cache_set_touch_hook(fs.cache, touch_hook, fs.be);
    err = sfs_cache_serve_opts(fs.cache, cfg.socket, &cfg.serve);
    if (err < 0) {
        fprintf(stderr, "shardfs: socket=%s: %s\n", cfg.socket, strerror(-err));
        goto out_cache;
    }

    se = start_fault("session") ? NULL : fuse_session_new(&args, &fs_ops, sizeof(fs_ops), &fs);
    if (!se)
        goto out_cache; /* libfuse printed the reason */
    fs.se = se;
    if (start_fault("signals") || fuse_set_signal_handlers(se) != 0) {
        fprintf(stderr, "shardfs: cannot set signal handlers\n");
        goto out_session;
    }
    if (o.peer_listen && peer_hup_start(fs.be) != 0) {
        fprintf(stderr, "shardfs: cannot set the SIGHUP handler\n");
        goto out_signals;
    }
    if (start_fault("mount") || fuse_session_mount(se, co.mountpoint) != 0) {
        fprintf(stderr, "shardfs: MOUNTPOINT %s: mount failed\n", co.mountpoint);
        goto out_signals;
    }
    err = start_fault("reaper") ? -EAGAIN : fs_reaper_start(&reaper, fs.cache);
    if (err < 0) {
        fprintf(stderr, "shardfs: reaper thread: %s\n", strerror(-err));
        goto out_unmount;
    }
    err = start_fault("settler") ? -EAGAIN : fs_waitq_start(&fs);
    if (err < 0) {
        fprintf(stderr, "shardfs: settler thread: %s\n", strerror(-err));
        fs_reaper_stop(&reaper);
        goto out_unmount;
    }
    err = start_fault("pagecache") ? -EAGAIN : fs_pagecache_start(&fs);
    if (err < 0) {
        fprintf(stderr, "shardfs: page-cache thread: %s\n", strerror(-err));
        fs_waitq_stop(&fs);
        fs_reaper_stop(&reaper);
        goto out_unmount;
    }
    /* The hot set: reads the usage file and warms from it in the background
     * while the mount serves; never fails the mount. */
    fs.warm_pin_s = cfg.warm_pin_s;
    fs_usage_start(&fs, o.backend, cfg.warm_pct, !o.ro);
    /* Another host's commits (a shared store): never fails the mount. */
    err = start_fault("revalidate")
              ? -EAGAIN
              : fs_reval_start(&fs, fs_reval_period(fs.be, cfg.revalidate_ms));
    if (err < 0)
        fprintf(stderr,
                "shardfs: revalidation thread: %s (blocks other hosts replace are "
                "served until evicted)\n",
                strerror(-err));
    /* The store's bound: its first pass scans the store in the background. */
    err = start_fault("storecap") ? -EAGAIN
                                  : fs_storecap_start(&fs, cfg.store_high_pct, cfg.store_low_pct);
    if (err < 0) {
        fprintf(stderr, "shardfs: store_capacity: collector thread: %s\n", strerror(-err));
        reval_stuck = !fs_reval_stop(&fs, STOP_GRACE_NS / 4);
        fs_pagecache_stop(&fs);
        fs_usage_stop(&fs, true);
        fs_waitq_stop(&fs);
        fs_reaper_stop(&reaper);
        goto out_unmount;
    }
    loop.se = se;
    loop.single = co.singlethread;
    loop.clone_fd = (unsigned)co.clone_fd;
    /* Idle workers beyond this many end (libfuse keeps every one by
     * default): a burst of requests does not leave 64 threads behind. */
    loop.max_idle_threads =
        co.max_idle_threads != UINT_MAX ? co.max_idle_threads : DEFAULT_MAX_IDLE_THREADS;
    /* Readers waiting for a load hold no worker (wait.c), but stores and
     * a few other requests wait in theirs: allow more than libfuse's 10. */
    loop.max_threads = co.max_threads && co.max_threads != 10 && co.max_threads <= 100000
                           ? co.max_threads
                           : DEFAULT_MAX_THREADS;
    err = start_fault("loop") ? -EAGAIN : fs_loop_start(&loop);
    if (err < 0) {
        fprintf(stderr, "shardfs: session thread: %s\n", strerror(-err));
        reval_stuck = !fs_storecap_stop(&fs, STOP_GRACE_NS / 4);
        fs_usage_stop(&fs, !reval_stuck); /* a stuck collector still reads it */
        reval_stuck |= !fs_reval_stop(&fs, STOP_GRACE_NS / 4);
        fs_pagecache_stop(&fs);
        fs_waitq_stop(&fs);
        fs_reaper_stop(&reaper);
        goto out_unmount;
    }
    /* Started, all of it: the daemonizing parent may return 0 now (not
     * before the session's thread, which is the last thing that can fail). */
    if (ready_fd >= 0) {
        fs_daemonize_done(ready_fd);
        ready_fd = -1;
    }
    if (!fs_loop_wait(&loop, STOP_GRACE_NS)) {
        /* A handler is stuck in the backend (a hung store, a dump that
         * does not return) and libfuse would join it forever. Answer what
         * can be answered, unmount, remove the socket, and leave: the exit
         * ends the stuck threads; nothing they did is reported done. */
        unsigned n = fs_loads_stop(&fs, 0);
        char msg[200];

        snprintf(msg, sizeof(msg),
                 "stopping: request handlers still in the backend after %lld s; exiting "
                 "without them (%u backend load%s abandoned)",
                 STOP_GRACE_NS / 1000000000, n, n == 1 ? "" : "s");
        fs_log_msg(LOG_WARNING, msg, NULL);
        /* Detach without closing /dev/fuse under libfuse's threads (the
         * exit closes it); fusermount3 -uz's way when not root. */
        if (umount2(co.mountpoint, MNT_DETACH) < 0)
            fuse_session_unmount(se);
        unlink(cfg.socket);
        /* The stuck threads end with the process, unjoined on purpose:
         * exit_group directly, not _exit (a sanitizer's _exit would report
         * them as leaked threads and change the status). */
        FS_COVERAGE_DUMP();
        syscall(SYS_exit_group, 0);
        _exit(0);
    }
    err = loop.err;
    /* 0: unmounted; > 0: stopped by that signal; < 0: an error. */
    ret = err < 0 ? 1 : 0;
    if (err < 0)
        fprintf(stderr, "shardfs: session loop: %s\n", strerror(-err));

    /* Loads in flight answer requests from backend threads: let them finish
     * while the session still exists, for what is left of the grace. A
     * backend that is stuck must not keep us (and the mount) alive: what is
     * left is abandoned, its slots failed so that no rank waits on a load
     * that will never come. */
    /* The store's collector reads the usage counts: it stops first. One
     * stuck in a hung store (a scan has no deadline) is left to the exit,
     * the backend open and the usage table not freed. */
    cap_stuck = !fs_storecap_stop(&fs, STOP_GRACE_NS / 4);
    if (cap_stuck)
        fs_log_msg(LOG_WARNING,
                   "stopping: the store collector is still in the backend (a hung store); "
                   "exiting without it",
                   NULL);
    fs_usage_stop(&fs, !cap_stuck); /* no more warm loads; the usage file written */
    /* A sweep stuck in a hung store is left to the exit, the backend open. */
    reval_stuck = !fs_reval_stop(&fs, STOP_GRACE_NS / 4);
    if (reval_stuck)
        fs_log_msg(LOG_WARNING,
                   "stopping: the revalidation sweep is still in the backend (a hung store); "
                   "exiting without it",
                   NULL);
    reval_stuck |= cap_stuck;
    fs_pagecache_stop(&fs); /* pins stay until the cache closes */
    fs_waitq_stop(&fs);     /* parked reads: EIO, the session ended */
    abandoned = fs_loads_stop(&fs, loop.grace_left_ns);
    if (abandoned) {
        char msg[160];

        snprintf(msg, sizeof(msg),
                 "stopping: %u backend load%s still in flight after %lld s abandoned "
                 "(their slots failed with ECANCELED)",
                 abandoned, abandoned == 1 ? "" : "s", STOP_GRACE_NS / 1000000000);
        fs_log_msg(LOG_WARNING, msg, NULL);
    }
    fs_reaper_stop(&reaper);
out_unmount:
    fuse_session_unmount(se);
out_signals:
    fuse_remove_signal_handlers(se);
    if (o.peer_listen)
        signal(SIGHUP, SIG_IGN); /* the backend closes below */
out_session:
    fuse_session_destroy(se);
out_cache:
    sfs_cache_close(fs.cache); /* stops the socket server, unlinks the socket */
out_backend:
    /* Closing waits for every request: not for those we abandoned. The
     * process exit takes the backend's threads and rings with it. */
    if (!abandoned && !reval_stuck)
        sfs_backend_close(fs.be);
out_table:
    fs_handles_drop(&fs); /* files still open: before the table they name */
    fs_table_destroy(&fs);
out_args:
    fs_options_free(&o);
    free(co.mountpoint);
    fuse_opt_free_args(&args);
    return ret;
}
