"""BIRD follows NodeState: inputs read from it, a reload only when they change, its lag as a note."""

from __future__ import annotations

import functools
import ipaddress
import subprocess
from collections.abc import Sequence

import trio

from flock.agent import BirdFollower, bird_inputs
from flock.apiserver import nodeconfig_object
from flock.bird import BirdReloader, RenderSettings
from flock.model import Allocation, AllocationState, NodeConfig
from flock.state import Gate, NodeState

NODE = "host001"
BGP = {"asn": 64512, "routerID": "192.0.2.11", "peers": [{"name": "tor1", "address": "2001:db8:ffff::1", "asn": 64500}]}


def anycast_pod(cid: str) -> Allocation:
    return Allocation(
        cid,
        "dns",
        cid,
        "",
        "eth0",
        f"/run/netns/{cid}",
        ipaddress.ip_address("2001:db8:0:1::5"),
        anycast=(ipaddress.ip_address("2001:db8:53::53"),),
        state=AllocationState.COMMITTED,
    )


async def test_bird_reloads_when_its_inputs_change_and_not_for_other_changes(autojump_clock, tmp_path):
    calls: list[tuple[float, str]] = []
    birdc_fails = [1]  # the first configure fails: BIRD not up yet

    async def runner(argv: Sequence[str]) -> subprocess.CompletedProcess:
        calls.append((trio.current_time(), argv[0]))
        if argv[0] == "birdc" and birdc_fails[0]:
            birdc_fails[0] -= 1
            return subprocess.CompletedProcess(argv, 1, b"", b"Unable to connect to server control socket\n")
        return subprocess.CompletedProcess(argv, 0, b"", b"")

    state = NodeState(NODE, [Gate("add", "start-up has not finished")])
    reloader = BirdReloader(
        config_path=tmp_path / "bird.conf",
        control_socket=tmp_path / "bird.ctl",
        settings=RenderSettings(route_protocol=70),
        inputs=functools.partial(bird_inputs, state),
        runner=runner,
        notes=state,
    )
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(BirdFollower(state, reloader).run)
            state.nodeconfig_observed(
                NodeConfig.from_object(nodeconfig_object(NODE, bgp=BGP)), deleted=False, refused=None
            )
            await trio.sleep(1)
            assert bird_inputs(state) is None and calls == []  # no allocation view yet: nothing rendered
            state.load_allocations([])
            await trio.sleep(0.6)
            assert [tool for _, tool in calls] == ["bird", "birdc"]
            assert state.notes() == [
                f"BIRD not configured yet (retrying): configure: birdc -s {tmp_path / 'bird.ctl'} configure "
                "exited 1: Unable to connect to server control socket"
            ]
            await trio.sleep(1.5)  # the retry (backoff 1 s)
            assert calls[-1][1] == "birdc" and state.notes() == [] and reloader.reloads == 1
            state.open_gate("add")  # readiness is not a BIRD input
            state.set_note("other", "something else")
            await trio.sleep(2)
            assert reloader.reloads == 1
            state.put_allocation(anycast_pod("c0ffee01"))  # a new anycast address: announce it
            await trio.sleep(0.6)
            assert reloader.reloads == 2 and "2001:db8:53::53" in (tmp_path / "bird.conf").read_text()
            nursery.cancel_scope.cancel()
