/* SPDX-License-Identifier: MIT */
/*
 * bench_peer.c - the peer tier (docs/peer.md): a cross-namespace
 * get of resident 256 KiB pages against a raw TCP transfer of the same bytes
 * over the same veth pair in the same run, the bytes on the wire per payload
 * byte, and the hit rate of the set-associative region against an ideal LRU.
 *
 * Network: two network namespaces joined by one veth pair (10.78.0.1 and
 * .2), created here and removed at exit (ip netns del takes the veth with
 * it); traffic stays inside them. A forked child enters namespace A, fills a
 * 4-way peer region (the real peer_region.c) with the pages, and serves it
 * with the real peer server (peer_net.c) and, on another port, with a plain
 * socket server that sends the same bytes from a buffer. The parent enters
 * namespace B and reads, pass by pass, interleaved:
 *   - peer get: one READ_GET (the bucket's headers and the payload of the
 *     way naming the key, one round trip), judged by peer_slot_matches
 *     (what peer_tier.c does for a single key);
 *   - peer batch: BATCH pages a batch, pipelined on the connection
 *     (peer_conn_batch_run: what batch_get does per owner host);
 *   - peer get in two trips: READ_HDRS of the bucket, then READ_SLOT of the
 *     way that names the key (the first increment's get);
 *   - raw per page: a 64-byte request, the 256 KiB answer (one page per
 *     request, as the peer get);
 *   - raw stream: one request, all the pass's pages back to back;
 *   - the breakdown: READ_HDRS alone (the small round trip) and READ_SLOT
 *     alone (the payload round trip).
 * Wire bytes are the veth's rx+tx byte counters (/proc/net/dev in namespace
 * B) over the pass; syscalls are counted by wrapping send/recv/poll in this
 * program (the core library's calls resolve to them), per process (client,
 * server) through a shared mapping.
 *
 * Hit rate: no network; the region in-process (peer_local_get, then
 * peer_local_set on a miss) against an LRU of the same number of slots, on
 * a uniform and a Zipf(0.99) trace, per ways and load factor (distinct keys
 * / slots).
 *
 * Placement: with two CPUs or more the server's child runs on the last CPU
 * and this client on CPU 0, as two hosts each have their own: sharing one,
 * the client's copy and checksum, the server's send and the veth's softirqs
 * take turns, and which passes share one moved from run to run (a get's
 * second half 37-47 us in some runs, 107-119 in others, the raw baseline's
 * likewise). Both servers are in the child, so the peer get and the raw
 * baseline are placed alike. SFS_BENCH_PEER_NOPIN=1 leaves placement to
 * the scheduler.
 *
 * Needs root and the `ip` tool: exit 77 with a message without them.
 */
#include "bench_util.h"

#include "peer_i.h"
#include "testutil.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/random.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define PAGE      (256u << 10)
#define WAYS      4u
#define MAXPAGES  256u
#define PEER_ADDR "10.78.0.1:7101"
#define RAW_PORT  7102
/* The same region served without the members' key (the cost of the key). */
#define PEER_ADDR_NOKEY "10.78.0.1:7103"

/* The members' key: drawn before the fork, so both ends hold it. */
static uint8_t key_bytes[32];
static struct peer_key *mkey;
#define DEADLINE  5000u /* ms: generous, a loaded machine */

/* ---------------------------------------------------------------------------
 * Syscall counting: these definitions interpose on libc's for every caller
 * in this program, including the core library's peer_net.c. Counters live
 * in a shared mapping, one set per process (0 client, 1 server).
 */
struct sysctr {
    _Atomic uint64_t send, recv, poll;
};

struct shm {
    struct sysctr c[2];
    uint32_t npages;
    uint8_t resident[MAXPAGES];
};

static struct shm *sh;
static struct sysctr *ctr; /* this process's set, NULL before the fork */

/* Relaxed: counters only, read after the pass by the same or a joined
 * process at a quiet point. */
#define COUNT(f)                                                                                   \
    do {                                                                                           \
        if (ctr)                                                                                   \
            atomic_fetch_add_explicit(&ctr->f, 1, memory_order_relaxed);                           \
    } while (0)

ssize_t send(int fd, const void *buf, size_t n, int flags)
{
    COUNT(send);
    return syscall(SYS_sendto, fd, buf, n, flags, NULL, 0);
}

ssize_t recv(int fd, void *buf, size_t n, int flags)
{
    COUNT(recv);
    return syscall(SYS_recvfrom, fd, buf, n, flags, NULL, NULL);
}

ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
    COUNT(recv);
    return syscall(SYS_recvmsg, fd, m, flags);
}

int poll(struct pollfd *fds, nfds_t n, int timeout)
{
    struct timespec ts = {.tv_sec = timeout / 1000, .tv_nsec = (timeout % 1000) * 1000000l};

    COUNT(poll);
    return (int)syscall(SYS_ppoll, fds, n, timeout < 0 ? NULL : &ts, NULL, (size_t)8);
}

