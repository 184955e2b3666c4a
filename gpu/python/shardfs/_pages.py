# SPDX-License-Identifier: MIT
"""SGLang host pages as shards: one page format per key, whichever path moves it.

SGLang moves a host pool's page two ways: the zero-copy path hands the
page's pieces in the host buffer (get_page_buffer_meta: K then V of the page
with the page_first layouts; K and V of layer 0, then of layer 1, ... with
layer_first), the copying path a flat page tensor (get_data_page: the page's
elements in the buffer's order, so with layer_first every K layer, then
every V layer). Stored as they come, the two paths would write one key in
two byte orders. A PageMap fixes one: the shard is the page's pieces in
get_page_buffer_meta's order, and a flat page is the same pieces at their
places in the flat tensor (a flat page lists the page's regions of the
buffer in address order), moved as pieces of one vectored entry. Where the
two orders agree (page_first) the pieces of a flat page are adjacent and go
as one.

With should_split_heads (SGLang's page_head layout and a tp_lcm_size above
this instance's TP size), a page is split_factor = tp_lcm_size / tp_size
shards, one per rank of a TP-tp_lcm_size deployment: the pieces of
get_split_heads_page_buffer_meta, K and V of each head group.
"""
from .errors import InvalidArgument
from ._pieces import Row


def _first_page_indices(pool):
    import torch  # the engine's: a pool exists, so torch is imported
    return torch.arange(int(getattr(pool, "page_size", 1) or 1), dtype=torch.int64)


class PageMap:
    """How one host pool's page maps to shards: `split` entries per page,
    each `per` pieces of the pool's page meta; `flat` is each piece's
    (offset, bytes) in a flat page, in meta order (None: the flat page is
    one piece)."""

    def __init__(self, pool, split=1, what="pool"):
        self.pool = pool
        self.split = split
        page = pool.get_dummy_flat_data_page()
        self.page_bytes = int(page.numel() * page.element_size())
        if self.page_bytes % split:
            raise InvalidArgument(f"{what}: a page of {self.page_bytes} bytes does not split in {split}")
        self.entry_bytes = self.page_bytes // split
        self.per = None  # pieces per entry: unknown until a transfer when the meta fails here
        self.flat = None
        try:
            ptrs, sizes = self.meta(_first_page_indices(pool))
            ptrs, sizes = [int(p) for p in ptrs], [int(s) for s in sizes]
        except Exception:  # noqa: BLE001 - a layout without zero-copy meta: flat pages go whole
            if split > 1:
                raise InvalidArgument(f"{what}: the pool gives no split page meta") from None
            return
        if not ptrs or len(ptrs) % split:
            raise InvalidArgument(f"{what}: {len(ptrs)} pieces per page do not split in {split}")
        self.per = len(ptrs) // split
        order = sorted(range(len(ptrs)), key=ptrs.__getitem__)
        offs = [0] * len(ptrs)
        off = 0
        for k, i in enumerate(order):
            if k and ptrs[order[k - 1]] + sizes[order[k - 1]] > ptrs[i]:
                off = -1  # overlapping pieces: not a page's regions
                break
            offs[i] = off
            off += sizes[i]
        if off == self.page_bytes:
            self.flat = list(zip(offs, sizes))
        elif split > 1:
            raise InvalidArgument(f"{what}: the split page's pieces are not the flat page's "
                                  f"{self.page_bytes} bytes")

    def meta(self, indices):
        if self.split > 1:
            return self.pool.get_split_heads_page_buffer_meta(indices, self.split)
        return self.pool.get_page_buffer_meta(indices)

    def host_rows(self, nkeys, indices, shard_size, exact, what):
        """The rows (nkeys * split) of pages at host indices in the pool."""
        ptrs, sizes = self.meta(indices)
        ptrs, sizes = list(ptrs), list(sizes)
        per = self.per or max(1, len(ptrs) // max(1, nkeys * self.split))
        if len(ptrs) != len(sizes) or len(ptrs) != nkeys * self.split * per:
            raise InvalidArgument(f"{what}: {nkeys} keys, {len(ptrs)} page pointers and "
                                  f"{len(sizes)} sizes do not divide into pages of "
                                  f"{self.split * per} pieces")
        return [Row([(int(ptrs[i * per + j]), int(sizes[i * per + j])) for j in range(per)],
                    shard_size, f"{what}: page {i // self.split}", exact)
                for i in range(nkeys * self.split)]

    def flat_rows(self, addr, shard_size, exact, what):
        """The rows (split) of a flat page at addr."""
        if self.flat is None:
            return [Row([(addr, self.page_bytes)], shard_size, what, exact)]
        per = self.per
        return [Row([(addr + off, n) for off, n in self.flat[r * per:(r + 1) * per]],
                    shard_size, what, exact) for r in range(self.split)]
