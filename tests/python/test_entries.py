# SPDX-License-Identifier: MIT
"""Rank.entries() and the column-wise packing of raw addresses, against a
real daemon on a real mount over a posix store.

Claims:
  * Rank.entries(blocks, shards, buffer) loads shard i into row i of one
    buffer (a torch tensor, a numpy array), dumps from one the same way, and
    can be used again and again; when the buffer's storage moves between
    uses the entries follow it (the addresses are packed again);
  * a list of (16-byte id, int, int address) triples (raw pointers, as the
    engines hand them) loads like any other; one bad triple among them
    raises InvalidArgument naming that entry, as the per-entry path does;
  * bad input to entries() raises InvalidArgument with a clear message:
    wrong buffer size, non-contiguous or read-only buffer for a load,
    lengths that disagree, no entries, entries of another Rank.
"""
import ctypes
import errno
import unittest

import fixture

torch, np, MISSING = fixture.optional("torch", "numpy")

import shardfs

SIZE = 64 << 10
D = fixture.ModuleDaemon(MISSING, shard_size=SIZE)
setUpModule, tearDownModule = D.up, D.down


class Entries(fixture.RankCase):
    daemon = D

    def test_load_rows_of_one_tensor_again_and_again(self):
        b = fixture.block(1, b"entries")
        fixture.write_block(D.store, b, 8, SIZE)
        dst = torch.zeros(8, SIZE, dtype=torch.uint8)
        ents = self.rank.entries(b, range(8), dst)
        self.assertEqual(len(ents), 8)
        for _ in range(3):
            dst.zero_()
            self.assertEqual(ents.load().wait(30), [0] * 8)
            for i in range(8):
                self.assertEqual(dst[i].numpy().tobytes(), D.expected(b, i), f"row {i}")
        # The tensor's storage moves: the next load follows it.
        other = torch.zeros(8, SIZE, dtype=torch.uint8)
        dst.set_(other)
        self.assertEqual(self.rank.load(ents).wait(30), [0] * 8)
        self.assertEqual(other[7].numpy().tobytes(), D.expected(b, 7))

    def test_list_of_blocks_one_shard_numpy_and_dump(self):
        blocks = [fixture.block(i, b"entries-dump") for i in range(4)]
        src = np.frombuffer(b"".join(D.expected(b, 2) for b in blocks), dtype=np.uint8).copy()
        self.assertEqual(self.rank.dump(self.rank.entries(blocks, 2, src)).wait(30), [0] * 4)
        back = np.zeros((4, SIZE), dtype=np.uint8)
        hexes = [b.hex() for b in blocks]  # any block spelling
        self.assertEqual(self.rank.load(self.rank.entries(hexes, [2] * 4, back)).wait(30), [0] * 4)
        self.assertEqual(back.tobytes(), src.tobytes())
        # A dump may read a read-only buffer (bytes).
        self.assertEqual(self.rank.dump(self.rank.entries(blocks, 2, src.tobytes())).wait(30),
                         [0] * 4)

    def test_raw_address_triples(self):
        b = fixture.block(2, b"entries")
        fixture.write_block(D.store, b, 4, SIZE)
        raws = [(ctypes.c_char * SIZE)() for _ in range(4)]
        st = self.rank.load([(b, i, ctypes.addressof(r)) for i, r in enumerate(raws)]).wait(30)
        self.assertEqual(st, [0] * 4)
        for i, r in enumerate(raws):
            self.assertEqual(bytes(r), D.expected(b, i))

    def test_bad_raw_address_triples_name_the_entry(self):
        b = fixture.block(3, b"entries")
        raws = [(ctypes.c_char * SIZE)() for _ in range(6)]
        good = [(b, i, ctypes.addressof(r)) for i, r in enumerate(raws)]
        for i, bad in ((5, (b, 5, 0)), (2, (b, 2, -1)), (3, (b, -1, ctypes.addressof(raws[3]))),
                       (4, (b[:15], 4, ctypes.addressof(raws[4])))):
            ents = list(good)
            ents[i] = bad
            with self.assertRaises(shardfs.InvalidArgument):
                self.rank.load(ents)
        ents = list(good)
        ents[1] = good[1] + (0,)  # a 4-tuple among triples
        self.einval(self.rank.load, ents, match="entry 1")
        ents = list(good)
        ents[4] = (b, 4, 0)
        self.einval(self.rank.load, ents, match="entry 4")

    def test_bad_entries(self):
        b = fixture.block(4, b"entries")
        r = self.rank
        self.einval(r.entries(b, range(4), torch.empty(3, SIZE, dtype=torch.uint8)).load,
                    match=f"holds {3 * SIZE} bytes")
        self.einval(r.entries(b, range(2), torch.empty(2, 2 * SIZE, dtype=torch.uint8)[:, ::2]).load,
                    match="not contiguous")
        self.einval(r.entries(b, range(2), bytes(2 * SIZE)).load, match="read-only")
        self.einval(r.entries(b, range(2), torch.empty(2 * SIZE, dtype=torch.uint8, device="meta")).load,
                    match="meta")
        self.einval(r.entries, [b, b], range(3), bytearray(3 * SIZE), match="2 block ids and 3")
        self.einval(r.entries, b, 0, bytearray(SIZE), match="list (or range)")
        self.einval(r.entries, b, [], bytearray(SIZE), match="no entries")
        self.einval(r.entries, "nothex", range(1), bytearray(SIZE), match="block id")
        self.einval(r.entries, b, [1 << 32], bytearray(SIZE), match="shard")
        self.einval(r.entries, b, range(-1, 1), bytearray(2 * SIZE), match="out of range")
        with shardfs.Rank(socket=D.sock, backend=D.store) as other:
            ents = other.entries(b, range(1), bytearray(SIZE))
            self.einval(r.load, ents, match="another Rank")
        ents = r.entries(b, range(1), bytearray(SIZE))
        r.close()
        with self.assertRaises(shardfs.RankClosed):
            ents.load()


if __name__ == "__main__":
    unittest.main()