/* ---------------------------------------------------------------------------
 * Namespaces.
 */
static char nsA[32], nsB[32], vethB[16];
static bool ns_up;

static int sh_run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh_run(const char *fmt, ...)
{
    char cmd[1024];
    va_list ap;
    int st;

    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void ns_down(void)
{
    if (!ns_up)
        return;
    sh_run("ip netns del %s 2>/dev/null", nsA);
    sh_run("ip netns del %s 2>/dev/null", nsB);
    ns_up = false;
}

static int ns_create(void)
{
    int pid = getpid();
    char va[16];

    snprintf(nsA, sizeof(nsA), "sfbA%d", pid);
    snprintf(nsB, sizeof(nsB), "sfbB%d", pid);
    snprintf(va, sizeof(va), "sfbva%d", pid);
    snprintf(vethB, sizeof(vethB), "sfbvb%d", pid);
    ns_up = true;
    return sh_run(
        "ip netns add %s && ip netns add %s && "
        "ip link add %s type veth peer name %s && "
        "ip link set %s netns %s && ip link set %s netns %s && "
        "ip -n %s addr add 10.78.0.1/24 dev %s && ip -n %s addr add 10.78.0.2/24 dev %s && "
        "ip -n %s link set %s up && ip -n %s link set %s up && "
        "ip -n %s link set lo up && ip -n %s link set lo up",
        nsA, nsB, va, vethB, va, nsA, vethB, nsB, nsA, va, nsB, vethB, nsA, va, nsB, vethB, nsA,
        nsB);
}

static int enter_ns(const char *ns)
{
    char p[64];
    int fd, r;

    snprintf(p, sizeof(p), "/var/run/netns/%s", ns);
    fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    r = setns(fd, CLONE_NEWNET) < 0 ? -errno : 0;
    close(fd);
    return r;
}

/* rx + tx bytes of vethB, from /proc/net/dev of the current namespace. */
static uint64_t wire_bytes(void)
{
    FILE *f = fopen("/proc/net/dev", "r");
    char line[512], name[40];
    uint64_t total = 0;

    snprintf(name, sizeof(name), "%s:", vethB);
    while (f && fgets(line, sizeof(line), f)) {
        char *p = strstr(line, name);
        unsigned long long v[9];

        if (p && sscanf(p + strlen(name), "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0],
                        &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8]) == 9)
            total = v[0] + v[8];
    }
    if (f)
        fclose(f);
    return total;
}

/* ---------------------------------------------------------------------------
 * Plain blocking socket I/O (the raw baseline, both sides).
 */
static int full_send(int fd, const void *b, size_t n)
{
    return bench_full_io(fd, (void *)b, n, true);
}

static int full_recv(int fd, void *b, size_t n)
{
    return bench_full_io(fd, b, n, false);
}

struct raw_req {
    uint32_t op; /* 1: one page; 2: `count` pages from `first`; 0: bye */
    uint32_t first, count;
    uint8_t pad[52];
};
_Static_assert(sizeof(struct raw_req) == 64, "a request as big as peer_req");

static uint8_t *raw_pages; /* the server's copy: npages x PAGE */

static void *raw_conn(void *arg)
{
    int fd = (int)(intptr_t)arg;
    struct raw_req q;

    while (full_recv(fd, &q, sizeof(q)) == 0 && q.op) {
        uint32_t n = q.op == 1 ? 1 : q.count;
        int bad = 0;

        for (uint32_t i = 0; i < n && !bad; i++)
            bad = full_send(fd, raw_pages + (size_t)((q.first + i) % sh->npages) * PAGE, PAGE);
        if (bad)
            break;
    }
    close(fd);
    return NULL;
}

static void *raw_accept(void *arg)
{
    int lfd = (int)(intptr_t)arg, one = 1;

    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        pthread_t t;

        if (fd < 0)
            return NULL;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (pthread_create(&t, NULL, raw_conn, (void *)(intptr_t)fd) == 0)
            pthread_detach(t);
        else
            close(fd);
    }
}

/* ---------------------------------------------------------------------------
 * The server (child, namespace A): the region, the peer server, the raw
 * server. Writes one byte to `ready` when serving; exits when `quit` closes.
 */
/* Run this process on cpu alone (the placement above): true when it does. */
static bool pin_to(long cpu)
{
    cpu_set_t set;

    if (cpu < 0 || getenv("SFS_BENCH_PEER_NOPIN") || sysconf(_SC_NPROCESSORS_ONLN) < 2)
        return false;
    CPU_ZERO(&set);
    CPU_SET((int)cpu, &set);
    return sched_setaffinity(0, sizeof(set), &set) == 0;
}

