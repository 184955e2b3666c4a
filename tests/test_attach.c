/* SPDX-License-Identifier: MIT */
/*
 * test_attach.c - handing the cache to other processes, and refusing what
 * should be refused.
 *
 * Good attaches come from forked children (a data rank and a query-only
 * scheduler). Bad input comes in two kinds: on the socket (garbage, a short
 * hello, a hello of another format or protocol, a silent client, bytes
 * after the hello), where the client must be refused or detached and the
 * server must keep serving; and in the region itself (another format word, a
 * bad magic, each geometry field out of bounds or out of step, a truncated
 * memfd, an index out of range), where attach or the operation must return
 * an error, never crash. An attach by descriptors takes every descriptor it
 * is given, on success and on failure; a child forked by an attached
 * process does not keep its parent's attachment.
 */
#include "attach_wire.h"
#include "testutil.h"
#include "cache_i.h" /* the header and the control memfd of a handle */
#include "slot_i.h"  /* bucket_of: a key of a given bucket */

#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define SHARD 4096u

static struct sfs_cache *served(const char **path)
{
    struct sfs_cache *c = tu_cache(8, 0, SHARD);

    cr_assert_not_null(c);
    *path = tu_path("attach");
    cr_assert_eq(sfs_cache_serve(c, *path), 0);
    return c;
}

/* ---------------------------------------------------------------------------
 * Good attaches.
 */
struct child {
    struct sfs_key have, absent, write;
};

/* Attached as device 3. */
static int data_child(struct sfs_cache *c, void *arg)
{
    struct child *a = arg;
    struct sfs_cache_info info;
    struct sfs_lease l;
    size_t len = 0;

    sfs_cache_info(c, &info);
    TU_CK(!info.query_only);
    TU_CK(info.nslots == 8 && info.shard_size == SHARD);
    TU_CK(sfs_cache_segment(c, 0, &len) != NULL && len >= SHARD);
    TU_CK(sfs_cache_get(c, &a->have, 0, 0, &l) == SFS_HIT);
    TU_CK(sfs_cache_data(c, &l) != NULL);
    TU_CK(tu_check(&a->have, sfs_cache_data(c, &l), SHARD) == -1);
    TU_CK(sfs_cache_release(c, &l) == 0);
    /* Bytes written here are the parent's bytes too. */
    TU_CK(sfs_cache_get(c, &a->write, 0, 0, &l) == SFS_OWNER);
    TU_CK(tu_publish(c, &a->write, &l) == 0);
    TU_CK(sfs_cache_release(c, &l) == 0);
    return 0;
}

Test(attach, data_rank_shares_bytes, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    struct child a = {.have = tu_key(1, 0), .write = tu_key(2, 0)};
    struct sfs_lease l;

    cr_assert_eq(tu_load(c, &a.have), SFS_OWNER);
    cr_assert_eq(tu_wait(tu_fork_attached(path, 3, data_child, &a)), 0);
    cr_assert_eq(sfs_cache_get(c, &a.write, 0, 0, &l), SFS_HIT);
    cr_assert_eq(tu_check(&a.write, sfs_cache_data(c, &l), SHARD), -1,
                 "the child's bytes are not in the parent's mapping");
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    sfs_cache_close(c);
}

/* Attached query-only (device -1). */
static int query_child(struct sfs_cache *c, void *arg)
{
    struct child *a = arg;
    struct sfs_cache_info info;
    struct sfs_lease l;

    sfs_cache_info(c, &info);
    TU_CK(info.query_only);
    TU_CK(sfs_cache_segment(c, 0, NULL) == NULL);
    TU_CK(sfs_cache_exists(c, &a->have));
    TU_CK(!sfs_cache_exists(c, &a->absent));
    TU_CK(sfs_cache_state(c, &a->have) == SFS_STATE_READY);
    TU_CK(sfs_cache_state(c, &a->absent) == -ENOENT);
    TU_CK(sfs_cache_get(c, &a->have, SFS_GET_NOALLOC, 0, &l) == SFS_HIT);
    TU_CK(sfs_cache_data(c, &l) == NULL);
    TU_CK(sfs_cache_release(c, &l) == 0);
    return 0;
}

