# SPDX-License-Identifier: MIT
"""The engines' store bound against the daemon's (-o store_capacity).

UCM's posix_capacity_gb / posix_gc_enable and the SGLang adapter's
store_capacity_gb ask for a bound on the store that only the daemon can
keep. The adapters read the daemon's shardfs_store_capacity_bytes (through
the mount, or the mount found for the socket) and log once: a warning when
the daemon enforces no bound or a larger one, an info line when it enforces
the engine's; .store_capacity_bytes is what they read. A bound that is not
a number of GiB is refused.
"""
import logging
import unittest

import fixture
import fixture_sglang

import shardfs
from shardfs import sglang, ucm

SHARD = 64 << 10


def ucm_config(d, **extra):
    """A scheduler's config (no device: lookups only) on d's socket."""
    cfg = {"storage_backends": [d.store], "shardfs_socket": d.sock, "data_dir_shard_bytes": 0,
           "unique_id": "engine-0", "block_size": SHARD}
    cfg.update(extra)
    return cfg


class Bounded(fixture.OwnDaemonCase):
    shard_size = SHARD
    opts = ""

    def setUp(self):
        if self.opts:
            why = fixture.usable()
            if why:
                self.skipTest(why)
            self.d = fixture.Daemon(shard_size=SHARD, opts=self.opts).start()
            self.addCleanup(self.d.stop)
        else:
            super().setUp()

    def ucm_store(self, level, **extra):
        with self.assertLogs(ucm.log, level=level) as logs:
            st = ucm.ShardfsStore(ucm_config(self.d, **extra))
        self.addCleanup(st.rank.close)
        return st, "\n".join(logs.output)

    def sglang_store(self, level, **extra):
        with self.assertLogs(sglang.log, level=level) as logs:
            st = sglang.ShardfsStorage(fixture_sglang.storage_config(self.d, extra), {})
        self.addCleanup(st.rank.close)
        return st, "\n".join(logs.output)


class NoDaemonBound(Bounded):
    def test_ucm_warns_that_its_bound_is_not_enforced(self):
        st, out = self.ucm_store(logging.WARNING, posix_capacity_gb=1, posix_gc_enable=True)
        self.assertEqual(st.store_capacity_bytes, 0)
        self.assertIn("enforces none", out)
        self.assertIn("-o store_capacity", out)

    def test_a_gc_switch_alone_is_a_request_too(self):
        st, out = self.ucm_store(logging.WARNING, posix_gc_enable=True)
        self.assertEqual(st.store_capacity_bytes, 0)
        self.assertIn("asks for a bound", out)

    def test_sglang_warns_that_its_bound_is_not_enforced(self):
        st, out = self.sglang_store(logging.WARNING, store_capacity_gb="0.5")
        self.assertEqual(st.store_capacity_bytes, 0)
        self.assertIn("enforces none", out)

    def test_no_bound_asked_no_line_and_nothing_read(self):
        st = ucm.ShardfsStore(ucm_config(self.d))
        self.addCleanup(st.rank.close)
        self.assertIsNone(st.store_capacity_bytes)

    def test_a_bound_that_is_not_gib_is_refused(self):
        for bad in ("lots", -1, "0x10"):
            with self.assertRaises(shardfs.InvalidArgument):
                sglang.ShardfsStorage(fixture_sglang.storage_config(
                    self.d, {"store_capacity_gb": bad}), {})


class DaemonBound(Bounded):
    opts = "store_capacity=2M"

    def test_ucm_is_told_the_daemon_enforces_its_bound(self):
        st, out = self.ucm_store(logging.INFO, posix_capacity_gb=1, posix_gc_enable=True)
        self.assertEqual(st.store_capacity_bytes, 2 << 20)
        self.assertIn("bounds the store at 2097152 bytes", out)
        self.assertNotIn("WARNING", out)

    def test_a_daemon_bound_above_the_engines_is_a_warning(self):
        st, out = self.ucm_store(logging.WARNING, posix_capacity_gb="0.001")
        self.assertEqual(st.store_capacity_bytes, 2 << 20)
        self.assertIn("may grow past", out)

    def test_sglang_through_the_mount(self):
        with self.assertLogs(sglang.log, level=logging.INFO) as logs:
            cfg = fixture_sglang.storage_config(self.d, {"store_capacity_gb": 1})
            del cfg.extra_config["shardfs_socket"]
            cfg.extra_config["shardfs_mount"] = self.d.mnt
            st = sglang.ShardfsStorage(cfg, {})
        self.addCleanup(st.rank.close)
        self.assertEqual(st.store_capacity_bytes, 2 << 20)
        self.assertIn("bounds the store", "\n".join(logs.output))


if __name__ == "__main__":
    unittest.main()
