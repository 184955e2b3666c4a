#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build the Debian packages of shardfs into dist/ (Debian 12, as root or
# with sudo for the build dependencies):
#   bash packaging/deb.sh
# gives dist/shardfs_V_ARCH.deb, libshardfs-rank0_V_ARCH.deb,
# libshardfs-dev_V_ARCH.deb, python3-shardfs_V_all.deb, V being the CMake
# project version (project(shardfs VERSION ...)), then runs lintian on them
# (its report in dist/lintian.txt; see docs/install.md for what remains).
#
# debhelper builds them from a copy of the working tree (build-deb/), with
# packaging/debian/ as debian/ and a changelog written here. No CUDA copier
# (-DSHARDFS_CUDA=OFF): the CUDA runtime is not a Debian package here.
# Environment: SHARDFS_LINTIAN=0 skips lintian.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

bash packaging/install-deps.sh
# What building packages needs beyond building shardfs (idempotent).
pkgs=(dpkg-dev debhelper dh-python python3 lintian)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "deb.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

version=$(sed -n 's/^project(shardfs VERSION \([0-9][0-9.]*\).*/\1/p' CMakeLists.txt)
[ -n "$version" ] || { echo "deb.sh: no version in CMakeLists.txt's project()" >&2; exit 1; }

stage=$root/build-deb
src=$stage/shardfs-$version
rm -rf "$stage"
mkdir -p "$src"
# The working tree as it is (committed or not), without build outputs.
tar -C "$root" --exclude='./build*' --exclude=./dist --exclude=./.git \
    --exclude='__pycache__' --exclude='*.pyc' -cf - . | tar -C "$src" -xf -
cp -r packaging/debian "$src/debian"
# The changelog's date: the last commit's, so that the same tree gives the
# same packages; now, outside a git checkout.
when=$(git log -1 --format=%cD 2>/dev/null || date -R)
cat >"$src/debian/changelog" <<CHANGELOG
shardfs ($version) unstable; urgency=medium

  * Release $version (built by packaging/deb.sh).

 -- shardfs developers <shardfs@lists.example.org>  $when
CHANGELOG

(cd "$src" && dpkg-buildpackage -b -us -uc -j"$(nproc)")

mkdir -p dist
rm -f dist/*.deb dist/lintian.txt
for p in shardfs libshardfs-rank0 libshardfs-dev python3-shardfs; do
  cp "$stage"/${p}_"$version"_*.deb dist/
done
ls -l dist/*.deb

if [ "${SHARDFS_LINTIAN:-1}" != 0 ]; then
  # Informational: lintian's findings do not fail the build; the ones left
  # are listed in docs/install.md.
  lintian --display-info --pedantic "$stage"/shardfs_"$version"_*.changes >dist/lintian.txt 2>&1 || true
  echo "== lintian ($(grep -c '^[EWIP]:' dist/lintian.txt || true) tags; dist/lintian.txt)"
  cat dist/lintian.txt
fi
