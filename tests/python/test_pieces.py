# SPDX-License-Identifier: MIT
"""Pages made of pieces go to libshardfs-rank as vectored entries, and one
key has one page format whichever of SGLang's paths wrote it.

Claims:
  * SGLang's zero-copy path moves a page whose K and V halves lie apart
    (page_first), or K and V of every layer (layer_first), as one vectored
    entry: no bounce buffer (the adapter's counters; the bounce path made
    to raise), bytes exact;
  * UCM's load_data/dump_data move a block's per-layer K and V rows the
    same way;
  * the vectored path and the contiguous path (Rank.load/Rank.dump of the
    whole shard) read each other's shards byte-exact;
  * a row of more pieces than an entry takes (512) goes through a bounce
    buffer, counted, and round-trips;
  * Rank.dumpv(after=EVENT) is sfs_rank_dumpv_after: with the host copier
    it fails as the library documents it, EOPNOTSUPP, nothing queued;
  * with layer_first, an instance on the zero-copy path (interface_v1) and
    one on the copying path (get/set of flat pages), sharing a store, read
    each other's pages byte-exact (one page format per key).
"""
import ctypes
import errno
import hashlib
import unittest
from unittest import mock

import fixture
import fixture_sglang

torch, np, MISSING = fixture.optional("torch", "numpy")

import shardfs
from shardfs import _pieces, sglang, ucm

SHARD = 32768  # fixture_sglang.MHAPool's page: 2 x 4 tokens x 2 layers x 2 heads x 512 x bf16
D = fixture.ModuleDaemon(MISSING, shard_size=SHARD)
setUpModule, tearDownModule = D.up, D.down


def keys(n, salt):
    return [hashlib.sha256(f"{salt}-{i}".encode()).hexdigest() for i in range(n)]


def indices(pool, pages):
    return torch.tensor([p * pool.page_size + t for p in pages for t in range(pool.page_size)],
                        dtype=torch.int64)


def page_bytes_v1(pool, page):
    """The page as the zero-copy path lays it out: its meta pieces in order."""
    ptrs, sizes = pool.get_page_buffer_meta(indices(pool, [page]))
    import ctypes
    return b"".join(ctypes.string_at(p, n) for p, n in zip(ptrs, sizes))


def storage(layout, seed, v1=True):
    st = sglang.ShardfsStorage(fixture_sglang.storage_config(D, {"interface_v1": int(v1)}), {})
    pool = fixture_sglang.MHAPool(seed, layout)
    st.register_mem_pool_host(pool)
    return st, pool


def no_bounce():
    """The bounce path made to raise: any row that takes it fails the test."""
    def boom(*a, **k):
        raise AssertionError("a bounce buffer was used")
    return mock.patch.multiple(_pieces.Row, gather=boom, scatter=boom)


class SGLangPieces(unittest.TestCase):
    def round_trip(self, layout):
        st, pool = storage(layout, 1)
        try:
            ks = keys(3, f"pieces-{layout}")
            want = [page_bytes_v1(pool, p) for p in (0, 1, 2)]
            with no_bounce():
                self.assertEqual(st.batch_set_v1(ks, indices(pool, [0, 1, 2])), [True] * 3)
                pool.kv_buffer.zero_()
                self.assertEqual(st.batch_get_v1(ks, indices(pool, [5, 6, 7])), [True] * 3)
            self.assertEqual([page_bytes_v1(pool, p) for p in (5, 6, 7)], want)
            self.assertEqual(st.stats()["pieces"], {"vectored": 6, "bounced": 0})
            return st, ks, want
        except BaseException:
            st.close()
            raise

    def test_page_first_k_and_v_halves_go_as_pieces(self):
        st, _, _ = self.round_trip("page_first")
        st.close()

    def test_layer_first_layers_go_as_pieces(self):
        st, _, _ = self.round_trip("layer_first")
        st.close()

    def test_vectored_and_contiguous_paths_read_each_other(self):
        st, ks, want = self.round_trip("layer_first")
        try:
            r = st.rank
            dst = torch.empty(3, SHARD, dtype=torch.uint8)
            self.assertEqual(r.load([(st.block_of(k), 0, dst[i]) for i, k in enumerate(ks)]).wait(),
                             [0] * 3, "the contiguous path reads what the vectored one stored")
            self.assertEqual([dst[i].numpy().tobytes() for i in range(3)], want)
            other = keys(2, "contiguous")
            src = torch.randint(0, 256, (2, SHARD), dtype=torch.int64).to(torch.uint8)
            self.assertEqual(r.dump([(st.block_of(k), 0, src[i]) for i, k in enumerate(other)]).wait(),
                             [0, 0])
            pool = fixture_sglang.MHAPool(2, "layer_first")
            st.register_mem_pool_host(pool)
            with no_bounce():
                self.assertEqual(st.batch_get_v1(other, indices(pool, [3, 4])), [True, True])
            self.assertEqual([page_bytes_v1(pool, p) for p in (3, 4)],
                             [src[i].numpy().tobytes() for i in range(2)],
                             "the vectored path reads what the contiguous one stored")
        finally:
            st.close()

    def test_more_pieces_than_an_entry_takes_bounce(self):
        r = shardfs.Rank(socket=D.sock, backend=D.store)
        try:
            n = 60  # 514 pieces of 60 bytes: a value shorter than the shard
            src = torch.randint(0, 256, (514, 2 * n), dtype=torch.int64).to(torch.uint8)
            pieces = [(src[i].data_ptr(), n) for i in range(514)]  # every other half-row: not adjacent
            counters = _pieces.Counters()
            block = hashlib.md5(b"bounce").digest()
            rows = [_pieces.Row(pieces, SHARD, "row", exact=False)]
            self.assertEqual(_pieces.submit(r, [block], [0], rows, False, counters).finish(), [0])
            dst = torch.zeros_like(src)
            back = [(dst[i].data_ptr(), n) for i in range(514)]
            rows = [_pieces.Row(back, SHARD, "row", exact=False)]
            self.assertEqual(_pieces.submit(r, [block], [0], rows, True, counters).finish(), [0])
            self.assertTrue(torch.equal(dst[:, :n], src[:, :n]))
            self.assertEqual(counters.as_dict(), {"vectored": 0, "bounced": 2})
        finally:
            r.close()


