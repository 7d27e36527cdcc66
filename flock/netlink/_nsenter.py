"""Run a small function inside another network namespace without moving any
reusable thread there.

A network namespace belongs to an OS thread (``setns(2)`` changes only the
calling thread).  pyroute2 0.9.7's ``IPRoute(netns=...)`` forks a child process
for every socket it opens, and creates the namespace when it is missing
(``flags=O_CREAT``) — wrong for a teardown of a deleted pod.  Instead, each call
here starts a fresh ``threading.Thread`` that enters the namespace, runs the
function and exits: the namespace switch dies with that thread.  Objects the
function creates stay bound to the namespace they were created in (a netlink
socket, an open ``/proc/sys/net`` file), so the caller may use them anywhere.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000


class NetnsMissing(FileNotFoundError):
    """The namespace path does not exist (or is not a namespace any more)."""


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _setns(fd: int) -> None:
    if hasattr(os, "setns"):  # Python 3.12+
        os.setns(fd, CLONE_NEWNET)
        return
    if _libc().setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def open_netns(path: str) -> int:
    """An O_RDONLY fd on the namespace file at *path*; NetnsMissing if gone."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NetnsMissing(errno.ENOENT, "network namespace not found", path) from None


def run_in_netns(path: str | None, fn: Callable[[], T]) -> T:
    """Call *fn* in the network namespace at *path* (None: the caller's own).

    Blocking; runs *fn* on a dedicated short-lived thread when *path* is set.
    Exceptions from *fn* propagate; a missing namespace raises NetnsMissing.
    """
    if path is None:
        return fn()
    fd = open_netns(path)
    outcome: list = []

    def enter_and_run() -> None:
        try:
            _setns(fd)
            outcome.append((True, fn()))
        except BaseException as exc:  # handed to the caller's thread, re-raised there
            outcome.append((False, exc))

    try:
        thread = threading.Thread(target=enter_and_run, name="flock-netns", daemon=True)
        thread.start()
        thread.join()
    finally:
        os.close(fd)
    ok, value = outcome[0]
    if not ok:
        if isinstance(value, OSError) and value.errno == errno.EINVAL:
            raise NetnsMissing(errno.EINVAL, "not a network namespace", path) from value
        raise value
    return value
