/* SPDX-License-Identifier: MIT */
/*
 * test_copier_host.c - the host copier's copies, byte for byte, compiled in
 * (the copier is not exported).
 *
 * A load batch of 1 MiB or more is copied with non-temporal stores, a piece
 * at a time: the head up to a 16-byte boundary and the tail after the last
 * 64 bytes go through memcpy. Every piece here starts and ends at an odd
 * place, between guard bytes nothing may write; a batch under 1 MiB, a
 * dump batch and the inline load are checked the same way. Which of the two
 * ways a batch took is not asserted (that is the copier's choice); that
 * both give the same bytes is.
 */
#include "copier_i.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 0x5a

/* Lengths that leave every kind of head and tail: under 4 KiB (memcpy
 * only), odd, a multiple of 64, one past it. */
static const size_t lens[] = {1, 63, 4095, 4096, 4097, 32768 + 13, 65536, 100001};
#define NLENS (sizeof(lens) / sizeof(lens[0]))

static uint8_t src_byte(size_t piece, size_t off)
{
    return (uint8_t)(piece * 37 + off * 11 + 3);
}

/* Copy `reps` rounds of every length (piece i at offset i % 16 + 1 past a
 * guard) through `fn`, then check every byte and every guard. */
static void round_trip(int (*fn)(struct sfs_copier *, struct sfs_copy *, size_t),
                       struct sfs_copier *cp, size_t reps)
{
    size_t n = reps * NLENS, room = 0;
    struct sfs_copy *v = calloc(n, sizeof(*v));
    uint8_t **src = calloc(n, sizeof(*src)), **dst = calloc(n, sizeof(*dst));

    cr_assert(v && src && dst);
    for (size_t i = 0; i < n; i++) {
        size_t len = lens[i % NLENS], lead = i % 16 + 1;

        src[i] = malloc(len + 32);
        dst[i] = malloc(len + 64);
        cr_assert(src[i] && dst[i]);
        for (size_t k = 0; k < len; k++)
            src[i][lead + k] = src_byte(i, k);
        memset(dst[i], GUARD, len + 64);
        v[i] = (struct sfs_copy){.dst = dst[i] + lead, .src = src[i] + lead, .len = len};
        room += len;
    }
    cr_assert_eq(fn(cp, v, n), 0);
    for (size_t i = 0; i < n; i++) {
        size_t len = lens[i % NLENS], lead = i % 16 + 1;

        cr_assert_eq(v[i].result, 0, "piece %zu", i);
        for (size_t k = 0; k < lead; k++)
            cr_assert_eq(dst[i][k], GUARD, "piece %zu: guard byte %zu before it", i, k);
        for (size_t k = 0; k < len; k++)
            cr_assert_eq(dst[i][lead + k], src_byte(i, k), "piece %zu (%zu bytes): byte %zu", i,
                         len, k);
        for (size_t k = lead + len; k < len + 64; k++)
            cr_assert_eq(dst[i][k], GUARD, "piece %zu: guard byte %zu after it", i, k - lead - len);
        free(src[i]);
        free(dst[i]);
    }
    cr_log_info("%zu pieces, %zu bytes", n, room);
    free(v);
    free(src);
    free(dst);
}

Test(copier_host, a_load_batch_of_over_a_mib_is_copied_exactly)
{
    int err = 0;
    struct sfs_copier *cp = sfs_copier_host_open(&err);

    cr_assert_not_null(cp, "%d", err);
    round_trip(cp->ops->load, cp, 8); /* 8 x 214 KiB */
    cp->ops->close(cp);
}

Test(copier_host, a_write_behind_dump_batch_of_over_a_mib_is_copied_exactly)
{
    int err = 0;
    struct sfs_copier *cp = sfs_copier_host_open(&err);

    cr_assert_not_null(cp);
    cr_assert_not_null(cp->ops->dump_behind);
    round_trip(cp->ops->dump_behind, cp, 8); /* 8 x 214 KiB: streamed */
    round_trip(cp->ops->dump_behind, cp, 1); /* under a MiB: memcpy */
    cp->ops->close(cp);
}

Test(copier_host, small_batches_dumps_and_inline_loads_are_copied_exactly)
{
    int err = 0;
    struct sfs_copier *cp = sfs_copier_host_open(&err);

    cr_assert_not_null(cp, "%d", err);
    round_trip(cp->ops->load, cp, 1);
    round_trip(cp->ops->dump, cp, 8);
    round_trip(cp->ops->load_inline, cp, 1);
    cp->ops->close(cp);
}

Test(copier_host, a_null_end_fails_its_copy_only)
{
    int err = 0;
    struct sfs_copier *cp = sfs_copier_host_open(&err);
    static uint8_t a[1 << 20], b[1 << 20];
    struct sfs_copy v[3] = {
        {.dst = a, .src = b, .len = sizeof(a) / 2},
        {.dst = NULL, .src = b, .len = 4096},
        {.dst = a + sizeof(a) / 2, .src = b, .len = sizeof(a) / 2},
    };

    cr_assert_not_null(cp, "%d", err);
    memset(b, 7, sizeof(b));
    cr_assert_eq(cp->ops->load(cp, v, 3), 0);
    cr_assert_eq(v[0].result, 0);
    cr_assert_eq(v[1].result, -EFAULT);
    cr_assert_eq(v[2].result, 0);
    cr_assert_eq(memcmp(a, b, sizeof(a)), 0);
    cp->ops->close(cp);
}
