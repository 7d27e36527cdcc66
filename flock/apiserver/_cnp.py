"""ClusterNetworkPolicy's schema: kubernetes-sigs/network-policy-api v0.2.0, experimental channel.

:data:`SCHEMA` is the CRD's ``openAPIV3Schema`` (deploy/crd-clusternetworkpolicy.yaml)
without its descriptions, written out so the fake API server needs no file
from deploy/ (tests/apiserver checks that the two are equal); :data:`RULES` are
its CEL rules in Python.  :func:`admit_cluster_network_policy` prunes and
validates an object with them (:mod:`flock.apiserver._structural`).

Like the real API server, it does not check label selectors' syntax: the
CRD's schema says only that keys, operators and values are strings.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from ._structural import CelRules, admit_object, check_rules

_PORT = {"format": "int32", "maximum": 65535, "minimum": 1, "type": "integer"}
_STRING = {"type": "string"}


def _selector() -> dict[str, Any]:
    """metav1.LabelSelector as controller-gen writes it."""
    return {
        "properties": {
            "matchExpressions": {
                "items": {
                    "properties": {
                        "key": _STRING,
                        "operator": _STRING,
                        "values": {"items": _STRING, "type": "array", "x-kubernetes-list-type": "atomic"},
                    },
                    "required": ["key", "operator"],
                    "type": "object",
                },
                "type": "array",
                "x-kubernetes-list-type": "atomic",
            },
            "matchLabels": {"additionalProperties": _STRING, "type": "object"},
        },
        "type": "object",
        "x-kubernetes-map-type": "atomic",
    }


def _pods() -> dict[str, Any]:
    return {
        "properties": {"namespaceSelector": _selector(), "podSelector": _selector()},
        "required": ["podSelector"],
        "type": "object",
    }


def _one_of(properties: Mapping[str, Any], **more: Any) -> dict[str, Any]:
    return {"maxProperties": 1, "minProperties": 1, "properties": dict(properties), "type": "object", **more}


def _list(items: Mapping[str, Any], *, at_least: int = 1, list_type: str = "") -> dict[str, Any]:
    node: dict[str, Any] = {"items": dict(items), "maxItems": 25, "type": "array"}
    if at_least:
        node["minItems"] = at_least
    if list_type:
        node["x-kubernetes-list-type"] = list_type
    return node


START_BEFORE_END = "self.start < self.end"
IS_CIDR = "isCIDR(self)"
NO_NAMED_PORT_TO_ADDRESSES = (
    "!(self.to.exists(peer, has(peer.networks) || has(peer.nodes) || has(peer.domainNames)) && "
    "has(self.protocols) && self.protocols.exists(protocol, has(protocol.destinationNamedPort)))"
)


def _port_protocol() -> dict[str, Any]:
    port_range = {
        "properties": {"end": _PORT, "start": _PORT},
        "required": ["end", "start"],
        "type": "object",
        "x-kubernetes-validations": [{"message": "Start port must be less than End port", "rule": START_BEFORE_END}],
    }
    return {
        "minProperties": 1,
        "properties": {"destinationPort": _one_of({"number": _PORT, "range": port_range})},
        "type": "object",
    }


def _protocols() -> dict[str, Any]:
    return _list(
        _one_of(
            {
                "destinationNamedPort": _STRING,
                "sctp": _port_protocol(),
                "tcp": _port_protocol(),
                "udp": _port_protocol(),
            }
        )
    )


_DOMAIN_NAME = r"^(\*\.)?([a-zA-z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.)+[a-zA-z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.?$"
_ACTION = {"enum": ["Accept", "Deny", "Pass"], "type": "string"}
_RULE_NAME = {"maxLength": 100, "type": "string"}


def _ingress_rule() -> dict[str, Any]:
    return {
        "properties": {
            "action": _ACTION,
            "from": _list(_one_of({"namespaces": _selector(), "pods": _pods()})),
            "name": _RULE_NAME,
            "protocols": _protocols(),
        },
        "required": ["action", "from"],
        "type": "object",
    }


def _egress_rule() -> dict[str, Any]:
    peer = _one_of(
        {
            "domainNames": _list({"pattern": _DOMAIN_NAME, "type": "string"}, list_type="set"),
            "namespaces": _selector(),
            "networks": _list(
                {
                    "maxLength": 43,
                    "type": "string",
                    "x-kubernetes-validations": [{"message": "Invalid CIDR format provided", "rule": IS_CIDR}],
                },
                list_type="set",
            ),
            "nodes": _selector(),
            "pods": _pods(),
        }
    )
    return {
        "properties": {"action": _ACTION, "name": _RULE_NAME, "protocols": _protocols(), "to": _list(peer)},
        "required": ["action", "to"],
        "type": "object",
        "x-kubernetes-validations": [
            {
                "message": "networks/nodes/domainNames peer cannot be set with namedPorts since there are no "
                "namedPorts for networks/nodes/domainNames",
                "rule": NO_NAMED_PORT_TO_ADDRESSES,
            }
        ],
    }


def _conditions() -> dict[str, Any]:
    """metav1.Condition, as controller-gen writes it."""
    return {
        "items": {
            "properties": {
                "lastTransitionTime": {"format": "date-time", "type": "string"},
                "message": {"maxLength": 32768, "type": "string"},
                "observedGeneration": {"format": "int64", "minimum": 0, "type": "integer"},
                "reason": {
                    "maxLength": 1024,
                    "minLength": 1,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
                    "type": "string",
                },
                "status": {"enum": ["True", "False", "Unknown"], "type": "string"},
                "type": {
                    "maxLength": 316,
                    "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
                    "type": "string",
                },
            },
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "type": "object",
        },
        "type": "array",
        "x-kubernetes-list-map-keys": ["type"],
        "x-kubernetes-list-type": "map",
    }


SCHEMA: dict[str, Any] = {
    "properties": {
        "apiVersion": _STRING,
        "kind": _STRING,
        "metadata": {"type": "object"},
        "spec": {
            "properties": {
                "egress": _list(_egress_rule(), at_least=0),
                "ingress": _list(_ingress_rule(), at_least=0),
                "priority": {"format": "int32", "maximum": 1000, "minimum": 0, "type": "integer"},
                "subject": _one_of({"namespaces": _selector(), "pods": _pods()}),
                "tier": {"enum": ["Admin", "Baseline"], "type": "string"},
            },
            "required": ["priority", "subject", "tier"],
            "type": "object",
        },
        "status": {"properties": {"conditions": _conditions()}, "required": ["conditions"], "type": "object"},
    },
    "required": ["metadata", "spec"],
    "type": "object",
}


def _is_cidr(text: Any) -> bool:
    """The Kubernetes CEL library's isCIDR: an address and a prefix length (host bits allowed),
    no zone, no IPv4-mapped IPv6."""
    if not isinstance(text, str) or "/" not in text or "%" in text:
        return False
    try:
        value = ipaddress.ip_interface(text)
    except ValueError:
        return False
    return not (isinstance(value, ipaddress.IPv6Interface) and value.ip.ipv4_mapped is not None)


def _no_named_port_to_addresses(rule: Mapping[str, Any]) -> bool:
    to_addresses = any(
        any(key in peer for key in ("networks", "nodes", "domainNames")) for peer in rule.get("to") or ()
    )
    named = any("destinationNamedPort" in p for p in rule.get("protocols") or ())
    return not (to_addresses and named)


RULES: CelRules = {
    START_BEFORE_END: lambda r: r["start"] < r["end"],
    IS_CIDR: _is_cidr,
    NO_NAMED_PORT_TO_ADDRESSES: _no_named_port_to_addresses,
}
check_rules(SCHEMA, RULES)


def admit_cluster_network_policy(obj: dict[str, Any]) -> dict[str, Any]:
    """*obj* pruned and validated as the CRD says; raises :class:`flock.apiserver._status.Invalid`."""
    return admit_object(SCHEMA, RULES, obj)
