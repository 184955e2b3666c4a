/* SPDX-License-Identifier: MIT */
/*
 * bench_peer_lo.c - the peer tier's single get of a resident 256 KiB page
 * (docs/peer.md) against raw TCP moving the same bytes, over
 * 127.0.0.1 in one process, with the CPU time each spends beside the wall
 * time.
 *
 * bench_peer measures the same comparison across two network namespaces and
 * needs root; its per-run ratio swings by about 0.2 on the shared 2-core
 * machine, too much to resolve a change of a tenth of a get's CPU. Here the
 * real peer server (peer_server.c) and a plain socket server run as threads
 * of this process, the client in the main thread, and each round times 64
 * peer gets (peer_conn_get: READ_GET, the checksum, the gate) and 64 raw
 * transfers of the same pages back to back, alternating which goes first.
 * CPU is the process's (client, both servers, and the softirqs that land
 * on them), so a busy neighbour's time is not counted. No root needed.
 */
#include "bench_util.h"

#include "peer_i.h"
#include "testutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/socket.h>

#define PAGE   (256u << 10)
#define NPAGES 64u
#define WAYS   4u
#define ROUNDS 21u

static uint8_t *pages; /* the raw server's copy, NPAGES x PAGE */

/* One connection: a 64-byte request naming a page, the page back. */
static void *raw_main(void *arg)
{
    int lfd = (int)(intptr_t)arg, one = 1, fd = accept(lfd, NULL, NULL);
    uint32_t q[16];

    if (fd < 0)
        return NULL;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    while (bench_full_io(fd, q, sizeof(q), false) == 0 && q[0] < NPAGES)
        if (bench_full_io(fd, pages + (size_t)q[0] * PAGE, PAGE, true) < 0)
            break;
    close(fd);
    return NULL;
}

/* A listening socket on 127.0.0.1 and an ephemeral port; its port in *port. */
static int listen_lo(unsigned *port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 4) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &l) < 0)
        return -1;
    *port = ntohs(a.sin_port);
    return fd;
}

