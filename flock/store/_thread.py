"""The thread that owns the sqlite connection: it runs queued blocking calls
in order, grouping consecutive calls that allow it, and hands each result
back to the Trio task that queued it."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs
import outcome
import trio

T = TypeVar("T")

# Upper bound on calls per group: a burst's callers wait for one fsync, not
# for an unbounded transaction.
MAX_GROUP = 64

#: Runs a group of calls, one outcome per call (:meth:`SyncStore.run_group`).
Group = Callable[[Sequence[Callable[[], Any]]], "list[outcome.Outcome]"]


@attrs.frozen
class _Job:
    fn: Callable[[], Any]
    deliver: Callable[[outcome.Outcome], None]
    # Jobs with the same ``group`` queued together run as one group.
    group: Group | None


@attrs.define(eq=False)
class StoreThread:
    """One thread that runs queued blocking calls in order, grouping those
    that allow it (see :mod:`flock.store`)."""

    _jobs: queue.SimpleQueue[_Job | None] = attrs.field(init=False, factory=queue.SimpleQueue)
    _thread: threading.Thread = attrs.field(init=False)
    _stopped: bool = attrs.field(init=False, default=False)
    # Calls that ran in a group of more than one (for tests and benchmarks).
    grouped_calls: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="flock-store", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        carried: list[_Job | None] = []
        while True:
            job = carried.pop() if carried else self._jobs.get()
            if job is None:
                return
            if job.group is None:
                job.deliver(outcome.capture(job.fn))
                continue
            batch = [job]
            while len(batch) < MAX_GROUP:
                try:
                    more = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None or more.group != job.group:
                    carried.append(more)
                    break
                batch.append(more)
            results = job.group([j.fn for j in batch])
            if len(batch) > 1:
                self.grouped_calls += len(batch)
            for j, result in zip(batch, results, strict=True):
                j.deliver(result)

    async def call(self, fn: Callable[[], T], *, group: Group | None = None) -> T:
        """Run *fn* on the thread (in a group run by *group*, if given).
        Cancellation waits for *fn* to finish."""
        if self._stopped:
            raise RuntimeError("the allocation store is closed")
        task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()

        def deliver(result: outcome.Outcome) -> None:
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)

        self._jobs.put(_Job(fn, deliver, group))
        result: T = await trio.lowlevel.wait_task_rescheduled(lambda _raise_cancel: trio.lowlevel.Abort.FAILED)
        return result

    async def stop(self) -> None:
        self._stopped = True
        self._jobs.put(None)
        await trio.to_thread.run_sync(self._thread.join)
