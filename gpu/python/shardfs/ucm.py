# SPDX-License-Identifier: MIT
"""shardfs.ucm.ShardfsStore: shardfs as a UCM store (StoreV1 interface).

UCM's connector for vLLM loads a store class by name from a module:

    ucm_connectors:
      - ucm_connector_name: "ShardfsStore"
        ucm_connector_module_path: "shardfs.ucm"
        ucm_connector_config:
          storage_backends: "/var/lib/kvstore"   # the daemon's BACKEND_DIR
          shardfs_mount: "/mnt/kv"               # or shardfs_socket: PATH
          data_dir_shard_bytes: 0                # the daemon's -o dir_prefix

and calls it as UCM's UcmKVStoreBaseV1 (ucm/store/ucmstore_v1.py): block ids
are UCM's 16-byte ids, whose 32 hex characters name the block files of the
posix layout (one file per block, shard n at n * shard_size), so a store
UCM's PosixStore wrote is read through shardfs and the other way round. Each
worker's store is a shardfs.Rank on the node's shared CacheBuffer: what any
rank or engine instance on the node loaded or dumped, the others load from
memory, and a key the cache misses is loaded from the backend once, by one
rank, for all of them.

Configuration (the connector adds device_id, shard_size, tensor_size_list,
block_size and local_rank_size for a worker; the scheduler gets none of
those and opens the query-only role):

    shardfs_mount / shardfs_socket  where the cache is (one of them)
    storage_backends   the store directory (a list, or ':'-separated; one)
    shardfs_backend    a full backend spec instead ("fault:...:DIR", "mem:")
    data_dir_shard_bytes  hex characters of directory per block file (UCM's
                       name and default, 3; 0 is "data/"); must match the
                       daemon's -o dir_prefix
    io_direct          O_DIRECT reads in the backend (UCM's name)
    shardfs_device     "auto" (CUDA when the library has a device, else
                       host), "cuda" or "cpu" (buffers are host memory)
    shardfs_load_depth, shardfs_key_timeout_ms  rank options
    timeout_ms         UCM's per-call deadline: the rank's key_timeout_ms
                       unless shardfs_key_timeout_ms is given
    posix_capacity_gb, posix_gc_enable  the store's bound is the daemon's
                       (-o store_capacity), which an adapter cannot set: the
                       adapter reads the daemon's shardfs_store_capacity_bytes
                       and logs once whether it enforces the engine's bound
                       (a warning when it does not); .store_capacity_bytes
                       holds what it read (0: none, None: unknown)

Errors. UCM's connector catches RuntimeError only, so every error that
leaves this store is a ShardfsUcmError (a RuntimeError; .errno and .cause
say what the library answered). wait() raises ShardfsTaskError (one of
them) naming the entries that failed; task.statuses then holds the
per-entry errnos. lookup() and lookup_on_prefix() never raise for a store
that cannot be reached (the daemon gone): they answer a miss, log once, and
answer again once the rank has re-attached.

Presence. A block counts only when every one of its shards is stored (UCM's
PosixStore shows a block only once complete): with block_size known (the
worker's config, the scheduler's when it owns the store's GC), lookups check
shard 0 to shards_per_block - 1; without it, shard 0 only (logged once).
"""
import errno
import functools
import logging
import os

from . import _pieces, _storebound
from .errors import InvalidArgument, RankClosed, ShardfsError
from .rank import Rank, cuda_devices

try:
    import numpy as _np
except ImportError:  # lookup() then answers a list
    _np = None

try:  # the real base class, so that UCM's factory accepts the class
    from ucm.store.ucmstore_v1 import Task as _UcmTask
    from ucm.store.ucmstore_v1 import UcmKVStoreBaseV1 as _UcmBase
    HAVE_UCM = True
except Exception:  # noqa: BLE001 - not installed, or installed but not importable here
    _UcmTask = object
    _UcmBase = object
    HAVE_UCM = False

log = logging.getLogger(__name__)


class ShardfsUcmError(RuntimeError):
    """An error of the store as UCM sees it (a RuntimeError, which the
    connector catches); .errno is the errno, .cause the original error."""

    def __init__(self, message, err=None, cause=None):
        super().__init__(message)
        self.errno = err
        self.cause = cause


