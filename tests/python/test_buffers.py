# SPDX-License-Identifier: MIT
"""What is behind a buffer, and the errors the package promises.

Each case runs a small script in a child interpreter, so that a crash (a
heap overflow, a pointer written over a Python object) shows as the child's
signal instead of taking the test runner down. The claims:

  * a tensor whose storage is smaller than its shape says (the storage
    resized, numel unchanged) is refused for a load and a dump, in a list
    of triples and in an Entries, also when the storage shrinks after the
    Entries was made: InvalidArgument, nothing copied;
  * a numpy array of dtype=object, or a buffer whose format holds Python
    objects, is refused;
  * a forked child's Task.wait() on its parent's task raises RankClosed
    instead of waiting for threads that do not exist in the child;
  * a released memoryview, a closed mmap, a sparse tensor, a timeout that
    is not a number, a path that is not a string, a NUL in a path, and an
    int too large for struct sfs_rank_config all raise InvalidArgument
    (an OSError), never a bare ValueError/TypeError or a silent truncation.
"""
import os
import subprocess
import sys
import textwrap
import unittest

import fixture

torch, numpy, MISSING = fixture.optional("torch", "numpy")

import shardfs

SHARD = 64 << 10
D = fixture.ModuleDaemon(MISSING, shard_size=SHARD)
setUpModule, tearDownModule = D.up, D.down

PRELUDE = """
import errno, os, sys, mmap
import numpy as np, torch
import shardfs
SHARD = {shard}
SOCK, STORE, BLOCK = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
r = shardfs.Rank(socket=SOCK, backend=STORE)

def refused(fn, *args, exc=shardfs.InvalidArgument, match=None):
    try:
        fn(*args)
    except exc as e:
        assert isinstance(e, OSError), type(e).__mro__
        if match is not None and match not in str(e):
            print("WRONG MESSAGE:", e)
            sys.exit(4)
        print("REFUSED:", type(e).__name__, e)
        return
    except Exception as e:
        print("WRONG EXCEPTION:", type(e).__name__, e)
        sys.exit(3)
    print("ACCEPTED:", fn, args)
    sys.exit(2)

def load(buf):
    return r.load([(BLOCK, 0, buf)]).wait()

def dump(buf):
    return r.dump([(BLOCK, 1, buf)]).wait()
"""


class Buffers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.blk = fixture.block(0, b"buffers")
        fixture.write_block(D.store, cls.blk, 2, SHARD)

    def run_script(self, body, timeout=60):
        """Runs PRELUDE + body in a child interpreter; it must exit 0 (every
        refusal seen), not by a signal. Returns its output."""
        src = PRELUDE.format(shard=SHARD) + textwrap.dedent(body)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(shardfs.__file__)))
        try:
            p = subprocess.run([sys.executable, "-c", src, D.sock, D.store, self.blk.hex()],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                               timeout=timeout)
        except subprocess.TimeoutExpired as e:
            self.fail(f"the child hung for {timeout} s (killed):\n{(e.stdout or b'').decode()[-3000:]}")
        out = p.stdout.decode(errors="replace")
        how = f"signal {-p.returncode}" if p.returncode < 0 else f"status {p.returncode}"
        self.assertEqual(p.returncode, 0, f"the child ended with {how}:\n{out[-3000:]}")
        return out

    def test_a_tensor_whose_storage_was_shrunk_is_refused(self):
        out = self.run_script("""
            t = torch.zeros(SHARD, dtype=torch.uint8)
            t.storage().resize_(16)
            assert t.numel() == SHARD
            refused(load, t, match="storage")
            refused(dump, t, match="storage")
            # A view at an offset past what the storage still holds.
            base = torch.zeros(2, SHARD, dtype=torch.uint8)
            v = base[1]
            base.storage().resize_(SHARD + 16)
            refused(load, v, match="storage")
            refused(r.load, r.entries(BLOCK, range(2), base), match="storage")
            print("OK")
        """)
        self.assertIn("OK", out)

    def test_entries_over_a_storage_shrunk_after_it_was_made(self):
        out = self.run_script("""
            t = torch.zeros(2, SHARD, dtype=torch.uint8)
            e = r.entries(BLOCK, range(2), t)
            assert r.load(e).wait() == [0, 0]
            t.storage().resize_(SHARD)          # half of it
            refused(r.load, e, match="storage")
            refused(r.dump, e, match="storage")
            print("OK")
        """)
        self.assertIn("OK", out)

    def test_object_arrays_are_refused(self):
        out = self.run_script("""
            import ctypes
            a = np.empty(SHARD // 8, dtype=object)
            refused(load, a, match="object")
            refused(dump, a, match="object")
            s = np.empty(SHARD // 16, dtype=[("x", "i8"), ("o", "O")])
            refused(load, s, match="object")
            refused(r.load, r.entries(BLOCK, range(1), a), match="object")
            p = (ctypes.py_object * (SHARD // 8))()
            refused(load, p, match="object")
            print("OK")
        """)
        self.assertIn("OK", out)

    def test_a_forked_childs_wait_on_the_parents_task(self):
        out = self.run_script("""
            import signal
            slow = shardfs.Rank(socket=SOCK, backend="fault:latency_us=1000000:" + STORE)
            t = torch.zeros(SHARD, dtype=torch.uint8)
            task = slow.load([(BLOCK, 0, t)])
            pid = os.fork()
            if pid == 0:
                signal.alarm(20)  # a hang ends as SIGALRM
                try:
                    task.wait()
                    os._exit(2)
                except shardfs.RankClosed as e:
                    os._exit(0 if "fork" in str(e) else 3)
                except BaseException:
                    os._exit(4)
            _, st = os.waitpid(pid, 0)
            print("child:", st)
            assert task.wait() == [0]
            assert st == 0, st
            print("OK")
        """)
        self.assertIn("OK", out)

    def test_errors_are_oserrors(self):
        out = self.run_script("""
            m = memoryview(bytearray(SHARD))
            m.release()
            refused(load, m, match="released")
            mm = mmap.mmap(-1, SHARD)
            mm.close()
            refused(load, mm, match="closed")
            i = torch.tensor([[0, 1]])
            sp = torch.sparse_coo_tensor(i, torch.ones(2, dtype=torch.float64), (SHARD // 8,))
            refused(load, sp, match="sparse")
            refused(dump, sp, match="sparse")
            task = r.load([(BLOCK, 0, torch.zeros(SHARD, dtype=torch.uint8))])
            refused(task.wait, "1", match="timeout")
            assert task.wait() == [0]
            sock = SOCK.encode()
            for kw in (dict(socket=123), dict(mount=1.5), dict(socket=SOCK, backend=7)):
                refused(lambda: shardfs.Rank(**kw), match="path")
            refused(lambda: shardfs.Rank(socket=SOCK + "\\0junk"), match="NUL")
            refused(lambda: shardfs.Rank(socket=SOCK, backend=STORE + "\\0x"), match="NUL")
            refused(lambda: shardfs.Rank(socket=SOCK, device=2**40), match="device")
            refused(lambda: shardfs.Rank(socket=SOCK, device=-2**40), match="device")
            refused(lambda: shardfs.Rank(socket=SOCK, world=2**40), match="world")
            refused(lambda: shardfs.Rank(socket=SOCK, world=2**32 + 1, rank=0), match="world")
            print("OK")
        """)
        self.assertIn("OK", out)


if __name__ == "__main__":
    unittest.main()
