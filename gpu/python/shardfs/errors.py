# SPDX-License-Identifier: MIT
"""The exceptions of the package: every one is an OSError carrying an errno.

ShardfsError          anything the library answered with -errno (.errno set)
  InvalidArgument     bad input from the caller (EINVAL); also a ValueError
  RankClosed          a call on a closed Rank, or on one opened by the parent
                      of a forked process (EBADF)
  WaitTimeout         Task.wait() ran out of time (ETIMEDOUT); also the
                      builtin TimeoutError
  PinBudgetExceeded   Rank.pin() over the daemon's pin budget (EDQUOT)
  PinsDisabled        Rank.pin() on a cache with pins off (EPERM)
"""
import errno as _errno
import os


class ShardfsError(OSError):
    """An error from libshardfs-rank or from the binding, with its errno."""

    def __init__(self, err, message):
        err = abs(int(err))
        super().__init__(err, f"{message}: {os.strerror(err)}" if message else os.strerror(err))


class InvalidArgument(ShardfsError, ValueError):
    """Bad input: wrong buffer size or type, non-contiguous tensor, bad key."""

    def __init__(self, message):
        ShardfsError.__init__(self, _errno.EINVAL, message)


class RankClosed(ShardfsError):
    """The Rank is closed, or belongs to another process (after fork)."""

    def __init__(self, message):
        ShardfsError.__init__(self, _errno.EBADF, message)


class WaitTimeout(ShardfsError, TimeoutError):
    """Task.wait() timed out; the task goes on and may be waited for again."""

    def __init__(self, message):
        ShardfsError.__init__(self, _errno.ETIMEDOUT, message)


class PinBudgetExceeded(ShardfsError):
    """A pin batch would take the pinned slots over the daemon's budget
    (-o pin_budget): refused whole, nothing pinned, no other pin evicted."""

    def __init__(self, message):
        ShardfsError.__init__(self, _errno.EDQUOT, message)


class PinsDisabled(ShardfsError):
    """The cache has pins off (-o pin_budget=0)."""

    def __init__(self, message):
        ShardfsError.__init__(self, _errno.EPERM, message)


def check(rc, what):
    """Raise ShardfsError for a negative return code; return rc otherwise."""
    if rc < 0:
        if rc == -_errno.EINVAL:
            raise InvalidArgument(what)
        raise ShardfsError(-rc, what)
    return rc
