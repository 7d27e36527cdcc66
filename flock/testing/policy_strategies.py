"""Hypothesis strategies for policy tests: random clusters as Kubernetes objects, through ``from_object``.

Shared by the property tests of the compiler and engine (tests/policy/test_properties.py) and of
``flockctl policy explain`` (tests/policy/test_explain.py).  A cluster has namespaces x, y, z (z now
and then unknown to the watchers), pods on the two nodes of :data:`NODES` (IPv6, some IPv4 too, named
container ports from :data:`NAMED`), NetworkPolicies with every construct of networking.k8s.io/v1;
:func:`tiered` adds ClusterNetworkPolicies of both tiers and labelled Nodes.

:func:`examples` scales a property's example count by ``FLOCK_PROPERTY_SCALE`` (.ci/run runs the
properties again with 4 after the main suite: a deeper search than the main suite's time allows).
"""

from __future__ import annotations

import itertools
import os

from hypothesis import strategies as st

from flock.policy import ClusterNetworkPolicy, Namespace, NetworkPolicy, PolicyNode, PolicyPod, Protocol

NODES = {"n1": ("2001:db8:ffff::1", "198.51.100.1"), "n2": ("2001:db8:ffff::2", "198.51.100.2")}
EXTERNAL = ("2001:db8:ff::5", "203.0.113.5", "2001:db8:1::ff")  # the last: inside n1's pod range, no pod
KEYS = ("app", "role", "team")
VALUES = ("a", "b", "c")
PORTS = ((80, Protocol.TCP), (81, Protocol.TCP), (80, Protocol.UDP), (53, Protocol.UDP), (80, Protocol.SCTP))
NAMED = (("http", 80, "TCP"), ("alt", 81, "TCP"), ("dns", 53, "UDP"), ("http", 81, "TCP"), ("sig", 80, "SCTP"))
CIDRS = {
    "2001:db8::/32": ["2001:db8:1::/64", "2001:db8:2::/112", "2001:db8:ff::/48"],
    "2001:db8:1::/64": ["2001:db8:1::/126", "2001:db8:1::10/124"],
    "2001:db8:2::/64": [],
    "192.0.2.0/24": ["192.0.2.128/25", "192.0.2.0/30"],
    "0.0.0.0/0": ["192.0.2.0/24"],
    "::/0": ["2001:db8:ffff::/48"],
}

PROPERTY_SCALE = float(os.environ.get("FLOCK_PROPERTY_SCALE", "1"))


def examples(n: int) -> int:
    """*n* examples, times ``FLOCK_PROPERTY_SCALE`` (at least one)."""
    return max(1, int(n * PROPERTY_SCALE))


labels = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3)


@st.composite
def selectors(draw: st.DrawFn) -> dict:
    sel: dict = {}
    ml = draw(labels)
    if ml:
        sel["matchLabels"] = ml
    exprs = []
    for _ in range(draw(st.integers(0, 2))):
        op = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]))
        e: dict[str, object] = {"key": draw(st.sampled_from(KEYS)), "operator": op}
        if op in ("In", "NotIn"):
            e["values"] = draw(st.lists(st.sampled_from(VALUES), min_size=1, max_size=2))
        exprs.append(e)
    if exprs:
        sel["matchExpressions"] = exprs
    return sel


@st.composite
def dense_selectors(draw: st.DrawFn) -> dict:
    """Selectors that match often: empty, one label pair, or one expression."""
    kind = draw(st.sampled_from(["empty", "empty", "pair", "pair", "pair", "expression", "namespace"]))
    if kind == "empty":
        return {}
    if kind == "namespace":
        return {"matchLabels": {"kubernetes.io/metadata.name": draw(st.sampled_from(["x", "y", "z"]))}}
    if kind == "pair":
        return {"matchLabels": {draw(st.sampled_from(KEYS)): draw(st.sampled_from(VALUES))}}
    return draw(selectors())


