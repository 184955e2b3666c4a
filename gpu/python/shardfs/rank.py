# SPDX-License-Identifier: MIT
"""shardfs.Rank: libshardfs-rank from Python (shardfs.Task: task.py).

A Rank is one attachment of this process to the node's CacheBuffer (through
the daemon's socket or a mount point), with its own LoadQueue. load() and
dump() turn a list of entries (block, shard, buffer) into one array of
struct sfs_rank_entry -- block ids and raw addresses, never the bytes -- and
queue it as one task; the copier threads of the library move the shards
straight between the data plane and the buffers. Task.wait() sleeps in the
library with the GIL released.

Buffers: the bytes behind a buffer are checked, not its shape (a tensor's
storage size and offset, the buffer protocol's length), and buffers of
Python objects are refused. A task keeps a reference to every buffer (a
tensor and its storage, the memoryview exports that pin bytearrays and the
like) until the task is waited for or freed, because the library writes (or reads) them until then. A Task dropped
before it is done is not freed under the copier's feet: it is parked on its
Rank and freed once done (at the latest when the Rank closes).

Processes: a Rank belongs to the process that opened it. After fork() the
child opens its own (the parent's threads do not exist in the child); a call
on the parent's Rank raises RankClosed instead of hanging.
"""
import ctypes
import errno
import os
import re
import sys
import threading

from . import _lib
from .errors import (InvalidArgument, PinBudgetExceeded, PinsDisabled, RankClosed, ShardfsError,
                     check)
from .task import (_ENTRY, _MAX_SHARD, EntriesV, Task, _pack, _shard_index, block_hex,
                   block_id, pack_vectored)

__all__ = ["Rank", "Task", "Entries", "EntriesV", "block_id", "block_hex", "cuda_devices",
           "PIN_MAX_SECONDS"]

# SFS_PIN_MAX_SECONDS (shardfs/cache.h): the longest pin, 366 days.
PIN_MAX_SECONDS = 366 * 24 * 3600
# This process's pid, kept current across fork() without a getpid() per call.
_pid = os.getpid()


def _after_fork():
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork)


_INT_MAX = (1 << 31) - 1
_INT_MIN = -(1 << 31)


_tensor_type = None


def _torch_tensor_type():
    """torch.Tensor once torch is imported (by the caller), else None."""
    global _tensor_type
    if _tensor_type is None:
        torch = sys.modules.get("torch")
        if torch is not None:
            _tensor_type = torch.Tensor
    return _tensor_type


def _is_torch_tensor(obj):
    t = type(obj)
    return t.__module__.startswith("torch") and hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous")


def _strided():
    """torch.strided (torch is imported: a tensor was seen)."""
    return sys.modules["torch"].strided


def _tensor_room(buf):
    """(bytes of storage from the tensor's first byte on, its storage), or
    (-1, None) when it has no storage to ask (sparse, a tensor subclass
    without one). The shape says how many bytes a tensor claims; only its
    storage says how many there are (a storage can be resized under it)."""
    try:
        get = getattr(buf, "untyped_storage", None) or buf._storage  # torch >= 2.0 / 1.13
        st = get()
        return st.nbytes() - buf.storage_offset() * buf.element_size(), st
    except (AttributeError, RuntimeError, NotImplementedError, TypeError):
        return -1, None


def _tensor_fast(buf, size, host_only):
    """(address, keepalive) of a plain contiguous strided tensor of `size`
    bytes with storage behind all of them; None when anything is in doubt
    (_buffer_address then says what)."""
    # The layout first, an attribute: asking a sparse tensor for contiguity
    # or an address raises in torch's C++, which an ASan-preloaded
    # interpreter (the suite's sanitizer pass) cannot unwind.
    if buf.layout is not _strided():
        return None
    try:
        if not (buf.is_contiguous() and buf.numel() * buf.element_size() == size and
                (buf.is_cpu or (buf.is_cuda and not host_only))):
            return None
        addr = buf.data_ptr()
    except (RuntimeError, NotImplementedError):
        return None  # sparse and other layouts without one buffer
    if not addr:
        return None
    room, st = _tensor_room(buf)
    if room < size:
        return None
    # The storage too: a tensor set_() to another one lets go of the bytes
    # a queued task still writes.
    return addr, (buf, st)


