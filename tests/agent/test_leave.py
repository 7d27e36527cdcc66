"""A leaving node (issue 34): its Service routes get GRACEFUL_SHUTDOWN (RFC 8326) and local preference
0 at once, are withdrawn after --bgp-leave-seconds (the last-resort ones kept), and come back when it
stops leaving; the Node object's cordon, label and taint are the reasons; SIGTERM's drain leaves and
puts the withdrawal in BIRD before the agent exits (virtual time, BIRD's config as rendered)."""

from __future__ import annotations

import functools
import ipaddress
import subprocess
from collections.abc import Sequence

import trio
import trio.lowlevel

from flock.agent import BirdFollower, bird_inputs
from flock.agent._leave import AUTOSCALER_TAINT, CORDONED, EXCLUDE_LABEL, STOPPING, ServiceLeave, node_leaving
from flock.apiserver import nodeconfig_object
from flock.bird import BirdReloader, RenderSettings
from flock.model import Communities, NodeConfig, ServiceRoutes
from flock.state import NodeState

NODE = "host001"
BGP = {"asn": 64512, "routerID": "192.0.2.11", "peers": [{"name": "tor1", "address": "2001:db8:ffff::1", "asn": 64500}]}
CLUSTER = ipaddress.ip_network("2001:db8:ee::7/128")  # eTP Cluster: every node announces it
LOCAL = ipaddress.ip_network("2001:db8:ee::8/128")  # eTP Local, every endpoint here: last resort
ROUTES = (ServiceRoutes("public", (CLUSTER, LOCAL), Communities(((64512, 7),)), 150, last_resort=(LOCAL,)),)


def test_the_node_object_says_why_it_is_leaving() -> None:
    assert node_leaving({"metadata": {"name": NODE}, "spec": {}}) == frozenset()
    assert node_leaving({"spec": {"unschedulable": True}}) == {CORDONED}
    labelled = node_leaving({"metadata": {"labels": {EXCLUDE_LABEL: ""}}, "spec": {"unschedulable": False}})
    assert len(labelled) == 1 and EXCLUDE_LABEL in next(iter(labelled))
    tainted = node_leaving({"spec": {"taints": [{"key": AUTOSCALER_TAINT, "effect": "NoSchedule"}]}})
    assert len(tainted) == 1 and AUTOSCALER_TAINT in next(iter(tainted))
    assert node_leaving({"spec": {"taints": "garbage", "unschedulable": "yes"}}) == frozenset()  # hostile: no crash


def _state() -> NodeState:
    state = NodeState(NODE, [])
    state.nodeconfig_observed(NodeConfig.from_object(nodeconfig_object(NODE, bgp=BGP)), deleted=False, refused=None)
    state.load_allocations([])
    state.set_service_routes(ROUTES)
    return state


async def test_graceful_shutdown_then_withdrawal_and_back(autojump_clock) -> None:
    state = _state()
    assert bird_inputs(state).services == ROUTES and not bird_inputs(state).leaving
    async with trio.open_nursery() as nursery:
        await nursery.start(ServiceLeave(state, 5.0).run)
        state.set_leaving(CORDONED, True)
        await trio.sleep(4.9)
        inputs = bird_inputs(state)
        assert inputs.leaving and inputs.services == ROUTES  # every route, with the community
        await trio.sleep(0.2)
        inputs = bird_inputs(state)
        assert inputs.leaving and [r.nets for r in inputs.services] == [(LOCAL,)]  # only the last resort
        state.set_leaving(CORDONED, False)  # uncordoned
        await trio.lowlevel.checkpoint()
        inputs = bird_inputs(state)
        assert not inputs.leaving and inputs.services == ROUTES and not state.leave_withdrawn
        # cordoned and uncordoned within the period: never withdrawn
        state.set_leaving(CORDONED, True)
        await trio.sleep(2)
        state.set_leaving(CORDONED, False)
        await trio.sleep(10)
        assert not state.leave_withdrawn and bird_inputs(state).services == ROUTES
        nursery.cancel_scope.cancel()


async def test_sigterm_leaves_and_puts_the_withdrawal_in_bird_before_exit(autojump_clock, tmp_path) -> None:
    configured: list[tuple[float, str]] = []

    async def runner(argv: Sequence[str]) -> subprocess.CompletedProcess:
        if argv[0] == "birdc":
            configured.append((trio.current_time(), (tmp_path / "bird.conf").read_text()))
        return subprocess.CompletedProcess(argv, 0, b"", b"")

    state = _state()
    reloader = BirdReloader(
        config_path=tmp_path / "bird.conf",
        control_socket=tmp_path / "bird.ctl",
        settings=RenderSettings(route_protocol=70),
        inputs=functools.partial(bird_inputs, state),
        runner=runner,
    )
    leave = ServiceLeave(state, 5.0, apply=reloader.apply_now)
    async with trio.open_nursery() as nursery:
        await nursery.start(BirdFollower(state, reloader).run)
        await nursery.start(leave.run)
        await trio.sleep(2)
        start = trio.current_time()
        normal = configured[-1][1]
        assert "2001:db8:ee::7/128" in normal and "65535, 0" not in normal
        await leave.leave()
        took = trio.current_time() - start
        assert 5.0 <= took <= 6.0 and state.leaving == {STOPPING}
        texts = [text for t, text in configured if t >= start]
        graceful, last = texts[0], texts[-1]
        assert "(65535, 0)" in graceful and "2001:db8:ee::7/128" in graceful  # first: the community on all
        assert "2001:db8:ee::7/128" not in last and "2001:db8:ee::8/128" in last  # then: the last resort alone
        nursery.cancel_scope.cancel()


async def test_the_node_watcher_follows_cordon_and_uncordon(autojump_clock) -> None:
    from flock.agent._leave import node_informer
    from flock.apiserver import ObjectStore
    from flock.apiserver._resources import NODES
    from flock.nursery import Backoff
    from flock.testing import StoreSource
    from flock.watchers import InformerSettings

    store = ObjectStore()
    store.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}, "spec": {}})
    store.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "other"}, "spec": {}})
    state = _state()
    settings = InformerSettings(watch_seconds=60, backoff=Backoff(jitter=0.0), watch_list=False)
    source = StoreSource(store, NODES, field_selector=f"metadata.name={NODE}")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(node_informer(source, state, settings).run)
        await trio.sleep(1)
        assert state.leaving == frozenset()
        other = store.get(NODES, "other", None)
        other["spec"]["unschedulable"] = True
        store.update(NODES, other)  # another node cordoned: not this one's business
        await trio.sleep(1)
        assert state.leaving == frozenset()
        mine = store.get(NODES, NODE, None)
        mine["spec"]["unschedulable"] = True
        store.update(NODES, mine)
        await trio.sleep(1)
        assert state.leaving == {CORDONED}
        mine = store.get(NODES, NODE, None)
        mine["spec"]["unschedulable"] = False
        store.update(NODES, mine)
        await trio.sleep(1)
        assert state.leaving == frozenset()
        nursery.cancel_scope.cancel()
