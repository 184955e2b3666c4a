#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# vLLM as an engine runs it, for tests/python/test_vllm_engine.py: vLLM's
# scheduler and OffloadingConnector need torch >= 2, which Debian 12 does
# not have and PyPI ships only as a CUDA build. This environment takes
# PyPI's torch 2.14.0 (the one vLLM 0.34.0 pins) without its CUDA wheels,
# and loads it on the CPU against the CUDA 13 runtime libraries of the
# machine's toolkit (/usr/local/cuda), plus the four libraries a toolkit
# does not carry (cuSPARSELt, NCCL, NVSHMEM, cuFile, about 520 MB as
# wheels). Without a GPU the toolkit's stub stands in for libcuda.so.1:
# torch imports, sees no device, and runs on the CPU.
#
#   tests/python/vllm-venv.sh     create it if needed, print bin/python
#
# It prints nothing on stdout and exits 1, saying why on stderr, where it
# cannot be made (no CUDA 13 toolkit, no network): the engine tests skip.
# The environment's library path is in its file `ld-library-path` (the
# runner sets LD_LIBRARY_PATH from it). About 1.3 GB to fetch, 2.8 GB
# installed, cached like engines-venv.sh's (SHARDFS_ENGINES_CACHE).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
CUDA=${CUDA_HOME:-/usr/local/cuda}
PINS=(torch==2.14.0 vllm==0.34.0 xgrammar==0.2.9 nvidia-cusparselt-cu13==0.8.1
      nvidia-nccl-cu13==2.30.7 nvidia-nvshmem-cu13==3.4.5 nvidia-cufile==1.15.1.6)
REQS=$here/vllm-engine-requirements.txt

if [ ! -e "$CUDA/lib64/libcudart.so.13" ] || [ ! -e "$CUDA/lib64/libcublas.so.13" ]; then
  echo "vllm-venv.sh: no CUDA 13 runtime libraries in $CUDA/lib64 (torch 2.14 links them)" >&2
  exit 1
fi
pins="${PINS[*]} $(sha256sum <"$REQS" | cut -c1-12) $($PY -c 'import sys; print(sys.version_info[:2])')"
hash=$(printf '%s' "$pins" | sha256sum | cut -c1-12)
cache=${SHARDFS_ENGINES_CACHE:-$HOME/.cache/shardfs}
venv=$cache/vllm-venv-$hash
if [ -f "$venv/.complete" ]; then
  echo "$venv/bin/python"
  exit 0
fi

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.vllm-venv-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
{
  $PY -m venv "$tmp"
  "$tmp/bin/python" -m pip --disable-pip-version-check -q install --no-deps "${PINS[@]}" -r "$REQS"
} >&2
# Built here, then moved: the path is the final one.
site=$("$tmp/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
site=${site/#$tmp/$venv}
ld="$site/nvidia/cusparselt/lib:$site/nvidia/cu13/lib:$site/nvidia/nccl/lib:$site/nvidia/nvshmem/lib"
ld="$ld:$CUDA/lib64"
if ! ldconfig -p | grep -q 'libcuda\.so\.1 '; then
  mkdir -p "$tmp/cuda-stub"
  ln -s "$CUDA/lib64/stubs/libcuda.so" "$tmp/cuda-stub/libcuda.so.1"
  ld="$ld:$venv/cuda-stub"
fi
echo "$ld" >"$tmp/ld-library-path"
rm -rf "$venv"
mv "$tmp" "$venv"
trap - EXIT
# The check, where it will run from.
if ! LD_LIBRARY_PATH=$ld "$venv/bin/python" -c 'import torch' >/dev/null 2>"$venv/import.log"; then
  echo "vllm-venv.sh: torch does not import with this machine's CUDA libraries:" >&2
  tail -3 "$venv/import.log" >&2
  exit 1
fi
echo "$pins" >"$venv/.complete"
echo "$venv/bin/python"
