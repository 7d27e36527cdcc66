"""The MTU new pods get: NodeConfig spec.mtu, else the uplink's as the node
bring-up reads it (at start, then every UPLINK_MTU_REFRESH_S), handed to the
dataplane by ADD; existing pods keep theirs."""

from __future__ import annotations

import logging

import attrs
import trio

from flock.apiserver import nodeconfig_object
from flock.faults import KernelRefused
from flock.model import MTU_DEFAULT, Allocation, NodeConfig, UplinkMtu
from flock.pods import ADD_GATE, NodeBringUp
from flock.pods._bringup import UPLINK_MTU_REFRESH_S
from flock.rpc import Request
from flock.state import NodeState, PodMtu, pod_mtu
from flock.testing.pods import CONFIG, MemoryKernel, serving_handler

NODE = "host001"


def node(**spec) -> NodeConfig:
    return NodeConfig.from_object(nodeconfig_object(NODE, "2001:db8:0:1::/64", **spec))


def add(cid: str) -> Request:
    # A container without a pod: NodeConfig defaults, no pod lookup.
    return Request("ADD", container_id=cid, netns=f"/run/netns/{cid}", if_name="eth0", args="", config=CONFIG)


@attrs.define(eq=False)
class MtuKernel(MemoryKernel):
    """Records the MTU each setup was asked for."""

    mtus: dict[str, int | None] = attrs.field(factory=dict)

    async def setup(self, alloc: Allocation, netns_fd: int | None = None, *, mtu: int | None = None):
        self.mtus[alloc.container_id] = mtu
        return await super().setup(alloc, netns_fd, mtu=mtu)


class NoPods:
    async def lookup(self, namespace: str, name: str) -> None:
        raise AssertionError("no pod lookup expected")

    async def fetch_pod(self, namespace: str, name: str) -> None:
        raise AssertionError("no pod lookup expected")


def test_pod_mtu_nodeconfig_beats_detection_and_detection_stays_in_bounds():
    eth0 = UplinkMtu(9000, "eth0", 6)
    assert pod_mtu(node(), eth0) == PodMtu(9000, "detected from eth0's IPv6 default route")
    assert pod_mtu(node(mtu=1400), eth0) == PodMtu(1400, "nodeconfig")
    assert pod_mtu(None, None) == PodMtu(MTU_DEFAULT, "default (the uplink has not been read)")
    assert pod_mtu(node(), UplinkMtu()) == PodMtu(1500, "default (the node has no default route)")
    assert pod_mtu(node(), UplinkMtu(65536, "lo", 4)) == PodMtu(
        9216, "detected from lo's IPv4 default route (65536, kept within 1280..9216)"
    )
    assert pod_mtu(node(), UplinkMtu(1200, "tun0", 6)).value == 1280


def test_node_state_tells_observers_of_an_uplink_change():
    state = NodeState(NODE)
    assert state.pod_mtu.value == MTU_DEFAULT and state.uplink_mtu is None
    seen = state.version
    state.uplink_mtu_observed(UplinkMtu(9000, "eth0", 6))
    assert state.version > seen and state.pod_mtu == PodMtu(9000, "detected from eth0's IPv6 default route")
    seen = state.version
    state.uplink_mtu_observed(UplinkMtu(9000, "eth0", 6))
    assert state.version == seen  # the same reading changes nothing


async def test_add_sets_up_the_veth_with_the_mtu_in_force_and_existing_pods_keep_theirs():
    kernel = MtuKernel()
    with trio.fail_after(10):
        handler = await serving_handler(NoPods(), node(), kernel=kernel)
        state = handler.state
        state.nodeconfig_observed(node(), deleted=False, refused=None)
        state.uplink_mtu_observed(UplinkMtu(9000, "eth0", 6))
        await handler(add("c1"))
        assert kernel.mtus == {"c1": 9000}

        # NodeConfig spec.mtu wins over detection, for new pods.
        state.nodeconfig_observed(node(mtu=1400), deleted=False, refused=None)
        await handler(add("c2"))
        assert kernel.mtus == {"c1": 9000, "c2": 1400}
        # A repeated ADD of an existing pod does not touch its veth.
        await handler(add("c1"))
        assert kernel.mtus["c1"] == 9000 and kernel.setups == 2