def _buffer_address(buf, size, writable, host_only, what):
    """(address, keepalive) of a buffer of exactly `size` bytes.

    Accepted: a torch tensor (strided, contiguous, with storage behind each
    of its bytes), anything with __array_interface__ (numpy; no object
    dtype), an object exporting the buffer protocol (C-contiguous; writable
    when `writable`; no object format), or an int address (taken as is: the
    caller vouches for its size). `host_only`: device memory is refused (a
    host copier would fault on it). Whatever is refused raises
    InvalidArgument."""
    t = type(buf)
    if t is (_tensor_type or _torch_tensor_type()):
        fast = _tensor_fast(buf, size, host_only)
        if fast is not None:
            return fast  # the common case; what it doubts is said below
    if t is bool:
        raise InvalidArgument(f"{what}: a bool is not a buffer")
    if isinstance(buf, int):
        if buf <= 0 or buf >= 1 << 64:
            raise InvalidArgument(f"{what}: address {buf:#x} is not a valid pointer")
        return buf, None
    if _is_torch_tensor(buf):
        layout = getattr(buf, "layout", None)
        if layout is not None and str(layout) != "torch.strided":
            raise InvalidArgument(f"{what}: tensor is {layout}: only a strided (dense) tensor "
                                  "is one buffer (call .to_dense())")
        if not buf.is_contiguous():
            raise InvalidArgument(f"{what}: tensor is not contiguous (call .contiguous() on a "
                                  "copy, or pass a contiguous view)")
        nbytes = buf.numel() * buf.element_size()
        if nbytes != size:
            raise InvalidArgument(f"{what}: tensor holds {nbytes} bytes, the shard is {size}")
        kind = buf.device.type
        if kind not in ("cpu", "cuda"):
            raise InvalidArgument(f"{what}: tensor on {buf.device}: only CPU and CUDA memory can be copied")
        if host_only and kind != "cpu":
            raise InvalidArgument(f"{what}: tensor on {buf.device} but this Rank copies to "
                                  "host memory (device=None): open the Rank with device=N")
        if not buf.data_ptr():
            raise InvalidArgument(f"{what}: tensor has no storage (data_ptr() is 0)")
        room, st = _tensor_room(buf)
        if room < size:
            raise InvalidArgument(f"{what}: tensor's storage holds {max(room, 0)} bytes from its "
                                  f"offset, its shape says {size} (a storage resized under it?)")
        return buf.data_ptr(), (buf, st)
    ai = getattr(buf, "__array_interface__", None)
    if ai is not None and not isinstance(buf, (bytes, bytearray, memoryview)):
        addr, readonly = ai["data"]
        dtype = getattr(buf, "dtype", None)
        if getattr(dtype, "hasobject", False) or "O" in str(ai.get("typestr", "")) or \
                any("O" in str(d[1]) for d in ai.get("descr", ()) if len(d) > 1):
            raise InvalidArgument(f"{what}: array of Python objects ({dtype}): its bytes are "
                                  "object pointers, not data")
        flags = getattr(buf, "flags", None)
        if flags is not None and not flags["C_CONTIGUOUS"]:
            raise InvalidArgument(f"{what}: array is not C-contiguous")
        nbytes = getattr(buf, "nbytes", None)
        if nbytes != size:
            raise InvalidArgument(f"{what}: array holds {nbytes} bytes, the shard is {size}")
        if writable and readonly:
            raise InvalidArgument(f"{what}: array is read-only and a load writes it")
        if not addr:
            raise InvalidArgument(f"{what}: array has no data (address 0)")
        return addr, buf
    try:
        view = memoryview(buf)
    except TypeError:
        raise InvalidArgument(f"{what}: {type(buf).__name__} is not a buffer: expected a torch "
                              "tensor, a numpy array, a writable buffer or an int address") from None
    except (ValueError, BufferError) as e:  # a released memoryview, a closed mmap
        raise InvalidArgument(f"{what}: {type(buf).__name__} gives no buffer ({e})") from None
    if "O" in view.format:
        fmt = view.format
        view.release()
        raise InvalidArgument(f"{what}: buffer of Python objects (format {fmt!r}): its bytes "
                              "are object pointers, not data")
    if not view.c_contiguous:
        view.release()
        raise InvalidArgument(f"{what}: buffer is not C-contiguous")
    if view.nbytes != size:
        n = view.nbytes
        view.release()
        raise InvalidArgument(f"{what}: buffer holds {n} bytes, the shard is {size}")
    if view.readonly:
        if writable:
            view.release()
            raise InvalidArgument(f"{what}: buffer is read-only and a load writes it")
        if isinstance(buf, bytes):
            # A bytes object's storage never moves: c_char_p points into it.
            return ctypes.cast(ctypes.c_char_p(buf), ctypes.c_void_p).value, (buf, view)
        view.release()  # nothing in the standard library gives a read-only view's address
        raise InvalidArgument(f"{what}: read-only buffer of type {type(buf).__name__}: pass bytes, "
                              "a writable buffer or a numpy array")
    # The memoryview export pins the storage (a bytearray cannot be resized
    # while it lives); the ctypes array only reads its address.
    cview = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    addr = ctypes.addressof((ctypes.c_char * size).from_buffer(cview))
    return addr, (buf, view, cview)