Test(attach, query_only_role, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    struct child a = {.have = tu_key(3, 1), .absent = tu_key(4, 0)};

    cr_assert_eq(tu_load(c, &a.have), SFS_OWNER);
    cr_assert_eq(tu_wait(tu_fork_attached(path, -1, query_child, &a)), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Bad clients on the socket.
 */

static int raw_connect(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct timeval tv = {.tv_sec = 5};
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    cr_assert_geq(s, 0);
    strcpy(addr.sun_path, path);
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    cr_assert_eq(connect(s, (struct sockaddr *)&addr, sizeof(addr)), 0);
    return s;
}

/* Read the server's answer: the welcome's status, or 1 for a bare close.
 * A refusal never carries fds. */
static int answer(int s)
{
    struct welcome w;
    char cbuf[CMSG_SPACE(sizeof(int) * 4)];
    struct iovec iov = {.iov_base = &w, .iov_len = sizeof(w)};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
    ssize_t n = recvmsg(s, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);

    cr_assert_geq(n, 0, "no answer from the server: %s", strerror(errno));
    if (n == 0)
        return 1;
    cr_assert_eq(n, (ssize_t)sizeof(w));
    cr_assert_eq(w.magic, WELCOME_MAGIC);
    cr_assert_null(CMSG_FIRSTHDR(&msg), "a refused client was sent fds");
    return w.status;
}

/* Connect, send len bytes of msg (then shut the write side, when shut) and
 * return the server's answer, as answer() reads it. */
static int exchange(const char *path, const void *msg, size_t len, bool shut)
{
    int s = raw_connect(path), st;

    cr_assert_eq(send(s, msg, len, 0), (ssize_t)len);
    if (shut)
        shutdown(s, SHUT_WR);
    st = answer(s);
    close(s);
    return st;
}

/* A good attach right after: the server kept serving. */
static void good_attach(const char *path)
{
    int err = 0;
    struct sfs_cache *c = sfs_cache_attach(path, 0, &err);
    struct sfs_key k = tu_key(1, 0);

    cr_assert_not_null(c, "the server stopped serving: %s", strerror(-err));
    cr_assert_eq(sfs_cache_state(c, &k), -ENOENT);
    sfs_cache_close(c);
}

Test(attach, garbage_client_refused, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    char junk[13] = "not a hello!";
    int st = exchange(path, junk, sizeof(junk), true);

    cr_assert(st == -EBADMSG || st == 1, "garbage got status %d", st);
    /* 40 bytes of garbage: full size, wrong magic. */
    char big[sizeof(struct hello)];
    memset(big, 0xa5, sizeof(big));
    cr_assert_eq(exchange(path, big, sizeof(big), false), -EBADMSG);
    good_attach(path);
    sfs_cache_close(c);
}

Test(attach, short_hello_refused, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    struct hello h = {
        .magic = HELLO_MAGIC, .proto = PROTO_VERSION, .flags = 1, .format = sfs_layout_format()};
    int st = exchange(path, &h, 12, true);

    cr_assert(st == -EBADMSG || st == 1, "a short hello got status %d", st);
    good_attach(path);
    sfs_cache_close(c);
}

Test(attach, wrong_format_or_proto_hello_refused, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    struct hello h = {.magic = HELLO_MAGIC,
                      .proto = PROTO_VERSION,
                      .flags = 1,
                      .format = sfs_layout_format() ^ 0x10};

    cr_assert_eq(exchange(path, &h, sizeof(h), false), -EPROTO,
                 "another layout must be refused with EPROTO");
    h.format = sfs_layout_format();
    h.proto = PROTO_VERSION + 1;
    cr_assert_eq(exchange(path, &h, sizeof(h), false), -EPROTO,
                 "another protocol must be refused with EPROTO");
    /* The same hello, right: welcomed with the control fd. */
    h.proto = PROTO_VERSION;
    int s = raw_connect(path);
    cr_assert_eq(send(s, &h, sizeof(h), 0), (ssize_t)sizeof(h));
    {
        struct welcome w;
        char cbuf[CMSG_SPACE(sizeof(int))];
        struct iovec iov = {.iov_base = &w, .iov_len = sizeof(w)};
        struct msghdr msg = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};

        cr_assert_eq(recvmsg(s, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC), (ssize_t)sizeof(w));
        cr_assert_eq(w.status, 0);
        cr_assert_eq(w.format, sfs_layout_format());
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cr_assert_not_null(cm, "a good hello got no control fd");
        int fd;
        memcpy(&fd, CMSG_DATA(cm), sizeof(fd));
        close(fd);
    }
    close(s);
    good_attach(path);
    sfs_cache_close(c);
}

/* A client that connects and says nothing stalls the server at most its
 * receive timeout; the next client is served. */
Test(attach, silent_client_does_not_stall_server, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    int s = raw_connect(path);

    int64_t t0 = sfs_now_ns();
    good_attach(path);
    int64_t dt = sfs_now_ns() - t0;
    cr_assert_lt(dt, 4000 * 1000 * 1000ll, "a silent client stalled the server %lld ns",
                 (long long)dt);
    close(s);
    sfs_cache_close(c);
}

/* A welcomed client sends nothing more: bytes after its hello are a breach
 * that ends the attachment as a close does. The server hangs up, declares
 * the record dead and reaps it, while the client still holds its end. */
Test(attach, bytes_after_the_hello_end_the_attachment, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    struct hello h = {.magic = HELLO_MAGIC, .proto = PROTO_VERSION, .format = sfs_layout_format()};
    struct welcome w;
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {.iov_base = &w, .iov_len = sizeof(w)};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
    int s = raw_connect(path), fd;
    char b;

    cr_assert_eq(send(s, &h, sizeof(h), 0), (ssize_t)sizeof(h));
    cr_assert_eq(recvmsg(s, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC), (ssize_t)sizeof(w));
    cr_assert_eq(w.status, 0);
    cr_assert_eq(w.nfds, 1, "a query-only welcome: the control fd alone");
    cr_assert_not_null(CMSG_FIRSTHDR(&msg));
    memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&msg)), sizeof(fd));
    close(fd);
    cr_assert_eq(atomic_load(&c->procs[w.proc].state), PROC_ALIVE);
    cr_assert_eq(send(s, "more", 4, MSG_NOSIGNAL), 4);
    cr_assert_eq(recv(s, &b, 1, 0), 0, "the server kept the connection");
    tu_wait_reaped(c, 1);
    cr_assert_eq(atomic_load(&c->procs[w.proc].state), PROC_FREE);
    close(s);
    good_attach(path);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Bad regions.
 */

