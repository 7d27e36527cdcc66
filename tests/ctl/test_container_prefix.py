"""flockctl takes what it shows (issue 25): a unique prefix of a container ID
wherever it takes one; an ambiguous or too short prefix is refused naming why."""

from __future__ import annotations

import ipaddress
import json

import pytest
import trio

from flock.ctl import ADMIN_PROTOCOL_VERSION, AdminOps, AdminServer
from flock.ctl._ops import AMBIGUOUS_LIST_MAX, MIN_CONTAINER_PREFIX, OpRefused, container_by_prefix
from flock.model import Allocation, AllocationState
from flock.netlink import NetlinkWorker
from flock.pods import PodHandler
from flock.state import NodeState
from flock.testing.pods import MemoryAllocations, MemoryKernel

FULL = "3f9a2c4b5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7081"


def alloc(cid: str, n: int = 1, pod: str = "web-0") -> Allocation:
    return Allocation(
        cid,
        "default",
        pod,
        "uid-" + cid,
        "eth0",
        "/nonexistent",
        ipaddress.IPv6Address(f"2001:db8:0:1::{n:x}"),
        state=AllocationState.COMMITTED,
    )


def test_a_full_id_and_any_unique_prefix_of_it_name_the_allocation():
    rows = [alloc(FULL, 1), alloc("c0ffee01", 2), alloc("c0ffee0", 3)]
    assert container_by_prefix(rows, FULL).container_id == FULL
    assert container_by_prefix(rows, FULL[:16]).container_id == FULL  # what `flockctl pods` shows
    assert container_by_prefix(rows, FULL[:MIN_CONTAINER_PREFIX]).container_id == FULL
    # A full ID wins over being a prefix of another one.
    assert container_by_prefix(rows, "c0ffee0").container_id == "c0ffee0"
    assert container_by_prefix(rows, "c0ffee01").container_id == "c0ffee01"
    assert container_by_prefix(rows, "deadbeef") is None
    assert container_by_prefix(rows, FULL + "0") is None


@pytest.mark.parametrize("prefix", ["", "3", "3f9"])
def test_a_prefix_shorter_than_the_minimum_is_refused(prefix):
    with pytest.raises(OpRefused) as info:
        container_by_prefix([alloc(FULL)], prefix)
    assert info.value.error == "container ID prefix too short"
    assert f"at least {MIN_CONTAINER_PREFIX} characters" in info.value.details


def test_a_short_full_id_is_still_taken():
    assert container_by_prefix([alloc("ab")], "ab").container_id == "ab"


def test_an_ambiguous_prefix_names_a_bounded_list_of_candidates():
    rows = [alloc(f"c0ffee{i:02d}", i + 1, pod=f"web-{i}") for i in range(25)]
    with pytest.raises(OpRefused) as info:
        container_by_prefix(rows, "c0ffee0")
    assert info.value.error == "ambiguous container ID prefix"
    assert info.value.details.startswith("'c0ffee0' matches 10 containers: c0ffee00 (pod default/web-0), c0ffee01")
    assert "and" not in info.value.details.split(";")[0].split(": ", 1)[1]
    with pytest.raises(OpRefused) as info:
        container_by_prefix(rows, "c0ff")
    details = info.value.details
    assert "matches 25 containers" in details and f"and {25 - AMBIGUOUS_LIST_MAX} more" in details
    assert details.count("c0ffee") == AMBIGUOUS_LIST_MAX and len(details) < 600


async def exchange(path, obj: dict) -> dict:
    stream = await trio.open_unix_socket(str(path))
    async with stream:
        await stream.send_all(json.dumps(obj).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


async def test_release_through_the_admin_socket_takes_a_prefix_and_refuses_ambiguity(tmp_path):
    state = NodeState("host001")
    store = MemoryAllocations()
    handler = PodHandler(store=store, dataplane=MemoryKernel(), pods=None, state=state)  # type: ignore[arg-type]
    ops = AdminOps(state=state, handler=handler, netlink=NetlinkWorker(), pending_deletes=tmp_path / "pending")
    for i, cid in enumerate((FULL, FULL[:20] + "ffff", "c0ffee01")):
        await store.put(alloc(cid, i + 1))
    path = tmp_path / "run" / "admin.sock"
    v = ADMIN_PROTOCOL_VERSION
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(AdminServer(path, ops).run)

            async def release(target: str) -> dict:
                return await exchange(path, {"version": v, "op": "ipam-release", "target": target})

            reply = await release(FULL[:16])
            assert reply["ok"] is False and reply["error"] == "ambiguous container ID prefix", reply
            assert FULL in reply["details"] and FULL[:20] + "ffff" in reply["details"]
            reply = await release("c0f")
            assert (reply["ok"], reply["error"]) == (False, "container ID prefix too short"), reply
            reply = await release("")
            assert (reply["ok"], reply["error"]) == (False, "invalid target"), reply
            reply = await release("c0ffee02")
            assert (reply["ok"], reply["error"]) == (False, "unknown target"), reply
            assert "prefix" in reply["details"]
            # The ID is unique from its 21st character on, and an address still works as before.
            assert {a.container_id for a in await store.list()} == {FULL, FULL[:20] + "ffff", "c0ffee01"}
            nursery.cancel_scope.cancel()
