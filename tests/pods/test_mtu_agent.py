"""MTU end to end on one node: the real plugin → real flock-agent → real
kernel.  The node's uplink carries 9000 and holds the default route: pods get
9000 on both veth ends; NodeConfig spec.mtu 1400 then wins for new pods;
CHECK names an MTU changed by hand."""

from __future__ import annotations

import json

import pytest

from flock.apiserver import NODECONFIGS, PODS, pod_object
from flock.testing.agentlab import NODE, open_lab, wait_for

pytestmark = pytest.mark.usefixtures("require_root")


@pytest.fixture
def lab(tmp_path):
    with open_lab(tmp_path, "fl-mtu-", bird=False) as lab:
        yield lab


def mtu(ns, name: str) -> int:
    return json.loads(ns.ip("-j", "link", "show", "dev", name))[0]["mtu"]


def test_pods_get_the_uplinks_mtu_then_the_nodeconfigs_and_check_names_a_change(lab):
    lab.node.ip("link", "set", "uplink", "mtu", "9000")
    lab.node.ip("addr", "add", "2001:db8:f::2/64", "dev", "uplink", "nodad")
    lab.node.ip("-6", "route", "add", "default", "via", "2001:db8:f::1", "dev", "uplink")
    for name in ("web-0", "web-1"):
        lab.api.create(PODS, pod_object("default", name, NODE))
    agent = lab.agent()
    agent.wait_ready()

    jumbo = lab.pool.create("pod")
    add = lab.cni("ADD", "c0ffee01", jumbo, "web-0")
    assert add.status == 0, add
    host_if = add.json["interfaces"][0]["name"]
    assert (mtu(lab.node, host_if), mtu(jumbo, "eth0")) == (9000, 9000)
    assert lab.cni("CHECK", "c0ffee01", jumbo, "web-0", prevResult=add.json).status == 0

    # spec.mtu wins for new pods; the first keeps its 9000 and CHECK passes it.
    lab.api.patch(NODECONFIGS, NODE, {"spec": {"mtu": 1400}})
    wait_for(
        "spec.mtu in force",
        lambda: any("pod MTU changed" in r.get("msg", "") and r.get("mtu") == 1400 for r in agent.records()),
    )
    small = lab.pool.create("pod")
    add2 = lab.cni("ADD", "c0ffee02", small, "web-1")
    assert add2.status == 0, add2
    assert (mtu(lab.node, add2.json["interfaces"][0]["name"]), mtu(small, "eth0")) == (1400, 1400)
    assert mtu(jumbo, "eth0") == 9000
    assert lab.cni("CHECK", "c0ffee01", jumbo, "web-0", prevResult=add.json).status == 0

    # Changed by hand inside the pod: CHECK fails naming both ends.
    jumbo.ip("link", "set", "eth0", "mtu", "1500")
    check = lab.cni("CHECK", "c0ffee01", jumbo, "web-0", prevResult=add.json)
    assert check.status == 1, check
    assert check.json["details"] == f"pod eth0: MTU is 1500, host {host_if} has 9000 (ADD sets both ends alike)"