static int server_main(int ready, int quit)
{
    struct peer_geometry g;
    struct peer_region r;
    struct peer_server *s = NULL, *s2 = NULL;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(RAW_PORT)};
    char err[256], c;
    int lfd, one = 1;
    pthread_t t;
    uint8_t *buf = malloc(PAGE);

    ctr = &sh->c[1];
    if (enter_ns(nsA) < 0 || !buf)
        return 1;
    /* num_buckets = npages: a quarter of the slots used, so every page is
     * resident (checked below, and only resident pages are read). */
    if (peer_geometry_make((uint64_t)sh->npages * WAYS * (PEER_HDR_SIZE + PAGE), WAYS, PAGE, &g) <
            0 ||
        peer_region_create(&r, &g) < 0)
        return 1;
    raw_pages = malloc((size_t)sh->npages * PAGE);
    if (!raw_pages)
        return 1;
    for (uint32_t i = 0; i < sh->npages; i++) {
        struct sfs_key k = tu_key(1000 + i, 0);
        struct peer_hash h = peer_key_hash(&k);

        tu_fill(&k, raw_pages + (size_t)i * PAGE, PAGE);
        peer_local_set(&r, &h, raw_pages + (size_t)i * PAGE, PAGE);
    }
    for (uint32_t i = 0; i < sh->npages; i++) {
        struct sfs_key k = tu_key(1000 + i, 0);
        struct peer_hash h = peer_key_hash(&k);

        sh->resident[i] = peer_local_get(&r, &h, buf, PAGE) == PEER_HIT;
    }
    if (peer_server_start(&s, &r, PEER_ADDR, mkey, err, sizeof(err)) < 0 ||
        peer_server_start(&s2, &r, PEER_ADDR_NOKEY, NULL, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_peer: peer server: %s\n", err);
        return 1;
    }
    inet_pton(AF_INET, "10.78.0.1", &a.sin_addr);
    lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(lfd, 8) < 0 ||
        pthread_create(&t, NULL, raw_accept, (void *)(intptr_t)lfd) != 0) {
        perror("bench_peer: raw server");
        return 1;
    }
    if (write(ready, "r", 1) != 1)
        return 1;
    while (read(quit, &c, 1) > 0)
        ;
    peer_server_stop(s);
    peer_server_stop(s2);
    return 0;
}

/* ---------------------------------------------------------------------------
 * The client passes (parent, namespace B).
 */
#define BATCH 16u
enum pass { P_PEER, P_NOKEY, P_RAW, P_STREAM, P_BATCH, P_PEER2, P_HDRS, P_SLOT, NPASS };
static const char *const pass_name[NPASS] = {
    "peer get, one trip (READ_GET)",
    "peer get, one trip, without the members' key",
    "raw TCP, one page per request (baseline)",
    "raw TCP, streaming (baseline)",
    "peer batch_get, 16 pages pipelined",
    "peer get, two trips (READ_HDRS + READ_SLOT)",
    "breakdown: READ_HDRS alone",
    "breakdown: READ_SLOT alone",
};

struct result {
    double gbps, wire_amp, us_per_page;
    double cli_sys, srv_sys; /* syscalls per page */
    uint64_t misses;
};

static struct peer_conn pc, pcn; /* with the members' key; without */
static int raw_fd = -1;
static uint32_t ids[MAXPAGES], nids;
static uint64_t way_of[MAXPAGES], bucket_of[MAXPAGES];
static uint8_t *cbuf;

/* One peer get of page id; 0 on a hit. */
static int peer_get(uint32_t id, bool hdrs, bool slot, bool verify)
{
    struct sfs_key k = tu_key(1000 + id, 0);
    struct peer_hash h = peer_key_hash(&k);
    struct peer_slot_hdr hd[PEER_WAYS_MAX], one;
    uint64_t after[PEER_WAYS_MAX], a2;
    uint64_t bucket = peer_bucket_of(&h, pc.g.num_buckets);
    int way = -1;

    if (hdrs) {
        if (peer_conn_read_hdrs(&pc, PEER_ADDR, DEADLINE, bucket, hd, after) < 0)
            return -1;
        for (uint32_t w = 0; w < pc.g.ways && way < 0; w++) {
            /* Relaxed: a private copy off the wire. */
            uint64_t before = atomic_load_explicit(&hd[w].seq, memory_order_relaxed);

            if (peer_slot_matches(&hd[w], before, after[w], &h, PAGE, NULL) == PEER_HIT)
                way = (int)w;
        }
        if (way < 0)
            return -1;
        bucket_of[id] = bucket;
        way_of[id] = (uint64_t)way;
    }
    if (!slot)
        return 0;
    if (peer_conn_read_slot(&pc, PEER_ADDR, DEADLINE, bucket_of[id], (uint32_t)way_of[id], PAGE,
                            &one, &a2, cbuf) < 0)
        return -1;
    /* Relaxed: a private copy. */
    if (peer_slot_matches(&one, atomic_load_explicit(&one.seq, memory_order_relaxed), a2, &h, PAGE,
                          cbuf) != PEER_HIT)
        return -1;
    return verify && tu_check(&k, cbuf, PAGE) != -1 ? -1 : 0;
}

