#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The engines' own packages for the Python tests, in a cached virtual
# environment: prints its interpreter's path.
#
#   tests/python/engines-venv.sh        create it if needed, print bin/python
#
# The environment sees Debian's python3-torch and python3-numpy
# (--system-site-packages); PyPI's torch (a CUDA build of several GB) is
# never installed. Each engine comes with --no-deps, plus the one
# pure-Python module its storage code imports:
#
#   sglang 0.5.23                 HiCacheStorage, PoolTransfer, ..., StorageBackendFactory
#   uc-manager-cuda-cu129 0.8.1   ucm.store.ucmstore_v1, factory_v1 (its cp312 wheel,
#                                 unpacked for its Python files)
#   wrapt 2.5.2                   imported by ucm/__init__.py
#   vllm 0.34.0                   vllm.v1.kv_offload.{base,config,factory,pointer_utils}
#                                 (its abi3 wheel, 239 MB: about 6 s to fetch, 16 s to install)
#   msgspec 0.23.0, regex 2026.12.2, cbor2 6.3.0
#                                 imported by those vLLM modules (kv_hints, the logger,
#                                 vllm.utils.hashing)
#
# The directory's name carries a hash of this list, so changing a pin makes
# a new one; a finished one holds a stamp file and is reused as it is.
# Environment: SHARDFS_ENGINES_CACHE (default ~/.cache/shardfs).
set -euo pipefail

SGLANG=sglang==0.5.23
UCM=uc-manager-cuda-cu129==0.8.1
WRAPT=wrapt==2.5.2
VLLM=(vllm==0.34.0 msgspec==0.23.0 regex==2026.12.2 cbor2==6.3.0)
PY=/usr/bin/python3

pins="$SGLANG $UCM $WRAPT ${VLLM[*]} $($PY -c 'import sys; print(sys.version_info[:2])')"
hash=$(printf '%s' "$pins" | sha256sum | cut -c1-12)
cache=${SHARDFS_ENGINES_CACHE:-$HOME/.cache/shardfs}
venv=$cache/engines-venv-$hash
if [ -f "$venv/.complete" ]; then
  echo "$venv/bin/python"
  exit 0
fi

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.engines-venv-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
{
  $PY -m venv --system-site-packages "$tmp"
  site=$("$tmp/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  pip=("$tmp/bin/python" -m pip --disable-pip-version-check -q)
  "${pip[@]}" install --no-deps "$SGLANG" "$WRAPT" "${VLLM[@]}"
  # UCM publishes its code only in CPython 3.12 wheels; their Python files
  # are what the tests import (its compiled modules do not load in 3.11).
  "${pip[@]}" install --no-deps --only-binary :all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --target "$site" "$UCM"
} >&2
echo "$pins" >"$tmp/.complete"
# Moved into place whole (bin/python finds its environment from where it
# lies; only pip's own scripts name the old path, and they are not used).
rm -rf "$venv"
mv "$tmp" "$venv"
trap - EXIT
echo "$venv/bin/python"
