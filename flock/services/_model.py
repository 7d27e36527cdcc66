"""Service and EndpointSlice (discovery.k8s.io/v1) as the service proxy sees them.

Frozen, hashable attrs values built from the objects' JSON (camelCase dict)
form by validating ``from_object`` classmethods; a field that does not hold
what the API server would accept raises :class:`flock.model.InvalidObject`
naming it (the watcher logs and skips the object).  Only what the proxy reads
is kept.  Names that may reach nftables identifiers (namespace, Service name,
port name) are checked against the API server's own rules here, and the
renderer sanitises them again; addresses are :mod:`ipaddress` values and
ports ints, so nothing from the API reaches nft text unparsed.

Conditions follow the API's nil semantics (``EndpointConditions``): ready
nil → true, serving nil → ready, terminating nil → false.
"""

from __future__ import annotations

import enum
import ipaddress
import re
import sys
from collections.abc import Mapping
from typing import Any

import attrs

from flock.model import InvalidObject
from flock.policy import Labels, Protocol, labels_field
from flock.policy._model import is_port_name

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
DEFAULT_AFFINITY_TIMEOUT = 10800  # seconds: sessionAffinityConfig.clientIP.timeoutSeconds' default
MAX_AFFINITY_TIMEOUT = 86400
MAX_PORTS = 1000  # bounds the work one hostile object can cause; the API server itself allows no more than this
MAX_ADDRESSES = 100  # an endpoint's addresses (the API server's limit); slices hold ≤ 1000 endpoints
MAX_ENDPOINTS = 1000

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")  # DNS-1123 label (namespaces)
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?\Z")  # Service names
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")  # EndpointSlice and node names


class ServiceType(enum.Enum):
    CLUSTER_IP = "ClusterIP"
    NODE_PORT = "NodePort"
    LOAD_BALANCER = "LoadBalancer"
    EXTERNAL_NAME = "ExternalName"


class TrafficPolicy(enum.Enum):
    CLUSTER = "Cluster"
    LOCAL = "Local"


class Family(enum.Enum):
    IPV4 = "IPv4"
    IPV6 = "IPv6"

    @property
    def version(self) -> int:
        return 4 if self is Family.IPV4 else 6


def family_of(address: IPAddress) -> Family:
    return Family.IPV4 if address.version == 4 else Family.IPV6


def _text(kind: str, name: str, field: str, raw: Any, pattern: re.Pattern[str], expected: str) -> str:
    if not isinstance(raw, str) or not pattern.match(raw):
        raise InvalidObject(kind, name, field, raw, expected)
    return raw


def _address(kind: str, name: str, field: str, raw: Any) -> IPAddress:
    # ipaddress reads ints as addresses and accepts any text after '%': refuse both.
    if not isinstance(raw, str) or "%" in raw:
        raise InvalidObject(kind, name, field, raw, "an IP address")
    try:
        return ipaddress.ip_address(raw)
    except ValueError:
        raise InvalidObject(kind, name, field, raw, "an IP address") from None


def _list(kind: str, name: str, field: str, raw: Any, limit: int) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidObject(kind, name, field, raw, "a list")
    if len(raw) > limit:
        raise InvalidObject(kind, name, field, f"{len(raw)} items", f"at most {limit}")
    return raw


