# SPDX-License-Identifier: MIT
"""A vLLM engine core as vLLM runs it, on the CPU, with shardfs as its
offloading tier: vLLM's own Scheduler (which builds the scheduler half of
vLLM's OffloadingConnector from the --kv-transfer-config), the worker half
of the same connector with a paged KV cache of CPU tensors registered as a
model runner registers its own, and a stand-in for the model's forward
pass that writes each computed block's pages. Only the model is not
vLLM's: the scheduler's decisions, the connector's lookups, loads, stores
and its completion reports are.

A block's pages are a function of its block hash (vLLM's chained prefix
hash) and its layer, so any engine can tell whether a page it holds is
what was computed for that prefix, whoever computed it.

Run as a program it is a second engine instance (a process of its own):

    python fixture_vllm_engine.py RESULT SOCKET STORE MODEL_DIR SEED NTOKENS

runs one request of NTOKENS prompt tokens made from SEED and writes its
summary (Engine.run's) as JSON to the file RESULT (renamed into place).
"""
import hashlib
import json
import os
import sys
import time

import torch

BLOCK_TOKENS = 16
NUM_BLOCKS = 32
KV_HEADS = 2
HEAD_SIZE = 64
LAYERS = tuple(f"model.layers.{i}.self_attn.attn" for i in range(4))
# One offloaded block of the one worker: K and V of every layer.
PAGE_BYTES = 2 * BLOCK_TOKENS * KV_HEADS * HEAD_SIZE * 2  # bfloat16
SHARD_SIZE = PAGE_BYTES * len(LAYERS)

MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_SIZE, "num_hidden_layers": len(LAYERS), "vocab_size": 1000,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}


