# SPDX-License-Identifier: MIT
"""shardfs as vLLM's own KV offloading tier: `ShardfsOffloadingSpec`, loaded by
vLLM's OffloadingConnector through `kv_connector_extra_config`
(`"spec_name": "ShardfsOffloadingSpec", "spec_module_path": "shardfs.vllm"`).

Key idea: the tier is the node's cache, not a region of this engine. The
scheduler's manager keeps no table of its own: `lookup` asks the cache and
the store (the rank library's query-only role), so a block that any engine
on the node stored is a hit for every engine; eviction is the cache's CLOCK
(the manager never evicts, so it cannot disagree with it). The workers move
blocks with libshardfs-rank (`Rank.load`/`Rank.dump`): one offloaded block
(one `OffloadKey`) of one worker is one shard, shard `worker rank` of the
block, or shard 0 for every rank when the KV is replicated (MLA: stored once
per node by rank 0, loaded by all from the same shard, from the store at
most once).

Block ids: 16 bytes of BLAKE2b over a namespace (model, KV dtype, tokens per
block, worker bytes per block, world size unless replicated) and the
`OffloadKey` (vLLM's block hash and KV group). They are equal in every
process only if vLLM's block hashes are: `--prefix-caching-hash-algo`
sha256 or sha256_cbor (vLLM's default; its seed is `PYTHONHASHSEED`, else a
fixed string), or xxhash/xxhash_cbor with `PYTHONHASHSEED` set. xxhash
without `PYTHONHASHSEED` seeds each process at random: the tier then
refuses to share, logging why once, and stays off (misses, no stores).

A block's bytes: for each layer tensor (data ref) of its KV group, its
pages in order, as vLLM's own file tier lays out a file. When that is one
range of memory (one data ref whose page is the shard) the library copies
straight between the page and the cache (`Rank.load`/`Rank.dump`).
Otherwise the block is one vectored entry (`Rank.loadv`/`Rank.dumpv`,
`sfs_rank_loadv`/`sfs_rank_dumpv`): its pages are the pieces of the shard,
in order, adjacent ones merged, and the copier moves each piece straight
between the page and the cache, host or GPU memory alike (no staging row,
no Python step per piece). A hole before a page (a chunk of several GPU
blocks that a job moves only in part) is a piece of zeros in a dump and a
scratch row, read by nobody, in a load; the shard's tail after the last page
is the library's zeros. The library takes up to 512 pieces per entry (an
80-layer model with K and V apart is 160): a KV group whose data refs times
blocks per chunk exceed that is refused at worker start, naming the counts.

Stores are write-behind unless the extra config says `"store":
"write-through"`: a store job completes once its blocks are Ready in the
node's cache, where every engine loads them from at once; the rank library
writes them to the store in the background, holding each slot until the
store has it (docs/engines.md argues the default).

Failures never raise into vLLM: a load's statuses are per block (logged,
counted in `ShardfsOffloadingWorker.failed_blocks`); a job with any failed
block reports `success=False`, and the connector recomputes its request.
With the daemon gone, lookups miss, `prepare_store` answers None (nothing
stored), submits complete at once as failures; the rank library re-attaches
by itself when the daemon returns.
"""
import ctypes
import errno
import hashlib
import itertools
import logging
import os
import threading
import time

import numpy as np

from vllm.v1.kv_offload.base import (  # vLLM's experimental API: pinned in docs/engines.md
    LoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadingSpec,
    OffloadingWorker,
    PrepareStoreOutput,
    RequestOffloadingContext,
    TransferResult,
)

from . import _lib
from .errors import ShardfsError
from .rank import Rank
from .task import EntriesV

log = logging.getLogger("shardfs.vllm")

