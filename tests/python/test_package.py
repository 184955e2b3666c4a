# SPDX-License-Identifier: MIT
"""The package itself, without a daemon, torch or numpy: it imports from a
build tree with PYTHONPATH=gpu/python, its version is the project's, and the
library is found (or not, with a clear message) in the documented order."""
import os
import re
import subprocess
import sys
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

    def test_the_library_loads(self):
        lib = os.environ.get("SHARDFS_LIB")
        r = run("import shardfs, shardfs._lib as l; shardfs.cuda_devices(); print(l.path())",
                **({"SHARDFS_LIB": lib} if lib else {}))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("libshardfs-rank.so", r.stdout)


if __name__ == "__main__":
    unittest.main()