/* One READ_GET of page id (on c, served at addr); 0 on a hit. */
static int peer_get1(struct peer_conn *c, const char *addr, uint32_t id, bool verify)
{
    struct sfs_key k = tu_key(1000 + id, 0);
    struct peer_hash h = peer_key_hash(&k);

    if (peer_conn_get(c, addr, DEADLINE, &h, PAGE, cbuf) != PEER_HIT)
        return -1;
    return verify && tu_check(&k, cbuf, PAGE) != -1 ? -1 : 0;
}

static struct peer_batch *pbatch;
static uint8_t *bbuf; /* BATCH pages */

/* Pages ids[at .. at + n) in one pipelined batch; the misses. */
static unsigned peer_batch_get(uint32_t at, uint32_t n, bool verify)
{
    struct peer_call calls[BATCH];
    static struct peer_slot_hdr hd[BATCH][PEER_WAYS_MAX];
    static uint64_t after[BATCH][PEER_WAYS_MAX];
    struct peer_hash h[BATCH];
    unsigned miss = 0;

    for (uint32_t i = 0; i < n; i++) {
        struct sfs_key k = tu_key(1000 + ids[at + i], 0);

        h[i] = peer_key_hash(&k);
        calls[i] =
            (struct peer_call){.buf = bbuf + (size_t)i * PAGE, .hdrs = hd[i], .after = after[i]};
        calls[i].q = (struct peer_req){.magic = PEER_MAGIC,
                                       .version = PEER_VERSION,
                                       .op = PEER_OP_READ_GET,
                                       .bucket = peer_bucket_of(&h[i], pc.g.num_buckets),
                                       .hash_lo = h[i].lo,
                                       .hash_hi = h[i].hi,
                                       .len = PAGE};
    }
    pbatch->c = &pc;
    pbatch->member = PEER_ADDR;
    pbatch->calls = calls;
    pbatch->n = n;
    peer_conn_batch_run(pbatch, 1, DEADLINE);
    for (uint32_t i = 0; i < n; i++) {
        struct sfs_key k = tu_key(1000 + ids[at + i], 0);

        if (peer_call_judge(&calls[i], pc.g.ways, &h[i], PAGE, calls[i].buf) != PEER_HIT ||
            (verify && tu_check(&k, calls[i].buf, PAGE) != -1))
            miss++;
    }
    return miss;
}

static int raw_get(uint32_t id, bool verify)
{
    struct raw_req q = {.op = 1, .first = id};
    struct sfs_key k = tu_key(1000 + id, 0);

    if (full_send(raw_fd, &q, sizeof(q)) < 0 || full_recv(raw_fd, cbuf, PAGE) < 0)
        return -1;
    return verify && tu_check(&k, cbuf, PAGE) != -1 ? -1 : 0;
}

/* One pass: `reps` times over the resident pages. */
static void run_pass(enum pass p, unsigned reps, bool verify, struct result *res)
{
    uint64_t w0 = wire_bytes(), pages = (uint64_t)reps * nids, miss = 0;
    uint64_t c0 = sh->c[0].send + sh->c[0].recv + sh->c[0].poll;
    uint64_t s0 = sh->c[1].send + sh->c[1].recv + sh->c[1].poll;
    int64_t t0 = bench_now_ns(), dt;

    for (unsigned r = 0; r < reps; r++) {
        if (p == P_STREAM) {
            struct raw_req q = {.op = 2, .first = 0, .count = nids};

            /* The raw server indexes all its pages; resident ones are all
             * of them in practice (checked in main). */
            if (full_send(raw_fd, &q, sizeof(q)) < 0)
                miss += nids;
            for (uint32_t i = 0; i < nids && !miss; i++) {
                struct sfs_key k = tu_key(1000 + i, 0);

                if (full_recv(raw_fd, cbuf, PAGE) < 0 || (verify && tu_check(&k, cbuf, PAGE) != -1))
                    miss++;
            }
            continue;
        }
        if (p == P_BATCH) {
            for (uint32_t i = 0; i < nids; i += BATCH)
                miss += peer_batch_get(i, nids - i < BATCH ? nids - i : BATCH, verify);
            continue;
        }
        for (uint32_t i = 0; i < nids; i++) {
            uint32_t id = ids[i];
            int e;

            switch (p) {
            case P_PEER:
                e = peer_get1(&pc, PEER_ADDR, id, verify);
                break;
            case P_NOKEY:
                e = peer_get1(&pcn, PEER_ADDR_NOKEY, id, verify);
                break;
            case P_PEER2:
                e = peer_get(id, true, true, verify);
                break;
            case P_RAW:
                e = raw_get(id, verify);
                break;
            case P_HDRS:
                e = peer_get(id, true, false, false);
                break;
            default:
                e = peer_get(id, false, true, verify);
                break;
            }
            miss += e != 0;
        }
    }
    dt = bench_now_ns() - t0;
    res->us_per_page = (double)dt / 1e3 / (double)pages;
    res->gbps = (double)pages * PAGE / (double)dt;
    res->wire_amp = (double)(wire_bytes() - w0) / ((double)pages * PAGE);
    res->cli_sys = (double)(sh->c[0].send + sh->c[0].recv + sh->c[0].poll - c0) / (double)pages;
    res->srv_sys = (double)(sh->c[1].send + sh->c[1].recv + sh->c[1].poll - s0) / (double)pages;
    res->misses = miss;
}

