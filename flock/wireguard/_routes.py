"""Routes of the remote pod blocks through the WireGuard device.

How a remote node's pod block is routed without encryption: BIRD learns it over BGP and exports it to
the kernel (``protocol kernel``, ``export filter flock_kernel_export``: BGP routes only), as protocol
``bird`` (12) with BIRD's default kernel metric, 32.  The device's route is the same prefix with a
**lower metric** (:data:`METRIC`, 16): both live in the table (routes of one prefix and different
metrics do not replace each other), the kernel uses the lower one, and BIRD's stays as the fallback
it would be anyway — which is why the fail-closed guard (:mod:`._guard`) exists: when the device
goes, its routes go with it, BIRD's route carries the traffic and the guard drops it.

The routes carry a protocol number of their own, :data:`ROUTE_PROTOCOL` (71), not the pods' (70,
``flock.netlink.ROUTE_PROTOCOL``): BIRD learns protocol 70 routes from the kernel (``learn``,
``flock_kernel_import``) and would take a remote block as its own best route and withdraw its BGP
route from the kernel; and the agent's start-up cleanup removes protocol-70 unicast routes through
no pod veth.  Protocol 71 routes are flock's too (only this module writes or deletes them), and
nothing else reads them.

Applied with ``ip -batch -`` (one process for any number of routes) in the device's namespace, from
the difference with what ``ip -j route show proto 71`` lists (pure: :func:`plan_routes`).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable

import attrs
import trio

from flock.netns import netns_path
from flock.wireguard._device import DeviceError, Tools
from flock.wireguard._model import IPNetwork, network_order

ROUTE_PROTOCOL = 71
METRIC = 16  # below BIRD's default kernel metric (32): the device's route wins over the BGP-learned one


@attrs.frozen
class RoutePlan:
    add: tuple[IPNetwork, ...] = ()
    delete: tuple[IPNetwork, ...] = ()  # ours, through the device, no longer wanted

    def __bool__(self) -> bool:
        return bool(self.add or self.delete)


def plan_routes(live: Iterable[IPNetwork], desired: Iterable[IPNetwork]) -> RoutePlan:
    """What takes the device's routes *live* to *desired* (pure)."""
    have, want = frozenset(live), frozenset(desired)
    return RoutePlan(
        tuple(sorted(want - have, key=network_order)),
        tuple(sorted(have - want, key=network_order)),
    )


def batch_lines(device: str, plan: RoutePlan) -> list[str]:
    """``ip -batch`` lines for *plan* (deletions first)."""
    tail = f"dev {device} proto {ROUTE_PROTOCOL} metric {METRIC}"
    return [
        *(f"route del {net} {tail}" for net in plan.delete),
        *(f"route replace {net} {tail}" for net in plan.add),
    ]


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
    """The routes through *device* in namespace *netns* (a path; None: this process's)."""

    device: str
    netns: str | None = None
    tools: Tools = attrs.field(factory=Tools)

    async def live(self) -> list[IPNetwork]:
        found: list[IPNetwork] = []
        for family in ("-6", "-4"):
            argv = [self.tools.ip, "-j", family, "route", "show", "proto", str(ROUTE_PROTOCOL), "dev", self.device]
            proc = await trio.run_process(self._enter(argv), capture_stdout=True, capture_stderr=True, check=False)
            if proc.returncode != 0:
                err = proc.stderr.decode(errors="replace")
                if "Cannot find device" in err or "does not exist" in err:
                    return []  # no device: no routes through it
                raise DeviceError(self.device, "ip route show", err, proc.returncode)
            found += parse_routes(proc.stdout.decode())
        return found

    async def apply(self, desired: Iterable[IPNetwork]) -> RoutePlan:
        """Make the device's routes exactly *desired*; what changed."""
        plan = plan_routes(await self.live(), desired)
        if plan:
            script = "\n".join(batch_lines(self.device, plan)) + "\n"
            argv = self._enter([self.tools.ip, "-batch", "-"])
            proc = await trio.run_process(
                argv, stdin=script.encode(), capture_stdout=True, capture_stderr=True, check=False
            )
            if proc.returncode != 0:
                raise DeviceError(self.device, "ip -batch route", proc.stderr.decode(errors="replace"), proc.returncode)
        return plan

    def _enter(self, argv: list[str]) -> list[str]:
        if self.netns is None:
            return argv
        return [self.tools.nsenter, f"--net={netns_path(self.netns)}", *argv]
