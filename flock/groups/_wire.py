"""AddressGroup and NodeAddressGroups as the API server holds them: encoding (flock-controller) and
decoding (the agent), with every field checked on the way in.

An **AddressGroup** is one slice of one group: ``metadata.name`` ``<group>-<n>``, the label
``flock.fritzlab.net/group: <group>`` (what agents select on), ``group``, ``selection`` (what the
group is, for a person reading it), and ``members``: per pod its namespace, name, node, labels,
addresses and named ports — what the agent's selectors read, and nothing more (no status, no
managedFields: ~150 bytes a pod where the Pod object is ~5.6 KiB).

A **NodeAddressGroups** (one per node, named after it) lists the groups that node's pods need.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

from flock.model import InvalidObject
from flock.policy import NamedPort, PolicyPod, Protocol
from flock.policy._groups import GroupSpec, NamedSelection
from flock.policy._model import LabelSelector, labels_field

GROUP, VERSION = "flock.fritzlab.net", "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
ADDRESS_GROUPS, NODE_GROUPS = "addressgroups", "nodeaddressgroups"
GROUP_LABEL = f"{GROUP}/group"
MANAGED_BY = {"app.kubernetes.io/managed-by": "flock-controller"}
MAX_MEMBERS = 100  # a slice: one pod's change rewrites ≤ 100 members (~15 KiB), as EndpointSlice's default


def slice_name(group: str, index: int) -> str:
    return f"{group}-{index}"


def slice_index(group: str, name: str) -> int | None:
    """*name*'s slice number in *group*, or None if *name* is not one of its slices."""
    prefix = group + "-"
    if not name.startswith(prefix):
        return None
    tail = name[len(prefix) :]
    if not tail.isdigit() or len(tail) > 5 or (len(tail) > 1 and tail[0] == "0"):
        return None
    return int(tail)


def _selector(sel: LabelSelector | None) -> dict[str, Any] | None:
    if sel is None:
        return None
    out: dict[str, Any] = {}
    if sel.match_labels:
        out["matchLabels"] = dict(sel.match_labels)
    if sel.match_expressions:
        out["matchExpressions"] = [
            {"key": r.key, "operator": r.operator.value, **({"values": list(r.values)} if r.values else {})}
            for r in sel.match_expressions
        ]
    return out


def selection_of(spec: GroupSpec) -> dict[str, Any]:
    """What a group selects, for a person (``kubectl get ag -o yaml``); agents never read it."""
    if isinstance(spec, NamedSelection):
        return {"namedPorts": [{"name": n, "protocol": p.value} for n, p in spec.ports]}
    out: dict[str, Any] = {}
    if spec.scope is not None:
        out["namespace"] = spec.scope
    if spec.namespace_selector is not None:
        out["namespaceSelector"] = _selector(spec.namespace_selector)
    out["podSelector"] = _selector(spec.pod_selector) if spec.pod_selector is not None else {}
    return out


def encode_member(pod: PolicyPod) -> dict[str, Any]:
    member: dict[str, Any] = {"namespace": pod.namespace, "name": pod.name}
    if pod.node:
        member["node"] = pod.node
    if pod.labels:
        member["labels"] = dict(pod.labels)
    member["ips"] = [str(a) for a in pod.addresses]
    if pod.named_ports:
        member["ports"] = [{"name": p.name, "protocol": p.protocol.value, "port": p.port} for p in pod.named_ports]
    return member


