/* SPDX-License-Identifier: MIT */
/*
 * fsfixture.c - start and stop a shardfs daemon on a real mount (see
 * fsfixture.h). Shared by the FUSE tests and bench_fs.
 */
#include "fsfixture.h"
#include "testutil.h"

#include <shardfs/cache.h>

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* system(3) of "fusermount3 ARGS MNT"; its exit status, or -1. */
static int fusermount(const char *args, const char *mnt)
{
    char cmd[512];
    int st;

    snprintf(cmd, sizeof(cmd), "fusermount3 %s %s 2>/dev/null", args, mnt);
    st = system(cmd);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

bool fsfx_usable(void)
{
    int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);

    if (fd < 0)
        return false;
    close(fd);
    return system("command -v fusermount3 >/dev/null 2>&1") == 0;
}

bool fsfx_is_mounted(const char *mnt)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    char line[4096], pat[300];
    bool found = false;

    if (!f)
        return false;
    snprintf(pat, sizeof(pat), " %s ", mnt);
    while (!found && fgets(line, sizeof(line), f))
        found = strstr(line, pat) && strstr(line, "fuse.shardfs");
    fclose(f);
    return found;
}

/* In the child: join the cgroup, point stdout/stderr at the log, exec. */
static void daemon_exec(const struct fsfx *m, const char *backend, const char *o)
{
    int fd =
        m->log[0] ? open(m->log, O_WRONLY | O_CREAT | O_TRUNC, 0644) : open("/dev/null", O_WRONLY);

    if (fd >= 0) {
        dup2(fd, 1);
        if (m->log[0])
            dup2(fd, 2);
    }
    if (m->join_cgroup) {
        char procs[4200];
        FILE *f;

        snprintf(procs, sizeof(procs), "%s/cgroup.procs", m->join_cgroup);
        f = fopen(procs, "we");
        if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) != 0)
            _exit(126);
    }
    if (o[0])
        execl(m->bin, "shardfs", "-f", "-o", o, backend, m->mnt, (char *)NULL);
    else
        execl(m->bin, "shardfs", "-f", backend, m->mnt, (char *)NULL);
    _exit(127);
}

int fsfx_start(struct fsfx *m, const char *backend, const char *opts, double timeout_s, int *status)
{
    char o[1024];
    double t0;

    mkdir(m->mnt, 0755);
    snprintf(o, sizeof(o), "%s%s%s%s", m->sock[0] ? "socket=" : "", m->sock,
             m->sock[0] && opts && *opts ? "," : "", opts ? opts : "");
    /* SHARDFS_TEST_ADMISSION=scan: the suite with -o admission=scan (unless
     * the test names an admission itself). */
    const char *adm = getenv("SHARDFS_TEST_ADMISSION");
    if (adm && *adm && !(opts && strstr(opts, "admission="))) {
        size_t ol = strlen(o);
        snprintf(o + ol, sizeof(o) - ol, "%sadmission=%s", ol ? "," : "", adm);
    }
    m->pid = fork();
    if (m->pid < 0) {
        m->pid = 0;
        return -errno;
    }
    if (m->pid == 0)
        daemon_exec(m, backend, o);
    t0 = now_s();
    while (!fsfx_is_mounted(m->mnt)) {
        int st;

        if (waitpid(m->pid, &st, WNOHANG) == m->pid) {
            m->pid = 0;
            if (status)
                *status = st;
            return -ECHILD;
        }
        if (now_s() - t0 > timeout_s) {
            kill(m->pid, SIGKILL);
            waitpid(m->pid, NULL, 0);
            m->pid = 0;
            fusermount("-uz", m->mnt);
            return -ETIMEDOUT;
        }
        nap_ms(5);
    }
    return 0;
}

