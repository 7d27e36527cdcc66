"""Render BIRD 2's configuration for one node: a pure function of typed values.

Nothing reaches the template as caller-supplied text. Every value is checked
for its type (``ipaddress`` objects, ``int``, names against a strict regex)
and turned into text here, so a pod annotation or a NodeConfig field cannot
inject BIRD syntax: anything else raises :class:`RenderError`, naming the
field and the value.

Ordering is canonical (peers by name, addresses by family then value, no
duplicates), so the same inputs in any order give byte-identical text, and
comparing with the file on disk tells whether BIRD needs reconfiguring.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from flock.model import Bfd, BgpPeer, Communities, IPAddress, NodeConfig, ServiceRoutes

if TYPE_CHECKING:
    import jinja2

# Kubernetes object names (DNS-1123 subdomain); only ever placed in a comment.
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")
# Peer names become quoted BIRD symbols ('bgp_<name>'); BIRD symbols hold at most 64 bytes.
_PEER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,59}\Z")

# The text of an address or network as it may appear in the config. Python's
# ipaddress accepts IPv6 scope IDs of any text ("2001:db8::1%x; } ..."), so the
# type alone does not make a value safe: its text is checked too.
_ADDRESS_TEXT = re.compile(r"[0-9a-f.:]+\Z")
_NETWORK_TEXT = re.compile(r"[0-9a-f.:]+/[0-9]{1,3}\Z")

# Route preferences: BGP's default is 100. Routes flock put in the kernel (a
# local pod, a local anycast member) must beat the same prefix heard from a
# peer, or BIRD would export the peer's route into the kernel over our own.
KERNEL_PREFERENCE = 250

#: The include file holding BGP passwords (mode 0600), next to ``bird.conf``:
#: BIRD resolves a relative include against the including file's directory.
SECRETS_FILE = "bird-secrets.conf"
# TCP MD5 keys are at most 80 bytes (TCP_MD5SIG_MAXKEYLEN). BIRD strings have
# no escapes: a '"' or '\\' (or a control character) could not be written safely.
_PASSWORD = re.compile(r"[\x20-\x21\x23-\x5b\x5d-\x7e]{1,80}\Z")


class RenderError(ValueError):
    """An input that cannot be placed in a BIRD config; names field and value."""

    def __init__(self, field: str, value: Any, expected: str) -> None:
        self.field, self.value, self.expected = field, value, expected
        super().__init__(f"{field}={value!r}: expected {expected}")


def _int_in(lo: int, hi: int) -> Callable[[Any, attrs.Attribute, Any], None]:
    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise RenderError(attribute.name, value, f"an integer {lo}..{hi}")

    return check


@attrs.frozen
class BgpTimers:
    """Short BGP timers for labs and tests (BIRD's defaults take ~5 s to connect).

    Seconds; the names follow BIRD's options (``connect delay time`` …).
    """

    connect_delay: int = attrs.field(default=1, validator=_int_in(1, 65535))
    connect_retry: int = attrs.field(default=1, validator=_int_in(1, 65535))
    error_wait_min: int = attrs.field(default=1, validator=_int_in(1, 65535))
    error_wait_max: int = attrs.field(default=5, validator=_int_in(1, 65535))
    hold: int = attrs.field(default=3, validator=_int_in(3, 65535))
    keepalive: int = attrs.field(default=1, validator=_int_in(1, 65535))

    def __attrs_post_init__(self) -> None:
        if self.error_wait_max < self.error_wait_min:
            raise RenderError("error_wait_max", self.error_wait_max, f"at least error_wait_min ({self.error_wait_min})")
        if self.keepalive >= self.hold:
            raise RenderError("keepalive", self.keepalive, f"less than hold ({self.hold})")


def _route_protocol(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    # 0-4 are the kernel's own (unspec, redirect, kernel, boot, static), which
    # BIRD cannot learn selectively; 12 is BIRD's own, which it never learns.
    if isinstance(value, bool) or not isinstance(value, int) or not 5 <= value <= 255 or value == 12:
        raise RenderError(attribute.name, value, "a route protocol number 5..255 other than 12 (bird)")


@attrs.frozen
class RenderSettings:
    """Node-independent settings: flock's kernel route protocol number, lab timers."""

    route_protocol: int = attrs.field(validator=_route_protocol)
    bgp_timers: BgpTimers | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(BgpTimers))
    )


@attrs.frozen
class _PeerView:
    name: str
    protocol: str
    address: str
    asn: str
    ipv6_channel: bool
    extended_next_hop: bool
    ibgp: bool
    multihop: str | None
    source_address: str | None
    bfd: Bfd | None
    rr_client: bool
    password: str | None  # the BIRD constant holding it (the value is in SECRETS_FILE)
    password_missing: bool  # configured, but its Secret is not available: the session stays disabled


