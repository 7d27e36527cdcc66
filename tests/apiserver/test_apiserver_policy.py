"""The fake API server's NetworkPolicy, Namespace and cluster-wide Pod resources,
through the real kubernetes-asyncio client over HTTP (as the agent's watchers use them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from kubernetes_asyncio.client import CoreV1Api, NetworkingV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from flock.apiserver import (
    NAME_LABEL,
    NAMESPACES,
    NETWORKPOLICIES,
    PODS,
    ApiServer,
    namespace_object,
    network_policy_object,
    pod_object,
)
from flock.watchers import KubeClient, open_kube_client


async def run_scenario(api: ApiServer, tmp_path: Path, scenario: Any) -> Any:
    async with open_kube_client(api.write_kubeconfig(tmp_path / "kubeconfig")) as kube:
        return await kube.bridge.call(scenario, kube)


def status_of(exc: ApiException) -> dict[str, Any]:
    return json.loads(exc.body)


DENY_ALL: dict[str, Any] = {"podSelector": {}}
ALLOW_80: dict[str, Any] = {
    "podSelector": {"matchLabels": {"pod": "a"}},
    "ingress": [
        {
            "from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {}}],
            "ports": [{"port": 80}, {"port": "serve-81-udp", "protocol": "UDP"}],
        }
    ],
    "egress": [{"to": [{"ipBlock": {"cidr": "2001:db8::/32", "except": ["2001:db8:1::/48"]}}]}],
}


async def test_namespaces_get_their_name_label_and_keep_it(tmp_path: Path) -> None:
    async def scenario(kube: KubeClient) -> None:
        core = CoreV1Api(kube.api_client)
        made = await core.create_namespace(namespace_object("x", {"ns": "x"}))
        assert made.metadata.labels == {"ns": "x", NAME_LABEL: "x"}
        assert made.status.phase == "Active" and made.spec.finalizers == ["kubernetes"]
        patched = await core.patch_namespace("x", {"metadata": {"labels": {"ns": None, "team": "blue"}}})
        assert patched.metadata.labels == {"team": "blue", NAME_LABEL: "x"}
        # A client cannot take the label away or change it: the server sets it again.
        body = namespace_object("x", {NAME_LABEL: "other"})
        body["metadata"]["resourceVersion"] = patched.metadata.resource_version
        replaced = await core.replace_namespace("x", body)
        assert replaced.metadata.labels == {NAME_LABEL: "x"}
        await core.create_namespace(namespace_object("y"))
        listed = await core.list_namespace()
        assert [n.metadata.name for n in listed.items] == ["x", "y"]
        assert [n.metadata.name for n in (await core.list_namespace(field_selector="metadata.name=y")).items] == ["y"]
        with pytest.raises(ApiException) as exc:
            await core.create_namespace(namespace_object("z", {"bad key!": "v"}))
        assert exc.value.status == 422 and status_of(exc.value)["details"]["causes"][0]["field"] == "metadata.labels"
        await core.delete_namespace("y")
        assert [n.metadata.name for n in (await core.list_namespace()).items] == ["x"]

    with trio.fail_after(20), ApiServer() as api:
        await run_scenario(api, tmp_path, scenario)


async def test_network_policy_crud_defaults_and_generation(tmp_path: Path) -> None:
    async def scenario(kube: KubeClient) -> None:
        net = NetworkingV1Api(kube.api_client)
        made = await net.create_namespaced_network_policy("x", network_policy_object("x", "allow-80", ALLOW_80))
        assert made.metadata.generation == 1 and made.metadata.uid
        assert made.spec.policy_types == ["Ingress", "Egress"]  # defaulted: there are egress rules
        assert [p.protocol for p in made.spec.ingress[0].ports] == ["TCP", "UDP"]  # defaulted to TCP
        assert made.spec.ingress[0].ports[1].port == "serve-81-udp"
        deny = await net.create_namespaced_network_policy("x", network_policy_object("x", "deny", DENY_ALL))
        assert deny.spec.policy_types == ["Ingress"]
        await net.create_namespaced_network_policy("y", network_policy_object("y", "deny", DENY_ALL))

        got = await net.read_namespaced_network_policy("allow-80", "x")
        assert got.spec.egress[0].to[0].ip_block.cidr == "2001:db8::/32"
        everywhere = await net.list_network_policy_for_all_namespaces()
        assert sorted((p.metadata.namespace, p.metadata.name) for p in everywhere.items) == [
            ("x", "allow-80"),
            ("x", "deny"),
            ("y", "deny"),
        ]
        assert len((await net.list_namespaced_network_policy("y")).items) == 1

        # Replacing the spec bumps the generation; a label change does not.
        body = network_policy_object("x", "deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})
        body["metadata"]["resourceVersion"] = deny.metadata.resource_version
        replaced = await net.replace_namespaced_network_policy("deny", "x", body)
        assert replaced.metadata.generation == 2 and replaced.spec.policy_types == ["Ingress", "Egress"]
        relabelled = await net.patch_namespaced_network_policy("deny", "x", {"metadata": {"labels": {"a": "b"}}})
        assert relabelled.metadata.generation == 2
        with pytest.raises(ApiException) as exc:  # stale resourceVersion
            await net.replace_namespaced_network_policy("deny", "x", body)
        assert exc.value.status == 409

        await net.delete_namespaced_network_policy("deny", "x")
        with pytest.raises(ApiException) as exc:
            await net.read_namespaced_network_policy("deny", "x")
        assert exc.value.status == 404

    with trio.fail_after(20), ApiServer() as api:
        await run_scenario(api, tmp_path, scenario)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({}, "spec.podSelector"),
        ({"podSelector": {}, "policyTypes": ["Sideways"]}, "spec.policyTypes[0]"),
        ({"podSelector": {}, "ingress": [{"ports": [{"protocol": "ICMP"}]}]}, "spec.ingress[0].ports[0].protocol"),
        ({"podSelector": {}, "ingress": [{"ports": [{"port": 0}]}]}, "spec.ingress[0].ports[0].port"),
        ({"podSelector": {}, "ingress": [{"ports": [{"port": "-http"}]}]}, "spec.ingress[0].ports[0].port"),
        (
            {"podSelector": {}, "ingress": [{"ports": [{"port": 90, "endPort": 80}]}]},
            "spec.ingress[0].ports[0].endPort",
        ),
        (
            {"podSelector": {}, "ingress": [{"ports": [{"port": "http", "endPort": 80}]}]},
            "spec.ingress[0].ports[0].endPort",
        ),
        ({"podSelector": {}, "egress": [{"to": [{}]}]}, "spec.egress[0].to[0]"),
        (
            {"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "fd00::/8"}, "podSelector": {}}]}]},
            "spec.egress[0].to[0]",
        ),
        (
            {"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "fd00::"}}]}]},
            "spec.egress[0].to[0].ipBlock.cidr",
        ),
        (
            {"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "192.0.2.0/24", "except": ["fd00::/64"]}}]}]},
            "spec.egress[0].to[0].ipBlock.except[0]",
        ),
        (
            {"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "fd00::/64", "except": ["fd00::/64"]}}]}]},
            "spec.egress[0].to[0].ipBlock.except[0]",
        ),
        (
            {"podSelector": {"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}},
            "spec.podSelector.matchExpressions[0].values",
        ),
        (
            {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}},
            "spec.podSelector.matchExpressions[0].values",
        ),
        (
            {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}},
            "spec.podSelector.matchExpressions[0].operator",
        ),
    ],
)
def test_network_policy_validation_names_the_field(spec: dict[str, Any], field: str) -> None:
    with ApiServer() as api:
        from flock.apiserver import StatusError

        with pytest.raises(StatusError) as exc:
            api.create(NETWORKPOLICIES, network_policy_object("x", "bad", spec))
        assert exc.value.code == 422 and exc.value.details is not None
        assert exc.value.details["causes"][0]["field"] == field, exc.value.message


async def test_cluster_wide_watches_with_bookmarks(tmp_path: Path) -> None:
    with trio.fail_after(20), ApiServer(bookmark_interval=0.2) as api:
        start = api.store.resource_version
        api.create(NAMESPACES, namespace_object("x", {"ns": "x"}))
        api.create(NETWORKPOLICIES, network_policy_object("x", "deny", DENY_ALL))
        api.create(PODS, pod_object("x", "a", "node1", labels={"pod": "a"}))
        api.create(PODS, pod_object("y", "b", "node2", labels={"pod": "b"}))
        api.patch(NAMESPACES, "x", {"metadata": {"labels": {"ns": "xx"}}})
        api.set_status(PODS, "b", {"podIPs": [{"ip": "2001:db8:0:2::b"}], "phase": "Running"}, "y")
        api.delete(NETWORKPOLICIES, "deny", "x")

        async def raw(kube: KubeClient, call: Any) -> list[tuple[str, str]]:
            resp = await call(
                watch=True,
                resource_version=str(start),
                allow_watch_bookmarks=True,
                timeout_seconds=1,
                _preload_content=False,
            )
            try:
                events = [json.loads(line) async for line in resp.content if line.strip()]
            finally:
                resp.release()
            out = []
            for e in events:
                meta = e["object"]["metadata"]
                out.append((e["type"], meta.get("name", "") if e["type"] != "BOOKMARK" else meta["resourceVersion"]))
            return out

        async def scenario(kube: KubeClient) -> dict[str, list[tuple[str, str]]]:
            core, net = CoreV1Api(kube.api_client), NetworkingV1Api(kube.api_client)
            return {
                "ns": await raw(kube, core.list_namespace),
                "np": await raw(kube, net.list_network_policy_for_all_namespaces),
                "pods": await raw(kube, core.list_pod_for_all_namespaces),
            }

        seen = await run_scenario(api, tmp_path, scenario)
        last = str(api.store.resource_version)
    assert seen["ns"][:2] == [("ADDED", "x"), ("MODIFIED", "x")]
    assert seen["np"][:2] == [("ADDED", "deny"), ("DELETED", "deny")]
    assert seen["pods"][:3] == [("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "b")]
    for events in seen.values():  # bookmarks follow, at the newest version
        assert events[-1] == ("BOOKMARK", last)


async def test_pod_status_subresource_and_ports(tmp_path: Path) -> None:
    async def scenario(kube: KubeClient) -> None:
        core = CoreV1Api(kube.api_client)
        ports = [{"name": "serve-80-tcp", "containerPort": 80}, {"containerPort": 81, "protocol": "UDP"}]
        made = await core.create_namespaced_pod("x", pod_object("x", "a", "node1", ports=ports))
        assert [(p.name, p.container_port, p.protocol) for p in made.spec.containers[0].ports] == [
            ("serve-80-tcp", 80, "TCP"),
            (None, 81, "UDP"),
        ]
        status = {"phase": "Running", "podIP": "2001:db8::a", "podIPs": [{"ip": "2001:db8::a"}, {"ip": "192.0.2.7"}]}
        after = await core.patch_namespaced_pod_status("a", "x", {"status": status})
        assert [i.ip for i in after.status.pod_ips] == ["2001:db8::a", "192.0.2.7"]
        assert after.metadata.generation == made.metadata.generation  # status is not spec
        # A status write leaves the spec alone, whatever the body says.
        body = pod_object("x", "a", "node9")
        body["status"] = {"phase": "Succeeded"}
        done = await core.replace_namespaced_pod_status("a", "x", body)
        assert done.status.phase == "Succeeded" and done.spec.node_name == "node1"
        with pytest.raises(ApiException) as exc:
            await core.create_namespaced_pod("x", pod_object("x", "b", ports=[{"containerPort": 70000}]))
        assert exc.value.status == 422

    with trio.fail_after(20), ApiServer() as api:
        await run_scenario(api, tmp_path, scenario)
