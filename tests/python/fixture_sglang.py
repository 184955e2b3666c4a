# SPDX-License-Identifier: MIT
"""SGLang's side of the shardfs.sglang tests (test_sglang.py, test_sglang_v2.py):
a host KV pool in SGLang's page_first layout, as much of HostKVCache as the
backend uses, and the storage config SGLang's backend factory hands a
backend. Needs torch (fixture.optional says why a module skips without it).
"""
import types

import fixture

torch, _ = fixture.optional("torch")

# kv_buffer[2, tokens, layers, heads, dim] in bf16.
PAGE, LAYERS, HEADS, DIM, PAGES = 4, 2, 2, 16, 16
ITEM = 2  # bf16
HALF = PAGE * LAYERS * HEADS * DIM * ITEM  # K (or V) of one page
SHARD = 2 * HALF


class HostPool:
    """What the backend uses of SGLang's HostKVCache (page_first layout);
    `heads` other than HEADS makes a pool of another page size."""

    def __init__(self, seed, heads=HEADS):
        self.page_size = PAGE
        self.heads = heads
        self.dtype = torch.bfloat16
        self.half = PAGE * LAYERS * heads * DIM * ITEM
        g = torch.Generator().manual_seed(seed)
        self.kv_buffer = torch.randn(2, PAGE * PAGES, LAYERS, heads, DIM, generator=g).to(self.dtype)

    def get_page_buffer_meta(self, indices):
        ptrs = []
        for i in range(0, len(indices), PAGE):
            first = int(indices[i])
            ptrs += [self.kv_buffer[0, first].data_ptr(), self.kv_buffer[1, first].data_ptr()]
        return ptrs, [self.half] * len(ptrs)

    def get_dummy_flat_data_page(self):
        return torch.zeros(2, PAGE, LAYERS, self.heads, DIM, dtype=self.dtype).flatten()

    def get_data_page(self, index, flat=True):
        page = self.kv_buffer[:, index:index + PAGE]
        return page.flatten() if flat else page

    def set_from_flat_data_page(self, index, data_page):
        self.kv_buffer[:, index:index + PAGE] = data_page.reshape(2, PAGE, LAYERS, self.heads, DIM)

    def page_bytes(self, index):
        return (self.kv_buffer[0, index:index + PAGE].contiguous().view(torch.uint8).numpy().tobytes()
                + self.kv_buffer[1, index:index + PAGE].contiguous().view(torch.uint8).numpy().tobytes())


def storage_config(daemon, extra=None, **kw):
    """The storage config of a shardfs backend on daemon's socket and store:
    rank fields as keywords (tp_rank, is_mla_model, attn_cp_size, ...),
    `extra` added to its extra_config."""
    cfg = {"backend_name": "shardfs", "module_path": "shardfs.sglang",
           "class_name": "ShardfsStorage", "interface_v1": 1,
           "shardfs_socket": daemon.sock, "shardfs_store": daemon.store}
    cfg.update(extra or {})
    base = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                model_name="org/model", dp_rank=0, dp_size=1, extra_config=cfg)
    base.update(kw)
    return types.SimpleNamespace(**base)