/* ---------------------------------------------------------------------------
 * Hit rate: the region in-process against an ideal LRU.
 */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A trace of n accesses over k keys: uniform, or Zipf(0.99) with key 0 the
 * most popular (a permutation makes the hot keys land anywhere). */
static void make_trace(uint32_t *t, size_t n, uint32_t k, bool zipf)
{
    double *cdf = NULL, sum = 0;
    uint32_t *perm = malloc(sizeof(*perm) * k);

    for (uint32_t i = 0; i < k; i++)
        perm[i] = i;
    for (uint32_t i = k - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(rng() % (i + 1)), x = perm[i];

        perm[i] = perm[j];
        perm[j] = x;
    }
    if (zipf) {
        cdf = malloc(sizeof(*cdf) * k);
        for (uint32_t i = 0; i < k; i++)
            cdf[i] = (sum += 1.0 / pow(i + 1.0, 0.99));
    }
    for (size_t i = 0; i < n; i++) {
        if (!zipf) {
            t[i] = (uint32_t)(rng() % k);
            continue;
        }
        double u = (double)(rng() >> 11) / 9007199254740992.0 * sum;
        uint32_t lo = 0, hi = k - 1;

        while (lo < hi) {
            uint32_t mid = (lo + hi) / 2;

            if (cdf[mid] < u)
                lo = mid + 1;
            else
                hi = mid;
        }
        t[i] = perm[lo];
    }
    free(cdf);
    free(perm);
}

/* Hits of an LRU of `cap` entries over the trace, counted after `warm`. */
static double lru_rate(const uint32_t *t, size_t n, size_t warm, uint32_t k, uint32_t cap)
{
    int32_t *prev = malloc(sizeof(int32_t) * k), *next = malloc(sizeof(int32_t) * k);
    uint8_t *in = calloc(k, 1);
    int32_t head = -1, tail = -1;
    uint32_t size = 0;
    uint64_t hits = 0;

    for (size_t i = 0; i < n; i++) {
        int32_t x = (int32_t)t[i];

        if (in[x]) {
            hits += i >= warm;
            if (head == x)
                continue;
            /* unlink */
            next[prev[x]] = next[x];
            if (next[x] >= 0)
                prev[next[x]] = prev[x];
            else
                tail = prev[x];
        } else {
            if (size == cap) {
                int32_t v = tail;

                in[v] = 0;
                tail = prev[v];
                if (tail >= 0)
                    next[tail] = -1;
                else
                    head = -1;
                size--;
            }
            in[x] = 1;
            size++;
        }
        prev[x] = -1;
        next[x] = head;
        if (head >= 0)
            prev[head] = x;
        head = x;
        if (tail < 0)
            tail = x;
    }
    free(prev);
    free(next);
    free(in);
    return (double)hits / (double)(n - warm);
}

static double region_rate(const uint32_t *t, size_t n, size_t warm, const struct peer_hash *hs,
                          uint32_t slots, uint32_t ways)
{
    struct peer_geometry g;
    struct peer_region r;
    uint64_t hits = 0, v;

    if (peer_geometry_make((uint64_t)slots * (PEER_HDR_SIZE + 64), ways, 64, &g) < 0 ||
        peer_region_create(&r, &g) < 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        const struct peer_hash *h = &hs[t[i]];

        if (peer_local_get(&r, h, NULL, 8) == PEER_HIT) {
            hits += i >= warm;
        } else {
            v = t[i];
            peer_local_set(&r, h, &v, 8);
        }
    }
    peer_region_destroy(&r);
    return (double)hits / (double)(n - warm);
}

