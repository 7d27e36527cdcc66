"""Service ClusterIPs and NodePorts, allocated as kube-apiserver 1.32 allocates them.

:class:`ServiceAllocator` is the service storage's allocation step
(``pkg/registry/core/service/storage/alloc.go``) over its allocators (``ipallocator``'s bitmap
range, ``portallocator``): ipFamilyPolicy and ipFamilies defaulted and checked against the
configured ranges (``initIPFamilyFields``), ClusterIPs and NodePorts allocated or the requested ones
checked ("provided IP is already allocated", "... is not in the valid range. The range of valid
IPs is ..."), a random free one otherwise, from the upper part of the range first (the static /
dynamic bands of KEP-3070 and KEP-3668).

What each Service holds is derived from the stored objects: the store calls :meth:`record` with
every Service it commits (and None when one is deleted), under its lock, so the allocator's view
is always the stored Services' and two writes asking for one address cannot both have it.
:meth:`admit_create` and :meth:`admit_update` change nothing here: they fill in the Service
(raising :class:`Invalid` or a 500 StatusError as upstream answers), and only the commit's
:meth:`record` takes what it holds.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Mapping
from typing import Any

import attrs

from . import _services as svc
from ._status import Invalid, StatusError
from ._validation import IPAddress, parse_ip

DEFAULT_SERVICE_CLUSTER_IP_RANGE = "fd00:10:96::/112"
NODE_PORTS = range(30000, 32768)  # --service-node-port-range's default, 30000-32767
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_service_ranges(text: str) -> tuple[Network, ...]:
    """``--service-cluster-ip-range``: one CIDR, or two of different families (the first is primary)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not 1 <= len(parts) <= 2:
        raise ValueError(f"service cluster IP range {text!r}: expected one CIDR or two comma-separated")
    try:
        nets = tuple(ipaddress.ip_network(p, strict=True) for p in parts)
    except ValueError as exc:
        raise ValueError(f"service cluster IP range {text!r}: {exc}") from None
    if len(nets) == 2 and nets[0].version == nets[1].version:
        raise ValueError(f"service cluster IP range {text!r}: two CIDRs must be one IPv4 and one IPv6")
    return nets


