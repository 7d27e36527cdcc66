"""Deferred veth removal (flock.pods._removals) in virtual time: DEL answers
before the veth is gone, the addresses stay held until it is, the same
container ID waits for it, failures are retried, and without the service
DEL stays synchronous."""

from __future__ import annotations

import contextlib
import functools
import logging

import pytest
import trio

from flock import errors
from flock.apiserver import PODS, ObjectStore, nodeconfig_object, pod_object
from flock.model import NodeConfig
from flock.pods import PodHandler, VethRemovals
from flock.pods._removals import QUIET_S
from flock.testing import StoreSource
from flock.testing.pods import MemoryAllocations, MemoryKernel, request, serving_handler
from flock.watchers import PodWatcher

NODE = "host001"
NODE_CONFIG = NodeConfig.from_object(
    nodeconfig_object(NODE, "2001:db8:0:1::/64", cidr4="198.51.100.0/29", families={"ipv6": True, "ipv4": True})
)
A = "flock.fritzlab.net/"
PINNED = "2001:db8:0:1::5"


@contextlib.asynccontextmanager
async def running(api: ObjectStore, *, with_removals: bool = True):
    """A handler over in-memory rows and kernel; with the removals service running when *with_removals*."""
    source = StoreSource(api, PODS, f"spec.nodeName={NODE}")
    watcher = PodWatcher(source, NODE)
    kernel = MemoryKernel()
    rows = MemoryAllocations()
    removals = VethRemovals(kernel) if with_removals else None
    handler = await serving_handler(watcher, NODE_CONFIG, rows=rows, kernel=kernel, removals=removals)
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        if removals is not None:
            await nursery.start(removals.run)
        yield handler, kernel, rows, removals
        nursery.cancel_scope.cancel()


def held(handler: PodHandler) -> set[str]:
    assert handler.ipam is not None
    return set(handler.ipam.allocator.containers())


def pods(api: ObjectStore, *names: str, **annotations: str) -> None:
    for name in names:
        api.create(PODS, pod_object("default", name, NODE, annotations={A + k: v for k, v in annotations.items()}))


async def test_del_answers_before_the_veth_goes_and_its_addresses_stay_held_until_it_has(autojump_clock):
    api = ObjectStore()
    pods(api, "a", addresses=PINNED)
    pods(api, "b", addresses=PINNED)
    with trio.fail_after(30):
        async with running(api) as (handler, kernel, rows, removals):
            await handler(request("ADD", cid="c0ffee0a", pod="a"))
            kernel.teardown_gate = trio.Event()
            assert await handler(request("DEL", cid="c0ffee0a", pod="a")) == {}
            # Answered: the row and the node's view are gone, the veth and the addresses are not.
            assert "c0ffee0a" not in rows.rows and "c0ffee0a" not in handler.state.allocations
            assert "c0ffee0a" in kernel.veths and held(handler) == {"c0ffee0a"}
            await trio.sleep(1)  # the removal is under way, in the kernel
            assert removals.pending == 1 and kernel.teardowns == [("c0ffee0a", False)]
            # Another pod cannot get an address the old veth still routes: an ADD
            # asking for it (a StatefulSet's new sandbox) waits for the removal.
            results = []

            async def add_b() -> None:
                results.append(await handler(request("ADD", cid="c0ffee0b", pod="b")))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(add_b)
                await trio.sleep(5)
                assert results == [] and "c0ffee0b" not in rows.rows and held(handler) == {"c0ffee0a"}
                kernel.teardown_gate.set()
            assert "c0ffee0a" not in kernel.veths and held(handler) == {"c0ffee0b"} and removals.pending == 0
            assert any(ip["address"].startswith(PINNED + "/") for ip in results[0]["ips"])
            # With nothing pending, the same conflict fails at once (code 7 naming the holder).
            pods(api, "c", addresses=PINNED)
            with pytest.raises(errors.CniError) as info:
                await handler(request("ADD", cid="c0ffee0c", pod="c"))
            assert PINNED in info.value.details and "c0ffee0b" in info.value.details


