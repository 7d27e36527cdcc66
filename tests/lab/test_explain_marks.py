"""``flock-lab explain`` and the matrix's marks without a lab: which agent is asked, what
a blocked cell is marked with (from explanations as flock.policy makes them), the legend,
and the e2e's comparison of explanations with probes (flock.testing.netpol).  The same
against a running lab: tests/lab/test_explain_lab.py (stage netpol)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flock.lab._explain import Answer, blocked_by, node_to_ask
from flock.lab._plan import LabPlan
from flock.lab._pods import LabPod
from flock.lab._policy_cli import EXIT_ERROR
from flock.lab._ports import PortSpec
from flock.lab._probe import ProbeResult, truth_tables
from flock.lab._state import LabError
from flock.lab.cli import build_parser
from flock.policy import DirectionVerdict, Explanation, Party, PathStep, Protocol, Query, Verdict
from flock.testing.netpol import explain_drift, verify_pairs


def lab_pod(key: str, node: str, *addresses: str) -> LabPod:
    namespace, name = key.split("/")
    ips = [{"address": f"{a}/{128 if ':' in a else 32}"} for a in addresses]
    return LabPod(namespace, name, node, f"uid-{name}", f"c-{name}", f"ns-{name}", {}, {"ips": ips})


PODS = [
    lab_pod("x/a", "node1", "2001:db8:0:1::a", "192.0.2.201"),
    lab_pod("y/b", "node2", "2001:db8:0:2::b"),
]


def test_the_node_asked_is_the_source_pods_else_the_destination_pods(tmp_path: Path) -> None:
    plan = LabPlan.make(tmp_path, 2)
    ask = lambda src, dst: node_to_ask(plan, PODS, src, dst).name  # noqa: E731
    assert ask("x/a", "y/b") == "node1" and ask("y/b", "x/a") == "node2"
    assert ask("2001:db8:0:2::b", "x/a") == "node2"  # a pod's address is that pod
    assert ask("node1", "y/b") == "node2" and ask("2001:db8:ffff::101", "y/b") == "node2"
    assert ask("x/a", "node2") == "node1" and ask("192.0.2.201", "2001:db8:ffff::102") == "node1"
    assert ask("node2", "2001:db8:1::1") == "node2" and ask("2001:db8:1::1", "node2") == "node2"
    assert ask("2001:db8:1::1", "2001:db8:1::2") == "node1"  # nothing of the lab: the first node
    assert ask("w/unknown", "y/b") == "node2"  # a pod the lab did not make: the agent may know it
    with pytest.raises(LabError, match="expected NS/POD, a node name, internet or an address"):
        ask("x/a", "node9")


def test_explain_arguments() -> None:
    args = build_parser().parse_args(["explain", "x/a", "y/b", "81/UDP", "--family", "4", "--json"])
    assert (args.source, args.target, args.port, args.family, args.json) == ("x/a", "y/b", "81/UDP", 4, True)
    assert build_parser().parse_args(["explain", "x/a", "y/b", "80/TCP"]).family is None
    assert build_parser().parse_args(["matrix", "--explain-all"]).explain_all
    assert Verdict.UNKNOWN.exit_code == EXIT_ERROR  # flock-lab's "could not" is flockctl's "cannot tell"


def answer(
    egress: tuple[PathStep, ...] | None, ingress: tuple[PathStep, ...] | None, verdict: Verdict, why: str = ""
) -> Answer:
    """An explanation as flock.policy makes it (a direction denied where its path is given)."""
    query = Query("x/a", "y/b", 80, Protocol.TCP, 6)

    def direction(name: str, path: tuple[PathStep, ...] | None) -> DirectionVerdict:
        if path is None:
            return DirectionVerdict(name, None, "node1", "forward", True, "default", (PathStep("none", "Allow"),))
        return DirectionVerdict(name, "x/a", "node1", "forward", False, path[-1].tier, path)

    doc = Explanation(
        query, Party("x/a"), Party("y/b"), verdict, why, 6, direction("egress", egress), direction("ingress", ingress)
    ).to_json()
    return Answer("node1", doc)


NP_DENY = (PathStep("NetworkPolicy", "Deny", isolated_by=("y/deny",)),)
CNP_DENY = (
    PathStep("Admin", "Pass", "first", 5, "pass-all"),
    PathStep("Admin", "Deny", "guard", 10, "to-db", 0),
)


def test_blocked_by_names_the_policy_and_rule_that_denied() -> None:
    assert (
        blocked_by(answer(None, NP_DENY, Verdict.DENIED)) == "ingress NetworkPolicy y/deny (isolates, no rule allows)"
    )
    assert (
        blocked_by(answer(CNP_DENY, None, Verdict.DENIED))
        == "egress Admin ClusterNetworkPolicy guard rule to-db (Deny)"
    )
    two = (PathStep("NetworkPolicy", "NoMatch", "y/a"), PathStep("NetworkPolicy", "Deny", isolated_by=("y/a", "y/b")))
    assert blocked_by(answer(CNP_DENY, two, Verdict.DENIED)) == (
        "egress Admin ClusterNetworkPolicy guard rule to-db (Deny); "
        "ingress NetworkPolicies y/a, y/b (isolate, no rule allows)"
    )
    closed = (PathStep("Baseline", "Deny", "nodes", 3, "no-nodes", detail="fails closed: Nodes are not listed"),)
    assert blocked_by(answer(closed, None, Verdict.DENIED)) == (
        "egress Baseline ClusterNetworkPolicy nodes rule no-nodes (Deny; fails closed: Nodes are not listed)"
    )
    # what an explanation says when it does not say denied: a disagreement the legend shows
    assert blocked_by(answer(None, None, Verdict.ALLOWED)) == (
        "explain says allowed (the agent on node1 disagrees with the probe)"
    )
    assert blocked_by(answer(None, None, Verdict.UNKNOWN, "pod y/b is unknown")) == (
        "explain cannot tell: pod y/b is unknown"
    )
    assert blocked_by("explain: cannot reach the agent on node2: refused") == (
        "explain failed: explain: cannot reach the agent on node2: refused"
    )


class Pod:
    def __init__(self, key: str) -> None:
        self.key = key


def test_blocked_cells_carry_a_footnote_and_the_table_a_legend() -> None:
    pods = [Pod("x/a"), Pod("y/b"), Pod("z/c")]
    results = [
        ProbeResult(s.key, d.key, port, 6, s is d or (s.key, d.key) == ("y/b", "x/a"), "timeout")
        for port in ("80/TCP", "81/UDP")
        for s in pods
        for d in pods
    ]
    causes = {
        (r.source, r.target, r.port): "ingress NetworkPolicy z/deny (isolates, no rule allows)"
        if r.target == "z/c"
        else "egress Admin ClusterNetworkPolicy guard rule to-db (Deny)"
        for r in results
        if not r.connected
    }
    del causes[("y/b", "z/c", "81/UDP")]  # not explained: a bare X
    text = truth_tables(pods, [PortSpec(80), PortSpec(81, "UDP")], results, 6, None, causes)  # type: ignore[arg-type]
    rows = text.splitlines()
    assert rows[0].startswith("reachability on 80/TCP, IPv6")
    assert rows[1].split() == ["-", "x/a", "y/b", "z/c"]
    assert [r.split() for r in rows[2:5]] == [
        ["x/a", ".", "X1", "X2"],
        ["y/b", ".", ".", "X2"],
        ["z/c", "X1", "X1", "."],
    ]
    assert rows[5:8] == [
        "blocked by (as the agents explain it):",
        "   1: egress Admin ClusterNetworkPolicy guard rule to-db (Deny)",
        "   2: ingress NetworkPolicy z/deny (isolates, no rule allows)",
    ]
    second = rows[9:]
    assert second[0].startswith("reachability on 81/UDP, IPv6")
    assert [r.split() for r in second[2:5]] == [
        ["x/a", ".", "X1", "X2"],
        ["y/b", ".", ".", "X"],
        ["z/c", "X1", "X1", "."],
    ]
    assert second[5] == "blocked by (as the agents explain it):"  # the same numbers in every table
    assert rows[-1] == "18 probes: 8 connected, 10 blocked, 0 errors"
    # without explanations: the table as before
    plain = truth_tables(pods, [PortSpec(80)], results, 6).splitlines()  # type: ignore[arg-type]
    assert plain[2].split() == ["x/a", ".", "X", "X"] and "blocked by" not in "\n".join(plain)


def result(source: str, target: str, connected: bool, doc: dict[str, Any] | None) -> dict[str, Any]:
    r: dict[str, Any] = {"from": source, "to": target, "port": "80/TCP", "family": 6, "connected": connected}
    if doc is not None:
        r["explanation"] = doc
    return r


def test_explanations_that_drift_from_the_probes_are_named_with_their_path() -> None:
    denied = answer(None, NP_DENY, Verdict.DENIED).to_json()
    allowed = answer(None, None, Verdict.ALLOWED).to_json()
    assert explain_drift([result("x/a", "y/b", False, denied), result("x/a", "x/a", True, allowed)]) == []
    drift = explain_drift(
        [
            result("x/a", "y/b", True, denied),
            result("x/a", "y/c", False, allowed),
            result("x/a", "z/c", False, {"error": "explain: cannot reach the agent on node1"}),
            result("x/a", "z/b", False, None),
        ]
    )
    assert drift[0].splitlines()[0] == "x/a → y/b 80/TCP IPv6: probe connected, explain denied (the agent on node1)"
    assert "isolated by y/deny: no rule allows it" in drift[0]  # flockctl's text, the path included
    assert drift[1].startswith("x/a → y/c 80/TCP IPv6: probe blocked, explain allowed")
    assert drift[2] == "x/a → z/c 80/TCP IPv6: probe blocked, not explained: explain: cannot reach the agent on node1"
    assert drift[3] == ("x/a → z/b 80/TCP IPv6: probe blocked, not explained: the matrix gave no explanation")


def test_verify_takes_one_blocked_and_one_allowed_pair_whose_source_the_asked_agent_holds() -> None:
    def doc(verdict: Verdict, asked: str) -> dict[str, Any]:
        d = answer(None, NP_DENY, verdict).to_json()
        d["from"] = {**d["from"], "kind": "pod", "node": "node1"}
        return {**d, "asked": asked}

    results = [
        result("x/a", "x/a", True, doc(Verdict.ALLOWED, "node1")),  # itself: never leaves its namespace
        result("x/a", "y/b", False, doc(Verdict.DENIED, "node2")),  # asked another node
        result("x/a", "y/c", False, doc(Verdict.DENIED, "node1")),
        result("x/a", "z/a", True, doc(Verdict.ALLOWED, "node1")),
        result("x/a", "z/b", True, doc(Verdict.ALLOWED, "node1")),
    ]
    assert [(r["to"], r["connected"]) for r in verify_pairs(results)] == [("y/c", False), ("z/a", True)]
    assert verify_pairs(results[:2]) == []
