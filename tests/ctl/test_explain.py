"""``flockctl policy explain``: against a real flock-agent (flock.testing.agentlab: two pods on the node, a
NetworkPolicy from the fake API server, the verdicts and exit codes an operator gets, the JSON keys pinned),
and the admin op in process over a running policy service."""

from __future__ import annotations

import argparse
import ipaddress
import subprocess

import pytest
import trio

from flock.apiserver import NETWORKPOLICIES, PODS, network_policy_object, pod_object
from flock.ctl import AdminOps, OpRefused, Peer
from flock.ctl._cli import port_protocol
from flock.fnv import fnv1a_32
from flock.model import Allocation
from flock.netlink import NetlinkWorker
from flock.pods import PodHandler
from flock.policy import Kind, Namespace, NetworkPolicy, PolicyInputs, PolicyPod, PolicyService
from flock.state import NodeState
from flock.testing.agentlab import BIN, NODE, open_lab, wait_for
from flock.testing.pods import MemoryAllocations, MemoryKernel
from flock.testing.policy import MemoryApplier, MemoryLocalPods, MemoryWatermark

# The keys of the --json output: scripts rely on them (add keys deliberately, never rename).
EXPLAIN_KEYS = {
    "egress", "family", "from", "ingress", "inputs", "notes", "port", "protocol", "reference", "to", "verdict", "why",
}  # fmt: skip
PARTY_KEYS = {"address", "kind", "node", "pod", "query"}
DIRECTION_KEYS = {
    "applied", "decided_by", "direction", "hook", "node", "path", "reference", "subject", "trace", "verdict",
}  # fmt: skip
STEP_KEYS = {"action", "detail", "isolated_by", "policy", "priority", "resource_version", "rule", "rule_index", "tier"}
TRACE_KEYS = {"chain", "steps", "verdict"}
TRACE_STEP_KEYS = {"chain", "rule", "verdict"}
INPUTS_KEYS = {
    "applied_resource_version", "apply_error", "complete", "generation", "nodes_known", "resource_version", "synced",
}  # fmt: skip


@pytest.fixture
def lab(tmp_path):
    with open_lab(tmp_path, "ctlx", bird=False) as lab:
        yield lab


def explain(lab, *args: str) -> tuple[int, str, dict]:
    """``flockctl policy explain *args*`` as an operator runs it: (exit code, text, the --json output)."""
    return lab.flockctl("policy", "explain", *args)


def add(lab, cid: str, name: str, labels: dict[str, str]) -> str:
    """ADD pod default/*name* (created on the API server with *labels*) as *cid*; its IPv6 address."""
    lab.api.create(PODS, pod_object("default", name, NODE, labels=labels))
    out = lab.cni("ADD", cid, lab.pool.create(name), name)
    assert out.status == 0, out
    return str(ipaddress.ip_interface(out.json["ips"][0]["address"]).ip)


def test_explain_through_the_agent(lab):
    agent = lab.agent()
    agent.wait_ready()
    client = add(lab, "c7500001", "client", {"app": "client"})
    web = add(lab, "c7500002", "web", {"app": "web"})

    # No policy: allowed both ways, no policy named; this node's ruleset in force agrees.
    code, text, doc = explain(lab, "default/client", "default/web", "80/TCP")
    assert code == 0, text
    assert set(doc) == EXPLAIN_KEYS and set(doc["from"]) == PARTY_KEYS and set(doc["inputs"]) == INPUTS_KEYS
    assert doc["from"] == {
        "query": "default/client",
        "kind": "pod",
        "pod": "default/client",
        "node": NODE,
        "address": client,
    }
    assert doc["to"]["address"] == web
    assert (doc["verdict"], doc["reference"], doc["family"], doc["why"]) == ("allowed", "allowed", 6, "")
    for d in (doc["egress"], doc["ingress"]):
        assert set(d) == DIRECTION_KEYS and d["decided_by"] == "no-policy" and d["applied"] == "allowed", d
        assert d["hook"] == "forward" and d["node"] == NODE and all(set(s) == STEP_KEYS for s in d["path"])
    assert doc["inputs"]["complete"] and doc["inputs"]["apply_error"] is None
    assert "verdict  allowed (the reference evaluator agrees)" in text

    # A NetworkPolicy lets the clients reach web on 80 only.
    lab.api.create(
        NETWORKPOLICIES,
        network_policy_object(
            "default",
            "web-allow",
            {
                "podSelector": {"matchLabels": {"app": "web"}},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}], "ports": [{"port": 80}]}],
            },
        ),
    )

    def denied():
        got = explain(lab, "default/client", "default/web", "81/TCP")
        return got if got[0] == 1 else None

    code, text, doc = wait_for("the NetworkPolicy in force", denied)
    assert doc["verdict"] == "denied" and doc["egress"]["verdict"] == "allowed", text
    ingress = doc["ingress"]
    assert (ingress["verdict"], ingress["decided_by"], ingress["applied"]) == ("denied", "NetworkPolicy", "denied")
    assert [(s["tier"], s["action"], s["policy"]) for s in ingress["path"]] == [
        ("NetworkPolicy", "NoMatch", "default/web-allow"),
        ("NetworkPolicy", "Deny", ""),
    ]
    assert ingress["path"][0]["resource_version"] and ingress["path"][1]["isolated_by"] == ["default/web-allow"]
    assert set(ingress["trace"]) == TRACE_KEYS and all(set(s) == TRACE_STEP_KEYS for s in ingress["trace"]["steps"])
    assert ingress["trace"]["verdict"] == "drop" and ingress["trace"]["steps"][-1]["verdict"] == "drop"
    assert "ingress  DENIED" in text and "isolated by default/web-allow: no rule allows it" in text

    code, text, doc = explain(lab, "default/client", web, "80")  # by address; TCP by default
    assert code == 0 and doc["to"]["pod"] == "default/web", text
    step = doc["ingress"]["path"][0]
    assert (step["tier"], step["action"], step["policy"], step["rule_index"]) == (
        "NetworkPolicy",
        "Allow",
        "default/web-allow",
        0,
    )
    assert "NetworkPolicy default/web-allow (rv " in text and "): ingress[0] allows" in text
    assert explain(lab, "default/web", "default/client", "81/TCP")[0] == 0  # client is not isolated
    assert explain(lab, "default/client", "default/web", "80/UDP")[0] == 1

    # What cannot be told: 2, and why.
    code, text, doc = explain(lab, "default/nobody", "default/web", "80/TCP")
    assert code == 2 and doc["verdict"] == "unknown" and set(doc) == EXPLAIN_KEYS
    assert doc["why"] == "pod default/nobody is unknown to the agent (no such pod, or not listed yet)"
    assert "CANNOT TELL: pod default/nobody is unknown" in text
    code, text, _ = explain(lab, "default/client", "default/web", "80/TCP", "--family", "4")
    assert code == 2 and "has no IPv4 address" in text
    bad = subprocess.run(
        [str(BIN / "flockctl"), "policy", "explain", "default/client", "default/web", "80/ICMP"], capture_output=True
    )
    assert bad.returncode == 2 and b"expected PORT/PROTO" in bad.stderr


