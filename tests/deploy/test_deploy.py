"""deploy/: the manifests an operator applies, checked offline.

Kubernetes objects validate against the API schemas bundled in
kubernetes-validate (no network); NodeConfig instances validate against the
CRD's own openAPIV3Schema as the apiserver would (flock/apiserver/k8s_schema.py:
jsonschema with RE2 patterns, list-map keys, and the CEL rules), and must agree
with flock.model.NodeConfig on what is valid.
"""

from __future__ import annotations

import copy
import hashlib
import ipaddress
import json
import os
import re
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import re2
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from flock import installer
from flock.apiserver import k8s_schema
from flock.model import InvalidObject, NodeConfig

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = (
    "crd-nodeconfig.yaml",
    "crd-clusternetworkpolicy.yaml",
    "crd-loadbalancerpool.yaml",
    "crd-addressgroups.yaml",
    "rbac.yaml",
    "admission-nodeconfig-status.yaml",
    "controller-rbac.yaml",
    "controller.yaml",
    "bird-bootstrap.yaml",
    "daemonset.yaml",
)
# kubernetes-sigs/network-policy-api v0.2.0, config/crd/experimental/policy.networking.k8s.io_clusternetworkpolicies.yaml
CNP_CRD_SHA256 = "995a7463dffb48b26ffb816bfec860ae1bc533bca364fda15b9f74f8c10b9882"
# The oldest Kubernetes whose CRD validation has the IP/CIDR CEL library the CRD uses.
MIN_KUBERNETES = "1.31"
HEALTH_PORT = 9464


def load(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]


def all_objects() -> list[dict[str, Any]]:
    """The agent's objects (flock-controller's RBAC, controller-rbac.yaml, is checked on its own)."""
    return [doc for name in MANIFESTS if name != "controller-rbac.yaml" for doc in load(name)]


