/* SPDX-License-Identifier: MIT */
/* testutil.c - see testutil.h. */
#include "testutil.h"
#include "slot_i.h" /* the slots, lease tables and hit lines, for tu_leases_on */
#include "testpoint_i.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

const char *tu_path(const char *tag)
{
    static __thread char buf[128];
    static int seq;

    /* The clock too: a pid is reused, and a run killed earlier may have
     * left its paths behind (a second mkdir of one would be EEXIST). */
    snprintf(buf, sizeof(buf), "/tmp/sfs-test-%d-%d-%x-%s", getpid(),
             __atomic_fetch_add(&seq, 1, __ATOMIC_RELAXED), (unsigned)sfs_now_ns(), tag);
    return buf;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

struct sfs_block_id tu_block(uint64_t n)
{
    struct sfs_block_id id;
    uint64_t a = mix(n), b = mix(n ^ 0x5555555555555555ull);

    memcpy(id.b, &a, 8);
    memcpy(id.b + 8, &b, 8);
    return id;
}

struct sfs_key tu_key(uint64_t block, uint32_t shard)
{
    struct sfs_key k = {.block = tu_block(block), .shard = shard};

    return k;
}

static uint64_t key_seed(const struct sfs_key *k)
{
    uint64_t a, b;

    memcpy(&a, k->block.b, 8);
    memcpy(&b, k->block.b + 8, 8);
    return mix(a ^ mix(b) ^ ((uint64_t)k->shard << 32));
}

void tu_fill(const struct sfs_key *k, void *buf, size_t len)
{
    uint64_t s = key_seed(k);
    uint8_t *p = buf;

    for (size_t i = 0; i < len; i += 8) {
        uint64_t v = mix(s + i);
        memcpy(p + i, &v, len - i < 8 ? len - i : 8);
    }
}

long tu_check(const struct sfs_key *k, const void *buf, size_t len)
{
    uint64_t s = key_seed(k);
    const uint8_t *p = buf;

    for (size_t i = 0; i < len; i += 8) {
        uint64_t v = mix(s + i);
        if (memcmp(p + i, &v, len - i < 8 ? len - i : 8) != 0)
            return (long)i;
    }
    return -1;
}

bool tu_all_bytes(const void *buf, size_t len, uint8_t v)
{
    const uint8_t *p = buf;

    for (size_t i = 0; i < len; i++)
        if (p[i] != v)
            return false;
    return true;
}

struct sfs_cache *tu_cache(uint32_t nslots, uint32_t nreserved, uint64_t shard_size)
{
    struct sfs_cache_config cfg = {
        .shard_size = shard_size,
        .nslots = nslots,
        .nreserved = nreserved,
        .no_reserved = nreserved == 0,
        .hugepages = SFS_HUGEPAGES_OFF,
    };
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);

    if (!c)
        fprintf(stderr, "tu_cache: %s\n", strerror(-err));
    return c;
}

/*
 * Forking a process whose other threads may be inside malloc.
 *
 * glibc's fork() takes malloc's locks around the fork, so the child finds
 * them free. GCC 12's ASan runtime does not do that for its own allocator:
 * a child forked while another thread of the parent held one of its locks
 * (the attach server answering an earlier child, say) inherits it held by
 * a thread that does not exist there, and every thread of the child that
 * then allocates in that size class waits for ever (seen: a rank whose
 * threads all sat in SizeClassAllocator64::GetFromAllocator). So tu_fork
 * forks only while every other thread of the parent sleeps, and proves it
 * afterwards: a thread that was sleeping before the fork and did not run
 * until after it (its CPU time unchanged) held no allocator lock at the
 * fork. Until the parent says so through a pipe, the child runs nothing of
 * the test; a child forked in a window where another thread ran is told to
 * _exit at once, and the fork is made again. A parent whose threads never
 * all sleep within the bound is forked as before.
 */
#define TU_QUIET_MAX 64

struct tu_quiet {
    int n;
    pid_t tid[TU_QUIET_MAX];
    unsigned long long ran_ns[TU_QUIET_MAX];
};

/* The other threads of this process: each asleep ('S'), with its CPU time
 * so far. False when one is not asleep, or there are too many to track. */
static bool tu_quiet_look(struct tu_quiet *q)
{
    pid_t self = (pid_t)syscall(SYS_gettid);
    DIR *d = opendir("/proc/self/task");
    struct dirent *de;
    bool quiet = d != NULL;

    q->n = 0;
    while (quiet && (de = readdir(d))) {
        pid_t tid = (pid_t)atoi(de->d_name);
        char path[64], buf[512], *p;
        unsigned long long ran = 0;
        FILE *f;

        if (tid <= 0 || tid == self)
            continue;
        if (q->n == TU_QUIET_MAX)
            quiet = false;
        snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)tid);
        f = fopen(path, "re");
        p = f && fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
        if (f)
            fclose(f);
        if (!p || p[1] != ' ' || p[2] != 'S') {
            quiet = false; /* running, or gone since readdir */
            break;
        }
        snprintf(path, sizeof(path), "/proc/self/task/%d/schedstat", (int)tid);
        f = fopen(path, "re");
        if (!f || fscanf(f, "%llu", &ran) != 1)
            quiet = false;
        if (f)
            fclose(f);
        if (quiet) {
            q->tid[q->n] = tid;
            q->ran_ns[q->n++] = ran;
        }
    }
    if (d)
        closedir(d);
    return quiet;
}

