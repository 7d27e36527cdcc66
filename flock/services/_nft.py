"""nft text for the services table: statement builders, the whole table, and the update from one table to the next.

Statements are built from :mod:`ipaddress` values, ints, :class:`Protocol`
members and names from :mod:`._names`; the builders check their arguments'
types, so a string from the API cannot become nft syntax by mistake.

- :func:`render_full` replaces the table in one transaction (``add table``
  so the ``delete`` cannot fail, ``delete table``, then the table).  Chains
  are declared before any rule refers to them, and map elements come last.
- :func:`render_update` turns one :class:`ServicesTable` into the next in one
  transaction touching only what differs: new sets and chains are declared
  first, changed chains are flushed and refilled, map and set elements are
  deleted and added, and only then are chains and sets nothing refers to any
  more flushed and deleted.  An endpoint turning unready in a Service with
  several endpoints is element writes only: the Service's ``spread`` element
  names the shared chain for one endpoint fewer, and its ``endpoints``
  elements are renumbered (a handful of lines whatever the size of the
  table).  ``None`` when the skeleton changed (then the caller renders the
  whole table).

Why element writes: nftables 1.0.6 (Debian 12's) reads the table's chains,
and for a new rule its rules, before every transaction, so a transaction's
cost grows with the number of chains and rules in the table, whatever it
changes (measured: 7 ms per transaction beside 10,000 chains, 42 ms per new
rule beside 110,000 rules, 0.3 ms for an element write beside none).  The
table therefore keeps its chains to the skeleton, one shared chain per
endpoint count in use, and the few per-service chains ClientIP affinity and
``externalTrafficPolicy: Local`` external addresses need.

Kernel note: a chain is deleted in the same transaction as the rule or map
element that referred to it, which kernels since 6.2 accept; kube-proxy
defers such deletes by a second on older kernels.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Iterable, Iterator

from flock.policy import Protocol

from ._model import Family, IPAddress
from ._table import AffinitySet, ServicesTable, Skeleton

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# The skeleton's own names (generated names all start with a kind, a family digit and '-').
SERVICE_IPS = "service-ips"  # counted: address . proto . port → the way to an endpoint
SERVICE_NODEPORTS = "service-nodeports"  # counted: proto . port (on the node's addresses) → the way
NO_ENDPOINT_SERVICES = "no-endpoint-services"  # counted: address . proto . port → refused or dropped
NO_ENDPOINT_NODEPORTS = "no-endpoint-nodeports"
SPREAD = "spread"  # address . proto . port → goto rand<f>-<N>: how many endpoints to choose from
ENDPOINTS = "endpoints"  # per protocol: address . proto . port . i → endpoint address . port
ONE_ENDPOINT = "one-endpoint"  # address . proto . port → the endpoint address . port, when there is one
NODEPORT_SPREAD = "nodeport-spread"  # the same three, keyed by each node address and the NodePort
NODEPORT_ENDPOINTS = "nodeport-endpoints"
NODEPORT_ONE_ENDPOINT = "nodeport-one-endpoint"
CLUSTER_IPS = "cluster-ips"
EXTERNAL_IPS = "external-ips"  # the external addresses translated here (announced over BGP, perhaps)
NODE_IPS = "node-ips"
POD_CIDRS = "pod-cidrs"
HAIRPIN = "hairpin"  # endpoint . endpoint: an endpoint reaching itself through a Service is masqueraded
MARK_CHAIN = "mark-for-masquerade"
REJECT_CHAIN = "reject-services"
SERVICES_CHAIN = "services"
CHECK_CHAIN = "endpoints-check"
MASQUERADING_CHAIN = "masquerading"
PICK_CHAIN = "pick"  # per family: spread's lookup
EXT_PICK_CHAIN = "xpick"  # per family: marked for masquerade, then pick (externalTrafficPolicy: Cluster)
NODEPORT_PICK_CHAIN = "nppick"  # per family: marked, then nodeport-spread's lookup
RAND = "rand"  # shared chains rand<f>-<N>: one of N endpoints at random, from ENDPOINTS
NODEPORT_RAND = "nprand"

CHUNK = 500  # elements per ``add element`` line: bounded lines for nft's parser


@functools.cache
def per_family(base: str, family: Family) -> str:
    return f"{base}{family.version}"


def skeleton_names() -> dict[str, str]:
    """Each per-family map and set of the skeleton → its declaration (what goes between the braces)."""
    names = {}
    for f in Family:
        addr, kw = f"ipv{f.version}_addr", ip_kw(f)
        service = f"{addr} . inet_proto . inet_service"
        names[per_family(SERVICE_IPS, f)] = f"type {service} : verdict; counter;"
        names[per_family(NO_ENDPOINT_SERVICES, f)] = f"type {service} : verdict; counter;"
        names[per_family(SERVICE_NODEPORTS, f)] = "type inet_proto . inet_service : verdict; counter;"
        names[per_family(NO_ENDPOINT_NODEPORTS, f)] = "type inet_proto . inet_service : verdict; counter;"
        names[per_family(SPREAD, f)] = f"type {service} : verdict;"
        names[per_family(NODEPORT_SPREAD, f)] = f"type {service} : verdict;"
        for protocol in Protocol:
            # numgen's integer has no ``type`` name, so these are ``typeof`` maps, one per protocol: nft 1.0.6
            # cannot read back a typeof with ``th`` ("conflicting protocols"), and a rule using a typeof map
            # read back from the kernel matches the protocol of the map's ``tcp``/``udp``/``sctp dport``
            p = proto(protocol)
            endpoints = f"typeof {kw} daddr . meta l4proto . {p} dport . numgen random mod 2 : {kw} daddr . {p} dport;"
            names[endpoints_map(family=f, protocol=protocol)] = endpoints
            names[endpoints_map(family=f, protocol=protocol, nodeport=True)] = endpoints
        names[per_family(ONE_ENDPOINT, f)] = f"type {service} : {addr} . inet_service;"
        names[per_family(NODEPORT_ONE_ENDPOINT, f)] = f"type {service} : {addr} . inet_service;"
        names[per_family(CLUSTER_IPS, f)] = f"type {addr};"
        names[per_family(EXTERNAL_IPS, f)] = f"type {addr};"
        names[per_family(NODE_IPS, f)] = f"type {addr};"
        names[per_family(POD_CIDRS, f)] = f"type {addr}; flags interval;"
        names[per_family(HAIRPIN, f)] = f"type {addr} . {addr};"
    return names


def endpoints_map(family: Family, protocol: Protocol, *, nodeport: bool = False) -> str:
    """The map numbering the endpoints of *protocol*'s Service ports (ENDPOINTS or NODEPORT_ENDPOINTS)."""
    return f"{per_family(NODEPORT_ENDPOINTS if nodeport else ENDPOINTS, family)}-{proto(protocol)}"


