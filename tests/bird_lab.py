"""A small routed lab for the real-BIRD test: namespaces, links, pods, bird2.

Synchronous pyroute2 helpers, run by the test in worker threads. Every
namespace is named ``fl-bird-<run id>-<role>`` and removed by :class:`Lab`'s
``close`` whatever state the test left it in.

Pods are wired the way DESIGN.md ("ADD, DEL, startup") describes, with the
route protocol number flock uses, so BIRD's ``learn`` sees exactly what the
agent would leave in the kernel.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import subprocess
import zlib

import attrs
from pyroute2 import NetNS, netns
from pyroute2.netlink.exceptions import NetlinkError

GATEWAY6 = "fe80::1"
GATEWAY4 = "169.254.1.1"


def _sysctl(ns: str, *settings: str) -> None:
    # A fresh process per call: setns() never touches a thread others reuse.
    subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", *settings], check=True)


@attrs.define(eq=False)
class Pod:
    ns: str
    node_ns: str
    host_if: str
    ip6: ipaddress.IPv6Address
    ip4: ipaddress.IPv4Address
    anycast: tuple = ()


@attrs.define(eq=False)
class Lab:
    prefix: str
    route_protocol: int
    namespaces: list[str] = attrs.field(factory=list)

    def ns(self, role: str) -> str:
        name = f"{self.prefix}-{role}"
        netns.create(name)
        self.namespaces.append(name)
        with NetNS(name) as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        return name

    def node(self, role: str) -> str:
        name = self.ns(role)
        # A new namespace does not inherit forwarding.
        _sysctl(name, "net.ipv6.conf.all.forwarding=1", "net.ipv4.ip_forward=1")
        return name

    def link(self, a: str, a_if: str, a_addrs: list[str], b: str, b_if: str, b_addrs: list[str]) -> None:
        """A veth between namespaces ``a`` and ``b`` with addresses (no DAD) on both ends."""
        with NetNS(a) as ipr:
            ipr.link("add", ifname=a_if, kind="veth", peer={"ifname": b_if, "net_ns_fd": b})
        for ns, ifname, addrs in ((a, a_if, a_addrs), (b, b_if, b_addrs)):
            with NetNS(ns) as ipr:
                idx = ipr.link_lookup(ifname=ifname)[0]
                for addr in addrs:
                    iface = ipaddress.ip_interface(addr)
                    extra = {"flags": 0x02} if iface.version == 6 else {}  # IFA_F_NODAD
                    ipr.addr("add", index=idx, address=str(iface.ip), prefixlen=iface.network.prefixlen, **extra)
                ipr.link("set", index=idx, state="up")

    def add_loopback_address(self, ns: str, addr: str) -> None:
        iface = ipaddress.ip_interface(addr)
        with NetNS(ns) as ipr:
            ipr.addr("add", index=ipr.link_lookup(ifname="lo")[0], address=str(iface.ip), prefixlen=iface.network.prefixlen)

    def node_blackholes(self, ns: str, *blocks: str) -> None:
        with NetNS(ns) as ipr:
            for block in blocks:
                ipr.route("add", dst=block, type="blackhole", proto=self.route_protocol)
            # proxy_arp answers for 169.254.1.1 only if the node routes it out of another interface.
            # A unicast route out of lo serves (it is never used: pods talk to their own veth).
            ipr.route("add", dst=GATEWAY4 + "/32", oif=ipr.link_lookup(ifname="lo")[0], scope=253, proto=self.route_protocol)

    def pod(self, node_ns: str, role: str, ip6: str, ip4: str, anycast: tuple[str, ...] = ()) -> Pod:
        pod_ns = self.ns(role)
        host_if = "flock%08x" % zlib.crc32(pod_ns.encode())
        with NetNS(node_ns) as ipr:
            ipr.link("add", ifname=host_if, kind="veth", peer={"ifname": "eth0", "net_ns_fd": pod_ns})
            idx = ipr.link_lookup(ifname=host_if)[0]
            ipr.link("set", index=idx, IFLA_AF_SPEC={"attrs": [("AF_INET6", {"attrs": [("IFLA_INET6_ADDR_GEN_MODE", 1)]})]})
        _sysctl(
            node_ns,
            f"net.ipv4.conf.{host_if}.proxy_arp=1",
            f"net.ipv4.neigh.{host_if}.proxy_delay=0",
            f"net.ipv4.conf.{host_if}.forwarding=1",
            f"net.ipv6.conf.{host_if}.forwarding=1",
        )
        with NetNS(node_ns) as ipr:
            idx = ipr.link_lookup(ifname=host_if)[0]
            ipr.addr("add", index=idx, address=GATEWAY6, prefixlen=64, flags=0x02)
            ipr.link("set", index=idx, state="up")  # routes via a down veth are refused
        with NetNS(pod_ns) as ipr:
            idx = ipr.link_lookup(ifname="eth0")[0]
            for addr in (ip6, *[a for a in anycast if ":" in a]):
                ipr.addr("add", index=idx, address=addr, prefixlen=128, flags=0x02)
            for addr in (ip4, *[a for a in anycast if ":" not in a]):
                ipr.addr("add", index=idx, address=addr, prefixlen=32)
            ipr.link("set", index=idx, state="up")
            ipr.route("add", dst="::/0", gateway=GATEWAY6, oif=idx)
            ipr.route("add", dst=GATEWAY4 + "/32", oif=idx, scope=253)
            ipr.route("add", dst="0.0.0.0/0", gateway=GATEWAY4, oif=idx)
        with NetNS(node_ns) as ipr:
            idx = ipr.link_lookup(ifname=host_if)[0]
            for addr in (ip6, ip4, *anycast):
                host = 128 if ":" in addr else 32
                ipr.route("add", dst=f"{addr}/{host}", oif=idx, proto=self.route_protocol)
        return Pod(pod_ns, node_ns, host_if, ipaddress.IPv6Address(ip6), ipaddress.IPv4Address(ip4), anycast)

    def remove_pod(self, pod: Pod) -> None:
        """Delete the pod namespace and its host veth; the kernel drops its routes with the link."""
        with NetNS(pod.node_ns) as ipr:
            idx = ipr.link_lookup(ifname=pod.host_if)
            if idx:
                ipr.link("del", index=idx[0])
        self._remove_ns(pod.ns)

    def _remove_ns(self, name: str) -> None:
        try:
            netns.remove(name)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
        if name in self.namespaces:
            self.namespaces.remove(name)

    def routes(self, ns: str, dst: str) -> list[set[str]]:
        """Next-hop gateways of each route to exactly ``dst`` in ``ns`` (one set per route)."""
        net = ipaddress.ip_network(dst)
        family = 10 if net.version == 6 else 2
        out = []
        with NetNS(ns) as ipr:
            for route in ipr.route("dump", family=family):
                if route.get("dst") != str(net.network_address) or route["dst_len"] != net.prefixlen:
                    continue
                hops = set()
                if route.get("gateway"):
                    hops.add(route.get("gateway"))
                for hop in route.get("multipath") or ():
                    hops.add(hop.get("gateway") or str(hop.get("via", {}).get("addr")))
                via = route.get("via")
                if via:
                    hops.add(str(via.get("addr")))
                out.append(hops)
        return out

    def close(self) -> None:
        for name in list(self.namespaces):
            self._remove_ns(name)


def unique_prefix() -> str:
    return "fl-bird-" + os.urandom(3).hex()


__all__ = ["Lab", "NetlinkError", "Pod", "unique_prefix"]
