#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The install test: the Debian packages on this machine, as a user gets them.
#   bash tests/install/run.sh            (as root; .ci/run runs it)
#
# 1. builds the .debs (packaging/deb.sh; its build tools, like
#    install-deps.sh's, stay installed) and installs them with apt-get,
#    which pulls in their dependencies;
# 2. compiles tests/install/consumer.c out of the tree two ways, with
#    pkg-config shardfs-rank and as a CMake project using
#    find_package(shardfs) -> shardfs::rank, from a scratch copy;
# 3. mounts a posix store with the installed /usr/sbin/shardfs, and runs both
#    consumers against it: each attaches through the mount point's socket and
#    loads shards whose every byte it checks;
# 4. imports the Python package from its installed place with Debian's
#    /usr/bin/python3 (PYTHONPATH unset, cwd /), and, once the package has
#    shardfs.Rank, loads the shards through it (load.py);
# 5. mounts through an fstab line (type fuse.shardfs, mount -T TMPFSTAB:
#    mount(8) runs /sbin/mount.fuse.shardfs), and with the helper alone from
#    an empty environment, and reads through both;
# 6. unmounts, purges the packages and the dependencies apt-get pulled in,
#    and checks that nothing of ours is left under /usr.
# The machine is left as found even when a step fails: an EXIT trap
# unmounts, stops the daemons it started, purges what it installed and
# removes its scratch directory. It refuses to start when a shardfs package
# is installed already (it would remove it). The last line is
# "N passed, N failed"; the exit status is 0 when nothing failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok - $*"; }
bad() { fail=$((fail + 1)); echo "FAIL - $*"; }
# check NAME CMD...: one step, its output shown only when it fails.
check() {
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then
    ok "$name"
  else
    bad "$name"
    printf '%s\n' "$out" | tail -30 | sed 's/^/    /'
    return 1
  fi
}

ourpkgs=(shardfs libshardfs-rank0 libshardfs-dev python3-shardfs)
installed_pkgs() {
  dpkg-query -W -f='${Package} ${db:Status-Status}\n' 2>/dev/null |
    awk '$2 == "installed" || $2 == "unpacked" || $2 == "half-installed" || $2 == "half-configured" {print $1}' |
    sort
}
# Everything of ours a package or an install could leave under /usr
# (/lib, /sbin and /bin are /usr's on Debian 12).
our_files() {
  find /usr /etc/systemd \( -name '*shardfs*' -o -path '*/man3/rank.3*' \) 2>/dev/null | sort
}

tmp=
baseline=
mounts=()
installed_by_us=0

cleanup() {
  local rc=$? m pid extra left
  trap - EXIT INT TERM
  if [ "$rc" -ne 0 ] && [ "$fail" -eq 0 ]; then
    bad "stopped early (exit status $rc)"
  fi
  for m in "${mounts[@]}"; do
    if mountpoint -q "$m" 2>/dev/null; then
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    fi
  done
  # The daemons this test started serve its scratch directory: only those.
  if [ -n "$tmp" ]; then
    for pid in $(pgrep -f -- "$tmp/" 2>/dev/null); do
      [ "$pid" != $$ ] && kill "$pid" 2>/dev/null
    done
  fi
  if [ "$installed_by_us" = 1 ]; then
    # Ours first, then what apt-get installed for them.
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${ourpkgs[@]}" >/dev/null 2>&1 || true
    extra=$(comm -13 "$baseline" <(installed_pkgs))
    if [ -n "$extra" ]; then
      # shellcheck disable=SC2086
      DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq $extra >/dev/null 2>&1 || true
    fi
    left=$(comm -13 "$baseline" <(installed_pkgs))
    if [ -z "$left" ]; then
      ok "packages purged, and the dependencies apt-get pulled in"
    else
      bad "packages still installed after purge: $left"
    fi
    left=$(comm -13 "$tmp/files.before" <(our_files))
    if [ -z "$left" ]; then
      ok "nothing of shardfs left under /usr"
    else
      bad "left under /usr after purge:"
      printf '    %s\n' $left
    fi
  fi
  [ -n "$tmp" ] && rm -rf "$tmp"
  echo "$pass passed, $fail failed"
  if [ "$fail" -eq 0 ]; then
    exit 0
  fi
  exit 1
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$(id -u)" -ne 0 ]; then
  bad "must run as root (apt-get, mounts)"
  exit 1
fi
already=$(installed_pkgs | grep -Fx -f <(printf '%s\n' "${ourpkgs[@]}") || true)
if [ -n "$already" ]; then
  bad "already installed, not touched: $(echo $already); remove them first"
  exit 1
fi

tmp=$(mktemp -d /tmp/shardfs-install.XXXXXX)
version=$(sed -n 's/^project(shardfs VERSION \([0-9][0-9.]*\).*/\1/p' CMakeLists.txt)
ss=65536
nshards=4
block=00112233445566778899aabbccddeeff
store=$tmp/store
mnt=$tmp/mnt
fmnt=$tmp/fstab-mnt
mkdir -p "$store/data" "$mnt" "$fmnt"
# Shard n of the block: byte i is (7 i + 13 n + 1) mod 256 (consumer.c
# checks the same pattern).
python3 - "$store/data/$block" "$ss" "$nshards" <<'EOF'
import sys
path, ss, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "wb") as f:
    for s in range(n):
        f.write(bytes((7 * i + 13 * s + 1) & 0xFF for i in range(ss)))