def _port_number(kind: str, name: str, field: str, raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 65535:
        raise InvalidObject(kind, name, field, raw, "a port number 1-65535")
    return raw


def _protocol(kind: str, name: str, field: str, raw: Any) -> Protocol:
    try:
        return Protocol(raw) if raw is not None else Protocol.TCP
    except ValueError:
        raise InvalidObject(kind, name, field, raw, "TCP, UDP or SCTP") from None


def _enum(kind: str, name: str, field: str, raw: Any, enum_type: Any, default: Any) -> Any:
    if raw is None or raw == "":
        return default
    try:
        return enum_type(raw)
    except ValueError:
        expected = " or ".join(m.value for m in enum_type)
        raise InvalidObject(kind, name, field, raw, expected) from None


def _metadata(kind: str, raw: Any, name_pattern: re.Pattern[str], name_rule: str) -> tuple[str, str, Mapping[str, Any]]:
    if not isinstance(raw, Mapping):
        raise InvalidObject(kind, "", "", type(raw).__name__, "an object")
    meta = raw.get("metadata")
    if not isinstance(meta, Mapping):
        raise InvalidObject(kind, "", "metadata", meta, "an object")
    name = _text(kind, "", "metadata.name", meta.get("name"), name_pattern, name_rule)
    namespace = _text(kind, name, "metadata.namespace", meta.get("namespace"), _DNS_LABEL, "a DNS-1123 label")
    return namespace, name, meta


@attrs.frozen(cache_hash=True)
class ServicePort:
    """One entry of spec.ports; *name* may be "" only when it is the Service's only port."""

    name: str
    protocol: Protocol
    port: int
    target_port: int | str  # a number, or a container port name (resolved by the EndpointSlice controller)
    node_port: int | None = None

    @classmethod
    def from_object(cls, raw: Any, *, service: str, field: str) -> ServicePort:
        kind = "Service"
        if not isinstance(raw, Mapping):
            raise InvalidObject(kind, service, field, raw, "a port (name, protocol, port, targetPort, nodePort)")
        name = raw.get("name") or ""
        if name:
            _text(kind, service, f"{field}.name", name, _DNS_LABEL, "a DNS-1123 label")
        protocol = _protocol(kind, service, f"{field}.protocol", raw.get("protocol"))
        port = _port_number(kind, service, f"{field}.port", raw.get("port"))
        target = raw.get("targetPort")
        if target is None or target == 0 or target == "":
            target = port
        elif isinstance(target, str) and target.isdigit():
            target = _port_number(kind, service, f"{field}.targetPort", int(target))
        elif isinstance(target, str):
            if not is_port_name(target):
                raise InvalidObject(kind, service, f"{field}.targetPort", target, "a port number or an IANA_SVC_NAME")
        else:
            target = _port_number(kind, service, f"{field}.targetPort", target)
        node_port = raw.get("nodePort")
        if node_port is not None and node_port != 0:
            node_port = _port_number(kind, service, f"{field}.nodePort", node_port)
        else:
            node_port = None
        return cls(name, protocol, port, target, node_port)


@attrs.frozen(cache_hash=True)
class Service:
    namespace: str
    name: str
    type: ServiceType = ServiceType.CLUSTER_IP
    cluster_ips: tuple[IPAddress, ...] = ()  # empty: headless (clusterIP None) or ExternalName
    ip_families: tuple[Family, ...] = ()
    ports: tuple[ServicePort, ...] = ()
    external_ips: tuple[IPAddress, ...] = ()
    load_balancer_ips: tuple[IPAddress, ...] = ()  # status.loadBalancer.ingress[].ip, ipMode VIP (not Proxy)
    external_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    internal_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    health_check_node_port: int | None = None
    client_ip_affinity: bool = False
    affinity_timeout: int = DEFAULT_AFFINITY_TIMEOUT
    load_balancer_class: str | None = None
    has_selector: bool = False
    # metadata.labels, kept only for a Service with external addresses (what LoadBalancerPools select)
    labels: Labels = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def proxied(self) -> bool:
        """Headless Services and ExternalName are DNS only: nothing to translate."""
        return self.type is not ServiceType.EXTERNAL_NAME and bool(self.cluster_ips)

    def cluster_ip(self, family: Family) -> IPAddress | None:
        for ip in self.cluster_ips:
            if family_of(ip) is family:
                return ip
        return None

    @classmethod
    def from_object(cls, raw: Any) -> Service:
        kind = "Service"
        namespace, name, meta = _metadata(kind, raw, _DNS_1035, "a DNS-1035 label")
        spec = raw.get("spec")
        if not isinstance(spec, Mapping):
            raise InvalidObject(kind, name, "spec", spec, "an object")
        type_ = _enum(kind, name, "spec.type", spec.get("type"), ServiceType, ServiceType.CLUSTER_IP)

        ips_raw = spec.get("clusterIPs")
        if ips_raw is None:
            single = spec.get("clusterIP")
            ips_raw = [single] if single is not None else []
        ips_raw = _list(kind, name, "spec.clusterIPs", ips_raw, 2)
        cluster_ips: tuple[IPAddress, ...] = ()
        if ips_raw and ips_raw[0] not in ("None", ""):
            cluster_ips = tuple(_address(kind, name, f"spec.clusterIPs[{i}]", ip) for i, ip in enumerate(ips_raw))
            if len({ip.version for ip in cluster_ips}) != len(cluster_ips):
                raise InvalidObject(kind, name, "spec.clusterIPs", ips_raw, "at most one address per family")
        families_raw = _list(kind, name, "spec.ipFamilies", spec.get("ipFamilies"), 2)
        families = tuple(
            _enum(kind, name, f"spec.ipFamilies[{i}]", f, Family, None) for i, f in enumerate(families_raw)
        )
        if None in families:
            raise InvalidObject(kind, name, "spec.ipFamilies", families_raw, "IPv4 or IPv6")
        if not families:
            families = tuple(family_of(ip) for ip in cluster_ips)
        for i, ip in enumerate(cluster_ips):
            if family_of(ip) not in families:
                raise InvalidObject(kind, name, f"spec.clusterIPs[{i}]", str(ip), "an address of spec.ipFamilies")

        ports_raw = _list(kind, name, "spec.ports", spec.get("ports"), MAX_PORTS)
        ports = tuple(
            ServicePort.from_object(p, service=name, field=f"spec.ports[{i}]") for i, p in enumerate(ports_raw)
        )
        names: set[str] = set()
        numbers: set[tuple[int, Protocol]] = set()
        for i, p in enumerate(ports):
            if not p.name and len(ports) > 1:
                raise InvalidObject(kind, name, f"spec.ports[{i}].name", "", "a name (the Service has several ports)")
            if p.name in names:
                raise InvalidObject(kind, name, f"spec.ports[{i}].name", p.name, "a name unique in the Service")
            if (p.port, p.protocol) in numbers:
                raise InvalidObject(kind, name, f"spec.ports[{i}].port", p.port, "a port unique per protocol")
            names.add(p.name)
            numbers.add((p.port, p.protocol))

        externals = _list(kind, name, "spec.externalIPs", spec.get("externalIPs"), 64)
        external_ips = tuple(_address(kind, name, f"spec.externalIPs[{i}]", ip) for i, ip in enumerate(externals))
        status = raw.get("status")
        lb = status.get("loadBalancer") if isinstance(status, Mapping) else None
        ingress = _list(
            kind, name, "status.loadBalancer.ingress", lb.get("ingress") if isinstance(lb, Mapping) else None, 64
        )
        lb_ips = []
        for i, entry in enumerate(ingress):
            if not isinstance(entry, Mapping):
                raise InvalidObject(kind, name, f"status.loadBalancer.ingress[{i}]", entry, "an object (ip, hostname)")
            if entry.get("ip") is None:
                continue  # a hostname: nothing the node can translate
            if entry.get("ipMode") == "Proxy":
                continue  # KEP-1860: the load balancer proxies; packets arrive for the node, not for this address
            lb_ips.append(_address(kind, name, f"status.loadBalancer.ingress[{i}].ip", entry["ip"]))

        etp = _enum(
            kind, name, "spec.externalTrafficPolicy", spec.get("externalTrafficPolicy"), TrafficPolicy,
            TrafficPolicy.CLUSTER,
        )  # fmt: skip
        itp = _enum(
            kind, name, "spec.internalTrafficPolicy", spec.get("internalTrafficPolicy"), TrafficPolicy,
            TrafficPolicy.CLUSTER,
        )  # fmt: skip
        hcnp = spec.get("healthCheckNodePort")
        if hcnp is not None and hcnp != 0:
            hcnp = _port_number(kind, name, "spec.healthCheckNodePort", hcnp)
        else:
            hcnp = None
        affinity = spec.get("sessionAffinity")
        if affinity not in (None, "", "None", "ClientIP"):
            raise InvalidObject(kind, name, "spec.sessionAffinity", affinity, "None or ClientIP")
        timeout = DEFAULT_AFFINITY_TIMEOUT
        config = spec.get("sessionAffinityConfig")
        if affinity == "ClientIP" and config is not None:
            if not isinstance(config, Mapping):
                raise InvalidObject(kind, name, "spec.sessionAffinityConfig", config, "an object")
            client = config.get("clientIP") or {}
            if not isinstance(client, Mapping):
                raise InvalidObject(kind, name, "spec.sessionAffinityConfig.clientIP", client, "an object")
            t = client.get("timeoutSeconds")
            if t is not None:
                if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= MAX_AFFINITY_TIMEOUT:
                    raise InvalidObject(
                        kind, name, "spec.sessionAffinityConfig.clientIP.timeoutSeconds", t,
                        f"seconds 1-{MAX_AFFINITY_TIMEOUT}",
                    )  # fmt: skip
                timeout = t
        lb_class = spec.get("loadBalancerClass")
        if lb_class is not None and (not isinstance(lb_class, str) or not 0 < len(lb_class) <= 253):
            raise InvalidObject(kind, name, "spec.loadBalancerClass", lb_class, "a qualified name")
        selector = spec.get("selector")
        if selector is not None and not isinstance(selector, Mapping):
            raise InvalidObject(kind, name, "spec.selector", selector, "a map of labels")
        return cls(
            namespace,
            name,
            type_,
            cluster_ips if type_ is not ServiceType.EXTERNAL_NAME else (),
            families,
            ports,
            external_ips,
            tuple(lb_ips),
            etp,
            itp,
            hcnp,
            affinity == "ClientIP",
            timeout,
            lb_class,
            bool(selector),
            labels_field(kind, name, "metadata.labels", meta.get("labels")) if external_ips or lb_ips else (),
        )


@attrs.frozen(cache_hash=True)
class Endpoint:
    """One endpoint of a slice, as compact as the proxy can keep it (100,000 of them are held): the first of
    its addresses (the one traffic goes to, as kube-proxy's; the others are checked, not kept), its
    conditions and its node's name (interned: shared by every endpoint on the node).  The targetRef is
    checked and not kept: nothing the proxy does depends on it."""

    address: IPAddress
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    node_name: str | None = None


@attrs.frozen(cache_hash=True)
class EndpointPort:
    name: str
    protocol: Protocol
    port: int


def _condition(kind: str, name: str, field: str, raw: Any, default: bool) -> bool:
    if raw is None:
        return default
    if not isinstance(raw, bool):
        raise InvalidObject(kind, name, field, raw, "true, false or null")
    return raw


@attrs.frozen(cache_hash=True)
class EndpointSlice:
    namespace: str
    name: str
    service: str | None  # label kubernetes.io/service-name; None: the slice belongs to no Service
    family: Family | None  # None: addressType FQDN (not proxied)
    endpoints: tuple[Endpoint, ...] = ()
    ports: tuple[EndpointPort, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def service_key(self) -> str | None:
        return f"{self.namespace}/{self.service}" if self.service is not None else None

    @classmethod
    def from_object(cls, raw: Any) -> EndpointSlice:
        kind = "EndpointSlice"
        namespace, name, meta = _metadata(kind, raw, _SUBDOMAIN, "a DNS-1123 subdomain")
        labels = meta.get("labels") or {}
        if not isinstance(labels, Mapping):
            raise InvalidObject(kind, name, "metadata.labels", labels, "a map of labels")
        service = labels.get(SERVICE_NAME_LABEL)
        if service is not None:
            _text(kind, name, f"metadata.labels.{SERVICE_NAME_LABEL}", service, _DNS_1035, "a Service name")
        address_type = raw.get("addressType")
        if address_type not in ("IPv4", "IPv6", "FQDN"):
            raise InvalidObject(kind, name, "addressType", address_type, "IPv4, IPv6 or FQDN")
        family = None if address_type == "FQDN" else Family(address_type)
        endpoints: list[Endpoint] = []
        for i, ep in enumerate(_list(kind, name, "endpoints", raw.get("endpoints"), MAX_ENDPOINTS)):
            where = f"endpoints[{i}]"
            if not isinstance(ep, Mapping):
                raise InvalidObject(kind, name, where, ep, "an endpoint (addresses, conditions)")
            addresses_raw = _list(kind, name, f"{where}.addresses", ep.get("addresses"), MAX_ADDRESSES)
            if not addresses_raw:
                raise InvalidObject(kind, name, f"{where}.addresses", addresses_raw, "at least one address")
            if family is None:
                continue  # FQDN endpoints are names; nothing to translate to
            addresses = tuple(_address(kind, name, f"{where}.addresses[{j}]", a) for j, a in enumerate(addresses_raw))
            for j, a in enumerate(addresses):
                if family_of(a) is not family:
                    raise InvalidObject(kind, name, f"{where}.addresses[{j}]", str(a), f"an {address_type} address")
            conditions = ep.get("conditions") or {}
            if not isinstance(conditions, Mapping):
                raise InvalidObject(kind, name, f"{where}.conditions", conditions, "an object")
            ready = _condition(kind, name, f"{where}.conditions.ready", conditions.get("ready"), True)
            serving = _condition(kind, name, f"{where}.conditions.serving", conditions.get("serving"), ready)
            terminating = _condition(
                kind, name, f"{where}.conditions.terminating", conditions.get("terminating"), False
            )
            node = ep.get("nodeName")
            if node is not None:
                node = _text(kind, name, f"{where}.nodeName", node, _SUBDOMAIN, "a node name")
            ref = ep.get("targetRef")
            if ref is not None:
                if not isinstance(ref, Mapping):
                    raise InvalidObject(kind, name, f"{where}.targetRef", ref, "an object reference")
                if ref.get("kind", "Pod") == "Pod" and isinstance(ref.get("name"), str):
                    ref_ns = ref.get("namespace") or namespace
                    if not isinstance(ref_ns, str):
                        raise InvalidObject(kind, name, f"{where}.targetRef.namespace", ref_ns, "a namespace")
            endpoints.append(
                Endpoint(addresses[0], ready, serving, terminating, sys.intern(node) if node is not None else None)
            )
        ports: list[EndpointPort] = []
        for i, p in enumerate(_list(kind, name, "ports", raw.get("ports"), MAX_PORTS)):
            where = f"ports[{i}]"
            if not isinstance(p, Mapping):
                raise InvalidObject(kind, name, where, p, "a port (name, protocol, port)")
            port_name = p.get("name") or ""
            if port_name:
                _text(kind, name, f"{where}.name", port_name, _DNS_LABEL, "a DNS-1123 label")
            protocol = _protocol(kind, name, f"{where}.protocol", p.get("protocol"))
            if p.get("port") is None:
                continue  # "all ports": nothing a Service port can be translated to (kube-proxy skips it too)
            ports.append(EndpointPort(port_name, protocol, _port_number(kind, name, f"{where}.port", p["port"])))
        return cls(namespace, name, service, family, tuple(endpoints), tuple(ports))
