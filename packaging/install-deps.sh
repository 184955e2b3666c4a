#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install what shardfs needs to build and test on Debian 12 (idempotent).
# The CUDA toolkit is optional: CMake finds it at /usr/local/cuda when present.
# GlusterFS (server and FUSE client) is for test_shared_store's two-host
# suite; that test starts its own glusterd when none runs and stops it after
# (installing the package does not need it running). python3-matplotlib
# draws docs/PERFORMANCE.md's plots (tests/bench/plots.py). libssl-dev: the
# peer tier's MACs (SHA-256 of libcrypto). gdb: a test whose process hangs
# prints every thread's stack before it fails (tu_dump_stacks). tmux: the
# test of `shardfsctl top` runs it in a detached 80x24 terminal.
# python3-yaml: test_k8s.py reads the manifests of packaging/k8s/.
set -euo pipefail

pkgs=(build-essential cmake pkg-config git
      libfuse3-dev fuse3 liburing-dev libnuma-dev libcriterion-dev libssl-dev
      attr util-linux procps python3 python3-numpy python3-torch python3-matplotlib python3-yaml
      clang libclang-rt-14-dev gdb tmux
      glusterfs-server glusterfs-client)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
