#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Run the Python tests (tests/python/test_*.py) with unittest and close with
one plain line, `N passed, N failed`, that ctest and people can read.

    /usr/bin/python3 tests/python/run.py [-k PATTERN] [test_module ...]

Skipped tests are listed with their reason before that line (they count in
neither number). Exit status 0 when none failed. The package is imported
from this tree's gpu/python, even when one is installed; with
SHARDFS_TEST_INSTALLED=1, from wherever the interpreter finds it (the
install test).
"""
import os
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


def main(argv):
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    sys.path.insert(0, HERE)
    if os.environ.get("SHARDFS_TEST_INSTALLED") != "1":
        # The package of this tree, not one installed on the machine.
        sys.path.insert(0, os.path.join(ROOT, "gpu", "python"))
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
