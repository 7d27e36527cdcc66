"""Entering a network namespace on an OS thread: the one way in (stdlib only).

A network namespace belongs to an OS thread: ``setns(2)`` moves the calling
thread alone, and everything that thread does afterwards (a socket opened, a
``/proc/sys/net`` file written, a netlink request) happens in the namespace
it is in.  The rule (DESIGN): **never** ``setns()`` **on a thread other work may
reuse** — a Trio worker thread, the main thread, a pool's thread.  There are
two ways to keep it:

- :func:`call_in_netns`: ``fn()`` on a fresh OS thread that enters the
  namespace, calls it and ends; the switch dies with the thread.  What *fn*
  makes (a socket) stays in the namespace it was made in and may be used from
  any thread afterwards.  Most callers want this.
- :func:`enter_netns`: enter on the current thread — only for a thread made
  for that namespace that never serves other work (libnftables' own thread
  in :class:`flock.policy.LibNftables`), or one that re-enters its own
  namespace before it takes the next call (:class:`flock.netlink.NetnsThread`).

A namespace is named by a path (``/proc/…/ns/net``, ``/run/netns/NAME``), by
a bare name under :data:`NETNS_DIR` (no ``/`` in it, as ``ip netns`` names
them), or by an open fd (borrowed: the caller keeps and closes it).

This module imports nothing from flock and nothing outside the standard
library: the lab and the lab's API server use it without pyroute2 or the
netlink layer.  (The CNI shim keeps a copy of its own in
:mod:`flock.cni_common`: the shim stands alone.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"  # where ``ip netns add NAME`` mounts its namespaces


def netns_path(netns: str) -> str:
    """The path of *netns*: itself when it has a ``/`` in it, else the name's under :data:`NETNS_DIR`."""
    return netns if "/" in netns else f"{NETNS_DIR}/{netns}"


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def setns(fd: int) -> None:
    """setns(2) the calling thread into the network namespace open as *fd* (see the module's rule).

    Raises OSError (EINVAL: *fd* is no network namespace)."""
    if hasattr(os, "setns"):  # Python 3.12+
        os.setns(fd, CLONE_NEWNET)
        return
    if _libc().setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def enter_netns(netns: str | int) -> None:
    """Move the calling thread into *netns* (a path, a name under :data:`NETNS_DIR`, or an fd), for good.

    Only on a thread made for that namespace and never reused for other work (the module's rule).
    Raises OSError: FileNotFoundError for a missing path, the setns error (naming the path) else."""
    if isinstance(netns, int):
        setns(netns)
        return
    path = netns_path(netns)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(fd)
    except OSError as exc:
        raise OSError(exc.errno, f"setns {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def call_in_netns(netns: str | int | None, fn: Callable[[], T], *, name: str = "flock-netns") -> T:
    """``fn()`` on a fresh OS thread (called *name*) that first enters *netns* (as :func:`enter_netns`
    takes it; None: ``fn()`` here, on the calling thread) and then ends.  Blocking.

    Whatever the thread raises — entering the namespace (OSError) or *fn* — is raised in the caller's
    thread."""
    if netns is None:
        return fn()
    outcome: list[tuple[bool, Any]] = []

    def enter_and_call() -> None:
        try:
            enter_netns(netns)
            outcome.append((True, fn()))
        except BaseException as exc:  # handed to the caller's thread, raised there
            outcome.append((False, exc))

    thread = threading.Thread(target=enter_and_call, name=name, daemon=True)
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value
