"""Uniquely named network namespaces and veth links, for tests and the lab.

Everything created through a :class:`NetnsPool` is deleted when the pool
closes (use it as a context manager or a fixture), even after a failure.
Deleting a namespace deletes the interfaces inside it, so veths need no
separate cleanup.  Blocking (pyroute2 + ``ip``); call from a thread or from
synchronous fixtures.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
from collections.abc import Iterator

import attrs
from pyroute2 import netns as _pyroute2_netns

NETNS_DIR = "/run/netns"


def _ip(*args: str) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


@attrs.frozen
class Netns:
    name: str

    @property
    def path(self) -> str:
        return f"{NETNS_DIR}/{self.name}"

    def run(self, *argv: str, check: bool = True, timeout: float = 10) -> subprocess.CompletedProcess:
        """Run *argv* inside this namespace (``ip netns exec``)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *argv], capture_output=True, text=True, check=check, timeout=timeout
        )

    def ip(self, *args: str) -> str:
        return _ip("-n", self.name, *args)

    def exists(self) -> bool:
        return os.path.exists(self.path)


@attrs.define(eq=False)
class NetnsPool:
    """Creates namespaces named ``<prefix><role>-<random>`` and removes them all on close."""

    prefix: str = "fl-"
    _created: list[Netns] = attrs.field(init=False, factory=list)

    def create(self, role: str = "ns") -> Netns:
        ns = Netns(f"{self.prefix}{role}-{secrets.token_hex(3)}")
        _ip("netns", "add", ns.name)
        self._created.append(ns)
        ns.ip("link", "set", "lo", "up")
        return ns

    def veth(self, a: Netns, a_name: str, b: Netns, b_name: str) -> None:
        """A veth pair a_name (in *a*) <-> b_name (in *b*), both up."""
        _ip("-n", a.name, "link", "add", a_name, "type", "veth", "peer", "name", b_name, "netns", b.name)
        a.ip("link", "set", a_name, "up")
        b.ip("link", "set", b_name, "up")

    def delete(self, ns: Netns) -> None:
        if ns.exists():
            _pyroute2_netns.remove(ns.name)
        if ns in self._created:
            self._created.remove(ns)

    def close(self) -> None:
        errors = []
        for ns in reversed(list(self._created)):
            try:
                self.delete(ns)
            except OSError as exc:
                errors.append(f"{ns.name}: {exc}")
        if errors:
            raise RuntimeError("could not delete namespaces: " + "; ".join(errors))

    def __enter__(self) -> NetnsPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@contextlib.contextmanager
def netns_pool(prefix: str = "fl-") -> Iterator[NetnsPool]:
    pool = NetnsPool(prefix)
    try:
        yield pool
    finally:
        pool.close()