Test(attach, region_of_another_format_is_eproto, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    uint64_t fmt = c->hdr->format;
    int err = 0;

    c->hdr->format = fmt ^ 1;
    cr_assert_null(sfs_cache_attach(path, 0, &err));
    cr_assert_eq(err, -EPROTO, "attach to a region of another layout: %d", err);
    err = 0;
    cr_assert_null(sfs_cache_attach(path, -1, &err));
    cr_assert_eq(err, -EPROTO);
    err = 0;
    cr_assert_null(sfs_cache_attach_fds(dup(c->ctl_fd), NULL, 0, -1, &err));
    cr_assert_eq(err, -EPROTO);
    c->hdr->format = fmt;
    good_attach(path);
    sfs_cache_close(c);
}

Test(attach, region_with_bad_magic_is_ebadmsg, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    int err = 0;

    c->hdr->magic ^= 0xff;
    cr_assert_null(sfs_cache_attach(path, 0, &err));
    cr_assert_eq(err, -EBADMSG, "bad magic: %d", err);
    c->hdr->magic ^= 0xff;
    good_attach(path);
    sfs_cache_close(c);
}

/* A memfd holding the first n bytes of c's control plane, edited by fn. */
static int region_copy(struct sfs_cache *c, size_t n, void (*fn)(struct sfs_header *))
{
    int fd = memfd_create("test-ctl", MFD_CLOEXEC);

    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (off_t)n), 0);
    if (n) {
        uint8_t *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

        cr_assert_neq(p, MAP_FAILED);
        memcpy(p, c->ctl, n);
        if (fn && n >= sizeof(struct sfs_header))
            fn((struct sfs_header *)p);
        munmap(p, n);
    }
    return fd;
}

static void bad_magic(struct sfs_header *h)
{
    h->magic = 0x4141414141414141ull;
}

static void bad_nslots(struct sfs_header *h)
{
    h->nslots = 1u << 29;
}

static void bad_nbuckets(struct sfs_header *h)
{
    h->nbuckets = 100; /* not a power of two */
}

static void bad_region_size(struct sfs_header *h)
{
    h->region_size /= 2;
}

static void bad_offset(struct sfs_header *h)
{
    h->off_slots += 64;
}

/* Each field of the geometry past the bounds a create gives it, or out of
 * step with the others: one editor each. */
#define EDIT(name, stmt)                                                                           \
    static void name(struct sfs_header *h)                                                         \
    {                                                                                              \
        stmt;                                                                                      \
    }
EDIT(zero_shard, h->shard_size = 0)
EDIT(reserved_all, h->nreserved = h->nslots)
EDIT(zero_buckets, h->nbuckets = 0)
EDIT(zero_procs, h->max_procs = 0)
EDIT(many_procs, h->max_procs = 4097)
EDIT(zero_leases, h->max_leases = 0)
EDIT(many_leases, h->max_leases = (1u << 24) + 1)
EDIT(zero_per_seg, h->slots_per_segment = 0)
EDIT(per_seg_past_slots, h->slots_per_segment = h->nslots + 1)
EDIT(zero_domains, h->npartitions = 0)
EDIT(many_domains, h->npartitions = 65)
EDIT(domains_past_slots, h->npartitions = h->nslots + 1)
EDIT(few_pins, h->npins = 32)
EDIT(many_pins, h->npins = 1u << 17)
EDIT(pins_not_pow2, h->npins = 96)
EDIT(pin_budget_past_slots, h->pin_budget = h->nslots + 1)
EDIT(user_budget_past_budget, h->pin_user_budget = h->pin_budget + 1)
EDIT(long_pins, h->pin_max_s = SFS_PIN_MAX_SECONDS + 1)
EDIT(domain_end_short, h->part_end[0] -= 1)
EDIT(domain_rend_past, h->part_rend[0] += 1)
EDIT(stride_off, h->stride += 64)
EDIT(huge_stride, h->stride = 1ull << 61)
EDIT(segment_off, h->segment_size += 2u << 20)
EDIT(segments_off, h->nsegments += 1)
EDIT(hits_moved, h->off_hits += 64)
EDIT(other_format, h->format ^= 1)
#undef EDIT

static int attach_copy(struct sfs_cache *c, size_t n, void (*fn)(struct sfs_header *))
{
    int err = 0;
    struct sfs_cache *a = sfs_cache_attach_fds(region_copy(c, n, fn), NULL, 0, -1, &err);

    if (a) {
        sfs_cache_close(a);
        return 0;
    }
    cr_assert_lt(err, 0);
    return err;
}

Test(attach, truncated_region_is_ebadmsg, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(64, 0, SHARD);
    size_t full = c->ctl_len;
    size_t sizes[] = {0,
                      8,
                      64,
                      sizeof(struct sfs_header) - 1,
                      sizeof(struct sfs_header),
                      sizeof(struct sfs_header) + 100,
                      4096,
                      full / 2,
                      full - 4096};

    cr_assert_not_null(c);
    cr_assert_gt(full, 3 * 4096, "the region is too small to truncate meaningfully");
    /* Control: the whole copy attaches, so only the truncation is refused. */
    cr_assert_eq(attach_copy(c, full, NULL), 0);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        cr_assert_eq(attach_copy(c, sizes[i], NULL), -EBADMSG, "a region of %zu of %zu bytes",
                     sizes[i], full);
    sfs_cache_close(c);
}

