"""NodeState: one way to change each part, one change signal, readiness gates and notes."""

from __future__ import annotations

import ipaddress

import pytest
import trio

from flock.apiserver import nodeconfig_object
from flock.model import Allocation, AllocationState, NodeConfig
from flock.state import NODECONFIG_GATE, Gate, NodeState, gated

NODE = "host001"
ip = ipaddress.ip_address


def nodeconfig(cidr6: str = "2001:db8:0:1::/64") -> NodeConfig:
    return NodeConfig.from_object(nodeconfig_object(NODE, cidr6))


def alloc(cid: str, state: AllocationState = AllocationState.COMMITTED) -> Allocation:
    return Allocation(cid, "default", cid, "", "eth0", f"/run/netns/{cid}", ip("2001:db8:0:1::5"), state=state)


def new_state() -> NodeState:
    return NodeState(
        NODE,
        [
            Gate("api", "not connected"),
            Gate(NODECONFIG_GATE, f"NodeConfig {NODE} not loaded"),
            Gate("add", "x", "ADD: "),
        ],
    )


def test_gates_list_their_reasons_in_declaration_order_and_only_declared_ones_change():
    state = new_state()
    assert state.not_ready() == ["not connected", "NodeConfig host001 not loaded", "ADD: x"] and not state.ready
    state.open_gate("api")
    state.close_gate("add", "rebuilding allocations")
    assert state.not_ready() == ["NodeConfig host001 not loaded", "ADD: rebuilding allocations"]
    assert state.reason("add") == "rebuilding allocations" and state.reason("api") == ""
    with pytest.raises(KeyError):
        state.open_gate("typo")
    with pytest.raises(ValueError):
        NodeState(NODE, [Gate("a", "x"), Gate("a", "y")])


def test_the_nodeconfig_gate_and_notes_follow_what_the_watcher_sees():
    state = new_state()
    state.nodeconfig_observed(None, deleted=False, refused="spec.cidr6='x': expected a CIDR")
    assert state.nodeconfig is None
    assert "NodeConfig host001 not loaded (spec.cidr6='x': expected a CIDR)" in state.not_ready()
    assert state.notes() == []  # nothing in force that the note could be about
    first = nodeconfig()
    state.nodeconfig_observed(first, deleted=False, refused=None)
    assert state.nodeconfig == first and state.reason(NODECONFIG_GATE) == "" and state.notes() == []
    state.nodeconfig_observed(first, deleted=False, refused="bad asn")
    assert state.notes() == ["NodeConfig host001 update refused (bad asn); serving with the previous one"]
    # A fresh watcher (new API connection) whose first object is invalid keeps the one in force.
    state.nodeconfig_observed(None, deleted=True, refused="bad asn")
    assert state.nodeconfig == first and state.nodeconfig_deleted
    assert state.notes()[0].startswith(
        "NodeConfig host001 was deleted; existing pods keep the last one seen (cidr6 2001"
    )
    state.nodeconfig_observed(first, deleted=False, refused=None)
    assert state.notes() == [] and state.nodeconfig_refused is None and not state.nodeconfig_deleted


def test_allocation_view_and_counts():
    state = new_state()
    assert not state.allocations_loaded
    state.load_allocations([alloc("a"), alloc("b", AllocationState.PENDING)])
    state.put_allocation(alloc("c"))
    state.drop_allocation("a")
    state.drop_allocation("unknown")
    assert set(state.allocations) == {"b", "c"} and state.allocations_loaded
    assert state.allocation_counts() == {AllocationState.PENDING: 1, AllocationState.COMMITTED: 1}


async def test_every_change_bumps_the_version_and_wakes_observers_once_per_change(autojump_clock):
    state = new_state()
    seen_versions = []

    async def observe():
        version = state.version
        while True:
            version = await state.wait_changed(version)
            seen_versions.append((version, trio.current_time()))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(observe)
            await trio.sleep(1)
            state.put_allocation(alloc("a"))
            await trio.sleep(1)
            state.put_allocation(alloc("a"))  # the same value: no change
            state.set_note("bird", None)  # no such note: no change
            state.set_exhausted(())  # already none: no change
            await trio.sleep(1)
            state.set_note("bird", "BIRD not configured yet")
            state.set_exhausted([ipaddress.ip_network("198.51.100.0/29")])  # two changes at once: one wake-up
            await trio.sleep(1)
            nursery.cancel_scope.cancel()
    assert seen_versions == [(1, 1.0), (3, 3.0)]
    assert state.exhausted == (ipaddress.ip_network("198.51.100.0/29"),)
    assert await state.wait_changed(0) == 3  # level-triggered: at once for an old version


async def test_gated_opens_while_the_service_serves_and_closes_when_it_stops(autojump_clock):
    gate = Gate("pod-informer", "pod informer not synced")
    state = NodeState(NODE, [gate])

    async def informer(*, task_status=trio.TASK_STATUS_IGNORED):
        await trio.sleep(2)
        task_status.started()
        await trio.sleep_forever()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(gated(state, gate, informer))
            await trio.sleep(1)
            assert state.not_ready() == ["pod informer not synced"]
            await trio.sleep(2)
            assert state.ready
            nursery.cancel_scope.cancel()
    assert state.not_ready() == ["pod informer not synced"]


async def test_gated_closes_the_gate_again_on_a_crash(autojump_clock):
    state = NodeState(NODE, [Gate("svc", "svc not running")])

    async def service(*, task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        await trio.sleep(1)
        raise OSError("boom")

    with pytest.RaisesGroup(OSError):
        async with trio.open_nursery() as nursery:
            await nursery.start(gated(state, Gate("svc", "svc not running"), service))
            assert state.ready
    assert state.not_ready() == ["svc not running"]
