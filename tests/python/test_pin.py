# SPDX-License-Identifier: MIT
"""Rank.pin() against a real daemon on a real mount over a posix store
(the pins of design.md, section 10, from Python).

Claims:
  * a block pinned through the rank (any block-id spelling Rank.load takes)
    survives a flood of other keys loaded through the same rank: its shards'
    user.shardfs.state on the mount reads `ready,pinned` after the flood,
    while an unpinned block of the flood is gone; pin(blocks, 0) unpins, and
    the next flood evicts it;
  * a pin over the daemon's budget raises PinBudgetExceeded (EDQUOT), pins
    nothing and leaves the other pins alone; a daemon with pins off raises
    PinsDisabled (EPERM);
  * bad arguments raise InvalidArgument before the library sees them; a
    closed Rank raises RankClosed.

The daemon: 2M of 64K shards (32 slots, no reserved pool), pin budget 25 %
(8 slots: two blocks of 4 shards), no warm-up, no readahead. Needs FUSE
only (buffers are bytearrays: no torch).
"""
import errno
import os
import unittest

import fixture

import shardfs

SIZE = 64 << 10
NSH = 4       # shards per block
NBLOCKS = 40  # 160 shards: five times the cache
OPTS = "readahead=0,warm=0"
D = fixture.ModuleDaemon(shard_size=SIZE, capacity=2 << 20, opts=OPTS)
setUpModule, tearDownModule = D.up, D.down


def blocks_of(salt, n=NBLOCKS, store=None):
    out = [fixture.block(i, salt) for i in range(n)]
    for b in out:
        fixture.write_block(store or D.store, b, NSH, SIZE)
    return out


def state(daemon, blk, shard):
    path = os.path.join(daemon.mnt, "block", blk.hex(), "shard", str(shard))
    return os.getxattr(path, "user.shardfs.state").decode()


def load_blocks(rank, blks):
    """Load every shard of each block through the rank, one task per block
    (each checked byte for byte)."""
    for b in blks:
        buf = bytearray(NSH * SIZE)
        st = rank.load(rank.entries(b, range(NSH), buf)).wait(60)
        assert st == [0] * NSH, f"load of {b.hex()}: {st}"
        for s in range(NSH):
            assert buf[s * SIZE:(s + 1) * SIZE] == fixture.shard_bytes(b, s, SIZE), \
                f"wrong bytes in ({b.hex()}, {s})"


class Pin(unittest.TestCase):
    def rank(self):
        # No Prealloc: the shards of a block are exactly NSH (a preallocated
        # shard NSH of the last block would be pinned with it).
        r = shardfs.Rank(socket=D.sock, backend=D.store, prealloc=False)
        self.addCleanup(r.close)
        return r

    def test_pinned_block_survives_a_flood_and_unpins(self):
        blks = blocks_of(b"pin-flood")
        r = self.rank()
        load_blocks(r, blks[:1])
        self.assertEqual(state(D, blks[0], 0), "ready")
        # The block as 32 hex characters, as Rank.load takes it.
        self.assertEqual(r.pin([blks[0].hex()], 600), NSH)
        self.addCleanup(r.pin, [blks[0]], 0)
        for s in range(NSH):
            self.assertEqual(state(D, blks[0], s), "ready,pinned")
        self.assertEqual(D.stats()["shardfs_pinned_bytes"], NSH * SIZE)
        load_blocks(r, blks[1:])
        for s in range(NSH):
            self.assertEqual(state(D, blks[0], s), "ready,pinned", f"pinned shard {s} after the flood")
        self.assertEqual(state(D, blks[1], 0), "absent", "the flood did not flood")
        # Unpin (bytearray spelling): the next flood evicts it.
        self.assertEqual(r.pin([bytearray(blks[0])], 0), 0)
        self.assertEqual(state(D, blks[0], 0), "ready")
        self.assertEqual(D.stats()["shardfs_pinned_bytes"], 0)
        load_blocks(r, blks[1:])
        self.assertEqual(state(D, blks[0], 0), "absent", "an unpinned block survived a flood")

    def test_over_budget_raises_and_pins_nothing(self):
        blks = blocks_of(b"pin-budget")
        r = self.rank()
        load_blocks(r, blks[:3])
        self.assertEqual(r.pin([blks[0], memoryview(blks[1])], 600), 2 * NSH)
        self.addCleanup(r.pin, blks[:3], 0)
        with self.assertRaises(shardfs.PinBudgetExceeded) as cm:
            r.pin([blks[2]], 600)
        e = cm.exception
        self.assertIsInstance(e, shardfs.ShardfsError)
        self.assertEqual(e.errno, errno.EDQUOT)
        self.assertIn("pin budget", str(e))
        self.assertEqual(state(D, blks[2], 0), "ready", "a refused pin pinned")
        self.assertEqual(D.stats()["shardfs_pinned_bytes"], 2 * NSH * SIZE)
        # The refused pin evicted no other pin, and a flood does not either.
        load_blocks(r, blks[3:])
        for b in blks[:2]:
            for s in range(NSH):
                self.assertEqual(state(D, b, s), "ready,pinned")
        # Unpinning one makes room.
        self.assertEqual(r.pin([blks[1]], 0), 0)
        load_blocks(r, blks[2:3])
        self.assertEqual(r.pin([blks[2]], 600), NSH)

    def test_pins_off_raises(self):
        off = fixture.Daemon(shard_size=SIZE, capacity=2 << 20, opts=OPTS + ",pin_budget=0").start()
        try:
            blks = blocks_of(b"pin-off", n=1, store=off.store)
            with shardfs.Rank(socket=off.sock, backend=off.store, prealloc=False) as r:
                load_blocks(r, blks)
                with self.assertRaises(shardfs.PinsDisabled) as cm:
                    r.pin(blks, 60)
                self.assertEqual(cm.exception.errno, errno.EPERM)
                self.assertIn("pins off", str(cm.exception))
            self.assertEqual(state(off, blks[0], 0), "ready")
        finally:
            off.stop()

    def test_bad_arguments(self):
        blks = blocks_of(b"pin-bad", n=1)
        r = self.rank()
        for secs in (-1, shardfs.rank.PIN_MAX_SECONDS + 1, 1 << 40, "60", 1.5, True, None):
            with self.assertRaises(shardfs.InvalidArgument, msg=f"seconds {secs!r}"):
                r.pin(blks, secs)
        for bad in (blks[0], blks[0].hex(), [b"short"], ["zz" * 16], [42], None, 7):
            with self.assertRaises(shardfs.InvalidArgument, msg=f"blocks {bad!r}"):
                r.pin(bad, 60)
        self.assertEqual(r.pin([], 60), 0)
        r.close()
        with self.assertRaises(shardfs.RankClosed):
            r.pin(blks, 60)


if __name__ == "__main__":
    unittest.main()
