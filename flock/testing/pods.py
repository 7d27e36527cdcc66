"""In-memory stand-ins for the pod handler's store and kernel, for virtual-time tests.

They keep the real ones' contracts (the SQLite store's commit of a missing
row fails; the kernel's setup/teardown are idempotent) without threads, so
``autojump_clock`` times stay exact.  The kernel-facing behaviour itself is
tested against real namespaces in test_pods_integration.py.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Iterable
from typing import Any

import attrs
import trio

from flock.faults import KernelRefused
from flock.model import Allocation, AllocationState, NodeConfig
from flock.netlink import GATEWAY4, GATEWAY6, AppliedPlan, CleanupReport, fnv1a_32, host_ifname, pod_plan
from flock.pods import ADD_GATE, PodHandler, PodLookup
from flock.rpc import Request
from flock.state import NodeState
from flock.store import AllocationNotFound


@attrs.define(eq=False)
class MemoryAllocations:
    rows: dict[str, Allocation] = attrs.field(factory=dict)
    # The container IDs get() was asked for, in order (what reads the store).
    gets: list[str] = attrs.field(factory=list)

    async def get(self, container_id: str) -> Allocation | None:
        await trio.lowlevel.checkpoint()
        self.gets.append(container_id)
        return self.rows.get(container_id)

    async def put(self, allocation: Allocation) -> None:
        await trio.lowlevel.checkpoint()
        self.rows[allocation.container_id] = allocation

    async def commit(self, container_id: str, *, now: float | None = None) -> Allocation:
        await trio.lowlevel.checkpoint()
        if container_id not in self.rows:
            raise AllocationNotFound(":memory:", "no allocation to commit", container_id)
        row = self.rows[container_id] = attrs.evolve(
            self.rows[container_id], state=AllocationState.COMMITTED, updated=now or 0.0
        )
        return row

    async def delete(self, container_id: str) -> bool:
        await trio.lowlevel.checkpoint()
        return self.rows.pop(container_id, None) is not None

    async def list(self, state: AllocationState | None = None) -> list[Allocation]:
        await trio.lowlevel.checkpoint()
        return [a for a in self.rows.values() if state is None or a.state is state]


def fake_macs(container_id: str) -> tuple[str, str]:
    """MemoryKernel's stand-ins for the kernel's random veth MACs (host, pod)."""
    h = fnv1a_32(container_id)
    host, pod = (":".join(["0a", "58", *(f"{b >> s & 255:02x}" for s in (24, 16, 8, 0))]) for b in (h, h ^ 1))
    return host, pod


@attrs.define(eq=False)
class MemoryKernel:
    """Which pods have a veth; ``gate`` (when set) holds every setup until it is set."""

    veths: dict[str, Allocation] = attrs.field(factory=dict)
    gate: trio.Event | None = None
    fail_with: Exception | None = None
    teardown_fails: set[str] = attrs.field(factory=set)
    # When set, every teardown waits for it (a veth removal "in the kernel").
    teardown_gate: trio.Event | None = None
    teardowns: list[tuple[str, bool]] = attrs.field(factory=list)  # (container ID, routes)
    left_routes: list[str] = attrs.field(factory=list)
    setups: int = 0
    in_setup: int = 0
    most_in_setup: int = 0
    blackholes: tuple = ()
    own_addresses: frozenset = frozenset()  # what node_addresses() reports
    gateway6: ipaddress.IPv6Address = GATEWAY6
    gateway4: ipaddress.IPv4Address = GATEWAY4

    def host_ifname(self, container_id: str) -> str:
        return host_ifname(container_id)

    async def setup(self, alloc: Allocation, netns_fd: int | None = None, *, mtu: int | None = None) -> AppliedPlan:
        self.setups += 1
        self.in_setup += 1
        self.most_in_setup = max(self.most_in_setup, self.in_setup)
        try:
            if self.gate is not None:
                await self.gate.wait()
            await trio.lowlevel.checkpoint()
            self.veths[alloc.container_id] = alloc
            if self.fail_with is not None:
                raise self.fail_with
        finally:
            self.in_setup -= 1
        return AppliedPlan(pod_plan(alloc), *fake_macs(alloc.container_id))

    async def macs(self, alloc: Allocation, netns_fd: int | None = None) -> tuple[str, str]:
        await trio.lowlevel.checkpoint()
        return fake_macs(alloc.container_id) if alloc.container_id in self.veths else ("", "")

    async def node_addresses(self) -> frozenset:
        await trio.lowlevel.checkpoint()
        return self.own_addresses

    async def teardown(
        self, container_id: str, netns: str | None = None, if_name: str | None = None, *, routes: bool = True
    ) -> None:
        self.teardowns.append((container_id, routes))
        if self.teardown_gate is not None:
            await self.teardown_gate.wait()
        await trio.lowlevel.checkpoint()
        if container_id in self.teardown_fails:
            raise KernelRefused("netlink teardown failed", f"container {container_id}: injected")
        self.veths.pop(container_id, None)

    async def leave_routes(self, container_id: str) -> None:
        await trio.lowlevel.checkpoint()
        self.left_routes.append(container_id)

    async def check(self, alloc: Allocation, netns_fd: int | None = None) -> list[str]:
        await trio.lowlevel.checkpoint()
        return (
            [] if alloc.container_id in self.veths else [f"host {host_ifname(alloc.container_id)}: interface missing"]
        )

    async def cleanup(self, explained_container_ids: Iterable[str]) -> CleanupReport:
        await trio.lowlevel.checkpoint()
        keep = set(explained_container_ids)
        gone = sorted(c for c in self.veths if c not in keep)
        for cid in gone:
            del self.veths[cid]
        return CleanupReport(tuple(host_ifname(c) for c in gone))

    async def ensure_anycast(self, allocations: Iterable[Allocation]) -> list[str]:
        await trio.lowlevel.checkpoint()
        return []

    async def ensure_blackholes(self, cidrs: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network | None]) -> None:
        await trio.lowlevel.checkpoint()
        self.blackholes = tuple(c for c in cidrs if c is not None)


CONFIG = {"cniVersion": "1.1.0", "name": "flock-net", "type": "flock"}


def request(op: str, cid: str = "c0ffee01", pod: str = "web-0", namespace: str = "default", **config: Any) -> Request:
    return Request(
        op,
        container_id=cid,
        netns=f"/run/netns/{cid}",
        if_name="eth0",
        args=f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={cid}",
        config={**CONFIG, **config},
    )


async def serving_handler(
    pods: PodLookup,
    node: NodeConfig,
    *,
    rows: MemoryAllocations | None = None,
    kernel: MemoryKernel | None = None,
    seed: int = 1,
    ready: bool = True,
    **kwargs: Any,
) -> PodHandler:
    """A pod handler over in-memory rows and kernel, rebuilt for *node* (its
    ``state`` declares only ADD's gate, opened when *ready*)."""
    state = NodeState(node.name, [ADD_GATE])
    handler = PodHandler(
        store=MemoryAllocations() if rows is None else rows,
        dataplane=MemoryKernel() if kernel is None else kernel,
        pods=pods,
        state=state,
        rng=random.Random(seed),
        **kwargs,
    )
    await handler.rebuild(node)
    if ready:
        state.open_gate(ADD_GATE.name)
    return handler
