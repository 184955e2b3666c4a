# SPDX-License-Identifier: MIT
"""Shards made of pieces: the engines' view of a shard, over shardfs.Rank.

An engine often keeps one shard of a block in several places: vLLM through
UCM hands a row of pointers per block (K and V of every layer), SGLang's
host pool a K page and a V page. The bytes of the shard are those pieces
one after the other (UCM's PosixStore lays a shard out that way, so a store
either of them wrote reads the same). shardfs moves one contiguous range
per entry, so:

  * a row whose pieces are adjacent in memory (one piece, or pieces that
    happen to follow each other) goes to the library as one address: zero
    copy;
  * any other row goes through a bounce buffer of one shard: a load lands
    in it and is scattered to the pieces once the entry is done; a dump is
    gathered into it before the task is queued.

Pieces are copied with memmove when the rank copies to host memory, and with
cudaMemcpy (cudaMemcpyDefault: host or device ends, through unified
addressing) when the rank uses the CUDA copier.
"""
import ctypes
import errno
import threading

from .errors import InvalidArgument, ShardfsError

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


class Row:
    """One shard's pieces: [(address, bytes), ...] totalling shard_size."""

    __slots__ = ("pieces", "bounce")

    def __init__(self, pieces, shard_size, what):
        total = sum(n for _, n in pieces)
        if total != shard_size:
            raise InvalidArgument(f"{what}: pieces hold {total} bytes, the shard is {shard_size}")
        for addr, n in pieces:
            if addr <= 0 or n <= 0:
                raise InvalidArgument(f"{what}: piece ({addr:#x}, {n}) is not a valid address and size")
        self.pieces = pieces
        self.bounce = None

    def address(self):
        """The one address of the shard when the pieces are adjacent, else a
        fresh bounce buffer's (kept on the row)."""
        addr, n = self.pieces[0]
        contiguous = True
        for a, m in self.pieces[1:]:
            if a != addr + n:
                contiguous = False
                break
            n += m
        if contiguous:
            return self.pieces[0][0]
        self.bounce = (ctypes.c_char * sum(m for _, m in self.pieces))()
        return ctypes.addressof(self.bounce)

    def gather(self, cuda):
        off = ctypes.addressof(self.bounce)
        for a, n in self.pieces:
            copy(off, a, n, cuda)
            off += n

    def scatter(self, cuda):
        off = ctypes.addressof(self.bounce)
        for a, n in self.pieces:
            copy(a, off, n, cuda)
            off += n


class PieceTask:
    """A shardfs.Task plus the scatters its bounced rows need once done.
    finish() is idempotent: it waits, scatters the rows that loaded, and
    returns the per-entry statuses."""

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
                    for row, s in zip(self.rows, st):
                        if s == 0 and row.bounce is not None:
                            row.scatter(self.cuda)
                self.rows = None
                self.keep = None
                self.statuses = st
            return self.statuses


def submit(rank, blocks, shards, rows, load):
    """Queue a load or dump of rows (one Row per (block, shard)) on rank."""
    if not (len(blocks) == len(shards) == len(rows)):
        raise InvalidArgument(f"{len(blocks)} block ids, {len(shards)} shard indices and "
                              f"{len(rows)} rows of buffers: they must be as many")
    cuda = rank.copier == "cuda"
    try:
        shards = [s if type(s) is int else int(s.__index__()) for s in shards]
    except (AttributeError, TypeError):
        raise InvalidArgument(f"shard indices {list(shards)[:8]!r}: expected ints") from None
    entries = []
    for b, s, row in zip(blocks, shards, rows):
        entries.append((b, s, row.address()))
    if not load:
        for row in rows:
            if row.bounce is not None:
                row.gather(cuda)
    task = rank.load(entries) if load else rank.dump(entries)
    return PieceTask(task, rows, load, cuda)
