"""Entering namespaces on throw-away threads, and the test namespace pool."""

import os
import threading
import time

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


def task_netns(native_id):
    return os.readlink(f"/proc/self/task/{native_id}/ns/net")


def wait_until(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_netns_thread_runs_there_and_is_home_again_before_the_caller_resumes():
    home = own_netns()
    helper = _nsenter.NetnsThread()
    with netns_pool("fl-nl-") as pool:
        a, b = pool.create("a"), pool.create("b")
        fd = os.open(b.path, os.O_RDONLY)
        try:
            inside_a = helper.run(a.path, own_netns)
            tid = helper.native_id
            assert inside_a not in (home, None)
            assert task_netns(tid) == home
            assert helper.run(fd, own_netns) == _nsenter.run_in_netns(b.path, own_netns) != inside_a
            assert helper.native_id == tid and task_netns(tid) == home  # one thread, reused, at home
            with pytest.raises(ZeroDivisionError):
                helper.run(a.path, lambda: 1 / 0)
            assert task_netns(tid) == home
            assert helper.run(None, threading.get_ident) == threading.get_ident()
        finally:
            os.close(fd)
    with pytest.raises(_nsenter.NetnsMissing):
        helper.run(a.path, own_netns)
    assert own_netns() == home


def test_netns_thread_that_cannot_prove_it_is_home_never_serves_again():
    home = own_netns()
    helper = _nsenter.NetnsThread()
    with netns_pool("fl-nl-") as pool:
        a, b = pool.create("a"), pool.create("b")
        helper.run(a.path, own_netns)
        first = helper.native_id
        fd = os.open(b.path, os.O_RDONLY)

        def lead_home_astray():
            # Its way home now leads into b: it must notice and leave.
            os.dup2(fd, helper.home_fd)
            return own_netns()

        try:
            assert helper.run(a.path, lead_home_astray) == _nsenter.run_in_netns(a.path, own_netns)
        finally:
            os.close(fd)
        assert helper.native_id is None
        wait_until(lambda: not os.path.exists(f"/proc/self/task/{first}"))
        assert helper.run(b.path, own_netns) == _nsenter.run_in_netns(b.path, own_netns)
        assert helper.native_id not in (None, first) and task_netns(helper.native_id) == home


def test_netns_thread_serves_concurrent_callers_and_retires_when_idle():
    helper = _nsenter.NetnsThread(idle=0.05)
    with netns_pool("fl-nl-") as pool:
        spaces = [pool.create(f"n{i}") for i in range(4)]
        expected = {ns.path: _nsenter.run_in_netns(ns.path, own_netns) for ns in spaces}
        wrong = []

        def caller(ns):
            for _ in range(50):
                if helper.run(ns.path, own_netns) != expected[ns.path]:
                    wrong.append(ns.path)

        threads = [threading.Thread(target=caller, args=(ns,)) for ns in spaces * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not wrong and not any(t.is_alive() for t in threads)
        wait_until(lambda: helper.native_id is None)
        assert helper.run(spaces[0].path, own_netns) == expected[spaces[0].path]
