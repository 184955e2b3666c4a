#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install dependencies, build, and run the whole test suite.
#   packaging/test.sh [BUILD_DIR]      (default: build)
# Environment: SHARDFS_SANITIZE=1 for ASan+UBSan, SHARDFS_TSAN=1 for TSan,
# CTEST_ARGS for extra ctest arguments (e.g. "-R cache").
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}

bash packaging/install-deps.sh

cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)
[ "${SHARDFS_SANITIZE:-0}" = 1 ] && cmake_args+=(-DSHARDFS_SANITIZE=ON)
[ "${SHARDFS_TSAN:-0}" = 1 ] && cmake_args+=(-DSHARDFS_TSAN=ON)

cmake -S . -B "$build" "${cmake_args[@]}" >/dev/null
cmake --build "$build" -j"$(nproc)"
cd "$build"
# shellcheck disable=SC2086
ctest --output-on-failure --timeout 900 ${CTEST_ARGS:-}