def write_model_dir(path):
    """A model directory vLLM's ModelConfig reads (its config.json only: the
    tests run no weights and no tokenizer)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(MODEL_CONFIG, f)
    return path


def extra_config(sock, store, **kw):
    d = {"spec_name": "ShardfsOffloadingSpec", "spec_module_path": "shardfs.vllm",
         "shardfs_socket": sock, "shardfs_store": store}
    d.update(kw)
    return d


def prompt(seed, ntokens):
    return [1 + (seed * 7919 + i * 31) % 997 for i in range(ntokens)]


class Engine:
    """One engine: vLLM's Scheduler and the worker's OffloadingConnector."""

    def __init__(self, model_dir, extra, load_failure_policy="recompute"):
        from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                                 SchedulerConfig, VllmConfig, set_current_vllm_config)
        from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
            OffloadingConnector)
        from vllm.forward_context import ForwardContext
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                                KVCacheGroupSpec, KVCacheTensor)
        from vllm.v1.structured_output import StructuredOutputManager

        model = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="bfloat16",
                            seed=0, max_model_len=4096)
        sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=1024, max_model_len=4096,
                                is_encoder_decoder=False)
        cache = CacheConfig(block_size=BLOCK_TOKENS, cache_dtype="auto",
                            enable_prefix_caching=True)
        kv = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                              kv_connector_extra_config=extra,
                              kv_load_failure_policy=load_failure_policy)
        self.config = VllmConfig(model_config=model, cache_config=cache, scheduler_config=sched,
                                 kv_transfer_config=kv, device_config=DeviceConfig("cpu"))
        spec = FullAttentionSpec(block_size=BLOCK_TOKENS, num_kv_heads=KV_HEADS,
                                 head_size=HEAD_SIZE, dtype=torch.bfloat16)
        assert spec.page_size_bytes == PAGE_BYTES
        kv_config = KVCacheConfig(
            num_blocks=NUM_BLOCKS,
            kv_cache_tensors=[KVCacheTensor(size=PAGE_BYTES * NUM_BLOCKS, layers=[name],
                                            layer_stride=PAGE_BYTES * NUM_BLOCKS,
                                            block_stride=PAGE_BYTES) for name in LAYERS],
            kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)])
        self.config.cache_config.num_gpu_blocks = NUM_BLOCKS
        with set_current_vllm_config(self.config):
            self.scheduler = Scheduler(vllm_config=self.config, kv_cache_config=kv_config,
                                       log_stats=True,
                                       structured_output_manager=StructuredOutputManager(
                                           self.config),
                                       block_size=BLOCK_TOKENS)
            self.worker = OffloadingConnector(self.config, KVConnectorRole.WORKER, kv_config)
            # The model runner's KV cache: one tensor per layer, block first.
            self.kv = {name: torch.zeros((NUM_BLOCKS, 2, BLOCK_TOKENS, KV_HEADS, HEAD_SIZE),
                                         dtype=torch.bfloat16) for name in LAYERS}
            self.worker.register_kv_caches(self.kv)
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(BLOCK_TOKENS, sha256)
        self.context = ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={})
        self.requests = 0
        self.before_load = None  # a test's hook: called between schedule and the worker's step

    @staticmethod
    def page(layer, block_hash):
        """The page the model computes for this prefix (block hash) and layer."""
        seed = hashlib.sha256(bytes(block_hash) + layer.encode()).digest()
        raw = (seed * (PAGE_BYTES // len(seed)))
        return torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).view(
            2, BLOCK_TOKENS, KV_HEADS, HEAD_SIZE)

    def shard_of(self, block_hash):
        """The bytes of one offloaded block in the order the tier stores it."""
        return b"".join(bytes(self.page(name, block_hash).view(torch.uint8).numpy())
                        for name in LAYERS)

    def run(self, tokens, new_tokens=2, max_steps=200):
        """One request through the engine until it finishes; then the steps
        that let the connector finish its stores. Returns what a test asks:
        {blocks, computed (block indices the model computed), loaded (the
        others), exact (every full block's pages what its prefix computes),
        steps, status (the request's, e.g. FINISHED_LENGTH_CAPPED)}."""
        from vllm import SamplingParams
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
        from vllm.v1.request import Request

        self.requests += 1
        rid = f"req-{os.getpid()}-{self.requests}"
        params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
        req = Request(request_id=rid, prompt_token_ids=list(tokens), sampling_params=params,
                      pooling_params=None, block_hasher=self.hasher)
        self.scheduler.add_request(req)
        nfull = len(tokens) // BLOCK_TOKENS
        computed, exact, block_ids, steps = set(), None, None, 0
        while self.scheduler.requests:
            steps += 1
            if steps > max_steps:
                raise AssertionError(f"the request did not finish in {max_steps} steps")
            out = self.scheduler.schedule()
            if self.before_load is not None:
                self.before_load(out)
            meta = out.kv_connector_metadata
            self.worker.handle_preemptions(meta)
            self.worker.bind_connector_metadata(meta)
            self.worker.start_load_kv(self.context)
            # The forward pass: the blocks it completes get their pages.
            started = {d.req_id: d.num_computed_tokens for d in out.scheduled_new_reqs}
            cached = out.scheduled_cached_reqs
            started.update(zip(cached.req_ids, cached.num_computed_tokens))
            for r_id, n in out.num_scheduled_tokens.items():
                r = self.scheduler.requests[r_id]
                ids = self.scheduler.kv_cache_manager.get_block_ids(r_id)[0]
                if r_id == rid:
                    block_ids = list(ids)
                first = started[r_id]
                for b in range(first // BLOCK_TOKENS, min((first + n) // BLOCK_TOKENS, nfull)):
                    for name in LAYERS:
                        self.kv[name][ids[b]].copy_(self.page(name, r.block_hashes[b]))
                    if r_id == rid:
                        computed.add(b)
            # What vLLM's CPU model runner does after the forward
            # (vllm/v1/worker/cpu/kv_connector.py, post_forward).
            self.worker.wait_for_save()
            done = self.worker.get_transfer_results(out.finished_req_ids)
            connector_out = KVConnectorOutput(
                finished_sending=done.finished_sending or None,
                finished_recving=done.finished_recving or None,
                failed_recving=done.failed_recving,
                invalid_block_ids=self.worker.get_block_ids_with_load_errors(),
                kv_connector_stats=self.worker.get_kv_connector_stats(),
                kv_connector_worker_meta=self.worker.build_connector_worker_meta())
            self.worker.clear_connector_metadata()
            if rid in self.scheduler.requests and block_ids is not None:
                exact = all(torch.equal(self.kv[name][block_ids[b]].view(torch.int16),
                                        self.page(name, req.block_hashes[b]).view(torch.int16))
                            for b in range(nfull) for name in LAYERS)
            running = [r.request_id for r in self.scheduler.running]
            result = ModelRunnerOutput(req_ids=running, sampled_token_ids=[[7] for _ in running],
                                       kv_connector_output=connector_out)
            self.scheduler.update_from_output(out, result)
            if not self.scheduler.running and self.scheduler.requests:
                time.sleep(0.005)  # transfers in flight: the next step polls them
        return {"blocks": nfull, "computed": sorted(computed),
                "loaded": [b for b in range(nfull) if b not in computed], "exact": exact,
                "steps": steps, "status": req.status.name}

    def shutdown(self):
        for c in (self.worker, self.scheduler.connector):
            if c is not None:
                c.shutdown()


def main(argv):
    result, sock, store, model_dir, seed, ntokens = argv
    eng = Engine(model_dir, extra_config(sock, store))
    try:
        out = eng.run(prompt(int(seed), int(ntokens)))
    finally:
        eng.shutdown()
    tmp = result + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.rename(tmp, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
