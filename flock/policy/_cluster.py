"""ClusterNetworkPolicy (``policy.networking.k8s.io/v1alpha2``) and Node as the policy compiler sees them.

The cluster administrator's tiers: an Admin tier evaluated before
NetworkPolicy and a Baseline tier after it (see :mod:`._reference` for the
order).  Values are frozen attrs, built by ``from_object`` from the JSON form
of the object.  Two kinds of trouble are told apart:

- What flock cannot place at all (tier, priority, subject missing or not
  what the CRD allows): :class:`flock.model.InvalidObject`; the watcher logs
  it, counts it and leaves the object out, as for a NetworkPolicy.
- A rule flock cannot read (a peer or protocol with no field flock knows, as
  a newer CRD would send; ``domainNames``, which flock does not implement; a
  value the CRD would refuse): the rule *fails closed*, as the CRD asks — an
  ``Accept`` rule then matches nothing, a ``Deny`` or ``Pass`` rule denies
  everything.  :attr:`ClusterRule.unreadable` says why; the policy is
  applied, its status and a metric say which rules fail closed.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from flock.model import InvalidObject

from ._model import (
    IPAddress,
    IPNetwork,
    Labels,
    LabelSelector,
    PolicyPod,
    Protocol,
    _addresses,
    is_port_name,
    labels_field,
)

KIND = "ClusterNetworkPolicy"
GROUP = "policy.networking.k8s.io"
VERSION = "v1alpha2"
PLURAL = "clusternetworkpolicies"
MAX_PRIORITY = 1000
MAX_RULES = 25  # per direction, peers per rule, protocols per rule, networks per peer (the CRD's MaxItems)
MAX_RULE_NAME = 100


class Tier(enum.Enum):
    ADMIN = "Admin"
    BASELINE = "Baseline"


class Action(enum.Enum):
    ACCEPT = "Accept"
    DENY = "Deny"
    PASS = "Pass"


@attrs.frozen(cache_hash=True)
class ClusterPeer:
    """One peer; exactly one field is set.

    ``namespaces``: every pod of the namespaces the selector picks.
    ``pods``: (namespace selector, pod selector) — pods matching both.
    ``nodes``: the addresses (status.addresses) of the nodes the selector picks (egress only).
    ``networks``: CIDRs (egress only).
    """

    namespaces: LabelSelector | None = None
    pods: tuple[LabelSelector, LabelSelector] | None = None
    nodes: LabelSelector | None = None
    networks: tuple[IPNetwork, ...] = ()

    @property
    def selector(self) -> tuple[LabelSelector, LabelSelector | None] | None:
        """(namespace selector, pod selector or None) for a pod peer; None for nodes and networks."""
        if self.namespaces is not None:
            return (self.namespaces, None)
        return self.pods


@attrs.frozen(cache_hash=True)
class ClusterPort:
    """One ``protocols`` entry: *protocol* ports *first*–*last*, or the container port called *named*."""

    protocol: Protocol | None = None  # None: a named port (the name says the protocol, per pod)
    first: int = 0
    last: int = 0
    named: str | None = None


@attrs.frozen(cache_hash=True)
class ClusterRule:
    """One ingress (peers: from) or egress (peers: to) rule; ``protocols`` () = all traffic to the peers."""

    action: Action
    peers: tuple[ClusterPeer, ...] = ()
    protocols: tuple[ClusterPort, ...] = ()
    name: str = ""
    unreadable: str = ""  # why flock cannot read this rule ("" : it can): it fails closed

    @property
    def fails_closed(self) -> bool:
        return bool(self.unreadable)


@attrs.frozen(cache_hash=True)
class ClusterNetworkPolicy:
    """A ClusterNetworkPolicy; its subject is the pods of the namespaces ``subject_namespaces``
    picks that ``subject_pods`` picks (None: every pod of them)."""

    name: str
    tier: Tier
    priority: int
    subject_namespaces: LabelSelector = attrs.field(factory=LabelSelector)
    subject_pods: LabelSelector | None = None
    ingress: tuple[ClusterRule, ...] = ()
    egress: tuple[ClusterRule, ...] = ()
    resource_version: str = ""

    @property
    def key(self) -> str:
        return self.name

    @property
    def order(self) -> tuple[int, str]:
        """Precedence within its tier: lower priority first; equal priorities by name (flock's choice)."""
        return (self.priority, self.name)

    @property
    def uses_nodes(self) -> bool:
        return any(p.nodes is not None for r in self.egress for p in r.peers)

    def selects(self, pod: PolicyPod, namespace_labels: Mapping[str, str]) -> bool:
        """Is *pod* (of a namespace with *namespace_labels*) a subject?  hostNetwork pods never are."""
        if not pod.selectable or not self.subject_namespaces.matches(namespace_labels):
            return False
        return self.subject_pods is None or self.subject_pods.matches(pod.label_map)

    @classmethod
    def read(cls, obj: Mapping[str, Any]) -> ClusterNetworkPolicy:
        """:meth:`from_object`, with anything malformed an :class:`InvalidObject` (never another exception)."""
        return _guarded(KIND, cls.from_object, obj)

    def unreadable_rules(self) -> list[str]:
        """``spec.ingress[0] (name): why`` for every rule that fails closed."""
        out = []
        for direction, rules in (("ingress", self.ingress), ("egress", self.egress)):
            for i, rule in enumerate(rules):
                if rule.unreadable:
                    label = f" ({rule.name})" if rule.name else ""
                    out.append(f"spec.{direction}[{i}]{label}: {rule.unreadable}")
        return out

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ClusterNetworkPolicy:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))[:253]
        spec = obj.get("spec")
        if not isinstance(spec, Mapping):
            raise InvalidObject(KIND, name, "spec", _brief(spec), "an object")
        try:
            tier = Tier(spec.get("tier"))
        except ValueError:
            raise InvalidObject(KIND, name, "spec.tier", _brief(spec.get("tier")), "Admin or Baseline") from None
        priority = spec.get("priority")
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= MAX_PRIORITY:
            raise InvalidObject(KIND, name, "spec.priority", _brief(priority), f"an integer 0-{MAX_PRIORITY}")
        ns_sel, pod_sel = _subject(name, spec.get("subject"))
        rules: dict[str, tuple[ClusterRule, ...]] = {}
        for direction, peers_key in (("ingress", "from"), ("egress", "to")):
            raw = spec.get(direction)
            if raw is None:
                raw = []
            if not isinstance(raw, list) or len(raw) > MAX_RULES:
                raise InvalidObject(
                    KIND, name, f"spec.{direction}", _brief(raw), f"a list of at most {MAX_RULES} rules"
                )
            rules[direction] = tuple(_rule(r, direction, peers_key) for r in raw)
        return cls(
            name=name,
            tier=tier,
            priority=priority,
            subject_namespaces=ns_sel,
            subject_pods=pod_sel,
            ingress=rules["ingress"],
            egress=rules["egress"],
            resource_version=str(meta.get("resourceVersion", "")),
        )


