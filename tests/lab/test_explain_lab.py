"""``flock-lab explain`` and the matrix's marks on the netpol stage's lab (the upstream model:
x, y, z × a, b, c; a and c on node1, b on node2): the agent of the node that matters is
asked over its admin socket, its answer printed as flockctl prints it, exit codes as
flockctl's; the matrix names what blocked each blocked cell."""

from __future__ import annotations

import json
from typing import Any

import pytest

from flock.testing.netpol import Lab

pytestmark = pytest.mark.netpol


def objects() -> tuple[dict[str, Any], dict[str, Any]]:
    deny = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": "y", "name": "deny"},
        "spec": {"podSelector": {}},
    }
    guard = {
        "apiVersion": "policy.networking.k8s.io/v1alpha2",
        "kind": "ClusterNetworkPolicy",
        "metadata": {"name": "guard"},
        "spec": {
            "tier": "Admin",
            "priority": 10,
            "subject": {"namespaces": {"matchLabels": {"ns": "x"}}},
            "egress": [{"name": "to-z", "action": "Deny", "to": [{"namespaces": {"matchLabels": {"ns": "z"}}}]}],
        },
    }
    return deny, guard


def test_explain_asks_the_agent_that_matters_and_exits_as_flockctl(model: Lab) -> None:
    model.apply(*objects())
    denied = model.cli("explain", "x/a", "y/b", "80/TCP")  # flock-lab as its own process: the exit code a user sees
    assert denied.returncode == 1, denied
    lines = denied.stdout.splitlines()
    assert lines[0].startswith("from     x/a (pod on node1, ")
    assert "isolated by y/deny: no rule allows it" in denied.stdout
    assert "the ruleset in force on node1 agrees" in denied.stdout  # x/a's egress: checked against the kernel's
    assert lines[-1] == "asked    the agent on node1"

    doc = json.loads(model.run("explain", "y/b", "x/a", "81/UDP", "--family", "4", "--json")[1])
    assert (doc["asked"], doc["verdict"], doc["family"], doc["protocol"]) == ("node2", "allowed", 4, "UDP")
    assert doc["egress"]["applied"] == "allowed"  # y/b is node2's: its ruleset in force was asked

    doc = json.loads(model.run("explain", "x/c", "z/b", "80/TCP", "--json")[1])
    (step,) = [s for s in doc["egress"]["path"] if s["action"] == "Deny"]
    assert (step["tier"], step["policy"], step["rule"]) == ("Admin", "guard", "to-z")

    # an address as the source: the destination pod's node is asked
    node1 = model.node_address("node1", 6)
    code, out = model.run("explain", node1, "y/b", "80/TCP", "--json")
    assert code == 1 and json.loads(out)["asked"] == "node2"
    assert model.run("explain", "x/a", "x/b", "80/TCP")[0] == 0

    code, out = model.run("explain", "x/a", "w/nobody", "80/TCP")  # the agent cannot tell: exit 2, why printed
    assert code == 2 and "CANNOT TELL: pod w/nobody is unknown" in out
    bad = model.cli("explain", "x/a", "node9", "80/TCP")
    assert bad.returncode == 2 and "expected NS/POD, a node name, internet or an address" in bad.stderr


def test_the_matrix_marks_each_blocked_cell_with_what_blocked_it(model: Lab) -> None:
    model.apply(*objects())
    model.forget_udp_flows()
    text = model.ok("matrix", "--port", "80/TCP")
    rows = text.splitlines()
    assert rows[1].split() == ["-", *(f"{ns}/{p}" for ns in "xyz" for p in "abc")]
    assert rows[2].split() == ["x/a", ".", ".", ".", "X1", "X1", "X1", "X2", "X2", "X2"]
    assert rows[6].split() == ["y/b", ".", ".", ".", "X1", ".", "X1", ".", ".", "."]
    assert rows[11:14] == [
        "blocked by (as the agents explain it):",
        "   1: ingress NetworkPolicy y/deny (isolates, no rule allows)",
        "   2: egress Admin ClusterNetworkPolicy guard rule to-z (Deny)",
    ]
    assert rows[-1] == "81 probes: 48 connected, 33 blocked, 0 errors"

    results = model.matrix(["81/UDP"], family=4)
    by_pair = {(r["from"], r["to"]): r for r in results}
    assert by_pair[("x/b", "z/c")]["blocked_by"] == "egress Admin ClusterNetworkPolicy guard rule to-z (Deny)"
    assert by_pair[("z/a", "y/c")]["blocked_by"] == "ingress NetworkPolicy y/deny (isolates, no rule allows)"
    assert all(("blocked_by" in r) == (not r["connected"]) for r in results)

    every = model.matrix(["80/TCP"], explain=True)
    asked = {(r["from"], r["explanation"]["asked"]) for r in every}
    assert asked == {(f"{ns}/{p}", "node2" if p == "b" else "node1") for ns in "xyz" for p in "abc"}
