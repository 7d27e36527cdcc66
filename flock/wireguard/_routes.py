"""Routes of the remote pod blocks through the WireGuard device, for this node's pods' traffic only.

Without encryption a remote node's pod block is routed by BIRD: learned over BGP and exported to the
kernel (``protocol kernel``, ``export filter flock_kernel_export``: BGP routes only) into the main table,
as protocol ``bird``.  With encryption, the same prefixes through the device live in a **table of their
own**, :data:`ROUTE_TABLE` (71), and a **rule** per pod block of this node sends what comes *from* a
pod of this node to that table first (:data:`RULE_PRIORITY` 99, before the main table's 32766)::

    99:  from 2001:db8:0:1::/64 lookup 71        (this node's pod blocks, protocol 71)
    table 71: 2001:db8:0:2::/64 dev flock-wg proto 71   (every peer's allowed IPs)

Why not the main table: WireGuard accepts from a peer only sources inside that peer's allowed IPs (the
pod blocks).  A packet to a remote pod from anything else — the node itself, a hostNetwork pod, a
client of a NodePort forwarded to a pod on another node — would enter the tunnel and be dropped by the
peer as a forged source.  With the rule, only pod ↔ pod traffic takes the tunnel; node traffic takes
BIRD's route, in the clear, as docs/encryption.md says it does.  A lookup in table 71 that finds no
route (the device gone, and its routes with it; no key yet for that node) falls through to the main
table and BIRD's route, which is what the fail-closed guard (:mod:`._guard`) drops.

Routes and rules carry a protocol number of their own, :data:`ROUTE_PROTOCOL` (71), not the pods' (70,
``flock.netlink.ROUTE_PROTOCOL``): BIRD learns protocol-70 routes from the kernel, and the agent's
start-up cleanup removes protocol-70 unicast routes through no pod veth.  Only this module writes or
deletes protocol-71 routes and rules, and only in table 71.

Applied with ``ip -batch -`` (one process per family for any number of routes and rules) in the
device's namespace, from the difference with what ``ip -j route show table 71 proto 71`` and
``ip -j rule show table 71`` list (pure: :func:`plan_routes`).
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from collections.abc import Iterable

import attrs
import trio

from flock.netns import netns_path
from flock.wireguard._device import DeviceError, Tools
from flock.wireguard._model import IPNetwork, network_order

ROUTE_PROTOCOL = 71
ROUTE_TABLE = 71  # the device's routes (default of --wireguard-table); looked up from this node's pod blocks
RULE_PRIORITY = 99  # before the main table's 32766 (default of --wireguard-rule-priority)


@attrs.frozen
class RoutePlan:
    add: tuple[IPNetwork, ...] = ()
    delete: tuple[IPNetwork, ...] = ()  # ours, in table 71, no longer wanted
    add_rules: tuple[IPNetwork, ...] = ()  # sources (this node's pod blocks) looked up in table 71
    delete_rules: tuple[IPNetwork, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.add or self.delete or self.add_rules or self.delete_rules)


def plan_routes(
    live: Iterable[IPNetwork],
    desired: Iterable[IPNetwork],
    live_rules: Iterable[IPNetwork] = (),
    desired_rules: Iterable[IPNetwork] = (),
) -> RoutePlan:
    """What takes the device's routes *live* to *desired*, and the rules' sources *live_rules* to
    *desired_rules* (pure)."""

    def diff(a: Iterable[IPNetwork], b: Iterable[IPNetwork]) -> tuple[IPNetwork, ...]:
        return tuple(sorted(frozenset(a) - frozenset(b), key=network_order))

    return RoutePlan(
        diff(desired, live), diff(live, desired), diff(desired_rules, live_rules), diff(live_rules, desired_rules)
    )


def batch_lines(
    device: str, plan: RoutePlan, family: int, table: int = ROUTE_TABLE, priority: int = RULE_PRIORITY
) -> list[str]:
    """``ip -batch`` lines of *family* for *plan*: routes before rules when adding (a rule never points at
    a table still being filled), rules before routes when deleting."""
    route = f"dev {device} proto {ROUTE_PROTOCOL} table {table}"
    rule = f"lookup {table} priority {priority} protocol {ROUTE_PROTOCOL}"

    def of(nets: tuple[IPNetwork, ...]) -> list[IPNetwork]:
        return [n for n in nets if n.version == family]

    return [
        *(f"rule del from {net} {rule}" for net in of(plan.delete_rules)),
        *(f"route del {net} {route}" for net in of(plan.delete)),
        *(f"route replace {net} {route}" for net in of(plan.add)),
        *(f"rule add from {net} {rule}" for net in of(plan.add_rules)),
    ]


def parse_rules(text: str, table: int = ROUTE_TABLE) -> list[IPNetwork]:
    """The sources of flock's rules (to *table*, protocol 71) in ``ip -j rule show``'s output."""
    found: list[IPNetwork] = []
    for entry in json.loads(text or "[]"):
        if str(entry.get("table")) != str(table) or str(entry.get("protocol")) != str(ROUTE_PROTOCOL):
            continue
        src = str(entry.get("src", ""))
        if src in ("", "all"):
            continue
        length = entry.get("srclen", 128 if ":" in src else 32)
        found.append(ipaddress.ip_network(f"{src}/{length}"))
    return found


def parse_routes(text: str) -> list[IPNetwork]:
    """The destinations of ``ip -j route show``'s output."""
    found: list[IPNetwork] = []
    for entry in json.loads(text or "[]"):
        dst = str(entry.get("dst", ""))
        if dst == "default":
            continue
        found.append(ipaddress.ip_network(dst if "/" in dst else f"{dst}/{128 if ':' in dst else 32}"))
    return found


