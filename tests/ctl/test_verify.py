"""``flockctl policy explain --verify`` against a real flock-agent (flock.testing.agentlab): the agent sends
one packet from the source pod with nftables tracing on for it alone and prints the kernel's chains and
rule handles next to the explanation's.  An allowed and a denied pair (exit 0 and 1, the kernel's way
printed), a rule put into flock's table by hand (exit 3, saying where the kernel and the explanation part),
a source on another node (exit 2), a destination on another node (its egress verified, its ingress said not
to be); and nothing of it left in the kernel: the ruleset as before, no process of it."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess

import pytest
import trio

from flock.apiserver import NETWORKPOLICIES, PODS, network_policy_object, pod_object
from flock.ctl import AdminOps, Peer
from flock.fnv import fnv1a_32
from flock.model import Allocation
from flock.netlink import NetlinkWorker
from flock.pods import PodHandler
from flock.policy import Kind, Namespace, NetworkPolicy, PolicyInputs, PolicyPod, PolicyService
from flock.state import NodeState
from flock.testing.agentlab import BIN, NODE, open_lab, wait_for
from flock.testing.pods import MemoryAllocations, MemoryKernel
from flock.testing.policy import MemoryApplier, MemoryLocalPods, MemoryWatermark

# The keys of the --json output (tests/ctl/test_explain.py pins them without --verify) and of --verify's part:
# scripts rely on them (add keys deliberately, never rename).
EXPLAIN_KEYS = {
    "egress",
    "family",
    "from",
    "ingress",
    "inputs",
    "notes",
    "port",
    "protocol",
    "reference",
    "to",
    "verdict",
    "why",
}  # fmt: skip of the --json output: scripts rely on them (add keys deliberately, never rename).
VERIFY_KEYS = {"egress", "ingress", "node", "notes", "probe", "status", "why"}
PROBE_KEYS = {"dport", "from", "protocol", "sport", "to", "trace_id"}
CHECK_KEYS = {"kernel", "status", "why"}
STEP_KEYS = {"chain", "handle", "note", "part", "rule", "verdict"}


@pytest.fixture
def lab(tmp_path):
    with open_lab(tmp_path, "ctlv", bird=False) as lab:
        yield lab


def explain_only(lab, *args: str) -> tuple[int, str, dict]:
    """``flockctl policy explain *args*`` as an operator runs it: (exit code, text, the --json output)."""
    return lab.flockctl("policy", "explain", *args)


def verify(lab, *args: str) -> tuple[int, str, dict]:
    """The same with ``--verify`` (each run sends its own packet)."""
    return explain_only(lab, *args, "--verify")


def add(lab, cid: str, name: str, labels: dict[str, str]) -> str:
    """ADD pod default/*name* (created on the API server with *labels*) as *cid*; its IPv6 address."""
    lab.api.create(PODS, pod_object("default", name, NODE, labels=labels))
    out = lab.cni("ADD", cid, lab.pool.create(name), name)
    assert out.status == 0, out
    return str(ipaddress.ip_interface(out.json["ips"][0]["address"]).ip)


def kernel(lab) -> str:
    """The node's ruleset (counters and set elements left out: a probe counts, as every packet does)."""
    return lab.node.run("nft", "-s", "-t", "list", "ruleset").stdout


def handles(lab, chain: str) -> list[int]:
    listing = json.loads(lab.node.run("nft", "-j", "list", "chain", "inet", "flock", chain).stdout)
    return [item["rule"]["handle"] for item in listing["nftables"] if "rule" in item]


def children(pid: int) -> list[str]:
    """The child processes of *pid* (the agent): the trace starts none that outlive it."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                comm, _, rest = f.read().partition("(")[2].rpartition(")")
        except (OSError, ValueError):
            continue
        if int(rest.split()[1]) == pid:
            found.append(f"{entry} {comm}")
    return found


def steps(doc: dict, direction: str) -> list[dict]:
    walk = doc["verify"][direction]["kernel"]
    assert walk is not None, doc["verify"]
    return walk["steps"]


def test_verify_through_the_agent(lab):
    agent = lab.agent()
    agent.wait_ready()
    add(lab, "c7600001", "client", {"app": "client"})
    add(lab, "c7600002", "web", {"app": "web"})
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
    wait_for("the NetworkPolicy in force", lambda: explain_only(lab, "default/client", "default/web", "81/TCP")[0] == 1)
    before = kernel(lab)
    assert "flock-trace" not in before

    # Allowed: exit 0, the kernel's way printed under the explanation's, handle by handle.
    code, text, doc = verify(lab, "default/client", "default/web", "80/TCP")
    assert code == 0, text
    assert set(doc) == EXPLAIN_KEYS | {"verify"} and set(doc["verify"]) == VERIFY_KEYS
    v = doc["verify"]
    assert (v["status"], v["why"], v["node"], v["notes"]) == ("agrees", "", "host001", [])
    assert set(v["probe"]) == PROBE_KEYS and (v["probe"]["protocol"], v["probe"]["dport"]) == ("TCP", 80)
    assert set(v["egress"]) == set(v["ingress"]) == CHECK_KEYS
    web_in, policy = doc["ingress"]["trace"]["chain"], doc["ingress"]["trace"]["steps"][0]["verdict"][5:]
    ingress = steps(doc, "ingress")
    assert all(set(s) == STEP_KEYS for s in ingress)
    assert [(s["chain"], s["rule"], s["verdict"]) for s in ingress] == [
        ("ingress", None, f"jump {web_in}"),
        (web_in, 0, f"jump {policy}"),
        (policy, 0, "accept"),
    ]
    assert [s["handle"] for s in ingress[1:]] == [handles(lab, web_in)[0], handles(lab, policy)[0]]
    assert f"kernel agrees: ingress[handle {ingress[0]['handle']}] jump {web_in} → " in text
    assert f"{policy}[0, handle {ingress[2]['handle']}] accept" in text
    assert "kernel   agrees: one TCP packet " in text and "traced on host001" in text

    # Denied: exit 1, the kernel dropping it where the explanation says.
    code, text, doc = verify(lab, "default/client", "default/web", "81/TCP")
    assert code == 1 and doc["verify"]["status"] == "agrees", text
    assert (steps(doc, "ingress")[-1]["chain"], steps(doc, "ingress")[-1]["verdict"]) == (web_in, "drop")
    assert doc["ingress"]["trace"]["steps"][-1]["verdict"] == "drop"

    # A rule put into flock's table by hand, which the explanation cannot know: exit 3, and where they part.
    lab.node.run(
        "nft", "insert", "rule", "inet", "flock", web_in, "meta", "l4proto", "tcp", "th", "dport", "80", "drop"
    )
    inserted = handles(lab, web_in)[0]
    try:
        code, text, doc = verify(lab, "default/client", "default/web", "80/TCP")
    finally:
        lab.node.run("nft", "delete", "rule", "inet", "flock", web_in, "handle", str(inserted))
    assert code == 3, text
    why = (
        f"ingress: the kernel dropped it at {web_in} rule handle {inserted} (not a rule the ruleset in force has) "
        f"where the explanation says it is accepted at {policy}[0]"
    )
    assert doc["verdict"] == "allowed" and doc["verify"]["status"] == "disagrees" and doc["verify"]["why"] == why
    assert f"kernel   DISAGREES: {why}" in text and f"{web_in}[?, handle {inserted}] drop" in text
    assert verify(lab, "default/client", "default/web", "80/TCP")[0] == 0  # the rule gone: they agree again

    # Another node's pods: a source there cannot be verified here; a destination there, its egress can.
    far = pod_object("default", "far", "host002", labels={"app": "far"})
    far["status"] = {"phase": "Running", "podIP": "2001:db8:0:2::5", "podIPs": [{"ip": "2001:db8:0:2::5"}]}
    lab.api.create(PODS, far)
    wait_for("far listed", lambda: explain_only(lab, "default/far", "default/web", "80/TCP")[0] == 1)
    code, text, doc = verify(lab, "default/far", "default/web", "80/TCP")
    assert code == 2 and doc["verdict"] == "denied", text  # web takes clients only
    assert doc["verify"]["why"] == "cannot verify: the source is not on this node; run it on host002"
    assert "kernel   NOT VERIFIED: cannot verify: the source is not on this node; run it on host002" in text
    lab.node.ip("-6", "route", "add", "2001:db8:0:2::/64", "dev", "uplink")  # out by the uplink, as to host002
    code, text, doc = verify(lab, "default/client", "default/far", "80/TCP")
    assert code == 0 and doc["verify"]["status"] == "agrees", text
    assert (doc["verify"]["egress"]["status"], doc["verify"]["ingress"]["status"]) == ("agrees", "not-verified")
    assert doc["verify"]["ingress"]["why"].startswith("ingress not verified: default/far is on host002")
    assert "the egress part was verified" in text

    assert kernel(lab) == before
    assert [c for c in children(agent.proc.pid) if c.split()[1] in ("nft", "nsenter")] == []
    # every packet sent (two per flockctl call here: text and --json) is in the agent's log
    sent = [r for r in agent.records() if r.get("op") == "policy-verify"]
    assert len(sent) == 10 and {r["pod"] for r in sent} == {"default/client"}, sent
    assert sent[0]["flow"].startswith("TCP [") and sent[0]["status"] == "agrees"


def test_an_agent_that_cannot_verify_says_so(tmp_path):
    """Without an agent to ask: exit 2 (unreachable), as every command; a usage error: 2."""
    run = [str(BIN / "flockctl"), "policy", "explain", "a/b", "c/d", "80/TCP", "--verify", "--socket"]
    out = subprocess.run([*run, str(tmp_path / "none.sock")], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "cannot reach flock-agent" in out.stderr


# ---- in process: what the op says when no packet can be sent --------------------------------------------


def _veth(cid: str) -> str:
    return f"flock{fnv1a_32(cid):08x}"


async def test_the_op_says_why_it_cannot_verify(tmp_path):
    inputs, local, mark = PolicyInputs(), MemoryLocalPods(), MemoryWatermark()
    policy = PolicyService(inputs, local, MemoryApplier(), NODE, _veth, watermark=mark)
    state = NodeState(NODE)
    handler = PodHandler(store=MemoryAllocations(), dataplane=MemoryKernel(), pods=None, state=state)  # type: ignore[arg-type]
    ops = AdminOps(state, handler, NetlinkWorker(), tmp_path / "pending", policy=policy)
    peer = Peer(pid=1, uid=0, gid=0)
    ask = {"from": "x/db", "to": "x/web", "port": 80, "protocol": "TCP", "verify": True}
    with trio.fail_after(10):
        doc = await ops.dispatch("policy-explain", ask, peer)
        assert doc["verify"]["status"] == "not-verified" and doc["verify"]["why"].startswith(
            "cannot verify: the explanation cannot tell"
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(policy.run)
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
            gone = str(tmp_path / "no-such-netns")
            local.put(Allocation("c1", "x", "web", "uid", "eth0", gone, ipaddress.IPv6Address("2001:db8::5")))
            await policy.wait_applied(inputs.generation)
            remote = await ops.dispatch("policy-explain", ask, peer)
            here = await ops.dispatch("policy-explain", {**ask, "from": "x/web", "to": "x/db"}, peer)
            without = await ops.dispatch("policy-explain", {**ask, "verify": False}, peer)
            nursery.cancel_scope.cancel()
    assert remote["verdict"] == "denied" and set(remote["verify"]) == VERIFY_KEYS
    assert remote["verify"] == {
        "status": "not-verified",
        "why": "cannot verify: the source is not on this node; run it on host002",
        "node": NODE,
        "probe": None,
        "egress": None,
        "ingress": None,
        "notes": [],
    }
    assert here["verify"]["why"] == "cannot verify: the network namespace of x/web is gone"
    assert "verify" not in without


def test_a_trace_table_left_by_a_killed_agent_goes_when_the_next_one_starts(lab) -> None:
    """An agent killed in the middle of --verify leaves `inet flock-trace` (tracing one flow): the next one
    deletes it before it serves flockctl."""
    lab.node.run("nft", "add", "table", "inet", "flock-trace")
    assert "flock-trace" in lab.node.run("nft", "list", "tables").stdout
    agent = lab.agent()
    agent.wait_ready()
    wait_for("the stale trace table to go", lambda: "flock-trace" not in lab.node.run("nft", "list", "tables").stdout)
