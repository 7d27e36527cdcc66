"""An allocation as a CNI result (1.1.0 form), and reading a CHECK's prevResult."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from flock.errors import quote
from flock.model import Allocation, IPAddress

from ._errors import InvalidNetworkConfig

IpInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


def result_addresses(alloc: Allocation) -> tuple[IPAddress, ...]:
    """What the result lists in ``ips`` (so what becomes podIPs): the pod's own
    /128 and /32 first, then its fixed extra addresses.  Anycast addresses are
    shared, so they are routed and announced but not reported as the pod's."""
    return tuple(a for a in (alloc.ip6, alloc.ip4) if a is not None) + tuple(alloc.addresses)


def cni_result(
    alloc: Allocation,
    *,
    host_iface: str,
    gateway6: ipaddress.IPv6Address,
    gateway4: ipaddress.IPv4Address,
    macs: tuple[str, str] = ("", ""),
) -> dict[str, Any]:
    """The ADD result in CNI 1.1.0 form (the caller converts it to the requested version).

    ``interfaces[0]`` is the host veth, ``interfaces[1]`` the pod's interface
    with its ``sandbox`` (the netns path); every ``ips[].interface`` is 1.
    *macs* are (host, pod) as read from the kernel; an empty one is left out
    (podman and libcni refuse ``"mac": ""``).
    """
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
    host: dict[str, Any] = {"name": host_iface}
    pod: dict[str, Any] = {"name": alloc.if_name}
    if macs[0]:
        host["mac"] = macs[0]
    if macs[1]:
        pod["mac"] = macs[1]
    pod["sandbox"] = alloc.netns
    return {
        "cniVersion": "1.1.0",
        "interfaces": [host, pod],
        "ips": ips,
        "routes": routes,
    }


def _invalid(field: str, value: Any, expected: str) -> InvalidNetworkConfig:
    return InvalidNetworkConfig("invalid prevResult", f"{field}={quote(value)}: expected {expected}")


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


def prev_result_macs(config: Mapping[str, Any], host_name: str, pod_name: str, sandbox: str) -> dict[str, str]:
    """The MACs ``prevResult.interfaces`` claims for the host veth (key "host")
    and the pod interface (key "pod", the entry with that name and sandbox);
    entries without ``mac`` are left out.  CniError (code 7) for a malformed
    list or MAC.  Call after :func:`prev_result_addresses` (which requires
    ``prevResult``)."""
    prev = config["prevResult"]
    interfaces = prev.get("interfaces", [])
    if not isinstance(interfaces, list):
        raise _invalid("prevResult.interfaces", interfaces, "a list")
    out: dict[str, str] = {}
    for i, item in enumerate(interfaces):
        if not isinstance(item, Mapping):
            raise _invalid(f"prevResult.interfaces[{i}]", item, "an object with 'name'")
        mac = item.get("mac")
        if mac is None:
            continue
        if not isinstance(mac, str) or not _is_mac(mac):
            raise _invalid(f"prevResult.interfaces[{i}].mac", mac, "a MAC address such as 0a:58:0a:f4:00:05")
        if item.get("name") == host_name and not item.get("sandbox"):
            out["host"] = mac.lower()
        elif item.get("name") == pod_name and item.get("sandbox") in (None, "", sandbox):
            out["pod"] = mac.lower()
    return out


def _is_mac(value: str) -> bool:
    parts = value.split(":")
    return len(parts) == 6 and all(len(p) == 2 and all(c in "0123456789abcdefABCDEF" for c in p) for p in parts)
