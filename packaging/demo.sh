#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The main job on an embedded default: install what is needed, build, make a
# small demo store in the UCM PosixStore layout, mount it with shardfs, and
# show it working: cp and dd of a shard, setfattr touch, getfattr state, a
# two-rank load through libshardfs-rank, the stats before and after. Then
# unmount. Runs as root (apt-get, /dev/fuse); uses sudo otherwise.
#   packaging/demo.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
build=${1:-build}
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '$ %s\n' "$*"; "$@"; }
xattr() { printf '$ getfattr -n %s %s\n  %s\n' "$1" "${2#$work/}" "$(getfattr --absolute-names --only-values -n "$1" "$2")"; }

step "install dependencies and build"
bash packaging/install-deps.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target shardfs shardfs-load >/dev/null
bin=$top/$build/fs/shardfs
load=$top/$build/gpu/shardfs-load

work=$(mktemp -d /tmp/shardfs-demo.XXXXXX)
store=$work/store
mnt=$work/mnt
sock=$work/attach.sock
mkdir -p "$store/data" "$mnt"

cleanup() {
  if mountpoint -q "$mnt" 2>/dev/null; then
    fusermount3 -u "$mnt" 2>/dev/null || $SUDO umount -l "$mnt" 2>/dev/null || true
  fi
  sleep 0.2
  rm -rf "$work"
}
trap cleanup EXIT

step "a demo store: 8 blocks x 4 shards of 256 KiB, UCM layout <store>/data/<32 hex id>"
shard=$((256 * 1024))
blocks=()
for i in $(seq 0 7); do
  id=$(printf 'shardfs demo block %d' "$i" | md5sum | cut -c1-32)
  blocks+=("$id")
  head -c $((4 * shard)) /dev/urandom >"$store/data/$id"
done
show ls -l "$store/data" | head -4
echo "..."

step "mount: capacity 16 shards (smaller than the 32 in the store, so CLOCK evicts)"
show "$bin" -o shard_size=256K,capacity=4M,socket="$sock" "$store" "$mnt"
for _ in $(seq 50); do mountpoint -q "$mnt" && break; sleep 0.1; done
mountpoint -q "$mnt"
xattr user.shardfs.socket "$mnt"

step "stats before"
grep -E '^shardfs_(requests|hits|misses|backend_loads|resident_bytes|capacity_bytes|evictions)' "$mnt/stats"

b0=${blocks[0]}
step "cp a shard out of the mount and compare with the store's bytes"
show cp "$mnt/block/$b0/shard/1" "$work/s1"
show cmp "$work/s1" <(dd if="$store/data/$b0" bs=$shard skip=1 count=1 status=none) && echo "identical"
xattr user.shardfs.state "$mnt/block/$b0/shard/1"
echo "(the miss on shard 1 also started readahead of the shards after it:)"
xattr user.shardfs.state "$mnt/block/$b0/shard/2"
xattr user.shardfs.state "$mnt/block/$b0/shard/0"

step "dd at an offset inside a shard (4 KiB at 8 KiB of shard 3)"
show dd if="$mnt/block/$b0/shard/3" of="$work/piece" bs=4096 skip=2 count=1 status=none
cmp "$work/piece" <(dd if="$store/data/$b0" bs=4096 skip=$((3 * shard / 4096 + 2)) count=1 status=none) && echo "identical"

step "ls the tree"
show ls "$mnt/block/$b0/shard"
show ls "$mnt/block"

step "Touch block 0 with setfattr: its resident shards get CLOCK's second chance"
grep '^shardfs_touched_total' "$mnt/stats"
show setfattr -n user.shardfs.touch -v 1 "$mnt/block/$b0"
grep '^shardfs_touched_total' "$mnt/stats"
echo "(tests/test_fs.c runs scenario D of docs/design.md through the mount: Touch keeps a block under eviction)"

step "read every shard of the other blocks: 28 shards through a 16-shard cache"
for id in "${blocks[@]:1}"; do cat "$mnt"/block/"$id"/shard/* >/dev/null; done
grep -E '^shardfs_(backend_loads|evictions)_total' "$mnt/stats"

step "a two-rank load through libshardfs-rank: shard 2 of every block, verified"
printf '%s\n' "${blocks[@]}" | show "$load" --mount "$mnt" --backend "$store" --ranks 2 --shard 2 --verify -

step "stats after (the ranks' loads count as owner loads; the daemon's as backend loads)"
grep -E '^shardfs_(requests|hits|misses|owner_loads|backend_loads|resident_bytes|capacity_bytes|evictions)' "$mnt/stats"

step "unmount"
show fusermount3 -u "$mnt"
echo "demo done"
