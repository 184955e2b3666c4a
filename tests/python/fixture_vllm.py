# SPDX-License-Identifier: MIT
"""One vLLM engine's offloading tier, built from vLLM's real classes as its
OffloadingConnector builds it (tests/python/engines.py says what of vLLM
imports here): the spec from vLLM's OffloadingSpecFactory and the
`kv_connector_extra_config`, a paged KV cache of CPU tensors in vLLM's
canonical block layout, device pointers from vLLM's resolve_device_pointers.

Run as a program it is a second engine instance (a process of its own) for
the sharing tests:

    python fixture_vllm.py RESULT SOCKET STORE store|load SEED FIRST N PAGE LAYERS

It writes its result, a JSON object, to the file RESULT (whole or not at
all: a temporary file renamed), never to stdout: stdout and stderr are for
logs. With PYTHONUNBUFFERED=1, Python's sys.stdout writes straight to the
fd and drops what a short write() leaves, and a pipe write that blocks (the
parent not reading yet) may be cut short by any interruption of the process.
(A Rank's close is not one: its io_uring ring is made by a library thread,
so its teardown interrupts no application thread; test_rank_close.)
"""
import json
import os
import sys
import time

import torch

TOKENS = 16       # tokens per block
NUM_BLOCKS = 32   # pages per layer tensor


def block_hashes(seed, n, first=0):
    """vLLM's chained block hashes of a prompt: hash_fn((parent, tokens, None))
    with vLLM's sha256_cbor (vllm.utils.hashing), the first parent being
    sha256_cbor of vLLM's fixed seed: what kv_cache_utils.hash_block_tokens
    computes (that module does not import with torch 1.13, so the chain is
    written here with vLLM's own hash function)."""
    from vllm.utils.hashing import sha256_cbor

    parent = sha256_cbor("vllm-none-hash")
    out = []
    for i in range(first + n):
        toks = tuple(seed * 100000 + i * TOKENS + t for t in range(TOKENS))
        parent = sha256_cbor((parent, toks, None))
        out.append(parent)
    return out[first:]


def offloading_config(extra, page_bytes, layers, world=1, rank=0, replicated=False, name="org/model",
                      blocks_per_chunk=1):
    from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig,
                                           OffloadingGroupConfig, OffloadingModelConfig,
                                           OffloadingParallelConfig)

    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=TOKENS,
                                      layer_names=tuple(f"layers.{i}" for i in range(layers)),
                                      group_id=0),),
        worker_kv_bytes_per_block=page_bytes * layers,
        enable_kv_cache_events=False,
        extra_config=dict(extra),
        engine_id="engine-test",
        model=OffloadingModelConfig(name=name, dtype="bfloat16", max_model_len=4096),
        cache=OffloadingCacheConfig(tokens_per_hash=TOKENS * blocks_per_chunk,
                                    blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(rank=rank, world_size=world, tp_size=world, pp_size=1,
                                          pcp_size=1, dcp_size=1, data_parallel_index=0,
                                          data_parallel_size=1, data_parallel_rank_local=None,
                                          is_parallelism_agnostic=False),
        replicated_layout=replicated)


def extra_config(sock, store_dir, **kw):
    d = {"spec_name": "ShardfsOffloadingSpec", "spec_module_path": "shardfs.vllm",
         "shardfs_socket": sock, "shardfs_store": store_dir}
    d.update(kw)
    return d


def make_spec(config):
    """The spec as vLLM's connector makes it: OffloadingSpecFactory.create_spec."""
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    return OffloadingSpecFactory.create_spec(config)


