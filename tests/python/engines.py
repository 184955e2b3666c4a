# SPDX-License-Identifier: MIT
"""The engines' own packages for the tests: SGLang's and UCM's real modules,
imported from the environment tests/python/engines-venv.sh makes (run.py
calls setup() before any test module imports shardfs, so the adapters
subclass the engines' real base classes).

What cannot be imported here, and why (each test that needs it skips
naming it):

  * `sglang/__init__.py` imports sglang.srt.utils, which needs torch >= 2.0
    (torch.utils._contextlib) and triton; Debian's torch is 1.13. The
    packages sglang, sglang.srt, sglang.srt.mem_cache(.storage) are entered
    without running their __init__, and the modules the storage interface
    lives in, `sglang.srt.mem_cache.hicache_storage` and
    `sglang.srt.mem_cache.storage.backend_factory`, are SGLang's files as
    installed, imported as they are (they need only torch and
    sglang.srt.environ). Out of reach for the same reason: HiCacheController
    (`sglang.srt.managers.cache_controller`), the host pools
    (`sglang.srt.mem_cache.pool_host`) and StorageMetrics
    (`sglang.srt.observability.metrics_collector`).
  * UCM publishes its code only in CPython 3.12 wheels: its Python files
    import as they are, but its one compiled module on the store path,
    `ucm.shared.infra.ucmlogger` (UCM's C++ log sink), is a cp312 binary;
    it is replaced by a module that sends the same calls to Python's
    logging. `ucm.integration.vllm.ucm_connector` needs vLLM (torch >= 2 and
    CUDA wheels of several GB): not importable here.
  * vLLM's scheduler and OffloadingConnector need torch >= 2: not here,
    but in the environment of tests/python/vllm-venv.sh (PyPI's torch 2.14
    on the CPU against the machine's CUDA 13 libraries), where
    `run.py --env vllm` runs test_vllm_engine and test_vllm (the ctest
    `python_vllm`).
"""
import importlib
import importlib.util
import logging
import os
import sys
import types

SGLANG_PKGS = ("sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.mem_cache.storage")
WHY_SGLANG_FULL = ("needs torch >= 2.0 (torch.utils._contextlib) and triton; this machine's "
                   "torch is Debian's 1.13")
WHY_VLLM = "vLLM is not installed (its wheels need torch >= 2 and CUDA, several GB)"

_done = None


def _bare_package(name, path):
    mod = types.ModuleType(name)
    mod.__path__ = [path]
    mod.__package__ = name
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, mod)
    return mod


def _sglang():
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return "sglang is not installed (tests/python/engines-venv.sh installs it)"
    root = list(spec.submodule_search_locations)[0]
    for name in SGLANG_PKGS:
        if name not in sys.modules:
            _bare_package(name, os.path.join(root, *name.split(".")[1:]))
    try:
        importlib.import_module("sglang.srt.mem_cache.hicache_storage")
        importlib.import_module("sglang.srt.mem_cache.storage.backend_factory")
    except Exception as e:  # noqa: BLE001 - the reason is the skip message
        return f"sglang's storage interface does not import: {type(e).__name__}: {e}"
    return None


class _Level:
    DEBUG, INFO, WARNING, ERROR, CRITICAL = 10, 20, 30, 40, 50


def _ucmlogger():
    mod = types.ModuleType("ucm.shared.infra.ucmlogger")
    mod.__doc__ = "Stand-in for UCM's compiled log sink (cp312 only): Python logging."
    sink = logging.getLogger("ucm_native")  # not under "ucm": UCM bridges that one here
    mod.Level = _Level
    mod.setup = lambda *a, **k: None
    mod.flush = lambda *a, **k: None
    mod.log = lambda level, file, func, line, msg: sink.log(int(level), "%s:%s: %s", file, line, msg)
    mod.log_rate_limit = lambda level, file, func, line, msg, *a: sink.log(int(level), "%s", msg)
    return mod


def _ucm():
    if importlib.util.find_spec("ucm") is None:
        return "UCM (uc-manager) is not installed (tests/python/engines-venv.sh installs it)"
    import sysconfig
    root = list(importlib.util.find_spec("ucm").submodule_search_locations)[0]
    native = os.path.join(root, "shared", "infra", "ucmlogger" + sysconfig.get_config_var("EXT_SUFFIX"))
    try:
        if not os.path.exists(native):  # a wheel for another CPython
            sys.modules["ucm.shared.infra.ucmlogger"] = _ucmlogger()
        importlib.import_module("ucm.store.ucmstore_v1")
        importlib.import_module("ucm.store.factory_v1")
    except Exception as e:  # noqa: BLE001 - the reason is the skip message
        return f"UCM's store interface does not import: {type(e).__name__}: {e}"
    return None


VLLM_API = ("vllm.v1.kv_offload.base", "vllm.v1.kv_offload.config", "vllm.v1.kv_offload.factory",
            "vllm.v1.kv_offload.pointer_utils", "vllm.utils.hashing")
VLLM_PARTS = {
    "OffloadingConnector": "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector",
    "CPUOffloadingSpec": "vllm.v1.kv_offload.cpu.spec",
    "kv_cache_utils": "vllm.v1.core.kv_cache_utils",
    "Scheduler": "vllm.v1.core.sched.scheduler",
}
WHY_VLLM_PARTS = {}


def _import_why(name):
    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - the reason is the skip message
        where = ""
        tb = e.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None:
            where = f" (in {tb.tb_frame.f_code.co_filename.rpartition('site-packages/')[2]})"
        return f"{name} does not import here: {type(e).__name__}: {e}{where}"
    return None


def _vllm():
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (tests/python/engines-venv.sh installs it)"
    for name in VLLM_API:
        why = _import_why(name)
        if why:
            return f"vLLM's offloading API: {why}"
    for part, name in VLLM_PARTS.items():
        WHY_VLLM_PARTS[part] = _import_why(name)
    if _import_why("vllm.distributed.parallel_state"):
        root = list(importlib.util.find_spec("vllm").submodule_search_locations)[0]
        _bare_package("vllm.distributed", os.path.join(root, "distributed"))
        ps = types.ModuleType("vllm.distributed.parallel_state")
        ps.__doc__ = "Stand-in (torch >= 2 module): vLLM's logger asks only which rank is first."
        ps.is_local_first_rank = ps.is_global_first_rank = lambda: True
        sys.modules[ps.__name__] = ps
    return None


def vllm_part(part):
    """None when that part of vLLM (a key of VLLM_PARTS) imports here, else why not."""
    setup()
    return WHY_VLLM_PARTS.get(part, why_not("vllm"))


def setup():
    """Import what of the engines this interpreter can; {engine: None or why not}."""
    global _done
    if _done is None:
        _done = {"sglang": _sglang(), "ucm": _ucm(), "vllm": _vllm()}
    return _done


def why_not(engine):
    """None when the engine's interface imported, else the reason (a skip message)."""
    return setup()[engine]
