# SPDX-License-Identifier: MIT
"""shardfs: the node-local shared cache of KV-cache shards, from Python.

    import shardfs, torch
    with shardfs.Rank(mount="/mnt/kv", backend="/var/lib/kvstore") as r:
        dst = torch.empty(r.shard_size, dtype=torch.uint8)
        status, = r.load([(block_id, 0, dst)]).wait()   # 0 or -errno

Binds libshardfs-rank (ctypes, zero copy: buffers go to the library as
addresses). Engine adapters: shardfs.ucm.ShardfsStore (UCM StoreV1) and
shardfs.sglang.ShardfsStorage (SGLang HiCacheStorage). docs/python.md has the
whole story.
"""
from ._version import __version__
from .errors import (InvalidArgument, PinBudgetExceeded, PinsDisabled, RankClosed, ShardfsError,
                     WaitTimeout)
from .rank import Entries, EntriesV, Rank, Task, block_hex, block_id, cuda_devices

__all__ = [
    "__version__", "Rank", "Task", "Entries", "EntriesV", "ShardfsError", "InvalidArgument",
    "RankClosed", "WaitTimeout", "PinBudgetExceeded", "PinsDisabled", "block_id", "block_hex",
    "cuda_devices",
]
