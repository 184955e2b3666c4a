# SPDX-License-Identifier: MIT
"""The installed Python package against a real daemon (tests/install/run.sh).

    /usr/bin/python3 load.py MOUNTPOINT BACKEND_DIR BLOCK_HEX NSHARDS

Loads shards 0..NSHARDS-1 of the block into bytearrays through shardfs.Rank
and checks every byte against the pattern run.sh wrote (byte i of shard n is
(7 i + 13 n + 1) mod 256). Exit 0 when all match; 77 when the installed
package has no Rank yet (the placeholder package: nothing to test).
"""
import sys

import shardfs


def main():
    mnt, store, block, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if not hasattr(shardfs, "Rank"):
        print("load.py: the installed shardfs has no Rank (placeholder package)")
        return 77
    with shardfs.Rank(mount=mnt, backend=store) as r:
        ss = r.shard_size
        bufs = [bytearray(ss) for _ in range(n)]
        status = r.load([(block, s, bufs[s]) for s in range(n)]).wait(30)
        if any(status):
            print(f"load.py: statuses {list(status)}")
            return 1
        for s in range(n):
            want = bytes((7 * i + 13 * s + 1) & 0xFF for i in range(ss))
            if bytes(bufs[s]) != want:
                print(f"load.py: shard {s}: bytes differ")
                return 1
    print(f"load.py: {n} shards of {ss} bytes verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