EOF
dd if="$store/data/$block" of="$tmp/shard2" bs=$ss skip=2 count=1 status=none

echo "== build the packages (packaging/deb.sh)"
if ! SHARDFS_LINTIAN=0 bash packaging/deb.sh >"$tmp/deb.log" 2>&1; then
  bad "packaging/deb.sh"
  tail -30 "$tmp/deb.log" | sed 's/^/    /'
  exit 1
fi
ok "packaging/deb.sh built $(ls dist/*.deb | wc -l) packages"
for p in "${ourpkgs[@]}"; do
  check "dist/ has $p $version" compgen -G "dist/${p}_${version}_*.deb"
done

echo "== install them"
installed_pkgs >"$tmp/pkgs.before"
baseline=$tmp/pkgs.before
our_files >"$tmp/files.before"
installed_by_us=1
debs=()
for p in "${ourpkgs[@]}"; do
  debs+=("$root/$(ls dist/${p}_"${version}"_*.deb)")
done
check "apt-get install ./dist/*.deb" \
  env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${debs[@]}" ||
  exit 1
check "dpkg says the four are installed" \
  bash -c "[ \$(dpkg-query -W -f='\${db:Status-Status}\n' ${ourpkgs[*]} | grep -c '^installed\$') = 4 ]"
for f in /usr/sbin/shardfs /usr/sbin/mount.fuse.shardfs /usr/bin/shardfs-load \
         /usr/bin/shardfsctl /usr/share/man/man8/shardfsctl.8.gz \
         /lib/systemd/system/shardfs@.service /usr/share/man/man8/shardfs.8.gz \
         /usr/share/man/man3/rank.3.gz /usr/include/shardfs/rank.h /usr/include/shardfs/cache.h \
         /usr/include/shardfs/backend.h /usr/include/shardfs/fault.h \
         /usr/lib/python3/dist-packages/shardfs/__init__.py \
         /usr/lib/python3/dist-packages/shardfs/py.typed /usr/lib/python3/dist-packages/shardfs/rank.pyi; do
  check "installed: $f" test -e "$f"
done
check "the systemd unit names the installed daemon" grep -q '^ExecStart=/usr/sbin/shardfs ' \
  /lib/systemd/system/shardfs@.service
if command -v systemd-analyze >/dev/null; then
  # An instance of the template, its command and its Documentation= man page.
  check "systemd-analyze verify shardfs@.service" bash -c "
    out=\$(systemd-analyze verify /lib/systemd/system/shardfs@.service 2>&1); rc=\$?
    echo \"\$out\"; [ \$rc = 0 ] && [ -z \"\$out\" ]"
fi
check "pkg-config shardfs-rank is $version" \
  bash -c "[ \"\$(env -u PKG_CONFIG_PATH pkg-config --modversion shardfs-rank)\" = $version ]"

echo "== out-of-tree consumers"
cons=$tmp/consumer
mkdir -p "$cons"
cp tests/install/consumer.c tests/install/CMakeLists.txt "$cons/"
# shellcheck disable=SC2046
check "consumer built with pkg-config" \
  bash -c "cd '$cons' && env -u PKG_CONFIG_PATH cc -std=c11 -Wall -Wextra -Werror consumer.c \
    \$(pkg-config --cflags --libs shardfs-rank) -o consumer-pc"
check "consumer built with CMake find_package(shardfs)" \
  bash -c "cd '$cons' && env -u CMAKE_PREFIX_PATH cmake -S . -B build >/dev/null &&
    cmake --build build >/dev/null && cp build/consumer consumer-cmake"
check "each header compiles alone (C11 -pedantic and C++)" bash -c "
  for h in rank cache backend fault; do
    echo \"#include <shardfs/\$h.h>\" >'$cons/h.c' &&
    cc -std=c11 -Wall -Wextra -pedantic -Werror -fsyntax-only '$cons/h.c' &&
    c++ -x c++ -Wall -Wextra -Werror -fsyntax-only '$cons/h.c' || exit 1
  done"
check "consumer-pc uses the installed libshardfs-rank.so.0" \
  bash -c "ldd '$cons/consumer-pc' | tee /dev/stderr | grep -Eq 'libshardfs-rank.so.0 => (/usr)?/lib/'"