Test(attach, corrupt_header_copies_are_refused, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(64, 0, SHARD);

    cr_assert_not_null(c);
    cr_assert_eq(attach_copy(c, c->ctl_len, bad_magic), -EBADMSG);
    cr_assert_eq(attach_copy(c, c->ctl_len, bad_nslots), -EBADMSG);
    cr_assert_eq(attach_copy(c, c->ctl_len, bad_nbuckets), -EBADMSG);
    cr_assert_eq(attach_copy(c, c->ctl_len, bad_region_size), -EBADMSG);
    cr_assert_eq(attach_copy(c, c->ctl_len, bad_offset), -EBADMSG);
    void (*const edits[])(struct sfs_header *) = {
        zero_shard,
        reserved_all,
        zero_buckets,
        zero_procs,
        many_procs,
        zero_leases,
        many_leases,
        zero_per_seg,
        per_seg_past_slots,
        zero_domains,
        many_domains,
        domains_past_slots,
        few_pins,
        many_pins,
        pins_not_pow2,
        pin_budget_past_slots,
        user_budget_past_budget,
        long_pins,
        domain_end_short,
        domain_rend_past,
        stride_off,
        huge_stride,
        segment_off,
        segments_off,
        hits_moved,
    };
    for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++)
        cr_assert_eq(attach_copy(c, c->ctl_len, edits[i]), -EBADMSG, "edit %zu", i);
    cr_assert_eq(attach_copy(c, c->ctl_len, other_format), -EPROTO);
    sfs_cache_close(c);
}

/* An index out of range in a live region: an error, never a wild access. */
Test(attach, corrupt_chain_index_is_ebadmsg, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(8, 0, SHARD);
    struct sfs_key k = tu_key(5, 0);
    struct sfs_lease l;
    uint32_t b, head;

    cr_assert_not_null(c);
    cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    b = c->slots[0].bucket;
    cr_assert_lt(b, c->nbuckets);
    head = atomic_load(&c->buckets[b].head);
    atomic_store(&c->buckets[b].head, c->nslots + 1000);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &l), -EBADMSG);
    cr_assert_eq(sfs_cache_state(c, &k), -EBADMSG);
    cr_assert_eq(sfs_cache_remove(c, &k), -EBADMSG);
    cr_assert_eq(sfs_cache_prealloc(c, &k), -EBADMSG);
    cr_assert_geq(sfs_cache_touch(c, &k.block, 1), 0);
    atomic_store(&c->buckets[b].head, head);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &l), SFS_HIT);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    sfs_cache_close(c);
}

static int visit_none(const struct sfs_key *k, int state, void *arg)
{
    (void)k;
    (void)state;
    ++*(int *)arg;
    return 0;
}

static int sample_none(const struct sfs_key *k, uint32_t s, bool acc, bool leased, void *arg)
{
    (void)k;
    (void)s;
    (void)acc;
    (void)leased;
    ++*(int *)arg;
    return 0;
}

/* A chain forged into a cycle (a slot that links to itself): every walk is
 * bounded, the lock-free one gives up, and a Get or State of a key the walk
 * would have to pass is -EBADMSG, never a hang. */
Test(attach, a_chain_forged_into_a_cycle_is_ebadmsg, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(8, 0, SHARD);
    struct sfs_key k = tu_key(5, 0), other;
    struct sfs_lease l;
    int n = 0;

    cr_assert_not_null(c);
    cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    uint32_t s = 0;

    while (s < c->nslots && atomic_load(&c->slots[s].state) != SFS_STATE_READY)
        s++;
    cr_assert_lt(s, c->nslots);
    uint32_t b = atomic_load(&c->slots[s].bucket);

    cr_assert_lt(b, c->nbuckets);
    for (uint64_t i = 6;; i++) {
        cr_assert_lt(i, 100000, "no other key of the bucket");
        other = tu_key(i, 0);
        if (bucket_of(c, &other) == b)
            break;
    }
    atomic_store(&c->slots[s].next, s);
    cr_assert_eq(sfs_cache_get(c, &other, 0, 0, &l), -EBADMSG);
    cr_assert_eq(sfs_cache_get(c, &other, SFS_GET_PEEK, 0, &l), -EBADMSG);
    cr_assert_eq(sfs_cache_state(c, &other), -EBADMSG);
    cr_assert_eq(sfs_cache_remove(c, &other), -EBADMSG);
    cr_assert_geq(sfs_cache_touch(c, &other.block, 1), 0);
    cr_assert_eq(sfs_cache_foreach(c, ~0u, visit_none, &n), 0);
    uint32_t cursor = 0;

    cr_assert_eq(sfs_cache_sample(c, &cursor, 0, sample_none, &n), 0);
    /* The key at the head is still found. */
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &l), SFS_HIT);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    atomic_store(&c->slots[s].next, SFS_NIL);
    cr_assert_eq(sfs_cache_state(c, &other), -ENOENT);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Attaching by descriptors (sfs_cache_attach_fds): it takes every
 * descriptor it is given, on success and on failure.
 */