@attrs.frozen
class _Announce:
    """One kind of route this node originates, with the communities (and local preference) it carries."""

    title: str
    nets: tuple[str, ...]
    standard: tuple[str, ...]  # "(64512, 100)"
    large: tuple[str, ...]  # "(64512, 1, 100)"
    local_pref: int | None = None


@attrs.frozen
class _FamilyView:
    version: int
    blocks: tuple[str, ...]
    announce: tuple[_Announce, ...]
    services: tuple[str, ...] = ()  # the Service routes BIRD holds (static, never given to the kernel)


def _check_node_name(name: Any) -> str:
    if not isinstance(name, str) or not _NODE_NAME.match(name):
        raise RenderError("node.name", name, "a Kubernetes node name (lowercase letters, digits, '-', '.')")
    return name


def _check_asn(field: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4294967295:
        raise RenderError(field, value, "an AS number 1..4294967295")
    return str(value)


def _check_network(field: str, value: Any, kind: type) -> str:
    if not isinstance(value, kind) or not _NETWORK_TEXT.match(str(value)):
        raise RenderError(field, value, f"an {kind.__name__} without a %scope")
    return str(value)


def _check_address(field: str, value: Any) -> IPAddress:
    if not isinstance(value, (ipaddress.IPv4Address, ipaddress.IPv6Address)) or not _ADDRESS_TEXT.match(str(value)):
        raise RenderError(field, value, "an IPv4Address or IPv6Address without a %scope")
    return value


def _check_addresses(field: str, values: Iterable[Any]) -> tuple[IPAddress, ...]:
    if isinstance(values, (str, bytes)):
        raise RenderError(field, values, "a collection of IPv4Address/IPv6Address values")
    out = {_check_address(field, value) for value in values}
    return tuple(sorted(out, key=lambda a: (a.version, int(a))))


def _password_symbol(index: int) -> str:
    return f"flock_password_{index}"


def _peer_view(i: int, peer: Any, local_asn: int, passwords: frozenset[str]) -> _PeerView:
    field = f"node.bgp.peers[{i}]"
    if not isinstance(peer, BgpPeer):
        raise RenderError(field, peer, "a BgpPeer")
    if not isinstance(peer.name, str) or not _PEER_NAME.match(peer.name):
        raise RenderError(
            field + ".name", peer.name, "letters, digits, '-' and '_', starting with a letter, at most 60"
        )
    address = _check_address(field + ".address", peer.address)
    if address.is_link_local or address.is_multicast or address.is_unspecified or address.is_loopback:
        raise RenderError(field + ".address", address, "a unicast, non-link-local peer address")
    asn = _check_asn(field + ".asn", peer.asn)
    source = None
    if peer.source_address is not None:
        source = _check_address(field + ".source_address", peer.source_address)
        if source.version != address.version:
            raise RenderError(field + ".source_address", source, f"an IPv{address.version} address")
    multihop = None
    if peer.multihop is not None:
        _int_in(1, 255)(None, attrs.fields(BgpPeer).multihop, peer.multihop)
        multihop = str(peer.multihop)
    if peer.bfd is not None:
        if not isinstance(peer.bfd, Bfd):
            raise RenderError(field + ".bfd", peer.bfd, "a Bfd")
        for name, lo, hi in (("min_rx_ms", 10, 10000), ("min_tx_ms", 10, 10000), ("multiplier", 1, 255)):
            value = getattr(peer.bfd, name)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise RenderError(f"{field}.bfd.{name}", value, f"an integer {lo}..{hi}")
        if multihop is not None and source is None:
            raise RenderError(field + ".source_address", None, "an address: multihop BFD needs one")
    ibgp = peer.asn == local_asn
    if peer.route_reflector_client and not ibgp:
        raise RenderError(field + ".route_reflector_client", True, "an iBGP peer")
    is_v6 = address.version == 6
    return _PeerView(
        name=peer.name,
        protocol=f"bgp_{peer.name}",
        address=str(address),
        asn=asn,
        ipv6_channel=is_v6,
        extended_next_hop=is_v6,
        ibgp=ibgp,
        multihop=multihop,
        source_address=None if source is None else str(source),
        bfd=peer.bfd,
        rr_client=bool(peer.route_reflector_client),
        password=None,  # numbered once the peers are in canonical order
        password_missing=peer.password is not None and peer.name not in passwords,
    )


GRACEFUL_SHUTDOWN = "(65535, 0)"  # RFC 8326's well-known community
_POOL_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")


def _check_services(services: Iterable[ServiceRoutes]) -> tuple[ServiceRoutes, ...]:
    """Service route groups, checked (a pool name only reaches a comment; nets must be networks), by pool."""
    if isinstance(services, (str, bytes)):
        raise RenderError("services", services, "a collection of ServiceRoutes")
    groups = []
    for group in services:
        if not isinstance(group, ServiceRoutes):
            raise RenderError("services", group, "a ServiceRoutes")
        if not isinstance(group.pool, str) or not _POOL_NAME.match(group.pool):
            raise RenderError("services.pool", group.pool, "a pool name (a DNS subdomain)")
        for net in group.nets:
            if not isinstance(net, ipaddress.IPv4Network | ipaddress.IPv6Network):
                raise RenderError(f"services[{group.pool}].nets", net, "an IP network")
        if group.local_preference is not None and not _is_uint(group.local_preference, 4294967295):
            raise RenderError(f"services[{group.pool}].local_preference", group.local_preference, "0..4294967295")
        groups.append(group)
    return tuple(sorted(groups, key=lambda g: g.pool))


def _community_texts(field: str, communities: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if not isinstance(communities, Communities):
        raise RenderError(field, communities, "a Communities")
    standard: list[str] = []
    large: list[str] = []
    for value in communities.standard:
        if not (isinstance(value, tuple) and len(value) == 2 and all(_is_uint(v, 65535) for v in value)):
            raise RenderError(field + ".standard", value, "(0..65535, 0..65535)")
        standard.append(f"({value[0]}, {value[1]})")
    for triple in communities.large:
        if not (isinstance(triple, tuple) and len(triple) == 3 and all(_is_uint(v, 4294967295) for v in triple)):
            raise RenderError(field + ".large", triple, "three integers 0..4294967295")
        large.append(f"({triple[0]}, {triple[1]}, {triple[2]})")
    return tuple(dict.fromkeys(standard)), tuple(dict.fromkeys(large))


def _is_uint(value: Any, hi: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and 0 <= value <= hi


def password_usable(value: str) -> bool:
    """Whether *value* can be a BIRD TCP MD5 password (1..80 printable ASCII, no quote or backslash)."""
    return isinstance(value, str) and _PASSWORD.match(value) is not None


def render_secrets(node: NodeConfig, passwords: Mapping[str, str]) -> str:
    """The text of :data:`SECRETS_FILE`: one BIRD constant per peer password.

    ``passwords`` maps peer names to the passwords read from their Secrets.
    Raises :class:`RenderError` naming the peer, never showing the value.
    """
    if not isinstance(node, NodeConfig):
        raise RenderError("node", node, "a NodeConfig")
    lines = [
        "# BGP passwords (TCP MD5) for BIRD, written by flock-agent with mode 0600: never log or copy this file.\n"
    ]
    peers = sorted((p for p in (node.bgp.peers if node.bgp else ()) if p.password is not None), key=lambda p: p.name)
    for i, peer in enumerate(peers):
        value = passwords.get(peer.name)
        if value is None:
            continue
        if not isinstance(value, str) or not _PASSWORD.match(value):
            raise RenderError(
                f"password of peer {peer.name}",
                "<hidden>",
                "1..80 printable ASCII characters without '\"' or '\\\\'",
            )
        lines.append(f'define {_password_symbol(i)} = "{value}";\n')
    return "".join(lines)


@functools.cache  # templates are package data: load and compile them once
def _environment() -> jinja2.Environment:
    # Imported on the first render, not with the agent: a restarted agent
    # renders only once it serves, and jinja2 is a tenth of its imports.
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("flock.bird", "templates"),
        autoescape=False,  # BIRD syntax, not HTML: values are made safe by type checks instead
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render(
    node: NodeConfig,
    *,
    anycast: Iterable[IPAddress] = (),
    addresses: Iterable[IPAddress] = (),
    passwords: Iterable[str] = (),
    services: Iterable[ServiceRoutes] = (),
    leaving: bool = False,
    settings: RenderSettings,
) -> str:
    """The complete ``bird.conf`` for ``node``.

    ``services`` are the Service routes to announce (:class:`ServiceRoutes`); ``leaving``: this node
    is going (drained, its agent stopping), so they carry the GRACEFUL_SHUTDOWN community (RFC 8326)
    and local preference 0, and the fabric moves their traffic to other nodes before they are
    withdrawn.

    ``anycast`` and ``addresses`` are the anycast and extra pod addresses to
    announce from this node (any order, duplicates allowed); they are announced
    as /128 or /32 while BIRD learns a matching route from the kernel (put
    there by flock with ``settings.route_protocol``). ``passwords`` names the
    peers whose password is available: they read it from :data:`SECRETS_FILE`
    (see :func:`render_secrets`); a peer whose password is configured but not
    available is rendered disabled, never without its password. Raises
    :class:`RenderError` for any value that is not of the expected type and shape.
    """
    if not isinstance(node, NodeConfig):
        raise RenderError("node", node, "a NodeConfig")
    if not isinstance(settings, RenderSettings):
        raise RenderError("settings", settings, "a RenderSettings")
    if isinstance(passwords, (str, bytes)):
        raise RenderError("passwords", passwords, "a collection of peer names")
    available = frozenset(passwords)
    node_name = _check_node_name(node.name)
    block6 = _check_network("node.cidr6", node.cidr6, ipaddress.IPv6Network)
    block4 = None if node.cidr4 is None else _check_network("node.cidr4", node.cidr4, ipaddress.IPv4Network)
    any_addrs = _check_addresses("anycast", anycast)
    extra_addrs = _check_addresses("addresses", addresses)
    service_groups = _check_services(services)

    router_id, local_asn, peers, bgp = None, None, [], node.bgp
    if bgp is not None:
        if not isinstance(bgp.router_id, ipaddress.IPv4Address):
            raise RenderError("node.bgp.router_id", bgp.router_id, "an IPv4Address")
        router_id = str(_check_address("node.bgp.router_id", bgp.router_id))
        local_asn = _check_asn("node.bgp.asn", bgp.asn)
        peers = [_peer_view(i, p, bgp.asn, available) for i, p in enumerate(bgp.peers)]
        protocols = [p.protocol for p in peers]
        if len(set(protocols)) != len(protocols):
            raise RenderError("node.bgp.peers", [p.name for p in bgp.peers], "unique peer names")
        peers.sort(key=lambda p: p.protocol)
        # Password constants are numbered in canonical order, as render_secrets numbers them.
        with_password = sorted(p.name for p in bgp.peers if p.password is not None)
        peers = [
            attrs.evolve(p, password=_password_symbol(with_password.index(p.name)))
            if p.name in with_password and not p.password_missing
            else p
            for p in peers
        ]
        gr = bgp.graceful_restart
        _int_in(1, 4095)(None, attrs.fields(type(gr)).restart_time, gr.restart_time)
        cluster_id = None if bgp.cluster_id is None else str(_check_address("node.bgp.cluster_id", bgp.cluster_id))
        communities = {
            kind: _community_texts(f"node.bgp.communities.{kind}", getattr(bgp.communities, kind))
            for kind in ("node_block", "anycast", "addresses")
        }
    else:
        gr, cluster_id = None, None
        communities = {kind: ((), ()) for kind in ("node_block", "anycast", "addresses")}

    def family(version: int, blocks: tuple[str, ...]) -> _FamilyView:
        host = 128 if version == 6 else 32
        kinds = (
            ("node block", "node_block", blocks),
            ("anycast", "anycast", tuple(f"{a}/{host}" for a in any_addrs if a.version == version)),
            ("extra pod addresses", "addresses", tuple(f"{a}/{host}" for a in extra_addrs if a.version == version)),
        )
        announce = [_Announce(title, nets, *communities[kind]) for title, kind, nets in kinds if nets]
        service_nets: list[str] = []
        for group in service_groups:
            nets = tuple(str(n) for n in group.nets if n.version == version)
            if nets:
                standard, large = _community_texts(f"services[{group.pool}].communities", group.communities)
                local_pref = group.local_preference
                if leaving:
                    standard, local_pref = (*standard, GRACEFUL_SHUTDOWN), 0
                title = f"Service addresses, pool {group.pool}" + (" (leaving: graceful shutdown)" if leaving else "")
                announce.append(_Announce(title, nets, standard, large, local_pref))
                service_nets.extend(nets)
        return _FamilyView(
            version=version,
            blocks=blocks,
            announce=tuple(announce),
            services=tuple(dict.fromkeys(service_nets)),
        )

    return (
        _environment()
        .get_template("bird.conf.j2")
        .render(
            node_name=node_name,
            router_id=router_id,
            local_asn=local_asn,
            route_protocol=str(settings.route_protocol),
            kernel_preference=str(KERNEL_PREFERENCE),
            families=[family(6, (block6,)), family(4, () if block4 is None else (block4,))],
            peers=peers,
            timers=settings.bgp_timers,
            graceful_restart=gr,
            cluster_id=cluster_id,
            secrets_file=SECRETS_FILE if any(p.password for p in peers) else None,
            bfd=any(p.bfd is not None for p in peers),
            reflector=any(p.rr_client for p in peers),
            multihop=any(p.multihop is not None for p in peers),
        )
    )