#: vLLM's --prefix-caching-hash-algo choices whose hashes depend on the seed
#: only: a fixed one (sha256*) unless PYTHONHASHSEED is set, random (xxhash*)
#: unless it is.
CRYPTO_ALGOS = ("sha256", "sha256_cbor")
SEEDED_ALGOS = ("xxhash", "xxhash_cbor")
RETRY_OPEN_S = 1.0
#: kv_connector_extra_config's "store": when a stored block counts as stored.
#: write-behind (the default): once it is Ready in the node's cache (every
#: engine loads it from there at once), the store's copy following in the
#: background; write-through: once the store has it too.
STORE_MODES = ("write-behind", "write-through")


def _store_mode(extra):
    mode = extra.get("store", "write-behind")
    if mode not in STORE_MODES:
        raise ValueError(f"shardfs.vllm: kv_connector_extra_config's store={mode!r}: "
                         f"expected one of {', '.join(STORE_MODES)}")
    return mode


def hash_sharing(algo, seed):
    """(shared, why): whether vLLM's block hashes under `algo` with the hash
    seed `seed` (PYTHONHASHSEED, None when unset) are equal in every process."""
    if algo in CRYPTO_ALGOS:
        how = f"PYTHONHASHSEED={seed!r}" if seed is not None else "vLLM's fixed seed"
        return True, f"prefix-caching-hash-algo {algo}, {how}: block hashes are the same in every process"
    if algo in SEEDED_ALGOS:
        if seed is not None:
            return True, f"prefix-caching-hash-algo {algo}, PYTHONHASHSEED={seed!r}: shared"
        return False, (f"prefix-caching-hash-algo {algo} without PYTHONHASHSEED seeds each "
                       "process at random: block hashes are process-local, shardfs refuses to "
                       "share them (set PYTHONHASHSEED to the same value for every engine, or "
                       "use sha256)")
    return False, f"prefix-caching-hash-algo {algo!r} is unknown to shardfs: not shared"


def _hash_algo(extra):
    """The engine's --prefix-caching-hash-algo: the extra config's
    `prefix_caching_hash_algo`, else vLLM's current config, else vLLM's
    default (sha256)."""
    algo = extra.get("prefix_caching_hash_algo")
    if algo:
        return str(algo)
    try:  # vllm.config needs torch >= 2.4: absent in some environments
        from vllm.config import get_current_vllm_config

        return str(get_current_vllm_config().cache_config.prefix_caching_hash_algo)
    except Exception:  # noqa: BLE001 - no config reachable: vLLM's default
        return "sha256"


class ShardfsLoadStoreSpec(LoadStoreSpec):
    """The blocks of a job: their 16-byte shardfs ids, in vLLM's key order."""

    def __init__(self, blocks):
        self.blocks = list(blocks)

    def __repr__(self):
        return f"ShardfsLoadStoreSpec({len(self.blocks)} blocks)"


class _Link:
    """A Rank opened lazily: a daemon down at start is retried at most once
    a second; once open, the library re-attaches by itself."""

    def __init__(self, extra, **kw):
        self.mount = extra.get("shardfs_mount")
        self.socket = extra.get("shardfs_socket")
        self.backend = extra.get("shardfs_backend")
        if self.backend is None and extra.get("shardfs_store"):
            self.backend = f"posix:{extra['shardfs_store']}?dir_prefix={int(extra.get('dir_prefix', 0))}"
        if (self.mount is None) == (self.socket is None):
            raise ValueError("shardfs.vllm: kv_connector_extra_config needs exactly one of "
                             "shardfs_mount and shardfs_socket")
        self.kw = kw
        self.rank = None
        self.next_try = 0.0
        self.down_logged = False

    def get(self):
        if self.rank is not None:
            return self.rank
        now = time.monotonic()
        if now < self.next_try:
            return None
        self.next_try = now + RETRY_OPEN_S
        try:
            self.rank = Rank(mount=self.mount, socket=self.socket, backend=self.backend,
                             **{"class_name": "vllm", **self.kw})
        except ShardfsError as e:
            self.gone(e)
            return None
        return self.rank

    def gone(self, e):
        """Log the first failure of a run of them (the rest are counted)."""
        if not self.down_logged:
            log.error("shardfs: the cache is unreachable (%s): misses, stores dropped, "
                      "until it is back", e)
            self.down_logged = True

    def ok(self):
        if self.down_logged:
            log.info("shardfs: the cache answers again")
            self.down_logged = False

    def close(self):
        if self.rank is not None:
            self.rank.close()
            self.rank = None


