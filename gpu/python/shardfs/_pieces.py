# SPDX-License-Identifier: MIT
"""Shards made of pieces: the engines' view of a shard, over shardfs.Rank.

An engine often keeps one shard of a block in several places: vLLM through
UCM hands a row of pointers per block (K and V of every layer), SGLang's
host pool a K page and a V page (or K and V of every layer). The bytes of
the shard are those pieces one after the other (UCM's PosixStore lays a
shard out that way, so a store either of them wrote reads the same).

Each row goes to the library as one vectored entry (sfs_rank_loadv /
sfs_rank_dumpv): the copier moves every piece straight between the cache
and the engine's memory, no staging copy. Adjacent pieces are merged
first. Only a row of more pieces than an entry takes (SFS_RANK_PIECES_MAX,
512; an 80-layer model's K and V rows are 160 pieces) goes through a bounce
buffer of one shard, gathered before a dump and scattered after a load
(memmove, or cudaMemcpy with the CUDA copier); the adapters count those
(`bounced`) beside the rows that went as pieces (`vectored`).

Values shorter than a shard (SGLang's extra pools: a Mamba state of 4,864 B
in a 32 KiB shard; the generic set/get of any tensor) are framed: the shard
holds a 16-byte header, then the value's bytes, then zeros:

    bytes 0..7   b"sfsval\\x00\\x01" (the magic)
    bytes 8..15  the value's length, little-endian uint64
    bytes 16..   the value

A load of a framed row checks the header against the length it expects
(another length, or a full shard, fails the entry with -ENODATA). A value
of exactly shard_size bytes is stored as it is, with no header: the posix
layout of full shards (UCM's PosixStore) is unchanged. So values of 1 to
shard_size - 16 bytes, or of shard_size bytes, can be stored.
"""
import ctypes
import errno
import struct
import threading

from . import _lib
from .errors import InvalidArgument, ShardfsError

HEADER = struct.Struct("<8sQ")
MAGIC = b"sfsval\x00\x01"
HEADER_SIZE = HEADER.size  # 16

_cudart = None


def _cuda():
    """libcudart, as already loaded by the engine (torch) or by the loader."""
    global _cudart
    if _cudart is None:
        for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"):
            try:
                lib = ctypes.CDLL(name)
            except OSError:
                continue
            lib.cudaMemcpy.restype = ctypes.c_int
            lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            lib.cudaEventSynchronize.restype = ctypes.c_int
            lib.cudaEventSynchronize.argtypes = [ctypes.c_void_p]
            _cudart = lib
            break
        else:
            raise ShardfsError(errno.ENODEV, "pieces of a device shard: libcudart cannot be loaded")
    return _cudart


_CUDA_MEMCPY_DEFAULT = 4


def copy(dst, src, n, cuda):
    """Copy n bytes between raw addresses (host, or either end on a device
    when `cuda`)."""
    if cuda:
        rc = _cuda().cudaMemcpy(dst, src, n, _CUDA_MEMCPY_DEFAULT)
        if rc:
            raise ShardfsError(errno.EIO, f"cudaMemcpy of {n} bytes failed (cudaError {rc})")
    else:
        ctypes.memmove(dst, src, n)


def event_sync(handle):
    """Wait for a CUDA event (a cudaEvent_t as an int)."""
    rc = _cuda().cudaEventSynchronize(ctypes.c_void_p(handle))
    if rc:
        raise ShardfsError(errno.EIO, f"cudaEventSynchronize failed (cudaError {rc})")


def tensor_piece(t, what, host_only=True):
    """(address, bytes) of a contiguous tensor in memory the rank's copier
    can reach: host memory, or CUDA memory when not `host_only`. Anything
    else is refused here, before an address reaches a memcpy."""
    if not hasattr(t, "data_ptr") or not hasattr(t, "is_contiguous") or not hasattr(t, "device"):
        raise InvalidArgument(f"{what}: expected a torch tensor, got {type(t).__name__}")
    kind = t.device.type
    if kind not in ("cpu", "cuda"):
        raise InvalidArgument(f"{what}: tensor on {t.device}: only CPU and CUDA memory can be copied")
    if host_only and kind != "cpu":
        raise InvalidArgument(f"{what}: tensor on {t.device}, but this store copies to host memory")
    if not t.is_contiguous():
        raise InvalidArgument(f"{what}: tensor is not contiguous")
    return int(t.data_ptr()), int(t.numel() * t.element_size())


def header_of(raw):
    """The value length a shard's first 16 bytes declare, or None when they
    are not a header (a full shard)."""
    magic, n = HEADER.unpack_from(raw)
    return n if magic == MAGIC else None


class Counters:
    """Rows moved as pieces (`vectored`) and through a bounce buffer
    (`bounced`), for an adapter's stats()."""

    def __init__(self):
        self._mu = threading.Lock()
        self.vectored = 0
        self.bounced = 0

    def add(self, vectored, bounced):
        with self._mu:
            self.vectored += vectored
            self.bounced += bounced

    def as_dict(self):
        with self._mu:
            return {"vectored": self.vectored, "bounced": self.bounced}


