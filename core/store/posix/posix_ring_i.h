/* SPDX-License-Identifier: MIT */
/*
 * posix_ring_i.h - what the posix backend's load ring shares between its
 * two rooms: the block-file opens and the ring's queue (posix_ring.c), and
 * the loads with their reaper (posix_load.c). Calls go posix_load.c ->
 * posix_ring.c; backend_posix.c starts and stops the reaper.
 */
#ifndef SHARDFS_POSIX_RING_I_H
#define SHARDFS_POSIX_RING_I_H

#include "posix_i.h"

#include <linux/openat2.h>
#include <sys/stat.h>

#define DIRECT_ALIGN 4096u
#define IO_RETRY_MAX 16

/* io->priv[] of a load, owned by posix_ring.c and posix_load.c while the load is in flight. */
enum {
    PRIV_FD = 0,   /* struct block_fd * shared by the batch's loads of a block */
    PRIV_NEXT = 1, /* pending / waiting / local list link */
    PRIV_DONE = 2, /* bytes read so far (uintptr_t) */
    PRIV_FLAGS = 3 /* F_DIRECT | F_HOLE | retries << F_RETRY_SHIFT */
};
#define F_DIRECT      1u
#define F_HOLE        2u /* read whole as zeros from a file with holes: ask SEEK_DATA */
#define F_RETRY_SHIFT 8

/* What a completion is for: the low two bits of its user_data (sfs_io and
 * block_fd are at least 8-byte aligned). user_data 0 (a NULL read) stops
 * the reaper. */
#define TAG_READ 0u /* struct sfs_io *: a read of a load */
#define TAG_OPEN 1u /* struct block_fd *: its OPENAT2 */
#define TAG_STAT 2u /* struct block_fd *: its STATX (a regular file?) */
#define TAG_STEP 3u /* struct block_fd *: its FADVISE (touch) or CLOSE */
#define TAG_MASK 3u

/* The steps of a block file's open (ring mode: each one an io_uring op, so
 * nothing waits in the submitter's thread). */
enum bfd_step {
    BFD_OPEN,  /* OPENAT2 queued or pending */
    BFD_STAT,  /* STATX of the new fd queued or pending */
    BFD_READY, /* a regular file, O_NONBLOCK cleared: loads read it */
    BFD_FADV,  /* touch: FADVISE(WILLNEED) queued or pending */
    BFD_CLOSE  /* CLOSE queued or pending; freed on its completion */
};

/* One open of a block file, shared by the loads of one sfs_posix_load() batch
 * that read that block the same way (O_DIRECT or not); closed when the last
 * of them finishes. Never reused across batches: a commit replaces the block
 * file by rename, and a later batch must see the new file. Set up by the
 * submitter before it is queued (published by sq_lock), then touched only
 * under sq_lock. how, rel and stx stay here until their op completes (the
 * kernel reads how/rel when it takes the entry, which may be at a later
 * submit, and writes stx at completion). */
struct block_fd {
    int fd;
    unsigned refs; /* loads holding it; a touch holds one itself */
    enum bfd_step step;
    bool direct;                          /* O_DIRECT asked of this open */
    bool touch;                           /* a touch's open: FADVISE, then close */
    bool holes;                           /* the file may have holes (posix_path.c) */
    unsigned char stale;                  /* opens retried after -ESTALE (< IO_RETRY_MAX) */
    struct sfs_io *wait_head, *wait_tail; /* loads waiting for BFD_READY */
    struct block_fd *next;                /* local list / bfd pending list */
    struct open_how how;
    struct statx stx;
    char rel[PATH_REL_MAX];
};

static inline struct block_fd *io_bfd(struct sfs_io *io)
{
    return io->priv[PRIV_FD];
}

static inline int io_fd(struct sfs_io *io)
{
    struct block_fd *b = io_bfd(io);

    return b ? b->fd : -1;
}

static inline struct sfs_io *io_next(struct sfs_io *io)
{
    return io->priv[PRIV_NEXT];
}

static inline void io_set_next(struct sfs_io *io, struct sfs_io *next)
{
    io->priv[PRIV_NEXT] = next;
}

static inline uintptr_t io_flags(struct sfs_io *io)
{
    return (uintptr_t)io->priv[PRIV_FLAGS];
}

/* posix_ring.c. A block_fd, refs 0. Ring mode: step BFD_OPEN, fd -1, the
 * open's arguments filled in. NULL when out of memory. */
struct block_fd *sfs_posix_bfd_alloc(struct posix_backend *p, const struct sfs_block_id *id,
                                     bool direct);
/* The file system refused O_DIRECT: every later load reads buffered; logged
 * once per backend. */
void sfs_posix_direct_refused(struct posix_backend *p);
/* Sync mode: open a block file for reading in the caller's thread; *direct
 * says whether O_DIRECT was used, *holes whether the file may have holes.
 * Returns the fd or -errno. */
int sfs_posix_open_block_read(struct posix_backend *p, const struct sfs_block_id *id, bool *direct,
                              bool *holes);
/* The rest take sq_lock (held by the caller). Queue the read of the rest of
 * io; false when the submission queue has no entry free. */
bool sfs_posix_prep_read_locked(struct posix_backend *p, struct sfs_io *io);
/* Submit what the submission queue holds. */
void sfs_posix_submit_locked(struct posix_backend *p);
/* Park a load on the pending list, at its tail or its head. */
void sfs_posix_pend_push_tail(struct posix_backend *p, struct sfs_io *io);
void sfs_posix_pend_push_head(struct posix_backend *p, struct sfs_io *io);
/* Queue b's next op now, or park it until an entry frees up. */
void sfs_posix_queue_bfd_locked(struct posix_backend *p, struct block_fd *b);
/* Move parked opens, then parked loads, into free ring entries. */
void sfs_posix_drain_pending_locked(struct posix_backend *p);
/* Drop io's reference to its block file (closed after the last). */
void sfs_posix_io_put_fd_locked(struct posix_backend *p, struct sfs_io *io);
/* Reaper: the completion of one of b's steps (tag TAG_OPEN, TAG_STAT or
 * TAG_STEP); loads that fail with it go onto *finished. */
void sfs_posix_bfd_cqe_locked(struct posix_backend *p, struct block_fd *b, unsigned tag, int res,
                              struct sfs_io **finished);
/* Without sq_lock: call done() of each load on the list, then count them
 * out of loads_active. */
void sfs_posix_finish_list(struct posix_backend *p, struct sfs_io *head);

#endif /* SHARDFS_POSIX_RING_I_H */
