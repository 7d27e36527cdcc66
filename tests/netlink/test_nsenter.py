"""Entering namespaces on throw-away threads, and the test namespace pool."""

import os
import threading

import pytest

from flock.netlink import _nsenter
from flock.testing.netns import netns_pool

pytestmark = pytest.mark.usefixtures("require_root")


def own_netns():
    return os.readlink("/proc/thread-self/ns/net")


def test_run_in_netns_runs_there_and_leaves_the_caller_alone():
    before = own_netns()
    with netns_pool("fl-nl-") as pool:
        ns = pool.create("a")
        inside = _nsenter.run_in_netns(ns.path, own_netns)
        assert inside != before
        assert inside == _nsenter.run_in_netns(ns.path, lambda: own_netns())
        assert own_netns() == before
        assert _nsenter.run_in_netns(None, threading.get_ident) == threading.get_ident()


def test_run_in_netns_propagates_errors_and_refuses_non_namespaces(tmp_path):
    with netns_pool("fl-nl-") as pool:
        ns = pool.create("a")
        with pytest.raises(ZeroDivisionError):
            _nsenter.run_in_netns(ns.path, lambda: 1 / 0)
    with pytest.raises(_nsenter.NetnsMissing):
        _nsenter.run_in_netns(ns.path, own_netns)
    plain = tmp_path / "not-a-netns"
    plain.write_text("")
    with pytest.raises(_nsenter.NetnsMissing):
        _nsenter.run_in_netns(str(plain), own_netns)


def test_pool_removes_everything_even_after_a_failure():
    names = []
    with pytest.raises(RuntimeError, match="boom"), netns_pool("fl-nl-") as pool:
        a, b = pool.create("a"), pool.create("b")
        pool.veth(a, "x0", b, "y0")
        names = [a.name, b.name]
        assert a.name.startswith("fl-nl-a-") and a.exists()
        assert "y0" in b.ip("link")
        raise RuntimeError("boom")
    assert names and not any(os.path.exists(f"/run/netns/{n}") for n in names)
