"""Deferred veth removal: DEL answers before the kernel has deleted the pod's veth.

Deleting a veth (RTM_DELLINK) costs the kernel 20-45 ms of RCU grace
periods, most of a DEL's time, while nothing in DEL's answer depends on it:
once the row is deleted and the allocation dropped from the node's view,
the pod is gone for the runtime, BIRD and the policy.  (Only for a
Kubernetes pod, whose namespace is destroyed right after its DEL: a
container without a pod may keep its namespace and attach it to another
network under the same interface name, so its DEL removes the veth itself.)  So DEL hands the
deletion to this service and answers; removals run concurrently (the
kernel's waits overlap) on the netlink worker.

What stays true meanwhile (the handler's side, :class:`PodHandler`):

* the pod's addresses stay held in the IPAM until its veth is really gone
  (the callback given to :meth:`VethRemovals.submit` releases them), so no
  other pod gets an address the old veth still routes;
* an ADD, CHECK, GC, DEL or release of the same container ID waits for the
  pending removal under the container's lock (:meth:`VethRemovals.wait`);
* an agent killed in between has deleted the row but not the veth: the
  start-up cleanup removes every flock veth no row explains, and the
  rebuilt IPAM never held those addresses.

Error handling: a failed removal (a :class:`flock.faults.Fault`) is logged
with its container_id and retried with a growing pause; its addresses stay
held and :attr:`VethRemovals.pending` counts it (``flock_veth_removals_pending``)
until it succeeds or a cleanup (GC, start-up) removed the veth, after which
the retry finds nothing and succeeds.  Anything else is a bug: it ends the
service, the supervisor restarts it, and the restarted service takes up every
removal still pending.  Without the service running (stopped, restarting,
or a handler built without one) DEL removes the veth itself, synchronously.

Requests first: a removal waits while the handler has requests in flight
(:meth:`VethRemovals.request`) and for :data:`QUIET_S` after the last one,
at most :data:`MAX_YIELD_S`, so a burst of DELs is answered before the
deletions take CPU (and the GIL from the agent's loop and store thread); a
removal someone waits for (:meth:`VethRemovals.wait`: an ADD of the same
container ID, or one that needs its addresses) starts at once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import attrs
import trio

from flock.faults import Fault

from ._protocols import Checkpoint, Dataplane, NoCheckpoint

log = logging.getLogger("flock.pods")

# Removals under way at once: the kernel's waits overlap, and the netlink
# worker keeps slots free for ADDs (its own limit is 8).
PARALLEL_REMOVALS = 4
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 60.0
# SIGTERM: how long the agent waits for pending removals before it exits
# (what is left is the start-up cleanup's; the agent's drains together are
# bounded by flock.agent's SHUTDOWN_DEADLINE_S).
DRAIN_S = 3.0
# A removal starts once no request has been in flight for QUIET_S (a burst
# of DELs arrives as a stream of short requests), or after MAX_YIELD_S.
QUIET_S = 0.02
MAX_YIELD_S = 1.0


@attrs.define(eq=False)
class _Removal:
    container_id: str
    done: Callable[[], None]
    finished: trio.Event = attrs.field(factory=trio.Event)
    running: bool = False
    urgent: bool = False  # someone waits for it: no yielding to requests


@attrs.define(eq=False)
class VethRemovals:
    """Supervised service ("removals"): deletes DEL'd pods' host veths in the background."""

    dataplane: Dataplane
    parallel: int = PARALLEL_REMOVALS
    drain_deadline: float = DRAIN_S
    # Told "before-veth-removal" as each removal begins (the crash tests kill the agent there).
    checkpoint: Checkpoint = attrs.field(factory=NoCheckpoint)
    #: Failed attempts so far (each is logged and retried).
    failures: int = attrs.field(init=False, default=0)
    _pending: dict[str, _Removal] = attrs.field(init=False, factory=dict)
    _nursery: trio.Nursery | None = attrs.field(init=False, default=None)
    _limiter: trio.CapacityLimiter = attrs.field(init=False)
    _in_flight: int = attrs.field(init=False, default=0)
    _quiet_since: float = attrs.field(init=False, default=float("-inf"))
    # Set (and replaced) when the requests in flight reach none, or a removal becomes urgent.
    _changed: trio.Event = attrs.field(init=False, factory=trio.Event)

    def __attrs_post_init__(self) -> None:
        self._limiter = trio.CapacityLimiter(self.parallel)

    @property
    def running(self) -> bool:
        """Whether :meth:`submit` may be called (the service is up)."""
        return self._nursery is not None

    @property
    def pending(self) -> int:
        """Removals submitted and not yet done (failed ones included)."""
        return len(self._pending)

    def is_pending(self, container_id: str) -> bool:
        return container_id in self._pending

    def container_ids(self) -> list[str]:
        """The containers whose removal is pending."""
        return sorted(self._pending)

    def submit(self, container_id: str, done: Callable[[], None]) -> None:
        """Delete *container_id*'s host veth in the background, then call *done*
        (on the Trio thread).  Only while :attr:`running`; the caller holds the
        container's lock and has waited for any earlier removal of it."""
        if self._nursery is None:
            raise RuntimeError("veth removals are not running")
        if container_id in self._pending:
            raise RuntimeError(f"a removal of container {container_id} is already pending")
        removal = self._pending[container_id] = _Removal(container_id, done)
        self._start(removal)

    async def wait(self, container_id: str) -> None:
        """Return once no removal of *container_id* is pending (it starts at once)."""
        while (removal := self._pending.get(container_id)) is not None:
            if not removal.urgent:
                removal.urgent = True
                self._wake()
            await removal.finished.wait()
        await trio.lowlevel.checkpoint()

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """Around each request the handler serves: removals wait while any is in flight."""
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._quiet_since = trio.current_time()
                self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _yield_to_requests(self, removal: _Removal) -> None:
        with trio.move_on_after(MAX_YIELD_S):
            while not removal.urgent:
                if self._in_flight:
                    await self._changed.wait()
                    continue
                quiet_at = self._quiet_since + QUIET_S
                if trio.current_time() >= quiet_at:
                    return
                with trio.move_on_at(quiet_at):
                    await self._changed.wait()

    async def drain(self) -> None:
        """Shutdown: wait up to ``drain_deadline`` for the pending removals."""
        with trio.move_on_after(self.drain_deadline):
            while self._pending and self.running:
                await next(iter(self._pending.values())).finished.wait()
        if self._pending:
            log.warning(
                "stopping with veth removals pending; the next start-up removes them",
                extra={"pending": len(self._pending), "container_ids": sorted(self._pending)[:16]},
            )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                # A restarted service takes up what its predecessor left.
                for removal in self._pending.values():
                    removal.running = False
                    self._start(removal)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            for removal in self._pending.values():
                removal.running = False

    def _start(self, removal: _Removal) -> None:
        assert self._nursery is not None
        if not removal.running:
            try:
                self._nursery.start_soon(self._remove, removal, name=f"remove-veth-{removal.container_id}")
            except RuntimeError:  # the service is stopping: the next run() takes it up
                return
            removal.running = True

    async def _remove(self, removal: _Removal) -> None:
        cid = removal.container_id
        self.checkpoint.reached("before-veth-removal")
        pause = RETRY_FIRST_S
        while True:
            await self._yield_to_requests(removal)
            try:
                async with self._limiter:
                    # Anycast routes were left before the DEL answered; the
                    # kernel drops the veth's single-path routes with it.
                    await self.dataplane.teardown(cid, routes=False)
                break
            except Fault as exc:
                self.failures += 1
                log.error(
                    "deferred veth removal failed; its addresses stay held, retrying",
                    extra={"container_id": cid, "op": "DEL", "error": str(exc), "retry_in_s": pause},
                )
                await trio.sleep(pause)
                pause = min(pause * 2, RETRY_MAX_S)
        del self._pending[cid]
        removal.running = False
        try:
            removal.done()
        finally:
            removal.finished.set()
        log.debug("veth removed", extra={"container_id": cid, "op": "DEL"})
