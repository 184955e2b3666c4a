# SPDX-License-Identifier: MIT
"""shardfs.sglang.ShardfsStorage: shardfs as SGLang's HiCache storage (L3).

SGLang loads it with

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "shardfs",
        "module_path": "shardfs.sglang", "class_name": "ShardfsStorage",
        "interface_v1": 1, "shardfs_mount": "/mnt/kv", "shardfs_store": "/var/lib/kvstore"}'

constructs it as ShardfsStorage(storage_config, kwargs) and hands it the host
memory pool with register_mem_pool_host(). One SGLang page is one shardfs
shard: the daemon's shard_size must be the page's bytes on one rank (K and V
of every layer; the pool's get_dummy_flat_data_page() size), checked when
the pool is registered.

Keys. SGLang names a page by a hash string. The block id of key K is the
first 16 bytes of md5(K + suffix), shard 0, where the suffix says whose
slice of the page it is, as SGLang's own file backend does:
"_<model with '/' as '-'>", then "_<tp_rank>_<tp_size>" unless the model is
MLA (every TP rank then holds the whole page, and they share one block),
then "_<pp_size>_<pp_rank>" with pipeline parallelism, then
"_cp<attn_cp_rank>_<attn_cp_size>" with attention context parallelism (each
CP rank holds its own slice). A page of another pool than KV (the v2
interface: Mamba states, SWA, indexer pages...) is key "<K>.<pool name>"
under the same rule (a Mamba state's with "_<tp_rank>_<tp_size>" even for
MLA). With should_split_heads (page_head, tp_lcm_size), a KV page is one
block per head group, each keyed as the page of the TP-tp_lcm_size rank
holding those heads. The same key in the same deployment always names the
same block files, so engine instances on a node share what they store.
`block_of(key)` / `blocks_of(key)` give the mapping.

Pages and values. A page is stored in the zero-copy path's order (its
get_page_buffer_meta pieces one after the other), whichever path moves it
(shardfs._pages); its pieces go to the library as one vectored entry. The
copying interface also stores values of any size up to the shard, and
SGLang's address form (int addresses with target_sizes); a value shorter
than the shard is framed by a 16-byte length header (shardfs._pieces).

Extra config (the same JSON object):
    shardfs_mount / shardfs_socket   where the cache is (one of them)
    shardfs_store      the store directory (the daemon's BACKEND_DIR)
    shardfs_backend    a full backend spec instead
    dir_prefix         hex characters of directory per block file (the
                       daemon's -o dir_prefix; default 0, "data/")
    store_capacity_gb  the bound the deployment expects on the store (GiB),
                       as SGLang's file backend users bound theirs: the
                       daemon owns the bound (-o store_capacity), which an
                       adapter cannot set, so the adapter reads the daemon's
                       shardfs_store_capacity_bytes and logs once whether it
                       enforces this one (a warning when it does not);
                       .store_capacity_bytes holds what it read

The host pool is host memory, so the rank copies to host memory (device
None). MLA models: the TP ranks load the same blocks, rank tp_rank of
tp_size (one backend load per page for all of them).

Errors. HiCache's backup and prefetch threads call the storage methods and
catch nothing (a raise ends the thread for the life of the process), so the
storage methods never raise once the backend is built: a store that cannot
be reached (the daemon gone), or bad input, makes every page of that call a
miss (False, None, 0), logged once per kind of error until a call succeeds
again; the rank re-attaches by itself when the daemon is back.

get_stats() answers SGLang's StorageMetrics (pages and bandwidth of the
prefetches and backups since the last call) where SGLang's metrics module
imports, else None (which SGLang's metrics collector skips). stats() is the
rank's counters. clear() does not remove anything: see its docstring.
"""
import ctypes
import functools
import hashlib
import logging
import threading
import time

from . import _pages, _pieces, _storebound
from .errors import InvalidArgument, RankClosed
from .rank import Rank

try:  # the real base class, so that SGLang's factory accepts the class
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
    HAVE_SGLANG = True
except Exception:  # noqa: BLE001 - not installed, or installed but not importable here
    _Base = object
    HAVE_SGLANG = False

try:  # batch_exists_v2's result type (newer SGLang)
    from sglang.srt.mem_cache.hicache_storage import PoolTransferResult
