#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build the libFuzzer targets with clang and run each one for a while
# (docs/fuzzing.md).
#   tests/fuzz/run.sh [SECONDS_EACH] [BUILD_DIR]      (defaults: 15, build-fuzz)
# Environment: FUZZ_TARGETS="ctl_header fs_path" runs only those; FUZZ_ARGS
# adds libFuzzer flags (e.g. "-runs=10000000"); FUZZ_NO_BUILD=1 runs the
# binaries already in BUILD_DIR as they are (built from other sources, say).
# Prints one line per target (executions, executions a second, coverage,
# result) and a closing "N passed, N failed". Exit status 1 if any target
# crashed, tripped a sanitizer, hung or failed a property; its reproducer is
# left in BUILD_DIR/fuzz-artifacts/<target>/ and its log in
# BUILD_DIR/fuzz-logs/<target>.log. The corpus grows in
# BUILD_DIR/fuzz-corpus/<target>/ (seeded from tests/fuzz/corpus/<target>/
# and by the harness itself) and is kept between runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-15}
build=${2:-build-fuzz}
targets=${FUZZ_TARGETS:-"attach_hello attach_welcome ctl_header fs_path xattr_value peer_wire peer_serve"}

if [ "${FUZZ_NO_BUILD:-0}" != 1 ]; then
  if ! command -v clang >/dev/null; then
    echo "fuzz: clang not found (packaging/install-deps.sh installs it)" >&2
    exit 1
  fi
  mkdir -p "$build"
  if ! cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DSHARDFS_FUZZ=ON -DSHARDFS_TESTS=OFF -DSHARDFS_BENCH=OFF -DSHARDFS_CUDA=OFF \
      -DSHARDFS_FUSE=ON >"$build/cmake-fuzz.log" 2>&1; then
    cat "$build/cmake-fuzz.log" >&2
    exit 1
  fi
  cmake --build "$build" -j"$(nproc)" --target fuzz >/dev/null || exit 1
fi

pass=0
fail=0
for t in $targets; do
  bin=$build/tests/fuzz/fuzz_$t
  work=$build/fuzz-corpus/$t
  art=$build/fuzz-artifacts/$t
  log=$build/fuzz-logs/$t.log
  if [ ! -x "$bin" ]; then
    echo "fuzz $t: not built"
    fail=$((fail + 1))
    continue
  fi
  mkdir -p "$work" "$art" "$(dirname "$log")"
  args=(-max_total_time="$secs" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1
        -artifact_prefix="$art/")
  [ -f "tests/fuzz/$t.dict" ] && args+=(-dict="tests/fuzz/$t.dict")
  dirs=("$work")
  [ -d "tests/fuzz/corpus/$t" ] && dirs+=("tests/fuzz/corpus/$t")
  # shellcheck disable=SC2086
  SHARDFS_FUZZ_SEEDS=$work "$bin" "${args[@]}" ${FUZZ_ARGS:-} "${dirs[@]}" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1)
  corp=$(find "$work" -type f | wc -l)
  if [ "$rc" -eq 0 ]; then
    result=ok
    pass=$((pass + 1))
  else
    result="FAILED (exit $rc; log $log; reproducer in $art/)"
    fail=$((fail + 1))
  fi
  printf 'fuzz %-12s %10s execs %7s exec/s  %-20s corpus %5s  %s\n' \
    "$t" "${execs:-?}" "${rate:-?}" "${cov:-cov: ?}" "$corp" "$result"
  if [ "$rc" -ne 0 ]; then
    # The finding and its stack, without libFuzzer's and libc's own frames.
    grep -E 'property failed|ERROR:|runtime error|SUMMARY|^    #[0-9]+ ' "$log" |
      grep -vE 'fuzzer::|__sanitizer|libc\.so|pthread_kill|raise\.c|abort\.c|_start' |
      head -16 | sed 's/^/    /'
  fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