class ShardfsUcmBadInput(ShardfsUcmError, ValueError):
    """Bad input from the caller (EINVAL), as a RuntimeError."""


class ShardfsTaskError(ShardfsUcmError):
    """Some entries of a task failed; .statuses holds 0 or -errno per entry."""

    def __init__(self, kind, statuses):
        self.statuses = statuses
        bad = [(i, s) for i, s in enumerate(statuses) if s]
        shown = ", ".join(f"entry {i}: {os.strerror(-s)}" for i, s in bad[:8])
        more = f" and {len(bad) - 8} more" if len(bad) > 8 else ""
        super().__init__(f"shardfs {kind}: {len(bad)} of {len(statuses)} entries failed ({shown}{more})",
                         -bad[0][1] if bad else None)


def _ucm_errors(fn):
    """Every exception out of fn becomes a ShardfsUcmError."""

    @functools.wraps(fn)
    def call(self, *args, **kw):
        try:
            return fn(self, *args, **kw)
        except ShardfsUcmError:
            raise
        except InvalidArgument as e:
            raise ShardfsUcmBadInput(f"shardfs {fn.__name__}: {e}", e.errno, e) from e
        except Exception as e:  # noqa: BLE001 - UCM catches RuntimeError only
            raise ShardfsUcmError(f"shardfs {fn.__name__}: {e}", getattr(e, "errno", None), e) from e

    return call


class ShardfsUcmTask(_UcmTask):
    """The Task UCM gets back: wraps the shardfs task and its scatters."""

    def __init__(self, kind, piece_task):
        self.kind = kind
        self._pt = piece_task
        self.statuses = None


def _list(value):
    if value is None:
        return []
    if isinstance(value, str):
        return [p for p in value.split(":") if p]
    return [str(p) for p in value]