static void hitrate(struct bench *b)
{
    static const uint32_t wayv[] = {1, 2, 4, 8, 16};
    static const double loadv[] = {0.5, 1, 2, 4};
    const uint32_t slots = b->quick ? 1024 : 8192;
    const unsigned mult = b->quick ? 4 : 16;

    fprintf(b->out,
            "\n**Hit rate vs ways and load factor** (no network; %u slots; load = distinct "
            "keys / slots; %ux keys accesses after a warm-up of 4x keys; a miss inserts; the "
            "region evicts the oldest *write* in the bucket, so its figure is FIFO per bucket "
            "against a true LRU of the same %u entries):\n\n",
            slots, mult, slots);
    fprintf(b->out, "| trace | load | ideal LRU |");
    for (size_t w = 0; w < sizeof(wayv) / sizeof(wayv[0]); w++)
        fprintf(b->out, " %u way%s |", wayv[w], wayv[w] > 1 ? "s" : "");
    fprintf(b->out, "\n|---|---|---|");
    for (size_t w = 0; w < sizeof(wayv) / sizeof(wayv[0]); w++)
        fprintf(b->out, "---|");
    fprintf(b->out, "\n");
    for (int z = 0; z < 2; z++) {
        for (size_t l = 0; l < sizeof(loadv) / sizeof(loadv[0]); l++) {
            uint32_t k = (uint32_t)(loadv[l] * slots);
            size_t warm = 4 * (size_t)k, n = warm + (size_t)mult * k;
            uint32_t *t = malloc(sizeof(*t) * n);
            struct peer_hash *hs = malloc(sizeof(*hs) * k);

            for (uint32_t i = 0; i < k; i++) {
                struct sfs_key key = tu_key(5000000 + i, 0);

                hs[i] = peer_key_hash(&key);
            }
            make_trace(t, n, k, z);
            fprintf(b->out, "| %s | %.1f | %.3f |", z ? "Zipf 0.99" : "uniform", loadv[l],
                    lru_rate(t, n, warm, k, slots));
            for (size_t w = 0; w < sizeof(wayv) / sizeof(wayv[0]); w++)
                fprintf(b->out, " %.3f |", region_rate(t, n, warm, hs, slots, wayv[w]));
            fprintf(b->out, "\n");
            free(t);
            free(hs);
        }
    }
}

/* ---------------------------------------------------------------------------
 */