def _brief(value: Any) -> Any:
    """A value for an error message: a bounded prefix of its text."""
    return value if isinstance(value, bool | int | float | type(None)) and len(str(value)) <= 64 else str(value)[:64]


def _selector(name: str, field: str, raw: Any) -> LabelSelector:
    return LabelSelector.from_object(raw if raw is not None else {}, kind=KIND, name=name, field=field)


def _subject(name: str, raw: Any) -> tuple[LabelSelector, LabelSelector | None]:
    if not isinstance(raw, Mapping):
        raise InvalidObject(KIND, name, "spec.subject", _brief(raw), "namespaces or pods")
    known = [k for k in ("namespaces", "pods") if raw.get(k) is not None]
    if len(known) != 1:
        raise InvalidObject(KIND, name, "spec.subject", _fields(raw), "exactly one of namespaces, pods")
    if known[0] == "namespaces":
        return _selector(name, "spec.subject.namespaces", raw["namespaces"]), None
    pods = raw["pods"]
    if not isinstance(pods, Mapping):
        raise InvalidObject(KIND, name, "spec.subject.pods", _brief(pods), "namespaceSelector and podSelector")
    return (
        _selector(name, "spec.subject.pods.namespaceSelector", pods.get("namespaceSelector")),
        _selector(name, "spec.subject.pods.podSelector", pods.get("podSelector")),
    )


class _Unreadable(Exception):
    """A rule flock cannot read: it fails closed (the message says why)."""