@st.composite
def peers(
    draw: st.DrawFn,
    selector: st.SearchStrategy[dict] | None = None,
    kinds: tuple[str, ...] = ("pod", "ns", "both", "block"),
) -> dict:
    selector = selectors() if selector is None else selector
    kind = draw(st.sampled_from(kinds))
    if kind == "block":
        cidr = draw(st.sampled_from(sorted(CIDRS)))
        block: dict = {"cidr": cidr}
        excepts = draw(st.lists(st.sampled_from(CIDRS[cidr]), unique=True)) if CIDRS[cidr] else []
        if excepts:
            block["except"] = excepts
        return {"ipBlock": block}
    peer: dict = {}
    if kind in ("pod", "both"):
        peer["podSelector"] = draw(selector)
    if kind in ("ns", "both"):
        peer["namespaceSelector"] = draw(selector)
    return peer


@st.composite
def ports(draw: st.DrawFn) -> dict:
    p: dict = {}
    proto = draw(st.sampled_from([None, "TCP", "UDP", "SCTP"]))
    if proto:
        p["protocol"] = proto
    kind = draw(st.sampled_from(["none", "num", "range", "named"]))
    if kind == "num":
        p["port"] = draw(st.sampled_from([53, 80, 81, 82]))
    elif kind == "range":
        p["port"] = draw(st.sampled_from([50, 80]))
        p["endPort"] = draw(st.sampled_from([80, 81, 90]))
    elif kind == "named":
        p["port"] = draw(st.sampled_from(["http", "alt", "dns", "sig", "nope"]))
    return p


@st.composite
def named_ports(draw: st.DrawFn) -> dict:
    """A named port as pods declare it (its protocol given, or defaulted to TCP), or now and then not quite."""
    name, _, proto = draw(st.sampled_from(NAMED))
    if draw(st.integers(0, 5)) == 0:  # a name no pod declares, or one with another protocol
        return (
            {"port": "nope"} if draw(st.booleans()) else {"port": name, "protocol": "UDP" if proto != "UDP" else "TCP"}
        )
    return {"port": name} if proto == "TCP" and draw(st.booleans()) else {"port": name, "protocol": proto}


@st.composite
def rules(
    draw: st.DrawFn,
    peer_key: str,
    selector: st.SearchStrategy[dict] | None = None,
    port: st.SearchStrategy[dict] | None = None,
) -> dict:
    r: dict = {}
    if port is not None:  # named ports: the peers each kind of named-port set is for, alone and together
        shape = draw(st.sampled_from(["none", "selectors", "selectors", "block", "mixed"]))
        pods = peers(selector, ("pod", "ns", "both"))
        if shape == "selectors":
            r[peer_key] = draw(st.lists(pods, min_size=1, max_size=2))
        elif shape != "none":
            r[peer_key] = [draw(peers(selector, ("block",)))] + ([draw(pods)] if shape == "mixed" else [])
    elif draw(st.booleans()):
        r[peer_key] = draw(st.lists(peers(selector), max_size=2))
    if draw(st.booleans()) or port is not None:
        r["ports"] = draw(st.lists(ports() if port is None else port, max_size=2, min_size=0 if port is None else 1))
    return r


@st.composite
def policies(
    draw: st.DrawFn,
    index: int,
    selector: st.SearchStrategy[dict] | None = None,
    port: st.SearchStrategy[dict] | None = None,
) -> dict:
    spec: dict = {"podSelector": draw(selectors() if selector is None else selector)}
    if port is not None:  # one direction each: an egress rule decides only where the destination's ingress is open
        egress = ("egress", "to", "Egress")
        key, peer_key, kind = draw(st.sampled_from([("ingress", "from", "Ingress"), egress, egress]))
        spec[key] = draw(st.lists(rules(peer_key, selector, port), min_size=1, max_size=2))
        spec["policyTypes"] = [kind]
    elif draw(st.booleans()):
        spec["ingress"] = draw(st.lists(rules("from", selector, port), max_size=2))
    if port is None and draw(st.booleans()):
        spec["egress"] = draw(st.lists(rules("to", selector, port), max_size=2))
    if port is None and draw(st.booleans()):
        spec["policyTypes"] = draw(
            st.lists(st.sampled_from(["Ingress", "Egress"]), min_size=1, max_size=2, unique=True)
        )
    ns = draw(st.sampled_from(["x", "y", "z"]))
    return {"metadata": {"namespace": ns, "name": f"p{index}"}, "spec": spec}


