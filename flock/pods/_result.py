"""An allocation as a CNI result (1.1.0 form), and reading a CHECK's prevResult."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from flock.model import Allocation, IPAddress

from ._errors import InvalidNetworkConfig

IpInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


def result_addresses(alloc: Allocation) -> tuple[IPAddress, ...]:
    """What the result lists in ``ips`` (so what becomes podIPs): the pod's own
    /128 and /32 first, then its fixed extra addresses.  Anycast addresses are
    shared, so they are routed and announced but not reported as the pod's."""
    return tuple(a for a in (alloc.ip6, alloc.ip4) if a is not None) + tuple(alloc.addresses)


def cni_result(
    alloc: Allocation, *, host_iface: str, gateway6: ipaddress.IPv6Address, gateway4: ipaddress.IPv4Address
) -> dict[str, Any]:
    """The ADD result in CNI 1.1.0 form (the caller converts it to the requested version)."""
    gateway = {6: str(gateway6), 4: str(gateway4)}
    ips = []
    for i, addr in enumerate(result_addresses(alloc)):
        item: dict[str, Any] = {"address": f"{addr}/{addr.max_prefixlen}", "interface": 1}
        if i < 2 and addr in (alloc.ip6, alloc.ip4):
            item["gateway"] = gateway[addr.version]
        ips.append(item)
    families = {a.version for a in alloc.all_addresses}
    routes = []
    if 6 in families:
        routes.append({"dst": "::/0", "gw": gateway[6]})
    if 4 in families:
        routes.append({"dst": "0.0.0.0/0", "gw": gateway[4]})
    return {
        "cniVersion": "1.1.0",
        "interfaces": [
            {"name": host_iface},
            {"name": alloc.if_name, "sandbox": alloc.netns},
        ],
        "ips": ips,
        "routes": routes,
    }


def _invalid(field: str, value: Any, expected: str) -> InvalidNetworkConfig:
    return InvalidNetworkConfig("invalid prevResult", f"{field}={value!r}: expected {expected}")


def prev_result_addresses(config: Mapping[str, Any]) -> set[IpInterface]:
    """The ``ips`` of the configuration's ``prevResult``; :class:`InvalidNetworkConfig`
    naming the field when it is missing or malformed."""
    if "prevResult" not in config:
        raise InvalidNetworkConfig("CHECK needs prevResult", "the network configuration has no field 'prevResult'")
    prev = config["prevResult"]
    if not isinstance(prev, Mapping):
        raise _invalid("prevResult", prev, "an object (the ADD result)")
    ips = prev.get("ips", [])
    if not isinstance(ips, list):
        raise _invalid("prevResult.ips", ips, "a list")
    out: set[IpInterface] = set()
    for i, item in enumerate(ips):
        field = f"prevResult.ips[{i}]"
        if not isinstance(item, Mapping):
            raise _invalid(field, item, "an object with 'address'")
        raw = item.get("address")
        try:
            if not isinstance(raw, str) or "%" in raw or "/" not in raw:
                raise ValueError(raw)
            out.add(ipaddress.ip_interface(raw))
        except ValueError:
            raise _invalid(field + ".address", raw, "an address with prefix length, such as 2001:db8::5/128") from None
    return out