class UcmPieces(unittest.TestCase):
    def test_per_layer_rows_go_as_pieces(self):
        layers, blocks, piece = 4, 6, SHARD // 8
        g = torch.Generator().manual_seed(5)
        kv = [[torch.randint(0, 256, (blocks, piece), generator=g, dtype=torch.int64).to(torch.uint8)
               for _ in range(2)] for _ in range(layers)]
        cfg = {"storage_backends": [D.store], "shardfs_socket": D.sock, "data_dir_shard_bytes": 0,
               "device_id": 0, "tensor_size_list": [piece] * (2 * layers), "shard_size": SHARD,
               "block_size": SHARD, "local_rank_size": 1, "shardfs_device": "cpu"}
        store = ucm.ShardfsStore(cfg)
        try:
            def rows(ids):
                return np.array([[t[b].data_ptr() for layer in kv for t in layer] for b in ids],
                                np.uint64)

            def block(b):
                return b"".join(t[b].numpy().tobytes() for layer in kv for t in layer)

            ids = [hashlib.md5(f"ucm-pieces-{i}".encode()).digest() for i in range(3)]
            want = [block(b) for b in (0, 1, 2)]
            with no_bounce():
                store.wait(store.dump_data(ids, [0] * 3, rows([0, 1, 2])))
                store.wait(store.load_data(ids, [0] * 3, rows([3, 4, 5])))
            self.assertEqual([block(b) for b in (3, 4, 5)], want)
            self.assertEqual(store.stats()["pieces"], {"vectored": 6, "bounced": 0})
        finally:
            store.close()


class DumpAfter(unittest.TestCase):
    def test_after_an_event_is_refused_by_the_host_copier(self):
        r = shardfs.Rank(socket=D.sock)
        self.addCleanup(r.close)
        self.assertEqual(r.copier, "host")
        buf = bytearray(SHARD)
        addr = ctypes.addressof((ctypes.c_char * SHARD).from_buffer(buf))
        blk = hashlib.md5(b"dump-after").digest()
        with self.assertRaises(shardfs.ShardfsError) as cm:
            r.dumpv([(blk, 0, [(addr, SHARD)])], after=0xE7E47)
        self.assertEqual(cm.exception.errno, errno.EOPNOTSUPP)
        self.assertIn("synchronize", str(cm.exception))
        self.assertEqual(r.lookup([blk]), [False], "nothing queued")
        for bad in (True, -1, "0x10", 1 << 64):
            with self.assertRaises(shardfs.InvalidArgument):
                r.dumpv([(blk, 0, [(addr, SHARD)])], after=bad)
        r.dumpv([(blk, 0, [(addr, SHARD)])], after=0).wait()  # 0: no event, as UCM passes it
        self.assertEqual(r.lookup([blk]), [True])


