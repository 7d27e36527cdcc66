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
The thread and ``setns`` themselves are :mod:`flock.netns`'s, flock's one way
into a namespace; what is here is the agent's: pod namespaces checked before
use, and a missing one named as such.

:class:`NetnsThread` saves the thread start on the hot path (a pod's socket
on every ADD): one long-lived thread enters the namespace per call and
returns to its own before it takes the next; a thread that cannot prove it is
back home exits instead of serving again.
"""

from __future__ import annotations

import errno
import fcntl
import os
import queue
import stat
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from flock.netns import CLONE_NEWNET, call_in_netns, setns

T = TypeVar("T")

# linux/nsfs.h: _IO(0xb7, 0x3).  Only nsfs implements it, so an answer proves
# the fd is a namespace; the value says which kind.
NS_GET_NSTYPE = 0xB703

# What a namespace "file" is opened with.  O_NONBLOCK: a FIFO or a device
# handed in as CNI_NETNS must not block the open (nsfs ignores the flag);
# O_NOCTTY: a terminal must not become ours.
OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY

# The network namespaces no pod may be given: flock's own and the node's.
NODE_NETNS_FILES = ("/proc/self/ns/net", "/proc/1/ns/net")


class NetnsMissing(FileNotFoundError):
    """The namespace path does not exist (or is not a namespace any more)."""


class NetnsUnusable(ValueError):
    """An fd or path that must not be used as a pod's network namespace.

    ``reason`` says why in a few words (it ends up in a CNI error's details).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def node_netns_ids(host_netns: str | None = None) -> frozenset[tuple[int, int]]:
    """Identities of the namespaces a pod must never get: this process's,
    PID 1's (the host's init, when visible) and the configured node netns."""
    out = set()
    for path in (*NODE_NETNS_FILES, *((host_netns,) if host_netns else ())):
        try:
            st = os.stat(path)
        except OSError:
            continue  # /proc/1 may be hidden (hidepid); the others exist
        out.add((st.st_dev, st.st_ino))
    return frozenset(out)


def check_netns_fd(fd: int, refused: frozenset[tuple[int, int]] = frozenset()) -> tuple[int, int]:
    """Verify *fd* is a network namespace not in *refused*; its identity.

    Raises NetnsUnusable.  fstat first: only a regular file (what nsfs
    inodes look like) gets the ioctl, never a device whose driver might
    give that number another meaning.
    """
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise NetnsUnusable(f"not a network namespace (a {_file_kind(st.st_mode)})")
    try:
        kind = fcntl.ioctl(fd, NS_GET_NSTYPE)
    except OSError as exc:
        if exc.errno in (errno.ENOTTY, errno.EINVAL):
            raise NetnsUnusable("not a network namespace (a regular file)") from None
        raise NetnsUnusable(f"not a network namespace ({exc.strerror})") from None
    if kind != CLONE_NEWNET:
        raise NetnsUnusable(f"a namespace of another kind (type {kind:#x}), not a network namespace")
    ident = (st.st_dev, st.st_ino)
    if ident in refused:
        raise NetnsUnusable("the node's own network namespace; a pod must have its own")
    return ident


def open_checked_netns(path: str, refused: frozenset[tuple[int, int]] = frozenset()) -> int:
    """Open *path* as a pod network namespace and verify it (see
    :func:`check_netns_fd`); an fd the caller closes.  NetnsMissing when the
    path does not exist, NetnsUnusable for anything else wrong, the OS
    error named."""
    try:
        before = os.stat(path)
    except FileNotFoundError:
        raise NetnsMissing(errno.ENOENT, "network namespace not found", path) from None
    except (OSError, ValueError) as exc:  # ELOOP, ENAMETOOLONG, ENOTDIR, EACCES; ValueError: NUL
        raise NetnsUnusable(f"cannot open it: {_os_error(exc)}") from None
    if not stat.S_ISREG(before.st_mode):  # never open() a FIFO or a device just to look at it
        raise NetnsUnusable(f"not a network namespace (a {_file_kind(before.st_mode)})")
    try:
        fd = os.open(path, OPEN_FLAGS)
    except FileNotFoundError:
        raise NetnsMissing(errno.ENOENT, "network namespace not found", path) from None
    except OSError as exc:
        raise NetnsUnusable(f"cannot open it: {_os_error(exc)}") from None
    try:
        check_netns_fd(fd, refused)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _os_error(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"[Errno {exc.errno}] {exc.strerror}"
    return str(exc)


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISLNK, "symbolic link"),
    ):
        if test(mode):
            return name
    return "regular file"