def _rule(raw: Any, direction: str, peers_key: str) -> ClusterRule:
    """One rule; what cannot be read makes it fail closed rather than the whole policy refused."""
    if not isinstance(raw, Mapping):
        return ClusterRule(Action.DENY, unreadable=f"not a rule: {_brief(raw)!r}")
    rule_name = raw.get("name")
    name = rule_name[:MAX_RULE_NAME] if isinstance(rule_name, str) else ""
    try:
        action = Action(raw.get("action"))
    except ValueError:
        # Not Accept, whatever it is: failing closed, it denies.
        return ClusterRule(Action.DENY, name=name, unreadable=f"action {_brief(raw.get('action'))!r} unknown")
    try:
        if rule_name is not None and not isinstance(rule_name, str):
            raise _Unreadable(f"name {_brief(rule_name)!r} is not a string")
        if isinstance(rule_name, str) and len(rule_name) > MAX_RULE_NAME:
            raise _Unreadable(f"name longer than {MAX_RULE_NAME} characters")
        peers = _peers(raw.get(peers_key), direction, peers_key)
        protocols = _protocols(raw.get("protocols"))
    except _Unreadable as exc:
        return ClusterRule(action, name=name, unreadable=str(exc))
    except InvalidObject as exc:  # a selector the API server would refuse
        return ClusterRule(action, name=name, unreadable=f"{exc.field}: expected {exc.expected}")
    return ClusterRule(action, peers, protocols, name)


def _one_field(raw: Any, where: str, what: str) -> tuple[str, Any]:
    """The one field set in *raw* (the CRD's MinProperties=MaxProperties=1) and its value."""
    if not isinstance(raw, Mapping):
        raise _Unreadable(f"{where}: not {what}")
    set_fields = [(k, v) for k, v in raw.items() if v is not None]
    if len(set_fields) != 1:
        raise _Unreadable(f"{where}: exactly one field expected, found {_fields(k for k, _ in set_fields)}")
    key, value = set_fields[0]
    return str(key)[:40] if not isinstance(key, str) or len(key) > 40 else key, value


def _fields(keys: Iterable[Any]) -> str:
    """Field names for a message: a few, each cut short."""
    names = sorted(str(k)[:40] for k in keys)
    if not names:
        return "none"
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


_PEER_FIELDS = {"ingress": ("namespaces", "pods"), "egress": ("namespaces", "pods", "nodes", "networks")}


def _peers(raw: Any, direction: str, peers_key: str) -> tuple[ClusterPeer, ...]:
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_RULES:
        raise _Unreadable(f"{peers_key}: expected a list of 1-{MAX_RULES} peers")
    out = []
    for i, peer in enumerate(raw):
        where = f"{peers_key}[{i}]"
        field, value = _one_field(peer, where, "a peer")
        if field not in _PEER_FIELDS[direction]:
            if field == "domainNames":
                raise _Unreadable(f"{where}.domainNames: flock does not implement domain name peers")
            raise _Unreadable(f"{where}: {field!r} is no {direction} peer flock knows")
        if field == "namespaces":
            out.append(ClusterPeer(namespaces=_selector("", f"{where}.namespaces", value)))
        elif field == "pods":
            if not isinstance(value, Mapping):
                raise _Unreadable(f"{where}.pods: expected namespaceSelector and podSelector")
            out.append(
                ClusterPeer(
                    pods=(
                        _selector("", f"{where}.pods.namespaceSelector", value.get("namespaceSelector")),
                        _selector("", f"{where}.pods.podSelector", value.get("podSelector")),
                    )
                )
            )
        elif field == "nodes":
            out.append(ClusterPeer(nodes=_selector("", f"{where}.nodes", value)))
        else:
            out.append(ClusterPeer(networks=_networks(value, f"{where}.networks")))
    return tuple(out)


def _networks(raw: Any, where: str) -> tuple[IPNetwork, ...]:
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_RULES:
        raise _Unreadable(f"{where}: expected a list of 1-{MAX_RULES} CIDRs")
    nets: list[IPNetwork] = []
    for i, cidr in enumerate(raw):
        # the CRD's isCIDR: an address and a prefix length (no netmask, no zone)
        if not isinstance(cidr, str) or "%" in cidr or len(cidr) > 43 or not cidr.partition("/")[2].isdigit():
            raise _Unreadable(f"{where}[{i}]: {_brief(cidr)!r} is not a CIDR")
        try:
            net = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise _Unreadable(f"{where}[{i}]: {_brief(cidr)!r} is not a CIDR") from None
        if net not in nets:
            nets.append(net)
    return tuple(sorted(nets, key=lambda n: (n.version, n.network_address, n.prefixlen)))


