# SPDX-License-Identifier: MIT
"""shardfs.Task, and the packing of a task's entries for libshardfs-rank.

A Task is one queued load or dump: the library's struct sfs_task, the
statuses it fills, and the buffers (or piece arrays) the copier reads or
writes until the task is done. Block ids and shard indices are checked here,
and a task's entries are packed into struct sfs_rank_entry[n] by a cached
struct.Struct, a chunk of entries per call (no Python code per entry).
Rank (rank.py) makes the entries and queues them; this module holds what a
queued task is.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import itertools
import os
import struct
import threading
import time

from . import _lib
from .errors import InvalidArgument, RankClosed, WaitTimeout, check

_HEX = frozenset("0123456789abcdefABCDEF")
_MAX_SHARD = 0xFFFFFFFF
# Longest single sleep of an unbounded wait, so that Ctrl-C is seen.
_WAIT_SLICE_MS = 200
# This process's pid, kept current across fork() without a getpid() per call.
_pid = os.getpid()


def _after_fork():
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork)


def block_id(block: str | bytes | bytearray | memoryview) -> bytes:
    """A block id as 16 raw bytes: from 16 bytes (bytes, bytearray,
    memoryview) or 32 hex characters (str). Anything else raises
    InvalidArgument."""
    if isinstance(block, str):
        if len(block) != 32 or not _HEX.issuperset(block):
            raise InvalidArgument(f"block id {block!r}: a str block id is 32 hex characters")
        return bytes.fromhex(block)
    if isinstance(block, (bytes, bytearray, memoryview)):
        raw = bytes(block)
        if len(raw) != _lib.BLOCK_ID_LEN:
            raise InvalidArgument(f"block id {raw[:40]!r}: a bytes block id is 16 bytes, "
                                  f"not {len(raw)} (32 hex characters go as a str)")
        return raw
    raise InvalidArgument(f"block id of type {type(block).__name__}: "
                          "expected 16 bytes or a str of 32 hex characters")


def block_hex(block: str | bytes | bytearray | memoryview) -> str:
    """The 32-hex-character name of a block id (the posix layout's file name)."""
    return block_id(block).hex()


def _shard_index(shard):
    if isinstance(shard, bool) or not isinstance(shard, int):
        try:
            shard = int(shard.__index__())
        except (AttributeError, TypeError):
            raise InvalidArgument(f"shard {shard!r}: expected an int") from None
    if not 0 <= shard <= _MAX_SHARD:
        raise InvalidArgument(f"shard {shard}: out of range 0..{_MAX_SHARD}")
    return shard


_ENTRY = struct.Struct("=16sI4xQ")  # struct sfs_rank_entry on LP64: block, shard, pad, addr
assert _ENTRY.size == ctypes.sizeof(_lib.Entry)
# The fast path packs up to _CHUNK entries with one pack_into of a Struct
# made once per entry count (a cached struct of _CHUNK entries and one for
# the remainder: at most _CHUNK + 1 distinct Structs ever).
_CHUNK = 256


@functools.lru_cache(maxsize=_CHUNK + 1)
def _entries_struct(n):
    return struct.Struct("=" + "16sI4xQ" * n)


def _pack(blocks, shards, addrs):
    """struct sfs_rank_entry[n] from three checked columns (sequences or
    iterables of n each), packed by a cached Struct _CHUNK entries at a
    time: no Python bytecode per entry."""
    flat = list(itertools.chain.from_iterable(zip(blocks, shards, addrs)))
    n = len(flat) // 3
    raw = bytearray(_ENTRY.size * n)
    off = 0
    while off + _CHUNK <= n:
        _entries_struct(_CHUNK).pack_into(raw, off * _ENTRY.size, *flat[3 * off:3 * (off + _CHUNK)])
        off += _CHUNK
    if off < n:
        _entries_struct(n - off).pack_into(raw, off * _ENTRY.size, *flat[3 * off:])
    return (_lib.Entry * n).from_buffer(raw)

class Task:
    """A queued load or dump. wait() returns one status per entry: 0, or a
    negative errno (-ENOENT not in the backend, -EIO, -ETIMEDOUT, -ENOSPC,
    -ECANCELED). The Task holds its buffers until it is waited for."""

    __slots__ = ("_ptr", "_n", "_keep", "_rank", "_statuses", "_status", "_kind", "_mu",
                 "__weakref__")

    def __init__(self, rank, ptr, n, keep, kind):
        # Held by a waiter for its whole wait: the task is freed by whoever
        # completes the wait, never under another thread's wait or done().
        # ptr None with n > 0: Rank._submit sets it once the library has the
        # task; n == 0: an empty task, done at once.
        self._mu = threading.Lock()
        self._ptr = ptr
        self._n = n
        self._keep = keep
        self._rank = rank
        self._statuses = None if n else []
        self._status = (ctypes.c_int * n)() if n else None
        self._kind = kind

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        if self._statuses is not None:
            state = "waited"
        elif self._rank is not None and self._rank._pid != _pid:
            state = "of the parent process"
        else:
            state = "done" if self.done() else "running"
        return f"<shardfs.Task {self._kind} of {self._n} entries, {state}>"

    def done(self) -> bool:
        """True once every entry has completed (never blocks)."""
        if self._statuses is not None:
            return True
        self._check_process("done")
        if not self._mu.acquire(blocking=False):
            return False  # another thread is waiting for it: done once its wait returns
        try:
            return self._statuses is not None or bool(_lib.lib().sfs_rank_task_done(self._ptr))
        finally:
            self._mu.release()

    def wait(self, timeout: float | None = None) -> list[int]:
        """Wait for every entry; returns the list of statuses (0 or -errno).

        timeout: seconds (None: no limit, 0: poll). Raises WaitTimeout when it
        passes first; the task goes on and may be waited for again. A task
        waited for once returns the same list again."""
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
                    not timeout >= 0:
                raise InvalidArgument(f"timeout {timeout!r}: expected seconds >= 0 or None")
            if timeout == float("inf"):
                timeout = None
        if self._statuses is not None:
            return list(self._statuses)
        self._check_process("wait")
        if timeout is None:
            self._mu.acquire()
        else:
            t0 = time.monotonic()
            if not self._mu.acquire(timeout=timeout):
                raise WaitTimeout(f"{self._kind} of {self._n} entries not done after {timeout} s")
            timeout = max(0.0, timeout - (time.monotonic() - t0))
        try:
            if self._statuses is None:
                self._wait_locked(timeout)
            return list(self._statuses)
        finally:
            self._mu.release()

    def _check_process(self, what):
        """A task of the parent's Rank, in a forked child, is never done
        there: the copier threads that would finish it were not forked."""
        rank = self._rank
        if rank is not None and rank._pid != _pid:
            raise RankClosed(f"Task.{what}: this task is of a Rank opened by process {rank._pid}; "
                             "after fork, open a new Rank in the child")

    def _wait_locked(self, timeout):
        lib = _lib.lib()
        status = self._status
        if timeout is None:
            while True:
                rc = lib.sfs_rank_wait(self._ptr, _WAIT_SLICE_MS, status)
                if rc != -errno.ETIMEDOUT:
                    break
        else:
            deadline = time.monotonic() + timeout
            while True:
                left_ms = max(0, int((deadline - time.monotonic()) * 1000 + 0.999))
                rc = lib.sfs_rank_wait(self._ptr, min(left_ms, _WAIT_SLICE_MS), status)
                if rc != -errno.ETIMEDOUT or left_ms <= _WAIT_SLICE_MS:
                    break
        if rc == -errno.ETIMEDOUT:
            raise WaitTimeout(f"{self._kind} of {self._n} entries not done after {timeout} s")
        check(rc, "sfs_rank_wait")
        self._release()
        self._statuses = status[:]

    def _release(self):
        ptr, self._ptr = self._ptr, None
        if ptr:
            _lib.lib().sfs_rank_task_free(ptr)
        self._keep = None

    def __del__(self):
        ptr = getattr(self, "_ptr", None)
        if not ptr:
            return
        rank = self._rank
        if rank is not None and rank._pid != _pid:
            return  # the parent's task, inherited through fork: not ours to free
        try:
            lib = _lib.lib()
            if lib.sfs_rank_task_done(ptr):
                self._release()
            elif rank is not None:
                # Still running: the library would keep writing the buffers.
                rank._park(ptr, self._keep)
                self._ptr = None
                self._keep = None
        except Exception:  # interpreter shutdown: nothing sane left to do
            pass


_ENTRYV = struct.Struct("=16sIIQ")  # struct sfs_rank_entryv: block, shard, npieces, pieces
_PIECE = struct.Struct("=QQ")  # struct sfs_rank_piece: addr, len
assert _ENTRYV.size == ctypes.sizeof(_lib.EntryV) and _PIECE.size == ctypes.sizeof(_lib.Piece)


def pack_vectored(entries, what):
    """struct sfs_rank_entryv[n] and the one array of every entry's pieces
    they point into, from (block, shard, [(address, bytes), ...]) triples.
    Returns (entries array, n, pieces array): the caller keeps the pieces
    array alive as long as the entries array (the library copies both at
    submit; a Task keeps them anyway)."""
    if isinstance(entries, (str, bytes)) or not hasattr(entries, "__iter__"):
        raise InvalidArgument(f"{what}: entries must be a list of (block, shard, pieces)")
    entries = list(entries)
    n = len(entries)
    total = 0
    rows = []
    for i, ent in enumerate(entries):
        try:
            block, shard, pieces = ent
            pieces = list(pieces)
        except (TypeError, ValueError):
            raise InvalidArgument(f"{what}: entry {i} is not a (block, shard, pieces) triple") from None
        if type(block) is not bytes or len(block) != _lib.BLOCK_ID_LEN:
            block = block_id(block)
        if type(shard) is not int or not 0 <= shard <= _MAX_SHARD:
            shard = _shard_index(shard)
        if not 1 <= len(pieces) <= _lib.PIECES_MAX:
            raise InvalidArgument(f"{what}: entry {i} has {len(pieces)} pieces: 1 to "
                                  f"{_lib.PIECES_MAX} per entry")
        for j, p in enumerate(pieces):
            try:
                addr, size = p
            except (TypeError, ValueError):
                raise InvalidArgument(f"{what}: entry {i} piece {j} is not an (address, bytes) "
                                      "pair") from None
            if type(addr) is not int or type(size) is not int or not 0 < addr < 1 << 64 or \
                    not 0 < size < 1 << 63:
                raise InvalidArgument(f"{what}: entry {i} piece {j} ({addr!r}, {size!r}) is not a "
                                      "valid address and size")
        rows.append((block, shard, pieces))
        total += len(pieces)
    raw = bytearray(_PIECE.size * max(total, 1))
    flat = (_lib.Piece * max(total, 1)).from_buffer(raw)  # pins raw: its address stays
    arr = bytearray(_ENTRYV.size * n)
    base = ctypes.addressof(flat)
    k = 0
    for i, (block, shard, pieces) in enumerate(rows):
        _ENTRYV.pack_into(arr, i * _ENTRYV.size, block, shard, len(pieces), base + k * _PIECE.size)
        for addr, size in pieces:
            _PIECE.pack_into(raw, k * _PIECE.size, addr, size)
            k += 1
    return (_lib.EntryV * n).from_buffer(arr), n, flat


@functools.lru_cache(maxsize=_CHUNK + 1)
def _entriesv_struct(n):
    return struct.Struct("=" + "16sIIQ" * n)


class EntriesV:
    """A vectored task's entries in columns (Rank.loadv / Rank.dumpv take it
    instead of a list of triples): entry i is (blocks[i], shards[i]) made of
    counts[i] pieces, the next ones of `pieces`, a C-contiguous buffer of
    (address, bytes) pairs of uint64 (struct sfs_rank_piece[], e.g. a numpy
    array of shape (k, 2) and dtype uint64). The columns are checked by
    builtins over them (no Python code per entry or piece): block ids are 16
    bytes, shards in range, 1 to PIECES_MAX pieces per entry that add up to
    the pairs given. Each piece (no null address, no empty piece, at most a
    shard per entry) is checked by the library when the task is queued, an
    InvalidArgument then. The pieces are copied at once: the buffer may be
    reused after this returns."""

    __slots__ = ("_n", "_arr", "_pieces")

    def __init__(self, blocks, shards, counts, pieces):
        what = "entriesv"
        blocks = list(blocks)
        n = len(blocks)
        if n == 0:
            raise InvalidArgument(f"{what}: no entries")
        if set(map(type, blocks)) != {bytes} or set(map(len, blocks)) != {_lib.BLOCK_ID_LEN}:
            blocks = [block_id(b) for b in blocks]
        if isinstance(shards, int):
            shards = [_shard_index(shards)] * n
        else:
            shards = [_shard_index(s) for s in shards]
        counts = [int(c) for c in counts]
        if len(shards) != n or len(counts) != n:
            raise InvalidArgument(f"{what}: {n} block ids, {len(shards)} shard indices and "
                                  f"{len(counts)} piece counts")
        if min(counts) < 1 or max(counts) > _lib.PIECES_MAX:
            raise InvalidArgument(f"{what}: 1 to {_lib.PIECES_MAX} pieces per entry, not "
                                  f"{min(counts) if min(counts) < 1 else max(counts)}")
        try:
            flat = memoryview(pieces).cast("B")
        except (TypeError, ValueError):
            raise InvalidArgument(f"{what}: pieces must be a C-contiguous buffer of "
                                  "(address, bytes) uint64 pairs") from None
        total = sum(counts)
        if flat.nbytes != total * _PIECE.size:
            raise InvalidArgument(f"{what}: {total} pieces counted, {flat.nbytes} bytes of "
                                  f"pairs given ({total * _PIECE.size} expected)")
        raw = bytearray(flat)
        self._pieces = (_lib.Piece * total).from_buffer(raw)  # pins raw: its address stays
        base = ctypes.addressof(self._pieces)
        ptrs = map(base.__add__, map(_PIECE.size.__mul__,
                                     itertools.accumulate(counts[:-1], initial=0)))
        cols = list(itertools.chain.from_iterable(zip(blocks, shards, counts, ptrs)))
        arr = bytearray(_ENTRYV.size * n)
        off = 0
        while off < n:
            k = min(_CHUNK, n - off)
            _entriesv_struct(k).pack_into(arr, off * _ENTRYV.size, *cols[4 * off:4 * (off + k)])
            off += k
        self._n = n
        self._arr = (_lib.EntryV * n).from_buffer(arr)

    def __len__(self):
        return self._n

    def __repr__(self):
        return f"<shardfs.EntriesV of {self._n} entries, {len(self._pieces)} pieces>"
