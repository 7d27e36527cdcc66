"""NetworkPolicy, Namespace and Pod as the policy compiler sees them.

Frozen attrs values, built from Kubernetes objects in their JSON (camelCase
dict) form by ``from_object`` classmethods that validate and normalize the way
the API server does (policyTypes and protocol defaulting, selector operator
rules).  A field that does not hold what the API server would accept raises
:class:`flock.model.InvalidObject` naming it; the watcher logs and skips that
object.  Label keys and values are kept as strings and only ever compared: the
only things that reach nftables syntax are addresses, port numbers and
identifiers flock makes itself.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from flock.model import ANNOTATION_PREFIX, InvalidObject

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# The label the API server puts on every Namespace (Kubernetes ≥ 1.21).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
# On a Namespace: "true" logs what policy denies its pods (flock.policy._denylog); anything else, or none: off.
LOG_DENIED_ANNOTATION = ANNOTATION_PREFIX + "log-denied"

_MAX_LABEL_TEXT = 317  # a qualified key (253 prefix + '/' + 63 name); values are ≤ 63


class Protocol(enum.Enum):
    TCP = "TCP"
    UDP = "UDP"
    SCTP = "SCTP"


class Direction(enum.Enum):
    INGRESS = "Ingress"
    EGRESS = "Egress"


class Operator(enum.Enum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


Labels = tuple[tuple[str, str], ...]  # sorted (key, value) pairs: hashable, order-free


def labels_of(mapping: Mapping[str, str] | Labels | None) -> Labels:
    """Normalize a label mapping (or pairs) to sorted pairs."""
    if not mapping:
        return ()
    items = mapping.items() if isinstance(mapping, Mapping) else mapping
    return tuple(sorted((str(k), str(v)) for k, v in items))


def labels_field(kind: str, name: str, field: str, raw: Any) -> Labels:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise InvalidObject(kind, name, field, raw, "a map of label keys to string values")
    for k, v in raw.items():
        if not isinstance(k, str) or not k or len(k) > _MAX_LABEL_TEXT:
            raise InvalidObject(kind, name, field, str(k)[:64], "label keys of 1-317 characters")
        if not isinstance(v, str) or len(v) > _MAX_LABEL_TEXT:
            raise InvalidObject(kind, name, f"{field}.{k}", str(v)[:64], "a string label value")
    return labels_of(raw)


@attrs.frozen(cache_hash=True)
class Requirement:
    """One matchExpressions entry; values sorted, empty for Exists/DoesNotExist."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator is Operator.IN:
            return self.key in labels and labels[self.key] in self.values
        if self.operator is Operator.NOT_IN:
            return self.key not in labels or labels[self.key] not in self.values
        if self.operator is Operator.EXISTS:
            return self.key in labels
        return self.key not in labels