# ---- in process: the op over a running policy service, and the command line's parsing ------------------


def test_port_and_protocol_are_parsed_as_policies_write_them():
    assert port_protocol("80/TCP") == (80, "TCP") and port_protocol("53/udp") == (53, "UDP")
    assert port_protocol("3868/SCTP") == (3868, "SCTP") and port_protocol("8080") == (8080, "TCP")
    for bad in ("0/TCP", "65536", "80/ICMP", "http/TCP", "", "/TCP"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected PORT/PROTO"):
            port_protocol(bad)


def _veth(cid: str) -> str:
    return f"flock{fnv1a_32(cid):08x}"


async def test_the_op_explains_from_the_policy_service_as_it_is(tmp_path):
    inputs, local, mark = PolicyInputs(), MemoryLocalPods(), MemoryWatermark()
    policy = PolicyService(inputs, local, MemoryApplier(), NODE, _veth, watermark=mark)
    state = NodeState(NODE)
    handler = PodHandler(store=MemoryAllocations(), dataplane=MemoryKernel(), pods=None, state=state)  # type: ignore[arg-type]
    ops = AdminOps(state, handler, NetlinkWorker(), tmp_path / "pending", policy=policy)
    peer = Peer(pid=1, uid=0, gid=0)
    ask = {"from": "x/db", "to": "x/web", "port": 80, "protocol": "TCP"}
    with trio.fail_after(10):
        doc = await ops.dispatch("policy-explain", ask, peer)
        assert doc["verdict"] == "unknown" and doc["why"].startswith("the policy inputs are not listed yet"), doc
        async with trio.open_nursery() as nursery:
            await nursery.start(policy.run)
            # The API's view of web has no address yet: the allocation's is the one explained.
            web = PolicyPod("x", "web", {"app": "web"}, node=NODE)
            db = PolicyPod("x", "db", {"app": "db"}, (ipaddress.ip_address("2001:db8:0:2::7"),), node="host002")
            deny = NetworkPolicy.from_object(
                {"metadata": {"namespace": "x", "name": "deny", "resourceVersion": "9"}, "spec": {"podSelector": {}}}
            )
            inputs.replace(Kind.NETWORK_POLICY, {deny.key: deny})
            inputs.replace(Kind.NAMESPACE, {"x": Namespace("x")})
            inputs.replace(Kind.POD, {web.key: web, db.key: db})
            inputs.replace(Kind.CLUSTER_POLICY, {})
            mark.move(12)
            local.put(Allocation("c1", "x", "web", "uid", "eth0", "/run/netns/x", ipaddress.IPv6Address("2001:db8::5")))
            await policy.wait_applied(inputs.generation)
            doc = await ops.dispatch("policy-explain", ask, peer)
            nursery.cancel_scope.cancel()
    assert doc["verdict"] == "denied" and doc["to"]["address"] == "2001:db8::5", doc
    assert (doc["ingress"]["applied"], doc["ingress"]["decided_by"]) == ("denied", "NetworkPolicy")
    assert doc["ingress"]["path"][-1]["isolated_by"] == ["x/deny"] and doc["ingress"]["node"] == NODE
    assert doc["egress"]["applied"] is None and doc["egress"]["node"] == "host002"  # db's own agent's
    assert (doc["inputs"]["resource_version"], doc["inputs"]["complete"]) == (12, True)
    with pytest.raises(OpRefused, match="invalid query"):
        await ops.dispatch("policy-explain", {**ask, "port": "80"}, peer)
    without = AdminOps(state, handler, NetlinkWorker(), tmp_path / "pending")
    with pytest.raises(OpRefused, match="no policy service"):
        await without.dispatch("policy-explain", ask, peer)
