"""The agent's start-up sequence in virtual time: NodeConfig wait, rebuild,
cleanup of what no committed row explains, pending-delete replay, run-time
NodeConfig changes."""

from __future__ import annotations

import ipaddress
import logging
import random

import trio

from flock import errors
from flock.apiserver import NODECONFIGS, PODS, ObjectStore, nodeconfig_object, pod_object
from flock.model import Allocation, AllocationState, NodeConfig
from flock.pods import ADD_GATE, NodeBringUp, PodHandler
from flock.state import NODECONFIG_GATE, Gate, NodeState
from flock.testing import StoreSource
from flock.testing.pods import MemoryAllocations, MemoryKernel, request
from flock.watchers import NodeConfigWatcher, PodWatcher

NODE = "host001"
ip = ipaddress.ip_address


def row(cid: str, state: AllocationState, ip6: str, ip4: str | None = None) -> Allocation:
    return Allocation(
        cid, "default", cid, "", "eth0", f"/run/netns/{cid}", ip(ip6), ip(ip4) if ip4 else None, state=state
    )


def setup(api: ObjectStore, rows: MemoryAllocations, kernel: MemoryKernel, tmp_path):
    state = NodeState(NODE, [Gate(NODECONFIG_GATE, f"NodeConfig {NODE} not loaded"), ADD_GATE])
    nodeconfigs = NodeConfigWatcher(StoreSource(api, NODECONFIGS, f"metadata.name={NODE}"), NODE, sink=state)
    pods = PodWatcher(StoreSource(api, PODS, f"spec.nodeName={NODE}"), NODE)
    handler = PodHandler(store=rows, dataplane=kernel, pods=pods, state=state, rng=random.Random(7))
    service = NodeBringUp(handler=handler, dataplane=kernel, state=state, pending_deletes=tmp_path / "pending-deletes")
    return nodeconfigs, pods, handler, service


async def serving(nursery: trio.Nursery, service: NodeBringUp) -> None:
    """Start the bring-up (it reports started before start-up's work) and wait until ADD is served."""
    await nursery.start(service.run)
    seen = -1
    while service.state.reason(ADD_GATE.name):
        seen = await service.state.wait_changed(seen)


