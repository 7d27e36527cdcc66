"""flock.netns, the one way into a network namespace: a fresh thread enters it, the caller never does."""

from __future__ import annotations

import errno
import os
import threading

import pytest

from flock.netns import call_in_netns, enter_netns, netns_path
from flock.testing.netns import netns_pool

pytestmark = pytest.mark.usefixtures("require_root")


def thread_netns() -> int:
    """The inode of the calling thread's network namespace."""
    return os.stat("/proc/thread-self/ns/net").st_ino


def where() -> tuple[int, int]:
    """(the calling thread's namespace, its native id)."""
    return thread_netns(), threading.get_native_id()


def test_a_fresh_thread_enters_the_namespace_and_the_caller_stays_home():
    before = thread_netns()
    with netns_pool("fl-nsh-") as pool:
        ns = pool.create("a")
        target = os.stat(ns.path).st_ino
        assert target != before
        threads = set(threading.enumerate())
        fd = os.open(ns.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            by_fd = call_in_netns(fd, where)
        finally:
            os.close(fd)
        for got in (call_in_netns(ns.path, where), call_in_netns(ns.name, where), by_fd):
            inside, native = got
            assert inside == target  # entered, by path, by /run/netns name and by fd
            assert native != threading.get_native_id()  # not on the caller's thread
        assert thread_netns() == before  # the caller never moved
        assert set(threading.enumerate()) == threads  # and each thread ended with its call
    assert call_in_netns(None, where) == (before, threading.get_native_id())  # None: here, as is


def test_what_the_function_makes_stays_in_the_namespace():
    with netns_pool("fl-nsh-") as pool:
        ns = pool.create("a")
        fd = call_in_netns(ns.path, lambda: os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC))
        try:
            assert os.fstat(fd).st_ino == os.stat(ns.path).st_ino != thread_netns()
        finally:
            os.close(fd)


def test_errors_are_raised_in_the_caller(tmp_path):
    with pytest.raises(FileNotFoundError):
        call_in_netns("fl-nsh-no-such-namespace", thread_netns)
    with pytest.raises(FileNotFoundError):
        call_in_netns(str(tmp_path / "gone"), thread_netns)
    plain = tmp_path / "not-a-netns"
    plain.write_text("")
    with pytest.raises(OSError, match=f"setns {plain}") as refused:
        call_in_netns(str(plain), thread_netns)
    assert refused.value.errno == errno.EINVAL
    with netns_pool("fl-nsh-") as pool:
        ns = pool.create("a")
        with pytest.raises(ZeroDivisionError):
            call_in_netns(ns.path, lambda: 1 / 0)


def test_a_thread_made_for_a_namespace_enters_it_for_good():
    before = thread_netns()
    seen: list[int] = []

    def serve(path: str) -> None:  # a thread that serves nothing else, as LibNftables' own
        enter_netns(path)
        seen.extend([thread_netns(), thread_netns()])

    with netns_pool("fl-nsh-") as pool:
        ns = pool.create("a")
        thread = threading.Thread(target=serve, args=(ns.path,))
        thread.start()
        thread.join()
        assert seen == [os.stat(ns.path).st_ino] * 2
    assert thread_netns() == before


def test_a_name_is_one_under_run_netns_and_a_path_is_itself():
    assert netns_path("pod-a") == "/run/netns/pod-a"
    assert netns_path("/proc/1/ns/net") == "/proc/1/ns/net"
    assert netns_path("/run/netns/pod-a") == "/run/netns/pod-a"
