"""Netlink sockets in a chosen namespace (flock.netlink._conn)."""

import os

import pytest

from flock.netlink import _conn
from flock.testing.netns import netns_pool

pytestmark = pytest.mark.usefixtures("require_root")


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def leave_unused(netns):
    async with _conn.rtnl(netns):
        pass


async def read_lo(netns):
    async with _conn.rtnl(netns) as ipr:
        return (await _conn.link_by_name(ipr, "lo"))["index"]


@pytest.mark.parametrize("use", [leave_unused, read_lo])
def test_rtnl_closes_its_socket_used_or_not(use):
    with netns_pool("fl-conn-") as pool:
        ns = pool.create("a")
        _conn.run_blocking(use, ns.path)  # the first call's one-off fds (the asyncio loop's selector, caches)
        before = open_fds()
        for _ in range(20):
            _conn.run_blocking(use, ns.path)
            _conn.run_blocking(use, None)
        assert open_fds() - before == set()