async def test_add_is_11_until_the_nodeconfig_arrives_and_a_late_one_is_logged_loudly(autojump_clock, tmp_path, caplog):
    api, rows, kernel = ObjectStore(), MemoryAllocations(), MemoryKernel()
    api.create(PODS, pod_object("default", "web-0", NODE))
    nodeconfigs, pods, handler, service = setup(api, rows, kernel, tmp_path)
    with trio.fail_after(200):
        async with trio.open_nursery() as nursery:
            await nursery.start(nodeconfigs.run)
            await nursery.start(pods.run)
            nursery.start_soon(service.run)
            await trio.sleep(59)
            for op, code in (("ADD", errors.TRY_AGAIN_LATER), ("STATUS", errors.NOT_AVAILABLE)):
                try:
                    await handler(request(op))
                except errors.CniError as err:
                    assert err.code == code and "waiting for NodeConfig host001" in err.details
                else:
                    raise AssertionError(f"{op} succeeded before the NodeConfig")
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
            await trio.sleep(2)
            loud = [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert len(loud) == 1 and "no valid NodeConfig named host001 after 60 s" in loud[0].getMessage()
            api.create(NODECONFIGS, nodeconfig_object(NODE, "2001:db8:0:1::/64"))
            await trio.sleep(0.5)
            assert handler.state.ready and trio.current_time() == 61.5
            assert kernel.blackholes == (ipaddress.ip_network("2001:db8:0:1::/64"),)
            result = await handler(request("ADD"))
            assert ipaddress.ip_interface(result["ips"][0]["address"]).ip in ipaddress.ip_network("2001:db8:0:1::/64")
            nursery.cancel_scope.cancel()


async def test_rebuild_keeps_committed_and_pending_addresses_and_cleans_the_kernel(autojump_clock, tmp_path):
    api, rows, kernel = ObjectStore(), MemoryAllocations(), MemoryKernel()
    api.create(NODECONFIGS, nodeconfig_object(NODE, "2001:db8:0:1::/64", cidr4="198.51.100.0/29"))
    done = row("c0ffee01", AllocationState.COMMITTED, "2001:db8:0:1::1", "198.51.100.2")
    half = row("c0ffee02", AllocationState.PENDING, "2001:db8:0:1::2", "198.51.100.3")
    for a in (done, half):
        rows.rows[a.container_id] = a
        kernel.veths[a.container_id] = a
    kernel.veths["deadbeef"] = row("deadbeef", AllocationState.COMMITTED, "2001:db8:0:1::9")  # no row explains it
    # Queued by the shim while no agent ran: one for a known pod, one unknown, one garbage.
    queue = tmp_path / "pending-deletes"
    queue.mkdir()
    (queue / "c0ffee01.json").write_bytes(request("DEL", cid="c0ffee01", pod="c0ffee01").encode())
    (queue / "feed0001.json").write_bytes(request("DEL", cid="feed0001").encode())
    (queue / "junk.json").write_text("{not json")
    api.create(PODS, pod_object("default", "new", NODE, annotations={"flock.fritzlab.net/ipv4": "true"}))
    nodeconfigs, pods, handler, service = setup(api, rows, kernel, tmp_path)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(nodeconfigs.run)
            await nursery.start(pods.run)
            await serving(nursery, service)
            assert sorted(p.name for p in queue.iterdir()) == []
            assert set(rows.rows) == {"c0ffee02"}  # the queued DEL applied; the pending row kept
            assert set(kernel.veths) == set()  # orphan and the pending pod's half-made state removed
            assert set(handler.ipam.allocator.containers()) == {"c0ffee02"}
            # A new pod cannot get the pending pod's IPv4 address; the DEL freed .2.
            result = await handler(request("ADD", cid="c0ffee03", pod="new"))
            assert result["ips"][1]["address"] == "198.51.100.2/32"
            # The pending pod's retried ADD gets exactly what it reserved.
            api.create(PODS, pod_object("default", "c0ffee02", NODE))
            again = await handler(request("ADD", cid="c0ffee02", pod="c0ffee02"))
            assert [i["address"] for i in again["ips"]] == ["2001:db8:0:1::2/128", "198.51.100.3/32"]
            nursery.cancel_scope.cancel()


async def test_the_kernel_is_restored_and_del_served_before_the_nodeconfig_arrives(autojump_clock, tmp_path):
    api, rows, kernel = ObjectStore(), MemoryAllocations(), MemoryKernel()
    done = row("c0ffee01", AllocationState.COMMITTED, "2001:db8:0:1::1")
    gone = row("c0ffee02", AllocationState.COMMITTED, "2001:db8:0:1::2")
    for a in (done, gone):
        rows.rows[a.container_id] = a
        kernel.veths[a.container_id] = a
    kernel.veths["deadbeef"] = row("deadbeef", AllocationState.COMMITTED, "2001:db8:0:1::9")  # no row explains it
    nodeconfigs, pods, handler, service = setup(api, rows, kernel, tmp_path)
    state = handler.state
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(nodeconfigs.run)
            await nursery.start(pods.run)
            await nursery.start(service.run)  # at once: ADD's readiness is its gate
            await trio.sleep(1)
            # No NodeConfig yet: the kernel is already in line with the store, DEL is served, ADD is not.
            assert set(kernel.veths) == {"c0ffee01", "c0ffee02"}
            assert await handler(request("DEL", cid="c0ffee02", pod="c0ffee02")) == {}
            assert set(rows.rows) == {"c0ffee01"} and set(kernel.veths) == {"c0ffee01"}
            assert "waiting for NodeConfig host001" in state.reason(ADD_GATE.name) and handler.ipam is None
            api.create(NODECONFIGS, nodeconfig_object(NODE, "2001:db8:0:1::/64"))
            seen = -1
            while state.reason(ADD_GATE.name):
                seen = await state.wait_changed(seen)
            assert trio.current_time() < 1.1
            # The IPAM knows the row that stayed and not the one deleted meanwhile.
            assert set(handler.ipam.allocator.containers()) == {"c0ffee01"}
            assert set(state.allocations) == {"c0ffee01"}
            nursery.cancel_scope.cancel()


async def test_nodeconfig_changes_apply_at_run_time_and_pods_keep_their_addresses(autojump_clock, tmp_path):
    api, rows, kernel = ObjectStore(), MemoryAllocations(), MemoryKernel()
    api.create(NODECONFIGS, nodeconfig_object(NODE, "2001:db8:0:1::/64"))
    for name in ("a", "b"):
        api.create(PODS, pod_object("default", name, NODE))
    nodeconfigs, pods, handler, service = setup(api, rows, kernel, tmp_path)
    state = handler.state
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(nodeconfigs.run)
            await nursery.start(pods.run)
            await serving(nursery, service)
            first = await handler(request("ADD", cid="c0ffee0a", pod="a"))
            obj = api.get(NODECONFIGS, NODE)
            obj["spec"] = {"cidr6": "2001:db8:0:2::/64", "bgp": {"asn": 64512, "routerID": "192.0.2.11", "peers": []}}
            api.update(NODECONFIGS, obj)
            await trio.sleep(0.1)
            assert state.nodeconfig.cidr6 == ipaddress.ip_network("2001:db8:0:2::/64")
            assert handler.ipam.node == state.nodeconfig
            assert kernel.blackholes == (ipaddress.ip_network("2001:db8:0:2::/64"),)
            second = await handler(request("ADD", cid="c0ffee0b", pod="b"))
            assert ipaddress.ip_interface(second["ips"][0]["address"]).ip in ipaddress.ip_network("2001:db8:0:2::/64")
            assert await handler(request("ADD", cid="c0ffee0a", pod="a")) == first
            assert isinstance(state.nodeconfig, NodeConfig)
            nursery.cancel_scope.cancel()


async def test_pending_deletes_are_drained_while_running_with_backoff_after_failure(autojump_clock, tmp_path):
    api, rows, kernel = ObjectStore(), MemoryAllocations(), MemoryKernel()
    api.create(NODECONFIGS, nodeconfig_object(NODE, "2001:db8:0:1::/64"))
    for cid in ("c0ffee01", "c0ffee02"):
        rows.rows[cid] = row(cid, AllocationState.COMMITTED, f"2001:db8:0:1::{cid[-1]}")
        kernel.veths[cid] = rows.rows[cid]
    nodeconfigs, pods, _handler, service = setup(api, rows, kernel, tmp_path)
    queue = tmp_path / "pending-deletes"
    with trio.fail_after(300):
        async with trio.open_nursery() as nursery:
            await nursery.start(nodeconfigs.run)
            await nursery.start(pods.run)
            await serving(nursery, service)
            began = trio.current_time()
            # A shim journals a DEL while this agent runs (it timed out on a busy agent).
            queue.mkdir(mode=0o755)
            (queue / "c0ffee01.json").write_bytes(request("DEL", cid="c0ffee01").encode())
            await trio.sleep(2.5)
            assert not (queue / "c0ffee01.json").exists() and "c0ffee01" not in rows.rows
            assert queue.stat().st_mode & 0o777 == 0o700  # flock's own directory, tightened
            # One whose DEL fails stays queued and is retried with a growing wait.
            kernel.teardown_fails.add("c0ffee02")
            (queue / "c0ffee02.json").write_bytes(request("DEL", cid="c0ffee02").encode())
            await trio.sleep(2 + 4 + 8)  # three failed tries: at +2, +4 and +8 s of each other
            assert (queue / "c0ffee02.json").exists() and "c0ffee02" in rows.rows
            kernel.teardown_fails.clear()
            await trio.sleep(16)
            assert not (queue / "c0ffee02.json").exists() and rows.rows == {}
            assert trio.current_time() - began < 40
            nursery.cancel_scope.cancel()


async def test_a_deleted_nodeconfig_stops_add_until_it_is_back_and_pods_keep_working(autojump_clock, tmp_path):
    api, rows, kernel = ObjectStore(), MemoryAllocations(), MemoryKernel()
    api.create(NODECONFIGS, nodeconfig_object(NODE, "2001:db8:0:1::/64"))
    for name in ("a", "b"):
        api.create(PODS, pod_object("default", name, NODE))
    nodeconfigs, pods, handler, service = setup(api, rows, kernel, tmp_path)
    state = handler.state
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(nodeconfigs.run)
            await nursery.start(pods.run)
            await serving(nursery, service)
            await handler(request("ADD", cid="c0ffee0a", pod="a"))
            api.delete(NODECONFIGS, NODE)
            await trio.sleep(0.1)
            assert not state.ready and "NodeConfig host001 was deleted" in " ".join(state.not_ready())
            try:
                await handler(request("ADD", cid="c0ffee0b", pod="b"))
            except errors.CniError as err:
                assert err.code == errors.TRY_AGAIN_LATER and "was deleted" in err.details
            else:
                raise AssertionError("ADD served while the NodeConfig is deleted")
            assert set(kernel.veths) == {"c0ffee0a"}  # the existing pod keeps its network
            assert await handler(request("DEL", cid="c0ffee0a", pod="a")) == {}  # and DEL still works
            api.create(NODECONFIGS, nodeconfig_object(NODE, "2001:db8:0:1::/64"))
            await trio.sleep(0.1)
            assert state.ready
            await handler(request("ADD", cid="c0ffee0b", pod="b"))
            nursery.cancel_scope.cancel()


async def test_with_encryption_add_waits_for_the_wireguard_guard(autojump_clock, tmp_path):
    """The agent's first start with encryption: start-up is done, but until the WireGuard service has
    written its guard (every remote pod block dropped unless through the tunnel) ADD answers 11 and
    STATUS 50, naming why — no pod of this node exists before its traffic is guarded."""
    from flock.agent._wireguard import GUARD_GATE

    api, rows, kernel = ObjectStore(), MemoryAllocations(), MemoryKernel()
    api.create(NODECONFIGS, nodeconfig_object(NODE, "2001:db8:0:1::/64"))
    state = NodeState(NODE, [Gate(NODECONFIG_GATE, f"NodeConfig {NODE} not loaded"), ADD_GATE, GUARD_GATE])
    nodeconfigs = NodeConfigWatcher(StoreSource(api, NODECONFIGS, f"metadata.name={NODE}"), NODE, sink=state)
    pods = PodWatcher(StoreSource(api, PODS, f"spec.nodeName={NODE}"), NODE)
    handler = PodHandler(
        store=rows, dataplane=kernel, pods=pods, state=state, rng=random.Random(7), add_gates=(GUARD_GATE.name,)
    )
    service = NodeBringUp(handler=handler, dataplane=kernel, state=state, pending_deletes=tmp_path / "pending")
    api.create(PODS, pod_object("default", "web-0", NODE))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(nodeconfigs.run)
            await nursery.start(pods.run)
            await serving(nursery, service)
            for op, code in (("ADD", errors.TRY_AGAIN_LATER), ("STATUS", errors.NOT_AVAILABLE)):
                try:
                    await handler(request(op))
                except errors.CniError as err:
                    assert err.code == code and err.details == GUARD_GATE.initial_reason
                else:
                    raise AssertionError(f"{op} served before the guard")
            assert not rows.rows and "encryption: " + GUARD_GATE.initial_reason in state.not_ready()
            state.open_gate(GUARD_GATE.name)  # what the service's first pass does
            result = await handler(request("ADD"))
            assert result["ips"] and await handler(request("STATUS")) == {}
            nursery.cancel_scope.cancel()
