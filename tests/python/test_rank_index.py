# SPDX-License-Identifier: MIT
"""Rank(rank=..., world=...): the index reaches the library's walk
(RearrangeIndex: rank r of N takes key r of a task first), with or without
a device.

How the first key is seen: load depth 1 and a slow fault backend: until the
first load ends, exactly one key of the task is in the cache (Loading), and
the mount shows it (user.shardfs.state). With a device the index used to be
device % world whatever rank= said; the device cases need a CUDA device and
skip without one (they run on a GPU machine).
"""
import errno
import os
import time
import unittest

import fixture

torch, MISSING = fixture.optional("torch")

import shardfs

SIZE = 64 << 10
KEYS = 8
D = fixture.ModuleDaemon(MISSING, shard_size=SIZE)
setUpModule, tearDownModule = D.up, D.down


def in_cache(blk):
    path = os.path.join(D.mnt, "block", blk.hex(), "shard", "0")
    try:
        return os.getxattr(path, "user.shardfs.state") not in (b"", b"absent")
    except OSError:
        return False


class RankIndex(unittest.TestCase):
    def first_key(self, salt, **kw):
        """Open a rank with kw, load a fresh task of KEYS keys, and return
        the index of the first key that reached the cache."""
        blocks = [fixture.block(i, salt) for i in range(KEYS)]
        for b in blocks:
            fixture.write_block(D.store, b, 1, SIZE)
        spec = f"fault:latency_us=500000:{D.store}"
        with shardfs.Rank(socket=D.sock, backend=spec, load_depth=1, prealloc=False, **kw) as r:
            dev = "cuda" if kw.get("device") is not None else "cpu"
            dst = torch.empty(KEYS, SIZE, dtype=torch.uint8, device=dev)
            task = r.load(r.entries(blocks, 0, dst))
            first = None
            t0 = time.monotonic()
            while first is None and time.monotonic() - t0 < 10:  # liveness bound only
                first = next((i for i, b in enumerate(blocks) if in_cache(b)), None)  # the lowest: key 0 comes 5th of 8 but for r = 0
                time.sleep(0.001)
            self.assertEqual(task.wait(60), [0] * KEYS)
            for i, b in enumerate(blocks):
                self.assertEqual(dst[i].cpu().numpy().tobytes(), fixture.shard_bytes(b, 0, SIZE))
        self.assertIsNotNone(first, "no key of the task reached the cache")
        return first, r

    def test_host_rank_index(self):
        first, r = self.first_key(b"idx-host", rank=2, world=4)
        self.assertEqual(first, 2)
        self.assertEqual((r.rank, r.world), (2, 4))

    def test_default_index(self):
        first, r = self.first_key(b"idx-default", world=4)
        self.assertEqual(first, 0)
        self.assertEqual(r.rank, 0)

    def test_device_rank_index(self):
        if shardfs.cuda_devices() == 0:
            self.skipTest("no CUDA device: the device cases run on a GPU machine")
        # Every worker sees its GPU as device 0: rank= says the index.
        first, r = self.first_key(b"idx-dev", device=0, rank=3, world=4)
        self.assertEqual(first, 3)
        first, r = self.first_key(b"idx-dev-default", device=0, world=4)
        self.assertEqual((first, r.rank), (0, 0), "rank=None with a device: device % world")

    def test_a_0_1_library_says_it_cannot(self):
        from shardfs import _lib
        self.assertTrue(_lib.lib().has_rank_index, "this tree's library has SHARDFS_RANK_0.2")
        _lib.lib().has_rank_index = False  # as a 0.1 library answers
        try:
            with self.assertRaises(shardfs.ShardfsError) as cm:
                shardfs.Rank(socket=D.sock, device=0, rank=1, world=2)
            self.assertEqual(cm.exception.errno, errno.ENOTSUP)
            self.assertIn("older than 0.2", str(cm.exception))
        finally:
            _lib.lib().has_rank_index = True

    def test_bad_rank_index(self):
        for rank, world in ((4, 4), (-1, 4), (0, 0)):
            with self.assertRaises(shardfs.InvalidArgument):
                shardfs.Rank(socket=D.sock, rank=rank, world=world)
        with self.assertRaises(shardfs.InvalidArgument):
            shardfs.Rank(socket=D.sock, rank="1", world=2)


if __name__ == "__main__":
    unittest.main()
