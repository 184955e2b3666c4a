#!/bin/sh
# SPDX-License-Identifier: MIT
# gpu_check.sh - on a machine with an NVIDIA GPU, in one command (< 5 min):
# build shardfs with the CUDA copier, run the CUDA tests (which otherwise
# skip), the rank tests, then the GPU benchmark (load/dump GB/s by shard size
# against one big pinned copy, and the 64 x 16 KiB task latency).
#
#   tests/bench/gpu_check.sh [BUILD_DIR]      (default: build-gpu)
#
#   GPU_CHECK_QUICK=1      the short benchmark
#   GPU_CHECK_SANITIZE=1   also run the CUDA tests under compute-sanitizer
#   GPU_CHECK_HUGEPAGES=0  leave vm.nr_hugepages alone (by default, as root,
#                          64 more huge pages are reserved for the hugetlb
#                          data-plane test while the CUDA tests run)
#
# Exit status: non-zero if the build, a test or the benchmark fails, or if no
# GPU is visible (so a CUDA run that silently fell back is not a pass). Tests
# that need what this machine lacks (two GPUs, huge pages) skip and say so.
# Without a GPU, ctest's rank_cuda_fake* run them on tests/fakecuda (control logic only).
set -eu
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-"$here/build-gpu"}
jobs=$(nproc 2>/dev/null || echo 4)
logs=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")

hp=/proc/sys/vm/nr_hugepages
hp_old=
restore() {
    if [ -n "$hp_old" ]; then
        echo "$hp_old" >"$hp" 2>/dev/null || true
    fi
}
trap restore EXIT
if [ "${GPU_CHECK_HUGEPAGES:-1}" != 0 ] && [ -w "$hp" ]; then
    free=$(awk '/^HugePages_Free:/ {print $2}' /proc/meminfo)
    if [ "${free:-0}" -lt 64 ]; then
        hp_old=$(cat "$hp")
        echo $((hp_old + 64)) >"$hp" 2>/dev/null || true
    fi
fi

command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L || true
echo "== configure + build ($build)"
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSHARDFS_CUDA=ON \
      -DSHARDFS_FUSE=OFF >"$build.cmake.log" 2>&1 || { cat "$build.cmake.log"; exit 1; }
grep -q "CUDA copier ON" "$build.cmake.log" || { echo "CUDA toolkit not found by CMake"; exit 1; }
cmake --build "$build" -j "$jobs" --target test_rank test_rank_cuda bench_rank

# Criterion lists every test a filter leaves out as "[SKIP] ...: Test is
# disabled"; only the others say anything.
echo "== CUDA tests"
rc=0
timeout 300 "$build/tests/test_rank_cuda" --jobs=1 --verbose --filter='rank/cuda*' \
    >"$logs/cuda.txt" 2>&1 || rc=$?
grep -v 'Test is disabled' "$logs/cuda.txt" || true
if [ "$rc" -ne 0 ]; then
    echo "gpu_check: CUDA tests failed (status $rc)"; exit 1
fi
if grep -q '^\[SKIP\] rank::cuda.*no CUDA device' "$logs/cuda.txt"; then
    echo "gpu_check: the CUDA tests skipped: no usable GPU"; exit 1
fi
grep -q '^\[PASS\] rank::cuda_load_dump_device_memory' "$logs/cuda.txt" || {
    echo "gpu_check: the main CUDA test did not run"; exit 1; }
# The benchmark's caches would take whatever huge pages are left: give them
# back first, so it measures what it always has.
restore
hp_old=

if [ "${GPU_CHECK_SANITIZE:-0}" != 0 ]; then
    echo "== CUDA tests under compute-sanitizer (memcheck)"
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    rc=0
    timeout 600 "$san" --tool memcheck --error-exitcode 99 --target-processes all \
        "$build/tests/test_rank_cuda" --jobs=1 --filter='rank/cuda*' >"$logs/san.txt" 2>&1 || rc=$?
    grep -v 'Test is disabled' "$logs/san.txt" | tail -40 || true
    [ "$rc" -eq 0 ] || { echo "gpu_check: compute-sanitizer: status $rc"; exit 1; }
fi

echo "== all rank tests"
rc=0
{ timeout 300 "$build/tests/test_rank" --jobs=1 &&
    timeout 300 "$build/tests/test_rank_cuda" --jobs=1; } >"$logs/rank.txt" 2>&1 || rc=$?
grep -v 'Test is disabled' "$logs/rank.txt" | grep -E '^\[(FAIL|SKIP)|Assertion|Synthesis' || true
[ "$rc" -eq 0 ] || { echo "gpu_check: rank tests failed (status $rc)"; exit 1; }

echo "== GPU benchmark"
timeout 150 "$build/tests/bench/bench_rank" --gpu --copier cuda ${GPU_CHECK_QUICK:+--quick}
echo "gpu_check: ok (logs in $logs)"
