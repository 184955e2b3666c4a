# SPDX-License-Identifier: MIT
"""The package itself, without a daemon, torch or numpy: it imports from a
build tree with PYTHONPATH=gpu/python, its version is the project's, the
library is SHARDFS_LIB's or the installed soname's (never a build tree's,
found by searching), and `pip install` works from the source tree and from
a wheel, typed (py.typed)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PY = os.path.join(ROOT, "gpu", "python")


def run(code, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SHARDFS_LIB")}
    e.update(PYTHONPATH=PY, PYTHONDONTWRITEBYTECODE="1", **env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                          timeout=60)


class Package(unittest.TestCase):
    def test_version_is_the_projects(self):
        import shardfs
        with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
            m = re.search(r"project\(shardfs VERSION ([0-9.]+)", f.read())
        self.assertEqual(shardfs.__version__, m.group(1))

    def test_imports_from_the_build_tree_without_torch_or_numpy(self):
        code = ("import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None\n"
                "import shardfs, shardfs.ucm, shardfs.sglang\n"
                "print(shardfs.__version__, shardfs.__file__)")
        r = run(code, SHARDFS_LIB=os.environ.get("SHARDFS_LIB", ""))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(os.path.join(PY, "shardfs"), r.stdout)

    def test_shardfs_lib_is_used_first_and_named_when_it_fails(self):
        r = run("import shardfs; shardfs.cuda_devices()", SHARDFS_LIB="/nonexistent/libshardfs-rank.so.0")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("SHARDFS_LIB", r.stderr)
        self.assertIn("/nonexistent/libshardfs-rank.so.0", r.stderr)

    def test_no_build_tree_is_searched(self):
        r = run("import shardfs._lib as l; print(l._candidates())")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "(['libshardfs-rank.so.0'], False)")

    def test_the_library_loads(self):
        lib = os.environ.get("SHARDFS_LIB")
        r = run("import shardfs, shardfs._lib as l; shardfs.cuda_devices(); print(l.path())",
                **({"SHARDFS_LIB": lib} if lib else {}))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("libshardfs-rank.so", r.stdout)


def pip(py, *args, cwd=None):
    """pip of interpreter py, offline (no index, the build backend from the
    system: setuptools)."""
    return subprocess.run([py, "-m", "pip", "--disable-pip-version-check", "-q", *args,
                           "--no-index", "--no-build-isolation", "--no-deps"],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


class PipInstall(unittest.TestCase):
    """pip install from the source tree and from a wheel, each into a fresh
    virtual environment, and the package imported from there."""

    @classmethod
    def setUpClass(cls):
        try:
            import setuptools  # noqa: F401 - the build backend pip uses here
        except ImportError:
            raise unittest.SkipTest("no setuptools (python3-setuptools): pip cannot build the package")
        cls.tmp = tempfile.mkdtemp(prefix="shardfs-pip-")
        # A copy of the source: pip's build leaves build/ and *.egg-info beside it.
        cls.src = os.path.join(cls.tmp, "src")
        shutil.copytree(PY, cls.src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def venv(self, name):
        path = os.path.join(self.tmp, name)
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", path], check=True,
                       timeout=120)
        return os.path.join(path, "bin", "python")

    def check_installed(self, py, where):
        code = ("import os, shardfs, shardfs.rank, shardfs.sglang, shardfs.ucm\n"
                "d = os.path.dirname(shardfs.__file__)\n"
                "print(shardfs.__version__, d, os.path.exists(os.path.join(d, 'py.typed')),"
                " os.path.exists(os.path.join(d, 'rank.pyi')), shardfs.cuda_devices())")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        r = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=60, cwd="/",
                           env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        version, d, typed, stub, _ = r.stdout.split()
        import shardfs
        self.assertEqual(version, shardfs.__version__)
        self.assertTrue(d.startswith(os.path.join(self.tmp, where)), d)
        self.assertEqual((typed, stub), ("True", "True"))

    def test_from_the_source_tree(self):
        py = self.venv("tree")
        r = pip(py, "install", self.src)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.check_installed(py, "tree")

    def test_from_a_wheel(self):
        wheels = os.path.join(self.tmp, "wheels")
        r = pip(sys.executable, "wheel", "-w", wheels, self.src)
        self.assertEqual(r.returncode, 0, r.stderr)
        whl = [f for f in os.listdir(wheels) if f.endswith(".whl")]
        self.assertEqual(len(whl), 1, whl)
        self.assertRegex(whl[0], r"^shardfs-[0-9.]+-py3-none-any\.whl$")
        py = self.venv("wheel")
        r = pip(py, "install", os.path.join(wheels, whl[0]))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.check_installed(py, "wheel")


if __name__ == "__main__":
    unittest.main()
