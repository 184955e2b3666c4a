/* SPDX-License-Identifier: MIT */
/*
 * shardfsctl - the operator's tool for a shardfs mount: `check` for probes
 * and scripts, `top` for a person at a terminal.
 *
 * Key idea: it asks the daemon only what any reader may: MOUNT/stats, the
 * mount's socket xattr, and one query-only attach (the control plane, no
 * data plane, no lease). `check` reads /stats in a child process under a
 * deadline, so a hung daemon makes it fail with a reason instead of
 * hanging the probe. `top` redraws one 80-column screen a second from the
 * differences of two /stats snapshots, with plain ANSI sequences (the
 * alternate screen, cursor home, erase to end of line): no curses, so it
 * works over ssh on any terminal; whatever ends it (q, Ctrl-C, SIGTERM,
 * SIGHUP) restores the terminal.
 */
#include <shardfs/cache.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define STATS_CAP (64u << 10) /* bytes of /stats read at most */
#define MAX_VALS  1024        /* metric lines kept from one snapshot */
#define COLS      80

enum { EXIT_OK = 0, EXIT_DOWN = 1, EXIT_USAGE = 2 };

static void usage(FILE *f)
{
    fprintf(f, "usage: shardfsctl check [-t SECS] MOUNT\n"
               "       shardfsctl top [-n COUNT] MOUNT\n"
               "       shardfsctl --help | --version\n"
               "\n"
               "check  exit 0 when the daemon of MOUNT answers and its cache attaches;\n"
               "       otherwise print the reason and exit 1 (2: not a shardfs mount,\n"
               "       or a usage error). -t: the daemon's deadline (default 5 s).\n"
               "top    a live view of MOUNT, refreshed each second: hit ratio and reads\n"
               "       per tier, loads and bytes, waits, resident and pinned bytes, the\n"
               "       attached processes. q or Ctrl-C quits. -n: stop after COUNT\n"
               "       screens. Not on a terminal: one plain screen per second.\n"
               "\n"
               "See shardfsctl(8).\n");
}

/* ---------------------------------------------------------------------------
 * Reading the daemon.
 */

/* Is mnt a shardfs mount (fuse.shardfs in /proc/self/mountinfo)? */
static bool is_shardfs_mount(const char *mnt)
{
    char real[4096], line[8192];
    FILE *f;
    bool found = false;

    if (!realpath(mnt, real))
        snprintf(real, sizeof(real), "%s", mnt); /* a dead mount: realpath fails */
    f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return false;
    while (!found && fgets(line, sizeof(line), f)) {
        char point[4096], type[256];
        const char *dash = strstr(line, " - ");

        /* id parent major:minor root point ... - type source options */
        if (!dash || sscanf(line, "%*s %*s %*s %*s %4095s", point) != 1 ||
            sscanf(dash + 3, "%255s", type) != 1)
            continue;
        found = strcmp(point, real) == 0 && strcmp(type, "fuse.shardfs") == 0;
    }
    fclose(f);
    return found;
}

/* Read MNT/stats into buf (NUL-terminated): bytes read, or -errno. */
static long read_stats(const char *mnt, char *buf, size_t cap)
{
    char path[4200];
    FILE *f;
    size_t n;

    snprintf(path, sizeof(path), "%s/stats", mnt);
    f = fopen(path, "re");
    if (!f)
        return -errno;
    n = fread(buf, 1, cap - 1, f);
    int err = ferror(f) ? errno : 0;
    fclose(f);
    if (err)
        return -err;
    buf[n] = '\0';
    return (long)n;
}

/*
 * What `check` asks the daemon, in a child so that a daemon that never
 * answers cannot hold the caller past its deadline: /stats and the socket
 * xattr. Returns 0 with sock filled; -ETIMEDOUT; or the -errno the child
 * met (its stage in *stage).
 */