def address_group(group: str, index: int, spec: GroupSpec, members: Iterable[PolicyPod]) -> dict[str, Any]:
    """The AddressGroup object of slice *index* of *group* (members by key: the same body for the same pods)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "AddressGroup",
        "metadata": {"name": slice_name(group, index), "labels": {GROUP_LABEL: group, **MANAGED_BY}},
        "group": group,
        "selection": selection_of(spec),
        "members": [encode_member(p) for p in sorted(members, key=lambda p: p.key)],
    }


def node_address_groups(node: str, groups: Iterable[str]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "NodeAddressGroups",
        "metadata": {"name": node, "labels": dict(MANAGED_BY)},
        "groups": sorted(groups),
    }


def _text(obj: str, field: str, raw: Any, limit: int = 253) -> str:
    if not isinstance(raw, str) or not raw or len(raw) > limit:
        raise InvalidObject("AddressGroup", obj, field, raw, f"a string of 1-{limit} characters")
    return raw


def decode_member(obj: str, i: int, raw: Any) -> PolicyPod:
    """One member of AddressGroup *obj* → the pod as a remote peer (``host_veth`` None); raises
    :class:`InvalidObject` naming the field."""
    where = f"members[{i}]"
    if not isinstance(raw, Mapping):
        raise InvalidObject("AddressGroup", obj, where, raw, "an object")
    namespace = _text(obj, f"{where}.namespace", raw.get("namespace"), 63)
    name = _text(obj, f"{where}.name", raw.get("name"))
    node = raw.get("node") or ""
    if not isinstance(node, str) or len(node) > 253:
        raise InvalidObject("AddressGroup", obj, f"{where}.node", node, "a node name")
    labels = labels_field("AddressGroup", obj, f"{where}.labels", raw.get("labels"))
    ips = raw.get("ips") or []
    if not isinstance(ips, list) or len(ips) > 2:
        raise InvalidObject("AddressGroup", obj, f"{where}.ips", ips, "at most 2 addresses")
    addresses = []
    for j, text in enumerate(ips):
        try:
            addresses.append(ipaddress.ip_address(text if isinstance(text, str) else ""))
        except ValueError:
            raise InvalidObject("AddressGroup", obj, f"{where}.ips[{j}]", text, "an IP address") from None
    ports = []
    raw_ports = raw.get("ports") or []
    if not isinstance(raw_ports, list) or len(raw_ports) > 100:
        raise InvalidObject("AddressGroup", obj, f"{where}.ports", raw_ports, "at most 100 named ports")
    for j, p in enumerate(raw_ports):
        field = f"{where}.ports[{j}]"
        if not isinstance(p, Mapping):
            raise InvalidObject("AddressGroup", obj, field, p, "a named port")
        number = p.get("port")
        if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= 65535:
            raise InvalidObject("AddressGroup", obj, f"{field}.port", number, "a port number 1-65535")
        try:
            protocol = Protocol(p.get("protocol") or "TCP")
        except ValueError:
            raise InvalidObject(
                "AddressGroup", obj, f"{field}.protocol", p.get("protocol"), "TCP, UDP or SCTP"
            ) from None
        ports.append(NamedPort(_text(obj, f"{field}.name", p.get("name"), 15), protocol, number))
    return PolicyPod(namespace, name, labels, tuple(addresses), tuple(ports), node=node)


def decode_members(obj: Mapping[str, Any]) -> tuple[str, dict[str, PolicyPod], list[InvalidObject]]:
    """An AddressGroup → (its group, its members by pod key, the members refused).  A refused member is
    left out (fail closed: not a peer), the others stand."""
    name = str((obj.get("metadata") or {}).get("name", ""))[:253]
    group = obj.get("group")
    if not isinstance(group, str) or not group:
        raise InvalidObject("AddressGroup", name, "group", group, "the group's name")
    raw = obj.get("members") or []
    if not isinstance(raw, list):
        raise InvalidObject("AddressGroup", name, "members", raw, "a list")
    members: dict[str, PolicyPod] = {}
    refused: list[InvalidObject] = []
    for i, item in enumerate(raw):
        try:
            pod = decode_member(name, i, item)
        except InvalidObject as exc:
            refused.append(exc)
            continue
        members[pod.key] = pod
    return group, members, refused


def decode_node_groups(obj: Mapping[str, Any]) -> frozenset[str]:
    """A NodeAddressGroups → the group names (raises :class:`InvalidObject`)."""
    name = str((obj.get("metadata") or {}).get("name", ""))[:253]
    raw = obj.get("groups") or []
    if not isinstance(raw, list) or not all(isinstance(g, str) and 0 < len(g) <= 63 for g in raw):
        raise InvalidObject("NodeAddressGroups", name, "groups", raw, "a list of group names")
    return frozenset(raw)