@attrs.define(eq=False)
class Uplink:
    """A scripted reader of the default route's MTU."""

    reading: UplinkMtu | Exception
    reads: list[float] = attrs.field(factory=list)

    async def __call__(self) -> UplinkMtu:
        await trio.lowlevel.checkpoint()
        self.reads.append(trio.current_time())
        if isinstance(self.reading, Exception):
            raise self.reading
        return self.reading


async def test_bringup_reads_the_uplink_before_serving_add_then_follows_it(autojump_clock, tmp_path, caplog):
    caplog.set_level(logging.INFO, "flock.pods")
    uplink = Uplink(UplinkMtu(9000, "eth0", 6))
    kernel = MtuKernel()
    handler = await serving_handler(NoPods(), node(), kernel=kernel, ready=False)
    state = handler.state
    service = NodeBringUp(
        handler=handler, dataplane=kernel, state=state, pending_deletes=tmp_path / "pd", uplink_mtu=uplink
    )
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            state.nodeconfig_observed(node(), deleted=False, refused=None)
            seen = -1
            while state.reason(ADD_GATE.name):
                seen = await state.wait_changed(seen)
            # Read before ADD was served, at t = 0.
            assert uplink.reads == [0.0] and state.pod_mtu.value == 9000
            assert not any("pod MTU changed" in r.getMessage() for r in caplog.records)
            await handler(add("c1"))

            # The uplink changes: read again UPLINK_MTU_REFRESH_S later; new pods get it.
            uplink.reading = UplinkMtu(1450, "eth0", 6)
            await trio.sleep(UPLINK_MTU_REFRESH_S + 1)
            assert uplink.reads == [0.0, UPLINK_MTU_REFRESH_S] and state.pod_mtu.value == 1450
            assert any("pod MTU changed" in r.getMessage() and r.mtu == 1450 and r.was == 9000 for r in caplog.records)
            await handler(add("c2"))
            assert kernel.mtus == {"c1": 9000, "c2": 1450}

            # A failed read is logged; the last reading stays in force.
            uplink.reading = KernelRefused("netlink default route read failed", "injected")
            await trio.sleep(UPLINK_MTU_REFRESH_S)
            assert len(uplink.reads) == 3 and state.pod_mtu.value == 1450
            assert any("cannot read the default route's MTU" in r.getMessage() for r in caplog.records)

            # A direct re-read (what the timer does) picks up a change at once.
            uplink.reading = UplinkMtu(9000, "bond0", 4)
            await service.refresh_uplink_mtu()
            assert state.pod_mtu == PodMtu(9000, "detected from bond0's IPv4 default route")
            nursery.cancel_scope.cancel()


def test_wireguard_takes_its_overhead_never_below_1280() -> None:
    ipv6_fabric, ipv4_fabric = 80, 60
    uplink = UplinkMtu(9000, "eth0", 6)
    assert pod_mtu(None, uplink, ipv6_fabric) == PodMtu(
        8920, "detected from eth0's IPv6 default route, less 80 for WireGuard"
    )
    assert pod_mtu(node(mtu=1500), uplink, ipv4_fabric).value == 1440
    assert pod_mtu(node(mtu=1360), None, ipv6_fabric) == PodMtu(1280, "nodeconfig, less 80 for WireGuard")
    refused = pod_mtu(node(mtu=1300), None, ipv6_fabric)
    assert refused.value == 1280 and refused.refused is not None
    assert "1300 less WireGuard's 80 bytes is 1220, below IPv6's minimum 1280" in refused.refused
    assert "at least 1360" in refused.refused
    assert pod_mtu(node(mtu=1300), None).refused is None  # without a tunnel nothing is taken


def test_the_node_state_takes_the_tunnel_s_share() -> None:
    state = NodeState(NODE, tunnel_overhead=80)
    state.nodeconfig_observed(node(mtu=1500), deleted=False, refused=None)
    assert state.pod_mtu.value == 1420
    state.uplink_mtu_observed(UplinkMtu(9000, "eth0", 6))  # spec.mtu wins, the tunnel's share still taken
    assert state.pod_mtu.value == 1420
