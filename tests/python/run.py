#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Run the Python tests (tests/python/test_*.py) with unittest and close with
one plain line, `N passed, N failed`, that ctest and people can read.

    /usr/bin/python3 tests/python/run.py [--env vllm] [-k PATTERN] [test_module ...]

It runs itself again in the engines' environment (tests/python/engines-venv.sh
makes it once and caches it; SHARDFS_ENGINES=0 does not), so the engine tests
import SGLang's and UCM's real packages; tests/python/engines.py says which
parts of them import here. With `--env vllm`, it runs in vllm-venv.sh's
environment instead: vLLM's scheduler and connector on PyPI's torch 2.

Skipped tests are listed with their reason before that line (they count in
neither number). Exit status 0 when none failed. The package is imported
from this tree's gpu/python, even when one is installed; with
SHARDFS_TEST_INSTALLED=1, from wherever the interpreter finds it (the
install test).
"""
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


class Result(unittest.TextTestResult):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.passed = 0

    def addSuccess(self, test):
        super().addSuccess(test)
        self.passed += 1


def engines_python(script="engines-venv.sh"):
    """The interpreter of the engines' environment (the script makes it,
    cached), or None, saying why, when it cannot be made."""
    try:
        out = subprocess.run(["bash", os.path.join(HERE, script)], check=True,
                             stdout=subprocess.PIPE, timeout=1800)
        return out.stdout.decode().strip().splitlines()[-1]
    except (OSError, subprocess.SubprocessError, IndexError) as e:
        print(f"{script} failed ({e}): the engine tests skip", flush=True)
        return None


def main(argv):
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    if argv[:2] == ["--env", "vllm"]:
        # vLLM's scheduler and connector, on PyPI's torch 2 (vllm-venv.sh).
        argv = argv[2:]
        if not os.environ.get("SHARDFS_IN_ENGINES"):
            py = engines_python("vllm-venv.sh")
            if py:
                with open(os.path.join(os.path.dirname(os.path.dirname(py)), "ld-library-path")) as f:
                    ld = f.read().strip()
                os.environ["LD_LIBRARY_PATH"] = ":".join(
                    p for p in (ld, os.environ.get("LD_LIBRARY_PATH")) if p)
                os.environ["SHARDFS_IN_ENGINES"] = "vllm"
                os.execv(py, [py, os.path.abspath(__file__)] + argv)
    elif os.environ.get("SHARDFS_ENGINES", "1") != "0" and not os.environ.get("SHARDFS_IN_ENGINES"):
        py = engines_python()
        if py:  # again, in the environment with SGLang and UCM installed
            os.environ["SHARDFS_IN_ENGINES"] = "1"
            os.execv(py, [py, os.path.abspath(__file__)] + argv)
    sys.path.insert(0, HERE)
    if os.environ.get("SHARDFS_TEST_INSTALLED") != "1":
        # The package of this tree, not one installed on the machine.
        sys.path.insert(0, os.path.join(ROOT, "gpu", "python"))
    import engines  # before any test imports shardfs: the adapters subclass the engines' bases

    for engine, why in engines.setup().items():
        print(f"{engine}: " + (why or "the real package's interface imported"), flush=True)
    pattern = None
    names = []
    it = iter(argv)
    for a in it:
        if a == "-k":
            pattern = next(it)
        else:
            names.append(a)
    loader = unittest.TestLoader()
    if pattern:
        loader.testNamePatterns = [f"*{pattern}*"]
    if names:
        suite = loader.loadTestsFromNames(names)
    else:
        suite = loader.discover(HERE, pattern="test_*.py", top_level_dir=HERE)
    runner = unittest.TextTestRunner(verbosity=2, resultclass=Result, stream=sys.stdout)
    result = runner.run(suite)
    for test, reason in result.skipped:
        print(f"skipped: {test}: {reason}")
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    print(f"{result.passed} passed, {failed} failed", flush=True)
    return 1 if failed or (result.testsRun == 0 and not result.skipped) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