def one(kind: str, objects: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    found = [o for o in (objects or all_objects()) if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def nodeconfig_crd() -> dict[str, Any]:
    return one("CustomResourceDefinition", load("crd-nodeconfig.yaml"))


def crd_schema() -> dict[str, Any]:
    (version,) = nodeconfig_crd()["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def nodeconfig_errors(obj: dict[str, Any]) -> list[str]:
    return k8s_schema.errors(crd_schema(), obj)


def example() -> dict[str, Any]:
    (obj,) = load("examples/nodeconfig.yaml")
    return obj


# --- Kubernetes schemas -----------------------------------------------------


@pytest.mark.parametrize("version", [MIN_KUBERNETES, kubernetes_validate.utils.latest_version()])
def test_manifests_validate_against_kubernetes_schemas(version):
    objects = all_objects()
    assert {o["kind"] for o in objects} == {
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "DaemonSet",
        "Deployment",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_kubernetes_validate_rejects_a_broken_daemonset():
    # The check above can fail: a typo'd field is refused in strict mode.
    ds = copy.deepcopy(one("DaemonSet"))
    ds["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = ds["spec"]["template"]["spec"]["containers"][
        0
    ].pop("livenessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, MIN_KUBERNETES, strict=True)


def test_kubernetes_validation_needs_no_network(require_root):
    # unshare --net: a fresh network namespace with only a down loopback.
    code = (
        "import yaml, kubernetes_validate, pathlib\n"
        f"for name in {MANIFESTS!r}:\n"
        f"    for doc in yaml.safe_load_all(pathlib.Path({str(DEPLOY)!r}, name).read_text()):\n"
        f"        kubernetes_validate.validate(doc, {MIN_KUBERNETES!r}, strict=True)\n"
        "print('validated offline')\n"
    )
    out = subprocess.run(["unshare", "--net", sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "validated offline"


def test_kustomization_lists_every_manifest():
    (kustomization,) = load("kustomization.yaml")
    assert kustomization["resources"] == list(MANIFESTS)
    on_disk = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert on_disk == set(MANIFESTS)


# --- the CRD ----------------------------------------------------------------


def test_crd_identity():
    crd = nodeconfig_crd()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "nodeconfigs.flock.fritzlab.net"
    assert (spec["group"], spec["scope"], spec["names"]["kind"], spec["names"]["plural"]) == (
        "flock.fritzlab.net",
        "Cluster",
        "NodeConfig",
        "nodeconfigs",
    )
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert crd_schema()["properties"]["spec"]["required"] == ["cidr6"]


def test_clusternetworkpolicy_crd_is_upstreams_experimental_v0_2_0_unmodified():
    # Unmodified: byte for byte what upstream ships (a new version is a new file and a new digest).
    assert hashlib.sha256((DEPLOY / "crd-clusternetworkpolicy.yaml").read_bytes()).hexdigest() == CNP_CRD_SHA256
    crd = one("CustomResourceDefinition", load("crd-clusternetworkpolicy.yaml"))
    annotations = crd["metadata"]["annotations"]
    assert annotations["policy.networking.k8s.io/bundle-version"] == "v0.2.0"
    assert annotations["policy.networking.k8s.io/channel"] == "experimental"
    spec = crd["spec"]
    assert (spec["group"], spec["scope"], spec["names"]["kind"], spec["names"]["plural"]) == (
        "policy.networking.k8s.io",
        "Cluster",
        "ClusterNetworkPolicy",
        "clusternetworkpolicies",
    )
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha2", True, True)
    # The experimental channel's egress peers, nodes among them (why flock ships this channel).
    peer = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["egress"]["items"]
    assert set(peer["properties"]["to"]["items"]["properties"]) == {
        "namespaces",
        "pods",
        "nodes",
        "networks",
        "domainNames",
    }


def _schema_nodes(schema: dict[str, Any], path: str = "$"):
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _schema_nodes(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _schema_nodes(schema["items"], f"{path}[]")


def test_crd_schema_is_structural_and_portable():
    # Structural (apiserver rule): every node has a type. Patterns must mean the
    # same to the apiserver (Go RE2) and to Python: anchored, no lookaround or
    # backreferences.
    for path, node in _schema_nodes(crd_schema()):
        assert "type" in node, f"{path} has no type"
        if "pattern" in node:
            pattern = node["pattern"]
            assert pattern.startswith("^") and pattern.endswith("$"), path
            assert "(?" not in pattern and not re.search(r"\\[1-9]", pattern), path
            re2.compile(pattern)
        if node.get("x-kubernetes-validations") and node["type"] == "string":
            assert "maxLength" in node, f"{path}: CEL cost estimation needs maxLength"


def test_example_nodeconfig_is_valid_for_crd_and_model():
    obj = example()
    assert nodeconfig_errors(obj) == []
    config = NodeConfig.from_object(obj)
    assert config.name == "host001"
    assert config.cidr6 == ipaddress.IPv6Network("2001:db8:0:1::/64")
    assert config.cidr4 == ipaddress.IPv4Network("198.51.100.0/24")
    assert config.bgp is not None and config.bgp.asn == 64512
    assert str(config.bgp.router_id) == "192.0.2.11"
    assert [(p.name, str(p.address), p.asn) for p in config.bgp.peers] == [
        ("tor1", "2001:db8:ffff::1", 64500),
        ("tor2", "203.0.113.1", 64500),
    ]
    assert config.ip_algo == "namespace:16,app:16,random:32"


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("cidr6", "198.51.100.0/24", "must be an IPv6 CIDR"),
        ("cidr6", "::ffff:198.51.100.0/120", "must be an IPv6 CIDR"),
        ("cidr6", "2001:db8::1/64", "no host bits set"),
        ("cidr6", "2001:db8::/64", None),
        ("cidr4", "2001:db8::/64", "must be an IPv4 CIDR"),
        ("cidr4", "198.51.100.0/25", None),
        ("cidr4", "198.51.100.128/24", "no host bits set"),
    ],
)
def test_cel_rules_on_their_own(field, value, message):
    # The CEL rules stand even where a pattern would have let a value through.
    found = list(k8s_schema.cel_errors(crd_schema()["properties"]["spec"]["properties"][field], value))
    assert found == ([] if message is None else [found[0]])
    assert message is None or message in found[0]


def _with(path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(example())
    *parents, last = path.split(".")
    cur: Any = obj
    for part in parents:  # missing objects on the way are created
        cur = cur[int(part)] if isinstance(cur, list) else cur.setdefault(part, {})
    if value is _DELETE:
        del cur[last]
    elif isinstance(cur, list):
        cur[int(last)] = value
    else:
        cur[last] = value
    return obj


_DELETE = object()
BAD_NODECONFIGS = {
    "cidr6 missing": ("spec.cidr6", _DELETE),
    "cidr6 not a CIDR": ("spec.cidr6", "pods"),
    "cidr6 without prefix": ("spec.cidr6", "2001:db8:0:1::"),
    "cidr6 prefix over 128": ("spec.cidr6", "2001:db8::/129"),
    "cidr6 prefix too long for pods": ("spec.cidr6", "2001:db8::/121"),
    "cidr6 triple colon": ("spec.cidr6", "2001:db8:::/64"),
    "cidr6 too many groups": ("spec.cidr6", "2001:db8:0:1:0:0:0:0:0/64"),
    "cidr6 is IPv4": ("spec.cidr6", "198.51.100.0/24"),
    "cidr6 not a string": ("spec.cidr6", 20010),
    "cidr4 is IPv6": ("spec.cidr4", "2001:db8::/64"),
    "cidr4 octet over 255": ("spec.cidr4", "198.51.256.0/24"),
    "cidr4 leading zero": ("spec.cidr4", "198.051.100.0/24"),
    "cidr4 /31": ("spec.cidr4", "198.51.100.0/31"),
    "asn 0": ("spec.bgp.asn", 0),
    "asn over 32 bits": ("spec.bgp.asn", 4294967296),
    "asn negative": ("spec.bgp.asn", -1),
    "asn as string": ("spec.bgp.asn", "64512"),
    "peer asn 0": ("spec.bgp.peers.0.asn", 0),
    "peer asn over 32 bits": ("spec.bgp.peers.1.asn", 4294967296),
    "routerID IPv6": ("spec.bgp.routerID", "2001:db8::1"),
    "routerID octet over 255": ("spec.bgp.routerID", "192.0.2.256"),
    "peer address is a CIDR": ("spec.bgp.peers.0.address", "2001:db8::/64"),
    "peer address garbage": ("spec.bgp.peers.1.address", "tor2.example"),
    "peer name starts with digit": ("spec.bgp.peers.0.name", "1tor"),
    "peer name duplicated": ("spec.bgp.peers.1.name", "tor1"),
    "family flag not bool": ("spec.families.ipv6", "yes"),
    "restart time 0": ("spec.bgp.gracefulRestart.restartTime", 0),
    "restart time over 4095": ("spec.bgp.gracefulRestart.restartTime", 4096),
    "graceful restart not bool": ("spec.bgp.gracefulRestart.enabled", "on"),
    "standard community over 16 bits": ("spec.bgp.communities.anycast.standard", ["65536:1"]),
    "standard community leading zero": ("spec.bgp.communities.anycast.standard", ["064512:1"]),
    "standard community three parts": ("spec.bgp.communities.nodeBlock.standard", ["1:2:3"]),
    "large community over 32 bits": ("spec.bgp.communities.addresses.large", ["4294967296:1:1"]),
    "large community two parts": ("spec.bgp.communities.addresses.large", ["1:2"]),
    "too many communities": ("spec.bgp.communities.nodeBlock.standard", [f"1:{i}" for i in range(17)]),
    "cluster id IPv6": ("spec.bgp.routeReflectorClusterID", "2001:db8::1"),
    "bfd interval under 10 ms": ("spec.bgp.peers.0.bfd", {"minRxMs": 5}),
    "bfd multiplier 0": ("spec.bgp.peers.0.bfd", {"multiplier": 0}),
    "multihop 0": ("spec.bgp.peers.0.multihop", 0),
    "multihop 256": ("spec.bgp.peers.0.multihop", 256),
    "password as a value": ("spec.bgp.peers.0.password", "hunter2"),
    "password without key": ("spec.bgp.peers.0.password", {"secretKeyRef": {"name": "bgp"}}),
    "password secret name uppercase": ("spec.bgp.peers.0.password", {"secretKeyRef": {"name": "BGP", "key": "k"}}),
    "password key with slash": ("spec.bgp.peers.0.password", {"secretKeyRef": {"name": "bgp", "key": "a/b"}}),
    "source address garbage": ("spec.bgp.peers.0.sourceAddress", "node.example"),
    # CEL rules:
    "source address of the other family": ("spec.bgp.peers.0.sourceAddress", "192.0.2.11"),
    "route reflector client over eBGP": ("spec.bgp.peers.0.routeReflectorClient", True),
    "multihop bfd without source address": (
        "spec.bgp.peers.1",
        {"name": "tor2", "address": "203.0.113.1", "asn": 64500, "multihop": 2, "bfd": {}},
    ),
    # Caught by the CEL rules (Kubernetes IP/CIDR library), not by patterns:
    "cidr6 host bits set": ("spec.cidr6", "2001:db8:0:1::1/64"),
    "cidr4 host bits set": ("spec.cidr4", "198.51.100.1/24"),
    "ipv4 by default without cidr4": ("spec.cidr4", _DELETE),
    "announceRanges not a list": ("spec.announceRanges", "2001:db8:53::/48"),
    "announceRanges item not a CIDR": ("spec.announceRanges.0", "2001:db8:53::1"),
    "announceRanges host bits": ("spec.announceRanges.0", "2001:db8:53::1/48"),
    "announceRanges link-local": ("spec.announceRanges.0", "fe80::/64"),
    "announceRanges multicast": ("spec.announceRanges.1", "224.0.0.0/4"),
    "announceRanges loopback": ("spec.announceRanges.1", "127.0.0.0/8"),
    "announceRanges everything": ("spec.announceRanges.0", "::/0"),
    "announceRanges too many": ("spec.announceRanges", [f"2001:db8:{i:x}::/48" for i in range(65)]),
    "clusterRanges host bits": ("spec.clusterRanges", ["198.51.100.1/24"]),
    "clusterRanges everything": ("spec.clusterRanges", ["0.0.0.0/0"]),
    "clusterRanges not a CIDR": ("spec.clusterRanges", ["cluster"]),
    "natOutgoing not an object": ("spec.natOutgoing", True),
    "natOutgoing ipv4 not a bool": ("spec.natOutgoing", {"ipv4": "yes"}),
}


@pytest.mark.parametrize("case", sorted(BAD_NODECONFIGS))
def test_bad_nodeconfig_rejected_by_crd_and_model(case):
    path, value = BAD_NODECONFIGS[case]
    obj = _with(path, value)
    assert nodeconfig_errors(obj), f"{case}: the CRD schema accepted {value!r} at {path}"
    with pytest.raises(InvalidObject):
        NodeConfig.from_object(obj)


def test_valid_edge_values_accepted_by_crd_and_model():
    for path, value in [
        ("spec.bgp.asn", 4294967295),
        ("spec.bgp.peers.0.asn", 1),
        ("spec.cidr6", "2001:db8::/120"),
        ("spec.cidr6", "2001:0db8:0000:0001:0000:0000:0000:0000/64"),
        ("spec.cidr4", "198.51.100.0/30"),
        ("spec.bgp.peers.0.name", "tor_1-a"),
        ("spec.clusterRanges", ["10.0.0.0/8", "2001:db8::/32"]),
        ("spec.natOutgoing", {"ipv6": True}),
    ]:
        obj = _with(path, value)
        assert nodeconfig_errors(obj) == [], (path, value)
        NodeConfig.from_object(obj)


EXAMPLES = ("nodeconfig.yaml", "nodeconfig-tor.yaml", "nodeconfig-route-reflector.yaml")


def test_every_example_is_listed_and_valid_for_crd_and_model():
    assert {p.name for p in (DEPLOY / "examples").glob("*.yaml")} == set(EXAMPLES)
    for name in EXAMPLES:
        for obj in load(f"examples/{name}"):
            assert nodeconfig_errors(obj) == [], (name, obj["metadata"]["name"])
            NodeConfig.from_object(obj)


def test_tor_example_reads_as_documented():
    (obj,) = load("examples/nodeconfig-tor.yaml")
    bgp = NodeConfig.from_object(obj).bgp
    assert bgp is not None and bgp.graceful_restart.enabled and bgp.graceful_restart.restart_time == 120
    tor1, tor2 = bgp.peers
    assert tor1.bfd is not None and (tor1.bfd.min_rx_ms, tor1.bfd.multiplier) == (100, 3) and tor1.multihop is None
    assert tor2.multihop == 2 and str(tor2.source_address) == "192.0.2.101"
    assert {(p.password.name, p.password.key) for p in bgp.peers if p.password} == {
        ("flock-bgp-passwords", "tor1"),
        ("flock-bgp-passwords", "tor2"),
    }
    assert bgp.communities.anycast.standard == ((64512, 200),)
    assert bgp.communities.node_block.large == ((4200000101, 1, 100),)


def test_route_reflector_example_reflects_to_its_clients():
    rr, client = (NodeConfig.from_object(o) for o in load("examples/nodeconfig-route-reflector.yaml"))
    assert rr.bgp is not None and client.bgp is not None
    assert all(p.route_reflector_client and p.asn == rr.bgp.asn for p in rr.bgp.peers)
    assert str(rr.bgp.cluster_id) == "192.0.2.250"
    assert [(p.name, p.route_reflector_client) for p in client.bgp.peers] == [("rr1", False)]


def _crd_default(*fields: str) -> Any:
    node = crd_schema()["properties"]["spec"]
    for f in fields:
        node = node["items"] if f == "[]" else node["properties"][f]
    return node["default"]


def test_crd_defaults_are_the_models():
    from flock.model import Bfd, GracefulRestart

    assert _crd_default("bgp", "gracefulRestart", "enabled") is GracefulRestart().enabled is True
    assert _crd_default("bgp", "gracefulRestart", "restartTime") == GracefulRestart().restart_time
    for field, attr in (("minRxMs", "min_rx_ms"), ("minTxMs", "min_tx_ms"), ("multiplier", "multiplier")):
        assert _crd_default("bgp", "peers", "[]", "bfd", field) == getattr(Bfd(), attr)
    assert _crd_default("bgp", "peers", "[]", "routeReflectorClient") is False


@pytest.fixture(scope="module")
def community_patterns() -> dict[str, Any]:
    communities = crd_schema()["properties"]["spec"]["properties"]["bgp"]["properties"]["communities"]
    kinds = communities["properties"]["anycast"]["properties"]
    return {kind: re2.compile(kinds[kind]["items"]["pattern"]) for kind in ("standard", "large")}


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.builds(lambda a, b: f"{a}:{b}", st.integers(0, 70000), st.integers(0, 70000)),
        st.builds(
            lambda a, b, c: f"{a}:{b}:{c}", st.integers(0, 2**32 + 5), st.integers(0, 2**32 + 5), st.integers(0, 9)
        ),
        st.text(alphabet="0123456789:", max_size=34),
    )
)
def test_community_patterns_and_model_agree(community_patterns, text):
    # The CRD's item patterns (RE2, as the apiserver reads them) against the model's parser.
    for kind in ("standard", "large"):
        crd_ok = community_patterns[kind].search(text)
        obj = {
            "metadata": {"name": "n"},
            "spec": {"cidr6": "2001:db8::/64", "bgp": {"asn": 1, "routerID": "192.0.2.1"}},
        }
        obj["spec"]["bgp"]["communities"] = {"anycast": {kind: [text]}}
        try:
            NodeConfig.from_object(obj)
            model_ok = True
        except InvalidObject:
            model_ok = False
        assert bool(crd_ok) == model_ok, (kind, text)


def _pattern(*fields: str) -> Any:
    node = crd_schema()["properties"]["spec"]
    for f in fields:
        node = node["items"] if f == "[]" else node["properties"][f]
    return re2.compile(node["pattern"])


@pytest.fixture(scope="module")
def patterns() -> dict[str, Any]:
    # Compiled once, with RE2 as the apiserver reads them: hypothesis calls the
    # tests below hundreds of times.
    return {
        "cidr6": _pattern("cidr6"),
        "cidr4": _pattern("cidr4"),
        "routerID": _pattern("bgp", "routerID"),
        "address": _pattern("bgp", "peers", "[]", "address"),
    }


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**128 - 1), st.integers(0, 120))
def test_cidr6_pattern_accepts_every_ipv6_spelling(patterns, value, prefix):
    addr = ipaddress.IPv6Address(value)
    for text in (str(addr), addr.exploded):
        assert patterns["cidr6"].match(f"{text}/{prefix}"), text
        assert patterns["address"].match(text), text


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 30))
def test_ipv4_patterns_accept_every_ipv4(patterns, value, prefix):
    addr = str(ipaddress.IPv4Address(value))
    assert patterns["cidr4"].match(f"{addr}/{prefix}")
    assert patterns["routerID"].match(addr)
    assert patterns["address"].match(addr)


def _near_misses() -> st.SearchStrategy[str]:
    """Valid addresses and CIDRs with one character inserted, dropped or replaced."""
    valid = st.one_of(
        st.builds(lambda v, p: f"{ipaddress.IPv6Address(v)}/{p}", st.integers(0, 2**128 - 1), st.integers(0, 128)),
        st.builds(lambda v, p: f"{ipaddress.IPv4Address(v)}/{p}", st.integers(0, 2**32 - 1), st.integers(0, 32)),
        st.builds(lambda v: str(ipaddress.IPv6Address(v)), st.integers(0, 2**128 - 1)),
        st.builds(lambda v: str(ipaddress.IPv4Address(v)), st.integers(0, 2**32 - 1)),
    )

    def mutate(text: str, where: int, char: str, how: int) -> str:
        i = where % (len(text) + 1)
        return [text[:i] + char + text[i:], text[:i] + text[i + 1 :], text[:i] + char + text[i + 1 :]][how]

    return st.builds(mutate, valid, st.integers(0, 60), st.sampled_from("0123456789abcdefg:./"), st.integers(0, 2))


@settings(max_examples=300, deadline=None)
@given(st.one_of(_near_misses(), st.text(alphabet="0123456789abcdefABCDEF:./", max_size=45)))
def test_patterns_accept_only_what_ipaddress_parses(patterns, text):
    if patterns["cidr6"].match(text):
        assert ipaddress.IPv6Network(text, strict=False).prefixlen <= 120
    if patterns["cidr4"].match(text):
        assert ipaddress.IPv4Network(text, strict=False).prefixlen <= 30
    if patterns["routerID"].match(text):
        ipaddress.IPv4Address(text)
    if patterns["address"].match(text):
        ipaddress.ip_address(text)


# --- RBAC -------------------------------------------------------------------


def test_rbac_grants_only_read_on_what_the_agent_watches():
    objects = all_objects()
    (role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    grants = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    grants.add((group, resource, verb))
    assert grants == {
        (group, resource, verb)
        for group, resource in (
            ("", "pods"),
            ("", "namespaces"),
            ("networking.k8s.io", "networkpolicies"),
            ("policy.networking.k8s.io", "clusternetworkpolicies"),
            ("flock.fritzlab.net", "nodeconfigs"),
            ("flock.fritzlab.net", "loadbalancerpools"),  # the allow-list of Service addresses
            ("flock.fritzlab.net", "addressgroups"),  # the groups its node needs (issue 35)
            ("flock.fritzlab.net", "nodeaddressgroups"),
            ("", "services"),  # the service proxy (--service-proxy)
            ("discovery.k8s.io", "endpointslices"),
        )
        for verb in ("get", "list", "watch")
    } | {
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        # the one write: its WireGuard public key in a NodeConfig's status, never the spec (issue 36)
        ("flock.fritzlab.net", "nodeconfigs/status", "patch"),
    }
    (binding,) = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    sa = one("ServiceAccount")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": sa["metadata"]["namespace"]}
    ]
    pod = one("DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert one("DaemonSet")["metadata"]["namespace"] == sa["metadata"]["namespace"] == "kube-system"


def test_rbac_reads_only_named_secrets_in_the_agents_namespace():
    objects = all_objects()
    sa = one("ServiceAccount")
    (role,) = [o for o in objects if o["kind"] == "Role"]
    assert role["metadata"]["namespace"] == sa["metadata"]["namespace"]
    # Only by name: no resourceNames would grant every Secret in the namespace.
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["flock-bgp-passwords"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding"]
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": sa["metadata"]["namespace"]}
    ]
    # The agent reads Secrets in the namespace it runs in.
    env = {e["name"]: e for e in _containers()["flock-agent"]["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


# --- DaemonSet --------------------------------------------------------------


def _containers() -> dict[str, dict[str, Any]]:
    pod = one("DaemonSet")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["initContainers"] + pod["containers"]}


def test_daemonset_pod_runs_on_every_node_as_node_critical():
    ds = one("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["priorityClassName"] == "system-node-critical"
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    for name, c in _containers().items():
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][kind]), f"{name} lacks {kind}"


def test_daemonset_mounts_refer_to_declared_volumes():
    pod = one("DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    used = {m["name"] for c in _containers().values() for m in c["volumeMounts"]}
    assert used == set(volumes)
    host_paths = {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
    assert host_paths == {
        "/opt/cni/bin",
        "/etc/cni/net.d",
        "/",
        "/run/flock",
        "/var/lib/flock",
        "/var/run/netns",
        "/etc/flock/bird",
        "/proc/sys/net",
    }
    config_maps = {v["configMap"]["name"] for v in volumes.values() if "configMap" in v}
    assert config_maps == {o["metadata"]["name"] for o in all_objects() if o["kind"] == "ConfigMap"}


def test_install_cni_init_container_matches_the_installer_cli():
    c = _containers()["install-cni"]
    assert c["command"][0] == "flock-install-cni"
    args = installer.parse_args(c["command"][1:])
    assert (args.cni_bin_dir, args.cni_conf_dir, args.socket, args.host_root) == (
        Path("/opt/cni/bin"),
        Path("/etc/cni/net.d"),
        "/run/flock/flock.sock",
        Path("/host"),
    )
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/host"]["readOnly"] is True
    assert {"/opt/cni/bin", "/etc/cni/net.d"} <= set(mounts)


def test_install_cni_init_container_command_installs_a_working_plugin(tmp_path):
    # The init container's exact command, its mounts moved into tmp_path and this
    # machine's own root standing in for the host's.
    bin_dir, conf_dir = tmp_path / "opt/cni/bin", tmp_path / "etc/cni/net.d"
    argv = [
        a.replace("/opt/cni/bin", str(bin_dir)).replace("/etc/cni/net.d", str(conf_dir)).replace("=/host", "=/")
        for a in _containers()["install-cni"]["command"]
    ]
    script = Path(sys.executable).parent / argv[0]
    out = subprocess.run([str(script), *argv[1:]], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert json.loads((conf_dir / "01-flock.conflist").read_text())["plugins"] == [
        {"type": "flock", "socket": "/run/flock/flock.sock", "capabilities": {"portMappings": True}}
    ]
    version = subprocess.run(
        [str(bin_dir / "flock")], input="{}", env={"CNI_COMMAND": "VERSION"}, capture_output=True, text=True, timeout=30
    )
    assert version.returncode == 0, version.stderr
    assert "1.1.0" in json.loads(version.stdout)["supportedVersions"]


@pytest.mark.parametrize("present", [None, "", "# rendered by flock-agent\n"])
def test_bird_config_init_container_seeds_only_a_missing_config(tmp_path, present):
    etc, bootstrap = tmp_path / "etc/flock/bird", tmp_path / "etc/flock/bird-bootstrap"
    etc.mkdir(parents=True)
    bootstrap.mkdir(parents=True)
    (bootstrap / "bird.conf").write_text(one("ConfigMap")["data"]["bird.conf"])
    if present is not None:
        (etc / "bird.conf").write_text(present)
    command = [a.replace("/etc/flock", str(tmp_path / "etc/flock")) for a in _containers()["bird-config"]["command"]]
    assert subprocess.run(command, capture_output=True, timeout=30).returncode == 0
    expected = present or one("ConfigMap")["data"]["bird.conf"]
    assert (etc / "bird.conf").read_text() == expected


def test_no_container_is_privileged_and_every_root_filesystem_is_read_only():
    # Least privilege: each container drops every capability and adds back only
    # what the image lab showed it needs (tests/image drops each one again).
    wanted = {
        "install-cni": [],
        "bird-config": [],
        "flock-agent": ["NET_ADMIN", "SYS_ADMIN"],
        "bird": ["NET_ADMIN", "NET_BIND_SERVICE"],
    }
    for name, c in _containers().items():
        sc = c["securityContext"]
        assert not sc.get("privileged", False), name
        assert sc["allowPrivilegeEscalation"] is False, name
        assert sc["readOnlyRootFilesystem"] is True, name
        assert sc["capabilities"]["drop"] == ["ALL"], name
        assert sc["capabilities"].get("add", []) == wanted[name], name


def test_agent_container():
    c = _containers()["flock-agent"]
    assert c["env"] == [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "FLOCK_POLICY_PEERS", "value": "groups"},  # flock-controller's address groups (issue 35)
        {"name": "FLOCK_ENCRYPTION", "value": "off"},  # the cluster's switch for WireGuard (issue 36)
    ]
    from flock.agent._cli import parse_args

    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    for value in ("off", "wireguard"):  # what the manifest says, and what an operator switches it to
        settings, _ = parse_args(["--node=n1"], {**env, "FLOCK_ENCRYPTION": value})
        assert settings.encryption == value
    assert "--node=$(NODE_NAME)" in c["args"]
    assert f"--health-address=127.0.0.1:{HEALTH_PORT}" in c["args"]
    assert c["livenessProbe"]["httpGet"] == {"host": "127.0.0.1", "path": "/healthz", "port": HEALTH_PORT}
    assert c["readinessProbe"]["httpGet"] == {"host": "127.0.0.1", "path": "/readyz", "port": HEALTH_PORT}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert set(mounts) == {"/run/flock", "/var/lib/flock", "/var/run/netns", "/etc/flock/bird", "/host/proc/sys/net"}
    assert mounts["/var/run/netns"]["mountPropagation"] == "HostToContainer"
    # /proc/sys is read-only without privilege; flock.netlink writes sysctls here then.
    from flock.netlink._conn import HOST_PROC_SYS

    assert f"{HOST_PROC_SYS}/net" in mounts


def test_bird_sidecar_shares_config_and_control_socket():
    c = _containers()["bird"]
    assert c["command"] == ["bird", "-f", "-R", "-c", "/etc/flock/bird/bird.conf", "-s", "/run/flock/bird.ctl"]
    # Stopped for a restart, BIRD leaves its kernel routes and its peers keep ours (graceful restart).
    sh, flag, script = c["lifecycle"]["preStop"]["exec"]["command"]
    assert (sh, flag) == ("sh", "-c") and script.endswith("exec birdc -s /run/flock/bird.ctl graceful restart")
    # ... after the stopping agent withdrew its Service routes (a leaving node), 10 s at most
    assert "grep -q 'protocol static flock_services' /etc/flock/bird/bird.conf || break" in script
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/etc/flock/bird", "/run/flock"}
    seed = _containers()["bird-config"]
    assert "/etc/flock/bird/bird.conf" in seed["command"][-1]


def test_bootstrap_bird_conf_parses(require_bird, tmp_path):
    conf = tmp_path / "bird.conf"
    conf.write_text(one("ConfigMap")["data"]["bird.conf"])
    out = subprocess.run(["bird", "-p", "-c", str(conf)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    broken = tmp_path / "broken.conf"
    broken.write_text(conf.read_text().replace("router id", "router idd"))
    assert subprocess.run(["bird", "-p", "-c", str(broken)], capture_output=True, timeout=30).returncode != 0


def _wait_for_line(stream, needle: str, seconds: float) -> str:
    """Read *stream* until a line holds *needle*; give up after *seconds*."""
    seen = ""
    deadline = time.monotonic() + seconds
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        while needle not in seen:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise AssertionError(f"no {needle!r} within {seconds} s; got {seen!r}")
            chunk = os.read(stream.fileno(), 4096).decode()
            if not chunk:
                raise AssertionError(f"stream closed before {needle!r}; got {seen!r}")
            seen += chunk
    return seen


def test_bird_sidecar_starts_on_bootstrap_config_and_passes_its_probe(require_root, require_bird, tmp_path):
    # The sidecar's own command and liveness probe, with the shared paths moved
    # into tmp_path, and BIRD in a fresh network namespace of its own.
    etc, run = tmp_path / "etc/flock/bird", tmp_path / "run/flock"
    etc.mkdir(parents=True)
    run.mkdir(parents=True)
    (etc / "bird.conf").write_text(one("ConfigMap")["data"]["bird.conf"])

    def moved(argv: list[str]) -> list[str]:
        return [a.replace("/etc/flock/bird", str(etc)).replace("/run/flock", str(run)) for a in argv]

    sidecar = _containers()["bird"]
    bird = subprocess.Popen(["unshare", "--net", *moved(sidecar["command"])], stderr=subprocess.PIPE)
    try:
        _wait_for_line(bird.stderr, "Started", seconds=10)
        probe = subprocess.run(
            moved(sidecar["livenessProbe"]["exec"]["command"]), capture_output=True, text=True, timeout=10
        )
        assert probe.returncode == 0, probe.stderr
        assert "Daemon is up and running" in probe.stdout
        assert (run / "bird.ctl").is_socket()
    finally:
        bird.terminate()
        bird.wait(timeout=10)
        bird.stderr.close()


# --- Dockerfile -------------------------------------------------------------


def test_dockerfile_builds_from_bookworm_with_bird_and_the_package():
    text = (DEPLOY / "Dockerfile").read_text()
    # Every stage starts from the BASE_IMAGE argument, bookworm-slim unless
    # scripts/build-image passes the one it made from Debian's packages.
    assert re.findall(r"^ARG BASE_IMAGE=(\S+)$", text, re.M) == ["debian:bookworm-slim"]
    assert {f.split()[0] for f in re.findall(r"^FROM (.+)$", text, re.M)} == {"${BASE_IMAGE}"}
    installs = " ".join(re.findall(r"apt-get install [^\n]*", text))
    for package in ("bird2", "iproute2", "python3", "python3-venv", "wireguard-tools"):
        assert re.search(rf"\b{re.escape(package)}\b", installs), package
    root = DEPLOY.parent
    for sources in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M):
        for source in sources.split():
            assert (root / source).exists(), f"COPY {source}: not in the repository"


def test_bootstrap_bird_device_protocol_has_the_rendered_name():
    """birdc configure keeps a protocol of the same name and type; a renamed one
    is replaced, dropping kernel routes learned meanwhile until the next scan."""
    from flock.bird import RenderSettings, render
    from flock.model import NodeConfig
    from flock.netlink import ROUTE_PROTOCOL

    node = NodeConfig.from_object({"metadata": {"name": "n1"}, "spec": {"cidr6": "2001:db8:0:1::/64"}})
    rendered = render(node, settings=RenderSettings(route_protocol=ROUTE_PROTOCOL))
    device = re.compile(r"^\s*protocol device (\w+)", re.M)
    assert device.findall(one("ConfigMap")["data"]["bird.conf"]) == device.findall(rendered) == ["flock_device"]


def test_loadbalancerpool_schema_accepts_pools_and_refuses_host_bits() -> None:
    crd = one("CustomResourceDefinition", load("crd-loadbalancerpool.yaml"))
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    good = {
        "spec": {
            "blocks": [{"cidr": "2001:db8:ee::/64"}, {"cidr": "192.0.2.224/27"}],
            "serviceSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]},
            "communities": ["64512:100"],
            "localPreference": 100,
        },
        "status": {"ipv4": {"total": "32", "used": 1, "free": "31"}, "used": 1},
    }
    assert k8s_schema.errors(schema, good) == []
    assert k8s_schema.errors(schema, {"spec": {"blocks": [{"cidr": "192.0.2.225/27"}]}})
    assert k8s_schema.errors(schema, {"spec": {"blocks": [{"cidr": "not-a-cidr"}]}})
    assert k8s_schema.errors(schema, {"spec": {"blocks": []}})


def test_address_group_schemas_accept_slices_and_refuse_bad_members() -> None:
    crds = {c["spec"]["names"]["kind"]: c for c in load("crd-addressgroups.yaml")}
    assert {c["spec"]["scope"] for c in crds.values()} == {"Cluster"}
    assert {c["spec"]["names"]["shortNames"][0] for c in crds.values()} == {"ag", "nag"}
    groups = crds["AddressGroup"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    member = {
        "namespace": "shop",
        "name": "web-0",
        "node": "n1",
        "labels": {"app": "web"},
        "ips": ["2001:db8::1", "10.0.0.1"],
        "ports": [{"name": "http", "protocol": "TCP", "port": 443}],
    }
    good = {"group": "g1", "selection": {"anything": ["goes"]}, "members": [member]}
    assert k8s_schema.errors(groups, good) == []
    assert k8s_schema.errors(groups, {"members": []})  # no group
    assert k8s_schema.errors(groups, {"group": "g" * 64})
    assert k8s_schema.errors(groups, {"group": "g", "members": [{**member, "ports": [{"port": 70000}]}]})
    assert k8s_schema.errors(groups, {"group": "g", "members": [{**member, "ports": [{"port": 1, "protocol": "X"}]}]})
    assert k8s_schema.errors(groups, {"group": "g", "members": [{**member, "ips": ["a", "b", "c"]}]})
    assert k8s_schema.errors(groups, {"group": "g", "members": [{"name": "x"}]})
    assert k8s_schema.errors(groups, {"group": "g", "members": [member] * 1001})
    nodes = crds["NodeAddressGroups"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert k8s_schema.errors(nodes, {"groups": ["g1", "g2"], "revision": 7}) == []
    assert k8s_schema.errors(nodes, {"groups": "g1"})
    assert k8s_schema.errors(nodes, {"groups": ["g1", "g1"]}) == ["groups: Duplicate value: 'g1'"]
    assert nodes["properties"]["groups"]["x-kubernetes-list-type"] == "set"
    for schema in (groups, nodes):  # structural: every node has a type
        assert all("type" in node for _, node in _schema_nodes(schema))


def test_controller_rbac_writes_only_status_and_its_lease() -> None:
    objects = load("controller-rbac.yaml")
    (role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    writes = {
        (r["apiGroups"][0], res)
        for r in role["rules"]
        for res in r["resources"]
        if set(r["verbs"]) - {"get", "list", "watch"}
    }
    # its status writes, Events (created, the same one bumped when told again; no list, no delete),
    # and the address groups it computes (issue 35)
    assert writes == {
        ("", "services/status"),
        ("flock.fritzlab.net", "loadbalancerpools/status"),
        ("", "events"),
        ("flock.fritzlab.net", "addressgroups"),
        ("flock.fritzlab.net", "nodeaddressgroups"),
    }
    (groups,) = [r for r in role["rules"] if "addressgroups" in r["resources"]]
    assert set(groups["verbs"]) == {"get", "list", "watch", "create", "update", "patch", "delete"}
    reads = {(r["apiGroups"][0], res) for r in role["rules"] for res in r["resources"] if "watch" in r["verbs"]}
    assert {
        ("", "pods"),
        ("", "namespaces"),
        ("networking.k8s.io", "networkpolicies"),
        ("policy.networking.k8s.io", "clusternetworkpolicies"),
    } <= reads
    (events,) = [r for r in role["rules"] if "events" in r["resources"]]
    assert set(events["verbs"]) == {"create", "get", "update"}
    (lease,) = [o for o in objects if o["kind"] == "Role"]
    assert lease["metadata"]["namespace"] == "kube-system"
    assert {n for r in lease["rules"] for n in r.get("resourceNames", [])} == {"flock-controller"}


def test_the_controller_deployment_is_unprivileged_and_runs_as_its_account() -> None:
    (deployment,) = load("controller.yaml")
    assert deployment["kind"] == "Deployment" and deployment["spec"]["replicas"] == 2  # a writer, a standby
    pod = deployment["spec"]["template"]["spec"]
    (sa,) = [o for o in load("controller-rbac.yaml") if o["kind"] == "ServiceAccount"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"] == "flock-controller"
    assert deployment["metadata"]["namespace"] == sa["metadata"]["namespace"]
    assert not pod.get("hostNetwork") and "volumes" not in pod
    (container,) = pod["containers"]
    assert container["command"][0] == "flock-controller"  # in-cluster: the service account's token and CA
    security = container["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] != 0 and not security["allowPrivilegeEscalation"]
    assert security["readOnlyRootFilesystem"] and security["capabilities"]["drop"] == ["ALL"]
    assert {e["name"] for e in container["env"]} == {"POD_NAME"}  # its identity in the Lease
    assert container["resources"]["limits"]["memory"] and container["image"].split(":")[0] == "flock"
    # its probes reach the port it serves them on (flock-controller --health-port)
    (port,) = container["ports"]
    assert f"--health-port={port['containerPort']}" in container["command"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
    assert "--health-port" in controller_help()


def controller_help() -> str:
    return subprocess.run(
        [sys.executable, "-m", "flock.controller", "--help"], capture_output=True, text=True, check=True
    ).stdout


def test_nodeconfig_status_is_written_by_its_own_node_only():
    """The policy binds flock's service account (rbac.yaml's) to the NodeConfig named after the node its token
    was issued for, on the status subresource, and denies: the lab's API server enforces the same."""
    from flock.apiserver._admission import NODE_NAME_EXTRA, NODECONFIG_STATUS_POLICY

    policy, binding = load("admission-nodeconfig-status.yaml")
    sa = one("ServiceAccount")
    assert policy["metadata"]["name"] == binding["spec"]["policyName"] == NODECONFIG_STATUS_POLICY
    assert binding["spec"]["validationActions"] == ["Deny"] and policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["nodeconfigs/status"] and "UPDATE" in rule["operations"]
    account = f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
    assert account in policy["spec"]["matchConditions"][0]["expression"]
    (check,) = policy["spec"]["validations"]
    assert NODE_NAME_EXTRA in check["expression"] and "object.metadata.name" in check["expression"]
    assert check["reason"] == "Forbidden"
