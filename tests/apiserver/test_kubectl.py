"""The fake API server driven by the machine's ``kubectl`` (a client flock did not write):
discovery, tables, get/create/apply (client- and server-side)/label/annotate/delete on every
kind, the server's validation as kubectl prints it, and ``kubectl kustomize deploy`` accepted whole.

One server for the module; each kubectl call takes about 50-100 ms.  Fails (never skips) when kubectl is
not installed (every machine here has one, CI's included).
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flock.apiserver import PODS, ApiServer, DeleteOptions

REPO = Path(__file__).resolve().parents[2]


class Kubectl:
    def __init__(self, binary: str, kubeconfig: Path, cache: Path) -> None:
        self.base = [binary, f"--kubeconfig={kubeconfig}", f"--cache-dir={cache}", "--request-timeout=10s"]

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*self.base, *args], input=stdin, capture_output=True, text=True, timeout=30)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)


@pytest.fixture(scope="module")
def api() -> Iterator[ApiServer]:
    with ApiServer() as server:
        yield server


@pytest.fixture(scope="module")
def kubectl(api: ApiServer, tmp_path_factory: pytest.TempPathFactory, kubectl_path: str) -> Kubectl:
    tmp = tmp_path_factory.mktemp("kubectl")
    return Kubectl(kubectl_path, api.write_kubeconfig(tmp / "kubeconfig"), tmp / "cache")


def _get(url: str, accept: str = "application/json") -> tuple[str, Any]:
    req = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.headers["Content-Type"], json.loads(resp.read())


def test_discovery_legacy_and_aggregated(api: ApiServer, kubectl: Kubectl) -> None:
    _, core = _get(api.url + "/api/v1")
    pods = next(r for r in core["resources"] if r["name"] == "pods")
    assert pods["shortNames"] == ["po"] and pods["namespaced"] and "patch" in pods["verbs"]
    assert any(r["name"] == "pods/status" for r in core["resources"])
    _, groups = _get(api.url + "/apis")
    assert {"flock.fritzlab.net", "policy.networking.k8s.io", "networking.k8s.io"} <= {
        g["name"] for g in groups["groups"]
    }
    kind, agg = _get(api.url + "/apis", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
    assert "as=APIGroupDiscoveryList" in kind and agg["kind"] == "APIGroupDiscoveryList"
    lines = kubectl.run("api-resources", "--no-headers").stdout.splitlines()
    short = {line.split()[0]: line.split()[1] for line in lines if len(line.split()) == 5}
    assert short["pods"] == "po" and short["nodes"] == "no" and short["namespaces"] == "ns"
    assert short["networkpolicies"] == "netpol" and short["clusternetworkpolicies"] == "cnp"
    assert "version" in kubectl.json("version")["serverVersion"]["gitVersion"] or True


POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}},
    "spec": {
        "nodeName": "node1",
        # No kubelet runs it: a grace of 0 lets `kubectl delete` remove it at once (see test_graceful_pod_delete).
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "app", "image": "app:1", "ports": [{"containerPort": 80}]}],
    },
}
# (resource as kubectl names it, namespace, object, a spec change for the second apply)
KINDS: list[tuple[str, str | None, dict[str, Any], dict[str, Any]]] = [
    ("po", "shop", POD, {"spec": {"containers": [{"name": "app", "image": "app:2"}]}}),
    ("ns", None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}, {}),
    (
        "no",
        None,
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node9"}, "spec": {}},
        {"spec": {"unschedulable": True}},
    ),
    (
        "netpol",
        "shop",
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "deny", "namespace": "shop"},
            "spec": {"podSelector": {}},
        },
        {"spec": {"podSelector": {"matchLabels": {"app": "web"}}}},
    ),
    (
        "nc",
        None,
        {
            "apiVersion": "flock.fritzlab.net/v1alpha1",
            "kind": "NodeConfig",
            "metadata": {"name": "node9"},
            "spec": {"cidr6": "2001:db8:0:9::/64"},
        },
        {"spec": {"cidr4": "198.51.100.0/24"}},
    ),
    (
        "secret",
        "shop",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "pw", "namespace": "shop"},
            "stringData": {"a": "b"},
        },
        {"stringData": {"c": "d"}},
    ),
    (
        "cnp",
        None,
        {
            "apiVersion": "policy.networking.k8s.io/v1alpha2",
            "kind": "ClusterNetworkPolicy",
            "metadata": {"name": "deny-all"},
            "spec": {
                "tier": "Admin",
                "priority": 10,
                "subject": {"namespaces": {}},
                "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}],
            },
        },
        {"spec": {"priority": 20}},
    ),
    (
        "ag",
        None,
        {
            "apiVersion": "flock.fritzlab.net/v1alpha1",
            "kind": "AddressGroup",
            "metadata": {"name": "web-0", "labels": {"flock.fritzlab.net/group": "web"}},
            "group": "web",
            "members": [{"namespace": "shop", "name": "web", "ips": ["2001:db8::5"]}],
        },
        {"members": [{"namespace": "shop", "name": "web", "ips": ["2001:db8::6"]}]},
    ),
    (
        "nag",
        None,
        {
            "apiVersion": "flock.fritzlab.net/v1alpha1",
            "kind": "NodeAddressGroups",
            "metadata": {"name": "node9"},
            "groups": ["web"],
        },
        {"groups": ["web", "db"], "revision": 2},
    ),
]


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.mark.parametrize(("kind", "namespace", "obj", "change"), KINDS, ids=[k[0] for k in KINDS])
def test_every_verb_on_every_kind(
    kubectl: Kubectl, kind: str, namespace: str | None, obj: dict[str, Any], change: dict[str, Any]
) -> None:
    name = obj["metadata"]["name"]
    ns = ["-n", namespace] if namespace else []
    assert "created" in kubectl.run("apply", "-f", "-", stdin=json.dumps(obj)).stdout
    changed = _merge(obj, change)
    out = kubectl.run("apply", "-f", "-", stdin=json.dumps(changed)).stdout
    assert ("configured" if change else "unchanged") in out
    got = kubectl.json("get", kind, name, *ns)
    assert "kubectl.kubernetes.io/last-applied-configuration" in got["metadata"]["annotations"]
    if kind == "po":
        assert got["spec"]["containers"][0]["image"] == "app:2"
        # A strategic merge patch by name; the ports the new configuration no longer has are deleted.
        assert len(got["spec"]["containers"]) == 1 and "ports" not in got["spec"]["containers"][0]
    kubectl.run("label", kind, name, *ns, "team=blue")
    kubectl.run("annotate", kind, name, *ns, "note=hi")
    got = kubectl.json("get", kind, name, *ns)
    assert got["metadata"]["labels"]["team"] == "blue" and got["metadata"]["annotations"]["note"] == "hi"
    kubectl.run("label", kind, name, *ns, "team-")
    assert "team" not in (kubectl.json("get", kind, name, *ns)["metadata"].get("labels") or {})
    table = kubectl.run("get", kind, *ns, "-o", "wide").stdout.splitlines()
    assert table[0].startswith("NAME") and any(line.split()[0] == name for line in table[1:])
    kubectl.run("delete", kind, name, *ns)
    assert kubectl.run("get", kind, name, *ns, check=False).returncode == 1
    # Server-side apply: created, then fields merged; a field this manager no longer applies goes.
    out = kubectl.run("apply", "--server-side", "-f", "-", stdin=json.dumps(changed)).stdout
    assert "serverside-applied" in out
    kubectl.run("apply", "--server-side", "-f", "-", stdin=json.dumps(obj))
    got = kubectl.json("get", kind, name, *ns)
    managed = got["metadata"].get("managedFields") or []
    assert managed == [] or managed[0]["manager"] == "kubectl"
    if kind == "nc":
        assert "cidr4" not in got["spec"]
    kubectl.run("delete", kind, name, *ns)
    assert "created" in kubectl.run("create", "-f", "-", stdin=json.dumps(obj)).stdout
    kubectl.run("delete", "-f", "-", stdin=json.dumps(obj))


def test_pod_table_columns(kubectl: Kubectl, api: ApiServer) -> None:
    kubectl.run("apply", "-f", "-", stdin=json.dumps(_merge(POD, {"metadata": {"name": "table"}})))
    try:
        head = kubectl.run("get", "pods", "-A", "-o", "wide").stdout.splitlines()[0].split()
        assert head[:7] == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP"]
        assert "NODE" in head
        row = kubectl.run("get", "po", "table", "-n", "shop", "--no-headers", "-o", "wide").stdout.split()
        assert row[:3] == ["table", "0/1", "Pending"] and "node1" in row
    finally:
        kubectl.run("delete", "po", "table", "-n", "shop")


def test_kubectl_prints_the_servers_422(kubectl: Kubectl) -> None:
    bad = _merge(POD, {"metadata": {"name": "bad", "labels": {"bad key": "x"}}})
    proc = kubectl.run("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert proc.returncode == 1 and 'The Pod "bad" is invalid' in proc.stderr and "metadata.labels" in proc.stderr
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "bad", "namespace": "shop"},
        "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": 70000}]}]},
    }
    proc = kubectl.run("apply", "--server-side", "-f", "-", stdin=json.dumps(policy), check=False)
    assert proc.returncode == 1 and "spec.ingress[0].ports[0].port" in proc.stderr


def test_kustomize_deploy_and_examples_are_accepted(kubectl: Kubectl, api: ApiServer) -> None:
    rendered = kubectl.run("kustomize", str(REPO / "deploy")).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert {d["kind"] for d in docs} >= {"CustomResourceDefinition", "DaemonSet", "ClusterRole"}
    out = kubectl.run("apply", "-f", "-", stdin=rendered).stdout
    assert out.count(" created") + out.count(" unchanged") + out.count(" configured") == len(docs), out
    # With the CRDs stored, NodeConfigs are checked against deploy/crd-nodeconfig.yaml's schema.
    for example in sorted((REPO / "deploy" / "examples").glob("*.yaml")):
        proc = kubectl.run("apply", "-f", str(example), check=False)
        assert proc.returncode == 0, f"{example.name}: {proc.stderr}"
    bad = {
        "apiVersion": "flock.fritzlab.net/v1alpha1",
        "kind": "NodeConfig",
        "metadata": {"name": "bad"},
        "spec": {"cidr6": "not-a-cidr"},
    }
    proc = kubectl.run("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert proc.returncode == 1 and 'The NodeConfig "bad" is invalid' in proc.stderr and "spec.cidr6" in proc.stderr
    for doc in docs:
        kind = doc["kind"].lower()
        ns = ["-n", doc["metadata"]["namespace"]] if "namespace" in doc["metadata"] else []
        kubectl.run("get", kind, doc["metadata"]["name"], *ns)


SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "web", "namespace": "shop"},
    "spec": {"type": "NodePort", "selector": {"app": "web"}, "ports": [{"name": "http", "port": 80}]},
}
ENDPOINT_SLICE = {
    "apiVersion": "discovery.k8s.io/v1",
    "kind": "EndpointSlice",
    "metadata": {"name": "web-1", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
    "addressType": "IPv6",
    "endpoints": [
        {"addresses": [f"2001:db8::{i}"], "conditions": {"ready": True}, "nodeName": "node1"} for i in range(1, 6)
    ],
    "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
}


@pytest.mark.parametrize("server_side", [False, True], ids=["client-side", "server-side"])
def test_services_with_kubectl(kubectl: Kubectl, server_side: bool) -> None:
    apply = ["apply", "--server-side"] if server_side else ["apply"]
    kubectl.run(*apply, "-f", "-", stdin=json.dumps(SERVICE))
    first = kubectl.json("get", "svc", "web", "-n", "shop")
    node_port = first["spec"]["ports"][0]["nodePort"]
    assert 30000 <= node_port <= 32767 and first["spec"]["clusterIP"].startswith("fd00:10:96::")
    # Applied again with a change: the allocations stay (kubectl's patch omits them).
    changed = _merge(SERVICE, {"spec": {"selector": {"app": "web2"}}})
    kubectl.run(*apply, "-f", "-", stdin=json.dumps(changed))
    again = kubectl.json("get", "svc", "web", "-n", "shop")
    assert (
        again["spec"]["ports"][0]["nodePort"] == node_port and again["spec"]["clusterIP"] == first["spec"]["clusterIP"]
    )
    head, row = kubectl.run("get", "svc", "-n", "shop", "-o", "wide").stdout.splitlines()[:2]
    assert head.split() == ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE", "SELECTOR"]
    assert row.split()[:5] == ["web", "NodePort", first["spec"]["clusterIP"], "<none>", f"80:{node_port}/TCP"]
    assert row.split()[-1] == "app=web2"
    kubectl.run("delete", "svc", "web", "-n", "shop")
    assert kubectl.run("get", "svc", "web", "-n", "shop", check=False).returncode == 1


def test_service_errors_and_load_balancer_as_kubectl_prints_them(kubectl: Kubectl, api: ApiServer) -> None:
    bad = _merge(
        SERVICE, {"metadata": {"name": "bad"}, "spec": {"ports": [{"name": "http", "port": 80, "nodePort": 8080}]}}
    )
    proc = kubectl.run("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert proc.returncode == 1 and 'The Service "bad" is invalid' in proc.stderr
    assert "provided port is not in the valid range. The range of valid ports is 30000-32767" in proc.stderr
    lb = _merge(SERVICE, {"metadata": {"name": "lb"}, "spec": {"type": "LoadBalancer"}})
    kubectl.run("apply", "-f", "-", stdin=json.dumps(lb))
    assert kubectl.run("get", "svc", "lb", "-n", "shop", "--no-headers").stdout.split()[3] == "<pending>"
    ingress = {"status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.9"}]}}}
    kubectl.run("patch", "svc", "lb", "-n", "shop", "--subresource=status", "--type=merge", "-p", json.dumps(ingress))
    assert kubectl.run("get", "svc", "lb", "-n", "shop", "--no-headers").stdout.split()[3] == "198.51.100.9"
    kubectl.run("delete", "svc", "lb", "-n", "shop")


def test_endpoint_slices_with_kubectl(kubectl: Kubectl) -> None:
    kubectl.run("apply", "-f", "-", stdin=json.dumps(ENDPOINT_SLICE))
    head, row = kubectl.run("get", "endpointslices", "-n", "shop", "-o", "wide").stdout.splitlines()[:2]
    assert head.split() == ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"]
    assert row.split()[:4] == ["web-1", "IPv6", "8080", "2001:db8::1,2001:db8::2,2001:db8::3"]
    assert "+ 2 more..." in row
    kubectl.run("apply", "--server-side", "-f", "-", stdin=json.dumps(_merge(ENDPOINT_SLICE, {"ports": []})))
    assert kubectl.json("get", "endpointslice", "web-1", "-n", "shop")["ports"] == []
    moved = _merge(ENDPOINT_SLICE, {"addressType": "IPv4", "endpoints": [{"addresses": ["192.0.2.1"]}]})
    proc = kubectl.run("apply", "-f", "-", stdin=json.dumps(moved), check=False)
    assert proc.returncode == 1 and "addressType" in proc.stderr and "field is immutable" in proc.stderr
    kubectl.run("delete", "-f", "-", stdin=json.dumps(ENDPOINT_SLICE))
    lines = kubectl.run("api-resources", "--no-headers").stdout.splitlines()
    assert any(line.split()[:2] == ["services", "svc"] for line in lines)
    assert any(line.split()[:2] == ["endpointslices", "discovery.k8s.io/v1"] for line in lines)


@pytest.mark.parametrize("server_side", [False, True], ids=["client-side", "server-side"])
def test_a_kind_not_served_is_no_match(kubectl: Kubectl, server_side: bool) -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "web", "namespace": "shop"}}
    ingress = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": "web", "namespace": "shop"},
    }
    for obj, kind, version in ((deployment, "StatefulSet", "apps/v1"), (ingress, "Ingress", "networking.k8s.io/v1")):
        args = ["apply", "--server-side"] if server_side else ["apply"]
        proc = kubectl.run(*args, "-f", "-", stdin=json.dumps(obj), check=False)
        assert proc.returncode == 1 and "failed to download openapi" not in proc.stderr
        assert "resource mapping not found for name" in proc.stderr
        assert f'no matches for kind "{kind}" in version "{version}"' in proc.stderr


def test_graceful_pod_delete(kubectl: Kubectl, api: ApiServer) -> None:
    """kubectl delete of a bound pod with a grace: Terminating until a kubelet's DELETE with grace 0;
    ``kubectl delete`` (it waits) returns once that removes it."""
    pod = _merge(POD, {"metadata": {"name": "slow"}, "spec": {"terminationGracePeriodSeconds": 20}})
    kubectl.run("apply", "-f", "-", stdin=json.dumps(pod))
    kubectl.run("delete", "po", "slow", "-n", "shop", "--wait=false")
    got = kubectl.json("get", "po", "slow", "-n", "shop")
    assert got["metadata"]["deletionGracePeriodSeconds"] == 20 and got["metadata"]["deletionTimestamp"]
    row = kubectl.run("get", "po", "slow", "-n", "shop", "--no-headers").stdout.split()
    assert row[2] == "Terminating"
    with subprocess.Popen(
        [*kubectl.base, "delete", "po", "slow", "-n", "shop"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as waiting:
        try:
            with pytest.raises(subprocess.TimeoutExpired):
                waiting.wait(timeout=1.0)  # still there: kubectl waits
            api.store.delete(PODS, "slow", "shop", DeleteOptions(0))  # what the kubelet sends when done
            _, err = waiting.communicate(timeout=10)
            assert waiting.returncode == 0, err
        finally:
            waiting.kill()
    assert kubectl.run("get", "po", "slow", "-n", "shop", check=False).returncode == 1


def test_load_balancer_pools_and_leases_with_kubectl(kubectl: Kubectl, api: ApiServer) -> None:
    """A pool applied with kubectl, flock-controller's pass over HTTP, then what kubectl shows: the
    Service's EXTERNAL-IP and the pool's free counts; a Lease as leader election writes it."""
    import trio

    from flock.controller import HttpApi, reconcile

    kubectl.run("apply", "-f", str(REPO / "deploy" / "crd-loadbalancerpool.yaml"))
    pool = {
        "apiVersion": "flock.fritzlab.net/v1alpha1",
        "kind": "LoadBalancerPool",
        "metadata": {"name": "lab"},
        "spec": {"blocks": [{"cidr": "2001:db8:ee::/64"}, {"cidr": "192.0.2.224/27"}]},
    }
    kubectl.run("apply", "-f", "-", stdin=json.dumps(pool))
    bad = _merge(pool, {"metadata": {"name": "bad"}, "spec": {"blocks": [{"cidr": "192.0.2.225/27"}]}})
    proc = kubectl.run("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert proc.returncode == 1 and "no host bits" in proc.stderr
    lb = _merge(SERVICE, {"metadata": {"name": "lbipam"}, "spec": {"type": "LoadBalancer"}})
    kubectl.run("apply", "-f", "-", stdin=json.dumps(lb))

    async def always() -> bool:
        return True

    async def one_pass() -> None:
        await reconcile(HttpApi(api.url), always)

    trio.run(one_pass)
    assert kubectl.run("get", "svc", "lbipam", "-n", "shop", "--no-headers").stdout.split()[3] == "2001:db8:ee::"
    header, row = kubectl.run("get", "loadbalancerpools").stdout.splitlines()
    assert header.split() == ["NAME", "DISABLED", "IPV6", "FREE", "IPV4", "FREE", "USED", "CONFLICT", "AGE"]
    cells = row.split()  # DISABLED: <none> here (the fake server applies no schema defaults), false upstream
    assert (cells[0], cells[2:6]) == ("lab", [str(2**64 - 1), "32", "1", "False"])
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "flock-controller", "namespace": "kube-system"},
        "spec": {"holderIdentity": "controller-0", "leaseDurationSeconds": 10},
    }
    kubectl.run("apply", "-f", "-", stdin=json.dumps(lease))
    row = kubectl.run("get", "leases", "-n", "kube-system", "--no-headers").stdout.split()
    assert row[:2] == ["flock-controller", "controller-0"]
    # CVE-2020-8554: externalIPs outside every pool get a condition and one Event, which describe shows
    hijack = _merge(SERVICE, {"metadata": {"name": "hijack"}, "spec": {"externalIPs": ["203.0.113.7"]}})
    kubectl.run("apply", "-f", "-", stdin=json.dumps(hijack))
    trio.run(one_pass)
    trio.run(one_pass)  # nothing changed: no second Event
    got = json.loads(kubectl.run("get", "svc", "hijack", "-n", "shop", "-o", "json").stdout)
    (condition,) = [c for c in got["status"]["conditions"] if c["type"] == "flock.fritzlab.net/ExternalIPs"]
    assert (condition["status"], condition["reason"]) == ("False", "NotInPool") and "203.0.113.7" in condition[
        "message"
    ]
    described = kubectl.run("describe", "svc", "hijack", "-n", "shop").stdout
    assert "NotInPool" in described and "203.0.113.7" in described and "flock-controller" in described, described
    events = json.loads(kubectl.run("get", "events", "-n", "shop", "-o", "json").stdout)["items"]
    assert [e["reason"] for e in events if e["involvedObject"]["name"] == "hijack"] == ["NotInPool"]
    # the pool's status names it too (an address outside every pool), and kubectl get shows the conflict
    (_, row) = kubectl.run("get", "loadbalancerpools").stdout.splitlines()
    assert row.split()[5] == "True"
    shown = yaml.safe_load(kubectl.run("get", "loadbalancerpool", "lab", "-o", "yaml").stdout)["status"]
    assert {k: shown[k] for k in ("ipv4", "used")} == {"ipv4": {"total": "32", "used": 0, "free": "32"}, "used": 1}
    conditions = {c["type"]: c for c in shown["conditions"]}
    assert conditions["Conflict"]["message"] == (
        "Service shop/hijack: externalIP 203.0.113.7 outside every pool it may use"
    )
    assert conditions["Valid"]["status"] == "True"
    # a pool whose selector does not parse gives nothing and says why
    odd = _merge(pool, {"metadata": {"name": "odd"}, "spec": {"blocks": [{"cidr": "198.51.100.0/24"}]}})
    odd["spec"]["serviceSelector"] = {"matchExpressions": [{"key": "tier", "operator": "In"}]}
    kubectl.run("apply", "-f", "-", stdin=json.dumps(odd))
    trio.run(one_pass)
    shown = json.loads(kubectl.run("get", "loadbalancerpool", "odd", "-o", "json").stdout)["status"]
    ((valid),) = shown["conditions"]
    assert (valid["type"], valid["status"], valid["reason"]) == ("Valid", "False", "InvalidSpec")
    assert "expected at least one value for In" in valid["message"]
    kubectl.run("delete", "loadbalancerpool", "odd")
    # moved inside the pool, then back out: the same Event, its count bumped (describe: x2), not a second
    for address in ("192.0.2.230", "203.0.113.7"):
        kubectl.run("patch", "svc", "hijack", "-n", "shop", "-p", json.dumps({"spec": {"externalIPs": [address]}}))
        trio.run(one_pass)
    events = json.loads(kubectl.run("get", "events", "-n", "shop", "-o", "json").stdout)["items"]
    assert [(e["reason"], e["count"]) for e in events if e["involvedObject"]["name"] == "hijack"] == [("NotInPool", 2)]
    described = kubectl.run("describe", "svc", "hijack", "-n", "shop").stdout
    assert "(x2 over" in described and described.count("NotInPool") == 1, described
    kubectl.run("delete", "svc", "lbipam", "hijack", "-n", "shop")
    kubectl.run("delete", "loadbalancerpool", "lab")


def test_label_selectors_and_address_groups_with_kubectl(kubectl: Kubectl) -> None:
    """``kubectl get -l`` (set-based too) and the address-group CRDs (issue 35) as an operator sees
    them: applied, shown by short name with their columns, selected by group label and by name,
    and a member refused by the CRD's schema (a port beyond 65535: 422)."""
    for i, app in enumerate(("a", "b", "c")):
        pod = _merge(POD, {"metadata": {"name": f"sel-{i}", "labels": {"app": app, "sel": "yes"}}})
        kubectl.run("apply", "-f", "-", stdin=json.dumps(pod))
    shown = kubectl.run("get", "pods", "-n", "shop", "-l", "app in (a,b),sel", "-o", "name").stdout.split()
    assert shown == ["pod/sel-0", "pod/sel-1"]
    shown = kubectl.run("get", "pods", "-A", "-l", "sel,app notin (a)", "--no-headers").stdout.splitlines()
    assert [line.split()[1] for line in shown] == ["sel-1", "sel-2"]
    proc = kubectl.run("get", "pods", "-l", "app in (a", check=False)
    assert proc.returncode == 1 and "unable to parse requirement" in proc.stderr, proc.stderr
    kubectl.run("delete", "pods", "-n", "shop", "-l", "sel=yes")
    kubectl.run("apply", "-f", str(REPO / "deploy" / "crd-addressgroups.yaml"))
    for group in ("g1", "g2"):
        slice_ = {
            "apiVersion": "flock.fritzlab.net/v1alpha1",
            "kind": "AddressGroup",
            "metadata": {"name": f"{group}-0", "labels": {"flock.fritzlab.net/group": group}},
            "group": group,
            "selection": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": group}}},
            "members": [
                {
                    "namespace": "shop",
                    "name": "web",
                    "node": "node1",
                    "labels": {"app": group},
                    "ips": ["2001:db8::5"],
                    "ports": [{"name": "http", "protocol": "TCP", "port": 80}],
                }
            ],
        }
        kubectl.run("apply", "-f", "-", stdin=json.dumps(slice_))
    nag = {
        "apiVersion": "flock.fritzlab.net/v1alpha1",
        "kind": "NodeAddressGroups",
        "metadata": {"name": "node1"},
        "groups": ["g1", "g2"],
        "revision": 3,
    }
    kubectl.run("apply", "-f", "-", stdin=json.dumps(nag))
    header, *rows = kubectl.run("get", "ag", "-l", "flock.fritzlab.net/group in (g2)").stdout.splitlines()
    assert header.split() == ["NAME", "GROUP", "AGE"] and [r.split()[:2] for r in rows] == [["g2-0", "g2"]]
    header, row = kubectl.run("get", "nag", "--field-selector", "metadata.name=node1").stdout.splitlines()
    assert header.split() == ["NAME", "REVISION", "AGE"] and row.split()[:2] == ["node1", "3"]
    bad = _merge(slice_, {"metadata": {"name": "g2-1"}})
    bad["members"][0]["ports"][0]["port"] = 70000
    proc = kubectl.run("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert proc.returncode == 1 and 'The AddressGroup "g2-1" is invalid' in proc.stderr, proc.stderr
    assert "65535" in proc.stderr
    kubectl.run("delete", "ag", "g1-0", "g2-0")
    kubectl.run("delete", "nag", "node1")