class Columns(unittest.TestCase):
    """shardfs.EntriesV: vectored entries in columns, checked by builtins."""

    def setUp(self):
        self.r = shardfs.Rank(socket=D.sock, backend=D.store)
        self.addCleanup(self.r.close)

    def test_columns_and_triples_read_each_other(self):
        half = SHARD // 2
        src = np.frombuffer(bytes(range(256)) * (3 * SHARD // 256), dtype=np.uint8).copy()
        base = src.ctypes.data
        blks = [hashlib.md5(f"columns-{i}".encode()).digest() for i in range(3)]
        # Block i: its second half first in memory, then its first half.
        rows = [(base + i * SHARD + half, half, base + i * SHARD, half) for i in range(3)]
        pieces = np.array(rows, dtype=np.uint64).reshape(6, 2)
        ev = shardfs.EntriesV(blks, 0, [2, 2, 2], pieces)
        self.assertEqual(len(ev), 3)
        pieces[:] = 0  # copied when made: the buffer may be reused
        self.assertEqual(self.r.dumpv(ev).wait(), [0, 0, 0])
        out = np.zeros(3 * SHARD, dtype=np.uint8)
        ob = out.ctypes.data
        self.assertEqual(self.r.load([(b, 0, ob + i * SHARD) for i, b in enumerate(blks)]).wait(),
                         [0, 0, 0])
        for i in range(3):
            row = src[i * SHARD:(i + 1) * SHARD]
            self.assertEqual(out[i * SHARD:(i + 1) * SHARD].tobytes(),
                             row[half:].tobytes() + row[:half].tobytes())
        back = np.zeros(3 * SHARD, dtype=np.uint8)
        bb = back.ctypes.data
        one = np.array([(bb + i * SHARD, SHARD) for i in range(3)], dtype=np.uint64)
        self.assertEqual(self.r.loadv(shardfs.EntriesV(blks, [0, 0, 0], [1, 1, 1], one)).wait(),
                         [0, 0, 0])
        self.assertEqual(back.tobytes(), out.tobytes())

    def test_bad_columns_are_refused_before_the_library(self):
        buf = np.zeros(SHARD, dtype=np.uint8)
        a = buf.ctypes.data
        blk = hashlib.md5(b"columns-bad").digest()
        good = np.array([[a, SHARD]], dtype=np.uint64)
        bad = {
            "no entries": ([], 0, [], np.empty((0, 2), np.uint64)),
            "zero pieces": ([blk], 0, [0], good),
            "too many pieces": ([blk], 0, [513], good),
            "counts against pairs": ([blk, blk], 0, [1, 1], good),
            "a short id": ([b"short"], 0, [1], good),
            "a shard out of range": ([blk], -1, [1], good),
            "not contiguous": ([blk], 0, [1], np.zeros((2, 4), np.uint64)[:, ::2]),
        }
        for what, args in bad.items():
            with self.subTest(what), self.assertRaises(shardfs.InvalidArgument):
                shardfs.EntriesV(*args)
        # The pieces themselves: the library's check when the task is queued.
        pieces = {
            "a null address": [[0, SHARD]],
            "a length of 0": [[a, 0]],
            "more than a shard": [[a, SHARD], [a, 1]],
        }
        for what, rows in pieces.items():
            ev = shardfs.EntriesV([blk], 0, [len(rows)], np.array(rows, dtype=np.uint64))
            with self.subTest(what), self.assertRaises(shardfs.InvalidArgument):
                self.r.loadv(ev)
            with self.subTest(what), self.assertRaises(shardfs.InvalidArgument):
                self.r.dumpv(ev)
        self.assertEqual(self.r.lookup([blk]), [False], "nothing queued")


class OnePageFormat(unittest.TestCase):
    """layer_first: SGLang's zero-copy meta gives K0 V0 K1 V1 ..., its flat
    page K0 K1 ... V0 V1 ...: both paths store the former."""

    def test_zero_copy_and_copying_instances_share_pages(self):
        zc, zpool = storage("layer_first", 11, v1=True)
        cp, cpool = storage("layer_first", 12, v1=False)
        try:
            a, b = keys(2, "fmt-zc"), keys(2, "fmt-copy")
            self.assertEqual(zc.batch_set_v1(a, indices(zpool, [0, 1])), [True, True])
            self.assertTrue(cp.batch_set(b, [cpool.get_data_page(p * 4) for p in (2, 3)]))
            # The copying instance reads the zero-copy one's pages, as SGLang's
            # controller does: batch_get into a dummy page, then set_from_flat_data_page.
            got = cp.batch_get(a, [cpool.get_dummy_flat_data_page() for _ in a])
            for p, page in zip((4, 5), got):
                self.assertIsNotNone(page)
                cpool.set_from_flat_data_page(p * 4, page)
            self.assertEqual([page_bytes_v1(cpool, p) for p in (4, 5)],
                             [page_bytes_v1(zpool, p) for p in (0, 1)])
            # And the zero-copy instance reads the copying one's.
            self.assertEqual(zc.batch_get_v1(b, indices(zpool, [6, 7])), [True, True])
            self.assertEqual([page_bytes_v1(zpool, p) for p in (6, 7)],
                             [page_bytes_v1(cpool, p) for p in (2, 3)])
        finally:
            zc.close()
            cp.close()


if __name__ == "__main__":
    unittest.main()