static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    struct bench b;
    int rc = bench_init(&b, "bench_peer", argc, argv), ready[2], quit[2], st = 0;
    bool pinned = false;
    const unsigned rounds = b.quick ? 2 : 11, reps = b.quick ? 1 : 4;
    const uint32_t npages = b.quick ? 16 : 64;
    struct result res[NPASS][16];
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(RAW_PORT)};
    int one = 1;
    pid_t pid;

    if (rc)
        return rc;
    if (geteuid() != 0) {
        fprintf(stderr, "bench_peer: skipped: needs root (network namespaces, veth pair)\n");
        return 77;
    }
    if (sh_run("command -v ip >/dev/null 2>&1") != 0) {
        fprintf(stderr, "bench_peer: skipped: the `ip` tool (iproute2) is missing\n");
        return 77;
    }
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cbuf = malloc(PAGE);
    bbuf = malloc((size_t)BATCH * PAGE);
    pbatch = malloc(sizeof(*pbatch));
    if (sh == MAP_FAILED || !cbuf || !bbuf || !pbatch)
        return 1;
    sh->npages = npages;
    if (ns_create() != 0) {
        ns_down();
        fprintf(stderr, "bench_peer: skipped: cannot create network namespaces and a veth pair\n");
        return 77;
    }
    if (pipe2(ready, O_CLOEXEC) < 0 || pipe2(quit, O_CLOEXEC) < 0)
        return 1;
    if (getrandom(key_bytes, sizeof(key_bytes), 0) != (ssize_t)sizeof(key_bytes) ||
        peer_key_from(key_bytes, sizeof(key_bytes), &mkey) < 0)
        return 1;
    fflush(NULL);
    pid = fork();
    if (pid == 0) {
        close(ready[0]);
        close(quit[1]);
        pin_to(sysconf(_SC_NPROCESSORS_ONLN) - 1);
        _exit(server_main(ready[1], quit[0]));
    }
    pinned = pin_to(0);
    close(ready[1]);
    close(quit[0]);
    {
        char c;

        if (pid < 0 || read(ready[0], &c, 1) != 1) {
            fprintf(stderr, "bench_peer: the server did not start\n");
            rc = 1;
            goto out;
        }
    }
    ctr = &sh->c[0];
    if (enter_ns(nsB) < 0) {
        rc = 1;
        goto out;
    }
    for (uint32_t i = 0; i < npages; i++)
        if (sh->resident[i])
            ids[nids++] = i;
    peer_conn_init(&pc);
    pc.key = mkey;
    peer_conn_init(&pcn);
    inet_pton(AF_INET, "10.78.0.1", &a.sin_addr);
    raw_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (peer_conn_open(&pc, PEER_ADDR, DEADLINE) < 0 ||
        peer_conn_open(&pcn, PEER_ADDR_NOKEY, DEADLINE) < 0 || raw_fd < 0 ||
        connect(raw_fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        fprintf(stderr, "bench_peer: cannot connect to the servers\n");
        rc = 1;
        goto out;
    }
    setsockopt(raw_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

    /* Warm-up, every byte checked (the stream needs all pages resident). */
    {
        struct result w;

        if (nids != npages)
            fprintf(stderr, "bench_peer: %u of %u pages resident\n", nids, npages);
        for (int p = 0; p < NPASS; p++) {
            run_pass((enum pass)p, 1, true, &w);
            if (w.misses) {
                fprintf(stderr, "bench_peer: %s: %llu pages missed or wrong\n", pass_name[p],
                        (unsigned long long)w.misses);
                rc = 1;
                goto out;
            }
        }
    }
    /* Rounds: the passes interleaved, rotated so noise hits all alike. */
    for (unsigned r = 0; r < rounds; r++)
        for (int i = 0; i < NPASS; i++) {
            int p = (i + (int)r) % NPASS;

            run_pass((enum pass)p, reps, false, &res[p][r]);
            if (res[p][r].misses) {
                fprintf(stderr, "bench_peer: %s: misses\n", pass_name[p]);
                rc = 1;
                goto out;
            }
        }

    {
        double v[16], med[NPASS][5], rr[16], rs[16], r2[16], rb[16], rk[16], dk[16];

        for (int p = 0; p < NPASS; p++) {
            for (unsigned r = 0; r < rounds; r++)
                v[r] = res[p][r].gbps;
            med[p][0] = bench_median(v, rounds);
            for (unsigned r = 0; r < rounds; r++)
                v[r] = res[p][r].us_per_page;
            med[p][1] = bench_median(v, rounds);
            for (unsigned r = 0; r < rounds; r++)
                v[r] = res[p][r].wire_amp;
            med[p][2] = bench_median(v, rounds);
            for (unsigned r = 0; r < rounds; r++)
                v[r] = res[p][r].cli_sys;
            med[p][3] = bench_median(v, rounds);
            for (unsigned r = 0; r < rounds; r++)
                v[r] = res[p][r].srv_sys;
            med[p][4] = bench_median(v, rounds);
        }
        for (unsigned r = 0; r < rounds; r++) {
            rr[r] = res[P_PEER][r].gbps / res[P_RAW][r].gbps;
            rs[r] = res[P_PEER][r].gbps / res[P_STREAM][r].gbps;
            r2[r] = res[P_PEER2][r].gbps / res[P_RAW][r].gbps;
            rb[r] = res[P_BATCH][r].gbps / res[P_STREAM][r].gbps;
            rk[r] = res[P_PEER][r].us_per_page / res[P_NOKEY][r].us_per_page;
            dk[r] = res[P_PEER][r].us_per_page - res[P_NOKEY][r].us_per_page;
        }
        qsort(rk, rounds, sizeof(double), cmp_dbl);
        qsort(dk, rounds, sizeof(double), cmp_dbl);
        qsort(rr, rounds, sizeof(double), cmp_dbl);
        qsort(rs, rounds, sizeof(double), cmp_dbl);
        qsort(r2, rounds, sizeof(double), cmp_dbl);
        qsort(rb, rounds, sizeof(double), cmp_dbl);

        bench_stamp(&b);
        fprintf(b.out,
                "Peer get of resident 256 KiB pages across two network namespaces (one veth "
                "pair), against a plain socket server in the same namespace sending the same "
                "bytes, same run; %u pages x %u per pass, %u rounds interleaved; medians. Wire "
                "= the veth's rx+tx bytes (Ethernet, IP and TCP headers included) / payload "
                "bytes. Syscalls = send + recv + poll per page. %s\n\n",
                nids, reps, rounds,
                pinned ? "The client on CPU 0, both servers on the last CPU, as two hosts."
                       : "Placement left to the scheduler (SFS_BENCH_PEER_NOPIN, or one CPU).");
        fprintf(b.out, "| pass | GB/s | us/page | wire amplification | client syscalls/page | "
                       "server syscalls/page |\n|---|---|---|---|---|---|\n");
        for (int p = 0; p < NPASS; p++)
            fprintf(b.out, "| %s | %.2f | %.1f | %.4f | %.1f | %.1f |\n", pass_name[p], med[p][0],
                    med[p][1], med[p][2], med[p][3], med[p][4]);
        fprintf(b.out,
                "\n**Peer get (one trip) / raw TCP one page per request: %.2fx** (median of "
                "per-round ratios; min %.2f, max %.2f; target >= 0.8x); the two-trip get of the "
                "first increment in the same rounds: %.2fx (min %.2f, max %.2f). Peer get / raw "
                "streaming: %.2fx (min %.2f, max %.2f). **Peer batch_get (16 pages) / raw "
                "streaming: %.2fx** (min %.2f, max %.2f).\n\n",
                bench_median(rr, rounds), rr[0], rr[rounds - 1], bench_median(r2, rounds), r2[0],
                r2[rounds - 1], bench_median(rs, rounds), rs[0], rs[rounds - 1],
                bench_median(rb, rounds), rb[0], rb[rounds - 1]);
        fprintf(b.out,
                "**The members' key** (a tag on every request, checked by the server before it "
                "serves it): a get with it / the same get without it, same rounds: **%.3fx** "
                "(median of per-round ratios; min %.3f, max %.3f; target <= 1.10x), %+.1f us a "
                "page (min %+.1f, max %+.1f).\n\n",
                bench_median(rk, rounds), rk[0], rk[rounds - 1], bench_median(dk, rounds), dk[0],
                dk[rounds - 1]);
        fprintf(b.out,
                "**Read amplification, 4 ways**: %.4f on the wire for a peer get (target <= "
                "1.1), against %.4f for the raw per-page transfer of the same bytes (the "
                "transport's own floor); the protocol's own bytes: (64 request + 16 "
                "answer + 4 x 72 headers + 72 + 262144) / 262144 = %.4f.\n",
                med[P_PEER][2], med[P_RAW][2], (64.0 + 16 + WAYS * 72 + 72 + PAGE) / (double)PAGE);
        /* The CPU a get adds to a plain transfer, per page, timed here: the
         * server's memset + seqlock copy into its send buffer, the client's
         * payload checksum (peer_slot_matches). */
        {
            uint8_t *x = malloc(PAGE);
            const int n = b.quick ? 20 : 200;
            volatile uint64_t sink = 0;
            int64_t t0;
            double cp, ck, tq, tw;

            if (x) {
                memset(x, 1, PAGE);
                t0 = bench_now_ns();
                for (int i = 0; i < n; i++) {
                    memset(cbuf, 0, PAGE);
                    memcpy(cbuf, x, PAGE);
                    sink += cbuf[i];
                }
                cp = (double)(bench_now_ns() - t0) / 1e3 / n;
                t0 = bench_now_ns();
                for (int i = 0; i < n; i++)
                    sink += peer_checksum(cbuf, PAGE);
                ck = (double)(bench_now_ns() - t0) / 1e3 / n;
                /* The tag of a request (64 bytes), and of a write (its
                 * 256 KiB payload too), each made once and checked once. */
                {
                    struct peer_sess sc = {0}, ss = {0};
                    uint8_t hw[PEER_HELLO_WIRE] = {0}, msg[PEER_AUTH_WIRE], pe[PEER_PROOF],
                            pr[PEER_PROOF], img[PEER_REQ_WIRE] = {0}, tag[PEER_TAG];

                    peer_auth_client(mkey, hw, sizeof(hw), msg, pe, &sc);
                    peer_auth_server(mkey, hw, sizeof(hw), msg, pr, &ss);
                    t0 = bench_now_ns();
                    for (int i = 0; i < n * 10; i++) {
                        peer_req_tag(&sc, img, NULL, 0, tag);
                        sink += peer_req_tag_ok(&ss, img, NULL, 0, tag);
                    }
                    tq = (double)(bench_now_ns() - t0) / 1e3 / (n * 10);
                    t0 = bench_now_ns();
                    for (int i = 0; i < n; i++) {
                        peer_req_tag(&sc, img, x, PAGE, tag);
                        sink += peer_req_tag_ok(&ss, img, x, PAGE, tag);
                    }
                    tw = (double)(bench_now_ns() - t0) / 1e3 / n;
                    peer_sess_end(&sc);
                    peer_sess_end(&ss);
                }
                fprintf(b.out,
                        "\n**Where a get's time goes** (per page): the READ_HDRS round trip "
                        "%.1f us (%.1f client syscalls: a poll + recv per header and per seq); "
                        "then READ_SLOT %.1f us (%.1f client syscalls) vs the raw request %.1f us "
                        "(%.1f). READ_SLOT does CPU work the raw path does not: the server's "
                        "memset + seqlock copy of the payload into its send buffer, %.1f us, "
                        "and the client's payload checksum, %.1f us (both timed in this "
                        "process on a 256 KiB page). The two-trip get is both in series; "
                        "READ_GET is one. The members' key adds to a get its request's tag, "
                        "made by the client and checked by the server: %.2f us both together; "
                        "to a 256 KiB write, %.1f us (HMAC-SHA256 over the payload, once each "
                        "end).\n",
                        med[P_HDRS][1], med[P_HDRS][3], med[P_SLOT][1], med[P_SLOT][3],
                        med[P_RAW][1], med[P_RAW][3], cp, ck, tq, tw);
                free(x);
            }
            (void)sink;
        }
    }
    hitrate(&b);

out:
    if (raw_fd >= 0)
        close(raw_fd);
    if (pc.fd >= 0)
        peer_conn_close(&pc);
    free(bbuf);
    free(pbatch);
    close(quit[1]);
    if (pid > 0)
        waitpid(pid, &st, 0);
    ns_down();
    if (rc == 0 && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
        fprintf(stderr, "bench_peer: the server exited with status %d\n", st);
        rc = 1;
    }
    if (rc)
        return rc;
    return bench_finish(&b);
}