class KVCache:
    """`layers` int8 tensors of NUM_BLOCKS pages of `page` bytes (vLLM's
    canonical tensors, one data ref each), filled from `seed`. With
    `block_major`, the layer tensors are views of one tensor of NUM_BLOCKS
    rows of `layers` pages: a block's pages of successive layers adjacent."""

    def __init__(self, page, layers, seed=0, block_major=False):
        from vllm.v1.kv_offload.base import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor

        g = torch.Generator().manual_seed(seed)
        if block_major:
            self.whole = torch.randint(-128, 127, (NUM_BLOCKS, layers, page), dtype=torch.int8,
                                       generator=g)
            self.tensors = [self.whole[:, i, :] for i in range(layers)]
        else:
            self.tensors = [torch.randint(-128, 127, (NUM_BLOCKS, page), dtype=torch.int8,
                                          generator=g) for _ in range(layers)]
        self.caches = CanonicalKVCaches(
            tensors=[CanonicalKVCacheTensor(tensor=t, page_size_bytes=page) for t in self.tensors],
            group_data_refs=[[CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=page)
                              for i in range(layers)]])

    def ptrs(self, block_ids, first=0):
        """vLLM's DevicePointers of these pages (GPULoadStoreSpec, resolve_device_pointers);
        `first`: the request's block index of the first (where a chunk of
        several blocks per offloaded block starts)."""
        from vllm.v1.kv_offload.base import GPULoadStoreSpec
        from vllm.v1.kv_offload.pointer_utils import resolve_device_pointers

        return resolve_device_pointers(GPULoadStoreSpec(list(block_ids), [len(block_ids)], [first]),
                                       self.caches)

    def block(self, i):
        return b"".join(bytes(t[i].numpy().tobytes()) for t in self.tensors)


def keys_of(hashes):
    from vllm.v1.kv_offload.base import make_offload_key

    return [make_offload_key(h, 0) for h in hashes]


def finish(worker, job_ids, deadline=60.0):
    """Poll get_finished() as the connector does, until these jobs report."""
    want, got = set(job_ids), {}
    t0 = time.monotonic()
    while want - set(got):
        for r in worker.get_finished():
            got[r.job_id] = r
        if time.monotonic() - t0 > deadline:
            raise AssertionError(f"jobs {sorted(want - set(got))} not finished in {deadline} s")
        time.sleep(0.001)
    return got


def store(spec, manager, worker, cache, hashes, block_ids, job_id):
    """The connector's store: prepare_store, submit_store, complete_store.
    Returns the keys stored, or None when the tier refused."""
    from vllm.v1.kv_offload.base import ReqContext

    ctx = ReqContext(req_id=f"store-{job_id}")
    keys = keys_of(hashes)
    out = manager.prepare_store(keys, ctx)
    if out is None:
        return None
    ids = [b for k, b in zip(keys, block_ids) if k in set(out.keys_to_store)]
    if ids:
        worker.submit_store(job_id, cache.ptrs(ids), out.store_spec)
        ok = finish(worker, [job_id])[job_id].success
    else:
        ok = True
    manager.complete_store(out.keys_to_store, ctx, success=ok)
    return out.keys_to_store if ok else None


def lookup(manager, hashes):
    from vllm.v1.kv_offload.base import LookupResult, ReqContext

    ctx = ReqContext(req_id="lookup")
    return [manager.lookup(k, ctx) == LookupResult.HIT for k in keys_of(hashes)]


def load(manager, worker, cache, hashes, block_ids, job_id):
    """The connector's load: prepare_load, submit_load, get_finished. The TransferResult."""
    from vllm.v1.kv_offload.base import ReqContext

    ctx = ReqContext(req_id=f"load-{job_id}")
    keys = keys_of(hashes)
    spec = manager.prepare_load(keys, ctx)
    worker.submit_load(job_id, spec, cache.ptrs(block_ids))
    res = finish(worker, [job_id])[job_id]
    manager.complete_load(keys, ctx)
    return res


def write_result(path, out):
    """`out` as JSON in `path`, whole or not at all (written, synced, renamed)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv):
    """A second engine: store or load blocks of prompt SEED, write the result to RESULT."""
    import engines

    why = engines.why_not("vllm")
    if why:
        raise SystemExit(f"vLLM: {why}")
    result, argv = argv[0], argv[1:]
    sock, st, what, seed, first, n = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4]), int(argv[5])
    page, layers = int(argv[6]), int(argv[7])
    spec = make_spec(offloading_config(extra_config(sock, st), page, layers))
    manager = spec.get_manager()
    cache = KVCache(page, layers, seed=seed if what == "store" else 999)
    worker = spec.get_worker(cache.caches)
    hashes = block_hashes(seed, n, first)
    ids = list(range(n))
    out = {}
    if what == "store":
        out["stored"] = len(store(spec, manager, worker, cache, hashes, ids, 1) or [])
        out["blocks"] = [cache.block(i).hex() for i in ids]
    else:
        out["hits"] = lookup(manager, hashes)
        out["success"] = load(manager, worker, cache, hashes, ids, 1).success
        out["blocks"] = [cache.block(i).hex() for i in ids]
    worker.shutdown()
    manager.shutdown()
    write_result(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