@attrs.frozen
class IPRange:
    """One family's range as the bitmap allocator sees it: never the network address, for IPv4
    never the broadcast, for IPv6 at most the first 65536 addresses."""

    network: Network

    @property
    def family(self) -> str:
        return svc.IPV6 if self.network.version == 6 else svc.IPV4

    @property
    def base(self) -> int:
        return int(self.network.network_address) + 1

    @property
    def size(self) -> int:
        total = self.network.num_addresses
        total = min(total, 65536) if self.network.version == 6 else total - 1
        return max(0, total - 1)

    @property
    def offset(self) -> int:
        """Where the dynamic band starts (``calculateRangeOffset``: min(max(16, size/16), 256))."""
        total = self.network.num_addresses
        return 0 if total <= 16 else min(max(16, total // 16), 256)

    def index(self, ip: IPAddress) -> int | None:
        if ip.version != self.network.version or ip not in self.network:
            return None
        i = int(ip) - self.base
        return i if 0 <= i < self.size else None

    def address(self, i: int) -> IPAddress:
        return ipaddress.ip_address(self.base + i)


class _Full(Exception):
    pass


def _internal(message: str) -> StatusError:
    return StatusError(500, f"Internal error occurred: {message}", reason="InternalError")


def _pick(size: int, offset: int, taken: Any, rng: random.Random) -> int:
    """A random free index, from [offset, size) first, then [0, offset) (``randomScanStrategyWithOffset``)."""
    for lo, hi in ((offset, size), (0, offset)):
        if hi <= lo:
            continue
        start = rng.randrange(lo, hi)
        for step in range(hi - lo):
            i = lo + (start - lo + step) % (hi - lo)
            if not taken(i):
                return i
    raise _Full


@attrs.define(eq=False)
class _Claim:
    """What one write asks for, checked against what the other Services hold."""

    alloc: ServiceAllocator
    key: str
    ips: set[IPAddress] = attrs.field(factory=set)
    ports: set[int] = attrs.field(factory=set)

    def ip(self, family: str, text: str) -> None:
        span = self.alloc.range_of(family)
        ip = parse_ip(text)
        assert span is not None and ip is not None  # families and addresses were validated
        if span.index(ip) is None:
            raise ValueError(
                f"provided IP is not in the valid range. The range of valid IPs is {span.network.with_prefixlen}"
            )
        if ip in self.ips or self.alloc.ip_holder(ip) not in (None, self.key):
            raise ValueError("provided IP is already allocated")
        self.ips.add(ip)

    def next_ip(self, family: str) -> str:
        span = self.alloc.range_of(family)
        assert span is not None

        def taken(i: int) -> bool:
            ip = span.address(i)
            return ip in self.ips or self.alloc.ip_holder(ip) is not None

        try:
            ip = span.address(_pick(span.size, span.offset, taken, self.alloc.rng))
        except _Full:
            raise _internal("failed to allocate a serviceIP: range is full") from None
        self.ips.add(ip)
        return str(ip)

    def port(self, port: int) -> None:
        lo, hi = self.alloc.node_ports.start, self.alloc.node_ports.stop - 1
        if port not in self.alloc.node_ports:
            raise ValueError(f"provided port is not in the valid range. The range of valid ports is {lo}-{hi}")
        if port in self.ports or self.alloc.port_holder(port) not in (None, self.key):
            raise ValueError("provided port is already allocated")
        self.ports.add(port)

    def next_port(self, what: str = "a nodePort") -> int:
        span = self.alloc.node_ports
        size = len(span)
        offset = 0 if size <= 16 else min(max(16, size // 32), 128)

        def taken(i: int) -> bool:
            return span[i] in self.ports or self.alloc.port_holder(span[i]) is not None

        try:
            port = span[_pick(size, offset, taken, self.alloc.rng)]
        except _Full:
            raise _internal(f"failed to allocate {what}: range is full") from None
        self.ports.add(port)
        return port


@attrs.define(eq=False)
class ServiceAllocator:
    """The ClusterIP ranges (primary family first) and the NodePort range, and what each Service holds."""

    ranges: tuple[IPRange, ...]
    node_ports: range = NODE_PORTS
    rng: random.Random = attrs.field(factory=random.Random)
    _ip_holders: dict[IPAddress, str] = attrs.field(init=False, factory=dict)
    _port_holders: dict[int, str] = attrs.field(init=False, factory=dict)
    _held: dict[str, tuple[frozenset[IPAddress], frozenset[int]]] = attrs.field(init=False, factory=dict)

    @classmethod
    def from_text(cls, text: str = DEFAULT_SERVICE_CLUSTER_IP_RANGE) -> ServiceAllocator:
        return cls(tuple(IPRange(n) for n in parse_service_ranges(text)))

    @property
    def primary_family(self) -> str:
        return self.ranges[0].family

    def range_of(self, family: str) -> IPRange | None:
        return next((r for r in self.ranges if r.family == family), None)

    def ip_holder(self, ip: IPAddress) -> str | None:
        return self._ip_holders.get(ip)

    def port_holder(self, port: int) -> str | None:
        return self._port_holders.get(port)

    # ---- the stored Services' holdings ------------------------------------------------

    def record(self, key: str, service: Mapping[str, Any] | None) -> None:
        """*key*'s Service is now *service* (None: deleted): it holds its addresses and ports, nothing else."""
        ips, ports = self._held.pop(key, (frozenset(), frozenset()))
        for ip in ips:
            self._ip_holders.pop(ip, None)
        for port in ports:
            self._port_holders.pop(port, None)
        if service is None:
            return
        ips, ports = holdings(service)
        self._held[key] = (ips, ports)
        self._ip_holders.update(dict.fromkeys(ips, key))
        self._port_holders.update(dict.fromkeys(ports, key))

    # ---- create and update ---------------------------------------------------------------

    def admit_create(self, key: str, service: dict[str, Any]) -> None:
        """A new Service (defaulted): clusterIPs in step, families set, addresses and ports
        allocated, then validated (``beginCreate``, then ``ValidateServiceCreate``)."""
        spec = _spec(service)
        svc.normalize_cluster_ips(spec, None)
        self._init_ip_families(spec, None)
        claim = _Claim(self, key)
        self._alloc_cluster_ips(spec, claim)
        self._alloc_node_ports(spec, claim)
        service["status"] = {"loadBalancer": {}}
        svc.validate_service(service)

    def admit_update(self, key: str, service: dict[str, Any], old: Mapping[str, Any]) -> None:
        """An update of the main resource (status kept): ``PrepareForUpdate``, ``ValidateServiceUpdate``,
        then ``beginUpdate``'s families and allocations."""
        spec, before = _spec(service), old["spec"]
        service["status"] = svc.status_copy(old)
        svc.patch_allocated_values(spec, before)
        svc.normalize_cluster_ips(spec, before)
        svc.drop_type_dependent_fields(service, before)
        svc.validate_service_update(service, old)
        self._init_ip_families(spec, before)
        claim = _Claim(self, key)
        self._update_cluster_ips(spec, before, claim)
        self._update_node_ports(spec, before, claim)

    # ---- ipFamilies --------------------------------------------------------------------

    def _init_ip_families(self, spec: svc.Spec, old: svc.Spec | None) -> None:
        """``initIPFamilyFields``."""
        if spec.get("type") == svc.EXTERNAL_NAME:
            return
        if _matching_prefer_dual_stack(spec, old):
            return
        if spec.get("ipFamilyPolicy") is None:
            if old is not None and old.get("ipFamilyPolicy") is not None:
                spec["ipFamilyPolicy"] = old["ipFamilyPolicy"]
            elif svc.is_headless(spec) and not spec.get("selector"):
                spec["ipFamilyPolicy"] = svc.REQUIRE_DUAL_STACK
            else:
                spec["ipFamilyPolicy"] = svc.SINGLE_STACK
        svc.validate_cluster_ips_related_fields(spec)
        policy = spec["ipFamilyPolicy"]
        ips: list[str] = spec.get("clusterIPs") or []
        families: list[str] = spec.setdefault("ipFamilies", [])
        if old is not None:
            old_ips, old_families = old.get("clusterIPs") or [], old.get("ipFamilies") or []
            if policy == svc.SINGLE_STACK:
                if ips == old_ips and len(ips) > 1:
                    spec["clusterIPs"] = ips = ips[:1]
                if families == old_families and len(families) > 1:
                    spec["ipFamilies"] = families = families[:1]
            else:
                if len(ips) < len(old_ips):
                    raise Invalid(
                        "spec.ipFamilyPolicy", policy, "must be 'SingleStack' to release the secondary cluster IP"
                    )
                if len(families) < len(old_families):
                    raise Invalid(
                        "spec.ipFamilyPolicy", policy, "must be 'SingleStack' to release the secondary IP family"
                    )
        if policy == svc.SINGLE_STACK:
            if len(ips) == 2:
                raise Invalid(
                    "spec.ipFamilyPolicy",
                    policy,
                    "must be 'RequireDualStack' or 'PreferDualStack' when multiple cluster IPs are specified",
                )
            if len(families) == 2:
                raise Invalid(
                    "spec.ipFamilyPolicy",
                    policy,
                    "must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified",
                )
        for i, ip in enumerate(ips):
            if ip == svc.NONE:
                break
            family = svc.family_of(ip)
            if i >= len(families):
                if self.range_of(family) is None:
                    raise Invalid(f"spec.clusterIPs[{i}]", ips, f"{family} is not configured on this cluster")
                families.append(family)
        if svc.is_headless(spec) and not spec.get("selector"):
            if not families:
                families.append(self.primary_family)
            if len(families) < 2 and policy != svc.SINGLE_STACK:
                families.append(svc.IPV6 if families[0] == svc.IPV4 else svc.IPV4)
            return
        if policy == svc.REQUIRE_DUAL_STACK and len(self.ranges) < 2:
            raise Invalid("spec.ipFamilyPolicy", policy, "this cluster is not configured for dual-stack services")
        for i, family in enumerate(families):
            if self.range_of(family) is None:
                raise Invalid(f"spec.ipFamilies[{i}]", family, "not configured on this cluster")
        if not families:
            families.append(self.primary_family)
        if policy != svc.SINGLE_STACK and len(families) == 1 and len(self.ranges) == 2:
            families.append(svc.IPV6 if families[0] == svc.IPV4 else svc.IPV4)

    # ---- ClusterIPs --------------------------------------------------------------------

    def _alloc_cluster_ips(self, spec: svc.Spec, claim: _Claim) -> None:
        """``allocClusterIPs``: one address a family (the requested one, else the next free)."""
        if spec.get("type") == svc.EXTERNAL_NAME or svc.is_headless(spec):
            return
        ips: list[str] = spec.setdefault("clusterIPs", [])
        families = spec.get("ipFamilies") or []
        while len(ips) < len(families):
            ips.append("")
        for i, family in enumerate(families):
            self._alloc_ip(spec, claim, i, family)

    def _alloc_ip(self, spec: svc.Spec, claim: _Claim, i: int, family: str) -> None:
        ips = spec["clusterIPs"]
        if ips[i]:
            try:
                claim.ip(family, ips[i])
            except ValueError as exc:
                shown = [ip for ip in ips if ip]
                raise Invalid("spec.clusterIPs", shown, f"failed to allocate IP {ips[i]}: {exc}") from None
        else:
            ips[i] = claim.next_ip(family)
        if i == 0:
            spec["clusterIP"] = ips[0]

    def _update_cluster_ips(self, spec: svc.Spec, old: svc.Spec, claim: _Claim) -> None:
        """``updateClusterIPs``: from ExternalName all new; a secondary added (its release is the commit's)."""
        if _matching_prefer_dual_stack(spec, old):
            return
        if old.get("type") == svc.EXTERNAL_NAME and spec.get("type") != svc.EXTERNAL_NAME:
            self._alloc_cluster_ips(spec, claim)
            return
        if svc.is_headless(old) or spec.get("type") == svc.EXTERNAL_NAME:
            return
        families = spec.get("ipFamilies") or []
        if len(old.get("ipFamilies") or []) == 1 and len(families) == 2:
            ips = spec.setdefault("clusterIPs", [])
            if len(ips) < 2:
                ips.append("")
            self._alloc_ip(spec, claim, 1, families[1])

    # ---- NodePorts -----------------------------------------------------------------------

    def _alloc_node_ports(self, spec: svc.Spec, claim: _Claim) -> None:
        """``initNodePorts`` (a port number asked for twice, TCP and UDP, shares one NodePort) and
        ``allocHealthCheckNodePort``."""
        if svc.needs_node_port(spec):
            by_port: dict[Any, int] = {}
            listed = svc.ports(spec)
            for i, port in enumerate(listed):
                if not port.get("nodePort") and not svc.should_allocate_node_ports(spec):
                    continue
                number = port.get("port")
                given = by_port.get(number, 0)
                if not given:
                    asked = next(
                        (p.get("nodePort") for p in listed[i:] if p.get("port") == number and p.get("nodePort")), 0
                    )
                    if asked:
                        self._claim_port(claim, asked, f"spec.ports[{i}].nodePort")
                        port["nodePort"] = by_port[number] = asked
                    else:
                        port["nodePort"] = by_port[number] = claim.next_port()
                elif port.get("nodePort") != given:
                    if not port.get("nodePort"):
                        port["nodePort"] = given
                    else:
                        self._claim_port(claim, port["nodePort"], f"spec.ports[{i}].nodePort")
        if svc.needs_health_check(spec):
            self._alloc_health_check(spec, claim)

    def _alloc_health_check(self, spec: svc.Spec, claim: _Claim) -> None:
        asked = spec.get("healthCheckNodePort")
        if asked:
            try:
                claim.port(asked)
            except ValueError as exc:
                raise _internal(f"failed to allocate requested HealthCheck NodePort {asked}: {exc}") from None
        else:
            spec["healthCheckNodePort"] = claim.next_port("a HealthCheck NodePort")

    @staticmethod
    def _claim_port(claim: _Claim, port: Any, where: str) -> None:
        try:
            claim.port(port)
        except ValueError as exc:
            raise Invalid(where, port, str(exc)) from None

    def _update_node_ports(self, spec: svc.Spec, old: svc.Spec, claim: _Claim) -> None:
        """``updateNodePorts`` and ``updateHealthCheckNodePort`` (releases are the commit's)."""
        if svc.needs_node_port(spec):
            before = set(svc.node_ports(old))
            for i, port in enumerate(svc.ports(spec)):
                number = port.get("nodePort")
                if not number and not svc.should_allocate_node_ports(spec):
                    continue
                if number:
                    if number not in before and number not in claim.ports:
                        self._claim_port(claim, number, f"spec.ports[{i}].nodePort")
                else:
                    port["nodePort"] = claim.next_port()
        needed, needs = svc.needs_health_check(old), svc.needs_health_check(spec)
        if needs and not needed:
            self._alloc_health_check(spec, claim)
        elif needs and needed and spec.get("healthCheckNodePort") != old.get("healthCheckNodePort"):
            raise Invalid(
                "spec.healthCheckNodePort",
                spec.get("healthCheckNodePort"),
                "cannot change healthCheckNodePort on loadBalancer service with externalTraffic=Local during update",
            )


def holdings(service: Mapping[str, Any]) -> tuple[frozenset[IPAddress], frozenset[int]]:
    """The addresses and ports a stored Service holds."""
    spec = service.get("spec") or {}
    ips: set[IPAddress] = set()
    if spec.get("type") != svc.EXTERNAL_NAME:
        for text in spec.get("clusterIPs") or []:
            if (ip := parse_ip(text)) is not None:
                ips.add(ip)
    ports = set(svc.node_ports(spec))
    if spec.get("healthCheckNodePort"):
        ports.add(spec["healthCheckNodePort"])
    return frozenset(ips), frozenset(ports)


def _spec(service: dict[str, Any]) -> svc.Spec:
    spec = service.get("spec")
    if not isinstance(spec, dict):
        raise Invalid("spec", spec, "Required value")
    return spec


def _matching_prefer_dual_stack(spec: svc.Spec, old: svc.Spec | None) -> bool:
    """``isMatchingPreferDualStackClusterIPFields``: a PreferDualStack Service left as it was is not
    upgraded or downgraded when the cluster's families change."""
    if old is None or spec.get("type") != old.get("type") or spec.get("type") == svc.EXTERNAL_NAME:
        return False
    if spec.get("ipFamilyPolicy") != svc.PREFER_DUAL_STACK or old.get("ipFamilyPolicy") != svc.PREFER_DUAL_STACK:
        return False
    return (spec.get("clusterIPs") or []) == (old.get("clusterIPs") or []) and (spec.get("ipFamilies") or []) == (
        old.get("ipFamilies") or []
    )