int main(int argc, char **argv)
{
    struct bench b;
    int rc = bench_init(&b, "bench_peer_lo", argc, argv), lfd, rfd, one = 1;
    const unsigned rounds = b.quick ? 3 : ROUNDS;
    double pw[ROUNDS], pc[ROUNDS], rw[ROUNDS], rcpu[ROUNDS], ratio[ROUNDS], cratio[ROUNDS];
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct peer_server *s = NULL;
    struct peer_geometry g;
    struct peer_region r;
    struct peer_conn c;
    struct peer_hash h[NPAGES];
    char addr[64], err[256];
    unsigned port;
    pthread_t t;
    uint8_t *buf;

    if (rc)
        return rc;
    pages = malloc((size_t)NPAGES * PAGE);
    buf = malloc(PAGE);
    if (!pages || !buf ||
        peer_geometry_make((uint64_t)NPAGES * WAYS * (PEER_HDR_SIZE + PAGE), WAYS, PAGE, &g) < 0 ||
        peer_region_create(&r, &g) < 0)
        return 1;
    /* num_buckets = NPAGES: a quarter of the slots used, every page kept. */
    for (uint32_t i = 0; i < NPAGES; i++) {
        struct sfs_key k = tu_key(2000 + i, 0);

        h[i] = peer_key_hash(&k);
        tu_fill(&k, pages + (size_t)i * PAGE, PAGE);
        if (peer_local_set(&r, &h[i], pages + (size_t)i * PAGE, PAGE) < 0)
            return 1;
    }
    /* The peer server on a port of its own (it binds what it is given). */
    lfd = listen_lo(&port);
    if (lfd < 0)
        return 1;
    close(lfd);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
    if (peer_server_start(&s, &r, addr, NULL, err, sizeof(err)) < 0) {
        fprintf(stderr, "bench_peer_lo: %s\n", err);
        return 1;
    }
    lfd = listen_lo(&port);
    a.sin_port = htons((uint16_t)port);
    rfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 || rfd < 0 || pthread_create(&t, NULL, raw_main, (void *)(intptr_t)lfd) != 0 ||
        connect(rfd, (struct sockaddr *)&a, sizeof(a)) < 0)
        return 1;
    setsockopt(rfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    peer_conn_init(&c);

    /* Two warm-up rounds, every byte checked; then the timed ones. */
    for (unsigned k = 0; k < rounds + 2; k++) {
        int64_t w[3], u[3];

        /* Each half: NPAGES calls of one kind, peer first in even rounds. */
        for (int half = 0; half < 2; half++) {
            bool peer = (half == 0) == (k % 2 == 0);

            w[half] = bench_now_ns();
            u[half] = bench_process_cpu_ns();
            for (uint32_t i = 0; i < NPAGES; i++) {
                struct sfs_key key = tu_key(2000 + i, 0);
                uint32_t q[16] = {i};

                if (peer ? peer_conn_get(&c, addr, 5000, &h[i], PAGE, buf) != PEER_HIT
                         : bench_full_io(rfd, q, sizeof(q), true) < 0 ||
                               bench_full_io(rfd, buf, PAGE, false) < 0) {
                    fprintf(stderr, "bench_peer_lo: %s: page %u missed\n", peer ? "peer" : "raw",
                            i);
                    return 1;
                }
                if (k < 2 && tu_check(&key, buf, PAGE) != -1) {
                    fprintf(stderr, "bench_peer_lo: page %u: wrong bytes\n", i);
                    return 1;
                }
            }
            w[half + 1] = bench_now_ns();
            u[half + 1] = bench_process_cpu_ns();
            if (k >= 2) {
                double *wv = peer ? pw : rw, *uv = peer ? pc : rcpu;

                wv[k - 2] = (double)(w[half + 1] - w[half]) / 1e3 / NPAGES;
                uv[k - 2] = (double)(u[half + 1] - u[half]) / 1e3 / NPAGES;
            }
        }
        if (k >= 2) {
            ratio[k - 2] = rw[k - 2] / pw[k - 2];
            cratio[k - 2] = rcpu[k - 2] / pc[k - 2];
        }
    }

    bench_stamp(&b);
    fprintf(b.out,
            "Peer get (READ_GET, checksum, gate) of resident 256 KiB pages against raw TCP "
            "moving the same bytes, over 127.0.0.1 in one process (servers as threads); %u "
            "rounds of %u pages each way, alternating which goes first; medians. CPU = the "
            "process's (client, servers, the softirqs on them) per page.\n\n",
            rounds, NPAGES);
    fprintf(b.out, "| pass | us/page | CPU us/page |\n|---|---|---|\n");
    fprintf(b.out, "| peer get, one trip (READ_GET) | %.1f | %.1f |\n", bench_median(pw, rounds),
            bench_median(pc, rounds));
    fprintf(b.out, "| raw TCP, one page per request (baseline) | %.1f | %.1f |\n",
            bench_median(rw, rounds), bench_median(rcpu, rounds));
    {
        double med = bench_median(ratio, rounds), cmed = bench_median(cratio, rounds);
        double lo = ratio[0], hi = ratio[0];

        for (unsigned i = 1; i < rounds; i++) {
            lo = ratio[i] < lo ? ratio[i] : lo;
            hi = ratio[i] > hi ? ratio[i] : hi;
        }
        fprintf(b.out,
                "\n**Peer get / raw TCP per page: %.2fx** (raw time / peer time, median of "
                "per-round ratios; min %.2f, max %.2f; target >= 0.8x); in CPU: %.2fx.\n",
                med, lo, hi, cmed);
    }
    fprintf(b.out, "\nCommand: `build/tests/bench/bench_peer_lo --md docs/PERFORMANCE.md`\n");

    close(rfd);
    pthread_join(t, NULL);
    close(lfd);
    peer_conn_close(&c);
    peer_server_stop(s);
    peer_region_destroy(&r);
    free(buf);
    free(pages);
    return bench_finish(&b);
}
