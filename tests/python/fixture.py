# SPDX-License-Identifier: MIT
"""A real shardfs daemon on a real mount over a posix store, for the Python
tests (the Python twin of tests/fsfixture.c).

The daemon runs in the foreground (-f) as a child; start() returns once
/proc/self/mountinfo shows the mount; stop() unmounts with fusermount3 -u and
reaps it, killing it (and detaching the mount lazily) after a deadline, so a
failed run never leaves a mount behind. The store is written by hand in the
UCM PosixStore layout the posix backend reads: <store>/data/<32 hex>, shard n
at byte n * shard_size.

Where things are: $SHARDFS_BIN (the daemon; default <repo>/build/fs/shardfs)
and $SHARDFS_LIB (read by the package itself).

What every test module does with it: `optional()` imports the packages it
needs beyond the standard library, and `ModuleDaemon` is its one daemon,
which its setUpModule skips the module for (saying why) or starts.
"""
import errno
import hashlib
import importlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def daemon_bin():
    return os.environ.get("SHARDFS_BIN") or os.path.join(ROOT, "build", "fs", "shardfs")


def usable():
    """None when a daemon can be mounted here, else why not."""
    if not os.path.exists(daemon_bin()):
        return f"no daemon binary at {daemon_bin()} (set SHARDFS_BIN)"
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
        os.close(fd)
    except OSError as e:
        return f"/dev/fuse: {e.strerror}"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not on PATH"
    return None


def optional(*names):
    """Import the packages a test module needs beyond the standard library
    (torch, numpy: Debian packages). Returns each module (None when it does
    not import) and, last, None or the reason to skip the module."""
    mods, missing = [], None
    for n in names:
        try:
            mods.append(importlib.import_module(n))
        except ImportError as e:
            mods.append(None)
            if missing is None:
                verb = "are" if len(names) > 1 else "is"
                missing = (f"{' and '.join(names)} {verb} needed ({e}): apt-get install "
                           + " ".join(f"python3-{m}" for m in names))
    return (*mods, missing)


def module_daemon(missing=None, **kw):
    """A test module's daemon, for its setUpModule: raises unittest.SkipTest
    when a package is missing (optional()'s reason) or no FUSE daemon can be
    mounted here, else returns Daemon(**kw), started."""
    if missing:
        raise unittest.SkipTest(missing)
    why = usable()
    if why:
        raise unittest.SkipTest(f"no FUSE daemon here: {why}")
    return Daemon(**kw).start()


class ModuleDaemon:
    """A test module's one daemon, started by its setUpModule and stopped by
    its tearDownModule:

        D = fixture.ModuleDaemon(MISSING, shard_size=SIZE)
        setUpModule, tearDownModule = D.up, D.down

    Between the two, D.sock, D.store, D.mnt, D.stats() ... are the started
    Daemon's (module_daemon() says when the module is skipped instead)."""

    def __init__(self, missing=None, **kw):
        self._missing, self._kw, self._d = missing, kw, None

    def up(self):
        self._d = module_daemon(self._missing, **self._kw)

    def down(self):
        if self._d is not None:
            self._d.stop()
            self._d = None

    def __getattr__(self, name):
        d = self.__dict__.get("_d")
        if d is None:
            raise AttributeError(f"{name}: the module's daemon is not running")
        return getattr(d, name)


class Checks:
    """Assertions the package's tests share (a unittest.TestCase mixin)."""

    def einval(self, fn, *args, match=None):
        """fn(*args) raises shardfs.InvalidArgument (EINVAL), saying match."""
        import shardfs

        with self.assertRaises(shardfs.InvalidArgument) as cm:
            fn(*args)
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        if match:
            self.assertIn(match, str(cm.exception))

    def logged_miss(self, fn, *args, match=None):
        """fn(*args) does not raise (a storage call from one of SGLang's
        threads): it answers a miss (False, None, 0, all of them in a list
        or a dict of lists) and logs an error, saying match."""
        with self.assertLogs("shardfs.sglang", "ERROR") as cm:
            out = fn(*args)
        if isinstance(out, dict):
            out = [x for v in out.values() for x in v]
        elif hasattr(out, "kv_hit_pages"):
            out = out.kv_hit_pages
        self.assertFalse(any(out) if isinstance(out, list) else out, f"not a miss: {out!r}")
        if match:
            self.assertIn(match, "\n".join(cm.output))
        return out


class RankCase(Checks, unittest.TestCase):
    """A test case with a fresh shardfs.Rank on `daemon` (a Daemon or a
    ModuleDaemon, set by the subclass) over its store, closed after."""

    daemon = None

    def setUp(self):
        import shardfs

        self.rank = shardfs.Rank(socket=self.daemon.sock, backend=self.daemon.store)

    def tearDown(self):
        self.rank.close()


def is_mounted(mnt):
    with open("/proc/self/mountinfo") as f:
        return any(f" {mnt} " in line and "fuse.shardfs" in line for line in f)


def block(i, salt=b""):
    """Block id number i: 16 bytes of md5, as UCM's ids are."""
    return hashlib.md5(b"shardfs-py-test" + salt + i.to_bytes(8, "little")).digest()


def shard_bytes(blk, shard, size):
    """The deterministic content of (blk, shard): size bytes."""
    seed = hashlib.sha256(blk + shard.to_bytes(4, "little")).digest()
    reps = size // len(seed) + 1
    return (seed * reps)[:size]


def write_block(store, blk, nshards, size, dir_prefix=0):
    """Write a block file in posix layout; returns its path."""
    name = blk.hex()
    d = os.path.join(store, "data" if dir_prefix == 0 else name[:dir_prefix])
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        for s in range(nshards):
            f.write(shard_bytes(blk, s, size))
    return path


class Daemon:
    """shardfs -f -o socket=...,shard_size=...,capacity=...,hugepages=off STORE MNT"""

    def __init__(self, shard_size=64 << 10, capacity=64 << 20, opts="", store=None):
        self.dir = tempfile.mkdtemp(prefix="shardfs-py-")
        self.store = store or os.path.join(self.dir, "store")
        os.makedirs(os.path.join(self.store, "data"), exist_ok=True)
        self.mnt = os.path.join(self.dir, "mnt")
        os.makedirs(self.mnt)
        self.sock = os.path.join(self.dir, "rank.sock")
        self.log = os.path.join(self.dir, "daemon.log")
        self.shard_size = shard_size
        o = f"socket={self.sock},shard_size={shard_size},capacity={capacity},hugepages=off"
        self.opts = o + ("," + opts if opts else "")
        self.proc = None

    def start(self, timeout=20.0):
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([daemon_bin(), "-f", "-o", self.opts, self.store, self.mnt],
                                         stdout=log, stderr=subprocess.STDOUT)
        t0 = time.monotonic()
        while not is_mounted(self.mnt):
            if self.proc.poll() is not None:
                raise RuntimeError(f"shardfs exited with {self.proc.returncode}: {self.read_log()}")
            if time.monotonic() - t0 > timeout:
                self.proc.kill()
                self.proc.wait()
                subprocess.run(["fusermount3", "-uz", self.mnt], stderr=subprocess.DEVNULL)
                raise RuntimeError(f"shardfs did not mount in {timeout} s: {self.read_log()}")
            time.sleep(0.01)
        return self

    def expected(self, blk, shard):
        """What shard `shard` of blk holds (shard_bytes at this shard size)."""
        return shard_bytes(blk, shard, self.shard_size)

    def read_log(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def stats(self):
        """The mount's /stats as {metric: int}."""
        out = {}
        with open(os.path.join(self.mnt, "stats")) as f:
            for line in f:
                m = re.match(r"^(shardfs_\w+)\s+(\d+)", line)
                if m:
                    out[m.group(1)] = int(m.group(2))
        return out

    def kill(self):
        """SIGKILL the daemon and detach its mount, keeping the store and
        the socket's path: start() brings the same daemon back."""
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait()
        self.proc = None
        subprocess.run(["fusermount3", "-uz", self.mnt], stderr=subprocess.DEVNULL)

    def stop(self, timeout=10.0):
        if self.proc is None:
            return
        if is_mounted(self.mnt):
            if subprocess.run(["fusermount3", "-u", self.mnt], stderr=subprocess.DEVNULL).returncode:
                self.proc.send_signal(signal.SIGTERM)
            else:
                try:  # unmounted here, still served: a copy in another mount namespace
                    self.proc.wait(min(3.0, timeout / 2))
                except subprocess.TimeoutExpired:
                    self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            subprocess.run(["fusermount3", "-uz", self.mnt], stderr=subprocess.DEVNULL)
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


class OwnDaemonCase(unittest.TestCase):
    """A test case with a daemon of its own for each test (of shard_size
    bytes a shard), stopped after; skipped with `missing` (what an optional
    import lacked) or when FUSE is not usable here."""

    shard_size = None
    missing = None

    def setUp(self):
        if self.missing:
            self.skipTest(self.missing)
        why = usable()
        if why:
            self.skipTest(why)
        self.d = Daemon(shard_size=self.shard_size).start()
        self.addCleanup(self.d.stop)
