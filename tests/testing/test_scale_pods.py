"""flock.testing.scale: the big cluster's objects are realistic in size and shape,
the same for the same seed, and what the fake API server (and flock's readers) accept."""

from __future__ import annotations

import collections
import ipaddress
import json

import pytest

from flock.apiserver import NAMESPACES, NETWORKPOLICIES, NODECONFIGS, PODS, ObjectStore
from flock.model import NodeConfig, PodInfo
from flock.policy import Namespace, NetworkPolicy, PolicyPod
from flock.testing.scale import (
    LOCAL_CIDR6,
    Churn,
    ClusterShape,
    ScaleCluster,
    average_pod_size,
    compact_size,
    fields_v1,
    resource_of,
)

SMALL = ClusterShape(pods=600, nodes=20, namespaces=8, policies=8)
DOCUMENTATION = ipaddress.ip_network("2001:db8::/32")
UNIQUE_LOCAL = ipaddress.ip_network("fd00::/8")


@pytest.fixture(scope="module")
def cluster() -> ScaleCluster:
    return ScaleCluster(ClusterShape.preset("3k"))


def test_pods_are_5_6_kib_of_json_on_average(cluster: ScaleCluster) -> None:
    sizes = [compact_size(cluster.pod(i)) for i in range(cluster.shape.pods)]
    assert 5.4 * 1024 <= sum(sizes) / len(sizes) <= 5.8 * 1024
    assert min(sizes) >= 4 * 1024
    # Pods with sidecars carry more (each container's spec, managedFields and status).
    assert sum(4096 <= s <= 6144 for s in sizes) / len(sizes) >= 0.85
    assert max(sizes) <= 9 * 1024
    report = average_pod_size(cluster, 300)
    assert report["n"] == 300 and 5.3 * 1024 <= report["mean"] <= 5.9 * 1024


def test_the_same_seed_makes_the_same_objects_and_another_seed_others() -> None:
    one, two = ScaleCluster(SMALL), ScaleCluster(SMALL)
    assert [json.dumps(o) for o in one.objects()] == [json.dumps(o) for o in two.objects()]
    other = ScaleCluster(ClusterShape(pods=600, nodes=20, namespaces=8, policies=8, seed=2))
    assert json.dumps(other.pod(1)) != json.dumps(one.pod(1))
    # Made on demand in any order: the same pod whatever came before.
    assert json.dumps(one.pod(599)) == json.dumps(ScaleCluster(SMALL).pod(599))