async def test_add_check_and_del_of_the_same_container_wait_for_its_pending_removal(autojump_clock):
    api = ObjectStore()
    pods(api, "a")
    with trio.fail_after(30):
        async with running(api) as (handler, kernel, rows, removals):
            await handler(request("ADD", cid="c0ffee0a", pod="a"))
            kernel.teardown_gate = trio.Event()
            await handler(request("DEL", cid="c0ffee0a", pod="a"))
            done: list[str] = []

            async def again(op: str, **config: object) -> None:
                with contextlib.suppress(errors.CniError):
                    await handler(request(op, cid="c0ffee0a", pod="a", **config))
                done.append(op)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(again, "ADD")
                nursery.start_soon(functools.partial(again, "CHECK", prevResult={"ips": []}))
                nursery.start_soon(again, "DEL")
                await trio.sleep(5)
                assert done == [] and kernel.setups == 1  # every one waits; nothing touched the kernel
                kernel.teardown_gate.set()
            # Each ran after the old veth was gone (the ADD set up a fresh one).
            assert sorted(done) == ["ADD", "CHECK", "DEL"] and kernel.setups == 2
            await removals.wait("c0ffee0a")
            await handler(request("ADD", cid="c0ffee0a", pod="a"))
            assert set(rows.rows) == set(kernel.veths) == held(handler) == {"c0ffee0a"}
            kernel.teardown_gate = trio.Event()
            await handler(request("DEL", cid="c0ffee0a", pod="a"))
            # GC has no row of it to wait for: its cleanup removes the unexplained
            # veth beside the pending removal, which then finds it gone.
            assert await handler(request("GC", **{"cni.dev/valid-attachments": []})) == {}
            assert rows.rows == {} and kernel.veths == {} and held(handler) == {"c0ffee0a"}
            kernel.teardown_gate.set()
            await removals.wait("c0ffee0a")
            assert held(handler) == set()


async def test_without_the_service_del_removes_the_veth_before_it_answers(autojump_clock):
    api = ObjectStore()
    pods(api, "a")
    pods(api, "any", anycast="2001:db8:0:1::a1")
    with trio.fail_after(30):
        async with running(api, with_removals=False) as (handler, kernel, rows, _):
            await handler(request("ADD", cid="c0ffee0a", pod="a"))
            await handler(request("ADD", cid="c0ffee0b", pod="any"))
            await handler(request("DEL", cid="c0ffee0a", pod="a"))
            assert "c0ffee0a" not in kernel.veths and held(handler) == {"c0ffee0b"}
            await handler(request("DEL", cid="c0ffee0b", pod="any"))
            assert kernel.veths == {} and held(handler) == set() and rows.rows == {}
            # Only the anycast pod leaves flock's routes by hand (the kernel drops single-path ones).
            assert kernel.teardowns == [("c0ffee0a", False), ("c0ffee0b", True)]
            assert kernel.left_routes == []


async def test_a_stopped_service_means_synchronous_del_and_a_restarted_one_takes_up_what_was_pending(
    autojump_clock,
):
    api = ObjectStore()
    pods(api, "a", "b")
    kernel = MemoryKernel()
    removals = VethRemovals(kernel)
    source = StoreSource(api, PODS, f"spec.nodeName={NODE}")
    watcher = PodWatcher(source, NODE)
    handler = await serving_handler(watcher, NODE_CONFIG, kernel=kernel, removals=removals)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            await handler(request("ADD", cid="c0ffee0a", pod="a"))
            await handler(request("ADD", cid="c0ffee0b", pod="b"))
            kernel.teardown_gate = trio.Event()
            async with trio.open_nursery() as service:
                await service.start(removals.run)
                await handler(request("DEL", cid="c0ffee0a", pod="a"))
                assert removals.pending == 1
                service.cancel_scope.cancel()  # the service stops (a supervisor restart, say)
            assert not removals.running and removals.pending == 1 and held(handler) == {"c0ffee0a", "c0ffee0b"}
            kernel.teardown_gate.set()
            kernel.teardown_gate = None
            await handler(request("DEL", cid="c0ffee0b", pod="b"))  # synchronous now
            assert "c0ffee0b" not in kernel.veths and held(handler) == {"c0ffee0a"}
            # The rebuilt IPAM (a restarted bring-up) keeps the removal's addresses held.
            await handler.rebuild(NODE_CONFIG)
            assert held(handler) == {"c0ffee0a"}
            await nursery.start(removals.run)
            await removals.wait("c0ffee0a")
            assert kernel.veths == {} and held(handler) == set() and removals.pending == 0
            nursery.cancel_scope.cancel()


async def test_an_anycast_pod_leaves_its_routes_before_del_answers(autojump_clock):
    api = ObjectStore()
    pods(api, "any", anycast="2001:db8:0:1::a1")
    with trio.fail_after(30):
        async with running(api) as (handler, kernel, _rows, removals):
            await handler(request("ADD", cid="c0ffee0a", pod="any"))
            kernel.teardown_gate = trio.Event()
            await handler(request("DEL", cid="c0ffee0a", pod="any"))
            assert kernel.left_routes == ["c0ffee0a"] and "c0ffee0a" in kernel.veths
            kernel.teardown_gate.set()
            await removals.wait("c0ffee0a")
            assert kernel.teardowns == [("c0ffee0a", False)] and kernel.veths == {}