class Entries:
    """A task's entries in columns, over one buffer: made by Rank.entries()
    and given to Rank.load() / Rank.dump() (or its own load() / dump())
    instead of a list of triples.

    Entry i is (blocks[i], shards[i], buffer + i * shard_size): the buffer
    holds the n shards one after the other (a torch tensor of n rows of
    shard_size bytes, a numpy array, a writable buffer, or an int address
    the caller vouches for). The block ids and shard indices are checked and
    packed once, when it is made; each use checks the buffer again (a few
    calls, whatever n is) and packs the addresses again only if the buffer
    moved. No Python code runs per entry, on making it or using it: this is
    the form for large tasks and tight loops.
    """

    __slots__ = ("_rank", "_blocks", "_shards", "_buffer", "_n", "_base", "_arr", "__weakref__")

    def __init__(self, rank, blocks, shards, buffer):
        what = "entries"
        n = None
        if isinstance(blocks, (str, bytes, bytearray, memoryview)):
            one = block_id(blocks)
            blocks = None
        else:
            if not hasattr(blocks, "__iter__"):
                raise InvalidArgument(f"{what}: blocks must be one block id or a list of them")
            blocks = [b if type(b) is bytes and len(b) == _lib.BLOCK_ID_LEN else block_id(b)
                      for b in blocks]
            n = len(blocks)
        if isinstance(shards, range) or (hasattr(shards, "__iter__") and not isinstance(shards, (str, bytes))):
            shards = shards if isinstance(shards, range) else [_shard_index(x) for x in shards]
            if n is not None and len(shards) != n:
                raise InvalidArgument(f"{what}: {n} block ids and {len(shards)} shard indices")
            n = len(shards)
            if n and (min(shards) < 0 or max(shards) > _MAX_SHARD):
                raise InvalidArgument(f"{what}: shard indices out of range 0..{_MAX_SHARD}")
        elif n is None:
            raise InvalidArgument(f"{what}: one block id and one shard index make one entry: "
                                  "give a list (or range) of either")
        else:
            shards = [_shard_index(shards)] * n
        if n == 0:
            raise InvalidArgument(f"{what}: no entries")
        self._rank = rank
        self._blocks = blocks if blocks is not None else [one] * n
        self._shards = shards
        self._buffer = buffer
        self._n = n
        self._base = None
        self._arr = None

    def __len__(self):
        return self._n

    def __repr__(self):
        return f"<shardfs.Entries of {self._n} over {type(self._buffer).__name__}>"

    def _packed(self, rank, writable, what):
        if rank is not self._rank:
            raise InvalidArgument(f"{what}: these entries were made by another Rank")
        size = rank.shard_size
        base, hold = _buffer_address(self._buffer, size * self._n, writable, rank._host_only,
                                     f"{what}: entries' buffer")
        if base != self._base:
            self._arr = _pack(self._blocks, self._shards, range(base, base + size * self._n, size))
            self._base = base
        return self._arr, self._n, hold

    def load(self):
        """Rank.load(self)."""
        return self._rank.load(self)

    def dump(self):
        """Rank.dump(self)."""
        return self._rank.dump(self)


