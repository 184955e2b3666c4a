# SPDX-License-Identifier: MIT
"""shardfs as vLLM's offloading tier inside vLLM's own engine loop: vLLM
0.34.0's Scheduler and OffloadingConnector (scheduler and worker halves),
built from the --kv-transfer-config that names ShardfsOffloadingSpec, on
PyPI's torch 2.14 on the CPU (tests/python/vllm-venv.sh; run.py --env
vllm), against a real daemon. The model's forward pass is the one stand-in
(fixture_vllm_engine.py): it writes each computed block's pages, a
function of the block's prefix hash.

Claims:
  * one engine: a prompt computed once is stored by the connector; a
    second engine instance (another Scheduler and worker) of the same
    process finds every full block, loads it instead of computing it, and
    holds exactly the computed pages, with no store read (the cache's
    memory served it);
  * two engine processes: what A stored, B loads (the same, and the
    reverse), byte-exact, no store read;
  * a prompt nobody stored is computed whole, then found by the next engine;
  * a failed load (the daemon killed between the scheduler's lookup and
    the worker's load) is reported per block: with
    kv_load_failure_policy=recompute vLLM computes those blocks again and
    the request finishes with the right pages; under vLLM's default (fail)
    that request ends in error; the engine runs on either way;
  * the daemon killed: requests run, computed, nothing stored; restarted:
    the engine's tier re-attaches and stores and loads again.
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

import engines
import fixture

HERE = os.path.dirname(os.path.abspath(__file__))


def why_not():
    why = engines.vllm_part("Scheduler") or engines.vllm_part("OffloadingConnector")
    if why:
        return why
    try:
        import torch
    except ImportError as e:
        return f"torch: {e}"
    if int(torch.__version__.split(".")[0]) < 2:
        return (f"vLLM's scheduler needs torch >= 2; this interpreter has {torch.__version__} "
                "(run.py --env vllm runs these tests on PyPI's torch 2, vllm-venv.sh)")
    return None


WHY = why_not()
if not WHY:
    import fixture_vllm_engine as fe


def until(pred, what, deadline=60.0):
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > deadline:
            raise AssertionError(f"{what}: not within {deadline} s")
        time.sleep(0.05)


@unittest.skipIf(WHY, f"vLLM's engine loop: {WHY}")
class EngineCase(fixture.OwnDaemonCase):
    shard_size = 32 << 10  # fe.SHARD_SIZE, checked in setUp

    def setUp(self):
        super().setUp()
        self.assertEqual(fe.SHARD_SIZE, self.shard_size)
        self.model = fe.write_model_dir(os.path.join(self.d.dir, "model"))

    def engine(self, **kw):
        eng = fe.Engine(self.model, fe.extra_config(self.d.sock, self.d.store), **kw)
        self.addCleanup(eng.shutdown)
        return eng

    def loads(self):
        return self.d.stats()["shardfs_backend_loads_total"]

    def other(self, seed, ntokens):
        """Another engine process: one request, its summary back in a file."""
        env = dict(os.environ)
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["shardfs"].__file__)))
        env["PYTHONPATH"] = os.pathsep.join([pkg, HERE])
        result = os.path.join(self.d.dir, f"engine-{seed}-{time.monotonic_ns()}.json")
        with tempfile.TemporaryFile() as log:
            rc = subprocess.run([sys.executable, os.path.join(HERE, "fixture_vllm_engine.py"),
                                 result, self.d.sock, self.d.store, self.model, str(seed),
                                 str(ntokens)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                timeout=300).returncode
            log.seek(0)
            text = log.read().decode(errors="replace")
        self.assertEqual(rc, 0, f"the other engine ended with {rc}:\n{text[-3000:]}")
        with open(result) as f:
            return json.load(f)


class OneProcess(EngineCase):
    def test_a_second_engine_loads_what_the_first_computed(self):
        import shardfs  # noqa: F401 - the package under test, from this tree

        toks = fe.prompt(seed=1, ntokens=4 * fe.BLOCK_TOKENS + 5)
        a = self.engine().run(toks)
        self.assertEqual(a["computed"], [0, 1, 2, 3], "the first engine computes every block")
        self.assertTrue(a["exact"])
        before = self.loads()
        b = self.engine().run(toks)
        self.assertEqual(b["loaded"], [0, 1, 2, 3],
                         f"the second engine computed {b['computed']} of 4 stored blocks")
        self.assertTrue(b["exact"], "the loaded pages are not what was computed")
        self.assertEqual(self.loads(), before, "a load read the store: the cache held them")

    def test_a_prompt_nobody_stored_is_computed_whole(self):
        eng = self.engine()
        n = 3 * fe.BLOCK_TOKENS + 1  # vLLM computes a prompt's last token itself
        a = eng.run(fe.prompt(seed=2, ntokens=n))
        self.assertEqual(a["computed"], [0, 1, 2])
        b = self.engine().run(fe.prompt(seed=3, ntokens=n))
        self.assertEqual(b["computed"], [0, 1, 2], "another prompt's blocks are not a hit")
        c = self.engine().run(fe.prompt(seed=3, ntokens=n))
        self.assertEqual(c["loaded"], [0, 1, 2])
        self.assertTrue(c["exact"])

    def failed_load(self, seed, **kw):
        """A request whose blocks the scheduler found, with the daemon
        killed before the worker loads them."""
        toks = fe.prompt(seed=seed, ntokens=4 * fe.BLOCK_TOKENS + 1)
        self.engine().run(toks)
        eng = self.engine(**kw)
        worker = eng.worker.connector_worker.worker  # the spec's ShardfsOffloadingWorker
        killed = []

        def kill_after_lookup(out):
            # The scheduler has found the blocks and asks the worker to
            # load them: the daemon goes now, before the worker's load.
            if out.kv_connector_metadata.load_jobs and not killed:
                self.d.kill()
                killed.append(True)
                until(lambda: self.worker_sees_gone(worker), "the worker's rank sees the kill")

        eng.before_load = kill_after_lookup
        res = eng.run(toks)
        self.assertTrue(killed, "the scheduler asked for no load: the blocks were not found")
        return eng, res

    def test_a_failed_load_is_computed_again(self):
        # kv_load_failure_policy=recompute, what docs/engines.md asks for.
        eng, res = self.failed_load(seed=4)
        self.assertEqual(res["computed"], [0, 1, 2, 3],
                         "blocks whose load failed must be computed by the engine")
        self.assertTrue(res["exact"])
        self.assertEqual(res["status"], "FINISHED_LENGTH_CAPPED")

    def test_a_failed_load_fails_the_request_under_vllms_default_policy(self):
        # vLLM's default (fail): that request ends in error, the engine runs on.
        eng, res = self.failed_load(seed=9, load_failure_policy="fail")
        self.assertEqual(res["status"], "FINISHED_ERROR")
        after = eng.run(fe.prompt(seed=10, ntokens=2 * fe.BLOCK_TOKENS + 1))
        self.assertEqual(after["status"], "FINISHED_LENGTH_CAPPED")
        self.assertEqual(after["computed"], [0, 1])

    @staticmethod
    def worker_sees_gone(worker):
        """Until the worker's rank has seen the daemon go (its watcher's
        thread), a load is served from the cache's memory, still mapped."""
        r = worker.link.rank
        if r is None:
            return True
        try:
            r.lookup([bytes(16)])
            return False
        except OSError:
            return True

    def test_the_daemon_killed_then_back(self):
        eng = self.engine()
        self.d.kill()
        a = eng.run(fe.prompt(seed=5, ntokens=2 * fe.BLOCK_TOKENS + 1))
        self.assertEqual(a["computed"], [0, 1], "the engine runs without its tier")
        self.d.start()
        toks = fe.prompt(seed=6, ntokens=2 * fe.BLOCK_TOKENS + 1)
        until(lambda: eng.run(toks) is not None and self.engine().run(toks)["loaded"] == [0, 1],
              "stores and loads after the restart")


class TwoProcesses(EngineCase):
    def test_what_one_engine_stored_the_other_loads(self):
        import shardfs  # noqa: F401

        n = 4 * fe.BLOCK_TOKENS + 3
        a = self.other(seed=7, ntokens=n)  # engine A, another process, stores
        self.assertEqual(a["computed"], [0, 1, 2, 3])
        before = self.loads()
        b = self.engine().run(fe.prompt(seed=7, ntokens=n))  # engine B, here, loads
        self.assertEqual(b["loaded"], [0, 1, 2, 3])
        self.assertTrue(b["exact"])
        self.engine().run(fe.prompt(seed=8, ntokens=n))  # here stores
        c = self.other(seed=8, ntokens=n)  # and the other process loads
        self.assertEqual(c["loaded"], [0, 1, 2, 3])
        self.assertTrue(c["exact"])
        self.assertEqual(self.loads(), before, "a load read the store: the cache held them")


if __name__ == "__main__":
    unittest.main()