# (NetworkPolicies, Namespaces, Pods); with ClusterNetworkPolicies and Nodes
Cluster = tuple[list[NetworkPolicy], list[Namespace], list[PolicyPod]]
Tiered = tuple[Cluster, list[ClusterNetworkPolicy], list[PolicyNode]]


@st.composite
def clusters(
    draw: st.DrawFn,
    names: tuple[str, ...] = ("a", "b", "c"),
    max_policies: int = 4,
    selector: st.SearchStrategy[dict] | None = None,
    port: st.SearchStrategy[dict] | None = None,
) -> Cluster:
    namespaces = [
        Namespace.from_object({"metadata": {"name": name, "labels": draw(labels)}})
        for name in ("x", "y", "z")
        if name != "z" or draw(st.booleans())  # z may be unknown to the watcher: only its name label
    ]
    pods = []
    counter = itertools.count(1)
    for ns in ("x", "y", "z"):
        for name in draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names))):
            node = draw(st.sampled_from(sorted(NODES)))
            n = next(counter)
            sub = 1 if node == "n1" else 2
            ips = [{"ip": f"2001:db8:{sub}::{n:x}"}]
            if draw(st.booleans()):
                ips.append({"ip": f"192.0.2.{n + (0 if node == 'n1' else 128)}"})
            container_ports = [
                {"name": nm, "containerPort": num, "protocol": proto}
                for nm, num, proto in draw(st.lists(st.sampled_from(NAMED), max_size=2, unique_by=lambda t: t[0]))
            ]
            obj = {
                "metadata": {"namespace": ns, "name": name, "labels": draw(labels)},
                "spec": {"nodeName": node, "containers": [{"name": "c", "ports": container_ports}]},
                "status": {"podIPs": ips, "phase": "Running"},
            }
            pods.append(PolicyPod.from_object(obj))
    pols = [
        NetworkPolicy.from_object(draw(policies(i, selector, port))) for i in range(draw(st.integers(0, max_policies)))
    ]
    return pols, namespaces, pods


# ---- ClusterNetworkPolicy: the Admin and Baseline tiers, and Nodes ----------------------------

NETWORKS = (
    "2001:db8::/32",
    "2001:db8:1::/64",
    "2001:db8:2::/48",
    "2001:db8:ffff::1/128",
    "::/0",
    "192.0.2.0/24",
    "192.0.2.128/25",
    "198.51.100.0/24",
    "0.0.0.0/0",
)
ZONES = ("a", "b")


@st.composite
def policy_nodes(draw: st.DrawFn, name: str) -> PolicyNode:
    labels_ = {"zone": draw(st.sampled_from(ZONES))} if draw(st.integers(0, 3)) else {}
    addresses = [{"type": "InternalIP", "address": a} for a in NODES[name]] + [{"type": "Hostname", "address": name}]
    return PolicyNode.from_object({"metadata": {"name": name, "labels": labels_}, "status": {"addresses": addresses}})