def test_presets_keep_30_pods_a_node_and_one_policy_a_namespace() -> None:
    for name, pods in (("3k", 3_000), ("30k", 30_000), ("150k", 150_000)):
        shape = ClusterShape.preset(name)
        assert (shape.pods, shape.pods // shape.nodes, shape.pods // shape.namespaces) == (pods, 30, 75)
        assert shape.policies == shape.namespaces
    assert ClusterShape.preset("3k", seed=5).seed == 5
    with pytest.raises(ValueError, match="unknown preset"):
        ClusterShape.preset("1m")


def test_layout_spreads_pods_over_nodes_and_keeps_addresses_in_reserved_ranges(cluster: ScaleCluster) -> None:
    per_node = collections.Counter(cluster.node_of(i) for i in range(cluster.shape.pods))
    assert set(per_node.values()) == {30}
    local = cluster.local_pods()
    assert len(local) == 30 and all(cluster.is_local(i) for i in local)
    assert len({cluster.app_of(i).namespace for i in local}) > 20  # the node's pods come from many namespaces
    names = set()
    for i in range(cluster.shape.pods):
        pod = cluster.pod(i)
        meta, spec, status = pod["metadata"], pod["spec"], pod["status"]
        names.add((meta["namespace"], meta["name"]))
        assert spec["nodeName"] == cluster.node_name(cluster.node_of(i))
        if i in local:
            assert status["phase"] == "Pending" and "podIPs" not in status
            continue
        assert status["phase"] == "Running"
        for ip in status["podIPs"]:
            address = ipaddress.ip_address(ip["ip"])
            assert address in ipaddress.ip_network(cluster.node_cidr6(cluster.node_of(i)))
            assert address in UNIQUE_LOCAL
        assert ipaddress.ip_address(status["hostIP"]) in UNIQUE_LOCAL
    assert len(names) == cluster.shape.pods
    assert cluster.node_cidr6(cluster.shape.local_node) == LOCAL_CIDR6
    running = cluster.running_status(local[0], ["2001:db8:0:1::a"])
    assert running["phase"] == "Running" and running["podIPs"] == [{"ip": "2001:db8:0:1::a"}]
    assert ipaddress.ip_address(running["podIP"]) in DOCUMENTATION


def test_pods_look_like_replicas_as_kube_apiserver_returns_them(cluster: ScaleCluster) -> None:
    kinds = collections.Counter()
    containers = collections.Counter()
    for i in range(0, cluster.shape.pods, 7):
        pod = cluster.pod(i)
        meta, spec = pod["metadata"], pod["spec"]
        owner = meta["ownerReferences"][0]
        kinds[owner["kind"]] += 1
        containers[len(spec["containers"])] += 1
        assert owner["controller"] is True
        assert {"app", "version", "tier"} <= meta["labels"].keys()
        if owner["kind"] == "ReplicaSet":
            assert owner["name"] == f"{meta['labels']['app']}-{meta['labels']['pod-template-hash']}"
            assert meta["name"].startswith(meta["generateName"])
        managers = [(m["manager"], m.get("subresource")) for m in meta["managedFields"]]
        assert managers == [("kube-controller-manager", None), ("kubelet", "status")]
        controller = meta["managedFields"][0]["fieldsV1"]
        for c in spec["containers"]:
            assert f'k:{{"name":"{c["name"]}"}}' in controller["f:spec"]["f:containers"]
        # Admission adds the token volume and tolerations: not the controller's fields.
        assert "f:volumes" not in controller["f:spec"] and "f:tolerations" not in controller["f:spec"]
        assert spec["volumes"][0]["projected"]["sources"][0]["serviceAccountToken"]["path"] == "token"
        assert spec["tolerations"]
        if pod["status"]["phase"] == "Running":
            for cs in pod["status"]["containerStatuses"]:
                assert cs["started"] and cs["containerID"].startswith("containerd://")
                assert "@sha256:" in cs["imageID"] and "running" in cs["state"]
    assert set(kinds) >= {"ReplicaSet", "StatefulSet"}
    assert set(containers) == {1, 2, 3} and containers[1] > containers[2] > containers[3]


def test_fields_v1_keys_lists_as_server_side_apply_does() -> None:
    tree = fields_v1(
        {
            "containers": [{"name": "app", "ports": [{"containerPort": 80, "protocol": "TCP"}], "args": ["-v"]}],
            "labels": {"app": "web"},
            "securityContext": {},
        }
    )
    assert tree == {
        "f:containers": {
            'k:{"name":"app"}': {
                ".": {},
                "f:name": {},
                "f:ports": {
                    ".": {},
                    'k:{"containerPort":80,"protocol":"TCP"}': {".": {}, "f:containerPort": {}, "f:protocol": {}},
                },
                "f:args": {},
            }
        },
        "f:labels": {".": {}, "f:app": {}},
        "f:securityContext": {},
    }


def test_every_object_passes_admission_and_flocks_readers() -> None:
    cluster = ScaleCluster(SMALL)
    store = ObjectStore()
    counts = collections.Counter()
    for obj in cluster.objects():
        created = store.create(resource_of(obj), obj)
        counts[obj["kind"]] += 1
        if obj["kind"] == "Pod":
            PodInfo.from_object(created)
            PolicyPod.from_object(created)
        elif obj["kind"] == "NetworkPolicy":
            NetworkPolicy.from_object(created)
        elif obj["kind"] == "Namespace":
            Namespace.from_object(created)
            assert created["metadata"]["labels"] == obj["metadata"]["labels"]  # the name label is already there
        else:
            NodeConfig.from_object(created)
    assert counts == {"Namespace": 8, "NodeConfig": 20, "NetworkPolicy": 8, "Pod": 600}
    assert len(store.list(NAMESPACES)[0]) == 8 and len(store.list(NODECONFIGS)[0]) == 20
    policies, _ = store.list(NETWORKPOLICIES)
    assert len({(p["metadata"]["namespace"], p["metadata"]["name"]) for p in policies}) == 8
    named = [r for p in policies for rule in p["spec"]["ingress"] for r in rule.get("ports", [])]
    assert any(isinstance(r["port"], str) for r in named) and any(isinstance(r["port"], int) for r in named)
    local = cluster.local_pods()[0]
    store.create(NETWORKPOLICIES, cluster.selecting_policy(local, "scale-bench-0"))


def test_churn_changes_remote_pods_and_applies_to_the_store() -> None:
    cluster = ScaleCluster(SMALL)
    store = ObjectStore()
    for obj in cluster.objects():
        store.create(resource_of(obj), obj)
    churn = Churn(cluster)
    local = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in map(cluster.pod, cluster.local_pods())}
    kinds = collections.Counter()
    for _ in range(400):
        change = churn.next()
        kinds[change.kind] += 1
        assert (change.namespace, change.name) not in local
        methods = [method for method, *_ in change.requests()]
        if change.kind == "labels":
            assert methods == ["PATCH"]
            store.patch(PODS, change.name, change.body, change.namespace)
        elif change.kind == "status":
            assert methods == ["PATCH"]
            # The server's merge patch of the status: these keys are replaced whole (lists).
            status = store.get(PODS, change.name, change.namespace)["status"] | change.body["status"]
            store.set_status(PODS, change.name, status, change.namespace)
        else:
            assert methods == ["DELETE", "POST"]
            old = store.delete(PODS, change.name, change.namespace)
            new = store.create(PODS, change.body)
            assert new["metadata"]["uid"] != old["metadata"]["uid"]
            assert new["status"]["podIPs"] != old["status"]["podIPs"]
    assert set(kinds) == {"labels", "status", "recreate"}
    assert len(store.list(PODS)[0]) == 600  # re-creates replace: every pod is still there, once
    # Deterministic: a second churn over the same cluster makes the same changes.
    again = Churn(ScaleCluster(SMALL))
    first = Churn(ScaleCluster(SMALL))
    for _ in range(50):
        assert again.next() == first.next()
