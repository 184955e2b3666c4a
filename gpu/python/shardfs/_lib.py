# SPDX-License-Identifier: MIT
"""Loading libshardfs-rank and the ctypes mirror of its public structs.

The package binds the C library with ctypes (see docs/python.md for why not
cffi or an extension module): no compiler at install time, no dependency
beyond the standard library, and every foreign call releases the GIL. The
structs below mirror gpu/include/shardfs/rank.h and core/include/shardfs/
cache.h field for field; ctypes applies the platform's C alignment rules, so
the layouts match as long as the field lists do; at load, `_check_layout()`
lets the library fill a config into a larger poisoned buffer and refuses to
go on if it wrote past the end of ours (a library of another layout).

Where the library comes from: $SHARDFS_LIB (a path to the shared object)
when set, else the installed soname, libshardfs-rank.so.0, through the
dynamic loader (ldconfig's cache, LD_LIBRARY_PATH). Nothing else is
searched: a build tree's library is used by naming it in SHARDFS_LIB.
"""
import ctypes
import errno
import os
import threading

from .errors import InvalidArgument, ShardfsError

SONAME = "libshardfs-rank.so.0"
BLOCK_ID_LEN = 16

# enum sfs_rank_copier
COPIER_AUTO = 0
COPIER_HOST = 1
COPIER_CUDA = 2
# enum sfs_rank_dump_mode, by the names Rank(dump_mode=...) takes.
DUMP_MODES = {"write-through": 0, "write-behind": 1}


def dump_mode(name, handle):
    """The value of dump mode `name` for library `handle`: InvalidArgument
    for an unknown name, ENOTSUP for write-behind from a library older than
    0.5 (sfs_rank_set_dump_mode)."""
    if name not in DUMP_MODES:
        raise InvalidArgument(f"Rank: dump_mode={name!r}: expected one of "
                              f"{', '.join(map(repr, DUMP_MODES))}")
    if DUMP_MODES[name] and not hasattr(handle, "sfs_rank_set_dump_mode"):
        raise ShardfsError(errno.ENOTSUP, f"Rank: dump_mode={name!r}: the library at {path()} "
                           "is older than 0.5 and writes dumps through")
    return DUMP_MODES[name]


def c_path(name, val):
    """A path (or backend spec) as the C string the library reads, or None:
    a str, bytes or os.PathLike without a NUL (C would read up to it)."""
    if val is None:
        return None
    try:
        raw = os.fsencode(val)
    except TypeError:
        raise InvalidArgument(f"Rank: {name}={val!r}: expected a path (str, bytes or "
                              "os.PathLike)") from None
    if b"\0" in raw:
        raise InvalidArgument(f"Rank: {name}={val!r}: a path with a NUL byte (C would cut it "
                              "there)")
    return raw


class BlockId(ctypes.Structure):
    _fields_ = [("b", ctypes.c_uint8 * BLOCK_ID_LEN)]


class Key(ctypes.Structure):
    _fields_ = [("block", BlockId), ("shard", ctypes.c_uint32)]


class Entry(ctypes.Structure):
    _fields_ = [("block", BlockId), ("shard", ctypes.c_uint32), ("addr", ctypes.c_void_p)]


class Piece(ctypes.Structure):
    """struct sfs_rank_piece: len bytes at addr, one piece of a shard."""
    _fields_ = [("addr", ctypes.c_void_p), ("len", ctypes.c_uint64)]


class EntryV(ctypes.Structure):
    """struct sfs_rank_entryv: a shard made of npieces pieces, in order."""
    _fields_ = [("block", BlockId), ("shard", ctypes.c_uint32), ("npieces", ctypes.c_uint32),
                ("pieces", ctypes.c_void_p)]


# SFS_RANK_PIECES_MAX (shardfs/rank.h): the most pieces of one vectored entry.
PIECES_MAX = 512


class RankConfig(ctypes.Structure):
    _fields_ = [
        ("socket_path", ctypes.c_char_p),
        ("mount_point", ctypes.c_char_p),
        ("device_id", ctypes.c_int),
        ("local_rank_size", ctypes.c_int),
        ("backend", ctypes.c_char_p),
        ("load_depth", ctypes.c_uint),
        ("rotate", ctypes.c_bool),
        ("reserved0", ctypes.c_bool),
        ("prealloc", ctypes.c_bool),
        ("copier", ctypes.c_int),
        ("workers", ctypes.c_uint),
        ("key_timeout_ms", ctypes.c_uint),
        ("rank_index", ctypes.c_int),  # 0.2, in 0.1's tail padding: same size
    ]


CACHE_STATS_FIELDS = (
    "requests", "hits", "misses", "prefetched", "prefetch_hits", "bytes_read",
    "resident_bytes", "capacity_bytes", "owner_loads", "waits", "evictions",
    "failures", "takeovers", "prealloc", "touched", "reaped",
)

RANK_STATS_FIELDS = (
    "tasks", "entries", "hits", "owner_loads", "takeovers", "waits", "dumps",
    "dumps_bounced", "failed", "copies", "copy_batches", "bytes_copied",
    "prealloc", "prefetched", "max_inflight",
)


class CacheStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in CACHE_STATS_FIELDS]


class RankStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in RANK_STATS_FIELDS] + [("cache", CacheStats)]


