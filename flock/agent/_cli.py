"""flock-agent's command line → :class:`AgentSettings` (frozen; every service reads its part)."""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from flock import cni_common
from flock.model import DEFAULT_NETWORK

DEFAULT_SOCKET = Path(cni_common.DEFAULT_SOCKET)  # where the shim dials by default
DEFAULT_STATE_DIR = Path("/var/lib/flock")
DEFAULT_HEALTH_ADDRESS = ("127.0.0.1", 9464)
DEFAULT_BIRD_CONFIG = Path("/etc/flock/bird/bird.conf")
DEFAULT_BIRD_SOCKET = Path("/run/flock/bird.ctl")


@attrs.frozen
class AgentSettings:
    node: str
    socket: Path = DEFAULT_SOCKET
    state_dir: Path = DEFAULT_STATE_DIR
    kubeconfig: Path | None = None  # None: in-cluster config (used by the watchers)
    health_address: tuple[str, int] = DEFAULT_HEALTH_ADDRESS
    bird: bool = True  # False: no BIRD on this node (nothing is rendered or reloaded)
    bird_config: Path = DEFAULT_BIRD_CONFIG
    bird_socket: Path = DEFAULT_BIRD_SOCKET
    bgp_lab_timers: bool = False  # short BGP timers (labs, tests)
    host_netns: str | None = None  # the node's network namespace (None: the agent's own)
    uplink: str | None = None  # interface for the pod gateway's route if the node has none
    namespace: str = "kube-system"  # the agent's own namespace: where BGP password Secrets are read
    admin_socket: Path | None = None  # flockctl's socket (None: admin.sock beside --socket)
    # The CNI network name flock-install-cni wrote (--network-name): rows stored before schema v2 take it.
    network_name: str = DEFAULT_NETWORK
    service_proxy: bool = False  # flock translates Services (kube-proxy's job); off: its table is removed
    # externalIPs and load-balancer addresses are translated only inside these (CVE-2020-8554)
    service_external_cidrs: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    # the ClusterIP ranges announced over BGP (as they are: aggregates), from every node
    announce_cluster_ip_ranges: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    # an eTP Cluster Service without an endpoint anywhere: its routes withdrawn (or kept: --keep-...)
    withdraw_without_endpoints: bool = True
    # leaving (SIGTERM, cordoned, excluded from load balancers): Service routes with GRACEFUL_SHUTDOWN this long
    bgp_leave_seconds: float = 5.0
    # NetworkPolicy peers: "pods" (every Pod of the cluster, watched by every agent) or "groups" (this
    # node's pods and the address groups flock-controller writes for it: issue 35)
    policy_peers: str = "pods"
    # Encryption between nodes (issue 36, docs/encryption.md): "off" or "wireguard", the same on every node.
    encryption: str = "off"
    wireguard_device: str = "flock-wg"  # the interface's name (a lab gives each node its own)
    wireguard_port: int = 51820  # every node's UDP port (cluster-wide)
    wireguard_fabric: int = 6  # the family of the node addresses the tunnel runs over
    wireguard_table: int = 71  # the routing table of the routes through the device
    wireguard_rule_priority: int = 99  # the rules sending this node's pods' traffic to that table
    wireguard_kind: str = "auto"  # auto (kernel module, else wireguard-go), kernel, userspace
    # nodes whose pods may be reached in the clear (a migration: nodes not encrypting yet)
    allow_plaintext_to: tuple[str, ...] = ()

    @property
    def admin_path(self) -> Path:
        return self.admin_socket if self.admin_socket is not None else self.socket.parent / "admin.sock"


def _service_account_namespace() -> str | None:
    try:
        return Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text().strip() or None
    except OSError:
        return None


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:9464 or [::1]:9464")
    return host, int(port)


def _network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text[:64]!r}: expected a CIDR ({exc})") from None


