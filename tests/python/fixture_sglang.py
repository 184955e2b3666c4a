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


class MHAPool:
    """SGLang's MHATokenToKVPoolHost as the storage backends see it, in one
    of its layouts (kv_buffer's dims as SGLang's init_kv_buffer makes them):

        layer_first  [2, layers, tokens, heads, dim]
        page_first   [2, tokens, layers, heads, dim]
        page_head    [2, pages, heads, page, layers, dim]

    get_page_buffer_meta gives each page's pieces as SGLang does (page_first,
    page_head: K page, V page; layer_first: K and V of layer 0, of layer 1,
    ...), get_split_heads_page_buffer_meta (page_head) K and V of each head
    group, get_data_page the flat page of the copying path."""

    def __init__(self, seed, layout, page=4, layers=2, heads=2, dim=512, pages=8):
        self.layout, self.page_size, self.layer_num, self.head_num = layout, page, layers, heads
        self.head_dim, self.pages, self.size = dim, pages, page * pages
        self.dtype = torch.bfloat16
        dims = {"layer_first": (2, layers, self.size, heads, dim),
                "page_first": (2, self.size, layers, heads, dim),
                "page_head": (2, pages, heads, page, layers, dim)}[layout]
        g = torch.Generator().manual_seed(seed)
        self.kv_buffer = torch.randn(*dims, generator=g).to(self.dtype)

    def _firsts(self, indices):
        return [int(indices[i]) for i in range(0, len(indices), self.page_size)]

    def get_page_buffer_meta(self, indices):
        kv, ptrs = self.kv_buffer, []
        for t in self._firsts(indices):
            if self.layout == "layer_first":
                for layer in range(self.layer_num):
                    ptrs += [kv[0, layer, t].data_ptr(), kv[1, layer, t].data_ptr()]
            elif self.layout == "page_first":
                ptrs += [kv[0, t].data_ptr(), kv[1, t].data_ptr()]
            else:
                ptrs += [kv[0, t // self.page_size].data_ptr(), kv[1, t // self.page_size].data_ptr()]
        per = self.page_bytes() // 2 // (self.layer_num if self.layout == "layer_first" else 1)
        return ptrs, [per] * len(ptrs)

    def get_split_heads_page_buffer_meta(self, indices, split):
        assert self.layout == "page_head" and self.head_num % split == 0
        kv, ptrs, step = self.kv_buffer, [], self.head_num // split
        for t in self._firsts(indices):
            for h in range(0, self.head_num, step):
                ptrs += [kv[0, t // self.page_size, h].data_ptr(), kv[1, t // self.page_size, h].data_ptr()]
        return ptrs, [self.page_bytes() // 2 // split] * len(ptrs)

    def page_bytes(self):
        return 2 * self.page_size * self.layer_num * self.head_num * self.head_dim * 2

    def _page(self, index):
        if self.layout == "layer_first":
            return self.kv_buffer[:, :, index:index + self.page_size]
        if self.layout == "page_first":
            return self.kv_buffer[:, index:index + self.page_size]
        return self.kv_buffer[:, index // self.page_size:index // self.page_size + 1]

    def get_data_page(self, index, flat=True):
        page = self._page(index)
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self):
        return torch.zeros(self.page_bytes() // 2, dtype=self.dtype)

    def set_from_flat_data_page(self, index, data_page):
        page = self._page(index)
        page.copy_(data_page.reshape(page.shape))

    def head_group(self, index, group, groups):
        """K then V of one head group of a page_head page, as bytes."""
        step = self.head_num // groups
        p = index // self.page_size
        return b"".join(self.kv_buffer[kv, p, group * step:(group + 1) * step].contiguous()
                        .view(torch.uint8).numpy().tobytes() for kv in (0, 1))


class StatePool:
    """A host pool of per-request states (SGLang's Mamba pool for the
    storage: one page per index, each `pieces` buffers of their own, e.g.
    the conv and the temporal state), `sizes` bytes each."""

    def __init__(self, seed, sizes=(1024, 3840), slots=8):
        self.page_size, self.sizes = 1, sizes
        g = torch.Generator().manual_seed(seed)
        self.buffers = [torch.randint(0, 256, (slots, n), generator=g, dtype=torch.int64)
                        .to(torch.uint8) for n in sizes]

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        for i in indices:
            for b, n in zip(self.buffers, self.sizes):
                ptrs.append(b[int(i)].data_ptr())
                sizes.append(n)
        return ptrs, sizes

    def get_dummy_flat_data_page(self):
        return torch.zeros(sum(self.sizes), dtype=torch.uint8)

    def state(self, i):
        return b"".join(b[i].numpy().tobytes() for b in self.buffers)
