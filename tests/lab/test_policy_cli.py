"""The lab's policy commands without a lab: ``apply`` (ClusterNetworkPolicy too),
``delete``, ``node label``, the Node objects ``up`` makes, ``matrix --to`` and
the node port servers, against the fake API server's store in this process."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import trio

import flock.lab._policy as lab_policy
from flock.apiserver import (
    CLUSTERNETWORKPOLICIES,
    NAMESPACES,
    NETWORKPOLICIES,
    NODES,
    ObjectStore,
    Resource,
    StatusError,
)
from flock.lab._api import ApiError
from flock.lab._lifecycle import ensure_node, process_specs
from flock.lab._plan import NODE_PORTS, LabPlan
from flock.lab._ports import PortSpec
from flock.lab._probe import ProbeResult, truth_tables
from flock.lab._state import LabState
from flock.lab.cli import build_parser, main
from flock.testing.netpol import MODEL, Reachability
from flock.testing.netpol import NODES as MODEL_NODES


class StoreApi:
    """The lab's API client (:class:`flock.lab._api.ApiClient`) over an in-process store:
    what the lab's API server would answer, its refusals as ApiError."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def _call(self, method: str, fn: Any, *args: Any) -> dict[str, Any]:
        try:
            return fn(*args)
        except StatusError as exc:
            raise ApiError(method, "/", exc.code, json.dumps(exc.status()).encode()) from None

    async def create(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", self.store.create, res, obj, obj["metadata"].get("namespace"))

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self._call("GET", self.store.get, res, name, namespace)

    async def replace(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        return self._call("PUT", self.store.update, res, obj, obj["metadata"].get("namespace"))

    async def patch(
        self, res: Resource, name: str, patch: dict[str, Any], namespace: str | None = None, subresource: str = ""
    ) -> dict[str, Any]:
        if subresource == "status":
            return self._call("PATCH", self.store.set_status, res, name, patch["status"], namespace)
        return self._call("PATCH", self.store.patch, res, name, patch, namespace)

    async def delete(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self._call("DELETE", self.store.delete, res, name, namespace)


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LabPlan, ObjectStore]]:
    """A lab directory whose commands reach an in-process store instead of the lab's API server."""
    plan = LabPlan.make(tmp_path, 2)
    LabState(plan, False, phase="up").save()
    store = ObjectStore()
    monkeypatch.setattr(lab_policy, "api_client", lambda _plan: StoreApi(store))
    yield plan, store


def run(plan: LabPlan, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([*args, "--dir", str(plan.dir)])
    return code, out.getvalue(), err.getvalue()


CNP = """
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: deny-y}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {ns: x}}}
  ingress:
  - action: Deny
    from: [{namespaces: {matchLabels: {ns: y}}}]
  egress:
  - action: Deny
    to: [{networks: ["2001:db8:ffff::102/128", "192.0.2.11/32"]}, {nodes: {matchLabels: {zone: a}}}]
    protocols: [{tcp: {destinationPort: {range: {start: 80, end: 81}}}}, {udp: {destinationPort: {number: 81}}}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: x}
spec: {podSelector: {}}
---
apiVersion: v1
kind: Namespace
metadata: {name: x, labels: {ns: x}}
"""


def test_apply_creates_and_replaces_cluster_network_policies(lab: tuple[LabPlan, ObjectStore], tmp_path: Path) -> None:
    plan, store = lab
    path = tmp_path / "p.yaml"
    path.write_text(CNP)
    code, out, err = run(plan, "apply", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["applied"] == [
        {"object": "clusternetworkpolicy.policy.networking.k8s.io/deny-y", "action": "created"},
        {"object": "networkpolicy.networking.k8s.io/x/deny", "action": "created"},
        {"object": "namespace/x", "action": "created"},
    ]
    stored = store.get(CLUSTERNETWORKPOLICIES, "deny-y")
    assert stored["spec"]["tier"] == "Admin" and "namespace" not in stored["metadata"]
    code, out, _ = run(plan, "apply", str(path))
    assert code == 0 and "clusternetworkpolicy.policy.networking.k8s.io/deny-y unchanged" in out
    path.write_text(CNP.replace("priority: 10", "priority: 20").replace("tier: Admin", "tier: Baseline"))
    code, out, _ = run(plan, "apply", str(path))
    assert code == 0 and "clusternetworkpolicy.policy.networking.k8s.io/deny-y configured" in out
    assert store.get(CLUSTERNETWORKPOLICIES, "deny-y")["spec"]["priority"] == 20

    code, out, _ = run(plan, "delete", "cnp", "deny-y")
    assert (code, out.strip()) == (0, "clusternetworkpolicy.policy.networking.k8s.io/deny-y deleted")
    with pytest.raises(StatusError):
        store.get(CLUSTERNETWORKPOLICIES, "deny-y")
    for kind in ("clusternetworkpolicy", "clusternetworkpolicies"):
        path.write_text(CNP)
        assert run(plan, "apply", str(path))[0] == 0
        assert run(plan, "delete", kind, "deny-y")[0] == 0
    code, _, err = run(plan, "delete", "cnp", "x/deny-y")
    assert code == 1 and "expected NAME (it is cluster-scoped)" in err
    code, _, err = run(plan, "delete", "cnp", "gone")
    assert code == 1 and "HTTP 404" in err
    code, _, err = run(plan, "delete", "pod", "x/a")
    assert code == 1 and "clusternetworkpolicy NAME" in err
    assert store.get(NETWORKPOLICIES, "deny", "x") and store.get(NAMESPACES, "x")


def test_apply_refusals_print_the_api_servers_message(lab: tuple[LabPlan, ObjectStore], tmp_path: Path) -> None:
    plan, store = lab
    path = tmp_path / "bad.yaml"
    path.write_text(CNP.split("---")[0].replace("priority: 10", "priority: 1001"))
    code, out, err = run(plan, "apply", str(path), "--json")
    assert code == 1
    assert "HTTP 422" in err and "spec.priority" in err and "deny-y" in err, err
    assert "spec.priority" in json.loads(out)["error"]
    path.write_text(CNP.split("---")[0].replace("action: Deny", "action: Drop", 1))
    code, _, err = run(plan, "apply", str(path))
    assert code == 1 and "HTTP 422" in err and "action" in err, err
    # An unknown kind or version is refused before anything is written.
    path.write_text(CNP.replace("v1alpha2", "v1alpha1"))
    code, _, err = run(plan, "apply", str(path))
    assert code == 1 and "policy.networking.k8s.io/v1alpha2 ClusterNetworkPolicy" in err
    with pytest.raises(StatusError):
        store.get(NETWORKPOLICIES, "deny", "x")


def test_nodes_made_by_up_and_their_labels(lab: tuple[LabPlan, ObjectStore]) -> None:
    plan, store = lab
    api = StoreApi(store)

    async def ensure_all() -> None:
        for node in plan.nodes:
            await ensure_node(api, node)  # type: ignore[arg-type]

    trio.run(ensure_all)
    node1 = store.get(NODES, "node1")
    assert node1["metadata"]["labels"] == {"kubernetes.io/hostname": "node1", "kubernetes.io/os": "linux"}
    assert node1["status"]["addresses"] == [
        {"type": "InternalIP", "address": "2001:db8:ffff::101"},
        {"type": "InternalIP", "address": "192.0.2.11"},
        {"type": "Hostname", "address": "node1"},
    ]
    assert store.get(NODES, "node2")["status"]["addresses"][1] == {"type": "InternalIP", "address": "192.0.2.12"}

    code, out, err = run(plan, "node", "label", "node1", "zone=a", "rack=r1", "--json")
    assert code == 0, err
    assert json.loads(out)["labels"] == {
        "kubernetes.io/hostname": "node1",
        "kubernetes.io/os": "linux",
        "zone": "a",
        "rack": "r1",
    }
    code, out, _ = run(plan, "node", "label", "node1", "zone=b", "--remove", "rack")
    assert (
        code == 0 and out.strip() == "node/node1 labeled: kubernetes.io/hostname=node1, kubernetes.io/os=linux, zone=b"
    )
    # up again (over the same API server): the node's own labels and addresses back, others kept.
    store.patch(NODES, "node1", {"metadata": {"labels": {"kubernetes.io/os": "plan9"}}, "status": {"addresses": []}})
    version = store.resource_version
    trio.run(ensure_all)
    again = store.get(NODES, "node1")
    assert again["metadata"]["labels"]["kubernetes.io/os"] == "linux" and again["metadata"]["labels"]["zone"] == "b"
    assert again["status"]["addresses"] == node1["status"]["addresses"]
    version = store.resource_version
    trio.run(ensure_all)
    assert store.resource_version == version  # nothing left to change: no write

    code, _, err = run(plan, "node", "label", "node9", "zone=a")
    assert code == 1 and "no such node (nodes: node1, node2)" in err
    code, _, err = run(plan, "node", "label", "node1")
    assert code == 1 and "nothing to change" in err
    code, _, err = run(plan, "node", "label", "node1", "zone")
    assert code == 1 and "KEY=VALUE" in err


def test_matrix_to_targets_and_the_node_port_servers(tmp_path: Path) -> None:
    args = build_parser().parse_args(["matrix", "--to", "node1", "--to", "2001:db8:ffff::102", "--port", "80/TCP"])
    assert args.to == ["node1", "2001:db8:ffff::102"] and args.port == ["80/TCP"]
    assert build_parser().parse_args(["matrix"]).to == []

    class Pod:
        def __init__(self, key: str) -> None:
            self.key = key

    results = [
        ProbeResult("x/a", "node1", "80/TCP", 6, True, "connected"),
        ProbeResult("x/a", "node2", "80/TCP", 6, False, "timeout"),
    ]
    text = truth_tables([Pod("x/a")], [PortSpec(80)], results, 6, ["node1", "node2"])  # type: ignore[list-item]
    rows = text.splitlines()
    assert rows[1].split() == ["-", "node1", "node2"] and rows[2].split() == ["x/a", ".", "X"]

    plan = LabPlan.make(tmp_path, 2)
    for nodes in (True, False):  # the image lab's nodes serve the same ports
        specs = {s.name: s for s in process_specs(plan, nodes=nodes)}
        serve = specs["serve-node2"]
        assert serve.argv[:4] == ("ip", "netns", "exec", plan.node("node2").netns)
        assert serve.argv[-10:] == (
            "--name",
            "node2",
            "--tcp",
            "80",
            "--tcp",
            "81",
            "--udp",
            "80",
            "--udp",
            "81",
        )
    assert NODE_PORTS == ("80/TCP", "81/TCP", "80/UDP", "81/UDP")


def test_reachability_to_other_targets_than_the_pods() -> None:
    want = Reachability(MODEL.pods, True, targets=MODEL_NODES)
    want.expect_all_egress("x/a", False)
    want.expect("y/b", "node2", False)
    results = [
        {"from": s, "to": d, "port": "80/TCP", "family": 4, "connected": want.expected(s, d)}
        for s in MODEL.pods
        for d in MODEL_NODES
    ]
    assert want.mismatches(results, "80/TCP", 4) == []
    results[0] = {**results[0], "connected": True}  # x/a → node1
    assert want.mismatches(results, "80/TCP", 4) == ["x/a → node1 80/TCP IPv4: expected blocked"]
    rows = want.table(results, "80/TCP", 4).splitlines()
    assert rows[1].split() == ["node1", "node2", "|", "node1", "node2"]
    assert rows[2].split() == ["x/a", "X", "X", "|", "!.", "X"]