static int probe_mount(const char *mnt, double timeout_s, char *sock, size_t socklen,
                       const char **stage)
{
    struct {
        int err;
        int stage; /* 0: stats, 1: socket xattr */
        char sock[4096];
    } rep = {0};
    int fds[2];
    pid_t pid;

    if (pipe(fds) < 0)
        return -errno;
    pid = fork();
    if (pid < 0) {
        int e = errno;

        close(fds[0]);
        close(fds[1]);
        return -e;
    }
    if (pid == 0) {
        static char buf[STATS_CAP];
        long r = read_stats(mnt, buf, sizeof(buf));

        close(fds[0]);
        if (r < 0) {
            rep.err = (int)-r;
        } else if (!strstr(buf, "shardfs_slots ")) {
            rep.err = EBADMSG;
        } else {
            ssize_t n;

            rep.stage = 1;
            n = getxattr(mnt, SFS_XATTR_SOCKET, rep.sock, sizeof(rep.sock) - 1);
            rep.err = n < 0 ? errno : 0;
        }
        _exit(write(fds[1], &rep, sizeof(rep)) == (ssize_t)sizeof(rep) ? 0 : 1);
    }
    close(fds[1]);
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    int pr = poll(&p, 1, (int)(timeout_s * 1000));
    ssize_t got = pr > 0 ? read(fds[0], &rep, sizeof(rep)) : -1;
    close(fds[0]);
    if (got != (ssize_t)sizeof(rep)) {
        /* The child is stuck in the daemon (or died): it goes, we report. */
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        *stage = "reading stats";
        return pr == 0 ? -ETIMEDOUT : -EIO;
    }
    waitpid(pid, NULL, 0);
    *stage = rep.stage == 0 ? "reading stats" : "reading the socket xattr";
    if (rep.err)
        return -rep.err;
    rep.sock[sizeof(rep.sock) - 1] = '\0';
    snprintf(sock, socklen, "%s", rep.sock);
    return 0;
}

static int cmd_check(const char *mnt, double timeout_s)
{
    char sock[4096];
    const char *stage = "";
    struct sfs_cache *c;
    struct sfs_cache_info ci;
    int err = 0;

    if (!is_shardfs_mount(mnt)) {
        printf("shardfsctl: %s: not a shardfs mount\n", mnt);
        return EXIT_USAGE;
    }
    err = probe_mount(mnt, timeout_s, sock, sizeof(sock), &stage);
    if (err == -ENOTCONN) {
        printf("shardfsctl: %s: the daemon is gone (the mount is left behind: "
               "Transport endpoint is not connected)\n",
               mnt);
        return EXIT_DOWN;
    }
    if (err == -ETIMEDOUT) {
        printf("shardfsctl: %s: the daemon does not answer (%s, %.1f s)\n", mnt, stage, timeout_s);
        return EXIT_DOWN;
    }
    if (err < 0) {
        printf("shardfsctl: %s: %s: %s\n", mnt, stage, strerror(-err));
        return EXIT_DOWN;
    }
    c = sfs_cache_attach(sock, -1, &err); /* query-only: the control plane alone */
    if (!c) {
        printf("shardfsctl: %s: the cache does not attach at %s: %s\n", mnt, sock, strerror(-err));
        return EXIT_DOWN;
    }
    sfs_cache_info(c, &ci);
    sfs_cache_close(c);
    printf("ok: %s: daemon answers, cache attached (%s, %u slots of %llu bytes)\n", mnt, sock,
           ci.nslots, (unsigned long long)ci.shard_size);
    return EXIT_OK;
}

/* ---------------------------------------------------------------------------
 * top: snapshots, and what two of them say.
 */

struct snap {
    double t; /* CLOCK_MONOTONIC seconds */
    unsigned n;
    struct val {
        char key[112]; /* the metric name with its labels */
        double v;
    } vals[MAX_VALS];
};

