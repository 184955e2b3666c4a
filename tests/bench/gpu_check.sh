#!/bin/sh
# SPDX-License-Identifier: MIT
# gpu_check.sh - on a machine with an NVIDIA GPU, in one command (< 5 min):
# build shardfs with the CUDA copier, run the rank tests (the CUDA ones run
# instead of skipping), then the GPU benchmark (load/dump GB/s by shard size
# against one big pinned copy, and the 64 x 16 KiB task latency).
#
#   tests/bench/gpu_check.sh [BUILD_DIR]      (default: build-gpu)
#
# Exit status: non-zero if the build, a test or the benchmark fails, or if no
# GPU is visible (so a CUDA run that silently fell back is not a pass).
set -eu
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-"$here/build-gpu"}
jobs=$(nproc 2>/dev/null || echo 4)

command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L || true
echo "== configure + build ($build)"
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSHARDFS_CUDA=ON \
      -DSHARDFS_FUSE=OFF >"$build.cmake.log" 2>&1 || { cat "$build.cmake.log"; exit 1; }
grep -q "CUDA copier ON" "$build.cmake.log" || { echo "CUDA toolkit not found by CMake"; exit 1; }
cmake --build "$build" -j "$jobs" --target test_rank bench_rank

echo "== CUDA tests"
out=$(timeout 120 "$build/tests/test_rank" --jobs=1 --verbose=0 --filter='rank/cuda*' 2>&1) || {
    echo "$out"; exit 1; }
echo "$out"
if echo "$out" | grep -q SKIP; then
    echo "gpu_check: the CUDA tests skipped: no usable GPU"; exit 1
fi

echo "== all rank tests"
timeout 240 "$build/tests/test_rank" --jobs=1 --verbose=0 2>&1 | tail -3

echo "== GPU benchmark"
timeout 150 "$build/tests/bench/bench_rank" --gpu --copier cuda ${GPU_CHECK_QUICK:+--quick}
echo "gpu_check: ok"