class Row:
    """One shard's pieces, [(address, bytes), ...] in the shard's order.

    exact: the pieces must hold shard_size bytes (UCM's blocks, SGLang's KV
    pages). Otherwise a row may hold less: a value of size bytes, framed
    (see the module's docstring). probe: a full-size load also reads back
    the length a framed value stored under the key declares (`stored`)."""

    __slots__ = ("pieces", "size", "framed", "probe", "stored", "bounce", "hdr")

    def __init__(self, pieces, shard_size, what, exact=True, probe=False):
        total = 0
        for addr, n in pieces:
            if addr <= 0 or n <= 0:
                raise InvalidArgument(f"{what}: piece ({addr:#x}, {n}) is not a valid address and size")
            total += n
        if not pieces:
            raise InvalidArgument(f"{what}: no pieces")
        if total != shard_size:
            if exact:
                raise InvalidArgument(f"{what}: pieces hold {total} bytes, the shard is {shard_size}")
            if total > shard_size - HEADER_SIZE:
                raise InvalidArgument(f"{what}: a value of {total} bytes: a shard of {shard_size} "
                                      f"holds values of up to {shard_size - HEADER_SIZE} bytes (with "
                                      f"their {HEADER_SIZE}-byte header) or of exactly {shard_size}")
        self.pieces = pieces
        self.size = total
        self.framed = total != shard_size
        self.probe = probe and not self.framed
        self.stored = None
        self.bounce = None
        self.hdr = 0  # address of the header (framed rows)

    def merged(self):
        """The pieces with adjacent ones merged."""
        out = []
        for a, n in self.pieces:
            if out and out[-1][0] + out[-1][1] == a:
                out[-1] = (out[-1][0], out[-1][1] + n)
            else:
                out.append((a, n))
        return out

    def _bounce_pieces(self):
        """The one piece of a fresh bounce buffer (header, then the value)."""
        extra = HEADER_SIZE if self.framed else 0
        self.bounce = (ctypes.c_char * (extra + self.size))()
        base = ctypes.addressof(self.bounce)
        self.hdr = base if self.framed else 0
        return [(base, extra + self.size)]

    def gather(self, cuda):
        off = ctypes.addressof(self.bounce) + (HEADER_SIZE if self.framed else 0)
        for a, n in self.pieces:
            copy(off, a, n, cuda)
            off += n

    def scatter(self, cuda):
        off = ctypes.addressof(self.bounce) + (HEADER_SIZE if self.framed else 0)
        for a, n in self.pieces:
            copy(a, off, n, cuda)
            off += n


class PieceTask:
    """A shardfs.Task plus what its rows need once done: the scatters of
    bounced rows, the header checks of framed rows. finish() is idempotent:
    it waits, completes the rows that loaded, and returns the per-entry
    statuses (a framed row whose header does not match fails -ENODATA)."""

    def __init__(self, task, rows, load, cuda, keep=None):
        self._mu = threading.Lock()  # one finisher scatters, once
        self.task = task
        self.rows = rows
        self.load = load
        self.cuda = cuda
        self.keep = keep
        self.statuses = None

    def done(self):
        return self.statuses is not None or self.task.done()

    def finish(self):
        with self._mu:
            if self.statuses is None:
                st = self.task.wait()
                if self.load:
                    for i, (row, s) in enumerate(zip(self.rows, st)):
                        if s == 0:
                            st[i] = _complete(row, self.cuda)
                self.rows = None
                self.keep = None
                self.statuses = st
            return self.statuses


def _complete(row, cuda):
    """A loaded row's status once its header is checked and its bounce
    buffer scattered."""
    if row.framed:
        if header_of(ctypes.string_at(row.hdr, HEADER_SIZE)) != row.size:
            return -errno.ENODATA  # another length, or a full shard, under this key
    if row.bounce is not None:
        row.scatter(cuda)
    if row.probe and not cuda and row.pieces[0][1] >= HEADER_SIZE:
        row.stored = header_of(ctypes.string_at(row.pieces[0][0], HEADER_SIZE))
    return 0


def submit(rank, blocks, shards, rows, load, counters=None, after=None):
    """Queue a load or dump of rows (one Row per (block, shard)) on rank, each
    row one vectored entry (a bounce buffer only past PIECES_MAX pieces).
    after: a dump's CUDA event (Rank.dumpv's after=): the copier's stream
    waits for it; a bounced row is gathered here, so with one the event is
    synchronized first and the dump goes without it."""
    if not (len(blocks) == len(shards) == len(rows)):
        raise InvalidArgument(f"{len(blocks)} block ids, {len(shards)} shard indices and "
                              f"{len(rows)} rows of buffers: they must be as many")
    cuda = rank.copier == "cuda"
    try:
        shards = [s if type(s) is int else int(s.__index__()) for s in shards]
    except (AttributeError, TypeError):
        raise InvalidArgument(f"shard indices {list(shards)[:8]!r}: expected ints") from None
    framed = sum(1 for r in rows if r.framed)
    headers = (ctypes.c_char * (HEADER_SIZE * framed))() if framed else None
    hbase = ctypes.addressof(headers) if framed else 0
    entries = []
    bounced = []
    for b, s, row in zip(blocks, shards, rows):
        vec = row.merged()
        if row.framed:
            vec.insert(0, (hbase, HEADER_SIZE))
            row.hdr = hbase
            hbase += HEADER_SIZE
        if len(vec) > _lib.PIECES_MAX:
            vec = row._bounce_pieces()
            bounced.append(row)
        if row.framed and not load:
            HEADER.pack_into((ctypes.c_char * HEADER_SIZE).from_address(row.hdr), 0, MAGIC, row.size)
        entries.append((b, s, vec))
    if bounced and not load:
        if after:
            event_sync(after)  # the gathers below read the sources now
            after = None
        for row in bounced:
            row.gather(cuda)
    if counters is not None:
        counters.add(len(rows) - len(bounced), len(bounced))
    keep = (headers, rows)  # the bounce buffers too, should the task outlive its PieceTask
    if load:
        task = rank.loadv(entries, keep=keep)
    elif after:
        task = rank.dumpv(entries, keep=keep, after=after)
    else:
        task = rank.dumpv(entries, keep=keep)
    return PieceTask(task, rows, load, cuda, keep=headers)
