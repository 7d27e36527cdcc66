"""The root of flock-agent's supervision tree: signals, the services, drain, exit status.

SIGTERM/SIGINT: drain (the RPC server stops accepting, requests in flight
get a bounded time, the socket file goes), then cancel the tree → exit 0.
A second signal cancels at once.  Escalation out of the root supervisor →
exit 1, so the kubelet restarts the container.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path

import attrs
import trio

from flock.nursery import ChildSpec, RestartIntensity, Supervisor, SupervisorEscalation

log = logging.getLogger("flock.agent")

# Every drain hook together must finish within this (the kubelet's grace
# period is 30 s by default; the RPC server's own drain deadline is shorter).
SHUTDOWN_DEADLINE_S = 5.0
ROOT_INTENSITY = RestartIntensity(max_restarts=5, period=60.0)

EXIT_OK = 0
EXIT_ESCALATED = 1

Drain = Callable[[], Awaitable[None]]


class FatalStartError(Exception):
    """Start-up cannot go on and restarting would not help (an unusable state
    directory or database); the message names it and what to do."""


class StateDirError(FatalStartError):
    """The state directory cannot be created or written."""


def _specs(children: Iterable[ChildSpec]) -> tuple[ChildSpec, ...]:
    return tuple(children)


def _drains(drains: Iterable[Drain]) -> tuple[Drain, ...]:
    return tuple(drains)


def _no_children(_inst: object, _attr: attrs.Attribute, children: Sequence[ChildSpec]) -> None:
    names = [c.name for c in children]
    if "signals" in names or len(set(names)) != len(names):
        raise ValueError(f"child names must be unique and not 'signals': {names}")


@attrs.define(eq=False)
class Agent:
    """The root supervisor: the signal watcher, then *services* in order (each
    started only once the previous one serves).  *drains* are awaited, in
    order, and *leaves* beside them, bounded by *deadline* (:data:`SHUTDOWN_DEADLINE_S` unless
    the agent announces Service routes: then plus ``--bgp-leave-seconds``), before the tree is cancelled."""

    services: Sequence[ChildSpec] = attrs.field(converter=_specs, validator=_no_children)
    drains: Sequence[Drain] = attrs.field(converter=_drains, default=())
    # run beside the drains, from the signal on (a BGP leave: graceful shutdown, then withdrawal)
    leaves: Sequence[Drain] = attrs.field(converter=_drains, default=())
    deadline: float = SHUTDOWN_DEADLINE_S
    intensity: RestartIntensity = ROOT_INTENSITY
    _root: trio.CancelScope = attrs.field(init=False, factory=trio.CancelScope)

    @property
    def children(self) -> Sequence[ChildSpec]:
        return (ChildSpec("signals", self._watch_signals), *self.services)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until a signal (returns) or until the tree escalates (SupervisorEscalation)."""
        with self._root:
            await Supervisor("flock-agent", self.children, intensity=self.intensity).run(task_status=task_status)

    async def shutdown(self) -> None:
        """Drain every service that asked for it (bounded), then cancel the tree."""
        with trio.move_on_after(self.deadline) as scope:
            async with trio.open_nursery() as nursery:
                for leave in self.leaves:
                    nursery.start_soon(leave)
                for drain in self.drains:
                    await drain()
        if scope.cancelled_caught:
            log.warning("drain did not finish in time", extra={"deadline_s": self.deadline})
        self._root.cancel()

    async def _watch_signals(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            async with trio.open_nursery() as nursery:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if nursery.child_tasks:
                        log.warning("second signal: stopping now", extra={"signal": name})
                        self._root.cancel()
                    else:
                        log.info("signal: shutting down", extra={"signal": name})
                        nursery.start_soon(self.shutdown)


def check_state_dir(path: Path) -> None:
    """Create *path* if needed; raise :class:`StateDirError` unless it is a writable directory."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        what = (
            "exists and is not a directory"
            if path.exists() and not path.is_dir()
            else f"cannot create it ({exc.strerror})"
        )
        raise StateDirError(
            f"state directory {path}: {what}; mount a writable directory there or pass --state-dir"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise StateDirError(
            f"state directory {path}: not writable (read-only mount?); "
            "mount a writable directory there or pass --state-dir"
        )


def serve(main: Callable[[], Awaitable[object]], clock: trio.abc.Clock | None = None) -> int:
    """Run *main* (the agent) to completion; the process exit status."""
    try:
        trio.run(main, clock=clock)
    except FatalStartError as exc:
        log.critical("cannot start", extra={"error": str(exc)})
        _tell_operator(str(exc))
        return EXIT_ESCALATED
    except SupervisorEscalation as exc:
        log.critical("supervision tree gave up", exc_info=True)
        if exc.fatal:
            _tell_operator(f"{exc.__cause__}")
        return EXIT_ESCALATED
    return EXIT_OK


def _tell_operator(message: str) -> None:
    # One plain last line on stderr: what `kubectl logs --previous` shows first
    # when the container exits at once instead of restarting for minutes.
    print(f"flock-agent: fatal: {message}", file=sys.stderr, flush=True)