static double mono_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Parse the Prometheus text: every sample line "KEY VALUE". */
static void parse(struct snap *s, char *text)
{
    s->n = 0;
    for (char *line = strtok(text, "\n"); line && s->n < MAX_VALS; line = strtok(NULL, "\n")) {
        char *sp = strrchr(line, ' ');

        if (line[0] == '#' || !sp || (size_t)(sp - line) >= sizeof(s->vals[0].key))
            continue;
        memcpy(s->vals[s->n].key, line, (size_t)(sp - line));
        s->vals[s->n].key[sp - line] = '\0';
        s->vals[s->n].v = strtod(sp + 1, NULL);
        s->n++;
    }
}

/* The value of key in s; NAN-free: 0 when absent (*found false). */
static double get(const struct snap *s, const char *key, bool *found)
{
    for (unsigned i = 0; i < s->n; i++)
        if (strcmp(s->vals[i].key, key) == 0) {
            if (found)
                *found = true;
            return s->vals[i].v;
        }
    if (found)
        *found = false;
    return 0;
}

/* Per second between prev and cur (0 without prev). */
static double rate(const struct snap *prev, const struct snap *cur, const char *key)
{
    double dt;

    if (!prev || (dt = cur->t - prev->t) <= 0)
        return 0;
    double d = get(cur, key, NULL) - get(prev, key, NULL);
    return d > 0 ? d / dt : 0;
}

/* "12.3 MiB" style, into out. */
static const char *human(double b, char *out, size_t len)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;

    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    snprintf(out, len, i ? "%.1f %s" : "%.0f %s", b, u[i]);
    return out;
}

/* One screen's lines. */
struct screen {
    char line[24][COLS + 1];
    int n;
};

