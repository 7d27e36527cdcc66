"""natOutgoing in the real kernel: what leaves the cluster is masqueraded, pod ↔ pod is not.

A node namespace routes two pod namespaces (flock-named veths) and has an
uplink to an "internet" namespace that routes only the node's uplink
address back (never the pod block): a pod reaches the internet only when
natOutgoing masquerades it.  A UDP echo in the internet namespace and in a
pod reports the source address it saw.  The table is the policy service's
(`PolicyService` with the NodeConfig's natOutgoing, libnftables or nft).
"""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import attrs
import pytest
import trio

from flock.model import NodeConfig
from flock.policy import Kind, NetworkPolicy, NftApplier, PolicyInputs, PolicyService, Protocol, compile_ruleset
from flock.policy import PolicyPod as PolicyPodValue
from flock.policy._apply import nft_available
from flock.policy._backend import NftCommand
from flock.policy._ruleset import HostPort
from flock.policy._service import nat_plan
from flock.testing.netns import Netns, NetnsPool
from flock.testing.policy import MemoryLocalPods
from flock.testing.policy_net import Pod, PolicyNode, probe, stop

pytestmark = pytest.mark.root

UPLINK6, UPLINK4 = "2001:db8:ff::1", "203.0.113.1"  # the node's side of its uplink
INTERNET6, INTERNET4 = "2001:db8:ff::2", "203.0.113.2"

# Answers each UDP datagram with the source address it came from.
WHO = textwrap.dedent(
    """
    import socket
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", 7))
    print("ready", flush=True)
    while True:
        data, addr = s.recvfrom(512)
        try:
            s.sendto(addr[0].removeprefix("::ffff:").encode(), addr)
        except OSError:  # no route back (the point of the test): the asker hears nothing
            pass
    """
)
ASK = textwrap.dedent(
    """
    import socket, sys
    host = sys.argv[1]
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1.0)
    s.sendto(b"?", (host, 7))
    try:
        print(s.recvfrom(512)[0].decode())
    except OSError:
        print("no answer")
    """
)


@attrs.define
class World:
    node: PolicyNode
    internet: Netns
    pods: dict[str, Pod]
    servers: list[subprocess.Popen]


def _serve_who(ns: Netns, servers: list[subprocess.Popen]) -> None:
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns.name, sys.executable, "-c", WHO], stdout=subprocess.PIPE, text=True
    )
    servers.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"


def _ask(src: Netns, host: str) -> str:
    done = ns_run(src, ASK, host)
    return done.stdout.strip()


