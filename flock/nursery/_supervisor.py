"""A supervisor: runs child services, restarts them by policy, escalates past its limit."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import attrs
import trio

from flock.nursery._policy import ChildSpec, Restart, RestartIntensity

log = logging.getLogger("flock.nursery")


class SupervisorEscalation(Exception):
    """A supervisor gave up: a child failed more often than its restart intensity allows.

    Raised out of :meth:`Supervisor.run` after every sibling was cancelled;
    ``__cause__`` is the child's last failure (None if it returned normally).
    A parent supervisor treats it as that child's crash; at the root it ends
    the process with a non-zero status.
    """

    def __init__(self, supervisor: str, child: str, intensity: RestartIntensity, *, fatal: bool = False) -> None:
        self.supervisor, self.child, self.intensity, self.fatal = supervisor, child, intensity, fatal
        super().__init__(
            f"supervisor {supervisor!r}: child {child!r} failed with an error a restart cannot fix"
            if fatal
            else f"supervisor {supervisor!r}: child {child!r} needed more than "
            f"{intensity.max_restarts} restarts in {intensity.period:g} s"
        )


@attrs.define(eq=False)
class _ChildStatus:
    """The task_status handed to a child: records readiness on every run and
    passes the first ``started()`` on to the supervisor's own start-up."""

    supervisor: Supervisor
    name: str
    outer: trio.TaskStatus[None]
    forwarded: bool = False

    def started(self, value: Any = None) -> None:
        self.supervisor._ready.add(self.name)
        self.release()

    def release(self) -> None:
        if not self.forwarded:
            self.forwarded = True
            self.outer.started()


def _specs(children: Iterable[ChildSpec]) -> tuple[ChildSpec, ...]:
    return tuple(children)


@attrs.define(eq=False)
class Supervisor:
    """Runs *children* in order, each started only after the previous one is ready.

    Error handling: an ``Exception`` from a child is logged and the child is
    restarted per its :class:`Restart` policy after its :class:`Backoff`
    delay, also before it first became ready (the supervisor's own start-up
    then waits).  Every restart counts against the shared
    :class:`RestartIntensity`; one too many raises
    :class:`SupervisorEscalation` out of :meth:`run`, cancelling all siblings.
    A temporary child that fails before it was ready escalates at once (the
    supervisor cannot become ready without it), and so does a failure listed
    in the child's ``fatal`` types.  ``trio.Cancelled`` and other
    ``BaseException`` pass straight through and are never counted.
    """

    name: str
    children: Sequence[ChildSpec] = attrs.field(converter=_specs)
    intensity: RestartIntensity = RestartIntensity()
    rng: random.Random = attrs.field(factory=random.Random)
    _ready: set[str] = attrs.field(init=False, factory=set)
    _history: tuple[float, ...] = attrs.field(init=False, default=())
    _restarts: dict[str, int] = attrs.field(init=False, factory=dict)

    @property
    def ready(self) -> frozenset[str]:
        """Names of the children serving right now."""
        return frozenset(self._ready)

    def restarts(self, child: str) -> int:
        return self._restarts.get(child, 0)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every child, report started, supervise until cancelled or escalation."""
        # A restarted supervisor starts afresh, like a new OTP process.
        self._history = ()
        self._ready.clear()
        try:
            async with trio.open_nursery() as nursery:
                for spec in self.children:
                    await nursery.start(self._supervise, spec)
                log.debug("supervisor ready", extra={"supervisor": self.name})
                task_status.started()
        except BaseExceptionGroup as group:
            escalations, rest = group.split(SupervisorEscalation)
            if escalations is not None and rest is None:
                # Keep the escalation's own cause (the child's failure) intact.
                escalation = next(_leaves(escalations))
                raise escalation from escalation.__cause__
            raise

    async def _supervise(self, spec: ChildSpec, *, task_status: trio.TaskStatus[None]) -> None:
        status = _ChildStatus(self, spec.name, task_status)
        failures = 0
        while True:
            began = trio.current_time()
            crash: Exception | None = None
            try:
                await spec.fn(task_status=status)
            except Exception as exc:
                crash = exc
            finally:
                self._ready.discard(spec.name)
            done = spec.restart is Restart.TEMPORARY or (crash is None and spec.restart is Restart.TRANSIENT)
            if crash is not None:
                log.error(
                    "child %s failed", spec.name, exc_info=crash, extra={"supervisor": self.name, "child": spec.name}
                )
                if isinstance(crash, spec.fatal):
                    raise SupervisorEscalation(self.name, spec.name, self.intensity, fatal=True) from crash
            if done and (crash is None or status.forwarded):
                status.release()  # a child that finished its job is no reason to wait
                return
            if crash is None:
                log.warning(
                    "child %s returned; restarting", spec.name, extra={"supervisor": self.name, "child": spec.name}
                )
            now = trio.current_time()
            history = None if done else self.intensity.admit(self._history, now)
            if history is None:
                raise SupervisorEscalation(self.name, spec.name, self.intensity) from crash
            self._history = history
            if now - began >= spec.backoff.reset_after:
                failures = 0
            await trio.sleep(spec.backoff.delay(failures, self.rng.random()))
            failures += 1
            self._restarts[spec.name] = self._restarts.get(spec.name, 0) + 1


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc
