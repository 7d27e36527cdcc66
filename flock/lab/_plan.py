"""The lab's topology as values: names, addresses and paths, decided before anything is made.

Everything is in documentation ranges (RFC 3849, RFC 5737) and in namespaces
named ``flab-<lab id>-…``, where the lab id comes from the lab directory, so two
labs in two directories never share a namespace and a crashed lab's leftovers
are found again from its directory alone.

Fabric segment (a bridge in the fabric namespace, every node's uplink a port)::

    fabric   2001:db8:ffff::1/64  192.0.2.1/26   bird2 route server, AS 64500, API server :6443
    node i   2001:db8:ffff::10i/64 192.0.2.(10+i)/26  AS 64512+i, router id 192.0.2.(10+i)

Node i's pod blocks: ``2001:db8:0:i::/64`` and a /26 of 198.51.100.0/24
(nodes 1-4) or 203.0.113.0/24 (nodes 5-8).  Pods' anycast and extra addresses:
``2001:db8:53::/48``, ``192.0.2.128/26``.  Services: ClusterIPs from
``fd00:10:96::/112`` and ``192.0.2.192/27``; externalIPs and load-balancer
addresses in ``2001:db8:ee::/64`` and ``192.0.2.224/27`` (the agents translate
those, and the fabric routes them to every node, ECMP).

With ``internet``, an "internet" namespace hangs off the fabric namespace
(which then forwards), with addresses outside every cluster range and routes
back only to the fabric segment (the nodes' uplinks), never to a pod block::

    fabric   2001:db8:ffff:1::1/64   192.0.2.65/26    its gateway
    internet 2001:db8:ffff:1::100/64 192.0.2.100/26   serves NODE_PORTS; routes: 2001:db8:ffff::/64, 192.0.2.0/26

so pods reach it only through their node's natOutgoing (masqueraded to the
node's uplink address).  ``uplink_mtu`` is the MTU of every fabric link (each
node's uplink and its bridge port, the bridge, the internet's link), which a
node's agent detects and gives its pods.

Each node is also a v1 Node object in the lab's API server (labels
``kubernetes.io/hostname`` and ``kubernetes.io/os``; its InternalIPs are its
fabric addresses, the ones every pod reaches it at), and serves
``NODE_PORTS`` on them (:mod:`flock.lab._serve`) for probes to a node.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
from pathlib import Path
from typing import Any

import attrs

from flock.model import MTU_MAX, MTU_MIN

NS_PREFIX = "flab-"
MAX_NODES = 8
FABRIC_ASN = 64500
INTERNET_ASN = 64496  # the internet's router (--internet): a documentation AS (RFC 5398)
NODE_ASN_BASE = 64512
FABRIC6 = ipaddress.IPv6Address("2001:db8:ffff::1")
FABRIC4 = ipaddress.IPv4Address("192.0.2.1")
FABRIC_PREFIX6, FABRIC_PREFIX4 = 64, 26
FABRIC_NET6 = ipaddress.ip_network(f"{FABRIC6}/{FABRIC_PREFIX6}", strict=False)
FABRIC_NET4 = ipaddress.ip_network(f"{FABRIC4}/{FABRIC_PREFIX4}", strict=False)
# The lab's internet (--internet): a documentation /64 and the free /26 of 192.0.2.0/24 (between the
# fabric's /26 and ANNOUNCE_RANGES' /25), outside every cluster range.
INTERNET_PREFIX6, INTERNET_PREFIX4 = 64, 26
INTERNET_GATEWAY6 = ipaddress.IPv6Address("2001:db8:ffff:1::1")  # the fabric's side of the link
INTERNET_GATEWAY4 = ipaddress.IPv4Address("192.0.2.65")
INTERNET6 = ipaddress.IPv6Address("2001:db8:ffff:1::100")
INTERNET4 = ipaddress.IPv4Address("192.0.2.100")
INTERNET_LINK = "internet"  # the fabric's end of the link; the internet's end is eth0
INTERNET = "internet"  # its name as a probe endpoint
DEFAULT_MTU = 1500
MIN_MTU, MAX_MTU = MTU_MIN, MTU_MAX  # what a NodeConfig's spec.mtu takes: every MTU an agent detects is usable
# Where lab pods may claim anycast/addresses: a documentation /48 and the third /26 of 192.0.2.0/24
# (the fabric and the nodes use the first, the internet the second; Services the fourth).
ANNOUNCE_RANGES = (ipaddress.ip_network("2001:db8:53::/48"), ipaddress.ip_network("192.0.2.128/26"))
# Services (the agents run flock's service proxy): the API server's --service-cluster-ip-range
# (ClusterIPs; IPv6 primary) and the LoadBalancerPool lab-default (externalIPs and load-balancer
# addresses translated and announced by the nodes over BGP; the fabric's BIRD puts them in its
# kernel, ECMP over the announcing nodes, and passes them on to the internet's).  Outside every pod
# block, fabric and announce range.
SERVICE_CLUSTER_RANGES = (ipaddress.ip_network("fd00:10:96::/112"), ipaddress.ip_network("192.0.2.192/27"))
SERVICE_EXTERNAL_RANGES = (ipaddress.ip_network("2001:db8:ee::/64"), ipaddress.ip_network("192.0.2.224/27"))
APISERVER_PORT = 6443
HEALTH_ADDRESS = "127.0.0.1:9464"  # inside each node's namespace
UPLINK = "uplink"
BRIDGE = "fabric"
DEFAULT_DIR = Path("/run/flock-lab")
# BGP as a production fabric runs it (issue 17): every node's session to the
# route server is signed (TCP MD5, the password from this Secret in the
# agents' namespace, one key per node), watched by BFD and restarts gracefully.
AGENT_NAMESPACE = "kube-system"
BGP_SECRET = "flock-bgp-passwords"
BFD_INTERVAL_MS, BFD_MULTIPLIER = 100, 3
# How the fabric's BGP sessions take BFD going down: "mixed", node1's port restart-safe and the others
# failing fast (NodePlan.fabric_bfd); "graceful", every port restart-safe (a rolling upgrade's fabric).
FABRIC_BFD_MODES = ("mixed", "graceful")
# What a node serves on its own addresses (TCP and UDP, IPv6 and IPv4), as the model's pods do.
NODE_PORTS = ("80/TCP", "81/TCP", "80/UDP", "81/UDP")
NODE_LABELS = ("kubernetes.io/hostname", "kubernetes.io/os")


def lab_id(directory: Path) -> str:
    """Four hex digits naming this lab directory's namespaces."""
    return hashlib.sha1(str(directory.resolve()).encode()).hexdigest()[:4]


# Every node's pod blocks and the fabric segment (see NodePlan.nodeconfig).
CLUSTER_RANGES = (
    ipaddress.ip_network("2001:db8::/48"),
    FABRIC_NET6,
    ipaddress.ip_network("198.51.100.0/24"),
    ipaddress.ip_network("203.0.113.0/24"),
    FABRIC_NET4,
)


@attrs.frozen
class NodePlan:
    index: int
    name: str
    netns: str
    dir: Path
    addr6: ipaddress.IPv6Address
    addr4: ipaddress.IPv4Address
    asn: int
    cidr6: ipaddress.IPv6Network
    cidr4: ipaddress.IPv4Network
    fabric_port: str  # the uplink's peer, a bridge port in the fabric namespace
    restart_safe: bool = False  # the fabric's port treats BFD going down as a restart (see fabric_bfd)
    # --encrypt: the node's WireGuard device (wireguard-go's socket is machine-wide: one name per lab node)
    wireguard_device: str | None = None

    @property
    def socket(self) -> Path:
        return self.dir / "run" / "flock.sock"

    @property
    def state_dir(self) -> Path:
        return self.dir / "state"

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def bird_conf(self) -> Path:
        return self.dir / "bird.conf"

    @property
    def bird_ctl(self) -> Path:
        return self.dir / "run" / "bird.ctl"

    @property
    def cni_bin(self) -> Path:
        return self.dir / "cni" / "bin"

    @property
    def cni_conf(self) -> Path:
        return self.dir / "cni" / "net.d"

    @property
    def fabric_bfd(self) -> str:
        """How the fabric's session to this node reacts to BFD going down.

        BIRD's BFD runs in the same process as its BGP (RFC 5882: the control
        plane independent bit is clear), so a peer cannot tell a node's BIRD
        restarting from its link dying. Node 1's port is restart-safe
        ("graceful": a BFD failure starts graceful restart, routes stay until
        the node is back or restartTime passes); the other nodes' ports fail
        fast ("on": a BFD failure withdraws at once, and a BIRD restart flaps
        the node's routes for the second it takes). Both are what a ToR
        offers; the lab shows each.  ``up --fabric-bfd graceful`` makes every
        port restart-safe, as a fabric must be for a rolling upgrade to lose
        nothing (``flock-lab upgrade``).
        """
        return "graceful" if self.index == 1 or self.restart_safe else "on"

    @property
    def bgp_password(self) -> str:
        """The lab's TCP MD5 password of this node's session (documentation only: not secret)."""
        return f"flock-lab-{self.name}"

    def node_labels(self) -> dict[str, str]:
        """The labels a kubelet gives its Node (``NODE_LABELS``)."""
        return {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux"}

    def node_addresses(self) -> list[dict[str, str]]:
        """The Node's ``status.addresses``: the fabric addresses, at which pods of
        every node reach this one (the node's only addresses beyond the pods'
        link-local gateway), and its name."""
        return [
            {"type": "InternalIP", "address": str(self.addr6)},
            {"type": "InternalIP", "address": str(self.addr4)},
            {"type": "Hostname", "address": self.name},
        ]

    def node_object(self) -> dict[str, Any]:
        """This node's v1 Node, as its kubelet would register it."""
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": self.node_labels()},
            "spec": {},
            "status": {"addresses": self.node_addresses()},
        }

    def nodeconfig(self) -> dict[str, Any]:
        """This node's NodeConfig object: its blocks, IPv6 by default, BGP to the fabric
        (BFD, TCP MD5 from the lab's Secret, communities that say what each route is)."""
        return {
            "apiVersion": "flock.fritzlab.net/v1alpha1",
            "kind": "NodeConfig",
            "metadata": {"name": self.name},
            "spec": {
                "cidr6": str(self.cidr6),
                "cidr4": str(self.cidr4),
                "families": {"ipv6": True, "ipv4": False},
                # The lab's service range for anycast/addresses (the fabric's own /26 stays out).
                "announceRanges": [str(a) for a in ANNOUNCE_RANGES],
                # Inside the cluster: every node's pod blocks (nodes 1-4 and 5-8) and the fabric segment (the
                # nodes' uplinks); with announceRanges, all of 192.0.2.0/24 but the internet's /26.
                # natOutgoing (IPv4 by default) masquerades only what leaves these.
                "clusterRanges": [str(n) for n in CLUSTER_RANGES],
                "bgp": {
                    "asn": self.asn,
                    "routerID": str(self.addr4),
                    "communities": {
                        "nodeBlock": {"standard": [f"{self.asn}:100"], "large": [f"{self.asn}:1:{self.index}"]},
                        "anycast": {"standard": [f"{self.asn}:200"], "large": [f"{self.asn}:2:{self.index}"]},
                        "addresses": {"standard": [f"{self.asn}:300"]},
                    },
                    "peers": [
                        {
                            "name": "fabric",
                            "address": str(FABRIC6),
                            "asn": FABRIC_ASN,
                            "bfd": {
                                "minRxMs": BFD_INTERVAL_MS,
                                "minTxMs": BFD_INTERVAL_MS,
                                "multiplier": BFD_MULTIPLIER,
                            },
                            "password": {"secretKeyRef": {"name": BGP_SECRET, "key": self.name}},
                        }
                    ],
                },
            },
        }


@attrs.frozen
class LabPlan:
    dir: Path
    id: str
    nodes: tuple[NodePlan, ...]
    uplink_mtu: int = DEFAULT_MTU  # every fabric link's MTU (what the agents detect)
    internet: bool = False  # an "internet" namespace behind the fabric
    fabric_bfd: str = "mixed"  # FABRIC_BFD_MODES: which fabric ports are restart-safe (NodePlan.fabric_bfd)
    encrypt: bool = False  # the agents encrypt pod traffic between nodes (WireGuard over wireguard-go)

    @classmethod
    def make(
        cls,
        directory: Path,
        node_count: int,
        *,
        uplink_mtu: int = DEFAULT_MTU,
        internet: bool = False,
        fabric_bfd: str = "mixed",
        encrypt: bool = False,
    ) -> LabPlan:
        if not 1 <= node_count <= MAX_NODES:
            raise ValueError(
                f"--nodes {node_count}: expected 1..{MAX_NODES} (one /26 of the documentation ranges each)"
            )
        if fabric_bfd not in FABRIC_BFD_MODES:
            raise ValueError(f"--fabric-bfd {fabric_bfd}: expected one of {', '.join(FABRIC_BFD_MODES)}")
        if not MIN_MTU <= uplink_mtu <= MAX_MTU:
            raise ValueError(f"--mtu {uplink_mtu}: expected {MIN_MTU}..{MAX_MTU} (what a NodeConfig's spec.mtu takes)")
        directory = Path(os.path.abspath(directory))
        ident = lab_id(directory)
        nodes = []
        for i in range(1, node_count + 1):
            base4 = ipaddress.IPv4Address("198.51.100.0" if i <= 4 else "203.0.113.0") + 64 * ((i - 1) % 4)
            nodes.append(
                NodePlan(
                    index=i,
                    name=f"node{i}",
                    netns=f"{NS_PREFIX}{ident}-n{i}",
                    dir=directory / "nodes" / f"node{i}",
                    addr6=FABRIC6 + 0x100 + i - 1,  # node1 ::101, node2 ::102 (hex digits)
                    addr4=FABRIC4 + 9 + i,
                    asn=NODE_ASN_BASE + i,
                    cidr6=ipaddress.IPv6Network(f"2001:db8:0:{i:x}::/64"),
                    cidr4=ipaddress.IPv4Network(f"{base4}/26"),
                    fabric_port=f"n{i}",
                    restart_safe=fabric_bfd == "graceful",
                    wireguard_device=f"flwg{ident}n{i}" if encrypt else None,
                )
            )
        return cls(directory, ident, tuple(nodes), uplink_mtu, internet, fabric_bfd, encrypt)

    @property
    def fabric_netns(self) -> str:
        return f"{NS_PREFIX}{self.id}-fabric"

    @property
    def internet_netns(self) -> str | None:
        """The internet's namespace (None: this lab has none)."""
        return f"{NS_PREFIX}{self.id}-inet" if self.internet else None

    @property
    def namespaces(self) -> list[str]:
        """Every namespace the lab itself makes (pods' come and go)."""
        inet = [self.internet_netns] if self.internet_netns is not None else []
        return [self.fabric_netns, *inet, *(n.netns for n in self.nodes)]

    @property
    def pod_netns_prefix(self) -> str:
        return f"{NS_PREFIX}{self.id}-p-"

    @property
    def netns_prefix(self) -> str:
        return f"{NS_PREFIX}{self.id}-"

    @property
    def apiserver_url(self) -> str:
        return f"http://[{FABRIC6}]:{APISERVER_PORT}"

    @property
    def state_file(self) -> Path:
        return self.dir / "lab.json"

    @property
    def fabric_dir(self) -> Path:
        return self.dir / "fabric"

    @property
    def pods_dir(self) -> Path:
        return self.dir / "pods"

    def bgp_secret(self) -> dict[str, Any]:
        """The Secret holding every node's BGP password, as the agents read it."""
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"namespace": AGENT_NAMESPACE, "name": BGP_SECRET},
            "type": "Opaque",
            "stringData": {node.name: node.bgp_password for node in self.nodes},
        }

    def node(self, name: str) -> NodePlan:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)