def parse_args(argv: Sequence[str] | None, environ: Mapping[str, str]) -> tuple[AgentSettings, argparse.Namespace]:
    """The settings and the parsed flags (logging flags are not settings); exits 2 on a bad flag."""
    parser = argparse.ArgumentParser(prog="flock-agent", description="flock's node agent")
    parser.add_argument("--node", default=environ.get("NODE_NAME"), help="this node's name (default: $NODE_NAME)")
    parser.add_argument("--socket", type=Path, default=DEFAULT_SOCKET, help="CNI RPC socket (default: %(default)s)")
    parser.add_argument(
        "--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="allocation store directory (default: %(default)s)"
    )
    parser.add_argument("--kubeconfig", type=Path, default=None, help="kubeconfig file (default: in-cluster)")
    parser.add_argument(
        "--health-address",
        type=_host_port,
        default=DEFAULT_HEALTH_ADDRESS,
        metavar="HOST:PORT",
        help="/healthz, /readyz and /metrics (default: 127.0.0.1:9464)",
    )
    parser.add_argument(
        "--bird-config", type=Path, default=DEFAULT_BIRD_CONFIG, help="rendered BIRD config (default: %(default)s)"
    )
    parser.add_argument(
        "--bird-socket", type=Path, default=DEFAULT_BIRD_SOCKET, help="BIRD control socket (default: %(default)s)"
    )
    parser.add_argument("--no-bird", action="store_true", help="no BIRD on this node: render and reload nothing")
    parser.add_argument(
        "--bgp-lab-timers", action="store_true", help="short BGP timers (labs and tests, not production)"
    )
    parser.add_argument(
        "--host-netns",
        default=None,
        metavar="PATH",
        help="network namespace holding the node's interfaces and routes (default: the agent's own)",
    )
    parser.add_argument(
        "--uplink",
        default=None,
        metavar="IFACE",
        help="interface for a route to the pod gateway 169.254.1.1 when the node has none",
    )
    parser.add_argument(
        "--admin-socket",
        type=Path,
        default=None,
        metavar="PATH",
        help="flockctl's admin socket, 0600, local only (default: admin.sock beside --socket)",
    )
    parser.add_argument(
        "--namespace",
        default=environ.get("POD_NAMESPACE") or _service_account_namespace() or "kube-system",
        help="the agent's namespace, where BGP password Secrets are read "
        "(default: $POD_NAMESPACE, else the service account's, else kube-system)",
    )
    parser.add_argument(
        "--network-name",
        default=environ.get("FLOCK_NETWORK_NAME", DEFAULT_NETWORK),
        help="the network name flock-install-cni was given (default: $FLOCK_NETWORK_NAME or %(default)s): "
        "allocations stored before flock recorded one (schema v1) take it",
    )
    parser.add_argument(
        "--service-proxy",
        action="store_true",
        default=environ.get("FLOCK_SERVICE_PROXY", "").lower() in ("1", "true", "yes"),
        help="translate Services in nftables (table inet flock-services) instead of kube-proxy; refused while "
        "kube-proxy's rules are on the node (default: $FLOCK_SERVICE_PROXY, else off; off removes the table)",
    )
    parser.add_argument(
        "--service-external-cidr",
        action="append",
        type=_network,
        default=[],
        metavar="CIDR",
        help="externalIPs and load-balancer addresses are translated only inside these (repeatable; "
        "none: no such address is translated)",
    )
    parser.add_argument(
        "--announce-cluster-ip-range",
        action="append",
        type=_network,
        default=[],
        metavar="CIDR",
        help="announce this ClusterIP range (the API server's --service-cluster-ip-range) over BGP from every "
        "node, so routers outside the cluster reach ClusterIPs (repeatable; with --service-proxy)",
    )
    parser.add_argument(
        "--keep-service-routes-without-endpoints",
        action="store_true",
        help="keep announcing an externalTrafficPolicy: Cluster Service's addresses while it has no endpoint "
        "anywhere (default: withdrawn on every node, so the fabric fails over to another announcement instead "
        "of sending clients to nodes that would refuse them)",
    )
    parser.add_argument(
        "--bgp-leave-seconds",
        type=float,
        default=5.0,
        metavar="S",
        help="a leaving node (agent stopping, node cordoned or labelled node.kubernetes.io/exclude-from-external-"
        "load-balancers) announces its Service routes with the graceful-shutdown community (RFC 8326) this "
        "long before it withdraws them (default: %(default)s)",
    )
    parser.add_argument(
        "--policy-peers",
        choices=("pods", "groups"),
        default=environ.get("FLOCK_POLICY_PEERS", "pods"),
        help="where NetworkPolicy peers come from: 'pods' watches every Pod of the cluster; 'groups' watches "
        "this node's pods and the AddressGroups flock-controller writes for it (needs flock-controller; "
        "default: $FLOCK_POLICY_PEERS, else %(default)s)",
    )
    parser.add_argument(
        "--encryption",
        choices=["off", "wireguard"],
        default=environ.get("FLOCK_ENCRYPTION", "off"),
        help="encrypt pod traffic between nodes with WireGuard, fail closed: pod traffic to another node's pod "
        "blocks leaves through the tunnel or is dropped (default: $FLOCK_ENCRYPTION, else off; off removes flock's "
        "rules, routes and guard table)",
    )
    parser.add_argument(
        "--wireguard-device", default="flock-wg", metavar="NAME", help="the WireGuard interface (default: %(default)s)"
    )
    parser.add_argument(
        "--wireguard-port", type=int, default=51820, metavar="PORT", help="WireGuard's UDP port on every node"
    )
    parser.add_argument(
        "--wireguard-fabric",
        type=int,
        choices=[6, 4],
        default=6,
        help="the family of the node addresses the tunnel runs over (default: %(default)s)",
    )
    parser.add_argument(
        "--wireguard-kind",
        choices=["auto", "kernel", "userspace"],
        default="auto",
        help="the kernel module, wireguard-go, or the module where the kernel has it (default: %(default)s)",
    )
    parser.add_argument(
        "--wireguard-table",
        type=int,
        default=71,
        metavar="N",
        help="the routing table of the routes through the device, looked up for traffic from this node's pod "
        "blocks (default: %(default)s; one no other software on the node uses)",
    )
    parser.add_argument(
        "--wireguard-rule-priority",
        type=int,
        default=99,
        metavar="N",
        help="the priority of the rules that send this node's pods' traffic to that table (default: %(default)s; "
        "below the main table's 32766)",
    )
    parser.add_argument(
        "--allow-plaintext-to",
        action="append",
        default=[n.strip() for n in environ.get("FLOCK_ALLOW_PLAINTEXT_TO", "").split(",") if n.strip()],
        metavar="NODE",
        help="a node whose pods this node may reach in the clear (repeatable; a migration to encryption), or '*' "
        "for every node that has published no WireGuard key yet (switching a running cluster on node by node): "
        "every other node's pod blocks are reachable through the tunnel only (default: $FLOCK_ALLOW_PLAINTEXT_TO, "
        "comma-separated, else none)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="json", choices=["json", "text"])
    args = parser.parse_args(argv)
    if not args.node:
        parser.error("--node is required (or set NODE_NAME)")
    if not 0 <= args.bgp_leave_seconds <= 600:
        parser.error(f"--bgp-leave-seconds {args.bgp_leave_seconds}: expected 0..600")
    if not args.socket.is_absolute():
        parser.error(f"--socket {args.socket}: expected an absolute path")
    if args.kubeconfig is not None and not os.access(args.kubeconfig, os.R_OK):
        parser.error(f"--kubeconfig {args.kubeconfig}: not a readable file")
    name = args.network_name
    if not (0 < len(name) <= 253 and name[0].isalnum() and all(c.isalnum() or c in "_.-" for c in name)):
        parser.error(f"--network-name {name[:64]!r}: expected a CNI network name (letters, digits, '_', '.', '-')")
    if args.host_netns is not None and not os.path.exists(args.host_netns):
        parser.error(f"--host-netns {args.host_netns}: no such namespace file")
    if args.admin_socket is not None and (not args.admin_socket.is_absolute() or args.admin_socket == args.socket):
        parser.error(f"--admin-socket {args.admin_socket}: expected an absolute path other than --socket")
    if not 1 <= args.wireguard_port <= 65535:
        parser.error(f"--wireguard-port {args.wireguard_port}: expected 1..65535")
    # 0 (unspec), 253 (default), 254 (main) and 255 (local) are the kernel's
    if not 1 <= args.wireguard_table <= 2**32 - 1 or args.wireguard_table in (253, 254, 255):
        parser.error(f"--wireguard-table {args.wireguard_table}: expected 1..4294967295, not 253, 254 or 255")
    if not 1 <= args.wireguard_rule_priority < 32766:
        parser.error(f"--wireguard-rule-priority {args.wireguard_rule_priority}: expected 1..32765 (before main)")
    device = args.wireguard_device
    if not (0 < len(device) <= 15 and all(c.isalnum() or c in "_.-" for c in device)):
        parser.error(f"--wireguard-device {device[:20]!r}: expected an interface name (1-15 letters, digits, _.-)")
    for flag, path in (("--bird-config", args.bird_config), ("--bird-socket", args.bird_socket)):
        if not path.is_absolute():
            parser.error(f"{flag} {path}: expected an absolute path")
    settings = AgentSettings(
        node=args.node,
        socket=args.socket,
        state_dir=args.state_dir,
        kubeconfig=args.kubeconfig,
        health_address=args.health_address,
        bird=not args.no_bird,
        bird_config=args.bird_config,
        bird_socket=args.bird_socket,
        bgp_lab_timers=args.bgp_lab_timers,
        host_netns=args.host_netns,
        uplink=args.uplink,
        admin_socket=args.admin_socket,
        namespace=args.namespace,
        network_name=args.network_name,
        service_proxy=args.service_proxy,
        service_external_cidrs=tuple(args.service_external_cidr),
        bgp_leave_seconds=args.bgp_leave_seconds,
        announce_cluster_ip_ranges=tuple(args.announce_cluster_ip_range),
        withdraw_without_endpoints=not args.keep_service_routes_without_endpoints,
        policy_peers=args.policy_peers,
        encryption=args.encryption,
        wireguard_device=device,
        wireguard_port=args.wireguard_port,
        wireguard_fabric=args.wireguard_fabric,
        wireguard_table=args.wireguard_table,
        wireguard_rule_priority=args.wireguard_rule_priority,
        wireguard_kind=args.wireguard_kind,
        allow_plaintext_to=tuple(args.allow_plaintext_to),
    )
    return settings, args