def open_netns(path: str) -> int:
    """An O_RDONLY fd on the namespace file at *path*; NetnsMissing if gone."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NetnsMissing(errno.ENOENT, "network namespace not found", path) from None


def _call_in(fd: int, fn: Callable[[], Any]) -> tuple[bool, Any]:
    """Enter the namespace *fd* (this thread only) and call *fn*: (True, its
    result) or (False, the exception, to be re-raised on the caller's thread)."""
    try:
        setns(fd)
        return True, fn()
    except BaseException as exc:  # handed to the caller's thread, re-raised there
        return False, exc


def run_in_netns(netns: str | int | None, fn: Callable[[], T]) -> T:
    """Call *fn* in the network namespace *netns*: a path, an fd (borrowed:
    the caller keeps and closes it) or None (the caller's own).

    Blocking; runs *fn* on a dedicated short-lived thread when *netns* is set.
    Exceptions from *fn* propagate; a missing namespace raises NetnsMissing.
    """
    if netns is None:
        return fn()
    path = netns if isinstance(netns, str) else f"fd {netns}"
    fd = open_netns(netns) if isinstance(netns, str) else netns
    try:
        return call_in_netns(fd, fn)
    except OSError as exc:
        _raise_missing(exc, path)
        raise
    finally:
        if isinstance(netns, str):
            os.close(fd)


def _raise_missing(exc: OSError, path: str) -> None:
    """EINVAL (from setns: *path* is no network namespace any more) as NetnsMissing."""
    if exc.errno == errno.EINVAL:
        raise NetnsMissing(errno.EINVAL, "not a network namespace", path) from exc


def _unwrap(outcome: list, path: str) -> Any:
    ok, value = outcome[0]
    if not ok:
        if isinstance(value, OSError):
            _raise_missing(value, path)
        raise value
    return value


THREAD_NETNS = "/proc/thread-self/ns/net"


def _outcome_of(fn: Callable[[], Any]) -> list:
    try:
        return [(True, fn())]
    except Exception as exc:  # handed to Pending.result, re-raised there
        return [(False, exc)]


@attrs.define(eq=False)
class Pending:
    """A call submitted to a :class:`NetnsThread`."""

    path: str
    outcome: list = attrs.field(factory=list)
    finished: threading.Lock | None = None
    close: int | None = None  # the namespace fd submit opened, closed once the call is done

    def result(self) -> Any:
        """Wait for the call; its result, or its exception re-raised."""
        if self.finished is not None:
            self.finished.acquire()
            self.finished = None
            if self.close is not None:
                os.close(self.close)
                self.close = None
        return _unwrap(self.outcome, self.path)


def _identity(path_or_fd: str | int) -> tuple[int, int]:
    st = os.stat(path_or_fd)
    return st.st_dev, st.st_ino


@attrs.define(eq=False)
class NetnsThread:
    """Runs small functions in other network namespaces on one long-lived
    thread (started on first use, gone after *idle* seconds without work).

    Before it takes the next call the thread re-enters its home namespace
    (the one it was born in: its creator's, never a pod's, as no thread that
    runs this code has left its own) and verifies it by the identity of
    ``/proc/thread-self/ns/net``.  If that fails it exits, never serving
    again, and hands the calls still queued to throw-away threads
    (:func:`run_in_netns`); the next call starts a new thread.
    """

    idle: float = 10.0
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _queue: queue.SimpleQueue | None = attrs.field(init=False, default=None)
    # The serving thread's native id (None: there is none) and, during a
    # call, its way home: the fd of the namespace it left (tests look at them).
    native_id: int | None = attrs.field(init=False, default=None)
    home_fd: int | None = attrs.field(init=False, default=None)

    def run(self, netns: str | int | None, fn: Callable[[], T]) -> T:
        """Call *fn* in *netns* as :func:`run_in_netns` does (same arguments,
        errors and result), on the long-lived thread."""
        return self.submit(netns, fn).result()

    def submit(self, netns: str | int | None, fn: Callable[[], T]) -> Pending:
        """Start calling *fn* in *netns* and return at once; the caller must
        collect :meth:`Pending.result` (which also closes a path it opened)."""
        if netns is None:
            return Pending(path="", outcome=_outcome_of(fn))
        path = netns if isinstance(netns, str) else f"fd {netns}"
        fd = open_netns(netns) if isinstance(netns, str) else netns
        finished = threading.Lock()
        finished.acquire()
        pending = Pending(path=path, finished=finished, close=fd if isinstance(netns, str) else None)
        try:
            with self._lock:
                if self._queue is None:
                    self._queue = queue.SimpleQueue()
                    threading.Thread(target=self._serve, args=(self._queue,), name="flock-netns", daemon=True).start()
                self._queue.put((fd, fn, pending.outcome, finished))
        except BaseException:
            if pending.close is not None:
                os.close(pending.close)
            raise
        return pending

    def _serve(self, jobs: queue.SimpleQueue) -> None:
        try:
            home_id = _identity(THREAD_NETNS)
        except OSError:
            self._give_up(jobs)
            return
        self.native_id = threading.get_native_id()
        while True:
            try:
                fd, fn, outcome, finished = jobs.get(timeout=self.idle)
            except queue.Empty:
                with self._lock:
                    if jobs.empty():  # callers put under this lock: none can be lost
                        self._retire(jobs)
                        return
                continue
            at_home = False
            try:
                # Opened per call: an idle thread holds no descriptor.
                home = self.home_fd = os.open(THREAD_NETNS, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                outcome.append((False, exc))
            else:
                outcome.append(_call_in(fd, fn))
                try:
                    setns(home)
                    at_home = _identity(THREAD_NETNS) == home_id
                except OSError:
                    pass
                finally:
                    self.home_fd = None
                    os.close(home)
            if not at_home:
                with self._lock:
                    self._retire(jobs)
                finished.release()
                self._give_up(jobs)
                return
            finished.release()

    def _give_up(self, jobs: queue.SimpleQueue) -> None:
        """Serve no more: the calls still queued run on throw-away threads."""
        with self._lock:
            self._retire(jobs)
        while True:
            try:
                fd, fn, outcome, finished = jobs.get_nowait()
            except queue.Empty:
                return
            try:
                outcome.append((True, run_in_netns(fd, fn)))
            except BaseException as exc:  # handed to the caller's thread, re-raised there
                outcome.append((False, exc))
            finished.release()

    def _retire(self, jobs: queue.SimpleQueue) -> None:
        """Stop taking calls (with the lock held)."""
        if self._queue is jobs:
            self._queue = None
            self.native_id = self.home_fd = None