static bool fd_open(int fd)
{
    return fcntl(fd, F_GETFD) >= 0;
}

static int dup_ok(int fd)
{
    int d = dup(fd);

    cr_assert_geq(d, 0);
    return d;
}

Test(attach, attach_by_descriptors_takes_every_descriptor, .timeout = 30)
{
    struct sfs_cache_config cfg = {.shard_size = SHARD,
                                   .nslots = 8,
                                   .no_reserved = true,
                                   .hugepages = SFS_HUGEPAGES_OFF,
                                   .max_procs = 2};
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err), *a, *b;
    int ctl, seg;

    cr_assert_not_null(c, "%s", strerror(-err));
    cr_assert_eq(c->nsegments, 1);
    /* Query-only: the control plane alone; the segment given is closed. */
    ctl = dup_ok(c->ctl_fd);
    seg = dup_ok(c->seg_fds[0]);
    a = sfs_cache_attach_fds(ctl, &seg, 1, -1, &err);
    cr_assert_not_null(a, "%s", strerror(-err));
    cr_assert(!fd_open(seg), "a query-only attach kept a segment");
    cr_assert_null(sfs_cache_data(a, &(struct sfs_lease){0}));
    /* Both records are taken (the creator's and a's): refused, and every
     * descriptor given is closed. */
    ctl = dup_ok(c->ctl_fd);
    seg = dup_ok(c->seg_fds[0]);
    b = sfs_cache_attach_fds(ctl, &seg, 1, 0, &err);
    cr_assert_null(b);
    cr_assert_eq(err, -EUSERS, "%s", strerror(-err));
    cr_assert(!fd_open(ctl) && !fd_open(seg), "a refused attach kept a descriptor");
    /* The same without a place for the error. */
    ctl = dup_ok(c->ctl_fd);
    cr_assert_null(sfs_cache_attach_fds(ctl, NULL, 0, -1, NULL));
    cr_assert(!fd_open(ctl));
    /* Segments short of the count: -EBADMSG, all closed. */
    sfs_cache_close(a);
    ctl = dup_ok(c->ctl_fd);
    a = sfs_cache_attach_fds(ctl, NULL, 0, 0, &err);
    cr_assert_null(a);
    cr_assert_eq(err, -EBADMSG, "%s", strerror(-err));
    cr_assert(!fd_open(ctl));
    /* Segments past the count, one that is no descriptor, one shorter than
     * a segment: refused, every descriptor closed. */
    int two[2];

    ctl = dup_ok(c->ctl_fd);
    two[0] = dup_ok(c->seg_fds[0]);
    two[1] = dup_ok(c->seg_fds[0]);
    cr_assert_null(sfs_cache_attach_fds(ctl, two, 2, 0, &err));
    cr_assert_eq(err, -EBADMSG, "%s", strerror(-err));
    cr_assert(!fd_open(ctl) && !fd_open(two[0]) && !fd_open(two[1]));
    ctl = dup_ok(c->ctl_fd);
    seg = dup_ok(c->seg_fds[0]);
    close(seg);
    cr_assert_null(sfs_cache_attach_fds(ctl, &seg, 1, 0, &err));
    cr_assert_eq(err, -EBADF, "%s", strerror(-err));
    cr_assert(!fd_open(ctl));
    ctl = dup_ok(c->ctl_fd);
    seg = memfd_create("test-short-seg", MFD_CLOEXEC);
    cr_assert_geq(seg, 0);
    cr_assert_eq(ftruncate(seg, 4096), 0);
    cr_assert_null(sfs_cache_attach_fds(ctl, &seg, 1, 0, &err));
    cr_assert_eq(err, -EBADMSG, "%s", strerror(-err));
    cr_assert(!fd_open(ctl) && !fd_open(seg));
    /* And with them: a data handle that shares the bytes. */
    struct sfs_key k = tu_key(4, 0);
    struct sfs_lease l;

    cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    ctl = dup_ok(c->ctl_fd);
    seg = dup_ok(c->seg_fds[0]);
    a = sfs_cache_attach_fds(ctl, &seg, 1, 0, &err);
    cr_assert_not_null(a, "%s", strerror(-err));
    cr_assert_eq(sfs_cache_get(a, &k, 0, 0, &l), SFS_HIT);
    cr_assert_eq(tu_check(&k, sfs_cache_data(a, &l), SHARD), -1);
    cr_assert_eq(sfs_cache_release(a, &l), 0);
    sfs_cache_close(a);
    /* No such socket, and no place for the error. */
    cr_assert_null(sfs_cache_attach(tu_path("none"), 0, NULL));
    cr_assert_null(sfs_cache_attach(NULL, 0, &err));
    cr_assert_eq(err, -EINVAL);
    sfs_cache_close(c);
}