def is_map(declaration: str) -> bool:
    return " : " in declaration


# --- statement builders (used by the compiler) ---------------------------------------------------------------


def ip_kw(family: Family) -> str:
    return "ip" if family is Family.IPV4 else "ip6"


def address(ip: IPAddress) -> str:
    """*ip* as nft reads it: RFC 5952 text, from the C library (``str`` of an IPv6Address costs ten times more)."""
    if isinstance(ip, ipaddress.IPv6Address):
        return socket.inet_ntop(socket.AF_INET6, ip.packed)
    if isinstance(ip, ipaddress.IPv4Address):
        return str(ip)
    raise TypeError(f"an address, not {type(ip).__name__}")


def network(net: IPNetwork) -> str:
    if not isinstance(net, ipaddress.IPv4Network | ipaddress.IPv6Network):
        raise TypeError(f"a network, not {type(net).__name__}")
    return str(net)


def _port(port: int) -> str:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"a port number, not {port!r}")
    return str(port)


_PROTO_NAMES = {Protocol.TCP: "tcp", Protocol.UDP: "udp", Protocol.SCTP: "sctp"}


def proto(protocol: Protocol) -> str:
    return _PROTO_NAMES[protocol]


def service_key(ip: IPAddress, protocol: Protocol, port: int) -> str:
    return f"{address(ip)} . {proto(protocol)} . {_port(port)}"


def nodeport_key(protocol: Protocol, port: int) -> str:
    return f"{proto(protocol)} . {_port(port)}"


