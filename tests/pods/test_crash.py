"""flock-agent killed with SIGKILL at each step of ADD (FLOCK_CRASH_POINT), then restarted:
no leaked address, no orphaned veth or route, no address handed out twice,
and the retried ADD gets exactly the addresses it had reserved."""

from __future__ import annotations

import ipaddress
import signal

import pytest

from flock.apiserver import PODS, pod_object
from flock.model import AllocationState
from flock.testing.agentlab import open_lab

pytestmark = pytest.mark.usefixtures("require_root")
V4 = {"flock.fritzlab.net/ipv4": "true"}


@pytest.fixture
def lab(tmp_path):
    with open_lab(tmp_path, "fl-crash-", bird=False) as lab:
        yield lab


def addresses(result: dict) -> list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]:
    return [ipaddress.ip_interface(i["address"]) for i in result["ips"]]


@pytest.mark.parametrize("point", ["before-pending", "after-pending", "setup:pod-addresses", "before-commit"])
def test_killed_during_add_recovers_without_leaks(lab, point):
    victim_ns, other_ns = lab.pool.create("victim"), lab.pool.create("other")
    for name in ("victim", "other", "third"):
        lab.api.create(PODS, pod_object("default", name, "host001", annotations=V4))
    agent = lab.agent(FLOCK_CRASH_POINT=point)
    agent.wait_ready()
    died = lab.cni("ADD", "c0ffee01", victim_ns, "victim")
    assert died.status == 1, died
    assert agent.wait_exit() == -signal.SIGKILL

    rows = lab.rows()
    if point == "before-pending":
        assert rows == {}
        reserved = None
    else:
        assert set(rows) == {"c0ffee01"} and rows["c0ffee01"].state is AllocationState.PENDING
        reserved = rows["c0ffee01"]
    if point.startswith("setup:") or point == "before-commit":
        assert lab.flock_links() != set()  # the dead agent left kernel state behind

    agent = lab.agent()
    agent.wait_ready()
    # Start-up removed what no committed row explains; the reservation stays.
    assert lab.flock_links() == set() and lab.flock_routes() == []
    assert "eth0" not in victim_ns.ip("-o", "link")
    assert lab.rows().keys() == rows.keys()

    other = lab.cni("ADD", "c0ffee02", other_ns, "other")
    assert other.status == 0, other
    retried = lab.cni("ADD", "c0ffee01", victim_ns, "victim")
    assert retried.status == 0, retried
    mine, theirs = addresses(retried.json), addresses(other.json)
    assert not {a.ip for a in mine} & {a.ip for a in theirs}  # nothing handed out twice
    if reserved is not None:
        assert [a.ip for a in mine] == [reserved.ip6, reserved.ip4]
    assert {r.state for r in lab.rows().values()} == {AllocationState.COMMITTED}
    assert len(lab.flock_links()) == 2 and len(lab.flock_routes()) == 4
    assert lab.cni("CHECK", "c0ffee01", victim_ns, "victim", prevResult=retried.json).status == 0

    for cid, ns, pod in (("c0ffee01", victim_ns, "victim"), ("c0ffee02", other_ns, "other")):
        assert lab.cni("DEL", cid, ns, pod).status == 0
    assert lab.rows() == {} and lab.flock_links() == set() and lab.flock_routes() == []
    # Every address came back: the next pod gets the lowest IPv4 address again.
    third = lab.cni("ADD", "c0ffee03", lab.pool.create("third"), "third")
    assert str(addresses(third.json)[1]) == "198.51.100.2/32"
    assert agent.stop() == 0


def test_killed_between_del_and_the_veth_removal_start_up_removes_the_veth_and_frees_the_address(lab):
    """DEL deletes the row (without an fsync of its own) and answers; the veth
    goes in the background.  An agent killed in between leaves a veth no row
    explains: the next start-up removes it, and its addresses are free."""
    victim_ns = lab.pool.create("victim")
    for name in ("victim", "third"):
        lab.api.create(PODS, pod_object("default", name, "host001", annotations=V4))
    agent = lab.agent(FLOCK_CRASH_POINT="before-veth-removal")
    agent.wait_ready()
    added = lab.cni("ADD", "c0ffee01", victim_ns, "victim")
    assert added.status == 0, added
    assert str(addresses(added.json)[1]) == "198.51.100.2/32"
    left = lab.flock_links()
    assert len(left) == 1
    # Answered, or (killed before the answer went out) journaled by the shim: 0 either way.
    assert lab.cni("DEL", "c0ffee01", victim_ns, "victim").status == 0
    assert agent.wait_exit() == -signal.SIGKILL
    assert lab.rows() == {}  # the delete survived the kill
    assert lab.flock_links() == left  # the veth did not go

    agent = lab.agent()
    agent.wait_ready()
    assert lab.flock_links() == set() and lab.flock_routes() == []
    third = lab.cni("ADD", "c0ffee03", lab.pool.create("third"), "third")
    assert str(addresses(third.json)[1]) == "198.51.100.2/32"  # the victim's address is free again
    assert lab.cni("DEL", "c0ffee03", None, "third").status == 0
    assert agent.stop() == 0