@attrs.define(eq=False)
class DeviceRoutes:
    """The routes through *device* in table 71 and the rules that send this node's pods' traffic there,
    in namespace *netns* (a path; None: this process's)."""

    device: str
    netns: str | None = None
    tools: Tools = attrs.field(factory=Tools)
    table: int = ROUTE_TABLE  # flock-agent --wireguard-table
    priority: int = RULE_PRIORITY  # flock-agent --wireguard-rule-priority

    async def live(self) -> list[IPNetwork]:
        found: list[IPNetwork] = []
        for family in ("-6", "-4"):
            argv = [self.tools.ip, "-j", family, "route", "show", "table", str(self.table)]
            argv += ["proto", str(ROUTE_PROTOCOL), "dev", self.device]
            proc = await self._run(argv)
            if proc.returncode != 0:
                err = proc.stderr.decode(errors="replace")
                if "Cannot find device" in err or "does not exist" in err:
                    return []  # no device: no routes through it
                raise DeviceError(self.device, "ip route show", err, proc.returncode)
            found += parse_routes(proc.stdout.decode())
        return found

    async def live_rules(self) -> list[IPNetwork]:
        found: list[IPNetwork] = []
        for family in ("-6", "-4"):
            proc = await self._run([self.tools.ip, "-j", family, "rule", "show", "table", str(self.table)])
            if proc.returncode != 0:
                raise DeviceError(self.device, "ip rule show", proc.stderr.decode(errors="replace"), proc.returncode)
            found += parse_rules(proc.stdout.decode(), self.table)
        return found

    async def apply(self, desired: Iterable[IPNetwork], sources: Iterable[IPNetwork] | None = ()) -> RoutePlan:
        """Make the device's routes exactly *desired* and the rules' sources exactly *sources* (this
        node's pod blocks; None: the rules are neither read nor touched); what changed."""
        if sources is None:
            plan = plan_routes(await self.live(), desired)
        else:
            plan = plan_routes(await self.live(), desired, await self.live_rules(), sources)
        for family in (6, 4):
            lines = batch_lines(self.device, plan, family, self.table, self.priority)
            if not lines:
                continue
            proc = await self._run([self.tools.ip, f"-{family}", "-batch", "-"], stdin="\n".join(lines) + "\n")
            if proc.returncode != 0:
                raise DeviceError(self.device, "ip -batch", proc.stderr.decode(errors="replace"), proc.returncode)
        return plan

    async def remove(self) -> RoutePlan:
        """Every route of table 71 through the device and every rule of flock's to table 71 (encryption
        switched off)."""
        return await self.apply((), ())

    async def _run(self, argv: list[str], stdin: str = "") -> subprocess.CompletedProcess[bytes]:
        return await trio.run_process(
            self._enter(argv), stdin=stdin.encode(), capture_stdout=True, capture_stderr=True, check=False
        )

    def _enter(self, argv: list[str]) -> list[str]:
        if self.netns is None:
            return argv
        return [self.tools.nsenter, f"--net={netns_path(self.netns)}", *argv]