def endpoint_key(key: str, index: int) -> str:
    """An ENDPOINTS key: a service key (:func:`service_key`) and the endpoint's index among those chosen."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"an index, not {index!r}")
    return f"{key} . {index}"


def endpoint_value(ip: IPAddress, port: int) -> str:
    return f"{address(ip)} . {_port(port)}"


def hairpin_member(ip: IPAddress) -> str:
    return f"{address(ip)} . {address(ip)}"


@functools.lru_cache(maxsize=1024)
def rand_chain(family: Family, n: int, *, nodeport: bool = False) -> str:
    """The shared chain choosing one of *n* endpoints (the Service's from the ENDPOINTS map)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"a number of endpoints, not {n!r}")
    return f"{NODEPORT_RAND if nodeport else RAND}{family.version}-{n}"


@functools.lru_cache(maxsize=1024)  # shared by every Service with n endpoints: one copy of the text
def rand_rules(family: Family, n: int, *, nodeport: bool = False) -> tuple[str, ...]:
    """One endpoint: a plain lookup in ONE_ENDPOINT; more: ``numgen random mod n`` picks the index in the
    protocol's ENDPOINTS map (nft 1.0.6 would make ``numgen … mod 1`` in a concatenation a match of TCP)."""
    kw = ip_kw(family)
    if n == 1:
        one = per_family(NODEPORT_ONE_ENDPOINT if nodeport else ONE_ENDPOINT, family)
        return (f"dnat {kw} to {kw} daddr . meta l4proto . th dport map @{one}",)
    return tuple(
        f"meta l4proto {proto(p)} dnat {kw} to {kw} daddr . meta l4proto . {proto(p)} dport . numgen random "
        f"mod {int(n)} map @{endpoints_map(family, p, nodeport=nodeport)}"
        for p in Protocol
    )


@functools.lru_cache(maxsize=4096)  # the shared chains' and the skeleton's names: one copy of each verdict
def goto(chain: str) -> str:
    return f"goto {chain}"


def masquerade() -> str:
    return f"jump {MARK_CHAIN}"


def from_pods(family: Family) -> str:
    return f"{ip_kw(family)} saddr @{per_family(POD_CIDRS, family)}"


def from_node() -> str:
    return "fib saddr type local"


def pods_short_circuit(family: Family, chain: str) -> str:
    return f"{ip_kw(family)} saddr @{per_family(POD_CIDRS, family)} goto {chain}"


def node_masquerade() -> str:
    return f"fib saddr type local jump {MARK_CHAIN}"


def node_short_circuit(chain: str) -> str:
    return f"fib saddr type local goto {chain}"


def affinity_goto(family: Family, set_name: str, chain: str) -> str:
    return f"{ip_kw(family)} saddr @{set_name} goto {chain}"


def affinity_update(family: Family, set_name: str) -> str:
    return f"update @{set_name} {{ {ip_kw(family)} saddr }}"


def spread(chains: Iterable[str]) -> str:
    """One of *chains* at random, per new connection."""
    chains = list(chains)
    if not chains:
        raise ValueError("spread over no chains")
    if len(chains) == 1:
        return goto(chains[0])
    arms = ", ".join(f"{i} : goto {c}" for i, c in enumerate(chains))
    return f"numgen random mod {len(chains)} vmap {{ {arms} }}"


def dnat(family: Family, protocol: Protocol, ip: IPAddress, port: int) -> str:
    target = f"{address(ip)}:{_port(port)}" if family is Family.IPV4 else f"[{address(ip)}]:{_port(port)}"
    return f"meta l4proto {proto(protocol)} dnat {ip_kw(family)} to {target}"


def dnat_spread(family: Family, protocol: Protocol, endpoints: Iterable[tuple[IPAddress, int]]) -> str:
    """DNAT to one of *endpoints* at random, per new connection (one rule: an anonymous map)."""
    endpoints = list(endpoints)
    if not endpoints:
        raise ValueError("DNAT to no endpoint")
    if len(endpoints) == 1:
        return dnat(family, protocol, *endpoints[0])
    arms = ", ".join(f"{i} : {endpoint_value(ip, port)}" for i, (ip, port) in enumerate(endpoints))
    return f"meta l4proto {proto(protocol)} dnat {ip_kw(family)} to numgen random mod {len(endpoints)} map {{ {arms} }}"


# --- rendering -----------------------------------------------------------------------------------------------


def _qualified(sk: Skeleton) -> str:
    return f"inet {sk.table}"


def _skeleton_decls(sk: Skeleton) -> list[str]:
    lines = [f"\t{'map' if is_map(decl) else 'set'} {name} {{ {decl} }}" for name, decl in skeleton_names().items()]
    mark = f"0x{sk.masquerade_mark:x}"
    masquerading = [
        f"ct status dnat {ip_kw(f)} saddr . {ip_kw(f)} daddr @{per_family(HAIRPIN, f)} jump {MARK_CHAIN}"
        for f in Family
    ]
    masquerading += [f"meta mark & {mark} == 0 return", f"meta mark set meta mark ^ {mark}", "masquerade fully-random"]
    chains: list[tuple[str, list[str]]] = [
        (MARK_CHAIN, [f"meta mark set meta mark | {mark}"]),
        (MASQUERADING_CHAIN, masquerading),
        (REJECT_CHAIN, ["meta l4proto tcp reject with tcp reset", "reject"]),
    ]
    services, check = [], []
    for f in Family:
        # ClusterIP traffic from outside the pod CIDRs (the node itself, a routed client) is masqueraded
        kw = ip_kw(f)
        services.append(
            f"{kw} daddr @{per_family(CLUSTER_IPS, f)} {kw} saddr != @{per_family(POD_CIDRS, f)} jump {MARK_CHAIN}"
        )
    for f in Family:
        kw = ip_kw(f)
        services.append(f"{kw} daddr . meta l4proto . th dport vmap @{per_family(SERVICE_IPS, f)}")
        services.append(
            f"{kw} daddr @{per_family(NODE_IPS, f)} meta l4proto . th dport vmap @{per_family(SERVICE_NODEPORTS, f)}"
        )
        check.append(f"{kw} daddr . meta l4proto . th dport vmap @{per_family(NO_ENDPOINT_SERVICES, f)}")
        check.append(
            f"{kw} daddr @{per_family(NODE_IPS, f)} meta l4proto . th dport vmap "
            f"@{per_family(NO_ENDPOINT_NODEPORTS, f)}"
        )
    for f in Family:  # a ClusterIP on a port no Service has: refused, not routed on
        check.append(f"{ip_kw(f)} daddr @{per_family(CLUSTER_IPS, f)} goto {REJECT_CHAIN}")
        # the same for an external address: this node announces it, and routed on, a packet for it would
        # go back to the fabric, which sends it here again, until its hop limit runs out
        check.append(f"{ip_kw(f)} daddr @{per_family(EXTERNAL_IPS, f)} goto {REJECT_CHAIN}")
    chains += [(SERVICES_CHAIN, services), (CHECK_CHAIN, check)]
    for f in Family:
        kw = ip_kw(f)
        lookup = f"{kw} daddr . meta l4proto . th dport vmap"
        chains.append((per_family(PICK_CHAIN, f), [f"{lookup} @{per_family(SPREAD, f)}"]))
        chains.append((per_family(EXT_PICK_CHAIN, f), [masquerade(), goto(per_family(PICK_CHAIN, f))]))
        chains.append(
            (per_family(NODEPORT_PICK_CHAIN, f), [masquerade(), f"{lookup} @{per_family(NODEPORT_SPREAD, f)}"])
        )
    for name, rules in chains:
        lines.append(f"\tchain {name} {{")
        lines.extend(f"\t\t{r}" for r in rules)
        lines.append("\t}")
    base = [
        # -100 is dstnat (nft 1.0.6 knows the name in prerouting only)
        ("nat-prerouting", "nat", "prerouting", "-100", f"jump {SERVICES_CHAIN}"),
        ("nat-output", "nat", "output", "-100", f"jump {SERVICES_CHAIN}"),
        ("nat-postrouting", "nat", "postrouting", "srcnat", f"jump {MASQUERADING_CHAIN}"),
        ("filter-input", "filter", "input", _priority(sk.filter_priority), f"ct state new jump {CHECK_CHAIN}"),
        ("filter-forward", "filter", "forward", _priority(sk.filter_priority), f"ct state new jump {CHECK_CHAIN}"),
        ("filter-output", "filter", "output", _priority(sk.filter_priority), f"ct state new jump {CHECK_CHAIN}"),
    ]
    for name, typ, hook, prio, rule in base:
        lines.append(f"\tchain {name} {{")
        lines.append(f"\t\ttype {typ} hook {hook} priority {prio}; policy accept;")
        lines.append(f"\t\t{rule}")
        lines.append("\t}")
    return lines


def _priority(offset: int) -> str:
    if not offset:
        return "filter"
    return f"filter {'+' if offset > 0 else '-'} {abs(int(offset))}"


def _set_decl(name: str, s: AffinitySet, table: str = "") -> str:
    where = f"{table} {name}" if table else name
    return f"set {where} {{ type ipv{s.family.version}_addr; flags dynamic,timeout; timeout {int(s.timeout)}s; }}"


def _chunks(items: list[str]) -> Iterator[list[str]]:
    for i in range(0, len(items), CHUNK):
        yield items[i : i + CHUNK]


def _element(key: str, verdict: str | None) -> str:
    return key if verdict is None else f"{key} : {verdict}"


def _element_lines(t: str, verb: str, name: str, elements: Iterable[tuple[str, str | None]]) -> list[str]:
    items = [_element(k, v) for k, v in sorted(elements, key=lambda e: (e[0], e[1] or ""))]
    if verb == "delete":  # a map element is deleted by its key
        items = [k for k, _ in sorted(elements, key=lambda e: (e[0], e[1] or ""))]
    return [f"{verb} element {t} {name} {{ {', '.join(chunk)} }}" for chunk in _chunks(items)]


def render_full(table: ServicesTable) -> str:
    """The whole table, replacing whatever ``inet <table>`` held, in one transaction."""
    sk = table.skeleton
    t = _qualified(sk)
    lines = [f"add table {t}", f"delete table {t}", f"table {t} {{"]
    lines.extend(f"\t{_set_decl(name, s)}" for name, s in sorted(table.affinity_sets.items()))
    lines.extend(f"\tchain {name} {{ }}" for name in sorted(table.chains))  # declared before any rule names them
    lines.extend(_skeleton_decls(sk))
    lines.append("}")
    if any(table.chains.values()):  # the rules, once every chain and set they name exists
        lines.append(f"table {t} {{")
        for name, rules in sorted(table.chains.items()):
            if rules:
                lines.append(f"\tchain {name} {{")
                lines.extend(f"\t\t{r}" for r in rules)
                lines.append("\t}")
        lines.append("}")
    for name, elements in sorted(table.elements.items()):
        lines.extend(_element_lines(t, "add", name, elements))
    return "\n".join(lines) + "\n"


def render_update(old: ServicesTable, new: ServicesTable) -> str | None:
    """The one transaction that turns *old* (what the kernel holds) into *new*; "" when equal; None: replace all."""
    if old.skeleton != new.skeleton:
        return None
    t = _qualified(new.skeleton)
    lines: list[str] = []
    for name, s in sorted(new.affinity_sets.items()):
        if old.affinity_sets.get(name) != s:
            if name in old.affinity_sets:
                return None  # a set's type cannot change in place (names carry the timeout: not expected)
            lines.append(f"add {_set_decl(name, s, t)}")
    lines.extend(f"add chain {t} {name}" for name in sorted(new.chains.keys() - old.chains.keys()))
    for name, rules in sorted(new.chains.items()):
        before = old.chains.get(name)
        if before == rules:
            continue
        if before:
            lines.append(f"flush chain {t} {name}")
        lines.extend(f"add rule {t} {name} {r}" for r in rules)
    deletes: list[str] = []
    adds: list[str] = []
    for name in sorted(old.elements.keys() | new.elements.keys()):
        was, now = old.elements.get(name, frozenset()), new.elements.get(name, frozenset())
        # a key whose verdict changed is deleted and added again
        deletes.extend(_element_lines(t, "delete", name, was - now))
        adds.extend(_element_lines(t, "add", name, now - was))
    lines.extend(deletes)
    lines.extend(adds)
    gone = sorted(old.chains.keys() - new.chains.keys())
    lines.extend(f"flush chain {t} {name}" for name in gone if old.chains[name])
    lines.extend(f"delete chain {t} {name}" for name in gone)
    lines.extend(f"delete set {t} {name}" for name in sorted(old.affinity_sets.keys() - new.affinity_sets.keys()))
    return "\n".join(lines) + "\n" if lines else ""