@st.composite
def cnp_peers(draw: st.DrawFn, direction: str) -> dict:
    kinds = ["namespaces", "pods", "pods"] + (["nodes", "networks", "networks"] if direction == "egress" else [])
    if draw(st.integers(0, 15)) == 0:
        kinds = ["unknown"]
    kind = draw(st.sampled_from(kinds))
    if kind == "namespaces":
        return {"namespaces": draw(dense_selectors())}
    if kind == "pods":
        return {"pods": {"namespaceSelector": draw(dense_selectors()), "podSelector": draw(dense_selectors())}}
    if kind == "nodes":
        return {"nodes": draw(st.sampled_from([{}, {"matchLabels": {"zone": "a"}}, {"matchLabels": {"zone": "b"}}]))}
    if kind == "networks":
        return {"networks": draw(st.lists(st.sampled_from(NETWORKS), min_size=1, max_size=3, unique=True))}
    return draw(st.sampled_from([{"domainNames": ["example.org"]}, {"services": {"name": "x"}}]))


@st.composite
def cnp_protocols(draw: st.DrawFn) -> dict:
    kind = draw(st.sampled_from(["number", "number", "range", "named", "named", "unknown"]))
    if kind == "named":
        return {"destinationNamedPort": draw(st.sampled_from(["http", "alt", "dns", "sig", "nope"]))}
    if kind == "unknown" and draw(st.integers(0, 3)) == 0:
        return {"icmp": {"type": 8}}
    proto = draw(st.sampled_from(["tcp", "udp", "sctp"]))
    if kind == "range":
        start = draw(st.sampled_from([50, 79, 80]))
        return {proto: {"destinationPort": {"range": {"start": start, "end": draw(st.sampled_from([81, 90]))}}}}
    return {proto: {"destinationPort": {"number": draw(st.sampled_from([53, 80, 81]))}}}


@st.composite
def cnp_rules(draw: st.DrawFn, direction: str) -> dict:
    rule: dict = {
        "action": draw(st.sampled_from(["Accept", "Deny", "Pass"])),
        "from" if direction == "ingress" else "to": draw(st.lists(cnp_peers(direction), min_size=1, max_size=2)),
    }
    if draw(st.booleans()):
        rule["protocols"] = draw(st.lists(cnp_protocols(), min_size=1, max_size=2))
    if draw(st.booleans()):
        rule["name"] = draw(st.sampled_from(["allow-web", "deny-all", "pass-dns"]))
    return rule


@st.composite
def cluster_policies(draw: st.DrawFn, index: int) -> ClusterNetworkPolicy:
    if draw(st.booleans()):
        subject: dict = {"namespaces": draw(dense_selectors())}
    else:
        subject = {"pods": {"namespaceSelector": draw(dense_selectors()), "podSelector": draw(dense_selectors())}}
    spec: dict = {
        "tier": draw(st.sampled_from(["Admin", "Baseline"])),
        "priority": draw(st.integers(0, 3)),  # ties are likely: the order by name decides them
        "subject": subject,
    }
    for direction in ("ingress", "egress"):
        if draw(st.booleans()):
            spec[direction] = draw(st.lists(cnp_rules(direction), min_size=1, max_size=3))
    return ClusterNetworkPolicy.from_object({"metadata": {"name": f"c{index}"}, "spec": spec})


@st.composite
def tiered(
    draw: st.DrawFn, names: tuple[str, ...] = ("a", "b", "c"), max_cnps: int = 4, max_policies: int = 2
) -> Tiered:
    """A cluster with NetworkPolicies, ClusterNetworkPolicies of both tiers and labelled nodes."""
    cluster = draw(clusters(names, max_policies, dense_selectors()))
    cnps = [draw(cluster_policies(i)) for i in range(draw(st.integers(1, max_cnps)))]
    nodes = [draw(policy_nodes(name)) for name in sorted(NODES)]
    return cluster, cnps, nodes


@st.composite
def tiered_maybe_unlisted(draw: st.DrawFn) -> tuple[Cluster, list[ClusterNetworkPolicy], list[PolicyNode] | None]:
    """:func:`tiered`, and now and then its Nodes not listed (None): the nodes peers fail closed."""
    cluster, cnps, nodes = draw(tiered())
    return cluster, cnps, None if draw(st.integers(0, 3)) == 0 else nodes
