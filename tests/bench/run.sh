#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# run.sh - build the benchmarks if needed and run every one that exists.
#
#   tests/bench/run.sh [--quick] [BUILD_DIR]     (BUILD_DIR defaults to build)
#
# Full mode runs each bench_* program and lets it replace its own section of
# docs/PERFORMANCE.md (--md; a program whose usage offers only --out FILE gets
# that instead); --quick is the CI smoke mode: seconds, stdout
# only, the file untouched. A program that exits 77 was skipped (say, no FUSE
# or no GPU here); any other non-zero status fails the run, after the rest ran.
set -euo pipefail

usage() {
    echo "usage: $0 [--quick] [BUILD_DIR]" >&2
}

root=$(cd "$(dirname "$0")/../.." && pwd)
quick=0
build=build
for a in "$@"; do
    case $a in
    --quick) quick=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) usage; exit 2 ;;
    *) build=$a ;;
    esac
done
case $build in
/*) ;;
*) build=$root/$build ;;
esac

if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSHARDFS_BENCH=ON
fi
cmake --build "$build" -j"$(nproc)"

btype=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt")
case $btype in
Release | RelWithDebInfo) ;;
*) echo "run.sh: warning: $build is a '${btype:-no type}' build; numbers need Release" >&2 ;;
esac
if grep -qE '^SHARDFS_(SANITIZE|TSAN):BOOL=ON' "$build/CMakeCache.txt"; then
    echo "run.sh: warning: $build has sanitizers on; numbers are not representative" >&2
fi

cd "$root"
failed=()
ran=0
for name in bench_cache bench_wake bench_clock bench_admit bench_rank bench_posix bench_cold bench_shared bench_fs bench_warm bench_storecap bench_peer bench_peer_lo; do
    # bench_shared is bench_cold --shared: two hosts on one GlusterFS volume
    # (docs/shared-store.md). --quick runs it briefly (8 MiB, one round, about 10 s);
    # it exits 77 where glusterd cannot run and removes its volume and
    # mounts on every path, which .ci/run checks.
    prog=$name
    pre=()
    if [ "$name" = bench_shared ]; then
        prog=bench_cold
        pre=(--shared)
    fi
    bin=$(find "$build" -name "$prog" -type f -perm -u+x 2>/dev/null | head -n 1)
    [ -n "$bin" ] || continue
    echo "== $name" >&2
    if [ "$quick" = 1 ]; then
        args=(--quick)
    elif grep -qa -e '--md' "$bin"; then
        args=(--md "$root/docs/PERFORMANCE.md") # replaces its own section
    elif grep -qa -e '--out' "$bin"; then
        args=(--out "$root/docs/PERFORMANCE.md") # a program that only knows --out
    else
        args=()
    fi
    # bench_posix measures the data plane as deployed, on huge pages: as
    # root it reserves enough for its 1 GiB store for its run only.
    if [ "$name" = bench_posix ] && [ "$quick" = 0 ] && [ "$(id -u)" = 0 ]; then
        args+=(--hugepages 640)
    fi
    # bench_cold likewise, for its 512 MiB store (and drops caches as root).
    if [ "$name" = bench_cold ] && [ "$quick" = 0 ] && [ "$(id -u)" = 0 ]; then
        args+=(--hugepages 400)
    fi
    set +e
    "$bin" "${pre[@]}" "${args[@]}"
    rc=$?
    set -e
    ran=$((ran + 1))
    if [ "$rc" = 77 ]; then
        echo "== $name: skipped" >&2
    elif [ "$rc" != 0 ]; then
        echo "== $name: failed (exit $rc)" >&2
        failed+=("$name")
    fi
done

# bench_python: the Python binding against the C API (Debian's interpreter,
# which has python3-torch; it loads bench_python_c.so from the build).
if [ -x /usr/bin/python3 ] && [ -f "$build/tests/bench/bench_python_c.so" ]; then
    echo "== bench_python" >&2
    if [ "$quick" = 1 ]; then
        args=(--quick)
    else
        args=(--md "$root/docs/PERFORMANCE.md")
    fi
    set +e
    /usr/bin/python3 "$root/tests/bench/bench_python.py" --build "$build" "${args[@]}"
    rc=$?
    set -e
    ran=$((ran + 1))
    if [ "$rc" = 77 ]; then
        echo "== bench_python: skipped" >&2
    elif [ "$rc" != 0 ]; then
        echo "== bench_python: failed (exit $rc)" >&2
        failed+=("bench_python")
    fi
fi

if [ "$ran" = 0 ]; then
    echo "run.sh: no bench_* programs in $build (configured with -DSHARDFS_BENCH=ON?)" >&2
    exit 1
fi
if [ "${#failed[@]}" -gt 0 ]; then
    echo "run.sh: failed: ${failed[*]}" >&2
    exit 1
fi