static void add(struct screen *sc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(struct screen *sc, const char *fmt, ...)
{
    va_list ap;

    if (sc->n >= 24)
        return;
    va_start(ap, fmt);
    vsnprintf(sc->line[sc->n], sizeof(sc->line[0]), fmt, ap); /* cut at 80 columns */
    va_end(ap);
    sc->n++;
}

/* The classes named in cur's shardfs_attached_processes lines. */
static unsigned classes(const struct snap *cur, char names[][24], unsigned max)
{
    const char *pfx = "shardfs_attached_processes{class=\"";
    unsigned n = 0;

    for (unsigned i = 0; i < cur->n && n < max; i++) {
        const char *k = cur->vals[i].key;

        if (strncmp(k, pfx, strlen(pfx)) != 0)
            continue;
        snprintf(names[n], 24, "%.*s", (int)strcspn(k + strlen(pfx), "\""), k + strlen(pfx));
        n++;
    }
    return n;
}

static const char *const tiers[] = {"memory", "peer", "store", "miss"};

static void render(struct screen *sc, const char *mnt, const struct snap *prev,
                   const struct snap *cur)
{
    char a[32], b[32], key[160], when[32];
    double tr[4], reads = 0;
    time_t now = time(NULL);

    strftime(when, sizeof(when), "%H:%M:%S", localtime(&now));
    sc->n = 0;
    add(sc, "shardfsctl top %-.50s  %s  q: quit", mnt, when);
    add(sc, "%s", "");
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof(key), "shardfs_served_total{tier=\"%s\"}", tiers[i]);
        tr[i] = rate(prev, cur, key);
        reads += tr[i];
    }
    double hits = rate(prev, cur, "shardfs_hits_total");
    double req = rate(prev, cur, "shardfs_requests_total");
    if (prev)
        add(sc, "reads/s %10.0f   hit ratio %5.1f %%   (Gets/s %.0f, hits/s %.0f)", reads,
            reads > 0 ? 100.0 * tr[0] / reads : 0.0, req, hits);
    else
        add(sc, "reads/s          -   hit ratio     - %%   (the rates start next second)");
    add(sc, "  memory %9.0f/s  peer %9.0f/s  store %9.0f/s  miss %9.0f/s", tr[0], tr[1], tr[2],
        tr[3]);
    double loads = rate(prev, cur, "shardfs_load_duration_seconds_count");
    double lsum = rate(prev, cur, "shardfs_load_duration_seconds_sum");
    add(sc, "loads/s %10.0f   bytes/s %11s/s   avg load %8.3f ms", loads,
        human(rate(prev, cur, "shardfs_bytes_read_total"), a, sizeof(a)),
        loads > 0 ? 1e3 * lsum / loads : 0.0);
    double waits = rate(prev, cur, "shardfs_wait_duration_seconds_count");
    double wsum = rate(prev, cur, "shardfs_wait_duration_seconds_sum");
    add(sc, "waits/s %10.0f   avg wait %8.3f ms   waiting now ~%.1f", waits,
        waits > 0 ? 1e3 * wsum / waits : 0.0, wsum); /* Little's law: time waited per second */
    double res = get(cur, "shardfs_resident_bytes", NULL);
    double cap = get(cur, "shardfs_capacity_bytes", NULL);
    add(sc, "resident %11s of %s (%.0f %%)   pinned %s", human(res, a, sizeof(a)),
        human(cap, b, sizeof(b)), cap > 0 ? 100.0 * res / cap : 0.0,
        human(get(cur, "shardfs_pinned_bytes", NULL), key, sizeof(key)));
    add(sc, "evictions/s %6.0f   backend errors/s %.0f   wait timeouts/s %.0f",
        rate(prev, cur, "shardfs_evictions_total"), rate(prev, cur, "shardfs_backend_errors_total"),
        rate(prev, cur, "shardfs_fs_wait_timeouts_total"));
    add(sc, "%s", "");
    add(sc, "%-16s %8s %11s %11s %11s %11s", "class", "attached", "memory/s", "peer/s", "store/s",
        "miss/s");

    char names[12][24];
    unsigned nc = classes(cur, names, 12);
    for (unsigned i = 0; i < nc; i++) {
        double v[4];

        for (int k = 0; k < 4; k++) {
            snprintf(key, sizeof(key), "shardfs_class_served_total{class=\"%.23s\",tier=\"%s\"}",
                     names[i], tiers[k]);
            v[k] = rate(prev, cur, key);
        }
        snprintf(key, sizeof(key), "shardfs_attached_processes{class=\"%.23s\"}", names[i]);
        add(sc, "%-16s %8.0f %11.0f %11.0f %11.0f %11.0f", names[i], get(cur, key, NULL), v[0],
            v[1], v[2], v[3]);
    }
    add(sc, "%s", "");
    bool peer;
    get(cur, "shardfs_peer_hits_total", &peer);
    if (peer)
        add(sc, "peer tier: hits/s %.0f  misses/s %.0f", rate(prev, cur, "shardfs_peer_hits_total"),
            rate(prev, cur, "shardfs_peer_misses_total"));
    const char *hot = "shardfs_hot_block_uses{block=\"";
    int nhot = 0;
    for (unsigned i = 0; i < cur->n && nhot < 3; i++) {
        if (strncmp(cur->vals[i].key, hot, strlen(hot)) != 0)
            continue;
        add(sc, "%s %.32s %8.0f uses", nhot++ ? "              " : "hottest blocks",
            cur->vals[i].key + strlen(hot), cur->vals[i].v);
    }
    add(sc, "%.0f slots of %s   warmed %.0f", get(cur, "shardfs_slots", NULL),
        human(get(cur, "shardfs_shard_size_bytes", NULL), a, sizeof(a)),
        get(cur, "shardfs_warmed_total", NULL));
}

/* ---------------------------------------------------------------------------
 * top: the terminal.
 */

static volatile sig_atomic_t stop_sig;
static struct termios saved_tio;
static bool tty_raw;

static void on_signal(int sig)
{
    stop_sig = sig;
}

static void term_restore(void)
{
    if (!tty_raw)
        return;
    /* Cursor shown, the alternate screen left: the shell's screen returns. */
    fputs("\033[?25h\033[?1049l", stdout);
    fflush(stdout);
    tcsetattr(STDIN_FILENO, TCSADRAIN, &saved_tio); /* keys typed ahead stay the shell's */
    tty_raw = false;
}