@attrs.frozen(cache_hash=True)
class LabelSelector:
    """metav1.LabelSelector: matchLabels AND every matchExpression; empty selects everything."""

    match_labels: Labels = ()
    match_expressions: tuple[Requirement, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        for k, v in self.match_labels:
            if labels.get(k) != v:
                return False
        return all(r.matches(labels) for r in self.match_expressions)

    @classmethod
    def from_object(
        cls, raw: Any, *, kind: str = "LabelSelector", name: str = "", field: str = "selector"
    ) -> LabelSelector:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise InvalidObject(kind, name, field, raw, "a label selector (matchLabels, matchExpressions)")
        match_labels = labels_field(kind, name, f"{field}.matchLabels", raw.get("matchLabels"))
        exprs_raw = raw.get("matchExpressions") or []
        if not isinstance(exprs_raw, list):
            raise InvalidObject(kind, name, f"{field}.matchExpressions", exprs_raw, "a list")
        exprs: list[Requirement] = []
        for i, e in enumerate(exprs_raw):
            where = f"{field}.matchExpressions[{i}]"
            if not isinstance(e, Mapping):
                raise InvalidObject(kind, name, where, e, "a requirement (key, operator, values)")
            key = e.get("key")
            if not isinstance(key, str) or not key or len(key) > _MAX_LABEL_TEXT:
                raise InvalidObject(kind, name, f"{where}.key", key, "a label key")
            try:
                op = Operator(e.get("operator"))
            except ValueError:
                raise InvalidObject(
                    kind, name, f"{where}.operator", e.get("operator"), "In, NotIn, Exists or DoesNotExist"
                ) from None
            values = e.get("values") or []
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise InvalidObject(kind, name, f"{where}.values", values, "a list of strings")
            if op in (Operator.IN, Operator.NOT_IN) and not values:
                raise InvalidObject(kind, name, f"{where}.values", values, f"at least one value for {op.value}")
            if op in (Operator.EXISTS, Operator.DOES_NOT_EXIST) and values:
                raise InvalidObject(kind, name, f"{where}.values", values, f"no values for {op.value}")
            exprs.append(Requirement(key, op, tuple(sorted(set(values)))))
        return cls(match_labels, tuple(exprs))


def _network(kind: str, name: str, field: str, raw: Any) -> IPNetwork:
    if not isinstance(raw, str) or "%" in raw or "/" not in raw:
        raise InvalidObject(kind, name, field, raw, "a CIDR such as 2001:db8::/48 or 192.0.2.0/24")
    try:
        # The API server accepts host bits in ipBlock CIDRs (older releases); mask them.
        return ipaddress.ip_network(raw, strict=False)
    except ValueError:
        raise InvalidObject(kind, name, field, raw, "a CIDR such as 2001:db8::/48 or 192.0.2.0/24") from None


@attrs.frozen(cache_hash=True)
class IPBlock:
    """ipBlock: *cidr* minus every network in *except_* (same family, inside *cidr*)."""

    cidr: IPNetwork
    except_: tuple[IPNetwork, ...] = ()

    def contains(self, address: IPAddress) -> bool:
        if address.version != self.cidr.version or address not in self.cidr:
            return False
        return not any(address in e for e in self.except_)

    @classmethod
    def from_object(cls, raw: Any, *, kind: str = "NetworkPolicy", name: str = "", field: str = "ipBlock") -> IPBlock:
        if not isinstance(raw, Mapping):
            raise InvalidObject(kind, name, field, raw, "an ipBlock (cidr, except)")
        cidr = _network(kind, name, f"{field}.cidr", raw.get("cidr"))
        excepts_raw = raw.get("except") or []
        if not isinstance(excepts_raw, list):
            raise InvalidObject(kind, name, f"{field}.except", excepts_raw, "a list of CIDRs")
        excepts: list[IPNetwork] = []
        for i, e in enumerate(excepts_raw):
            net = _network(kind, name, f"{field}.except[{i}]", e)
            # the API server's rule: a strict subset of cidr
            if net.version != cidr.version or not net.subnet_of(cidr) or net.prefixlen <= cidr.prefixlen:  # type: ignore[arg-type]
                raise InvalidObject(kind, name, f"{field}.except[{i}]", e, f"a CIDR strictly inside {cidr}")
            excepts.append(net)
        return cls(cidr, tuple(sorted(set(excepts), key=lambda n: (n.network_address, n.prefixlen))))


@attrs.frozen(cache_hash=True)
class Peer:
    """NetworkPolicyPeer: either *ip_block*, or pod/namespace selectors.

    ``pod_selector`` None with ``namespace_selector`` set: every pod of the
    selected namespaces.  ``namespace_selector`` None: the policy's own
    namespace.  Both set: pods matching both (AND).
    """

    pod_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    ip_block: IPBlock | None = None

    @classmethod
    def from_object(cls, raw: Any, *, name: str = "", field: str = "peer") -> Peer:
        kind = "NetworkPolicy"
        if not isinstance(raw, Mapping):
            raise InvalidObject(kind, name, field, raw, "a peer (podSelector, namespaceSelector or ipBlock)")
        has = {k: raw.get(k) is not None for k in ("podSelector", "namespaceSelector", "ipBlock")}
        if not any(has.values()):
            raise InvalidObject(kind, name, field, raw, "one of podSelector, namespaceSelector, ipBlock")
        if has["ipBlock"] and (has["podSelector"] or has["namespaceSelector"]):
            raise InvalidObject(kind, name, field, raw, "ipBlock alone, without pod or namespace selectors")
        if has["ipBlock"]:
            return cls(ip_block=IPBlock.from_object(raw["ipBlock"], kind=kind, name=name, field=f"{field}.ipBlock"))
        return cls(
            pod_selector=(
                LabelSelector.from_object(raw["podSelector"], kind=kind, name=name, field=f"{field}.podSelector")
                if has["podSelector"]
                else None
            ),
            namespace_selector=(
                LabelSelector.from_object(
                    raw["namespaceSelector"], kind=kind, name=name, field=f"{field}.namespaceSelector"
                )
                if has["namespaceSelector"]
                else None
            ),
        )


@attrs.frozen(cache_hash=True)
class PolicyPort:
    """NetworkPolicyPort: *port* None = every port of *protocol*; a str is a named port."""

    protocol: Protocol = Protocol.TCP
    port: int | str | None = None
    end_port: int | None = None

    @classmethod
    def from_object(cls, raw: Any, *, name: str = "", field: str = "port") -> PolicyPort:
        kind = "NetworkPolicy"
        if not isinstance(raw, Mapping):
            raise InvalidObject(kind, name, field, raw, "a port (protocol, port, endPort)")
        proto_raw = raw.get("protocol")
        try:
            protocol = Protocol(proto_raw) if proto_raw is not None else Protocol.TCP
        except ValueError:
            raise InvalidObject(kind, name, f"{field}.protocol", proto_raw, "TCP, UDP or SCTP") from None
        port = raw.get("port")
        end_port = raw.get("endPort")
        if port is not None:
            if isinstance(port, bool) or not isinstance(port, int | str):
                raise InvalidObject(kind, name, f"{field}.port", port, "a port number or a port name")
            if isinstance(port, str) and port.isdigit():
                port = int(port)  # intstr given as a string of digits
            if isinstance(port, int) and not 1 <= port <= 65535:
                raise InvalidObject(kind, name, f"{field}.port", port, "a port number 1-65535")
            if isinstance(port, str) and not is_port_name(port):
                raise InvalidObject(kind, name, f"{field}.port", port[:64], "an IANA_SVC_NAME (1-15 a-z0-9-)")
        if end_port is not None:
            if isinstance(end_port, bool) or not isinstance(end_port, int):
                raise InvalidObject(kind, name, f"{field}.endPort", end_port, "a port number")
            if not isinstance(port, int):
                raise InvalidObject(kind, name, f"{field}.endPort", end_port, "endPort only with a numeric port")
            if not port <= end_port <= 65535:
                raise InvalidObject(kind, name, f"{field}.endPort", end_port, f"a port number {port}-65535")
            if end_port == port:
                end_port = None
        return cls(protocol, port, end_port)


def is_port_name(text: str) -> bool:
    """IANA_SVC_NAME as Kubernetes validates it: 1-15 of a-z0-9-, a letter, no leading/trailing/double '-'."""
    return (
        0 < len(text) <= 15
        and all(c.isascii() and (c.islower() or c.isdigit() or c == "-") for c in text)
        and any(c.isalpha() for c in text)
        and not text.startswith("-")
        and not text.endswith("-")
        and "--" not in text
    )


@attrs.frozen(cache_hash=True)
class PolicyRule:
    """One ingress (peers = from) or egress (peers = to) rule.

    ``peers`` empty: every peer; ``ports`` empty: every port and protocol.
    """

    peers: tuple[Peer, ...] = ()
    ports: tuple[PolicyPort, ...] = ()


@attrs.frozen(cache_hash=True)
class NetworkPolicy:
    namespace: str
    name: str
    pod_selector: LabelSelector = LabelSelector()
    policy_types: frozenset[Direction] = frozenset({Direction.INGRESS})
    ingress: tuple[PolicyRule, ...] = ()
    egress: tuple[PolicyRule, ...] = ()
    resource_version: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> NetworkPolicy:
        kind = "NetworkPolicy"
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        name = f"{namespace}/{meta.get('name', '')}"
        spec = obj.get("spec") or {}
        if not isinstance(spec, Mapping):
            raise InvalidObject(kind, name, "spec", spec, "an object")
        selector = LabelSelector.from_object(spec.get("podSelector"), kind=kind, name=name, field="spec.podSelector")
        rules: dict[str, tuple[PolicyRule, ...]] = {}
        for direction, peers_key in (("ingress", "from"), ("egress", "to")):
            raw_rules = spec.get(direction) or []
            if not isinstance(raw_rules, list):
                raise InvalidObject(kind, name, f"spec.{direction}", raw_rules, "a list of rules")
            parsed = []
            for i, r in enumerate(raw_rules):
                where = f"spec.{direction}[{i}]"
                if r is None:
                    r = {}
                if not isinstance(r, Mapping):
                    raise InvalidObject(kind, name, where, r, "a rule (ports, from/to)")
                peers_raw = r.get(peers_key) or []
                ports_raw = r.get("ports") or []
                if not isinstance(peers_raw, list):
                    raise InvalidObject(kind, name, f"{where}.{peers_key}", peers_raw, "a list of peers")
                if not isinstance(ports_raw, list):
                    raise InvalidObject(kind, name, f"{where}.ports", ports_raw, "a list of ports")
                peers = tuple(
                    Peer.from_object(p, name=name, field=f"{where}.{peers_key}[{j}]") for j, p in enumerate(peers_raw)
                )
                ports = tuple(
                    PolicyPort.from_object(p, name=name, field=f"{where}.ports[{j}]") for j, p in enumerate(ports_raw)
                )
                parsed.append(PolicyRule(peers, ports))
            rules[direction] = tuple(parsed)
        types_raw = spec.get("policyTypes") or []
        if not isinstance(types_raw, list):
            raise InvalidObject(kind, name, "spec.policyTypes", types_raw, "a list of Ingress/Egress")
        types: set[Direction] = set()
        for i, t in enumerate(types_raw):
            try:
                types.add(Direction(t))
            except ValueError:
                raise InvalidObject(kind, name, f"spec.policyTypes[{i}]", t, "Ingress or Egress") from None
        if not types:
            # The API server's defaulting (SetDefaults_NetworkPolicySpec): always Ingress,
            # Egress too when the policy has at least one egress rule.
            types = {Direction.INGRESS}
            if rules["egress"]:
                types.add(Direction.EGRESS)
        return cls(
            namespace=namespace,
            name=str(meta.get("name", "")),
            pod_selector=selector,
            policy_types=frozenset(types),
            ingress=rules["ingress"],
            egress=rules["egress"],
            resource_version=str(meta.get("resourceVersion", "")),
        )


@attrs.frozen
class Namespace:
    """A Namespace: its labels (what namespace selectors match) and whether its pods' denied traffic is
    logged (annotation :data:`LOG_DENIED_ANNOTATION` ``"true"``; off by default)."""

    name: str
    labels: Labels = attrs.field(default=(), converter=labels_of)
    log_denied: bool = False

    @property
    def label_map(self) -> dict[str, str]:
        # The API server sets this label on every namespace; an unseen namespace gets it too.
        return {**dict(self.labels), NAMESPACE_NAME_LABEL: self.name}

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Namespace:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        annotations = meta.get("annotations")
        switch = annotations.get(LOG_DENIED_ANNOTATION) if isinstance(annotations, Mapping) else None
        # A value other than "true" is off, never a refusal: refusing the Namespace would lose its labels,
        # and with them what its selectors match.
        log_denied = isinstance(switch, str) and switch.strip().lower() == "true"
        return cls(name, labels_field("Namespace", name, "metadata.labels", meta.get("labels")), log_denied)


@attrs.frozen
class NamedPort:
    """A containerPort with a name: what a named policy port resolves to on this pod."""

    name: str
    protocol: Protocol
    port: int


def _addresses(raw: Iterable[Any]) -> tuple[IPAddress, ...]:
    out: list[IPAddress] = []
    for a in raw:
        if isinstance(a, str) and "%" not in a:
            try:
                addr = ipaddress.ip_address(a)
            except ValueError:
                continue
            if addr not in out:
                out.append(addr)
    return tuple(out)


@attrs.frozen
class PolicyPod:
    """A pod as a policy peer or target.

    ``host_veth`` is set only for pods attached on this node (flock's own
    ``flock%08x`` name, from the allocation, never from the API object);
    ``addresses`` are status.podIPs for remote pods and the allocation's
    addresses for local ones.  Pods with hostNetwork or in a terminal phase are
    never selected (``selectable`` False): their addresses are the node's, or
    free for reuse.
    """

    namespace: str
    name: str
    labels: Labels = attrs.field(default=(), converter=labels_of)
    addresses: tuple[IPAddress, ...] = ()
    named_ports: tuple[NamedPort, ...] = ()
    node: str = ""
    host_veth: str | None = None
    selectable: bool = True
    resource_version: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    def resolve(self, port_name: str, protocol: Protocol) -> int | None:
        """The containerPort named *port_name* with *protocol*, if this pod declares one."""
        for p in self.named_ports:
            if p.name == port_name and p.protocol is protocol:
                return p.port
        return None

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> PolicyPod:
        """A Pod object as the cluster-wide watcher sees it (``host_veth`` None)."""
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name", ""))
        key = f"{namespace}/{name}"
        labels = labels_field("Pod", key, "metadata.labels", meta.get("labels"))
        ips = [p.get("ip") for p in status.get("podIPs") or [] if isinstance(p, Mapping)]
        if not ips and status.get("podIP"):
            ips = [status.get("podIP")]
        ports: list[NamedPort] = []
        for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            if not isinstance(container, Mapping):
                continue
            for cp in container.get("ports") or []:
                if not isinstance(cp, Mapping) or not isinstance(cp.get("name"), str):
                    continue
                number = cp.get("containerPort")
                try:
                    proto = Protocol(cp.get("protocol") or "TCP")
                except ValueError:
                    continue
                if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= 65535:
                    continue
                if is_port_name(cp["name"]):
                    ports.append(NamedPort(cp["name"], proto, number))
        phase = status.get("phase")
        return cls(
            namespace=namespace,
            name=name,
            labels=labels,
            addresses=_addresses(ips),
            named_ports=tuple(ports),
            node=str(spec.get("nodeName") or ""),
            host_veth=None,
            selectable=not spec.get("hostNetwork") and phase not in ("Succeeded", "Failed"),
            resource_version=str(meta.get("resourceVersion", "")),
        )