class Rank:
    """One rank's attachment to the node's shardfs cache.

    Rank(mount=PATH | socket=PATH, backend=SPEC, device=None | int, rank=None, world=1)

    mount / socket: where the cache is (exactly one): a shardfs mount point
        (its user.shardfs.socket xattr names the socket) or the socket itself.
    backend: the spec of the store this rank loads misses from (a directory
        in posix layout, "posix:DIR?...", "fault:...:DIR"); None: no backend,
        a miss fails its entry with -ENOENT and dumps only fill the cache.
    device: None copies to and from host memory (CPU tensors, numpy arrays,
        buffers); an int N >= 0 uses the CUDA copier on device N (buffers may
        be device or host memory); a negative int opens the query-only
        scheduler role (lookup, lookup_prefix, touch; load/dump raise EPERM).
    rank, world: this rank's index among the `world` ranks of the node that
        load the same tasks (RearrangeIndex: rank r walks r, r+world, ...).
        rank=None: device % world with a device, else 0 (struct
        sfs_rank_config's rank_index < 0).
    Extra keywords: load_depth, rotate, prealloc, workers, key_timeout_ms
        (struct sfs_rank_config; defaults are the library's); class_name:
        the requester class the daemon's /stats counts this rank's reads
        under (sfs_rank_set_class; "rank" by default; the adapters pass
        "ucm", "sglang", "vllm"), 1..15 of [A-Za-z0-9_.-]; dump_mode:
        "write-through" (default) or "write-behind" (docs/python.md).
    """

    def __init__(self, mount=None, socket=None, backend=None, device=None, rank=None, world=1,
                 **options):
        self._ptr = None
        self._pid = os.getpid()
        self._lock = threading.Condition()
        self._users = 0
        self._closing = False
        self._parked = []
        if (mount is None) == (socket is None):
            raise InvalidArgument("Rank: give exactly one of mount= and socket=")
        for name, val in (("rank", rank), ("world", world)):
            if (val is not None or name == "world") and (isinstance(val, bool) or not isinstance(val, int)):
                raise InvalidArgument(f"Rank: {name}={val!r}: expected an int")
        if world < 1 or not 0 <= (0 if rank is None else rank) < world:
            raise InvalidArgument(f"Rank: rank={rank}, world={world}: need 0 <= rank < world")
        if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
            raise InvalidArgument(f"Rank: device={device!r}: expected None or an int")
        # struct sfs_rank_config holds them in C ints: refuse what would be cut.
        for name, val in (("device", device), ("rank", rank), ("world", world)):
            if val is not None and not _INT_MIN <= val <= _INT_MAX:
                raise InvalidArgument(f"Rank: {name}={val}: out of range of a C int "
                                      f"({_INT_MIN}..{_INT_MAX})")
        lib = _lib.lib()
        if device is not None and device >= 0 and rank is not None and rank != device % world \
                and not getattr(lib, "has_rank_index", True):
            raise ShardfsError(errno.ENOTSUP, f"Rank: rank={rank} with device={device}: "
                               f"{_lib.path()} is older than 0.2 and takes the rank index "
                               f"from the device ({device % world}); leave rank=None")
        cfg = _lib.RankConfig()
        lib.sfs_rank_config_init(ctypes.byref(cfg))
        # Keep the encoded strings alive for the call.
        self._strings = [_lib.c_path(name, s) for name, s in
                         (("socket", socket), ("mount", mount), ("backend", backend))]
        cfg.socket_path, cfg.mount_point, cfg.backend = self._strings
        cfg.local_rank_size = world
        if device is None:
            cfg.device_id = 0 if rank is None else rank
            cfg.copier = _lib.COPIER_HOST
        else:
            cfg.device_id = device
            cfg.copier = _lib.COPIER_CUDA if device >= 0 else _lib.COPIER_AUTO
        # < 0: the library takes device_id % world (rank=None with a device).
        cfg.rank_index = -1 if rank is None else rank
        dump_mode = options.pop("dump_mode", "write-through")
        mode = _lib.dump_mode(dump_mode, lib)  # refused before anything is opened
        class_name = options.pop("class_name", None)
        if class_name is not None and not (isinstance(class_name, str) and
                                           re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", class_name)):
            raise InvalidArgument(f"Rank: class_name={class_name!r}: expected 1..15 of "
                                  f"[A-Za-z0-9_.-]")
        for name, val in options.items():
            if name in ("rotate", "prealloc"):
                if not isinstance(val, bool):
                    raise InvalidArgument(f"Rank: {name}={val!r}: expected a bool")
            elif name in ("load_depth", "workers", "key_timeout_ms"):
                if isinstance(val, bool) or not isinstance(val, int) or not 0 <= val <= 0xFFFFFFFF:
                    raise InvalidArgument(f"Rank: {name}={val!r}: expected an int in 0..2^32-1")
            else:
                raise InvalidArgument(f"Rank: unknown option {name}=")
            setattr(cfg, name, val)
        err = ctypes.c_int(0)
        ptr = lib.sfs_rank_open(ctypes.byref(cfg), ctypes.byref(err))
        if not ptr:
            where = f"socket {socket}" if socket is not None else f"mount {mount}"
            hint = ""
            if err.value == -errno.ENODEV:
                hint = " (no such CUDA device, or the library was built without CUDA: device=None copies to host memory)"
            elif err.value == -errno.ENODATA:
                hint = " (not a shardfs mount: no user.shardfs.socket xattr)"
            raise ShardfsError(err.value or errno.EIO,
                               f"cannot open a rank on {where} with backend {backend!r}{hint}")
        self._ptr = ptr
        if mode:
            lib.sfs_rank_set_dump_mode(ptr, mode)  # checked above: cannot fail
        self.dump_mode = dump_mode
        if class_name is not None and hasattr(lib, "sfs_rank_set_class"):
            lib.sfs_rank_set_class(ptr, class_name.encode())  # checked above: cannot fail
        self.device = device
        if rank is None:
            rank = device % world if device is not None and device >= 0 else 0
        self.rank = rank
        self.world = world
        self.shard_size = int(lib.sfs_rank_shard_size(ptr))
        self.copier = lib.sfs_rank_copier_name(ptr).decode()
        self._host_only = self.copier == "host"

    # -- lifetime ---------------------------------------------------------

    def _enter(self, what):
        if self._pid != _pid:
            raise RankClosed(f"{what}: this Rank was opened by process {self._pid}; "
                             "after fork, open a new Rank in the child")
        with self._lock:
            if self._ptr is None or self._closing:
                raise RankClosed(f"{what}: the Rank is closed")
            self._users += 1
        return self._ptr

    def _leave(self):
        with self._lock:
            self._users -= 1
            if self._users == 0:
                self._lock.notify_all()

    def _park(self, ptr, keep):
        with self._lock:
            self._parked.append((ptr, keep))

    def _reap_parked(self, all_of_them=False):
        lib = _lib.lib()
        with self._lock:
            parked, self._parked = self._parked, []
        left = []
        for ptr, keep in parked:
            if all_of_them or lib.sfs_rank_task_done(ptr):
                if all_of_them:
                    lib.sfs_rank_wait(ptr, -1, None)
                lib.sfs_rank_task_free(ptr)
            else:
                left.append((ptr, keep))
        if left:
            with self._lock:
                self._parked.extend(left)

    @property
    def closed(self):
        return self._ptr is None

    def close(self):
        """Stop the rank: queued tasks are cancelled (-ECANCELED), started
        entries finish, then the cache is detached. Tasks stay waitable.
        Waits for calls in flight in other threads. Idempotent."""
        if self._pid != _pid:
            self._ptr = None  # the parent's: its threads are not in this process
            return
        with self._lock:
            if self._ptr is None or self._closing:
                return
            self._closing = True
            while self._users:
                self._lock.wait()
            ptr = self._ptr
        _lib.lib().sfs_rank_close(ptr)
        self._reap_parked(all_of_them=True)
        with self._lock:
            self._ptr = None
            self._closing = False

    def __enter__(self):
        if self._ptr is None:
            raise RankClosed("with: the Rank is closed")
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if getattr(self, "_ptr", None):
                self.close()
        except Exception:
            pass

    def __repr__(self):
        state = "closed" if self._ptr is None else f"copier={self.copier}, shard_size={self.shard_size}"
        return f"<shardfs.Rank rank={self.rank}/{self.world} device={self.device} {state}>"

    # -- tasks ------------------------------------------------------------

    def _entries(self, entries, writable, what):
        """The entry array (struct sfs_rank_entry[n]), n, and the objects to
        keep alive. Raw int addresses are checked and packed column-wise
        (_fast_entries); anything else, or anything the fast path doubts,
        goes through the per-entry loop, which also names the offending
        entry in its error."""
        if isinstance(entries, (str, bytes)) or not hasattr(entries, "__iter__"):
            raise InvalidArgument(f"{what}: entries must be a list of (block, shard, buffer)")
        if not isinstance(entries, (list, tuple)):
            entries = list(entries)
        if entries and type(entries[0]) is tuple and type(entries[0][-1]) is int:
            fast = self._fast_entries(entries)
            if fast is not None:
                return fast
        return self._slow_entries(entries, writable, what)

    @staticmethod
    def _fast_entries(entries):
        """(array, n, None) when every entry is (bytes[16], int, int address):
        engines that hand raw pointers (UCM's load_data, SGLang's page
        pointers); None otherwise. Each check is one pass of a builtin over
        a column: no Python bytecode per entry. (Tensors are not done this
        way: asking each tensor several questions in several passes costs
        more than the loop's one pass once they are out of the CPU caches,
        as they are after a load; Rank.entries() is their loop-free form.)"""
        if set(map(type, entries)) != {tuple} or set(map(len, entries)) != {3}:
            return None  # not all triples: the slow path says which
        blocks, shards, addrs = zip(*entries)
        if set(map(type, addrs)) != {int} or set(map(type, shards)) != {int} or \
                set(map(type, blocks)) != {bytes} or set(map(len, blocks)) != {_lib.BLOCK_ID_LEN}:
            return None
        if min(shards) < 0 or max(shards) > _MAX_SHARD or min(addrs) <= 0 or max(addrs) >= 1 << 64:
            return None
        return _pack(blocks, shards, addrs), len(blocks), None

    def _slow_entries(self, entries, writable, what):
        """The per-entry loop: every kind of buffer, and exact errors."""
        n = len(entries)
        raw = bytearray(_ENTRY.size * n)
        keep = []
        size = self.shard_size
        host_only = self._host_only
        pack = _ENTRY.pack_into
        tensor_type = _torch_tensor_type()
        for i, ent in enumerate(entries):
            try:
                block, shard, buf = ent
            except (TypeError, ValueError):
                raise InvalidArgument(f"{what}: entry {i} is not a (block, shard, buffer) triple") from None
            if type(block) is not bytes or len(block) != _lib.BLOCK_ID_LEN:
                block = block_id(block)
            if type(shard) is not int or not 0 <= shard <= _MAX_SHARD:
                shard = _shard_index(shard)
            fast = _tensor_fast(buf, size, host_only) if type(buf) is tensor_type else None
            if fast is not None:
                addr, hold = fast  # the common case, checked as _buffer_address does
                keep.append(hold)
            elif type(buf) is int and 0 < buf < 1 << 64:
                addr = buf  # a raw address: the caller vouches for it
            else:
                addr, hold = _buffer_address(buf, size, writable, host_only, f"{what}: entry {i}")
                if hold is not None:
                    keep.append(hold)
            pack(raw, i * _ENTRY.size, block, shard, addr)
        return (_lib.Entry * n).from_buffer(raw), n, keep

    def entries(self, blocks, shards, buffer):
        """A task's entries in columns over one buffer (see Entries): entry i
        is (blocks[i], shards[i]) at buffer + i * shard_size. `blocks`: one
        block id for every entry, or a list; `shards`: one index, or a list
        or range; `buffer`: n * shard_size bytes (a torch tensor of n rows,
        a numpy array, a writable buffer, or an int address). Pass the
        result to load() or dump(), as often as wanted."""
        return Entries(self, blocks, shards, buffer)

    def _submit(self, fn_name, entries, writable, kind):
        if type(entries) is Entries:
            arr, n, keep = entries._packed(self, writable, kind)
        else:
            arr, n, keep = self._entries(entries, writable, kind)
        return self._queue(fn_name, arr, n, keep, kind)

    def _queue(self, fn_name, arr, n, keep, kind, extra=()):
        """Queue the packed entries with fn_name (its arguments after the
        entry count: `extra`, then the task's address); the Task keeps `keep`."""
        if n == 0:
            return Task(self, None, 0, None, kind)
        if self._parked:
            self._reap_parked()
        # Everything the Task needs is made before the submit: once the task
        # is queued the copier runs, and any Python work of this thread until
        # it sleeps in wait() competes with it for a CPU (measured: about 1 us
        # of copy time per us of such work on a busy 2-CPU host).
        task = Task(self, None, n, keep, kind)
        fn = getattr(_lib.lib(), fn_name)
        out = ctypes.c_void_p()
        ptr = self._enter(kind)
        try:
            rc = fn(ptr, arr, n, *extra, ctypes.byref(out))
        finally:
            self._leave()
        if rc < 0:
            task._keep = None
            if rc == -errno.EPERM:
                raise ShardfsError(errno.EPERM, f"{kind}: this Rank is the query-only scheduler "
                                   "role (device < 0)")
            if rc == -errno.EOPNOTSUPP and extra:
                raise ShardfsError(errno.EOPNOTSUPP, f"{kind} after a CUDA event: the {self.copier} "
                                   "copier cannot wait for a device's stream (synchronize the "
                                   "event, then dumpv() without after=)")
            check(rc, f"{kind} of {n} entries")
        task._ptr = out.value
        return task

    def load(self, entries):
        """Queue a load: each entry (block, shard, buffer) receives its shard
        (shard_size bytes). Returns a Task; Task.wait() gives the statuses."""
        return self._submit("sfs_rank_load", entries, True, "load")

    def dump(self, entries):
        """Queue a dump (write-through: cache and backend) of each entry's
        buffer as its (block, shard). Returns a Task."""
        return self._submit("sfs_rank_dump", entries, False, "dump")

    def _submitv(self, fn_name, entries, keep, kind, extra=()):
        if getattr(_lib.lib(), fn_name, None) is None:
            raise ShardfsError(errno.ENOTSUP, f"{kind}: the library at {_lib.path()} is older "
                               f"than 0.3 (no {fn_name})")
        if type(entries) is EntriesV:  # columns, checked and packed when made
            arr, n, pieces = entries._arr, entries._n, entries._pieces
        else:
            arr, n, pieces = pack_vectored(entries, kind)
        return self._queue(fn_name, arr, n, (pieces, keep), kind, extra)

    def loadv(self, entries, keep=None):
        """Queue a load of shards made of pieces: each entry is (block,
        shard, [(address, bytes), ...]), 1 to 512 pieces whose bytes add up
        to at most shard_size; piece k receives the shard's bytes that follow
        piece k-1's (sfs_rank_loadv); or an EntriesV, the same in columns.
        Addresses are raw: the caller vouches
        for them and keeps them valid until the task is done; `keep` (any
        object) is held by the Task until then. Returns a Task."""
        return self._submitv("sfs_rank_loadv", entries, keep, "loadv")

    def dumpv(self, entries, keep=None, after=None):
        """Queue a dump of shards made of pieces (entries as for loadv): the
        shard is the pieces one after the other, zeros after the last
        (sfs_rank_dumpv). Returns a Task.

        after: a CUDA event (a cudaEvent_t as an int, e.g. torch's
        `event.cuda_event`) recorded on the stream that writes the sources:
        the copier's stream waits for it, no thread blocks
        (sfs_rank_dumpv_after; the event's record at this call counts).
        CUDA copier only: with the host copier it raises ShardfsError
        EOPNOTSUPP (synchronize, then dumpv without it). None or 0: none."""
        if after is None or after == 0:
            return self._submitv("sfs_rank_dumpv", entries, keep, "dumpv")
        if isinstance(after, bool) or not isinstance(after, int) or not 0 < after < 1 << 64:
            raise InvalidArgument(f"dumpv: after={after!r}: expected a cudaEvent_t as an int")
        return self._submitv("sfs_rank_dumpv_after", entries, keep, "dumpv",
                             (ctypes.c_void_p(after),))

    # -- queries ----------------------------------------------------------

    @staticmethod
    def _blocks(blocks, what):
        if isinstance(blocks, (str, bytes)) or not hasattr(blocks, "__iter__"):
            raise InvalidArgument(f"{what}: expected a list of block ids")
        ids = [block_id(b) for b in blocks]
        arr = (_lib.BlockId * len(ids))()
        for i, raw in enumerate(ids):
            ctypes.memmove(arr[i].b, raw, _lib.BLOCK_ID_LEN)
        return arr, len(ids)

    def lookup(self, blocks, shard=0):
        """For each block: does its shard `shard` exist (cache or backend)?"""
        arr, n = self._blocks(blocks, "lookup")
        shard = _shard_index(shard)
        if n == 0:
            return []
        present = (ctypes.c_bool * n)()
        ptr = self._enter("lookup")
        try:
            check(_lib.lib().sfs_rank_lookup(ptr, arr, n, shard, present), "lookup")
        finally:
            self._leave()
        return [bool(p) for p in present]

    def lookup_prefix(self, blocks, shard=0):
        """Index of the last block of the leading run whose shard `shard`
        exists; -1 when the first block misses (UCM's lookup_on_prefix)."""
        arr, n = self._blocks(blocks, "lookup_prefix")
        shard = _shard_index(shard)
        if n == 0:
            return -1
        ptr = self._enter("lookup_prefix")
        try:
            run = check(_lib.lib().sfs_rank_lookup_prefix(ptr, arr, n, shard), "lookup_prefix")
        finally:
            self._leave()
        return int(run) - 1

    def touch(self, blocks):
        """Mark every resident shard of each block recently used; returns the
        number of slots marked."""
        arr, n = self._blocks(blocks, "touch")
        if n == 0:
            return 0
        ptr = self._enter("touch")
        try:
            return check(_lib.lib().sfs_rank_touch(ptr, arr, n), "touch")
        finally:
            self._leave()

    def pin(self, blocks, seconds):
        """Pin every shard of each block for `seconds` (an int, 0 unpins):
        resident shards, and shards loaded while the pin lasts, are not
        evicted until the pin's absolute expiry, whether this process lives
        that long or not. Pinning a pinned block sets its expiry to now +
        seconds. All or nothing: a batch over the daemon's pin budget
        (-o pin_budget) raises PinBudgetExceeded (EDQUOT) and pins nothing;
        pins off (-o pin_budget=0) raise PinsDisabled (EPERM); ENOSPC (no
        pin table entry near a block's hash) raises ShardfsError. Returns
        the shards pinned now (0 for an unpin)."""
        if isinstance(seconds, bool):
            raise InvalidArgument(f"pin: seconds {seconds!r}: expected an int (0 unpins)")
        if not isinstance(seconds, int):
            try:
                seconds = int(seconds.__index__())
            except (AttributeError, TypeError):
                raise InvalidArgument(f"pin: seconds {seconds!r}: expected an int "
                                      "(0 unpins)") from None
        if not 0 <= seconds <= PIN_MAX_SECONDS:
            raise InvalidArgument(f"pin: seconds {seconds}: out of range 0..{PIN_MAX_SECONDS} "
                                  "(0 unpins)")
        if isinstance(blocks, (str, bytes, bytearray, memoryview)):
            raise InvalidArgument("pin: expected a list of block ids (one block: [block])")
        arr, n = self._blocks(blocks, "pin")
        fn = getattr(_lib.lib(), "sfs_rank_pin", None)
        if fn is None:
            raise ShardfsError(errno.ENOTSUP, f"pin: the library at {_lib.path()} is older "
                               "than 0.2 (no sfs_rank_pin)")
        if n == 0:
            return 0
        ptr = self._enter("pin")
        try:
            rc = fn(ptr, arr, n, seconds)
        finally:
            self._leave()
        if rc == -errno.EDQUOT:
            raise PinBudgetExceeded(f"pin of {n} blocks for {seconds} s: over the daemon's "
                                    "pin budget (-o pin_budget); nothing pinned")
        if rc == -errno.EPERM:
            raise PinsDisabled(f"pin of {n} blocks: the cache has pins off (-o pin_budget=0)")
        if rc == -errno.ENOSPC:
            raise ShardfsError(errno.ENOSPC, f"pin of {n} blocks: no pin table entry left "
                               "near a block's hash")
        return check(rc, f"pin of {n} blocks for {seconds} s")

    def prefetch(self, keys):
        """Advisory: start loading (block, shard) keys into the cache.
        Returns how many were accepted (0 is not an error)."""
        if isinstance(keys, (str, bytes)) or not hasattr(keys, "__iter__"):
            raise InvalidArgument("prefetch: expected a list of (block, shard) keys")
        keys = list(keys)
        arr = (_lib.Key * len(keys))()
        for i, k in enumerate(keys):
            try:
                block, shard = k
            except (TypeError, ValueError):
                raise InvalidArgument(f"prefetch: key {i} is not a (block, shard) pair") from None
            ctypes.memmove(arr[i].block.b, block_id(block), _lib.BLOCK_ID_LEN)
            arr[i].shard = _shard_index(shard)
        if not keys:
            return 0
        ptr = self._enter("prefetch")
        try:
            return check(_lib.lib().sfs_rank_prefetch(ptr, arr, len(keys)), "prefetch")
        finally:
            self._leave()

    def stats(self):
        """This rank's counters, and the cache's (summed over every process)
        under "cache"; see struct sfs_rank_stats in shardfs/rank.h."""
        st = _lib.RankStats()
        ptr = self._enter("stats")
        try:
            _lib.lib().sfs_rank_stats(ptr, ctypes.byref(st))
        finally:
            self._leave()
        out = {name: int(getattr(st, name)) for name in _lib.RANK_STATS_FIELDS}
        out["cache"] = {name: int(getattr(st.cache, name)) for name in _lib.CACHE_STATS_FIELDS}
        return out


def cuda_devices():
    """CUDA devices libshardfs-rank can use (0 without CUDA)."""
    return int(_lib.lib().sfs_rank_cuda_devices())