static int term_enter(void)
{
    struct termios t;

    if (tcgetattr(STDIN_FILENO, &saved_tio) < 0)
        return -errno;
    t = saved_tio;
    t.c_lflag &= ~(tcflag_t)(ICANON | ECHO); /* keys one by one, unechoed; ISIG stays */
    t.c_cc[VMIN] = 0;
    t.c_cc[VTIME] = 0;
    if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &t) < 0)
        return -errno;
    tty_raw = true;
    fputs("\033[?1049h\033[?25l", stdout);
    return 0;
}

static void draw(const struct screen *sc, bool tty)
{
    if (tty) {
        fputs("\033[H", stdout);
        for (int i = 0; i < sc->n; i++)
            printf("%s\033[K\r\n", sc->line[i]);
        fputs("\033[J", stdout);
    } else {
        for (int i = 0; i < sc->n; i++)
            printf("%s\n", sc->line[i]);
        printf("\n");
    }
    fflush(stdout);
}

static int cmd_top(const char *mnt, long count)
{
    static struct snap a, b;
    static char text[STATS_CAP];
    struct snap *prev = NULL, *cur = &a;
    bool tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    struct sigaction sa = {.sa_handler = on_signal};
    int ret = EXIT_OK;

    if (!is_shardfs_mount(mnt)) {
        fprintf(stderr, "shardfsctl: %s: not a shardfs mount\n", mnt);
        return EXIT_USAGE;
    }
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    if (tty && term_enter() < 0)
        tty = false;
    for (long shown = 0; !stop_sig && (count <= 0 || shown < count); shown++) {
        long r = read_stats(mnt, text, sizeof(text));
        struct screen sc;

        if (r < 0) {
            term_restore();
            fprintf(stderr, "shardfsctl: %s/stats: %s\n", mnt, strerror((int)-r));
            return EXIT_DOWN;
        }
        cur->t = mono_s();
        parse(cur, text);
        render(&sc, mnt, prev, cur);
        draw(&sc, tty);
        prev = cur;
        cur = cur == &a ? &b : &a;
        if (count > 0 && shown + 1 >= count)
            break;
        /* A second, or a key: q quits at once. */
        double until = mono_s() + 1.0;
        while (!stop_sig) {
            double left = until - mono_s();
            struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
            char ch;

            if (left <= 0)
                break;
            if (!tty) {
                struct timespec ts = {(time_t)left, (long)((left - (time_t)left) * 1e9)};

                nanosleep(&ts, NULL);
                continue;
            }
            if (poll(&p, 1, (int)(left * 1000) + 1) > 0 && read(STDIN_FILENO, &ch, 1) == 1 &&
                (ch == 'q' || ch == 'Q'))
                goto out;
        }
    }
out:
    term_restore();
    return ret;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        usage(stdout);
        return EXIT_OK;
    }
    if (argc >= 2 && strcmp(argv[1], "--version") == 0) {
        printf("shardfsctl %s\n", SHARDFS_VERSION);
        return EXIT_OK;
    }
    if (argc < 3) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    double timeout_s = 5.0;
    long count = 0;
    int opt;

    optind = 2;
    while ((opt = getopt(argc, argv, "t:n:")) != -1) {
        char *end;

        switch (opt) {
        case 't':
            timeout_s = strtod(optarg, &end);
            if (*end || !(timeout_s > 0 && timeout_s <= 3600)) {
                fprintf(stderr, "shardfsctl: -t %s: seconds in (0, 3600]\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case 'n':
            count = strtol(optarg, &end, 10);
            if (*end || count < 1) {
                fprintf(stderr, "shardfsctl: -n %s: a count >= 1\n", optarg);
                return EXIT_USAGE;
            }
            break;
        default:
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (optind != argc - 1) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (strcmp(cmd, "check") == 0)
        return cmd_check(argv[optind], timeout_s);
    if (strcmp(cmd, "top") == 0)
        return cmd_top(argv[optind], count);
    fprintf(stderr, "shardfsctl: unknown command %s\n", cmd);
    usage(stderr);
    return EXIT_USAGE;
}