_PROTOCOLS = {"tcp": Protocol.TCP, "udp": Protocol.UDP, "sctp": Protocol.SCTP}


def _protocols(raw: Any) -> tuple[ClusterPort, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_RULES:
        raise _Unreadable(f"protocols: expected a list of 1-{MAX_RULES} entries")
    out: list[ClusterPort] = []
    for i, entry in enumerate(raw):
        where = f"protocols[{i}]"
        field, value = _one_field(entry, where, "a protocol match")
        if field == "destinationNamedPort":
            if not isinstance(value, str) or not is_port_name(value):
                raise _Unreadable(f"{where}.destinationNamedPort: {_brief(value)!r} is not a port name")
            port = ClusterPort(named=value)
        elif field in _PROTOCOLS:
            port = _port(_PROTOCOLS[field], value, f"{where}.{field}")
        else:
            raise _Unreadable(f"{where}: {field!r} is no protocol match flock knows")
        if port not in out:
            out.append(port)
    return tuple(out)


def _port(protocol: Protocol, raw: Any, where: str) -> ClusterPort:
    if not isinstance(raw, Mapping):
        raise _Unreadable(f"{where}: expected destinationPort")
    unknown = [k for k, v in raw.items() if v is not None and k != "destinationPort"]
    if unknown:
        raise _Unreadable(f"{where}: {_fields(unknown)} unknown to flock")
    dport = raw.get("destinationPort")
    if not isinstance(dport, Mapping):
        raise _Unreadable(f"{where}: expected destinationPort")
    set_fields = [k for k, v in dport.items() if v is not None]
    if set_fields == ["number"]:
        number = dport["number"]
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 65535:
            raise _Unreadable(f"{where}.destinationPort.number: {_brief(number)!r} is not a port number")
        return ClusterPort(protocol, number, number)
    if set_fields == ["range"]:
        rng = dport["range"]
        start = rng.get("start") if isinstance(rng, Mapping) else None
        end = rng.get("end") if isinstance(rng, Mapping) else None
        ok = all(isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 65535 for p in (start, end))
        if not ok or not start < end:  # type: ignore[operator]
            raise _Unreadable(f"{where}.destinationPort.range: expected 1 <= start < end <= 65535")
        return ClusterPort(protocol, start, end)  # type: ignore[arg-type]
    raise _Unreadable(f"{where}.destinationPort: exactly one of number, range expected, found {_fields(set_fields)}")


@attrs.frozen(cache_hash=True)
class PolicyNode:
    """A Node as a ``nodes`` peer: its labels and the IP addresses of status.addresses."""

    name: str
    labels: Labels = ()
    addresses: tuple[IPAddress, ...] = ()

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> PolicyNode:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        labels = labels_field("Node", name, "metadata.labels", meta.get("labels"))
        status = obj.get("status") or {}
        raw = status.get("addresses") if isinstance(status, Mapping) else None
        entries = raw if isinstance(raw, list) else []
        # Hostname and DNS entries are names, not addresses: _addresses keeps what parses as an IP.
        ips = [e.get("address") for e in entries if isinstance(e, Mapping)]
        return cls(name, labels, tuple(sorted(_addresses(ips), key=lambda a: (a.version, a))))

    @classmethod
    def read(cls, obj: Mapping[str, Any]) -> PolicyNode:
        """:meth:`from_object`, with anything malformed an :class:`InvalidObject` (never another exception)."""
        return _guarded("Node", cls.from_object, obj)


def _guarded(kind: str, read: Any, obj: Any) -> Any:
    if not isinstance(obj, Mapping) or not isinstance(obj.get("metadata") or {}, Mapping):
        raise InvalidObject(kind, "", "metadata", _brief(obj), "an object with metadata")
    try:
        return read(obj)
    except InvalidObject:
        raise
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a shape no API server sends
        name = str((obj.get("metadata") or {}).get("name", ""))[:253]
        raise InvalidObject(kind, name, "(object)", _brief(exc), "an object the CRD's schema allows") from None