except Exception:  # noqa: BLE001
    class PoolTransferResult:
        """SGLang's PoolTransferResult where SGLang is not installed: the
        usable KV prefix, and the pages found per pool."""

        def __init__(self, kv_hit_pages, extra_pool_hit_pages):
            self.kv_hit_pages = kv_hit_pages
            self.extra_pool_hit_pages = extra_pool_hit_pages

        def __eq__(self, other):
            return (self.kv_hit_pages, self.extra_pool_hit_pages) == \
                (other.kv_hit_pages, other.extra_pool_hit_pages)

        def __repr__(self):
            return f"PoolTransferResult({self.kv_hit_pages}, {self.extra_pool_hit_pages})"

log = logging.getLogger(__name__)


def torch_uint8():
    import torch
    return torch.uint8


def _storage_metrics_class():
    for mod in ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector"):
        try:
            return getattr(__import__(mod, fromlist=["StorageMetrics"]), "StorageMetrics")
        except Exception:  # noqa: BLE001 - a module that does not import has no metrics
            continue
    return None


def _never_raises(miss):
    """A storage method HiCache's threads call: any error is logged (once
    per kind until a call succeeds) and answered with miss(args)."""

    def wrap(fn):
        @functools.wraps(fn)
        def call(self, *args, **kw):
            try:
                out = fn(self, *args, **kw)
            except Exception as e:  # noqa: BLE001 - a raise kills HiCache's thread
                if isinstance(e, (InvalidArgument, RankClosed)) or not isinstance(e, OSError):
                    log.error("ShardfsStorage.%s: %s (its pages are misses)", fn.__name__, e)
                    return miss(*args, **kw)
                kind = (type(e).__name__, e.errno)  # the store out of reach: logged once
                if self._failing != kind:
                    log.error("ShardfsStorage.%s: %s (every page is a miss until the store answers "
                              "again)", fn.__name__, e)
                    self._failing = kind
                return miss(*args, **kw)
            if self._failing is not None:
                log.warning("ShardfsStorage.%s: the store answers again", fn.__name__)
                self._failing = None
            return out

        return call

    return wrap


def _falses(keys, *a, **k):
    return [False] * len(keys or [])


def _nones(keys, *a, **k):
    return [None] * len(keys or [])


def _v2_misses(transfers, *a, **k):
    try:
        return {str(t.name): [False] * len(t.keys or []) for t in transfers}
    except Exception:  # noqa: BLE001
        return {}

# SGLang's PoolName.KV and PoolHitPolicy values (str enums: they compare
# equal to these strings).
KV_POOL = "kv"
MAMBA_POOL = "mamba"
ALL_PAGES = "all_pages"


def key_suffix(storage_config, tp=None, shared=None):
    """The key suffix of SGLang's file backend for this rank. tp: (rank,
    size) instead of the config's (a head group's rank with split heads);
    shared: whether the TP ranks share the page (default: MLA)."""
    model = getattr(storage_config, "model_name", None) or ""
    suffix = "_" + "-".join(model.split("/"))
    if shared is None:
        shared = bool(getattr(storage_config, "is_mla_model", False))
    if not shared:
        rank, size = tp or (storage_config.tp_rank, storage_config.tp_size)
        suffix += f"_{rank}_{size}"
    pp_size = getattr(storage_config, "pp_size", 1) or 1
    if pp_size > 1:
        suffix += f"_{pp_size}_{storage_config.pp_rank}"
    cp_size = getattr(storage_config, "attn_cp_size", 1) or 1
    if cp_size > 1:
        suffix += f"_cp{storage_config.attn_cp_rank}_{cp_size}"
    return suffix