async def test_a_failed_removal_is_logged_kept_held_and_retried(autojump_clock, caplog):
    api = ObjectStore()
    pods(api, "a")
    caplog.set_level(logging.ERROR, logger="flock.pods")
    with trio.fail_after(300):
        async with running(api) as (handler, kernel, _rows, removals):
            await handler(request("ADD", cid="c0ffee0a", pod="a"))
            kernel.teardown_fails.add("c0ffee0a")
            await handler(request("DEL", cid="c0ffee0a", pod="a"))
            await trio.sleep(10)
            assert removals.failures >= 3 and removals.pending == 1 and held(handler) == {"c0ffee0a"}
            failed = [r for r in caplog.records if r.getMessage().startswith("deferred veth removal failed")]
            assert failed and all(getattr(r, "container_id", None) == "c0ffee0a" for r in failed)
            kernel.teardown_fails.clear()
            await removals.wait("c0ffee0a")
            assert kernel.veths == {} and held(handler) == set()


async def test_drain_waits_a_bounded_time(autojump_clock, caplog):
    api = ObjectStore()
    pods(api, "a", "b")
    with trio.fail_after(30):
        async with running(api) as (handler, kernel, _rows, removals):
            await handler(request("ADD", cid="c0ffee0a", pod="a"))
            kernel.teardown_gate = trio.Event()
            await handler(request("DEL", cid="c0ffee0a", pod="a"))

            async def finish_later() -> None:
                await trio.sleep(1)
                kernel.teardown_gate.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(finish_later)
                began = trio.current_time()
                await removals.drain()
            assert trio.current_time() - began == 1 and removals.pending == 0
            await handler(request("ADD", cid="c0ffee0b", pod="b"))
            kernel.teardown_gate = trio.Event()
            await handler(request("DEL", cid="c0ffee0b", pod="b"))
            began = trio.current_time()
            await removals.drain()
            assert trio.current_time() - began == removals.drain_deadline and removals.pending == 1
            assert "veth removals pending" in caplog.text
            kernel.teardown_gate.set()


async def test_removals_let_requests_in_flight_go_first_for_at_most_a_second(autojump_clock):
    api = ObjectStore()
    pods(api, "a", "b", "c", "d", "e")
    with trio.fail_after(30):
        async with running(api) as (handler, kernel, _rows, _removals):
            for name in "abc":
                await handler(request("ADD", cid=f"c0ffee0{name}", pod=name))
            kernel.gate = trio.Event()  # setups hang: an ADD stays in flight
            async with trio.open_nursery() as nursery:
                nursery.start_soon(handler, request("ADD", cid="c0ffee0d", pod="d"))
                await handler(request("DEL", cid="c0ffee0a", pod="a"))
                await trio.sleep(0.5)
                assert kernel.teardowns == []  # the ADD in flight goes first
                kernel.gate.set()
            await trio.sleep(QUIET_S / 2)
            assert kernel.teardowns == []  # and the quiet period after it
            await trio.sleep(QUIET_S)
            assert kernel.teardowns == [("c0ffee0a", False)]

            kernel.gate = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(handler, request("ADD", cid="c0ffee0e", pod="e"))
                began = trio.current_time()
                await handler(request("DEL", cid="c0ffee0b", pod="b"))
                await trio.sleep(0.9)
                assert len(kernel.teardowns) == 1
                await trio.sleep(0.2)  # a second at most, even while requests keep coming
                assert kernel.teardowns[1] == ("c0ffee0b", False) and trio.current_time() - began < 1.2

                # An ADD of the same container waits for its removal, which then starts at once.
                await handler(request("DEL", cid="c0ffee0c", pod="c"))
                nursery.start_soon(handler, request("ADD", cid="c0ffee0c", pod="c"))
                await trio.sleep(0.1)
                assert kernel.teardowns[2] == ("c0ffee0c", False)
                kernel.gate.set()
            assert set(handler.state.allocations) == {"c0ffee0c", "c0ffee0d", "c0ffee0e"}


async def test_a_container_without_a_pod_loses_its_veth_before_del_answers(autojump_clock):
    """podman network disconnect/connect keeps the container's namespace: the
    old interface must be gone when DEL answers, so that one is not deferred."""
    api = ObjectStore()
    with trio.fail_after(30):
        async with running(api) as (handler, kernel, rows, removals):
            podman = request("ADD", cid="c0ffee0a")
            podman.args = "IgnoreUnknown=1;K8S_POD_NAME=my_app.1"
            await handler(podman)
            assert rows.rows["c0ffee0a"].namespace == ""
            gone = request("DEL", cid="c0ffee0a")
            gone.args = podman.args
            await handler(gone)
            assert kernel.veths == {} and held(handler) == set() and removals.pending == 0
            assert kernel.teardowns == [("c0ffee0a", False)]