static bool tu_quiet_same(const struct tu_quiet *a, const struct tu_quiet *b)
{
    if (a->n != b->n)
        return false;
    for (int i = 0; i < a->n; i++)
        if (a->tid[i] != b->tid[i] || a->ran_ns[i] != b->ran_ns[i])
            return false;
    return true;
}

pid_t tu_fork(int (*fn)(void *arg), void *arg)
{
    int64_t give_up = sfs_now_ns() + 2000000000ll; /* then fork as before */

    for (;;) {
        struct tu_quiet before, after;
        bool quiet = tu_quiet_look(&before);
        int gate[2];
        pid_t pid;
        char go;

        if (!quiet && sfs_now_ns() < give_up) {
            usleep(200);
            continue;
        }
        if (pipe2(gate, O_CLOEXEC) < 0)
            return -1;
        pid = fork();
        if (pid == 0) {
            close(gate[1]);
            if (read(gate[0], &go, 1) != 1 || go != 'g')
                _exit(127); /* forked in a bad window: nothing ran here */
            close(gate[0]);
            _exit(fn(arg));
        }
        close(gate[0]);
        /* Still the same sleepers, none of which ran: the fork was clean. */
        go = pid < 0 || !quiet || (tu_quiet_look(&after) && tu_quiet_same(&before, &after))
                 ? 'g'
                 : 'x';
        if (pid > 0 && write(gate[1], &go, 1) != 1)
            go = 'x'; /* the child reads EOF and exits: reaped below */
        close(gate[1]);
        if (go == 'g' || pid < 0)
            return pid;
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
}

void tu_dump_stacks(pid_t pid)
{
    char cmd[256];

    snprintf(cmd, sizeof(cmd),
             "command -v gdb >/dev/null && flock /tmp/shardfs-tu-stacks.lock sh -c "
             "'echo \"process %d hung, the stacks of its threads:\"; timeout 60 gdb -p %d "
             "-batch -nx -q -ex \"set print thread-events off\" -ex \"thread apply all bt\"' "
             "</dev/null >&2 2>&1",
             (int)pid, (int)pid);
    if (system(cmd) != 0)
        fprintf(stderr, "process %d: no stacks (gdb missing or failed)\n", (int)pid);
}

int tu_wait(pid_t pid)
{
    int st;

    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return -1;
}

int tu_wait_for(pid_t pid, int64_t timeout_ns)
{
    int64_t end = sfs_now_ns() + timeout_ns;
    int st;

    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);

        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (r < 0 && errno != EINTR)
            return -2;
        if (sfs_now_ns() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        usleep(500);
    }
}

struct attached {
    const char *path;
    int device_id;
    int (*body)(struct sfs_cache *c, void *arg);
    void *arg;
};

static int run_attached(void *p)
{
    const struct attached *a = p;
    int err = 0, ret;
    struct sfs_cache *c = sfs_cache_attach(a->path, a->device_id, &err);

    if (!c) {
        fprintf(stderr, "child %d: attach to %s: %s\n", getpid(), a->path, strerror(-err));
        return 10;
    }
    ret = a->body(c, a->arg);
    if (ret == 0)
        sfs_cache_close(c);
    return ret;
}

pid_t tu_fork_attached(const char *path, int device_id, int (*body)(struct sfs_cache *c, void *arg),
                       void *arg)
{
    struct attached a = {.path = path, .device_id = device_id, .body = body, .arg = arg};

    return tu_fork(run_attached, &a);
}

int tu_publish(struct sfs_cache *c, const struct sfs_key *k, struct sfs_lease *l)
{
    struct sfs_cache_info info;

    sfs_cache_info(c, &info);
    tu_fill(k, sfs_cache_data(c, l), info.shard_size);
    return sfs_cache_publish(c, l, (uint32_t)info.shard_size, 0);
}

int tu_load(struct sfs_cache *c, const struct sfs_key *k)
{
    struct sfs_lease l;
    int role = sfs_cache_get(c, k, 0, 0, &l);

    if (role < 0)
        return role;
    if (role == SFS_OWNER)
        tu_publish(c, k, &l);
    sfs_cache_release(c, &l);
    return role;
}

