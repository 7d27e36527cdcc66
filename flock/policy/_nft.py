"""A :class:`Ruleset` → nft(8) script text.  Pure.

Two forms, each ONE transaction when fed to ``nft -f -``:

- :func:`render_full` replaces the whole table: ``add table`` (so the delete
  cannot fail), ``delete table``, then the table with everything in it.  The
  kernel applies the batch atomically, so no packet ever sees an empty or
  half-built table.
- :func:`render_update` turns the applied ruleset into the new one in place:
  new sets and chains first, changed chains flushed and refilled, element
  deletes and adds, then removed chains and sets.  Pod churn is elements
  only; counters of untouched chains keep counting.

What reaches the text: names flock made (checked against :data:`NAME`),
addresses and networks (``ipaddress`` values, printed by ``ipaddress``),
protocols from an enum and port numbers (ints), and the log prefixes of
logged drops, which are flock-made chain names (:data:`PREFIX`).  Anything
else is a bug and raises :class:`RenderError`.

A logged drop (a rule with a :class:`flock.policy._ruleset.DenyLog`) is two
nft rules: the match with a per-pod meter and ``log group``, then the match
and the drop; the meters (``denylog-eg``, ``denylog-in``) are in the table
while some rule logs.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import cast

from ._model import Direction, IPAddress, Protocol
from ._ruleset import (
    EGRESS_MAP,
    INGRESS_MAP,
    NODE_MAP,
    AddressSet,
    HostPort,
    Match,
    PortSet,
    Rule,
    Ruleset,
    RulesetChange,
    ServiceSet,
)

TABLE = "flock"
FAMILY = "inet"
NAME = re.compile(r"[a-z][a-z0-9-]{0,62}\Z")
EGRESS_CHAIN = "egress"
INGRESS_CHAIN = "ingress"
INPUT_CHAIN = "input"
# Before a pod's Admin egress chain in the input hook: what a pod must always reach on its node (neighbour
# discovery, the fe80::1 / 169.254.1.1 gateway, multicast and broadcast) is never policy's.
_INPUT_ALWAYS = (
    "meta pkttype != host accept",
    "ip6 daddr fe80::/10 accept",
    "ip daddr 169.254.0.0/16 accept",
)
_BASE = (
    (EGRESS_CHAIN, 0, "iifname", EGRESS_MAP),
    (INGRESS_CHAIN, 1, "oifname", INGRESS_MAP),
)
_PROTO = {Protocol.TCP: "tcp", Protocol.UDP: "udp", Protocol.SCTP: "sctp"}

# Denied traffic, logged (a Rule with a DenyLog): the nflog group flock.policy._denylog reads ("fl"), and how
# often a pod may be logged, per direction: a meter keyed by its veth (the one the packet came in on for
# Egress, goes out on for Ingress), shared by every logged drop it meets.  Entries leave a minute after the
# pod's last logged packet; the meter holds at most DENY_METER_SIZE pods (beyond: not logged, still dropped).
DENY_LOG_GROUP = 26220
DENY_LOG_RATE = "10/second burst 20 packets"
DENY_METER_SIZE = 4096
_DENY_METERS = {Direction.EGRESS: ("denylog-eg", "iifname"), Direction.INGRESS: ("denylog-in", "oifname")}
# A DenyLog prefix: a chain name, and for a tier chain the rule's index ("ta-i-0123456789abcdef#3")
PREFIX = re.compile(r"[a-z][a-z0-9-]{0,62}(#[0-9]{1,5})?\Z")


class RenderError(ValueError):
    """Something that is not a flock-made name, an address or a port was about to reach nft syntax."""


def _name(name: str) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise RenderError(f"not a flock identifier: {str(name)[:40]!r}")
    return name


def _port(port: int) -> str:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise RenderError(f"not a port number: {str(port)[:16]!r}")
    return str(port)


def _addr(value: object) -> str:
    if not isinstance(
        value, ipaddress.IPv4Address | ipaddress.IPv6Address | ipaddress.IPv4Network | ipaddress.IPv6Network
    ):
        raise RenderError(f"not an address: {str(value)[:48]!r}")
    if getattr(value, "scope_id", None):  # fe80::1%eth0: not nft syntax, and the zone is free text
        raise RenderError(f"an address with a zone: {str(value)[:48]!r}")
    return str(value)


def _ip(family: int) -> str:
    return "ip6" if family == 6 else "ip"


def render_match(m: Match) -> list[str]:
    out: list[str] = []
    fam = m.family
    if m.saddr is not None:
        out.append(f"{_ip(fam or 6)} saddr @{_name(m.saddr)}")
    if m.daddr is not None:
        out.append(f"{_ip(fam or 6)} daddr @{_name(m.daddr)}")
    if fam is not None and m.saddr is None and m.daddr is None and m.service is None:
        out.append("meta nfproto " + ("ipv6" if fam == 6 else "ipv4"))
    if m.protocol is not None:
        out.append(f"meta l4proto {_PROTO[m.protocol]}")
        if m.ports:
            items = [_port(lo) if lo == hi else f"{_port(lo)}-{_port(hi)}" for lo, hi in m.ports]
            out.append("th dport " + (items[0] if len(items) == 1 else "{ " + ", ".join(items) + " }"))
    if m.portset is not None:
        out.append(f"meta l4proto . th dport @{_name(m.portset)}")
    if m.service is not None:
        out.append(f"{_ip(fam or 6)} daddr . meta l4proto . th dport @{_name(m.service)}")
    return out


def render_rules(rule: Rule) -> list[str]:
    """*rule* as nft rules: one, or for a logged drop the log rule and the drop."""
    if rule.log is None:
        return [render_rule(rule)]
    if rule.verdict != "drop" or not isinstance(rule.log.prefix, str) or not PREFIX.match(rule.log.prefix):
        raise RenderError(f"not a logged drop: {rule.verdict[:16]!r} {str(rule.log.prefix)[:72]!r}")
    meter, key = _DENY_METERS[rule.log.direction]
    parts = render_match(rule.match)
    # no counter: the drop's counts the packets (the tier chains' per-rule counters index counted rules)
    parts.append(f"update @{meter} {{ {key} limit rate {DENY_LOG_RATE} }}")
    parts.append(f'log prefix "{rule.log.prefix}" group {DENY_LOG_GROUP}')
    return [" ".join(parts), render_rule(rule)]


def _logs(rs: Ruleset) -> bool:
    """Does some rule of *rs* log (so the meters must be there)?"""
    return any(r.log is not None for c in rs.chains.values() for r in c.rules)


def _meters(declare: str) -> list[str]:
    flags = f"size {DENY_METER_SIZE}; flags dynamic,timeout; timeout 1m;"
    return [f"{declare} {meter} {{ type ifname; {flags} }}" for meter, _ in _DENY_METERS.values()]


def render_rule(rule: Rule) -> str:
    parts = render_match(rule.match)
    if rule.counter:
        parts.append("counter")
    if rule.verdict in ("accept", "drop", "return"):
        parts.append(rule.verdict)
    elif rule.verdict.startswith("jump "):
        parts.append("jump " + _name(rule.verdict[5:]))
    else:
        raise RenderError(f"not a verdict: {rule.verdict[:32]!r}")
    return " ".join(parts)


def _set_type(s: AddressSet | ServiceSet) -> str:
    addr = "ipv6_addr" if s.family == 6 else "ipv4_addr"
    if isinstance(s, ServiceSet):
        return f"type {addr} . inet_proto . inet_service"
    return f"type {addr}" + ("; flags interval" if s.interval else "")


def _element(s: AddressSet | ServiceSet, e: object) -> str:
    if isinstance(s, ServiceSet):
        addr, proto, port = cast(tuple[IPAddress, Protocol, int], e)
        return f"{_addr(addr)} . {_PROTO[proto]} . {_port(port)}"
    return _addr(e)


def _sorted_elements(s: AddressSet | ServiceSet, elements: Iterable[object]) -> list[str]:
    return sorted(_element(s, e) for e in elements)


def _map_element(veth: str, chain: str) -> str:
    return f'"{_name(veth)}" : jump {_name(chain)}'


def _chunks(items: list[str], size: int = 2000) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _all_sets(rs: Ruleset) -> dict[str, AddressSet | ServiceSet]:
    return {**rs.address_sets, **rs.service_sets}


def _port_set(t: str, ps: PortSet, declare: str) -> str:
    items = ", ".join(
        f"{_PROTO[proto]} . {_port_or_zero(lo)}" + (f"-{_port(hi)}" if hi != lo else "")
        for proto, lo, hi in sorted(ps.elements, key=lambda e: (e[0].value, e[1], e[2]))
    )
    return f"{declare} {_name(ps.name)} {{ type inet_proto . inet_service; flags interval; elements = {{ {items} }}; }}"


def _port_or_zero(port: int) -> str:
    return "0" if port == 0 else _port(port)


NAT_CHAIN = "postrouting"
HOSTPORTS = "hostports"
_HOSTPORT_HOOKS = (("hostport-pre", "prerouting"), ("hostport-out", "output"))


# The mappings live in four maps (a family each, any address of the node or one hostIP), so a pod's
# mappings come and go as element updates: O(its mappings), whatever the node holds.
_HOSTPORT_MAPS = (
    (6, "any", "inet_proto . inet_service", "meta l4proto . th dport"),
    (6, "ip", "ipv6_addr . inet_proto . inet_service", "ip6 daddr . meta l4proto . th dport"),
    (4, "any", "inet_proto . inet_service", "meta l4proto . th dport"),
    (4, "ip", "ipv4_addr . inet_proto . inet_service", "ip daddr . meta l4proto . th dport"),
)


def _hostport_map(hp: HostPort) -> str:
    return f"hp-{'any' if hp.host_ip is None else 'ip'}-{hp.pod_ip.version}"


def _hostport_key(hp: HostPort) -> str:
    """The element's key in its map (a hostIP mapping's address first)."""
    key = f"{_PROTO[hp.protocol]} . {_port(hp.host_port)}"
    if hp.host_ip is None:
        return key
    if hp.host_ip.version != hp.pod_ip.version:
        raise RenderError(f"hostIP {hp.host_ip} and pod {hp.pod_ip} are of different families")
    return f"{_addr(hp.host_ip)} . {key}"


def _hostport_elements(rs: Ruleset) -> dict[str, dict[str, str]]:
    """map → key → "pod . port": one target a key (the first in the ruleset's order, were two to clash)."""
    out: dict[str, dict[str, str]] = {f"hp-{kind}-{family}": {} for family, kind, _, _ in _HOSTPORT_MAPS}
    for hp in rs.hostports:
        out[_hostport_map(hp)].setdefault(_hostport_key(hp), f"{_addr(hp.pod_ip)} . {_port(hp.pod_port)}")
    return out


def _hairpin(rs: Ruleset, family: int) -> list[str]:
    """(pod . pod) for the pods with a mapping: a pod reaching itself through its hostPort, masqueraded."""
    pods = sorted({hp.pod_ip for hp in rs.hostports if hp.pod_ip.version == family})
    return [f"{_addr(a)} . {_addr(a)}" for a in pods]


def _hostport_lines(rs: Ruleset) -> list[str]:
    """The hostPort maps, sets and chains (always there, so mappings come and go as element updates)."""
    lines = []
    for family, addr in ((6, "ipv6_addr"), (4, "ipv4_addr")):
        items = ", ".join(_hairpin(rs, family))
        elements = f" elements = {{ {items} }};" if items else ""
        lines.append(f"\tset hairpin-{family} {{ type {addr} . {addr};{elements} }}")
    maps = _hostport_elements(rs)
    for family, kind, key_type, _ in _HOSTPORT_MAPS:
        name = f"hp-{kind}-{family}"
        items = ", ".join(f"{k} : {v}" for k, v in maps[name].items())
        elements = f" elements = {{ {items} }};" if items else ""
        addr = "ipv6_addr" if family == 6 else "ipv4_addr"
        lines.append(f"\tmap {name} {{ type {key_type} : {addr} . inet_service;{elements} }}")
    for chain, hook in _HOSTPORT_HOOKS:
        lines.append(f"\tchain {chain} {{")
        lines.append(f"\t\ttype nat hook {hook} priority -100; policy accept;")  # dstnat (nft 1.0.6: prerouting only)
        # loopback is local too, but a DNATed packet from 127.0.0.1 or ::1 is dropped on the way out
        # (no route_localnet): leave the node's localhost services alone
        lines.append("\t\tip daddr 127.0.0.0/8 return")
        lines.append("\t\tip6 daddr ::1 return")
        lines.append(f"\t\tfib daddr type local jump {HOSTPORTS}")
        lines.append("\t}")
    lines.append(f"\tchain {HOSTPORTS} {{")
    for family, kind, _, key in _HOSTPORT_MAPS:  # a miss in one map goes on to the next rule
        ip = "ip6" if family == 6 else "ip"
        lines.append(f"\t\tdnat {ip} to {key} map @hp-{kind}-{family}")
    lines.append("\t}")
    return lines


def _hostport_changes(t: str, old: Ruleset, new: Ruleset) -> list[str]:
    """Element updates turning *old*'s mappings into *new*'s (deletions first: a key may change its target)."""
    if old.hostports == new.hostports:
        return []
    dels: list[str] = []
    adds: list[str] = []
    before, after = _hostport_elements(old), _hostport_elements(new)
    for name, now in after.items():
        was = before[name]
        gone = [k for k, v in was.items() if now.get(k) != v]
        came = [f"{k} : {v}" for k, v in now.items() if was.get(k) != v]
        dels += [f"delete element {t} {name} {{ {', '.join(c)} }}" for c in _chunks(gone)]
        adds += [f"add element {t} {name} {{ {', '.join(c)} }}" for c in _chunks(came)]
    for family in (6, 4):
        was_set, now_set = set(_hairpin(old, family)), set(_hairpin(new, family))
        if gone_pods := sorted(was_set - now_set):
            dels += [f"delete element {t} hairpin-{family} {{ {', '.join(c)} }}" for c in _chunks(gone_pods)]
        if came_pods := sorted(now_set - was_set):
            adds += [f"add element {t} hairpin-{family} {{ {', '.join(c)} }}" for c in _chunks(came_pods)]
    return dels + adds


def _nat_lines(rs: Ruleset) -> list[str]:
    """natOutgoing's interval sets (two a family) and the postrouting nat chain, which also masquerades
    hostPort hairpins (a pod reaching itself through its own mapping)."""
    lines: list[str] = []
    rules = [f"ct status dnat {ip} saddr . {ip} daddr @hairpin-{f} masquerade" for f, ip in ((6, "ip6"), (4, "ip"))]
    for nat in rs.nat:
        ip, addr = ("ip6", "ipv6_addr") if nat.family == 6 else ("ip", "ipv4_addr")
        for kind, nets in (("src", nat.sources), ("exempt", nat.exempt)):
            items = ", ".join(_addr(n) for n in nets)
            elements = f" elements = {{ {items} }};" if items else ""
            lines.append(f"\tset nat-{kind}-{nat.family} {{ type {addr}; flags interval;{elements} }}")
        rules.append(f"{ip} saddr @nat-src-{nat.family} {ip} daddr != @nat-exempt-{nat.family} masquerade")
    lines.append(f"\tchain {NAT_CHAIN} {{")
    lines.append("\t\ttype nat hook postrouting priority srcnat; policy accept;")
    lines.extend(f"\t\t{r}" for r in rules)
    lines.append("\t}")
    return lines


def render_full(rs: Ruleset) -> str:
    """The whole table, replacing whatever ``inet flock`` held, in one transaction."""
    t = f"{FAMILY} {TABLE}"
    lines = [f"add table {t}", f"delete table {t}", f"table {t} {{"]
    for map_name in (EGRESS_MAP, INGRESS_MAP, NODE_MAP):
        lines.append(f"\tmap {map_name} {{ type ifname : verdict; }}")
    for s in _all_sets(rs).values():
        lines.append(f"\tset {_name(s.name)} {{ {_set_type(s)}; }}")
    for ps in rs.port_sets.values():
        lines.append("\t" + _port_set(t, ps, "set"))
    if _logs(rs):
        lines.extend("\t" + line for line in _meters("set"))
    for name, prio, key, map_name in _BASE:
        lines.append(f"\tchain {name} {{")
        lines.append(f"\t\ttype filter hook forward priority {prio}; policy accept;")
        lines.append("\t\tct state established,related accept")
        lines.append(f"\t\t{key} vmap @{map_name}")
        lines.append("\t}")
    lines.append(f"\tchain {INPUT_CHAIN} {{")
    lines.append("\t\ttype filter hook input priority 0; policy accept;")
    lines.append("\t\tct state established,related accept")
    lines.extend(f"\t\t{line}" for line in _INPUT_ALWAYS)
    lines.append(f"\t\tiifname vmap @{NODE_MAP}")
    lines.append("\t}")
    lines.extend(_hostport_lines(rs))
    lines.extend(_nat_lines(rs))
    for chain in rs.chains.values():
        lines.append(f"\tchain {_name(chain.name)} {{")
        lines.extend(f"\t\t{line}" for r in chain.rules for line in render_rules(r))
        lines.append("\t}")
    lines.append("}")
    # elements after the table block: every chain a map element jumps to exists by then
    for s in _all_sets(rs).values():
        for chunk in _chunks(_sorted_elements(s, s.elements)):
            lines.append(f"add element {t} {s.name} {{ {', '.join(chunk)} }}")
    for map_name, vmap in ((EGRESS_MAP, rs.egress_map), (INGRESS_MAP, rs.ingress_map), (NODE_MAP, rs.node_map)):
        items = [_map_element(v, c) for v, c in sorted(vmap.items())]
        for chunk in _chunks(items):
            lines.append(f"add element {t} {map_name} {{ {', '.join(chunk)} }}")
    return "\n".join(lines) + "\n"


def _element_lines(t: str, verb: str, s: AddressSet | ServiceSet, elements: Iterable[object]) -> list[str]:
    return [f"{verb} element {t} {s.name} {{ {', '.join(c)} }}" for c in _chunks(_sorted_elements(s, elements))]


def _map_changes(t: str, name: str, old: Mapping[str, str], new: Mapping[str, str]) -> tuple[list[str], list[str]]:
    removed = sorted(k for k in old if old[k] != new.get(k))
    added = sorted(k for k in new if new[k] != old.get(k))
    dels = [
        f"delete element {t} {name} {{ {', '.join(chr(34) + _name(k) + chr(34) for k in c)} }}"
        for c in _chunks(removed)
    ]
    adds = [f"add element {t} {name} {{ {', '.join(_map_element(k, new[k]) for k in c)} }}" for c in _chunks(added)]
    return dels, adds


def render_update(old: Ruleset, new: Ruleset) -> str:
    """The transaction turning the applied *old* into *new*; "" when nothing changes."""
    return render_change(old, RulesetChange.of(new, old, base=old))


def render_change(old: Ruleset, change: RulesetChange) -> str:
    """The transaction turning the applied *old* into ``change.structure``; "" when nothing changes.

    Only the declarations of *old*'s sets are read: elements move as
    *change* says (sets in both), or come whole with a new set."""
    new = change.structure
    t = f"{FAMILY} {TABLE}"
    if new is old:  # pod churn: elements only
        sets = _all_sets(new)
        out = [line for n, e in change.removed.items() for line in _element_lines(t, "delete", sets[n], e)]
        out += [line for n, e in change.added.items() for line in _element_lines(t, "add", sets[n], e)]
        return "\n".join(out) + "\n" if out else ""
    old_sets, new_sets = _all_sets(old), _all_sets(new)
    head: list[str] = []
    rules: list[str] = []
    dels: list[str] = []
    adds: list[str] = []
    tail: list[str] = []

    for name, s in new_sets.items():
        prev = old_sets.get(name)
        if prev is None:
            head.append(f"add set {t} {_name(name)} {{ {_set_type(s)}; }}")
            adds += _element_lines(t, "add", s, change.elements(name))
            continue
        if prev.declaration != s.declaration:
            raise RenderError(f"set {name} changed its type: set names must encode their type")
        gone, came = change.removed.get(name), change.added.get(name)
        if gone:
            dels += _element_lines(t, "delete", s, gone)
        if came:
            adds += _element_lines(t, "add", s, came)
    head += [_port_set(t, ps, f"add set {t}") for n, ps in new.port_sets.items() if n not in old.port_sets]
    logs_before, logs_now = _logs(old), _logs(new)
    if logs_now and not logs_before:
        head += _meters(f"add set {t}")
    for name, chain in new.chains.items():
        prev_chain = old.chains.get(name)
        if prev_chain is chain or prev_chain == chain:
            continue
        if prev_chain is None:
            head.append(f"add chain {t} {_name(name)}")
        else:
            rules.append(f"flush chain {t} {_name(name)}")
        rules.extend(f"add rule {t} {name} {line}" for r in chain.rules for line in render_rules(r))
    for map_name, o, n in (
        (EGRESS_MAP, old.egress_map, new.egress_map),
        (INGRESS_MAP, old.ingress_map, new.ingress_map),
        (NODE_MAP, old.node_map, new.node_map),
    ):
        if o is n:
            continue
        d, a = _map_changes(t, map_name, o, n)
        dels += d
        adds += a
    removed_chains = [c for c in old.chains if c not in new.chains]
    tail += [f"flush chain {t} {_name(c)}" for c in removed_chains]
    tail += [f"delete chain {t} {c}" for c in removed_chains]
    tail += [f"delete set {t} {_name(n)}" for n in old_sets if n not in new_sets]
    tail += [f"delete set {t} {_name(n)}" for n in old.port_sets if n not in new.port_sets]
    if logs_before and not logs_now:
        tail += [f"delete set {t} {meter}" for meter, _ in _DENY_METERS.values()]
    lines = head + rules + _hostport_changes(t, old, new) + dels + adds + tail
    return "\n".join(lines) + "\n" if lines else ""


def summarize(old: Ruleset | None, change: RulesetChange) -> dict[str, int]:
    """Counts for the one log line per applied change (*old*: the structure it replaced; None: a full apply)."""
    new = change.structure
    if old is None:
        return {"chains": len(new.chains), "rules": new.rule_count, "sets": new.set_count}
    old_sets, new_sets = _all_sets(old), _all_sets(new)
    changed = sum(1 for n, c in new.chains.items() if old.chains.get(n) is not c and old.chains.get(n) != c)
    return {
        "chains_changed": changed,
        "chains_removed": sum(1 for n in old.chains if n not in new.chains),
        "elements_added": sum(
            len(change.added.get(n, ())) if n in old_sets else len(change.elements(n)) for n in new_sets
        ),
        "elements_removed": sum(len(change.removed.get(n, ())) for n in old_sets),
        "pods_isolated": len(set(new.egress_map) | set(new.ingress_map)),
    }
