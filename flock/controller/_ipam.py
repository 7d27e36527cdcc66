"""LoadBalancer IPAM, pure: pools + Services → each Service's addresses and condition, each pool's counts.

Nothing here reads the API or the clock: :func:`plan` is a function of its
arguments, deterministic (pools by name, Services by key), so two writers that
see the same objects write the same answer, and a writer that restarts rebuilds
the same state from the Services' own ``status.loadBalancer.ingress`` (there is
no other record).

The rules, in the order :func:`plan` applies them:

1. Pools: a disabled pool gives nothing. A pool whose block overlaps a block of
   a pool earlier by name (or another block of its own) is *conflicting*: it
   gives no new address and its status says which pool it overlaps.
2. Kept: an address a Service already holds stays if a pool the Service may use
   (usable, selectors matching) holds it, its family is one the Service asks
   for, it is one the Service requested (when it requests any), and no earlier
   Service (by key) holds it unshareably. An existing allocation is never moved.
3. Requested: addresses from the annotation or ``spec.loadBalancerIP`` are
   given exactly, or not at all (condition ``NotInPool``, ``AddressInUse``,
   ``WrongFamily``); a family not requested gets nothing.
4. Otherwise, one address per family in ``ipFamilies``: with a sharing key,
   first an address a Service of the same key holds whose ports do not clash;
   else the lowest free address of the first pool (by name) that may serve it.

Sharing: two Services share an address only when both carry the same sharing
key and no (protocol, port) of one is a (protocol, port) of the other.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from flock.policy import LabelSelector

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# The loadBalancerClass flock answers for (besides none at all).
LOAD_BALANCER_CLASS = "flock.fritzlab.net/bgp"
# Requested addresses, comma-separated: flock's annotation, else MetalLB's (manifests written for
# MetalLB keep working), else the deprecated spec.loadBalancerIP.
ANNOTATION_IPS = "flock.fritzlab.net/loadBalancerIPs"
METALLB_ANNOTATION_IPS = "metallb.universe.tf/loadBalancerIPs"
# The sharing key: flock's, else MetalLB's.
ANNOTATION_SHARING = "flock.fritzlab.net/allow-shared-ip"
METALLB_ANNOTATION_SHARING = "metallb.universe.tf/allow-shared-ip"
# The Service conditions the controller writes: the load-balancer address, and whether spec.externalIPs
# lie inside the pools (CVE-2020-8554: outside, no agent translates or announces them).
CONDITION_TYPE = "flock.fritzlab.net/LoadBalancerAddress"
EXTERNAL_IPS_CONDITION = "flock.fritzlab.net/ExternalIPs"


class Reason(enum.Enum):
    ALLOCATED = "Allocated"
    NO_POOL = "NoPool"  # no usable pool may serve this Service (in this family)
    POOL_EXHAUSTED = "PoolExhausted"
    NOT_IN_POOL = "NotInPool"  # a requested address outside every pool the Service may use
    ADDRESS_IN_USE = "AddressInUse"  # a requested address held by another Service, sharing refused
    WRONG_FAMILY = "WrongFamily"  # a requested address of a family the Service does not ask for
    INVALID_REQUEST = "InvalidRequest"  # the annotation does not parse
    IN_POOL = "InPool"  # every externalIP lies in a pool the Service may use


@attrs.frozen
class ServiceCondition:
    reason: Reason
    message: str

    @property
    def status(self) -> str:
        return "True" if self.reason in (Reason.ALLOCATED, Reason.IN_POOL) else "False"


@attrs.frozen
class Pool:
    name: str
    blocks: tuple[IPNetwork, ...]
    service_selector: LabelSelector = attrs.field(factory=LabelSelector)
    namespace_selector: LabelSelector = attrs.field(factory=LabelSelector)
    disabled: bool = False

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Pool:
        """A LoadBalancerPool object (its CRD's schema checked the shape); raises ValueError."""
        name = str(obj["metadata"]["name"])
        spec = obj.get("spec") or {}
        blocks = tuple(ipaddress.ip_network(str(b["cidr"]), strict=True) for b in spec.get("blocks") or [])
        return cls(
            name,
            blocks,
            LabelSelector.from_object(spec.get("serviceSelector"), kind="LoadBalancerPool", name=name),
            LabelSelector.from_object(spec.get("namespaceSelector"), kind="LoadBalancerPool", name=name),
            bool(spec.get("disabled", False)),
        )

    def holds(self, address: IPAddress) -> bool:
        return any(address.version == b.version and address in b for b in self.blocks)

    def serves(self, service: LbService) -> bool:
        return self.service_selector.matches(dict(service.labels)) and self.namespace_selector.matches(
            dict(service.namespace_labels)
        )


Port = tuple[str, int]  # (protocol, port)


@attrs.frozen
class LbService:
    """What the allocator reads of a Service of type LoadBalancer that flock serves."""

    namespace: str
    name: str
    families: tuple[int, ...]  # 6, 4: spec.ipFamilies in order
    ports: frozenset[Port] = frozenset()
    labels: tuple[tuple[str, str], ...] = ()
    namespace_labels: tuple[tuple[str, str], ...] = ()
    requested: tuple[IPAddress, ...] = ()
    request_error: str | None = None  # the annotation did not parse: nothing is given
    sharing_key: str | None = None
    current: tuple[IPAddress, ...] = ()  # status.loadBalancer.ingress[].ip

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_object(cls, obj: Mapping[str, Any], namespace_labels: Mapping[str, str] | None = None) -> LbService | None:
        """None for a Service flock does not allocate for (another type, another class)."""
        spec = obj.get("spec") or {}
        if spec.get("type") != "LoadBalancer" or spec.get("loadBalancerClass") not in (None, LOAD_BALANCER_CLASS):
            return None
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        families = tuple(6 if f == "IPv6" else 4 for f in spec.get("ipFamilies") or ["IPv4"])
        try:
            ports = frozenset((str(p.get("protocol") or "TCP"), int(p["port"])) for p in spec.get("ports") or [])
            ports_error = None
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # the API server checks; a fake may not
            ports, ports_error = frozenset(), f"spec.ports does not parse: {type(e).__name__}: {str(e)[:100]}"
        raw = annotations.get(ANNOTATION_IPS, annotations.get(METALLB_ANNOTATION_IPS, spec.get("loadBalancerIP")))
        requested: tuple[IPAddress, ...] = ()
        error = None
        if raw:
            try:
                requested = tuple(ipaddress.ip_address(t.strip()) for t in str(raw).split(",") if t.strip())
            except ValueError as e:
                error = f"requested addresses {str(raw)[:100]!r}: {str(e)[:100]}"
        current: list[IPAddress] = []
        for ingress in ((obj.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []:
            try:
                current.append(ipaddress.ip_address(str(ingress.get("ip"))))
            except ValueError:
                continue  # a hostname, or another writer's garbage: not an allocation
        sharing = annotations.get(ANNOTATION_SHARING, annotations.get(METALLB_ANNOTATION_SHARING))
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta["name"]),
            families=families,
            ports=ports,
            labels=tuple(sorted((meta.get("labels") or {}).items())),
            namespace_labels=tuple(sorted((namespace_labels or {}).items())),
            requested=requested,
            request_error=ports_error or error,
            sharing_key=str(sharing) if sharing else None,
            current=tuple(current),
        )


@attrs.frozen
class ExternalIps:
    """A Service's ``spec.externalIPs`` (any type), as the allow-list check reads them."""

    namespace: str
    name: str
    addresses: tuple[IPAddress, ...]
    labels: tuple[tuple[str, str], ...] = ()
    namespace_labels: tuple[tuple[str, str], ...] = ()
    error: str | None = None  # an entry that is not an address

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_object(
        cls, obj: Mapping[str, Any], namespace_labels: Mapping[str, str] | None = None
    ) -> ExternalIps | None:
        """None for a Service without externalIPs."""
        raw = (obj.get("spec") or {}).get("externalIPs") or []
        if not raw:
            return None
        meta = obj.get("metadata") or {}
        addresses: list[IPAddress] = []
        error = None
        for text in raw if isinstance(raw, list) else [raw]:
            try:
                addresses.append(ipaddress.ip_address(str(text)))
            except ValueError:
                error = f"externalIPs entry {str(text)[:64]!r} is not an address"
        return cls(
            str(meta.get("namespace", "")),
            str(meta["name"]),
            tuple(addresses),
            tuple(sorted((meta.get("labels") or {}).items())),
            tuple(sorted((namespace_labels or {}).items())),
            error,
        )


def _outside(usable: Sequence[Pool], svc: ExternalIps) -> list[IPAddress]:
    probe = LbService(svc.namespace, svc.name, (), labels=svc.labels, namespace_labels=svc.namespace_labels)
    return [a for a in svc.addresses if not any(p.holds(a) and p.serves(probe) for p in usable)]


def _named(addresses: Sequence[object], most: int = 8) -> str:
    shown = ", ".join(str(a) for a in addresses[:most])
    return shown + (f" and {len(addresses) - most} more" if len(addresses) > most else "")


def external_ip_conditions(pools: Iterable[Pool], services: Iterable[ExternalIps]) -> dict[str, ServiceCondition]:
    """Per Service with externalIPs: ``InPool``, or ``NotInPool`` naming the addresses outside every
    enabled, non-conflicting pool whose selectors match it (no agent translates or announces those)."""
    ordered_pools = sorted(pools, key=lambda p: p.name)
    overlaps = _overlaps(ordered_pools)
    usable = [p for p in ordered_pools if not p.disabled and p.name not in overlaps]
    out: dict[str, ServiceCondition] = {}
    for svc in services:
        outside = _outside(usable, svc)
        if svc.error is not None:
            out[svc.key] = ServiceCondition(Reason.INVALID_REQUEST, svc.error)
        elif outside:
            out[svc.key] = ServiceCondition(
                Reason.NOT_IN_POOL,
                f"externalIPs {_named(outside)} outside every pool this Service may use: not translated, not announced",
            )
        else:
            out[svc.key] = ServiceCondition(Reason.IN_POOL, "every externalIP lies in a pool this Service may use")
    return out


@attrs.frozen
class Allocation:
    addresses: tuple[IPAddress, ...]  # in the Service's family order
    condition: ServiceCondition


@attrs.frozen
class FamilyCount:
    total: int
    used: int

    @property
    def free(self) -> int:
        return self.total - self.used


@attrs.frozen
class PoolStatus:
    counts: Mapping[int, FamilyCount]  # 6, 4 → counts (families the pool has blocks of)
    conflicts: tuple[str, ...]  # messages: overlapping pools, requests outside every pool
    usable: bool


@attrs.frozen
class Plan:
    services: Mapping[str, Allocation]  # by Service key
    pools: Mapping[str, PoolStatus]  # by pool name
    external: Mapping[str, ServiceCondition] = attrs.field(factory=dict)  # by key: Services with externalIPs


@attrs.define(eq=False)
class _Holders:
    """Who holds each address: (key, sharing key, ports) per holder."""

    by_address: dict[IPAddress, list[tuple[str, str | None, frozenset[Port]]]] = attrs.Factory(dict)

    def may_take(self, address: IPAddress, service: LbService) -> bool:
        holders = self.by_address.get(address)
        if not holders:
            return True
        if service.sharing_key is None:
            return False
        return all(
            key != service.key and sk == service.sharing_key and not (ports & service.ports)
            for key, sk, ports in holders
        )

    def take(self, address: IPAddress, service: LbService) -> None:
        self.by_address.setdefault(address, []).append((service.key, service.sharing_key, service.ports))


def _overlaps(pools: Sequence[Pool]) -> dict[str, list[str]]:
    """pool name → what it overlaps (pools earlier by name, or itself)."""
    found: dict[str, list[str]] = {}
    seen: list[tuple[str, IPNetwork]] = []
    for pool in pools:
        mine: list[IPNetwork] = []
        for block in pool.blocks:
            for other, b in seen:
                if b.version == block.version and b.overlaps(block):
                    found.setdefault(pool.name, []).append(f"block {block} overlaps {b} of pool {other}")
            for b in mine:
                if b.version == block.version and b.overlaps(block):
                    found.setdefault(pool.name, []).append(f"block {block} overlaps its own block {b}")
            mine.append(block)
        seen.extend((pool.name, b) for b in pool.blocks)
    return found


def _lowest_free(block: IPNetwork, taken: Iterable[IPAddress]) -> IPAddress | None:
    """The lowest address of *block* not in *taken*: at most len(taken) + 1 steps, whatever the size."""
    inside = {int(a) for a in taken if a.version == block.version and a in block}
    first = int(block.network_address)
    if len(inside) >= block.num_addresses:
        return None
    n = first
    while n in inside:
        n += 1
    return ipaddress.ip_address(n) if block.version == 6 else ipaddress.IPv4Address(n)


def plan(pools: Iterable[Pool], services: Iterable[LbService], externals: Iterable[ExternalIps] = ()) -> Plan:
    """*services*' addresses and conditions, *externals*' conditions, the pools' status (whose
    conflicts name requested addresses and externalIPs outside every pool the Service may use)."""
    ordered_pools = sorted(pools, key=lambda p: p.name)
    overlaps = _overlaps(ordered_pools)
    usable = [p for p in ordered_pools if not p.disabled and p.name not in overlaps]
    ordered = sorted(services, key=lambda s: s.key)
    holders = _Holders()
    given: dict[str, dict[int, IPAddress]] = {s.key: {} for s in ordered}
    outside: dict[str, list[str]] = {}

    def allowed(service: LbService, address: IPAddress) -> bool:
        return any(p.holds(address) and p.serves(service) for p in usable)

    # 2. Kept, before anything new is given, so that a new Service never takes a held address.
    for service in ordered:
        if service.request_error is not None or len({a.version for a in service.requested}) != len(service.requested):
            continue
        for address in service.current:
            family = address.version
            if family not in service.families or family in given[service.key]:
                continue
            if service.requested and address not in service.requested:
                continue
            if allowed(service, address) and holders.may_take(address, service):
                holders.take(address, service)
                given[service.key][family] = address

    conditions: dict[str, ServiceCondition] = {}
    for service in ordered:
        mine = given[service.key]
        failure: ServiceCondition | None = None
        if service.request_error is not None:
            failure = ServiceCondition(Reason.INVALID_REQUEST, service.request_error)
        elif len({a.version for a in service.requested}) != len(service.requested):
            failure = ServiceCondition(Reason.INVALID_REQUEST, "at most one requested address per family")
        elif service.requested:
            for address in service.requested:
                if address.version in mine:
                    continue
                if address.version not in service.families:
                    failure = failure or ServiceCondition(
                        Reason.WRONG_FAMILY,
                        f"requested {address} is IPv{address.version}; ipFamilies do not ask for it",
                    )
                elif not allowed(service, address):
                    failure = failure or ServiceCondition(
                        Reason.NOT_IN_POOL, f"requested {address} is outside every pool this Service may use"
                    )
                    outside.setdefault(service.key, []).append(f"requested {address}")
                elif not holders.may_take(address, service):
                    failure = failure or ServiceCondition(
                        Reason.ADDRESS_IN_USE, f"requested {address} is held by another Service and may not be shared"
                    )
                else:
                    holders.take(address, service)
                    mine[address.version] = address
        else:
            for wanted in service.families:
                if wanted in mine:
                    continue
                candidates = [p for p in usable if p.serves(service) and any(b.version == wanted for b in p.blocks)]
                if not candidates:
                    failure = failure or ServiceCondition(
                        Reason.NO_POOL, f"no enabled pool may serve this Service in IPv{wanted}"
                    )
                    continue
                found = _shared(candidates, service, wanted, holders) or _free(candidates, wanted, holders)
                if found is None:
                    names = ", ".join(p.name for p in candidates)
                    failure = failure or ServiceCondition(
                        Reason.POOL_EXHAUSTED, f"no free IPv{wanted} address in {names}"
                    )
                    continue
                holders.take(found, service)
                mine[wanted] = found
        if failure is None:
            text = ", ".join(str(mine[f]) for f in service.families if f in mine)
            failure = ServiceCondition(Reason.ALLOCATED, f"given {text}")
        conditions[service.key] = failure

    allocations = {
        s.key: Allocation(tuple(given[s.key][f] for f in s.families if f in given[s.key]), conditions[s.key])
        for s in ordered
    }
    external_list = sorted(externals, key=lambda e: e.key)
    external = external_ip_conditions(ordered_pools, external_list)
    for svc in external_list:
        if svc.error is None and (addresses := _outside(usable, svc)):
            outside.setdefault(svc.key, []).extend(f"externalIP {a}" for a in addresses)
    return Plan(allocations, _pool_status(ordered_pools, overlaps, usable, holders, outside), external)


def _shared(candidates: Sequence[Pool], service: LbService, family: int, holders: _Holders) -> IPAddress | None:
    if service.sharing_key is None:
        return None
    for address in sorted((a for a in holders.by_address if a.version == family), key=int):
        if any(p.holds(address) for p in candidates) and holders.may_take(address, service):
            return address
    return None


def _free(candidates: Sequence[Pool], family: int, holders: _Holders) -> IPAddress | None:
    for pool in candidates:
        for block in pool.blocks:
            if block.version == family:
                found = _lowest_free(block, holders.by_address)
                if found is not None:
                    return found
    return None


def _pool_status(
    pools: Sequence[Pool],
    overlaps: Mapping[str, list[str]],
    usable: Sequence[Pool],
    holders: _Holders,
    outside: Mapping[str, list[str]],
) -> dict[str, PoolStatus]:
    statuses: dict[str, PoolStatus] = {}
    usable_names = {p.name for p in usable}
    outside_text = tuple(
        f"Service {key}: {_named(addrs, 4)} outside every pool it may use" for key, addrs in sorted(outside.items())
    )
    for pool in pools:
        counts: dict[int, FamilyCount] = {}
        for family in (6, 4):
            blocks = [b for b in pool.blocks if b.version == family]
            if not blocks:
                continue
            total = sum(b.num_addresses for b in blocks)
            used = (
                sum(1 for a in holders.by_address if a.version == family and pool.holds(a))
                if pool.name in usable_names
                else 0
            )
            counts[family] = FamilyCount(total, used)
        statuses[pool.name] = PoolStatus(
            counts, tuple(overlaps.get(pool.name, ())) + outside_text, pool.name in usable_names
        )
    return statuses
