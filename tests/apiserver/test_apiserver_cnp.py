"""The fake API server's ClusterNetworkPolicy (a custom resource: pruned, then its CRD's schema and
CEL rules) and Node resources, through the real kubernetes-asyncio client over HTTP."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException

from flock.apiserver import (
    CLUSTERNETWORKPOLICIES,
    ApiServer,
    StatusError,
    cluster_network_policy_object,
    k8s_schema,
    node_object,
)
from flock.apiserver._cnp import SCHEMA
from flock.watchers import KubeClient, open_kube_client

CRD = Path(__file__).resolve().parents[2] / "deploy" / "crd-clusternetworkpolicy.yaml"
GROUP, VERSION, PLURAL = "policy.networking.k8s.io", "v1alpha2", "clusternetworkpolicies"
MERGE = "application/merge-patch+json"  # the custom objects client sends JSON patches unless told


async def run_scenario(api: ApiServer, tmp_path: Path, scenario: Any) -> Any:
    async with open_kube_client(api.write_kubeconfig(tmp_path / "kubeconfig")) as kube:
        return await kube.bridge.call(scenario, kube)


def status_of(exc: ApiException) -> dict[str, Any]:
    return json.loads(exc.body)


def crd_schema() -> dict[str, Any]:
    (version,) = yaml.safe_load(CRD.read_text())["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def _without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_without_descriptions(v) for v in node]
    return node


ALL_NAMESPACES: dict[str, Any] = {"namespaces": {}}
VALID: dict[str, Any] = {
    "tier": "Admin",
    "priority": 10,
    "subject": {"pods": {"namespaceSelector": {"matchLabels": {"team": "a"}}, "podSelector": {}}},
    "ingress": [
        {
            "name": "from-monitoring",
            "action": "Accept",
            "from": [{"namespaces": {"matchExpressions": [{"key": "role", "operator": "In", "values": ["mon"]}]}}],
            "protocols": [{"tcp": {"destinationPort": {"number": 9100}}}, {"destinationNamedPort": "metrics"}],
        }
    ],
    "egress": [
        {
            "action": "Deny",
            "to": [{"networks": ["192.0.2.0/24", "2001:db8::/32"]}, {"nodes": {"matchLabels": {"role": "infra"}}}],
            "protocols": [{"udp": {"destinationPort": {"range": {"start": 1000, "end": 2000}}}}],
        },
        {"action": "Pass", "to": [{"pods": {"podSelector": {"matchLabels": {"app": "db"}}}}]},
    ],
}


def with_(path: str, value: Any) -> dict[str, Any]:
    """VALID with the value at *path* ("egress.0.to.0") replaced (None: removed)."""
    spec = copy.deepcopy(VALID)
    *parents, last = path.split(".")
    node: Any = spec
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) else last
    if value is None:
        del node[key]
    else:
        node[key] = value
    return spec


NAMED = {"destinationNamedPort": "dns"}
INGRESS_NODES = with_("ingress.0.from.0", {"nodes": {}})
DUPLICATE_NETWORKS = with_("egress.0.to.0.networks", ["10.0.0.0/8", "10.0.0.0/8"])
BAD: list[tuple[dict[str, Any], str, str]] = [
    (with_("tier", "Developer"), "spec.tier", "Unsupported value"),
    (with_("tier", None), "spec.tier", "Required value"),
    (with_("priority", 1001), "spec.priority", "less than or equal to 1000"),
    (with_("priority", -1), "spec.priority", "greater than or equal to 0"),
    (with_("priority", "10"), "spec.priority", "must be of type integer"),
    (with_("subject", {"namespaces": {}, "pods": {"podSelector": {}}}), "spec.subject", "at most 1"),
    (with_("subject", {}), "spec.subject", "at least 1"),
    (with_("subject", {"pods": {"namespaceSelector": {}}}), "spec.subject.pods.podSelector", "Required value"),
    (with_("ingress.0.action", "Allow"), "spec.ingress[0].action", "Unsupported value"),
    (with_("ingress.0.action", None), "spec.ingress[0].action", "Required value"),
    (with_("ingress.0.name", "n" * 101), "spec.ingress[0].name", "Too long"),
    (with_("ingress.0.from", []), "spec.ingress[0].from", "at least 1"),
    (with_("ingress.0.from", [ALL_NAMESPACES] * 26), "spec.ingress[0].from", "at most 25"),
    (with_("ingress", [VALID["ingress"][0]] * 26), "spec.ingress", "at most 25"),
    (
        with_("ingress.0.from.0", {"namespaces": {}, "pods": {"podSelector": {}}}),
        "spec.ingress[0].from[0]",
        "at most 1",
    ),
    (INGRESS_NODES, "spec.ingress[0].from[0]", "at least 1"),  # pruned: ingress has no nodes peer
    (with_("egress.0.to.1", {"nodes": {}, "networks": ["10.0.0.0/8"]}), "spec.egress[0].to[1]", "at most 1"),
    (with_("egress.0.to.0.networks", []), "spec.egress[0].to[0].networks", "at least 1"),
    (with_("egress.0.to.0.networks", ["10.0.0.0"]), "spec.egress[0].to[0].networks[0]", "Invalid CIDR"),
    (with_("egress.0.to.0.networks", ["::ffff:10.0.0.0/104"]), "spec.egress[0].to[0].networks[0]", "Invalid CIDR"),
    (with_("egress.0.to.0.networks", ["f" * 44]), "spec.egress[0].to[0].networks[0]", "Too long"),
    (DUPLICATE_NETWORKS, "spec.egress[0].to[0].networks[1]", "Duplicate value"),
    (
        with_("egress.0.to.0.networks", [f"10.{i}.0.0/16" for i in range(26)]),
        "spec.egress[0].to[0].networks",
        "at most 25",
    ),
    (with_("egress.0.protocols", []), "spec.egress[0].protocols", "at least 1"),
    (
        with_("egress.0.protocols.0", {"tcp": {"destinationPort": {"number": 80}}, "destinationNamedPort": "http"}),
        "spec.egress[0].protocols[0]",
        "at most 1",
    ),
    (with_("egress.0.protocols.0", {"tcp": {}}), "spec.egress[0].protocols[0].tcp", "at least 1"),
    (
        with_("egress.0.protocols.0.udp.destinationPort", {"number": 53, "range": {"start": 1, "end": 2}}),
        "spec.egress[0].protocols[0].udp.destinationPort",
        "at most 1",
    ),
    (
        with_("egress.0.protocols.0.udp.destinationPort.range", {"start": 2000, "end": 2000}),
        "spec.egress[0].protocols[0].udp.destinationPort.range",
        "Start port must be less than End port",
    ),
    (
        with_("egress.0.protocols.0.udp.destinationPort.range", {"start": 2000, "end": 1000}),
        "spec.egress[0].protocols[0].udp.destinationPort.range",
        "Start port must be less than End port",
    ),
    (
        with_("egress.0.protocols.0.udp.destinationPort", {"number": 0}),
        "spec.egress[0].protocols[0].udp.destinationPort.number",
        "greater than or equal to 1",
    ),
    (
        with_("egress.0.protocols.0.udp.destinationPort.range", {"start": 1000}),
        "spec.egress[0].protocols[0].udp.destinationPort.range.end",
        "Required value",
    ),
    # The experimental channel's CEL rule: no named port towards addresses.
    (with_("egress.0.protocols", [{"destinationNamedPort": "dns"}]), "spec.egress[0]", "cannot be set with namedPorts"),
    (
        with_("egress", [{"action": "Accept", "to": [{"domainNames": ["*.example.com"]}], "protocols": [NAMED]}]),
        "spec.egress[0]",
        "cannot be set with namedPorts",
    ),
    (
        with_("egress", [{"action": "Accept", "to": [{"nodes": {}}], "protocols": [NAMED]}]),
        "spec.egress[0]",
        "cannot be set with namedPorts",
    ),
    (with_("egress.0.to", [{"domainNames": ["-bad-.example"]}]), "spec.egress[0].to[0].domainNames[0]", "should match"),
    (
        with_("subject", {"namespaces": {"matchExpressions": [{"key": "a"}]}}),
        "spec.subject.namespaces.matchExpressions[0].operator",
        "Required value",
    ),
    (
        with_("subject", {"namespaces": {"matchLabels": {"a": 1}}}),
        "spec.subject.namespaces.matchLabels.a",
        "must be of type string",
    ),
]


@pytest.mark.parametrize(("spec", "field", "why"), BAD, ids=[f"{f}:{w}" for _, f, w in BAD])
def test_invalid_cluster_network_policy_is_refused_naming_the_field(spec: dict[str, Any], field: str, why: str) -> None:
    with ApiServer() as api, pytest.raises(StatusError) as exc:
        api.create(CLUSTERNETWORKPOLICIES, cluster_network_policy_object("bad", spec))
    assert exc.value.code == 422 and exc.value.reason == "Invalid" and exc.value.details is not None
    assert exc.value.details["causes"][0]["field"] == field, exc.value.message
    assert why in exc.value.message
    assert exc.value.message.startswith('ClusterNetworkPolicy "bad" is invalid: ')


def test_the_servers_schema_is_the_deployed_crds() -> None:
    assert _without_descriptions(crd_schema()) == SCHEMA


# Not the refusal that pruning makes (jsonschema does not prune: it sees a peer with one field), nor
# the duplicate in a list-type set (k8s_schema does not check x-kubernetes-list-type).
@pytest.mark.parametrize(
    "spec", [VALID, *(spec for spec, _, _ in BAD if spec is not INGRESS_NODES and spec is not DUPLICATE_NETWORKS)]
)
def test_the_server_and_the_crd_agree_on_what_is_valid(spec: dict[str, Any]) -> None:
    # The CRD checked by an independent implementation (jsonschema + cel-python, flock.apiserver.k8s_schema).
    obj = cluster_network_policy_object("p", spec)
    with ApiServer() as api:
        try:
            pruned = api.create(CLUSTERNETWORKPOLICIES, obj)
        except StatusError:
            accepted = False
        else:
            accepted = True
            for key in ("uid", "creationTimestamp", "generation", "resourceVersion"):
                del pruned["metadata"][key]
            obj = pruned
    errors = k8s_schema.errors(crd_schema(), obj)
    assert accepted == (not errors), errors


def test_unknown_fields_are_pruned_as_the_api_server_does() -> None:
    spec = copy.deepcopy(VALID)
    spec["futureField"] = {"x": 1}
    spec["ingress"][0]["from"][0]["namespaces"]["matchFoo"] = "bar"
    spec["egress"][0]["to"].append({"networks": ["198.51.100.0/24"], "someNewPeer": None})
    spec["egress"][0]["protocols"][0]["udp"]["sourcePort"] = {"number": 5}
    spec["egress"][1]["to"][0]["pods"]["namespaceSelector"] = None  # null: pruned, like an unknown field
    obj = cluster_network_policy_object("p", spec)
    obj["extra"] = "top level"
    with ApiServer() as api:
        made = api.create(CLUSTERNETWORKPOLICIES, obj)
        assert "extra" not in made and "futureField" not in made["spec"]
        assert made["spec"]["ingress"][0]["from"][0]["namespaces"] == VALID["ingress"][0]["from"][0]["namespaces"]
        assert made["spec"]["egress"][0]["to"][2] == {"networks": ["198.51.100.0/24"]}
        assert made["spec"]["egress"][0]["protocols"][0]["udp"] == VALID["egress"][0]["protocols"][0]["udp"]
        assert made["spec"]["egress"][1]["to"][0]["pods"] == {"podSelector": {"matchLabels": {"app": "db"}}}
        # A peer whose only field is unknown is empty once pruned: refused, as a newer client's would be.
        spec["ingress"][0]["from"] = [{"someNewPeer": {}}]
        with pytest.raises(StatusError) as exc:
            api.create(CLUSTERNETWORKPOLICIES, cluster_network_policy_object("q", spec))
        assert exc.value.details is not None and exc.value.details["causes"][0]["field"] == "spec.ingress[0].from[0]"
        # Label selectors are only typed by the CRD: the API server does not check their syntax.
        loose = with_("subject", {"namespaces": {"matchExpressions": [{"key": "bad key!", "operator": "Near"}]}})
        api.create(CLUSTERNETWORKPOLICIES, cluster_network_policy_object("loose", loose))


async def test_cluster_network_policy_crud_list_watch_over_http(tmp_path: Path) -> None:
    async def scenario(kube: KubeClient) -> None:
        custom = CustomObjectsApi(kube.api_client)
        made = await custom.create_cluster_custom_object(
            GROUP, VERSION, PLURAL, cluster_network_policy_object("admin-a", VALID)
        )
        assert made["metadata"]["generation"] == 1 and made["spec"] == VALID
        baseline = with_("tier", "Baseline")
        await custom.create_cluster_custom_object(
            GROUP, VERSION, PLURAL, cluster_network_policy_object("base", baseline)
        )
        got = await custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "base")
        assert got["spec"]["tier"] == "Baseline"
        page = await custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=1)
        assert [o["metadata"]["name"] for o in page["items"]] == ["admin-a"] and page["metadata"]["continue"]
        rest = await custom.list_cluster_custom_object(
            GROUP, VERSION, PLURAL, limit=1, _continue=page["metadata"]["continue"]
        )
        assert [o["metadata"]["name"] for o in rest["items"]] == ["base"]
        start = page["metadata"]["resourceVersion"]

        patched = await custom.patch_cluster_custom_object(
            GROUP, VERSION, PLURAL, "base", {"spec": {"priority": 999}}, _content_type=MERGE
        )
        assert patched["spec"]["priority"] == 999 and patched["metadata"]["generation"] == 2
        with pytest.raises(ApiException) as exc:
            await custom.patch_cluster_custom_object(
                GROUP, VERSION, PLURAL, "base", {"spec": {"priority": 1001}}, _content_type=MERGE
            )
        assert exc.value.status == 422 and status_of(exc.value)["details"]["causes"][0]["field"] == "spec.priority"
        with pytest.raises(ApiException) as exc:
            await custom.create_cluster_custom_object(
                GROUP, VERSION, PLURAL, cluster_network_policy_object("bad", with_("tier", "Developer"))
            )
        assert exc.value.status == 422 and status_of(exc.value)["reason"] == "Invalid"
        await custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "admin-a")

        resp = await custom.list_cluster_custom_object(
            GROUP, VERSION, PLURAL, watch=True, resource_version=start, timeout_seconds=1, _preload_content=False
        )
        try:
            events = [json.loads(line) async for line in resp.content if line.strip()]
        finally:
            resp.release()
        seen = [(e["type"], e["object"]["metadata"].get("name")) for e in events if e["type"] != "BOOKMARK"]
        assert seen == [("MODIFIED", "base"), ("DELETED", "admin-a")]

    with trio.fail_after(20), ApiServer() as api:
        await run_scenario(api, tmp_path, scenario)


async def test_a_crd_not_installed_answers_404_until_it_is(tmp_path: Path) -> None:
    async def scenario(kube: KubeClient) -> int:
        custom = CustomObjectsApi(kube.api_client)
        with pytest.raises(ApiException) as exc:
            await custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        assert exc.value.status == 404 and status_of(exc.value)["reason"] == "NotFound"
        resp = await custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, watch=True, _preload_content=False)
        try:
            assert resp.status == 404  # a watch too
        finally:
            resp.release()
        return 0

    with trio.fail_after(20), ApiServer() as api:
        api.create(CLUSTERNETWORKPOLICIES, cluster_network_policy_object("p", VALID))
        assert api.uninstall(CLUSTERNETWORKPOLICIES) == 1
        await run_scenario(api, tmp_path, scenario)
        with pytest.raises(StatusError):
            api.create(CLUSTERNETWORKPOLICIES, cluster_network_policy_object("p", VALID))
        api.install(CLUSTERNETWORKPOLICIES)
        assert api.list(CLUSTERNETWORKPOLICIES) == []  # its objects went with it
        api.create(CLUSTERNETWORKPOLICIES, cluster_network_policy_object("p", VALID))
        assert [o["metadata"]["name"] for o in api.list(CLUSTERNETWORKPOLICIES)] == ["p"]


async def test_nodes_list_watch_and_status_addresses(tmp_path: Path) -> None:
    async def scenario(kube: KubeClient) -> None:
        core = CoreV1Api(kube.api_client)
        made = await core.create_node(node_object("n1", {"role": "infra"}, [("InternalIP", "2001:db8::1")]))
        assert made.metadata.labels == {"role": "infra"} and made.status.addresses[0].address == "2001:db8::1"
        await core.create_node(node_object("n2", addresses=[("InternalIP", "192.0.2.2"), ("Hostname", "n2")]))
        listed = await core.list_node()
        assert [n.metadata.name for n in listed.items] == ["n1", "n2"]
        assert [n.metadata.name for n in (await core.list_node(field_selector="metadata.name=n2")).items] == ["n2"]
        start = listed.metadata.resource_version
        await core.patch_node("n2", {"metadata": {"labels": {"role": "infra"}}})
        await core.patch_node_status(
            "n1", {"status": {"addresses": [{"type": "InternalIP", "address": "2001:db8::9"}]}}
        )
        with pytest.raises(ApiException) as exc:
            await core.patch_node_status("n1", {"status": {"addresses": [{"type": "InternalIP"}]}})
        assert exc.value.status == 422
        assert status_of(exc.value)["details"]["causes"][0]["field"] == "status.addresses[0].address"
        await core.delete_node("n1")
        resp = await core.list_node(watch=True, resource_version=start, timeout_seconds=1, _preload_content=False)
        try:
            events = [json.loads(line) async for line in resp.content if line.strip()]
        finally:
            resp.release()
        seen = [(e["type"], e["object"]["metadata"]["name"]) for e in events if e["type"] != "BOOKMARK"]
        assert seen == [("MODIFIED", "n2"), ("MODIFIED", "n1"), ("DELETED", "n1")]
        assert events[1]["object"]["status"]["addresses"] == [{"type": "InternalIP", "address": "2001:db8::9"}]

    with trio.fail_after(20), ApiServer() as api:
        await run_scenario(api, tmp_path, scenario)