class ShardfsStore(_UcmBase):
    """UCM StoreV1 over shardfs.Rank (see the module's docstring)."""

    @_ucm_errors
    def __init__(self, config):
        if HAVE_UCM:
            super().__init__(config)
        self.config = config
        mount = config.get("shardfs_mount")
        socket = config.get("shardfs_socket")
        if (mount is None) == (socket is None):
            raise InvalidArgument("ShardfsStore: set exactly one of shardfs_mount and shardfs_socket")
        spec = config.get("shardfs_backend")
        if spec is None:
            dirs = _list(config.get("storage_backends"))
            if len(set(dirs)) > 1:
                raise InvalidArgument(f"ShardfsStore: storage_backends {dirs}: shardfs reads one "
                                      "store directory (the daemon's BACKEND_DIR); give one, "
                                      "or mount one shardfs daemon per directory")
            if dirs:
                prefix = int(config.get("data_dir_shard_bytes", 3))
                spec = f"posix:{dirs[0]}?dir_prefix={prefix}"
                if config.get("io_direct"):
                    spec += "&direct=1"
        device_id = int(config.get("device_id", -1))
        world = int(config.get("local_rank_size", 1) or 1)
        mode = config.get("shardfs_device", "auto")
        if mode not in ("auto", "cuda", "cpu"):
            raise InvalidArgument(f"ShardfsStore: shardfs_device={mode!r}: auto, cuda or cpu")
        options = {}
        if "shardfs_load_depth" in config:
            options["load_depth"] = int(config["shardfs_load_depth"])
        if "shardfs_key_timeout_ms" in config:
            options["key_timeout_ms"] = int(config["shardfs_key_timeout_ms"])
        elif config.get("timeout_ms"):
            options["key_timeout_ms"] = int(config["timeout_ms"])
        want = _storebound.gib(config.get("posix_capacity_gb"), "ShardfsStore",
                               "posix_capacity_gb")
        self.store_capacity_bytes = _storebound.check(
            log, "ShardfsStore", want, bool(want) or bool(config.get("posix_gc_enable")),
            mount=mount, socket=socket)
        if device_id < 0:
            device, rank = -1, 0  # the scheduler: lookups only
        elif mode == "cuda" or (mode == "auto" and cuda_devices() > 0):
            device, rank = device_id, device_id % world
        else:
            device, rank = None, device_id % world
        self.rank_options = options
        self.rank = Rank(mount=mount, socket=socket, backend=spec, device=device, rank=rank,
                         world=world, **{"class_name": "ucm", **options})
        self.shard_size = self.rank.shard_size
        want = config.get("shard_size")
        if want is not None and int(want) != self.shard_size:
            self.rank.close()
            raise InvalidArgument(f"ShardfsStore: the engine's shard_size is {int(want)} bytes, the "
                                  f"shardfs cache's is {self.shard_size}: mount with "
                                  f"-o shard_size={int(want)}")
        sizes = config.get("tensor_size_list")
        if sizes is None and config.get("tensor_size"):
            sizes = [int(config["tensor_size"])] * max(1, self.shard_size // int(config["tensor_size"]))
        self.tensor_sizes = [int(s) for s in sizes] if sizes else [self.shard_size]
        block_size = int(config.get("block_size") or 0)
        self.shards_per_block = max(1, -(-block_size // self.shard_size)) if block_size else 1
        self.block_size_known = bool(block_size)
        self._unreachable = None  # the error last logged by a lookup, until one succeeds
        self.pieces = _pieces.Counters()  # rows moved as pieces / through a bounce buffer

    # -- StoreV1 ----------------------------------------------------------

    @_ucm_errors
    def cc_store(self):
        """UCM's native handle of a store is a C++ `Store*` (its pipeline
        store's Self()), whose methods UCM's native code calls (GSA's
        prefetch engine). shardfs has no such object: this raises
        (ShardfsUcmError, ENOTSUP) rather than hand out a pointer that would
        be called as one. Native code written for libshardfs-rank takes
        `self.rank` (a shardfs.Rank) instead."""
        self.rank._enter("cc_store")  # a closed store says so first
        self.rank._leave()
        raise ShardfsUcmError("shardfs cc_store: ShardfsStore has no UCM C++ Store for native "
                              "code to call (UCM's GSA prefetch engine needs one); use UCM's "
                              "Python load path, or a UCM C++ store", errno.ENOTSUP)

    def _present(self, block_ids, what):
        """Per block: is every shard stored? All False (logged once) when the
        store cannot be reached."""
        blocks = list(block_ids)
        if not blocks:
            return []
        if not self.block_size_known and self._unreachable is None:
            log.info("ShardfsStore: no block_size in the config: %s checks shard 0 only", what)
        try:
            have = self.rank.lookup(blocks)
            for s in range(1, self.shards_per_block):
                more = self.rank.lookup(blocks, s)
                have = [a and b for a, b in zip(have, more)]
        except (InvalidArgument, RankClosed):
            raise
        except ShardfsError as e:
            if self._unreachable != e.errno:
                log.error("ShardfsStore %s: %s: every block is a miss until the store is back", what, e)
            self._unreachable = e.errno
            return [False] * len(blocks)
        if self._unreachable is not None:
            log.warning("ShardfsStore %s: the store answers again", what)
            self._unreachable = None
        return have

    @_ucm_errors
    def lookup(self, block_ids):
        """Per block: stored whole? (a numpy bool array, as UCM's stores answer)"""
        have = self._present(block_ids, "lookup")
        return _np.array(have, dtype=bool) if _np is not None else have

    @_ucm_errors
    def lookup_on_prefix(self, block_ids):
        """Last index of the leading run of blocks stored whole; -1 on a first miss."""
        blocks = list(block_ids)
        if self.shards_per_block == 1:
            try:
                run = self.rank.lookup_prefix(blocks)
            except (InvalidArgument, RankClosed):
                raise
            except ShardfsError:
                run = None
            if run is not None:
                self._unreachable = None
                return run
        have = self._present(blocks, "lookup_on_prefix")
        return have.index(False) - 1 if False in have else len(have) - 1

    @_ucm_errors
    def lookup_on_reverse(self, block_ids):
        """Index of the rightmost block stored whole; -1 when none is
        (UCM 0.8's reverse scan, for hybrid models' Mamba blocks)."""
        have = self._present(block_ids, "lookup_on_reverse")
        return len(have) - 1 - have[::-1].index(True) if True in have else -1

    @_ucm_errors
    def prefetch(self, block_ids):
        keys = [(b, s) for b in block_ids for s in range(self.shards_per_block)]
        if keys:
            self.rank.prefetch(keys)

    def _tensor_rows(self, tensors, what):
        rows = []
        host_only = self.rank.copier == "host"
        for i, row in enumerate(tensors):
            pieces = []
            for j, t in enumerate(row):
                pieces.append(_pieces.tensor_piece(t, f"{what}: block {i} tensor {j} "
                                                   "(shardfs_device)", host_only))
            rows.append(_pieces.Row(pieces, self.shard_size, f"{what}: block {i}"))
        return rows

    def _addr_rows(self, addrs, what):
        rows = []
        sizes = self.tensor_sizes
        for i, row in enumerate(addrs):
            try:
                row = [int(a) for a in (row.tolist() if hasattr(row, "tolist") else row)]
            except (TypeError, ValueError):
                raise InvalidArgument(f"{what}: block {i}: an address is not an int") from None
            if len(row) == 1 and len(sizes) != 1:
                pieces = [(row[0], self.shard_size)]
            elif len(row) != len(sizes):
                raise InvalidArgument(f"{what}: block {i} has {len(row)} addresses, the layout "
                                      f"(tensor_size_list) {len(sizes)}")
            else:
                pieces = list(zip(row, sizes))
            rows.append(_pieces.Row(pieces, self.shard_size, f"{what}: block {i}"))
        return rows

    def _go(self, kind, block_ids, shard_index, rows, keep=None, after=None):
        block_ids = list(block_ids)
        shard_index = list(shard_index)
        pt = _pieces.submit(self.rank, block_ids, shard_index, rows, kind == "load", self.pieces,
                            after=after)
        pt.keep = keep
        return ShardfsUcmTask(kind, pt)

    @_ucm_errors
    def load(self, block_ids, shard_index, dst_tensor):
        return self._go("load", block_ids, shard_index, self._tensor_rows(dst_tensor, "load"), dst_tensor)

    @_ucm_errors
    def dump(self, block_ids, shard_index, src_tensor):
        return self._go("dump", block_ids, shard_index, self._tensor_rows(src_tensor, "dump"), src_tensor)

    @_ucm_errors
    def load_data(self, block_ids, shard_index, dst_addr):
        return self._go("load", block_ids, shard_index, self._addr_rows(dst_addr, "load_data"))

    @_ucm_errors
    def dump_data(self, block_ids, shard_index, src_addr, prerequisite_handle=0):
        """The sources are complete once the engine's event
        (`prerequisite_handle`, a cudaEvent_t) is: with the CUDA copier its
        stream waits for the event (no thread blocks); with the host copier
        (host sources) this thread synchronizes it, then queues the dump."""
        rows = self._addr_rows(src_addr, "dump_data")
        after = None
        if prerequisite_handle:
            if self.rank.copier == "cuda":
                after = int(prerequisite_handle)
            else:
                _pieces.event_sync(prerequisite_handle)
        return self._go("dump", block_ids, shard_index, rows, after=after)

    fetch_data = load_data  # the name in earlier StoreV1 revisions

    @_ucm_errors
    def wait(self, task):
        """Block until the task is done; RuntimeError when any entry failed."""
        if not isinstance(task, ShardfsUcmTask):
            raise InvalidArgument(f"wait: not a task of this store ({type(task).__name__})")
        task.statuses = task._pt.finish()
        if any(task.statuses):
            raise ShardfsTaskError(task.kind, task.statuses)

    @_ucm_errors
    def check(self, task):
        """True once the task is done (then its loads are in place)."""
        if not isinstance(task, ShardfsUcmTask):
            raise InvalidArgument(f"check: not a task of this store ({type(task).__name__})")
        if not task._pt.done():
            return False
        task.statuses = task._pt.finish()
        return True

    # -- beyond StoreV1 ---------------------------------------------------

    @_ucm_errors
    def stats(self):
        """The rank's counters (Rank.stats()), and under "pieces" the rows
        this store moved as pieces ("vectored") and through a bounce buffer
        ("bounced": rows of more than 512 pieces)."""
        out = self.rank.stats()
        out["pieces"] = self.pieces.as_dict()
        return out

    @_ucm_errors
    def close(self):
        self.rank.close()


__all__ = ["ShardfsStore", "ShardfsUcmTask", "ShardfsTaskError", "ShardfsUcmError",
           "ShardfsUcmBadInput", "HAVE_UCM"]
