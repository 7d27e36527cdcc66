"""What kube-apiserver checks and fills in before it stores an object, per kind.

Validation follows ``pkg/apis/core/validation`` and ``pkg/apis/networking/validation``
for the fields flock reads (labels, label selectors, NetworkPolicy peers and
ports, a Node's status.addresses); defaulting follows the v1 defaulters (a
NetworkPolicy's ``policyTypes`` and port protocols, a Namespace's finalizer and
phase).  A Service is defaulted here and validated by the store with its allocations
(:mod:`._services`, :mod:`._service_alloc`); an EndpointSlice is checked as
``pkg/apis/discovery/validation`` does (:mod:`._endpointslices`).  A ClusterNetworkPolicy,
a custom resource, is pruned and checked against its CRD's schema and CEL rules instead
(:mod:`._cnp`).  The API server also
labels every Namespace with ``kubernetes.io/metadata.name: <name>``, overriding
whatever the client sent, so ``namespaceSelector`` can select by name.

Every refusal is a 422 ``Invalid`` Status naming the field, as the real server's.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any

from ._cnp import admit_cluster_network_policy
from ._crds import admit_crd
from ._endpointslices import admit_endpoint_slice
from ._resources import (
    CLUSTERNETWORKPOLICIES,
    CUSTOMRESOURCEDEFINITIONS,
    ENDPOINTSLICES,
    NAMESPACES,
    NETWORKPOLICIES,
    NODES,
    PODS,
    SERVICES,
    Resource,
)
from ._services import default_service
from ._status import Invalid, StatusError
from ._validation import is_label_key, is_port, is_port_name, label

NAME_LABEL = "kubernetes.io/metadata.name"

_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?\Z")
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
_PROTOCOLS = ("TCP", "UDP", "SCTP")
_POLICY_TYPES = ("Ingress", "Egress")


# deploy/admission-nodeconfig-status.yaml: the ValidatingAdmissionPolicy this server enforces natively.
NODECONFIG_STATUS_POLICY = "flock-nodeconfig-status-own-node"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


def admit_nodeconfig_status(node_claim: str | None, name: str) -> None:
    """A write of NodeConfig *name*'s status by a token bound to node *node_claim* (None: a token bound to
    no node, as an administrator's: not the policy's concern) is refused unless it is that node's own."""
    if node_claim is not None and node_claim != name:
        raise StatusError(
            403,
            f'nodeconfigs.flock.fritzlab.net "{name}" is forbidden: ValidatingAdmissionPolicy '
            f"'{NODECONFIG_STATUS_POLICY}' with binding '{NODECONFIG_STATUS_POLICY}' denied request: "
            f"flock-agent may write the status of its own node's NodeConfig only "
            f"(the token's {NODE_NAME_EXTRA} is {node_claim!r})",
            reason="Forbidden",
        )


def invalid(resource: Resource, name: str, field: str, value: Any, why: str) -> StatusError:
    shown = repr(value)
    if len(shown) > 200:
        shown = shown[:200] + "…"
    return StatusError(
        422,
        f'{resource.kind} "{name}" is invalid: {field}: {why} (got {shown})',
        details={"name": name, "kind": resource.kind, "causes": [{"field": field, "message": why}]},
    )