unsigned tu_leases_on(struct sfs_cache *c, uint32_t s)
{
    unsigned n = sfs_slot_refs(&c->slots[s]);

    /* The lock-free hits' leases: in slot s's hit line, in no count. */
    for (uint32_t p = 0; p < c->max_procs && c->nhit; p++) {
        _Atomic uint32_t *t = lease_table(c, p) + hit_line_of(c, s);

        for (uint32_t k = 0; k < SFS_HIT_LINE; k++)
            n += atomic_load_explicit(&t[k], memory_order_relaxed) == s + 1;
    }
    return n;
}

unsigned tu_leases_left(struct sfs_cache *c, unsigned *entries)
{
    unsigned rc = 0, ent = 0;

    for (uint32_t s = 0; s < c->nslots; s++)
        if (tu_leases_on(c, s))
            rc++;
    _Atomic uint32_t *t = (_Atomic uint32_t *)((uint8_t *)c->ctl + c->off_leases);
    for (uint64_t i = 0; i < (uint64_t)c->max_procs * c->max_leases; i++)
        if (atomic_load_explicit(&t[i], memory_order_relaxed) != SFS_ENTRY_FREE)
            ent++;
    if (entries)
        *entries = ent;
    return rc;
}

uint64_t tu_rng_next(uint64_t *state)
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return *state * 0x2545f4914f6cdd1dull;
}

static pthread_t hold_thread;
static atomic_int reaper_held;

static void hold_other_reapers(const char *name, void *arg)
{
    (void)name;
    (void)arg;
    while (atomic_load(&reaper_held) && !pthread_equal(pthread_self(), hold_thread))
        usleep(1000);
}

void tu_hold_reaper(bool on)
{
    hold_thread = pthread_self();
    atomic_store(&reaper_held, on);
    cr_assert_eq(
        sfs_testpoint_arm("proc:reap", on ? SFS_TP_CALL : SFS_TP_OFF, hold_other_reapers, NULL), 0);
}

void tu_wait_marked_dead(struct sfs_cache *c, unsigned n)
{
    int64_t end = sfs_now_ns() + 3 * 1000 * 1000 * 1000ll;

    for (;;) {
        unsigned dead = 0;

        for (uint32_t i = 0; i < c->max_procs; i++)
            dead += atomic_load(&c->procs[i].state) == PROC_DEAD;
        if (dead >= n)
            return;
        cr_assert_lt(sfs_now_ns(), end, "the server did not see %u connection(s) close", n);
        usleep(1000);
    }
}

void tu_wait_reaped(struct sfs_cache *c, uint64_t n)
{
    int64_t end = sfs_now_ns() + 3 * 1000 * 1000 * 1000ll;
    struct sfs_stats s;

    for (;;) {
        sfs_cache_stats(c, &s);
        if (s.reaped >= n)
            return;
        cr_assert_lt(sfs_now_ns(), end, "reaped %llu of %llu", (unsigned long long)s.reaped,
                     (unsigned long long)n);
        usleep(1000);
    }
}

void tu_block_hex(uint64_t n, char out[SFS_BLOCK_HEX_LEN + 1])
{
    struct sfs_block_id id = tu_block(n);

    sfs_block_to_hex(&id, out);
}

void tu_store_path(const char *dir, uint64_t block, char *out, size_t len)
{
    char hex[SFS_BLOCK_HEX_LEN + 1];

    tu_block_hex(block, hex);
    snprintf(out, len, "%s/data/%s", dir, hex);
}

int tu_store_write(const char *dir, uint64_t first, uint64_t nblocks, uint32_t nshards,
                   uint32_t shard_size, tu_shard_fill_fn *fill, void *arg, bool sync)
{
    char path[PATH_MAX];
    uint8_t *buf = malloc(shard_size ? shard_size : 1);
    int r = 0;

    if (!buf)
        return -ENOMEM;
    snprintf(path, sizeof(path), "%s/data", dir);
    if ((mkdir(dir, 0755) < 0 && errno != EEXIST) || (mkdir(path, 0755) < 0 && errno != EEXIST)) {
        r = -errno;
        goto out;
    }
    for (uint64_t b = first; b < first + nblocks && r == 0; b++) {
        int fd;

        tu_store_path(dir, b, path, sizeof(path));
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            r = -errno;
            break;
        }
        for (uint32_t s = 0; s < nshards && r == 0; s++) {
            if (fill) {
                fill(b, s, buf, shard_size, arg);
            } else {
                struct sfs_key k = tu_key(b, s);

                tu_fill(&k, buf, shard_size);
            }
            if (pwrite(fd, buf, shard_size, (off_t)s * shard_size) != (ssize_t)shard_size)
                r = errno ? -errno : -EIO;
        }
        if (r == 0 && sync && fsync(fd) < 0)
            r = -errno;
        close(fd);
    }
out:
    free(buf);
    return r;
}
