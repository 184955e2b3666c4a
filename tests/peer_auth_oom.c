/* SPDX-License-Identifier: MIT */
/*
 * peer_auth_oom.c - the peer tier's key, handshake and tags
 * (core/peer/peer_auth.c) with the crypto library out of memory at each of
 * its allocations in turn: every step answers -ENOMEM (the key file with
 * its reason), never crashes, never makes a session or a proof of a step
 * that failed, and goes through once nothing fails.
 *
 * A plain program, not a Criterion one: the crypto library takes an
 * allocator only before its first allocation, and Criterion's own
 * libraries make one at start.
 */
#include "peer_auth_i.h"

#include <openssl/crypto.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The crypto library's allocations from the count's reset on: the
 * fail_at-th and every one after it fail (fail_at < 0: none). */
static long fail_at = -1, allocs;

static void *oom_malloc(size_t n, const char *file, int line)
{
    (void)file;
    (void)line;
    if (fail_at >= 0 && allocs++ >= fail_at)
        return NULL;
    return malloc(n);
}

static void *oom_realloc(void *p, size_t n, const char *file, int line)
{
    (void)file;
    (void)line;
    if (fail_at >= 0 && allocs++ >= fail_at)
        return NULL;
    return realloc(p, n);
}

static void oom_free(void *p, const char *file, int line)
{
    (void)file;
    (void)line;
    free(p);
}

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "peer_auth_oom: %s:%d: ", __FILE__, __LINE__);                         \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

enum { STEP_KEY, STEP_LOAD, STEP_CLIENT, STEP_SERVER, STEP_TAG, STEP_TAG_OK, STEPS };

int main(void)
{
    uint8_t hw[72] = {1}, msg[PEER_AUTH_WIRE], want[PEER_PROOF], proof[PEER_PROOF];
    uint8_t img[64] = {2}, tag[PEER_TAG], big[100];
    char path[128], err[256];
    struct peer_key *k = NULL, *x = NULL;
    struct peer_sess cs = {0}, ss = {0};
    int fd;

    if (!CRYPTO_set_mem_functions(oom_malloc, oom_realloc, oom_free)) {
        fprintf(stderr, "peer_auth_oom: the crypto library allocated before main\n");
        return 1;
    }
    /* A key longer than SHA-256's block (hashed first), in a file too. */
    memset(big, 0x33, sizeof(big));
    snprintf(path, sizeof(path), "/tmp/sfs-test-%d-oom-key", getpid());
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, big, sizeof(big)) != (ssize_t)sizeof(big)) {
        perror(path);
        return 1;
    }
    close(fd);
    /* Once through with nothing failing: the library's one-time set-up. */
    CHECK(peer_key_from(big, sizeof(big), &k) == 0, "the key");
    CHECK(k && peer_auth_client(k, hw, sizeof(hw), msg, want, &cs) == 0, "the client's side");
    CHECK(k && peer_auth_server(k, hw, sizeof(hw), msg, proof, &ss) == 0, "the server's side");
    CHECK(peer_proof_equal(want, proof), "the proofs differ");
    CHECK(peer_req_tag(&cs, img, NULL, 0, tag) == 0, "a tag");
    peer_sess_end(&cs);
    peer_sess_end(&ss);
    if (failures) {
        unlink(path);
        return 1;
    }
    for (int step = 0; step < STEPS; step++) {
        long n;

        for (n = 0; n < 1000; n++) {
            int ret;

            err[0] = '\0';
            allocs = 0;
            fail_at = n;
            switch (step) {
            case STEP_KEY:
                ret = peer_key_from(big, sizeof(big), &x);
                break;
            case STEP_LOAD:
                ret = peer_key_load(path, &x, err, sizeof(err));
                break;
            case STEP_CLIENT:
                ret = peer_auth_client(k, hw, sizeof(hw), msg, want, &cs);
                break;
            case STEP_SERVER:
                ret = peer_auth_server(k, hw, sizeof(hw), msg, proof, &ss);
                break;
            case STEP_TAG: /* a write's tag: over its image and its payload */
                fail_at = -1;
                ret = peer_auth_client(k, hw, sizeof(hw), msg, want, &cs);
                allocs = 0;
                fail_at = n;
                if (ret == 0)
                    ret = peer_req_tag(&cs, img, big, sizeof(big), tag);
                break;
            default: /* the server's check of that tag: a refusal (-ENOMEM
                      * here), never a pass */
                fail_at = -1;
                ret = peer_auth_client(k, hw, sizeof(hw), msg, want, &cs);
                if (ret == 0)
                    ret = peer_auth_server(k, hw, sizeof(hw), msg, proof, &ss);
                if (ret == 0)
                    ret = peer_req_tag(&cs, img, big, sizeof(big), tag);
                allocs = 0;
                fail_at = n;
                if (ret == 0)
                    ret = peer_req_tag_ok(&ss, img, big, sizeof(big), tag) ? 0 : -ENOMEM;
                break;
            }
            fail_at = -1;
            if (allocs <= n) { /* nothing failed */
                CHECK(ret == 0, "step %d: %d with nothing failing", step, ret);
                CHECK(step != STEP_SERVER || peer_proof_equal(proof, want), "step %d: proof", step);
                break;
            }
            CHECK(ret == -ENOMEM, "step %d, allocation %ld failing: %d", step, n, ret);
            CHECK(!x, "step %d, allocation %ld: a key made of a failure", step, n);
            CHECK(step != STEP_LOAD || strstr(err, strerror(ENOMEM)), "step %d: '%s'", step, err);
            CHECK(step != STEP_CLIENT || !cs.on, "step %d: a session of a failed handshake", step);
            CHECK(step != STEP_SERVER || !ss.on, "step %d: a session of a failed handshake", step);
            peer_sess_end(&cs);
            peer_sess_end(&ss);
        }
        CHECK(n > 0 && n < 1000, "step %d: %ld allocations", step, n);
        peer_key_free(x);
        x = NULL;
        peer_sess_end(&cs);
        peer_sess_end(&ss);
    }
    peer_key_free(k);
    unlink(path);
    if (failures)
        return 1;
    printf("peer_auth_oom: every step -ENOMEM at each allocation, through with none\n");
    return 0;
}
