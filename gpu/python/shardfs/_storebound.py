# SPDX-License-Identifier: MIT
"""The store's bound, as an engine asks for it and as the daemon keeps it.

Engines bound their disk tier themselves (UCM's posix_capacity_gb with
posix_gc_enable; an SGLang or vLLM deployment's store capacity). Under
shardfs the store is the daemon's, and only the daemon bounds it
(`-o store_capacity=SIZE`, docs/eviction.md); an adapter cannot set a
daemon option. So an adapter that is asked for a bound reads what the
daemon enforces (`shardfs_store_capacity_bytes` in MOUNT/stats; with only
the socket known, the mount whose user.shardfs.socket names it) and says
so: one log line, a warning when the engine's bound is not enforced (no
bound, a larger one, or no daemon to ask), an info line when it is.
"""
import os
import re

from .errors import InvalidArgument

_METRIC = "shardfs_store_capacity_bytes"
_XATTR_SOCKET = "user.shardfs.socket"


def _unescape(s):
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def mount_of_socket(socket):
    """The shardfs mount whose attach socket is `socket`, or None."""
    want = os.path.realpath(socket)
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.readlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or not rfields or rfields[0] != "fuse.shardfs":
            continue
        mnt = _unescape(fields[4])
        try:
            sock = os.getxattr(mnt, _XATTR_SOCKET).decode(errors="replace").rstrip("\0")
        except OSError:
            continue
        if os.path.realpath(sock) == want:
            return mnt
    return None


def daemon_store_capacity(mount=None, socket=None):
    """The daemon's store bound in bytes (0: none), or None when it cannot
    be read (no mount found, a daemon without the counter)."""
    if mount is None and socket is not None:
        mount = mount_of_socket(socket)
    if mount is None:
        return None
    try:
        with open(os.path.join(mount, "stats")) as f:
            for line in f:
                m = re.match(r"^" + _METRIC + r"\s+(\d+)\s*$", line)
                if m:
                    return int(m.group(1))
    except OSError:
        return None
    return None


def gib(value, who, key):
    """A size in GiB from an engine's config (a number, or its text) as
    bytes; None when not given (None, 0, ""). InvalidArgument otherwise."""
    if value in (None, 0, "", False):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{who}: {key}={value!r}: not a number of GiB") from None
    if not v > 0 or v > (1 << 34):
        raise InvalidArgument(f"{who}: {key}={value!r}: out of range (above 0, GiB)")
    return int(v * (1 << 30))


def check(log, who, want_bytes, asked, mount=None, socket=None):
    """Compare the engine's bound (want_bytes, or None for "some bound":
    a GC switch without a size) with the daemon's, when the engine asked
    for one (asked); log one line. Returns the daemon's bound in bytes (0:
    none) or None (unknown)."""
    if not asked:
        return None
    have = daemon_store_capacity(mount, socket)
    want = f"{want_bytes} bytes" if want_bytes else "a bound"
    if have is None:
        log.warning("%s: the engine asks for %s on the store; the shardfs daemon's bound could "
                    "not be read (%s/stats): this adapter cannot bound the store; mount the daemon "
                    "with -o store_capacity=SIZE", who, want, mount or "no mount for the socket")
    elif have == 0:
        log.warning("%s: the engine asks for %s on the store, but the shardfs daemon enforces "
                    "none (%s 0): the store is not bounded; mount the daemon with "
                    "-o store_capacity=SIZE", who, want, _METRIC)
    elif want_bytes and have > want_bytes:
        log.warning("%s: the engine asks for %s on the store; the shardfs daemon enforces %d "
                    "bytes, more: the store may grow past the engine's bound", who, want, have)
    else:
        log.info("%s: the shardfs daemon bounds the store at %d bytes (the engine asks for %s)",
                 who, have, want)
    return have