int fsfx_stop(struct fsfx *m, bool term, double timeout_s)
{
    double t0 = now_s();
    int st = 0, um;
    bool termed = false;

    if (m->pid <= 0)
        return -1;
    um = fsfx_is_mounted(m->mnt) ? fusermount("-u", m->mnt) : 0;
    if (um != 0 && term)
        kill(m->pid, SIGTERM);
    while (waitpid(m->pid, &st, WNOHANG) != m->pid) {
        /* Unmounted here, and still serving: a copy of the mount lives on
         * in another mount namespace (a process another test made with
         * unshare or `ip netns exec` while this mount existed), so the
         * kernel keeps the connection. The daemon rightly serves it; the
         * test stops it as an operator would, with SIGTERM. */
        if (um == 0 && !termed && now_s() - t0 > (timeout_s < 6.0 ? timeout_s / 2 : 3.0)) {
            fprintf(stderr,
                    "fsfx_stop: %s unmounted but daemon %d still serves it (a copy "
                    "in another mount namespace): SIGTERM\n",
                    m->mnt, (int)m->pid);
            kill(m->pid, SIGTERM);
            termed = true;
        }
        if (now_s() - t0 > timeout_s) {
            fprintf(stderr, "fsfx_stop: daemon %d not gone within %.0f s (fusermount3 -u: %d)\n",
                    (int)m->pid, timeout_s, um);
            tu_dump_stacks(m->pid);
            kill(m->pid, SIGKILL);
            waitpid(m->pid, &st, 0);
            fusermount("-uz", m->mnt);
            m->pid = 0;
            return -1;
        }
        nap_ms(10);
    }
    m->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---------------------------------------------------------------------------
 * Helpers shared by the tests that drive a mount.
 */

int fsfx_sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    int st;

    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    st = system(cmd);
    if (st == -1)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void fsfx_sleep_ms(long ms)
{
    nap_ms(ms);
}

double fsfx_now_s(void)
{
    return (double)sfs_now_ns() / 1e9;
}

const char *fsfx_daemon_bin(const char *built)
{
    const char *e = getenv("SHARDFS_TEST_DAEMON");

    return e && *e ? e : built;
}

/* The next of a thread-local ring of 4 path buffers of 256 bytes. */
#define PATH_RING(name)                                                                            \
    static __thread char name##_ring[4][256];                                                      \
    static __thread unsigned name##_next;                                                          \
    char *name = name##_ring[name##_next++ & 3]

const char *fsfx_shard_path(const struct fsfx *m, uint64_t b, long n)
{
    char hex[SFS_BLOCK_HEX_LEN + 1];
    PATH_RING(p);

    tu_block_hex(b, hex);
    if (n < 0)
        snprintf(p, 256, "%s/block/%s/shard", m->mnt, hex);
    else
        snprintf(p, 256, "%s/block/%s/shard/%ld", m->mnt, hex, n);
    return p;
}

const char *fsfx_block_dir(const struct fsfx *m, uint64_t b)
{
    char hex[SFS_BLOCK_HEX_LEN + 1];
    PATH_RING(p);

    tu_block_hex(b, hex);
    snprintf(p, 256, "%s/block/%s", m->mnt, hex);
    return p;
}

const char *fsfx_block_file(const char *store, uint64_t b)
{
    char hex[SFS_BLOCK_HEX_LEN + 1];
    PATH_RING(p);

    tu_block_hex(b, hex);
    snprintf(p, 256, "%s/data/%s", store, hex);
    return p;
}

long long fsfx_stat(const struct fsfx *m, const char *name)
{
    char path[256], line[512];
    size_t nl = strlen(name);
    long long v = -1;
    FILE *f;

    snprintf(path, sizeof(path), "%s/stats", m->mnt);
    f = fopen(path, "re");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, name, nl) == 0 && line[nl] == ' ')
            v = atoll(line + nl + 1);
    fclose(f);
    return v;
}

long fsfx_read_all(const char *path, void *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    size_t got = 0;

    if (fd < 0)
        return -errno;
    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);

        if (n < 0) {
            int e = errno;

            close(fd);
            return -e;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    return (long)got;
}

int fsfx_log_lines_with(const struct fsfx *m, const char *s)
{
    char line[1024];
    int n = 0;
    FILE *f = m->log[0] ? fopen(m->log, "re") : NULL;

    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        n += strstr(line, s) != NULL;
    fclose(f);
    return n;
}

void fsfx_cleanup(const struct fsfx *m, const char *store)
{
    if (m->mnt[0] && fsfx_is_mounted(m->mnt))
        fsfx_sh("fusermount3 -uz %s 2>/dev/null", m->mnt);
    if (m->mnt[0] && !fsfx_is_mounted(m->mnt))
        rmdir(m->mnt);
    if (store && store[0])
        fsfx_sh("rm -rf %s", store);
    if (m->log[0] && !getenv("SFS_TEST_KEEP_LOGS"))
        unlink(m->log);
}