def ns_run(ns: Netns, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", ns.name, sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )


@pytest.fixture
def world(require_root: None) -> Iterator[World]:
    missing = nft_available()
    if missing:
        pytest.fail(missing)
    with NetnsPool("fl-nat-") as pool:
        node = PolicyNode(pool)
        servers: list[subprocess.Popen] = []
        try:
            internet = pool.create("inet")
            pool.veth(node.node, "uplink", internet, "eth0")
            for ns, (a6, a4) in ((node.node, (UPLINK6, UPLINK4)), (internet, (INTERNET6, INTERNET4))):
                ns.ip("-6", "addr", "add", f"{a6}/64", "dev", "uplink" if ns is node.node else "eth0", "nodad")
                ns.ip("addr", "add", f"{a4}/24", "dev", "uplink" if ns is node.node else "eth0")
            node.node.ip("-6", "route", "add", "default", "via", INTERNET6)
            node.node.ip("route", "add", "default", "via", INTERNET4)
            # The internet knows the node's uplink subnet and nothing of the pod blocks.
            pods = {
                "x/a": node.add_pod("x/a", "2001:db8:1::a", "192.0.2.10", serve=("80/tcp", "80/udp")),
                "x/b": node.add_pod("x/b", "2001:db8:1::b", "192.0.2.11"),
            }
            _serve_who(internet, servers)
            _serve_who(pods["x/b"].netns, servers)
            yield World(node, internet, pods, servers)
        finally:
            for proc in servers:
                stop(proc)
            node.close()


def _config(**spec: object) -> NodeConfig:
    base = {"cidr6": "2001:db8:1::/64", "cidr4": "192.0.2.0/24"}
    return NodeConfig.from_object({"metadata": {"name": "n1"}, "spec": {**base, **spec}})


def test_the_plan_follows_the_nodeconfig() -> None:
    default = nat_plan(_config(clusterRanges=["198.51.100.0/24", "2001:db8::/32"]))
    assert [(n.family, [str(s) for s in n.sources]) for n in default] == [(4, ["192.0.2.0/24"])]
    assert [str(e) for e in default[0].exempt] == ["192.0.2.0/24", "198.51.100.0/24"]
    both = nat_plan(_config(natOutgoing={"ipv6": True}, announceRanges=["2001:db8:1::/48"]))
    assert [n.family for n in both] == [6, 4] and [str(e) for e in both[0].exempt] == ["2001:db8:1::/48"]
    assert nat_plan(_config(natOutgoing={"ipv4": False})) == () and nat_plan(None) == ()


async def test_pods_reach_outside_only_masqueraded_and_keep_their_address_inside(world: World) -> None:
    w = world
    a, b = w.pods["x/a"], w.pods["x/b"]
    config = {"value": _config(natOutgoing={"ipv4": False})}
    inputs = PolicyInputs()
    for kind in (Kind.NETWORK_POLICY, Kind.NAMESPACE, Kind.POD, Kind.CLUSTER_POLICY):
        inputs.replace(kind, {})
    local = MemoryLocalPods()
    applier = NftApplier(NftCommand(("ip", "netns", "exec", w.node.node.name, "nft")))
    service = PolicyService(
        inputs, local, applier, "n1", lambda cid: cid, rand=lambda: 0.0, nodeconfig=lambda: config["value"]
    )

    async def settle(want_nat: bool) -> None:
        local.touched()  # the NodeConfig changed: NodeState's version moves
        with trio.fail_after(10):
            # (the applier has no change signal of its own: poll what it holds)
            while applier.applied is None or bool(applier.applied.nat) != want_nat:  # noqa: ASYNC110
                await trio.sleep(0.05)

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await settle(False)
            # natOutgoing off: the internet answers the pod's own address, which it cannot route back
            assert await trio.to_thread.run_sync(_ask, a.netns, INTERNET4) == "no answer"
            assert await trio.to_thread.run_sync(_ask, a.netns, b.ip4) == a.ip4

            config["value"] = _config(natOutgoing={"ipv4": True, "ipv6": True}, clusterRanges=["198.51.100.0/24"])
            await settle(True)
            # on: masqueraded to the node's uplink address, both families
            assert await trio.to_thread.run_sync(_ask, a.netns, INTERNET4) == UPLINK4
            assert await trio.to_thread.run_sync(_ask, a.netns, INTERNET6) == UPLINK6
            # pod ↔ pod keeps its source (the block is exempt), as seen by the receiving pod
            assert await trio.to_thread.run_sync(_ask, a.netns, b.ip4) == a.ip4
            assert await trio.to_thread.run_sync(_ask, a.netns, b.ip6) == a.ip6
            assert ipaddress.ip_address(a.ip4) in ipaddress.ip_network("192.0.2.0/24")

            config["value"] = _config(natOutgoing={"ipv4": False})
            await settle(False)
            assert await trio.to_thread.run_sync(_ask, a.netns, INTERNET4) == "no answer"
            nursery.cancel_scope.cancel()
    listing = w.node.node.run("nft", "list", "tables").stdout
    assert "inet flock" not in listing  # nothing isolated, no NAT: no table at all


async def test_host_ports_reach_the_pod_from_outside_the_node_itself_and_its_pods(world: World) -> None:
    """hostPort DNAT in the table: from another machine (the internet namespace, to the uplink address), from
    the node itself (output hook), from a pod on the node, and from the pod itself (hairpin, masqueraded);
    a hostIP mapping answers on that address only; NetworkPolicy still applies to what comes in through it;
    removed mappings are gone (an incremental change: the chain flushed and refilled)."""
    w = world
    a, b = w.pods["x/a"], w.pods["x/b"]
    applier = NftApplier(NftCommand(("ip", "netns", "exec", w.node.node.name, "nft")))
    maps = (
        HostPort(8080, Protocol.TCP, ipaddress.ip_address(a.ip6), 80),
        HostPort(8080, Protocol.TCP, ipaddress.ip_address(a.ip4), 80),
        HostPort(5353, Protocol.UDP, ipaddress.ip_address(a.ip4), 80),
        HostPort(9090, Protocol.TCP, ipaddress.ip_address(a.ip4), 80, host_ip=ipaddress.ip_address(UPLINK4)),
    )

    def reach(src: Netns, addr: str, port: int, proto: str = "tcp") -> bool:
        return probe(src, addr, port, proto)

    with trio.fail_after(120):
        from flock.policy import Ruleset

        assert (await applier.apply(Ruleset(hostports=tuple(sorted(maps, key=HostPort.sort_key))))).mode == "full"
        cases = [
            (w.internet, UPLINK6, 8080, "tcp"),
            (w.internet, UPLINK4, 8080, "tcp"),
            (w.internet, UPLINK4, 5353, "udp"),
            (w.internet, UPLINK4, 9090, "tcp"),
            (w.node.node, UPLINK4, 8080, "tcp"),  # the node itself: the output hook
            (w.node.node, UPLINK6, 8080, "tcp"),
            (b.netns, UPLINK4, 8080, "tcp"),  # a pod on the node
            (a.netns, UPLINK4, 8080, "tcp"),  # the pod itself: hairpin
            (a.netns, UPLINK6, 8080, "tcp"),
        ]
        for src, addr, port, proto in cases:
            assert await trio.to_thread.run_sync(reach, src, addr, port, proto), (src.name, addr, port, proto)
        # the node's localhost is not mapped: a service of its own on 8080 keeps answering there
        w.node.serve(("8080/tcp",))
        for loopback in ("127.0.0.1", "::1"):
            assert await trio.to_thread.run_sync(reach, w.node.node, loopback, 8080, "tcp"), loopback
        # 9090 is mapped on the IPv4 uplink address only; nothing else listens on the node
        assert not await trio.to_thread.run_sync(reach, w.internet, UPLINK6, 9090, "tcp")
        assert not await trio.to_thread.run_sync(reach, w.internet, UPLINK4, 7070, "tcp")

        # NetworkPolicy applies to what arrives through a hostPort: x/a isolated for ingress, nothing allowed
        deny = NetworkPolicy.from_object({"metadata": {"namespace": "x", "name": "deny"}, "spec": {"podSelector": {}}})
        local = [
            PolicyPodValue(
                "x", "a", addresses=(ipaddress.ip_address(a.ip6), ipaddress.ip_address(a.ip4)), host_veth=a.veth
            )
        ]
        rs = compile_ruleset([deny], [], local, local)
        assert (
            await applier.apply(attrs.evolve(rs, hostports=tuple(sorted(maps, key=HostPort.sort_key))))
        ).mode == "incremental"
        assert not await trio.to_thread.run_sync(reach, w.internet, UPLINK4, 8080, "tcp")
        assert await trio.to_thread.run_sync(reach, w.node.node, UPLINK4, 8080, "tcp")  # the node: always

        # mappings removed: an incremental change
        assert (await applier.apply(attrs.evolve(rs, hostports=maps[:1]))).mode == "incremental"
        listing = w.node.node.run("nft", "list", "map", "inet", "flock", "hp-any-6").stdout
        assert f"tcp . 8080 : {a.ip6} . 80" in listing, listing
        for name in ("hp-any-4", "hp-ip-4", "hp-ip-6"):
            listing = w.node.node.run("nft", "list", "map", "inet", "flock", name).stdout
            assert "elements" not in listing, listing
        assert not await trio.to_thread.run_sync(reach, w.node.node, UPLINK4, 9090, "tcp")
        await applier.remove()
