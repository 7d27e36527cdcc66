"""The agent's start-up sequence and its following of NodeConfig changes.

DESIGN ("Startup"): store open (DEL and CHECK are served from there) → wait
for this node's NodeConfig → IPAM rebuilt from the stored rows → kernel
objects no committed row explains cleaned → pending deletes replayed → ADD
served.  Pending rows keep their addresses (the runtime retries that ADD,
which must get the same addresses, or sends DEL/GC); their half-made kernel
state is removed here and rebuilt by the retry.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Protocol

import attrs
import trio

from flock import errors, logs
from flock.ipam import AddressConflict, Addresses, Ipam
from flock.model import Allocation, AllocationState, NodeConfig
from flock.rpc import Request

from ._handler import PodHandler
from ._ports import AllocationStore, Dataplane

log = logging.getLogger("flock.pods")

# DESIGN: how long start-up waits for the NodeConfig before it says so loudly
# (it keeps waiting; ADD answers 11 and readiness stays false meanwhile).
NODECONFIG_WAIT_S = 60.0


class NodeConfigs(Protocol):
    @property
    def current(self) -> NodeConfig | None: ...
    async def wait_changed(self, since: NodeConfig | None = None) -> NodeConfig: ...
    def values(self) -> AsyncIterator[NodeConfig]: ...


@attrs.define(eq=False)
class PodService:
    """Supervised service: runs start-up, then applies NodeConfig changes.

    ``started()`` once ADD is served.  Error handling: a pending-delete file
    that cannot be read is logged and removed; one whose DEL fails is logged
    and kept for the next start.  Failures of the store or the kernel during
    start-up propagate to the supervisor, which restarts this service (the
    sequence is idempotent).  A node without a route for the pod gateway
    (``prepare``) is logged and does not stop start-up.
    """

    handler: PodHandler
    store: AllocationStore
    dataplane: Dataplane
    nodeconfigs: NodeConfigs
    node_name: str
    pending_deletes: Path
    prepare: Callable[[], Awaitable[None]] | None = None
    nodeconfig_wait: float = NODECONFIG_WAIT_S
    rng: random.Random = attrs.field(factory=random.SystemRandom)
    _node: NodeConfig | None = attrs.field(init=False, default=None)

    @property
    def node(self) -> NodeConfig | None:
        """The NodeConfig in force (None before start-up found one)."""
        return self._node

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.handler.disable_add(f"waiting for NodeConfig {self.node_name}")
        node = await self._wait_for_node()
        self.handler.disable_add("rebuilding allocations")
        if self.prepare is not None:
            try:
                await self.prepare()
            except errors.CniError as exc:
                log.error("node preparation failed; IPv4 pods may lack their gateway", extra={"error": str(exc)})
        await self._rebuild(node)
        await self.replay_pending_deletes()
        self.handler.enable_add()
        self.handler.on_change()
        log.info("serving ADD", extra={"node": node.name, "cidr6": str(node.cidr6), "cidr4": str(node.cidr4)})
        task_status.started()
        async for new in self.nodeconfigs.values():
            if new != self._node:
                await self._apply(new)

    async def _wait_for_node(self) -> NodeConfig:
        waited = 0.0
        while True:
            with trio.move_on_after(self.nodeconfig_wait):
                node = await self.nodeconfigs.wait_changed()
                self._node = node
                return node
            waited += self.nodeconfig_wait
            reason = f"no valid NodeConfig named {self.node_name} after {waited:g} s"
            self.handler.disable_add(reason)
            log.error(
                reason + "; ADD answers 'try again later' and /readyz fails until one exists",
                extra={"node": self.node_name},
            )

    async def _rebuild(self, node: NodeConfig) -> None:
        await self.handler.quiesce()
        rows = await self.store.list()
        ipam = Ipam(node, rng=self.rng)
        kept: list[Allocation] = []
        # Committed rows first: if two rows claim one address, the pod that
        # is really running keeps it.
        for alloc in sorted(rows, key=lambda a: a.state is not AllocationState.COMMITTED):
            try:
                ipam.mark_in_use(alloc.container_id, Addresses.of(alloc))
                kept.append(alloc)
            except AddressConflict as exc:
                log.error(
                    "stored allocations conflict; this one is left out",
                    extra={"container_id": alloc.container_id, "error": str(exc)},
                )
        self.handler.adopt(ipam, kept)
        # A DEL may have removed rows between the list and adopt: release those.
        still = {a.container_id for a in await self.store.list()}
        self.handler.drop_missing(still)
        committed = [a for a in self.handler.allocations.values() if a.state is AllocationState.COMMITTED]
        report = await self.dataplane.cleanup([a.container_id for a in committed])
        await self.dataplane.ensure_anycast([a for a in committed if a.anycast])
        await self.dataplane.ensure_blackholes((node.cidr6, node.cidr4))
        pending = len(self.handler.allocations) - len(committed)
        log.info(
            "allocations rebuilt",
            extra={
                "committed": len(committed),
                "pending": pending,
                "orphan_interfaces": list(report.interfaces),
                "orphan_routes": list(report.routes),
            },
        )

    async def replay_pending_deletes(self) -> int:
        """Apply the DELs the shim recorded while no agent answered; how many were applied."""
        applied = 0
        try:
            paths = sorted(self.pending_deletes.glob("*.json"))
        except OSError as exc:
            log.error(
                "cannot read the pending-deletes queue",
                extra={"directory": str(self.pending_deletes), "error": str(exc)},
            )
            return 0
        for path in paths:
            try:
                request = Request.decode(path.read_bytes())
                if request.op != "DEL":
                    raise errors.CniError(errors.INVALID_ENV, "not a DEL", f"op={request.op!r}")
            except (errors.CniError, OSError) as exc:
                log.error("dropping an unreadable pending delete", extra={"file": str(path), "error": str(exc)})
                path.unlink(missing_ok=True)
                continue
            with logs.bound(container_id=request.container_id, pod=request.pod, op="DEL"):
                try:
                    await self.handler.delete(request)
                except errors.CniError as exc:
                    log.error(
                        "pending delete failed; kept for the next start", extra={"file": str(path), "error": str(exc)}
                    )
                    continue
                path.unlink(missing_ok=True)
                applied += 1
                log.info("applied a pending delete")
        return applied

    async def _apply(self, node: NodeConfig) -> None:
        """A NodeConfig change at run time: existing pods keep their addresses."""
        old, self._node = self._node, node
        assert self.handler.ipam is not None
        self.handler.ipam.set_node(node)
        await self.dataplane.ensure_blackholes((node.cidr6, node.cidr4))
        self.handler.on_change()
        log.info(
            "NodeConfig changed",
            extra={
                "cidr6": str(node.cidr6),
                "cidr4": str(node.cidr4),
                "was": {"cidr6": str(old.cidr6), "cidr4": str(old.cidr4)} if old else None,
            },
        )