class ShardfsOffloadingManager(OffloadingManager):
    """The scheduler's view: every question goes to the node's cache and its
    store (query-only rank). No table, no LRU: the cache's CLOCK evicts."""

    def __init__(self, spec):
        self.spec = spec
        self.link = _Link(spec.extra_config, device=-1) if spec.shared else None
        self.misses_down = 0

    def _rank(self):
        return self.link.get() if self.link is not None else None

    def lookup(self, key, req_context):
        r = self._rank()
        if r is None:
            return LookupResult.MISS
        blk = self.spec.block_of(key)
        try:
            for shard in self.spec.slices():
                if not r.lookup([blk], shard)[0]:
                    return LookupResult.MISS
        except OSError as e:
            self.misses_down += 1
            self.link.gone(e)
            return LookupResult.MISS
        self.link.ok()
        return LookupResult.HIT

    def prepare_load(self, keys, req_context):
        blocks = [self.spec.block_of(k) for k in keys]
        r = self._rank()
        if r is not None:
            try:  # used again: the CLOCK keeps it
                r.touch(blocks)
            except OSError as e:
                self.link.gone(e)
        return ShardfsLoadStoreSpec(blocks)

    def touch(self, keys):
        r = self._rank()
        if r is not None:
            try:
                r.touch([self.spec.block_of(k) for k in keys])
            except OSError as e:
                self.link.gone(e)

    def prepare_store(self, keys, req_context):
        r = self._rank()
        if r is None:
            return None  # the cache is gone: nothing is stored
        keys = list(keys)
        blocks = [self.spec.block_of(k) for k in keys]
        try:  # a block another engine stored already is not stored again
            have = r.lookup(blocks, self.spec.slices()[-1])
        except OSError as e:
            self.link.gone(e)
            return None
        todo = [i for i, h in enumerate(have) if not h]
        return PrepareStoreOutput(keys_to_store=[keys[i] for i in todo],
                                  store_spec=ShardfsLoadStoreSpec([blocks[i] for i in todo]),
                                  evicted_keys=[])

    def on_new_request(self, req_context):
        return RequestOffloadingContext()  # vLLM's default: new chunks only

    def complete_store(self, keys, req_context, success=True):
        return  # stored write-through by the workers; nothing to track here

    def shutdown(self):
        if self.link is not None:
            self.link.close()


class _Job:
    __slots__ = ("task", "load", "nbytes", "t0", "blocks", "statuses")

    def __init__(self, load, blocks, nbytes):
        self.task = None
        self.load = load
        self.nbytes = nbytes
        self.t0 = time.perf_counter()
        self.blocks = blocks
        self.statuses = None


class ShardfsOffloadingWorker(OffloadingWorker):
    """A worker's transfers: one Rank task per job, finished when polled.

    `failed_blocks` counts blocks whose transfer failed; `last_failures`
    keeps the latest per job: {job_id: [(block hex, -errno), ...]}."""

    def __init__(self, spec, kv_caches):
        self.spec = spec
        self.kv_caches = kv_caches
        par = spec.config.parallel
        self.shard = 0 if spec.replicated_layout else par.rank
        gpu = sorted({t.tensor.device.index or 0 for t in kv_caches.tensors
                      if t.tensor.device.type == "cuda"})
        # A block of one worker is one entry: at most its group's data refs
        # times blocks per chunk pieces (holes of a partial chunk included).
        most = max((len(refs) for refs in kv_caches.group_data_refs), default=1) \
            * spec.blocks_per_chunk
        if most > _lib.PIECES_MAX:
            raise ValueError(f"shardfs.vllm: a block of this KV cache is up to {most} pieces "
                             f"({spec.blocks_per_chunk} blocks per chunk of up to "
                             f"{most // spec.blocks_per_chunk} data refs); the rank library "
                             f"takes at most {_lib.PIECES_MAX} pieces per shard")
        if most > 1:
            try:
                handle = _lib.lib()
            except OSError:
                handle = None  # no library at all: the link says so when it opens
            if handle is not None and getattr(handle, "sfs_rank_loadv", None) is None:
                raise ValueError(f"shardfs.vllm: a block of several pieces needs the rank "
                                 f"library's vectored entries (0.3); {_lib.path()} is older")
        self._zeros = None  # the holes of a dump, read (shard_size zeros)
        self._sink = None  # the holes of a load, written and never read
        self.store_mode = spec.store_mode
        if self.store_mode != "write-through":
            try:
                handle = _lib.lib()
            except OSError:
                handle = None
            if handle is not None and getattr(handle, "sfs_rank_set_dump_mode", None) is None:
                log.warning("shardfs: store=%s needs the rank library 0.5; %s is older: "
                            "stores are write-through", self.store_mode, _lib.path())
                self.store_mode = "write-through"
        self.link = _Link(spec.extra_config, device=gpu[0] if gpu else None, rank=par.rank,
                          world=par.world_size, dump_mode=self.store_mode)
        self.jobs = {}
        self.done_now = []
        self.failed_blocks = 0
        self.last_failures = {}
        self.lock = threading.Lock()
        r = self.link.get()
        if r is not None:
            self.check_shard_size(r.shard_size)

    def check_shard_size(self, shard_size):
        """The bytes of one offloaded block must be the cache's shard size."""
        want = self.spec.shard_bytes(self.kv_caches)
        if want != shard_size:
            raise ValueError(f"shardfs.vllm: the engine's shard_size is {want} bytes (one "
                             f"offloaded block of one worker), the shardfs cache's is "
                             f"{shard_size}: mount with -o shard_size={want}")

    # -- the entries of a job ---------------------------------------------

    def _layout(self, device_ptrs, blocks):
        """[(block, [(ptr, size, offset in shard), ...]), ...] in key order,
        the layout of vLLM's file tier (data ref, then block of the chunk)."""
        bpc = self.spec.blocks_per_chunk
        out = []
        ptrs, sizes = device_ptrs.ptrs, device_ptrs.sizes
        k = 0
        off = 0
        for gsize, nrefs, bidx in zip(device_ptrs.group_block_counts,
                                      device_ptrs.group_data_ref_counts, device_ptrs.block_indices):
            if gsize == 0:
                continue
            skip = bidx % bpc
            nchunks = -(-(gsize + skip) // bpc)
            dev = 0
            for i in range(nchunks):
                start = skip if i == 0 else 0
                n = min(bpc - start, gsize - dev)
                pieces = []
                shard_off = 0
                for d in range(nrefs):
                    base = off + d * gsize + dev
                    page = int(sizes[base])
                    for b in range(n):
                        pieces.append((int(ptrs[base + b]), page, shard_off + (start + b) * page))
                    shard_off += bpc * page
                out.append((blocks[k], pieces))
                k += 1
                dev += n
            off += gsize * nrefs
        if k != len(blocks):
            raise ValueError(f"shardfs.vllm: {len(blocks)} blocks for {k} chunks of pages")
        return out

    @staticmethod
    def _columns(device_ptrs, blocks):
        """One block per chunk (no holes): the job's pieces in columns,
        (counts per block, uint64 array of (address, bytes) rows), in the
        order of _layout, adjacent pages merged; numpy over vLLM's pointer
        arrays, no Python code per block or page."""
        ptrs = np.asarray(device_ptrs.ptrs, dtype=np.uint64)
        sizes = np.asarray(device_ptrs.sizes, dtype=np.uint64)
        counts, rows = [], []
        off = 0
        for gsize, nrefs in zip(device_ptrs.group_block_counts, device_ptrs.group_data_ref_counts):
            if gsize == 0:
                continue
            end = off + gsize * nrefs
            p = ptrs[off:end].reshape(nrefs, gsize).T  # block by block, refs in order
            n = sizes[off:end].reshape(nrefs, gsize).T
            off = end
            joins = p[:, 1:] == p[:, :-1] + n[:, :-1]  # a page that goes on the one before
            if not joins.any():  # vLLM's layer tensors: no page follows another
                rows.append(np.stack((p.ravel(), n.ravel()), axis=1))
                counts += [nrefs] * gsize
                continue
            start = np.ones((gsize, nrefs), dtype=bool)  # a block's first page starts a piece
            start[:, 1:] = ~joins
            at = np.flatnonzero(start)
            rows.append(np.stack((p.ravel()[at], np.add.reduceat(n.ravel(), at)), axis=1))
            counts += start.sum(axis=1).tolist()
        if len(counts) != len(blocks):
            raise ValueError(f"shardfs.vllm: {len(blocks)} blocks for {len(counts)} chunks of "
                             "pages")
        pieces = np.ascontiguousarray(np.concatenate(rows) if rows else np.empty((0, 2), np.uint64))
        return counts, pieces

    def _submit(self, job_id, device_ptrs, spec, load):
        blocks = spec.blocks
        job = _Job(load, blocks, int(device_ptrs.sizes.sum()))
        with self.lock:
            self.jobs[job_id] = job
        r = self.link.get()
        if r is None:
            job.statuses = [-errno.ENOTCONN] * len(blocks)
            return True
        try:
            size = r.shard_size
            cols = self._columns(device_ptrs, blocks) if self.spec.blocks_per_chunk == 1 else None
            if cols is not None:
                counts, pieces = cols
                if pieces.shape[0] == len(blocks) and bool((pieces[:, 1] == size).all()):
                    entries = list(zip(blocks, itertools.repeat(self.shard), pieces[:, 0].tolist()))
                    job.task = r.load(entries) if load else r.dump(entries)  # straight to the page
                else:
                    entries = EntriesV(blocks, self.shard, counts, pieces)
                    job.task = r.loadv(entries) if load else r.dumpv(entries)
                return True
            layout = self._layout(device_ptrs, blocks)
            if all(len(p) == 1 and p[0][1] == size and p[0][2] == 0 for _, p in layout):
                entries = [(blk, self.shard, p[0][0]) for blk, p in layout]  # straight to the page
                job.task = r.load(entries) if load else r.dump(entries)
            else:
                entries = [(blk, self.shard, self._vector(p, size, load)) for blk, p in layout]
                job.task = r.loadv(entries) if load else r.dumpv(entries)
        except OSError as e:
            self.link.gone(e)
            job.statuses = [-(e.errno or errno.EIO)] * len(blocks)
        return True  # the connector asserts on False: failures are results

    def _vector(self, pieces, size, load):
        """One block's [(ptr, bytes, offset in shard), ...] (offsets rising)
        as the pieces of a vectored entry: adjacent pages merged, a hole
        before a page filled from the zero row (a dump) or into the sink
        row (a load), both shard_size bytes of this worker."""
        vec = []
        at = 0
        for ptr, n, off in pieces:
            if off > at:
                if load:
                    if self._sink is None:
                        self._sink = (ctypes.c_char * size)()
                    pad = ctypes.addressof(self._sink)
                else:
                    if self._zeros is None:
                        self._zeros = (ctypes.c_char * size)()
                    pad = ctypes.addressof(self._zeros)
                vec.append((pad + at, off - at))
            if vec and vec[-1][0] + vec[-1][1] == ptr and off == at:
                vec[-1] = (vec[-1][0], vec[-1][1] + n)
            else:
                vec.append((ptr, n))
            at = off + n
        return vec

    def submit_store(self, job_id, device_ptrs, dst_spec):
        return self._submit(job_id, device_ptrs, dst_spec, load=False)

    def submit_load(self, job_id, src_spec, device_ptrs, expedited=False):
        return self._submit(job_id, device_ptrs, src_spec, load=True)

    # -- completions ------------------------------------------------------

    def _finish(self, job_id, job):
        st = job.statuses
        if st is None:
            try:
                st = job.task.wait()
            except OSError as e:
                st = [-(e.errno or errno.EIO)] * len(job.blocks)
        bad = [(b.hex(), s) for b, s in zip(job.blocks, st) if s != 0]
        if bad:
            self.failed_blocks += len(bad)
            self.last_failures[job_id] = bad
            log.warning("shardfs: %s job %d: %d of %d blocks failed: %s", "load" if job.load
                        else "store", job_id, len(bad), len(st),
                        ", ".join(f"{h}: {os.strerror(-s)}" for h, s in bad[:4]))
        else:
            self.link.ok()
        return TransferResult(job_id=job_id, success=not bad,
                              transfer_size=job.nbytes if not bad else None,
                              transfer_time=time.perf_counter() - job.t0 if not bad else None)

    def get_finished(self):
        out = []
        with self.lock:
            ready = [(j, job) for j, job in self.jobs.items()
                     if job.statuses is not None or job.task.done()]
            for j, _ in ready:
                del self.jobs[j]
        for j, job in ready:
            out.append(self._finish(j, job))
        return out

    def wait(self, job_ids):
        for j in job_ids:
            job = self.jobs.get(j)
            if job is not None and job.task is not None and job.statuses is None:
                try:
                    job.statuses = job.task.wait()
                except OSError as e:
                    job.statuses = [-(e.errno or errno.EIO)] * len(job.blocks)

    def shutdown(self):
        self.wait(list(self.jobs))
        self.link.close()


class ShardfsOffloadingSpec(OffloadingSpec):
    """vLLM's OffloadingSpec over the node's shardfs cache.

    kv_connector_extra_config: `shardfs_mount` or `shardfs_socket` (where the
    cache is), `shardfs_store` (the daemon's BACKEND_DIR; with `dir_prefix`,
    default 0) or `shardfs_backend` (a backend spec), and optionally
    `prefix_caching_hash_algo` (the engine's --prefix-caching-hash-algo when
    vLLM's config is not reachable from here), and `store`: "write-behind"
    (the default: a stored block is complete once it is Ready in the node's
    cache, as vLLM's CPU tier's is once copied; the store's copy follows) or
    "write-through" (complete once the store has it too)."""

    def __init__(self, config):
        super().__init__(config)
        self.replicated_layout = bool(config.replicated_layout)
        self.blocks_per_chunk = int(config.cache.blocks_per_chunk)
        algo = _hash_algo(self.extra_config)
        self.store_mode = _store_mode(self.extra_config)
        self.shared, why = hash_sharing(algo, os.environ.get("PYTHONHASHSEED"))
        if self.shared:
            log.info("shardfs: %s", why)
        else:
            log.error("shardfs: %s; the shardfs tier is off for this engine", why)
        par = config.parallel
        m = config.model
        ns = (f"shardfs-vllm\0{m.name}\0{m.dtype}\0{self.tokens_per_block}\0"
              f"{config.worker_kv_bytes_per_block}\0"
              f"{'replicated' if self.replicated_layout else par.world_size}\0")
        self._ns = ns.encode()

    def block_of(self, key):
        """The 16-byte shardfs block id of an OffloadKey (block hash + group)."""
        return hashlib.blake2b(self._ns + bytes(key), digest_size=16).digest()

    def slices(self):
        """The shards one block has: one per worker, or one if replicated."""
        return (0,) if self.replicated_layout else tuple(range(self.config.parallel.world_size))

    def shard_bytes(self, kv_caches):
        """One offloaded block of this worker: the largest group's pages."""
        return max(sum(ref.page_size_bytes for ref in refs) for refs in kv_caches.group_data_refs) \
            * self.blocks_per_chunk

    def get_manager(self):
        return ShardfsOffloadingManager(self)

    def get_worker(self, kv_caches):
        return ShardfsOffloadingWorker(self, kv_caches)
