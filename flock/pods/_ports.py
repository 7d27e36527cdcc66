"""hostPort: ADD's ``runtimeConfig.portMappings`` → :class:`flock.model.PortMapping`, and the node's
claims on host ports, so a second pod asking for a hostIP:hostPort/protocol another pod holds gets a
clear error instead of a mapping that silently shadows (or is shadowed by) the first.

The DNAT itself is the policy service's: mappings are part of an allocation, and the ruleset it
applies carries every allocation's mappings (see :mod:`flock.policy`, "hostPort").
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from flock.errors import quote
from flock.model import PORT_PROTOCOLS, Allocation, IPAddress, PortMapping

from ._errors import HostPortInUse, InvalidNetworkConfig

# More mappings than any pod declares ports; the bound keeps one ADD's rules (and its error) small.
MAX_PORT_MAPPINGS = 256
_FIELD = "runtimeConfig.portMappings"


def _bad(field: str, value: object, expected: str) -> InvalidNetworkConfig:
    return InvalidNetworkConfig("invalid portMappings", f"{field}={quote(value, 64)}: expected {expected}")


def _port(entry: Mapping[str, Any], key: str, field: str) -> int:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise _bad(f"{field}.{key}", value, "a port number from 1 to 65535")
    return value


# Keys as CNI's convention spells them.  containerd (and nerdctl, Nomad: go-cni) sends Go's field names
# (HostPort, ContainerPort, Protocol, HostIP): Go's JSON decoding, which the reference portmap uses,
# matches keys regardless of case, so flock does too.
_KEYS = {"hostport": "hostPort", "containerport": "containerPort", "protocol": "protocol", "hostip": "hostIP"}


def port_mappings(config: Mapping[str, Any]) -> tuple[PortMapping, ...]:
    """The hostPort mappings ADD's network configuration asks for (the runtime puts them in
    ``runtimeConfig`` because the conflist declares the ``portMappings`` capability); () when none.

    Identical entries are kept once (a runtime may list a port twice).  Entries of the same
    hostIP:hostPort/protocol leading to different container ports contradict each other: code 7."""
    runtime = config.get("runtimeConfig")
    if runtime is None:
        return ()
    if not isinstance(runtime, Mapping):
        raise _bad("runtimeConfig", runtime, "an object")
    raw = runtime.get("portMappings")
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_PORT_MAPPINGS:
        raise _bad(_FIELD, raw, f"a list of at most {MAX_PORT_MAPPINGS} mappings")
    out: dict[PortMapping, None] = {}
    for i, entry in enumerate(raw):
        field = f"{_FIELD}[{i}]"
        if not isinstance(entry, Mapping):
            raise _bad(field, entry, 'an object such as {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}')
        entry = {_KEYS.get(k.lower(), k) if isinstance(k, str) else k: v for k, v in entry.items()}
        host_port = _port(entry, "hostPort", field)
        container_port = _port(entry, "containerPort", field)
        protocol = entry.get("protocol") or "tcp"
        if not isinstance(protocol, str) or protocol.lower() not in PORT_PROTOCOLS:
            raise _bad(f"{field}.protocol", protocol, "tcp, udp or sctp")
        host_ip: IPAddress | None = None
        raw_ip = entry.get("hostIP")
        if raw_ip not in (None, ""):
            try:
                if not isinstance(raw_ip, str) or "%" in raw_ip:  # a zone (fe80::1%eth0) names no address of the node
                    raise ValueError
                host_ip = ipaddress.ip_address(raw_ip)
            except ValueError:
                raise _bad(f"{field}.hostIP", raw_ip, "an IPv6 or IPv4 address, or none") from None
            if isinstance(host_ip, ipaddress.IPv6Address) and host_ip.ipv4_mapped is not None:
                host_ip = host_ip.ipv4_mapped  # ::ffff:192.0.2.1 is 192.0.2.1 (portmap reads it so too)
            if host_ip.is_loopback or host_ip.is_multicast:
                raise _bad(
                    f"{field}.hostIP",
                    raw_ip,
                    "an address of the node other than loopback (127.0.0.1 and ::1 are not mapped: "
                    "traffic from them cannot leave the node) and not multicast",
                )
        mapping = PortMapping(host_port, container_port, protocol.lower(), host_ip)
        for seen in out:
            if _overlap(seen, mapping) and seen.container_port != container_port:
                raise InvalidNetworkConfig(
                    "contradicting portMappings",
                    f"{field}={quote(dict(entry), 96)}: {seen.describe()} is also asked for",
                )
        out[mapping] = None
    return tuple(out)


def _overlap(a: PortMapping, b: PortMapping) -> bool:
    """Whether two mappings would catch the same packets (on some family)."""
    if a.host_port != b.host_port or a.protocol != b.protocol:
        return False
    if a.host_ip is None or b.host_ip is None:
        return True
    if a.host_ip.version != b.host_ip.version:
        return False
    return a.host_ip == b.host_ip or a.host_ip.is_unspecified or b.host_ip.is_unspecified


@attrs.frozen
class _Claim:
    container_id: str
    owner: str  # "pod ns/name" or "container name": for the error
    mapping: PortMapping


@attrs.define
class HostPortClaims:
    """Which container holds which host port, per (protocol, port, family).

    Claims are taken synchronously (no await between the check and the claim), so two ADDs
    racing for one port cannot both pass."""

    _by_key: dict[tuple[str, int, int], list[_Claim]] = attrs.field(factory=dict)
    _by_container: dict[str, list[tuple[str, int, int]]] = attrs.field(factory=dict)

    def __len__(self) -> int:
        return len(self._by_container)

    def claim(self, alloc: Allocation) -> None:
        """Take *alloc*'s mappings; :class:`HostPortInUse` (nothing taken) when another container holds one,
        :class:`InvalidNetworkConfig` when a mapping's hostIP is of a family the pod has no address of."""
        if not alloc.port_mappings:
            return
        families = alloc.families
        wanted: list[tuple[tuple[str, int, int], _Claim]] = []
        owner = f"pod {alloc.namespace}/{alloc.pod}" if alloc.namespace else f"container {alloc.pod or '(unnamed)'}"
        for i, m in enumerate(alloc.port_mappings):
            mine = m.families(families)
            if not mine:
                raise InvalidNetworkConfig(
                    "portMappings hostIP of another family",
                    f"{_FIELD}[{i}].hostIP={str(m.host_ip)!r}: the pod has no IPv{m.host_ip.version if m.host_ip else '?'} "
                    "address to forward it to",
                )
            for family in mine:
                key = (m.protocol, m.host_port, family)
                claim = _Claim(alloc.container_id, owner, m)
                for other in self._by_key.get(key, ()):
                    if other.container_id != alloc.container_id and _overlap(other.mapping, m):
                        raise HostPortInUse(
                            "hostPort already in use",
                            f"{_FIELD}[{i}] {m.describe()} (IPv{family}): {other.mapping.describe()} is held by "
                            f"{other.owner} (container {other.container_id[:16]})",
                        )
                wanted.append((key, claim))
        self.release(alloc.container_id)
        for key, claim in wanted:
            self._by_key.setdefault(key, []).append(claim)
            self._by_container.setdefault(alloc.container_id, []).append(key)

    def release(self, container_id: str) -> None:
        for key in self._by_container.pop(container_id, ()):
            rest = [c for c in self._by_key.get(key, ()) if c.container_id != container_id]
            if rest:
                self._by_key[key] = rest
            else:
                self._by_key.pop(key, None)

    @classmethod
    def of(cls, allocations: Iterable[Allocation]) -> tuple[HostPortClaims, list[tuple[Allocation, str]]]:
        """Claims rebuilt from stored allocations (in the order given: the first holder keeps a port),
        and the allocations whose mappings clashed with an earlier one, with why (logged by the caller)."""
        claims = cls()
        clashes = []
        for alloc in allocations:
            try:
                claims.claim(alloc)
            except (HostPortInUse, InvalidNetworkConfig) as exc:
                clashes.append((alloc, f"{exc.msg}: {exc.details}"))
        return claims, clashes
