"""An EndpointSlice (``discovery.k8s.io/v1``) as kube-apiserver 1.32 defaults and validates it
(``pkg/apis/discovery/v1`` defaults, ``pkg/apis/discovery/validation``): the first error, with
upstream's message, as :class:`Invalid`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._status import Invalid
from ._validation import (
    REQUIRED,
    dns_label,
    dns_subdomain,
    is_int,
    labels,
    non_special_ip,
    parse_ip,
    qualified_name,
    too_many,
    unsupported,
)

ADDRESS_TYPES = ("FQDN", "IPv4", "IPv6")
PROTOCOLS = ("SCTP", "TCP", "UDP")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # the Service a slice belongs to (kube-proxy's index)
MAX_ENDPOINTS = 1000
MAX_ADDRESSES = 100
MAX_PORTS = 20000  # upstream's validation (the API reference still says 100)
MAX_TOPOLOGY_LABELS = 16
_CONDITIONS = ("ready", "serving", "terminating")


def admit_endpoint_slice(obj: dict[str, Any]) -> None:
    """Default (port name "" and protocol TCP) and validate *obj* in place."""
    ports = obj.get("ports")
    for port in ports if isinstance(ports, list) else []:
        if isinstance(port, dict):
            port.setdefault("name", "")
            port.setdefault("protocol", "TCP")
    validate_endpoint_slice(obj)


def validate_endpoint_slice(obj: Mapping[str, Any]) -> None:
    """``ValidateEndpointSlice``."""
    address_type = obj.get("addressType")
    if not address_type:
        raise Invalid("addressType", address_type, REQUIRED)
    if address_type not in ADDRESS_TYPES:
        raise Invalid("addressType", address_type, unsupported(address_type, ADDRESS_TYPES))
    endpoints = obj.get("endpoints")
    if endpoints is None:
        raise Invalid("endpoints", endpoints, REQUIRED)
    if not isinstance(endpoints, list):
        raise Invalid("endpoints", endpoints, "must be a list")
    if len(endpoints) > MAX_ENDPOINTS:
        raise Invalid("endpoints", len(endpoints), too_many(MAX_ENDPOINTS))
    for i, endpoint in enumerate(endpoints):
        _endpoint(endpoint, address_type, f"endpoints[{i}]")
    ports = obj.get("ports")
    if ports is None:
        return
    if not isinstance(ports, list):
        raise Invalid("ports", ports, "must be a list")
    if len(ports) > MAX_PORTS:
        raise Invalid("ports", len(ports), too_many(MAX_PORTS))
    names: set[str] = set()
    for i, port in enumerate(ports):
        where = f"ports[{i}]"
        if not isinstance(port, dict):
            raise Invalid(where, port, "must be an object")
        name = port.get("name") or ""
        if name:
            dns_label(name, f"{where}.name")
        if name in names:
            raise Invalid(f"{where}.name", name, "Duplicate value")
        names.add(name)
        protocol = port.get("protocol")
        if protocol is None:
            raise Invalid(f"{where}.protocol", protocol, REQUIRED)
        if protocol not in PROTOCOLS:
            raise Invalid(f"{where}.protocol", protocol, unsupported(protocol, PROTOCOLS))
        number = port.get("port")
        if number is not None and (not is_int(number) or not 0 <= number <= 65535):
            raise Invalid(f"{where}.port", number, "must be between 0 and 65535, inclusive")
        if port.get("appProtocol") is not None:
            qualified_name(port["appProtocol"], f"{where}.appProtocol")


def check_update(obj: Mapping[str, Any], old: Mapping[str, Any]) -> None:
    """``ValidateEndpointSliceUpdate``: the address type is immutable."""
    if obj.get("addressType") != old.get("addressType"):
        raise Invalid("addressType", obj.get("addressType"), "field is immutable")


def _endpoint(endpoint: Any, address_type: str, where: str) -> None:
    if not isinstance(endpoint, dict):
        raise Invalid(where, endpoint, "must be an object")
    addresses = endpoint.get("addresses")
    if not isinstance(addresses, list) or not addresses:
        raise Invalid(f"{where}.addresses", addresses, "Required value: must contain at least 1 address")
    if len(addresses) > MAX_ADDRESSES:
        raise Invalid(f"{where}.addresses", len(addresses), too_many(MAX_ADDRESSES))
    for j, address in enumerate(addresses):
        at = f"{where}.addresses[{j}]"
        if address_type in ("IPv4", "IPv6"):
            ip = parse_ip(address)
            if ip is None or f"IPv{ip.version}" != address_type:
                raise Invalid(at, address, f"must be a valid {address_type} address")
            non_special_ip(address, at)
        elif not isinstance(address, str) or "." not in address.strip("."):
            raise Invalid(at, address, "should be a domain with at least two segments separated by dots")
        else:
            dns_subdomain(address, at)
    conditions = endpoint.get("conditions")
    if conditions is not None:
        if not isinstance(conditions, dict):
            raise Invalid(f"{where}.conditions", conditions, "must be an object")
        for key in _CONDITIONS:
            value = conditions.get(key)
            if value is not None and not isinstance(value, bool):
                raise Invalid(f"{where}.conditions.{key}", value, "must be a boolean")
    node = endpoint.get("nodeName")
    if node is not None:
        dns_subdomain(node, f"{where}.nodeName")
    topology = endpoint.get("deprecatedTopology")
    if isinstance(topology, dict) and len(topology) > MAX_TOPOLOGY_LABELS:
        raise Invalid(f"{where}.deprecatedTopology", len(topology), too_many(MAX_TOPOLOGY_LABELS))
    labels(topology, f"{where}.deprecatedTopology")
    if endpoint.get("hostname") is not None:
        dns_label(endpoint["hostname"], f"{where}.hostname")
    target = endpoint.get("targetRef")
    if target is not None and not isinstance(target, dict):
        raise Invalid(f"{where}.targetRef", target, "must be an object reference")