def admit(resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
    """Validate and default *obj* (already a private copy; changed in place and returned).

    Raises the 422 StatusError the real API server would answer.
    """
    name = str(obj["metadata"].get("name"))
    try:
        _check_string_map(obj["metadata"], "labels", label_map=True)
        _check_string_map(obj["metadata"], "annotations", label_map=False)
        if resource == NAMESPACES:
            _namespace(obj)
        elif resource == NETWORKPOLICIES:
            _network_policy(obj)
        elif resource == CLUSTERNETWORKPOLICIES:
            admit_cluster_network_policy(obj)  # a custom resource: pruned, then its CRD's schema and rules
        elif resource == NODES:
            _node(obj)
        elif resource == CUSTOMRESOURCEDEFINITIONS:
            admit_crd(obj)
        elif resource == SERVICES:
            default_service(obj)  # validated by the store with its allocations (see _service_alloc)
        elif resource == ENDPOINTSLICES:
            admit_endpoint_slice(obj)
        elif resource.requires_spec:
            if not isinstance(obj.get("spec"), dict):
                raise Invalid("spec", obj.get("spec"), "Required value")
            if resource == PODS:
                _pod(obj["spec"])
    except Invalid as exc:
        raise invalid(resource, name, exc.field, exc.value, exc.why) from None
    return obj


# ---- kinds ------------------------------------------------------------------


def _namespace(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        raise Invalid("spec", spec, "must be an object")
    spec.setdefault("finalizers", ["kubernetes"])
    obj["status"] = {"phase": "Active"}
    labels = obj["metadata"].get("labels") or {}
    obj["metadata"]["labels"] = {**labels, NAME_LABEL: obj["metadata"]["name"]}


def _node(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        raise Invalid("spec", spec, "must be an object")
    status = obj.get("status")
    if status is None:
        return
    if not isinstance(status, dict):
        raise Invalid("status", status, "must be an object")
    addresses = status.get("addresses")
    if addresses is None:
        return
    if not isinstance(addresses, list):
        raise Invalid("status.addresses", addresses, "must be a list")
    for i, entry in enumerate(addresses):
        where = f"status.addresses[{i}]"
        if not isinstance(entry, dict):
            raise Invalid(where, entry, "must be an object")
        for key in ("type", "address"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise Invalid(f"{where}.{key}", entry.get(key), "Required value")


def _pod(spec: dict[str, Any]) -> None:
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise Invalid("spec.containers", containers, "Required value")
    for i, c in enumerate(containers):
        if not isinstance(c, dict) or not c.get("name") or not c.get("image"):
            raise Invalid(f"spec.containers[{i}]", c, "name and image are required")
        ports = c.get("ports", [])
        if not isinstance(ports, list):
            raise Invalid(f"spec.containers[{i}].ports", ports, "must be a list")
        for j, p in enumerate(ports):
            where = f"spec.containers[{i}].ports[{j}]"
            if not isinstance(p, dict):
                raise Invalid(where, p, "must be an object")
            port = p.get("containerPort")
            if not is_port(port):
                raise Invalid(f"{where}.containerPort", port, "must be between 1 and 65535, inclusive")
            p.setdefault("protocol", "TCP")
            if p["protocol"] not in _PROTOCOLS:
                raise Invalid(f"{where}.protocol", p["protocol"], f"supported values: {', '.join(_PROTOCOLS)}")
            if "name" in p and not is_port_name(p["name"]):
                raise Invalid(f"{where}.name", p["name"], "must be an IANA_SVC_NAME (at most 15 characters)")


def _network_policy(obj: dict[str, Any]) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise Invalid("spec", spec, "Required value")
    _selector(spec.get("podSelector"), "spec.podSelector", required=True)
    for direction, peers_key in (("ingress", "from"), ("egress", "to")):
        rules = spec.get(direction)
        if rules is None:
            continue
        if not isinstance(rules, list):
            raise Invalid(f"spec.{direction}", rules, "must be a list")
        for i, rule in enumerate(rules):
            where = f"spec.{direction}[{i}]"
            if not isinstance(rule, dict):
                raise Invalid(where, rule, "must be an object")
            for j, port in enumerate(_list(rule, "ports", where)):
                _policy_port(port, f"{where}.ports[{j}]")
            for j, peer in enumerate(_list(rule, peers_key, where)):
                _peer(peer, f"{where}.{peers_key}[{j}]")
    types = spec.get("policyTypes")
    if types is None or types == []:
        # The v1 defaulter: Ingress always, Egress when there are egress rules.
        spec["policyTypes"] = ["Ingress", *(["Egress"] if spec.get("egress") else [])]
    else:
        if not isinstance(types, list) or len(types) > 2 or len(set(map(str, types))) != len(types):
            raise Invalid("spec.policyTypes", types, "at most Ingress and Egress, each once")
        for i, t in enumerate(types):
            if t not in _POLICY_TYPES:
                raise Invalid(f"spec.policyTypes[{i}]", t, "supported values: Ingress, Egress")


def _list(rule: Mapping[str, Any], key: str, where: str) -> list[Any]:
    items = rule.get(key)
    if items is None:
        return []
    if not isinstance(items, list):
        raise Invalid(f"{where}.{key}", items, "must be a list")
    return items


def _policy_port(port: Any, where: str) -> None:
    if not isinstance(port, dict):
        raise Invalid(where, port, "must be an object")
    port.setdefault("protocol", "TCP")
    if port["protocol"] not in _PROTOCOLS:
        raise Invalid(f"{where}.protocol", port["protocol"], f"supported values: {', '.join(_PROTOCOLS)}")
    value = port.get("port")
    if value is not None and not (is_port(value) or is_port_name(value)):
        raise Invalid(f"{where}.port", value, "must be a port number (1-65535) or an IANA_SVC_NAME")
    end = port.get("endPort")
    if end is not None:
        if not is_port(value):
            raise Invalid(f"{where}.endPort", end, "may not be specified when `port` is not a number")
        if not is_port(end) or end < value:
            raise Invalid(f"{where}.endPort", end, "must be a port number not less than `port`")


def _peer(peer: Any, where: str) -> None:
    if not isinstance(peer, dict):
        raise Invalid(where, peer, "must be an object")
    present = [k for k in ("podSelector", "namespaceSelector", "ipBlock") if peer.get(k) is not None]
    if not present:
        raise Invalid(where, peer, "must specify a peer")
    if "ipBlock" in present and len(present) > 1:
        raise Invalid(where, peer, "may not specify more than 1 peer type when ipBlock is set")
    for key in ("podSelector", "namespaceSelector"):
        if key in present:
            _selector(peer[key], f"{where}.{key}", required=False)
    if "ipBlock" in present:
        _ip_block(peer["ipBlock"], f"{where}.ipBlock")


def _ip_block(block: Any, where: str) -> None:
    if not isinstance(block, dict):
        raise Invalid(where, block, "must be an object")
    cidr = _cidr(block.get("cidr"), f"{where}.cidr")
    for i, text in enumerate(_list(block, "except", where)):
        sub = _cidr(text, f"{where}.except[{i}]")
        if sub.version != cidr.version or not sub.subnet_of(cidr) or sub == cidr:  # type: ignore[arg-type]
            raise Invalid(f"{where}.except[{i}]", text, "must be a strict subset of `cidr`")


def _cidr(text: Any, where: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    if not isinstance(text, str) or "/" not in text:
        raise Invalid(where, text, "must be a valid CIDR (e.g. 10.9.0.0/16 or fd00::/8)")
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise Invalid(where, text, "must be a valid CIDR (e.g. 10.9.0.0/16 or fd00::/8)") from None


def _selector(sel: Any, where: str, *, required: bool) -> None:
    if sel is None:
        if required:
            raise Invalid(where, sel, "Required value")
        return
    if not isinstance(sel, dict):
        raise Invalid(where, sel, "must be a label selector object")
    labels = sel.get("matchLabels") or {}
    if not isinstance(labels, dict):
        raise Invalid(f"{where}.matchLabels", labels, "must be a map of strings")
    for key, value in labels.items():
        label(key, value, f"{where}.matchLabels")
    exprs = sel.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise Invalid(f"{where}.matchExpressions", exprs, "must be a list")
    for i, expr in enumerate(exprs):
        at = f"{where}.matchExpressions[{i}]"
        if not isinstance(expr, dict):
            raise Invalid(at, expr, "must be an object")
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values")
        if not is_label_key(key):
            raise Invalid(f"{at}.key", key, "must be a valid label key")
        if op not in _OPERATORS:
            raise Invalid(f"{at}.operator", op, f"not a valid selector operator ({', '.join(_OPERATORS)})")
        if op in ("In", "NotIn"):
            if not isinstance(values, list) or not values:
                raise Invalid(f"{at}.values", values, "must be specified when `operator` is 'In' or 'NotIn'")
            for j, v in enumerate(values):
                if not isinstance(v, str) or not _LABEL_VALUE.match(v):
                    raise Invalid(f"{at}.values[{j}]", v, "must be a valid label value")
        elif values:
            raise Invalid(f"{at}.values", values, "may not be specified when `operator` is 'Exists' or 'DoesNotExist'")


def _check_string_map(meta: dict[str, Any], key: str, *, label_map: bool) -> None:
    value = meta.get(key)
    if value is None:
        return
    if not isinstance(value, dict):
        raise Invalid(f"metadata.{key}", value, "must be a map of strings")
    for k, v in value.items():
        if label_map:
            label(k, v, "metadata.labels")
        elif not isinstance(v, str):
            raise Invalid(f"metadata.{key}", {k: v}, "values must be strings")