class ShardfsStorage(_Base):
    """SGLang HiCacheStorage over shardfs.Rank (see the module's docstring)."""

    def __init__(self, storage_config, kwargs=None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        mount = extra.get("shardfs_mount")
        socket = extra.get("shardfs_socket")
        if (mount is None) == (socket is None):
            raise InvalidArgument("ShardfsStorage: set exactly one of shardfs_mount and "
                                  "shardfs_socket in the extra config")
        spec = extra.get("shardfs_backend")
        if spec is None and extra.get("shardfs_store"):
            spec = f"posix:{extra['shardfs_store']}?dir_prefix={int(extra.get('dir_prefix', 0))}"
        want = _storebound.gib(extra.get("store_capacity_gb"), "ShardfsStorage",
                               "store_capacity_gb")
        self.store_capacity_bytes = _storebound.check(log, "ShardfsStorage", want, bool(want),
                                                      mount=mount, socket=socket)
        self.storage_config = storage_config
        self.suffix = key_suffix(storage_config)
        self.tp_suffix = key_suffix(storage_config, shared=False)  # Mamba states: per TP rank
        mla = bool(getattr(storage_config, "is_mla_model", False))
        lcm = int(getattr(storage_config, "tp_lcm_size", None) or 0)
        self.split = 1
        if getattr(storage_config, "should_split_heads", False) and not mla and lcm:
            tp_size = int(storage_config.tp_size)
            if lcm % tp_size:
                raise InvalidArgument(f"ShardfsStorage: tp_lcm_size {lcm} is not a multiple of "
                                      f"tp_size {tp_size}")
            self.split = lcm // tp_size
        base = int(storage_config.tp_rank) * self.split
        self.split_suffixes = [key_suffix(storage_config, tp=(base + r, lcm))
                               for r in range(self.split)] if self.split > 1 else [self.suffix]
        rank, world = (storage_config.tp_rank, storage_config.tp_size) if mla else (0, 1)
        self.rank = Rank(mount=mount, socket=socket, backend=spec, device=None,
                         rank=rank, world=max(1, world), class_name="sglang")
        self.shard_size = self.rank.shard_size
        self.mem_pool_host = None
        self.registered_pools = {}
        self._maps = {}  # id(pool) -> its PageMap
        self.pieces = _pieces.Counters()
        self._failing = None
        self._metrics_mu = threading.Lock()
        self._metrics = ([], [], [], [])  # prefetch pages, backup pages, their GB/s

    # -- keys -------------------------------------------------------------

    def block_of(self, key, suffix=None):
        """The 16-byte block id of an SGLang page key (shard 0)."""
        if not isinstance(key, str):
            raise InvalidArgument(f"key {key!r}: SGLang page keys are str")
        return hashlib.md5((key + (suffix or self.suffix)).encode()).digest()

    def blocks_of(self, key):
        """The block ids of a KV page key: one, or one per head group with
        split heads (tp_lcm_size)."""
        return [self.block_of(key, s) for s in self.split_suffixes]

    def _blocks(self, keys, pool=None):
        """The block ids of keys' pages of a pool, and how many per key
        (split heads: the KV pool's pages are several)."""
        if pool is None or str(pool) == KV_POOL:
            if self.split > 1:
                return [self.block_of(k, s) for k in keys for s in self.split_suffixes]
            return [self.block_of(k) for k in keys]
        suffix = self.tp_suffix if str(pool) == MAMBA_POOL else self.suffix
        return [self.block_of(f"{k}.{pool}", suffix) if isinstance(k, str) else self.block_of(k)
                for k in keys]

    def _per_key(self, pool=None):
        return self.split if pool is None or str(pool) == KV_POOL else 1

    # -- the host pool ----------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host):
        page = mem_pool_host.get_dummy_flat_data_page()
        page_bytes = page.numel() * page.element_size()
        want = page_bytes // self.split
        if want != self.shard_size or page_bytes % self.split:
            split = f" split in {self.split} head groups" if self.split > 1 else ""
            raise InvalidArgument(f"ShardfsStorage: a host page{split} is {want} bytes, the shardfs "
                                  f"cache's shard {self.shard_size}: mount with -o shard_size={want}")
        self._map(mem_pool_host, KV_POOL)
        self.mem_pool_host = mem_pool_host

    def _map(self, pool, name):
        """The pool's PageMap (made once per pool)."""
        m = self._maps.get(id(pool))
        if m is None or m.pool is not pool:
            split = self.split if str(name) == KV_POOL else 1
            m = _pages.PageMap(pool, split, f"ShardfsStorage: pool {name}")
            if m.entry_bytes > self.shard_size:
                raise InvalidArgument(f"ShardfsStorage: pool {name}: a page of {m.entry_bytes} "
                                      f"bytes is larger than the shardfs cache's shard "
                                      f"{self.shard_size}")
            self._maps[id(pool)] = m
        return m

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """The v2 interface's pools, by name (PoolName: "kv", "mamba", ...).
        A pool's page may be smaller than the shard (stored with its length,
        see shardfs._pieces); a pool whose page is larger is kept, and its
        transfers fail page by page."""
        self.registered_pools[str(host_pool_name)] = host_pool

    def on_host_pools_registered(self):
        """SGLang's hook after every pool is registered: nothing to do (each
        pool is checked when its pages move)."""

    def _page_rows(self, keys, host_indices, what, pool=None, name=KV_POOL):
        """The rows of keys' pages at host_indices in a pool (the KV pool by
        default): each page its pieces, in the pool's page format."""
        pool = self.mem_pool_host if pool is None else pool
        if pool is None:
            raise InvalidArgument(f"{what}: no host pool registered (register_mem_pool_host)")
        m = self._map(pool, name)
        return m.host_rows(len(keys), host_indices, self.shard_size, str(name) == KV_POOL, what)

    def _submit(self, keys, rows, load, pool=None):
        blocks = self._blocks(keys, pool)
        return _pieces.submit(self.rank, blocks, [0] * len(blocks), rows, load, self.pieces)

    def _fold(self, statuses, pool=None):
        """One bool per key from the statuses of its entries."""
        g = self._per_key(pool)
        if g == 1:
            return [s == 0 for s in statuses]
        return [not any(statuses[i:i + g]) for i in range(0, len(statuses), g)]

    def _run(self, keys, rows, load, pool=None):
        return self._fold(self._submit(keys, rows, load, pool).finish(), pool)

    # -- zero copy (v1) -----------------------------------------------------

    @_never_raises(_falses)
    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Load each page into the host pool; one bool per key."""
        if not keys:
            return []
        t0 = time.monotonic()
        ok = self._run(keys, self._page_rows(keys, host_indices, "batch_get_v1"), True)
        self._account(0, ok, time.monotonic() - t0)
        return ok

    @_never_raises(_falses)
    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Store each page from the host pool; one bool per key."""
        if not keys:
            return []
        t0 = time.monotonic()
        ok = self._run(keys, self._page_rows(keys, host_indices, "batch_set_v1"), False)
        self._account(1, ok, time.monotonic() - t0)
        return ok

    def _account(self, which, ok, seconds):
        pages = sum(1 for x in ok if x)
        with self._metrics_mu:
            self._metrics[which].append(pages)
            self._metrics[which + 2].append(pages * self.shard_size / max(seconds, 1e-9) / 1e9)

    # -- pools (v2) ---------------------------------------------------------

    def _transfer_rows(self, transfer, what):
        """(keys, rows) of one PoolTransfer, or (keys, None) when it cannot
        be served (no such pool, indices that do not match the keys, a page
        of another size): its pages then fail, as SGLang's file backend
        fails them, without failing the other transfers."""
        name = str(transfer.name)
        keys = list(transfer.keys or [])
        pool = self.registered_pools.get(name)
        if pool is None and name == KV_POOL:
            pool = self.mem_pool_host
        if not keys:
            return keys, []
        if pool is None:
            log.error("%s: no host pool %r registered (register_mem_host_pool_v2)", what, name)
            return keys, None
        page = getattr(pool, "page_size", 1) or 1
        idx = transfer.host_indices
        if idx is None or len(idx) != len(keys) * page:
            log.error("%s: pool %r: %d keys of %d tokens, %s host indices", what, name, len(keys),
                      page, "no" if idx is None else len(idx))
            return keys, None
        try:
            return keys, self._page_rows(keys, idx, f"{what}: pool {name}", pool, name)
        except InvalidArgument as e:
            log.error("%s", e)
            return keys, None

    def _batch_v2(self, transfers, load, what):
        if isinstance(transfers, (str, bytes)) or not hasattr(transfers, "__iter__"):
            raise InvalidArgument(f"{what}: expected a list of PoolTransfer")
        results, running = {}, []
        for t in transfers:  # every transfer queued before any is waited for
            keys, rows = self._transfer_rows(t, what)
            name = str(t.name)
            if rows is None:
                results[name] = [False] * len(keys)
            elif not keys:
                results[name] = []
            else:
                running.append((name, self._submit(keys, rows, load, name)))
        for name, pt in running:
            results[name] = self._fold(pt.finish(), name)
        return results

    @_never_raises(_v2_misses)
    def batch_get_v2(self, transfers, extra_info=None):
        """Load each PoolTransfer's pages into its pool; {pool name: [bool
        per key]}."""
        return self._batch_v2(transfers, True, "batch_get_v2")

    @_never_raises(_v2_misses)
    def batch_set_v2(self, transfers, extra_info=None):
        """Store each PoolTransfer's pages from its pool; {pool name: [bool
        per key]}."""
        return self._batch_v2(transfers, False, "batch_set_v2")

    @_never_raises(lambda *a, **k: PoolTransferResult(0, {}))
    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """The usable KV prefix, respecting every extra pool's hit policy:
        "all_pages" needs the pool's page for every page of the prefix,
        "trailing_pages" only for its last len(transfer.keys) pages (at least
        one). Returns PoolTransferResult(pages, {pool: pages found})."""
        keys = list(keys or [])
        kv = self.batch_exists(keys) if keys else 0
        hits = {KV_POOL: kv} if kv else {}
        final = kv
        for t in pool_transfers or []:
            if final == 0:
                break
            name = str(t.name)
            have = self._fold([0 if h else -1 for h in self.rank.lookup(self._blocks(keys[:kv], name))],
                              name)
            if str(getattr(t, "hit_policy", ALL_PAGES)) == ALL_PAGES:
                bound = have.index(False) if False in have else kv
            else:
                tail = max(1, len(t.keys) if t.keys else 1)
                bound = 0
                for end in range(kv, 0, -1):
                    if all(have[max(0, end - tail):end]):
                        bound = end
                        break
            if bound:
                hits[name] = bound
            final = min(final, bound)
        return PoolTransferResult(final, hits)

    # -- copying interface --------------------------------------------------
    #
    # Values are flat page tensors (SGLang's copying path), tensors of any
    # size up to the shard (SGLang's generic set/get), or, with target_sizes,
    # int addresses and their sizes (the address form of SGLang's NIXL
    # backend). A flat page of the KV pool goes in the pool's page format
    # (shardfs._pages); any other value as it is, framed when shorter than
    # the shard (shardfs._pieces).

    def _value(self, v, size, what):
        """(address, bytes, what to keep alive) of a value or target."""
        if size is not None:
            if isinstance(v, bool) or not isinstance(v, int) or isinstance(size, bool) or \
                    not isinstance(size, int) or not 0 < v < 1 << 64 or size <= 0:
                raise InvalidArgument(f"{what}: the address form is an int address and an int size, "
                                      f"got {v!r} and {size!r}")
            return v, size, None
        if not all(hasattr(v, a) for a in ("data_ptr", "contiguous", "device")):
            raise InvalidArgument(f"{what}: expected a torch tensor (or an address with target_sizes), "
                                  f"got {type(v).__name__}")
        addr, n = _pieces.tensor_piece(v, what, True)
        return addr, n, v

    def _value_rows(self, addr, n, what, probe):
        """The rows of one value: a KV flat page's pieces (one row per head
        group), or the value as one row; and whether it is a KV page."""
        m = self._maps.get(id(self.mem_pool_host)) if self.mem_pool_host is not None else None
        if m is not None and n == m.page_bytes:
            return m.flat_rows(addr, self.shard_size, True, what), True
        return [_pieces.Row([(addr, n)], self.shard_size, what, exact=False, probe=probe)], False

    def _copy(self, keys, values, sizes, load, what):
        """Queue the rows of keys' values; (piece task, rows per key)."""
        blocks, rows, groups = [], [], []
        for i, (k, v, size) in enumerate(zip(keys, values, sizes)):
            addr, n, _ = self._value(v, size, f"{what} {i}")
            got, page = self._value_rows(addr, n, f"{what} {i}", load)
            if not load and not page and not got[0].framed and \
                    _pieces.header_of(ctypes.string_at(addr, _pieces.HEADER_SIZE)) is not None:
                raise InvalidArgument(f"{what} {i}: a value of the shard's size that begins as a "
                                      "shorter value's header would read back as that value")
            blocks += self._blocks([k]) if page else [self.block_of(k)]
            rows += got
            groups.append(got)
        pt = _pieces.submit(self.rank, blocks, [0] * len(blocks), rows, load, self.pieces)
        return pt, groups

    @staticmethod
    def _per_value(statuses, groups):
        ok, i = [], 0
        for g in groups:
            ok.append(not any(statuses[i:i + len(g)]))
            i += len(g)
        return ok

    def _new_page(self):
        import torch
        if self.mem_pool_host is not None:
            return self.mem_pool_host.get_dummy_flat_data_page()
        return torch.empty(self.shard_size, dtype=torch.uint8)

    @_never_raises(_nones)
    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """Load values into target_locations: tensors (new pages if None),
        or with target_sizes int addresses and their sizes. Returns the
        tensors, None for each value that failed (a missing key, a value of
        another size); in the address form None for every key, as SGLang's
        NIXL backend (the bytes are at the addresses)."""
        if not keys:
            return []
        n = len(keys)
        targets = list(target_locations) if target_locations is not None else [None] * n
        sizes = list(target_sizes) if target_sizes is not None else [None] * n
        if len(targets) != n or len(sizes) != n:
            raise InvalidArgument(f"batch_get: {n} keys, {len(targets)} targets, {len(sizes)} sizes")
        fresh = [t is None for t in targets]
        seen = set()
        for i, t in enumerate(targets):
            if t is None:
                targets[i] = self._new_page()
            elif sizes[i] is None and hasattr(t, "data_ptr"):
                if t.data_ptr() in seen:  # one buffer given for several keys: a copy each
                    import torch
                    targets[i] = torch.empty_like(t)
                seen.add(targets[i].data_ptr())
        pt, groups = self._copy(keys, targets, sizes, True, "batch_get: target")
        ok = self._per_value(pt.finish(), groups)
        if target_sizes is not None:
            return [None] * n
        out = []
        for t, good, g, new in zip(targets, ok, groups, fresh):
            stored = g[0].stored if len(g) == 1 else None
            if not good or (stored is not None and not new):
                out.append(None)  # missing, or a shorter value than the target under this key
            elif stored is not None:
                out.append(t.view(torch_uint8())[_pieces.HEADER_SIZE:_pieces.HEADER_SIZE + stored])
            else:
                out.append(t)
        return out

    @_never_raises(lambda *a, **k: None)
    def get(self, key, target_location=None, target_sizes=None):
        return self.batch_get([key], None if target_location is None else [target_location],
                              None if target_sizes is None else [target_sizes])[0]

    @_never_raises(lambda *a, **k: False)
    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """Store values: tensors of up to the shard's size (flat pages of the
        KV pool in its page format), or target_locations with target_sizes:
        int addresses and their sizes. True when every one was stored."""
        if not keys:
            return True
        n = len(keys)
        if values is None:
            values = target_locations
        values = list(values or [])
        sizes = list(target_sizes) if target_sizes is not None else [None] * n
        if len(values) != n or len(sizes) != n:
            raise InvalidArgument(f"batch_set: {n} keys, {len(values)} values, {len(sizes)} sizes")
        values = [v.contiguous() if s is None and hasattr(v, "contiguous") else v
                  for v, s in zip(values, sizes)]  # held until the dump is done
        pt, groups = self._copy(keys, values, sizes, False, "batch_set: value")
        return all(self._per_value(pt.finish(), groups))

    @_never_raises(lambda *a, **k: False)
    def set(self, key, value=None, target_location=None, target_sizes=None):
        if value is None:
            value = target_location
        return self.batch_set([key], [value], None,
                              None if target_sizes is None else [target_sizes])

    # -- existence ----------------------------------------------------------

    @_never_raises(lambda *a, **k: False)
    def exists(self, key):
        if not isinstance(key, str):
            raise InvalidArgument(f"key {key!r}: SGLang page keys are str")
        return all(self.rank.lookup(self._blocks([key])))

    @_never_raises(lambda *a, **k: 0)
    def batch_exists(self, keys, extra_info=None):
        """How many keys from the start exist (in the cache or the store;
        with split heads, every head group's page)."""
        if not keys:
            return 0
        if self.split == 1:
            return self.rank.lookup_prefix(self._blocks(keys)) + 1
        have = self._fold([0 if h else -1 for h in self.rank.lookup(self._blocks(keys))])
        return have.index(False) if False in have else len(have)

    def clear(self):
        """Removes nothing, and says so (False): the store directory is
        shared by every engine instance and deployment on the node (and by
        UCM), and a page's file is named by a hash of its key, so which
        files are this deployment's cannot be told. Remove the store's
        files, with the daemon stopped, to empty it."""
        log.warning("ShardfsStorage.clear(): nothing removed: the shardfs store is shared by every "
                    "deployment on the node and its files are named by key hashes; remove the "
                    "store directory's files with the daemon stopped to empty it")
        return False

    def get_stats(self):
        """SGLang's StorageMetrics since the last call (None where SGLang's
        metrics module does not import)."""
        cls = _storage_metrics_class()
        with self._metrics_mu:
            got, self._metrics = self._metrics, ([], [], [], [])
        if cls is None:
            return None
        return cls(prefetch_pgs=got[0], backup_pgs=got[1], prefetch_bandwidth=got[2],
                   backup_bandwidth=got[3])

    def stats(self):
        """The rank's counters (Rank.stats()), and under "pieces" the pages
        this storage moved as pieces ("vectored") and through a bounce buffer
        ("bounced": pages of more than 512 pieces)."""
        out = self.rank.stats()
        out["pieces"] = self.pieces.as_dict()
        return out

    def close(self):
        self.rank.close()


__all__ = ["ShardfsStorage", "PoolTransferResult", "key_suffix", "HAVE_SGLANG"]