/* A process that forks while attached: the child does not keep the
 * parent's attachment (its copy of the connection is closed at the fork),
 * so the parent's close is its leaving, whatever the child does. */
struct forked {
    int fd; /* the parent's connection */
    int up[2], down[2];
};

/* The child: the copy of the connection is closed; it lives on until the
 * parent has seen the server free the record. */
static int conn_closed_in_child(void *arg)
{
    struct forked *f = arg;
    char b = 1;

    TU_CK(!fd_open(f->fd));
    TU_CK(write(f->up[1], &b, 1) == 1);
    TU_CK(read(f->down[0], &b, 1) == 1);
    return 0;
}

Test(attach, a_forked_child_does_not_keep_the_attachment, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    int err = 0;
    struct sfs_cache *a = sfs_cache_attach(path, -1, &err);
    struct forked f;
    char b = 1;

    cr_assert_not_null(a, "%s", strerror(-err));
    f.fd = sfs_cache_conn_fd(a);
    cr_assert_geq(f.fd, 0);
    cr_assert_eq(sfs_cache_conn_fd(NULL), -1);
    cr_assert_eq(sfs_cache_conn_fd(c), -1, "the creator has no connection");
    cr_assert_eq(pipe(f.up), 0);
    cr_assert_eq(pipe(f.down), 0);
    pid_t pid = tu_fork(conn_closed_in_child, &f);
    close(f.up[1]); /* a child that fails its check is an EOF, not a hang */
    close(f.down[0]);
    cr_assert_eq(read(f.up[0], &b, 1), 1, "the child kept the connection");
    cr_assert(fd_open(f.fd), "the parent's connection was closed");
    uint32_t me = a->me;

    cr_assert_eq(atomic_load(&c->procs[me].state), PROC_ALIVE);
    sfs_cache_close(a);
    /* The server sees the close, the child alive, and frees the record. */
    for (int i = 0; atomic_load(&c->procs[me].state) != PROC_FREE; i++) {
        cr_assert_lt(i, 3000, "the record was never freed");
        usleep(1000);
    }
    cr_assert_eq(write(f.down[1], &b, 1), 1);
    cr_assert_eq(tu_wait(pid), 0);
    close(f.up[0]);
    close(f.down[1]);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * The socket's life.
 */

Test(attach, close_unlinks_socket, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = tu_cache(8, 0, SHARD);
    struct stat st;
    int err = 0;
    char p[128];

    cr_assert_not_null(c);
    path = tu_path("sock");
    snprintf(p, sizeof(p), "%s", path);
    /* A stale file at the path is replaced. */
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fclose(f);
    cr_assert_eq(sfs_cache_serve(c, p), 0);
    cr_assert_eq(stat(p, &st), 0);
    cr_assert(S_ISSOCK(st.st_mode));
    cr_assert_eq(sfs_cache_serve(c, p), -EINVAL, "a second server on one cache");
    good_attach(p);
    sfs_cache_close(c);
    cr_assert_eq(stat(p, &st), -1);
    cr_assert_eq(errno, ENOENT, "the socket outlived the cache");
    cr_assert_null(sfs_cache_attach(p, 0, &err));
    cr_assert(err == -ENOENT || err == -ECONNREFUSED, "attach to nothing: %d", err);
}

Test(attach, attacher_cannot_serve, .timeout = 30)
{
    const char *path;
    struct sfs_cache *c = served(&path);
    int err = 0;
    struct sfs_cache *a = sfs_cache_attach(path, 0, &err);

    cr_assert_not_null(a);
    cr_assert_eq(sfs_cache_serve(a, tu_path("other")), -EINVAL);
    sfs_cache_close(a);
    sfs_cache_close(c);
}