echo "== against a real daemon (/usr/sbin/shardfs)"
mounts+=("$mnt")
if check "/usr/sbin/shardfs mounts a store" \
     /usr/sbin/shardfs -o "shard_size=$ss,capacity=64M,socket=$tmp/sock" "$store" "$mnt"; then
  for c in consumer-pc consumer-cmake; do
    [ -x "$cons/$c" ] || continue
    check "$c loads $nshards shards through the daemon, bytes verified" \
      "$cons/$c" "$mnt" "$store" "$block" "$nshards"
  done
  check "shard 2 read through the mount matches the store" cmp "$tmp/shard2" "$mnt/block/$block/shard/2"
  check "/usr/bin/shardfs-load verifies the block through 2 ranks" \
    /usr/bin/shardfs-load -m "$mnt" -b "$store" -r 2 -n 1 -V "$block"
  check "/usr/bin/shardfsctl check says the daemon answers" /usr/bin/shardfsctl check "$mnt"
  # The package's own API against the daemon, from its installed place; the
  # placeholder package (no Rank) says so and is not counted.
  cp tests/install/load.py "$tmp/load.py"
  (cd / && env -u PYTHONPATH /usr/bin/python3 "$tmp/load.py" "$mnt" "$store" "$block" "$nshards" \
     >"$tmp/py.out" 2>&1)
  case $? in
    0) ok "python: shardfs.Rank loads $nshards shards through the daemon, bytes verified" ;;
    77) echo "skip - python: $(cat "$tmp/py.out")" ;;
    *) bad "python: shardfs.Rank load through the daemon"; sed 's/^/    /' "$tmp/py.out" ;;
  esac
  check "umount" umount "$mnt"
fi

echo "== the Python package, from its installed place"
check "import shardfs with /usr/bin/python3 gives __version__ $version, from dist-packages" \
  bash -c "cd / && out=\$(env -u PYTHONPATH /usr/bin/python3 -c \
    'import shardfs; print(shardfs.__version__); print(shardfs.__file__)') &&
    echo \"\$out\" && [ \"\$(echo \"\$out\" | sed -n 1p)\" = $version ] &&
    [ \"\$(echo \"\$out\" | sed -n 2p)\" = /usr/lib/python3/dist-packages/shardfs/__init__.py ]"

echo "== an fstab line (mount -T)"
# nofail and noauto are mount(8)'s (mount.fuse3 drops them), x-* are never
# passed to a helper: the daemon would refuse any of them.
printf '# shardfs install test\n%s  %s  fuse.shardfs  shard_size=%s,capacity=64M,socket=%s,nofail,noauto,x-systemd.device-timeout=5s  0  0\n' \
  "$store" "$fmnt" "$ss" "$tmp/fsock" >"$tmp/fstab"
mounts+=("$fmnt")
# mount(8) runs its helper with the standard PATH; the libmount debug
# output names the helper it ran: ours, not mount.fuse3's fallback.
if check "mount -T FSTAB MOUNTPOINT (type fuse.shardfs)" \
     bash -c "LIBMOUNT_DEBUG=cxt mount -T '$tmp/fstab' '$fmnt' 2>'$tmp/mount.debug'"; then
  check "mount(8) ran /sbin/mount.fuse.shardfs" \
    grep -q 'argv\[0\] = "/sbin/mount.fuse.shardfs"' "$tmp/mount.debug"
  check "findmnt says fuse.shardfs" \
    bash -c "findmnt -n -o FSTYPE '$fmnt' | tee /dev/stderr | grep -Fqx fuse.shardfs"
  check "shard 2 read through the fstab mount matches the store" \
    cmp "$tmp/shard2" "$fmnt/block/$block/shard/2"
  [ -x "$cons/consumer-pc" ] &&
    check "consumer-pc attaches through the fstab mount, bytes verified" \
      "$cons/consumer-pc" "$fmnt" "$store" "$block" "$nshards"
  check "umount of the fstab mount" umount "$fmnt"
fi
check "a bad option fails mount -t fuse.shardfs with the daemon's message" bash -c "
  ! mount -t fuse.shardfs -o shard_size=bogus,socket='$tmp/bsock' '$store' '$fmnt' 2>'$tmp/bad.err' &&
  cat '$tmp/bad.err' && grep -q 'shard_size=bogus' '$tmp/bad.err' && ! mountpoint -q '$fmnt'"
# The helper by itself, as mount(8) calls it, from an empty environment: it
# finds mount.fuse3 and the daemon on its own.
if check "env -i mount.fuse.shardfs STORE MOUNTPOINT -o OPTS" \
     env -i /sbin/mount.fuse.shardfs "$store" "$fmnt" -o "shard_size=$ss,socket=$tmp/hsock,nofail"; then
  check "shard 2 read through the helper's mount matches the store" \
    cmp "$tmp/shard2" "$fmnt/block/$block/shard/2"
  check "umount of the helper's mount" umount "$fmnt"
fi
# Whatever happened above, cleanup (the EXIT trap) purges and checks /usr.
exit 0