def _prototypes(lib):
    """Declare the argument and result types of every function we call."""
    P = ctypes.c_void_p
    sig = {
        "sfs_rank_config_init": (None, [ctypes.POINTER(RankConfig)]),
        "sfs_rank_open": (P, [ctypes.POINTER(RankConfig), ctypes.POINTER(ctypes.c_int)]),
        "sfs_rank_close": (None, [P]),
        "sfs_rank_load": (ctypes.c_int, [P, ctypes.POINTER(Entry), ctypes.c_size_t,
                                         ctypes.POINTER(P)]),
        "sfs_rank_dump": (ctypes.c_int, [P, ctypes.POINTER(Entry), ctypes.c_size_t,
                                         ctypes.POINTER(P)]),
        "sfs_rank_loadv": (ctypes.c_int, [P, ctypes.POINTER(EntryV), ctypes.c_size_t,
                                          ctypes.POINTER(P)]),
        "sfs_rank_dumpv": (ctypes.c_int, [P, ctypes.POINTER(EntryV), ctypes.c_size_t,
                                          ctypes.POINTER(P)]),
        "sfs_rank_dumpv_after": (ctypes.c_int, [P, ctypes.POINTER(EntryV), ctypes.c_size_t, P,
                                                ctypes.POINTER(P)]),
        "sfs_rank_wait": (ctypes.c_int, [P, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]),
        "sfs_rank_task_done": (ctypes.c_bool, [P]),
        "sfs_rank_task_size": (ctypes.c_size_t, [P]),
        "sfs_rank_task_free": (None, [P]),
        "sfs_rank_lookup": (ctypes.c_int, [P, ctypes.POINTER(BlockId), ctypes.c_size_t,
                                           ctypes.c_uint32, ctypes.POINTER(ctypes.c_bool)]),
        "sfs_rank_lookup_prefix": (ctypes.c_long, [P, ctypes.POINTER(BlockId), ctypes.c_size_t,
                                                   ctypes.c_uint32]),
        "sfs_rank_touch": (ctypes.c_int, [P, ctypes.POINTER(BlockId), ctypes.c_size_t]),
        "sfs_rank_pin": (ctypes.c_int, [P, ctypes.POINTER(BlockId), ctypes.c_size_t,
                                        ctypes.c_uint32]),
        "sfs_rank_prefetch": (ctypes.c_int, [P, ctypes.POINTER(Key), ctypes.c_size_t]),
        "sfs_rank_stats": (None, [P, ctypes.POINTER(RankStats)]),
        "sfs_rank_shard_size": (ctypes.c_uint64, [P]),
        "sfs_rank_copier_name": (ctypes.c_char_p, [P]),
        "sfs_rank_cuda_devices": (ctypes.c_int, []),
        "sfs_rank_set_class": (ctypes.c_int, [P, ctypes.c_char_p]),
        "sfs_rank_set_dump_mode": (ctypes.c_int, [P, ctypes.c_int]),
    }
    # New in SHARDFS_RANK_0.2 (pin) and 0.3 (the vectored calls): Rank.pin
    # and Rank.loadv/dumpv (and dumpv's after=) say when they are missing.
    optional = {"sfs_rank_pin", "sfs_rank_loadv", "sfs_rank_dumpv", "sfs_rank_dumpv_after",
                "sfs_rank_set_class",  # 0.4
                "sfs_rank_set_dump_mode"}  # 0.5
    for name, (res, args) in sig.items():
        if name in optional and not hasattr(lib, name):
            continue
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


def _candidates():
    env = os.environ.get("SHARDFS_LIB")
    if env:
        return [env], True
    return [SONAME], False


def _check_layout(handle, where):
    size = ctypes.sizeof(RankConfig)
    buf = (ctypes.c_uint8 * (size + 64))(*([0xA5] * (size + 64)))
    handle.sfs_rank_config_init(ctypes.cast(buf, ctypes.POINTER(RankConfig)))
    if any(b != 0xA5 for b in buf[size:]):
        raise OSError(f"shardfs: {where}: struct sfs_rank_config is larger than this "
                      "package's mirror of it: package and library are of different versions")
    assert ctypes.sizeof(Entry) == 32 and ctypes.sizeof(Key) == 20
    assert ctypes.sizeof(EntryV) == 32 and ctypes.sizeof(Piece) == 16


def _has_version(handle, name, version):
    """Does the library define name@version? (0.1 libraries lack
    sfs_rank_open@SHARDFS_RANK_0.2, the one that reads rank_index.) True
    when it cannot be told (no dlvsym)."""
    try:
        dlvsym = ctypes.CDLL(None).dlvsym
    except (OSError, AttributeError):
        return True
    dlvsym.restype = ctypes.c_void_p
    dlvsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    return bool(dlvsym(handle._handle, name, version))


_lock = threading.Lock()
_lib = None


def lib():
    """The loaded library (loaded on first use). Raises OSError naming every
    place looked at when none loads."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        paths, from_env = _candidates()
        errors = []
        for path in paths:
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                errors.append(f"{path}: {e}")
                continue
            _prototypes(handle)
            _check_layout(handle, path)
            handle.has_rank_index = _has_version(handle, b"sfs_rank_open", b"SHARDFS_RANK_0.2")
            _lib = handle
            return handle
        where = "SHARDFS_LIB" if from_env else "the installed soname"
        raise OSError(
            f"shardfs: cannot load libshardfs-rank from {where} ({'; '.join(errors)}); "
            "set SHARDFS_LIB to the library's path")


def path():
    """Where the loaded library came from (for diagnostics)."""
    handle = lib()
    return handle._name
