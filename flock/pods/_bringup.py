"""The node bring-up: the agent's start-up sequence, then its following of NodeConfig changes.

DESIGN ("Startup"): store open (DEL and CHECK are served from there) → wait
for this node's NodeConfig → IPAM rebuilt from the stored rows → kernel
objects no committed row explains cleaned → pending deletes replayed → ADD
served.  Pending rows keep their addresses (the runtime retries that ADD,
which must get the same addresses, or sends DEL/GC); their half-made kernel
state is removed here and rebuilt by the retry.

What needs only the store runs while the NodeConfig is awaited (the API
link lists meanwhile, so a restart pays for the longer of the two, not their
sum): the node's preparation, the kernel cleanup (what no committed row
explains goes; a row, even one the IPAM rebuild later leaves out as a
conflict, keeps its veth) and the anycast routes' repair.  ADD still
waits for all of it and for the IPAM.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import trio

from flock import errors, logs
from flock.faults import Fault, NodeUnprepared
from flock.model import AllocationState, NodeConfig, UplinkMtu
from flock.rpc import Request
from flock.state import NodeState, PodMtu, pod_mtu

from ._errors import InvalidCniArgs
from ._handler import ADD_GATE, PodHandler
from ._protocols import Dataplane

log = logging.getLogger("flock.pods")

# DESIGN: how long start-up waits for the NodeConfig before it says so loudly
# (it keeps waiting; ADD answers 11 and readiness stays false meanwhile).
NODECONFIG_WAIT_S = 60.0
# While running, the queue is looked at this often (one listdir); after a
# replay that failed, the wait doubles up to PENDING_DELETES_MAX_S.
PENDING_DELETES_POLL_S = 2.0
PENDING_DELETES_MAX_S = 60.0
# How often the node's own addresses (which no pod may claim) are read again.
NODE_ADDRESSES_REFRESH_S = 30.0
# How often the default route's interface MTU is read again (new pods get a
# change within this; one filtered route dump per family, read undecoded).
UPLINK_MTU_REFRESH_S = 10.0
# A record is one small request line; anything bigger is not flock's.
_MAX_RECORD_BYTES = 64 * 1024


@attrs.define(eq=False)
class NodeBringUp:
    """Supervised service: runs start-up, then applies NodeConfig changes.

    Reads the NodeConfig from ``state`` (the NodeConfig watcher publishes it
    there) and opens :data:`ADD_GATE` once ADD can be served; ``started()``
    comes first, as soon as the gate is closed (ADD's readiness is the
    gate, and the API link is to list while start-up works).  While running
    it closes that gate again while the NodeConfig is deleted (existing pods
    keep working), replays DELs the shim journals, and re-reads the node's
    own addresses (no pod may claim one) and the MTU of the interface holding
    the default route (the MTU new pods get without ``spec.mtu``; read before
    ADD is served, then every :data:`UPLINK_MTU_REFRESH_S`).  Error handling: a pending-delete
    file that cannot be read is logged and removed; one whose DEL fails is
    logged and kept for a retry (the poll backs off while it keeps failing).
    Failures of the store or the kernel during start-up propagate to the
    supervisor, which restarts this service (the sequence is idempotent).  A
    node without a route for the pod gateway (``prepare``) is logged and does
    not stop start-up; nor does an MTU read that fails (logged; the last
    reading, or 1500, stays in force).
    """

    handler: PodHandler
    dataplane: Dataplane
    state: NodeState
    pending_deletes: Path
    prepare: Callable[[], Awaitable[None]] | None = None
    # Reads what the uplink carries (None: never read; new pods get 1500 or spec.mtu).
    uplink_mtu: Callable[[], Awaitable[UplinkMtu]] | None = None
    nodeconfig_wait: float = NODECONFIG_WAIT_S

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        add = ADD_GATE.name
        self.state.close_gate(add, f"waiting for NodeConfig {self.state.node_name}")
        try:
            # Serving from here: DEL and CHECK need nothing more, and ADD's readiness
            # is ADD_GATE (the supervisor may start the API link now, to list
            # while the kernel is restored).
            task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._restore_kernel)
                node = await self._wait_for_node()
                self.state.close_gate(add, "rebuilding allocations")
            await self._rebuild(node)
            await self._refresh_node_addresses()
            await self.refresh_uplink_mtu()
            await self.replay_pending_deletes()
            self.state.open_gate(add)
            mtu = self.state.pod_mtu
            log.info(
                "serving ADD",
                extra={
                    "node": node.name,
                    "cidr6": str(node.cidr6),
                    "cidr4": str(node.cidr4),
                    "mtu": mtu.value,
                    "mtu_source": mtu.source,
                },
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.drain_pending_deletes)
                nursery.start_soon(self._follow_node_addresses)
                if self.uplink_mtu is not None:
                    nursery.start_soon(self._follow_uplink_mtu)
                await self._follow(node)
        finally:
            self.state.close_gate(add, "the node's services are restarting")

    async def _wait_for_node(self) -> NodeConfig:
        waited = 0.0
        while True:
            with trio.move_on_after(self.nodeconfig_wait):
                seen = self.state.version
                while (node := self.state.nodeconfig) is None:
                    seen = await self.state.wait_changed(seen)
                return node
            waited += self.nodeconfig_wait
            reason = f"no valid NodeConfig named {self.state.node_name} after {waited:g} s"
            self.state.close_gate(ADD_GATE.name, reason)
            log.error(
                reason + "; ADD answers 'try again later' and /readyz fails until one exists",
                extra={"node": self.state.node_name},
            )

    async def _restore_kernel(self) -> None:
        """What start-up does with the store alone: the node prepared, kernel
        objects no committed row explains removed, anycast routes repaired."""
        if self.prepare is not None:
            try:
                await self.prepare()
            except NodeUnprepared as exc:
                log.error("node preparation failed; IPv4 pods may lack their gateway", extra={"error": str(exc)})
        committed = [a for a in await self.handler.store.list() if a.state is AllocationState.COMMITTED]
        report = await self.dataplane.cleanup([a.container_id for a in committed])
        await self.dataplane.ensure_anycast([a for a in committed if a.anycast])
        log.info(
            "kernel restored",
            extra={
                "committed": len(committed),
                "orphan_interfaces": list(report.interfaces),
                "orphan_routes": list(report.routes),
            },
        )

    async def _rebuild(self, node: NodeConfig) -> None:
        kept = await self.handler.rebuild(node)
        await self.dataplane.ensure_blackholes((node.cidr6, node.cidr4))
        committed = sum(a.state is AllocationState.COMMITTED for a in kept)
        log.info("allocations rebuilt", extra={"committed": committed, "pending": len(kept) - committed})

    async def _refresh_node_addresses(self) -> None:
        try:
            addresses = await self.dataplane.node_addresses()
        except Fault as exc:
            log.error("cannot read the node's addresses; keeping the last ones", extra={"error": str(exc)})
            return
        if self.handler.ipam is not None:
            self.handler.ipam.set_node_addresses(addresses)

    async def _follow_node_addresses(self) -> None:
        while True:
            await trio.sleep(NODE_ADDRESSES_REFRESH_S)
            await self._refresh_node_addresses()

    async def refresh_uplink_mtu(self) -> None:
        """Read the default route's interface MTU into the node state (what
        new pods get without ``spec.mtu``); a change is logged, existing pods
        keep theirs.  A failed read is logged and the last reading stays."""
        if self.uplink_mtu is None:
            return
        try:
            uplink = await self.uplink_mtu()
        except Fault as exc:
            log.error("cannot read the default route's MTU; keeping the last one", extra={"error": str(exc)})
            return
        first, before = self.state.uplink_mtu is None, self.state.pod_mtu
        self.state.uplink_mtu_observed(uplink)
        if not first:  # the first reading is logged with "serving ADD"
            _log_mtu_change(before, self.state.pod_mtu)

    async def _follow_uplink_mtu(self) -> None:
        while True:
            await trio.sleep(UPLINK_MTU_REFRESH_S)
            await self.refresh_uplink_mtu()

    async def drain_pending_deletes(self) -> None:
        """Replay DELs the shim journals while this agent runs (a shim that
        timed out on a busy agent), not only those found at start."""
        wait = PENDING_DELETES_POLL_S
        while True:
            await trio.sleep(wait)
            outcome = await self.replay_pending_deletes()
            wait = PENDING_DELETES_POLL_S if outcome >= 0 else min(wait * 2, PENDING_DELETES_MAX_S)

    async def replay_pending_deletes(self) -> int:
        """Apply the DELs the shim recorded while no agent answered; how many
        were applied, or -1 when one of them failed (it stays queued)."""
        applied = 0
        failed = False
        try:
            self._tighten_queue()
            paths = sorted(self.pending_deletes.glob("*.json"))
        except OSError as exc:
            log.error(
                "cannot read the pending-deletes queue",
                extra={"directory": str(self.pending_deletes), "error": str(exc)},
            )
            return 0
        for path in paths:
            try:
                with path.open("rb") as f:
                    raw = f.read(_MAX_RECORD_BYTES + 1)
                if len(raw) > _MAX_RECORD_BYTES:
                    raise InvalidCniArgs("record too large", f"over {_MAX_RECORD_BYTES} bytes")
                request = Request.decode(raw)
                if request.op != "DEL":
                    raise InvalidCniArgs("not a DEL", f"op={request.op!r}")
            except (errors.CniError, InvalidCniArgs, OSError) as exc:
                log.error("dropping an unreadable pending delete", extra={"file": str(path), "error": str(exc)})
                path.unlink(missing_ok=True)
                continue
            with logs.bound(container_id=request.container_id, pod=request.pod, op="DEL"):
                try:
                    await self.handler.delete(request)
                except (errors.CniError, Fault) as exc:
                    log.error("pending delete failed; kept for a retry", extra={"file": str(path), "error": str(exc)})
                    failed = True
                    continue
                path.unlink(missing_ok=True)
                applied += 1
                log.info("applied a pending delete")
        return -1 if failed else applied

    def _tighten_queue(self) -> None:
        """Keep flock's own queue directory 0700 (the shim creates it on first use)."""
        try:
            mode = self.pending_deletes.stat().st_mode
        except FileNotFoundError:
            return
        if mode & 0o077:
            self.pending_deletes.chmod(0o700)

    async def _follow(self, applied: NodeConfig) -> None:
        """NodeConfig changes at run time: existing pods keep their addresses.
        A deleted NodeConfig closes ADD's gate (11, and /readyz fails) until it is back."""
        seen = -1
        while True:
            seen = await self.state.wait_changed(seen)
            if self.state.nodeconfig_deleted:
                self.state.close_gate(
                    ADD_GATE.name, f"NodeConfig {self.state.node_name} was deleted; waiting for it to be recreated"
                )
            else:
                self.state.open_gate(ADD_GATE.name)
            node = self.state.nodeconfig
            if node is None or node == applied:
                continue
            if node.mtu != applied.mtu:
                _log_mtu_change(pod_mtu(applied, self.state.uplink_mtu), self.state.pod_mtu)
            self.handler.apply_nodeconfig(node)
            await self.dataplane.ensure_blackholes((node.cidr6, node.cidr4))
            log.info(
                "NodeConfig changed",
                extra={
                    "cidr6": str(node.cidr6),
                    "cidr4": str(node.cidr4),
                    "was": {"cidr6": str(applied.cidr6), "cidr4": str(applied.cidr4)},
                },
            )
            applied = node


def _log_mtu_change(before: PodMtu, now: PodMtu) -> None:
    if now.value != before.value:
        log.info(
            "pod MTU changed: new pods get it, existing pods keep theirs until they are recreated",
            extra={"mtu": now.value, "source": now.source, "was": before.value},
        )
