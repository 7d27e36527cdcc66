"""Call a function in a named network namespace on a fresh OS thread that then ends (stdlib only).

For sockets: one made in a namespace keeps it, and no thread that other work
uses ever changes namespace.  (flock.netlink has the agent's own version;
the fake API server and the lab must not need the netlink layer.)
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

NETNS_DIR = "/run/netns"
_CLONE_NEWNET = 0x40000000


def call_in_netns(netns: str, fn: Callable[[], T]) -> T:
    """``fn()`` on a new OS thread that first enters *netns* (a name under /run/netns); blocking.

    An OSError (entering, or from *fn*) is raised in the caller's thread."""
    outcome: list[Any] = []

    def enter_and_call() -> None:
        try:
            fd = os.open(f"{NETNS_DIR}/{netns}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({netns}): {os.strerror(err)}")
            finally:
                os.close(fd)
            outcome.append(fn())
        except OSError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=enter_and_call, name=f"in-{netns}", daemon=True)
    thread.start()
    thread.join()
    if isinstance(outcome[0], OSError):
        raise outcome[0]
    return outcome[0]
