"""The services table in the real kernel: real sockets through a node namespace that holds ``inet flock-services``.

A node namespace routes three pod namespaces (a, b: backends; c: a client)
over flock-named veths (/128 and /32 routes, as flock.netlink does) and has
an uplink to a "router" namespace (its default route: a ClusterIP that is not
translated is routed on, as on a real node, and meets the forward hook).
Backends answer each TCP connection and UDP datagram with their own name and
the address the client came from, so a test sees which endpoint answered and
whether it was masqueraded.  The table is compiled from Service and
EndpointSlice objects and loaded with Debian's ``nft``: first whole, then by
:func:`render_update` from what was applied last, so every test after the
first exercises the incremental path too.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import trio

from flock.netns import call_in_netns
from flock.policy._counters import element_counters
from flock.services import (
    TABLE,
    EndpointSlice,
    NodeView,
    Service,
    ServicePortCounts,
    ServicesConfig,
    ServicesTable,
    compile_service,
    compile_table,
    decode_key,
    forget_stale,
    render_full,
    render_update,
    service_connections,
    stale_flows,
)
from flock.services._counters import COUNTED_MAPS
from flock.testing import services as objects
from flock.testing.netns import Netns, NetnsPool
from flock.testing.policy_net import Pod, PolicyNode, stop

pytestmark = pytest.mark.root

NODE = "node-a"
UPLINK6, UPLINK4 = "2001:db8:ff::1", "198.51.100.129"  # the node's side of its uplink
ROUTER6, ROUTER4 = "2001:db8:ff::2", "198.51.100.130"
PODS = {
    "a": ("2001:db8:10::a", "192.0.2.10"),
    "b": ("2001:db8:10::b", "192.0.2.11"),
    "c": ("2001:db8:10::c", "192.0.2.12"),
}
BACKEND_TCP, BACKEND_UDP = 8080, 5353

# Answers every TCP connection and UDP datagram with "<name> <peer address>".
SERVER = textwrap.dedent(
    """
    import selectors, socket, sys
    name = sys.argv[1]
    sel = selectors.DefaultSelector()
    for port, kind in ((int(sys.argv[2]), socket.SOCK_STREAM), (int(sys.argv[3]), socket.SOCK_DGRAM)):
        s = socket.socket(socket.AF_INET6, kind)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("::", port))
        if kind == socket.SOCK_STREAM:
            s.listen(128)
        sel.register(s, selectors.EVENT_READ, kind)
    print("ready", flush=True)
    def who(addr):
        return f"{name} {addr[0].removeprefix('::ffff:')}".encode()
    while True:
        for key, _ in sel.select():
            s = key.fileobj
            if key.data == socket.SOCK_STREAM:
                c, addr = s.accept()
                try:
                    c.sendall(who(addr))
                except OSError:
                    pass
                c.close()
            else:
                data, addr = s.recvfrom(512)
                try:
                    s.sendto(who(addr), addr)
                except OSError:
                    pass
    """
)

# N attempts; one JSON list of what each met: "<name> <peer>", "refused", "timeout" or "error <errno>".
CLIENT = textwrap.dedent(
    """
    import json, socket, sys
    addr, port, proto, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    out = []
    for _ in range(n):
        s = socket.socket(fam, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
        s.settimeout(2.0)
        try:
            s.connect((addr, port))
            if proto == "udp":
                s.send(b"?")
            out.append(s.recv(512).decode())
        except ConnectionRefusedError:
            out.append("refused")
        except TimeoutError:
            out.append("timeout")
        except OSError as exc:
            out.append(f"error {exc.errno}")
        finally:
            s.close()
    print(json.dumps(out))
    """
)

CLUSTER6, CLUSTER4 = "fd00:96::", "203.0.113."
WEB = (CLUSTER6 + "10", CLUSTER4 + "10")
STICKY = (CLUSTER6 + "11", CLUSTER4 + "11")
EMPTY = (CLUSTER6 + "12", CLUSTER4 + "12")
SOLO = (CLUSTER6 + "13", CLUSTER4 + "13")
LOCAL = (CLUSTER6 + "14", CLUSTER4 + "14")
WEB_NODEPORT, LOCAL_NODEPORT = 30080, 30081


def _ports(node_port: int | None = None) -> list[dict[str, Any]]:
    return [
        objects.port("http", 80, target=BACKEND_TCP, node_port=node_port),
        objects.port("dns", 53, protocol="UDP", target=BACKEND_UDP),
    ]


def _slices(service: str, backends: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One slice per family; *backends*: pod name → endpoint keyword arguments (node, ready, …)."""
    ports = [objects.slice_port("http", BACKEND_TCP), objects.slice_port("dns", BACKEND_UDP, "UDP")]
    return [
        objects.endpoint_slice(
            service,
            [objects.endpoint(PODS[pod][family], pod=pod, **kw) for pod, kw in sorted(backends.items())],
            ports,
            address_type=("IPv6", "IPv4")[family],
        )
        for family in (0, 1)
    ]


def cluster_objects(web_backends: dict[str, dict[str, Any]] | None = None) -> tuple[list[Service], list[EndpointSlice]]:
    two = {"a": {}, "b": {}}
    svcs = [
        objects.service("web", WEB, _ports(WEB_NODEPORT), type="NodePort"),
        objects.service("sticky", STICKY, _ports(), affinity_timeout=600),
        objects.service("empty", EMPTY, _ports()),
        objects.service("solo", SOLO, _ports()),
        objects.service("local", LOCAL, _ports(LOCAL_NODEPORT), type="NodePort", etp="Local"),
    ]
    slices = (
        _slices("web", two if web_backends is None else web_backends)
        + _slices("sticky", two)
        + _slices("solo", {"a": {}})
        + _slices("local", {"a": {}, "b": {"node": "node-b"}})  # b stands for a pod on another node
    )
    return [Service.from_object(s) for s in svcs], [EndpointSlice.from_object(s) for s in slices]


@attrs.define
class World:
    node: PolicyNode
    router: Netns
    pods: dict[str, Pod]
    servers: list[subprocess.Popen]
    applied: ServicesTable | None = None
    last_script: str = ""

    def compile(self, web_backends: dict[str, dict[str, Any]] | None = None) -> ServicesTable:
        services, slices = cluster_objects(web_backends)
        view = NodeView(NODE, (ipaddress.ip_address(self.node.node_ip6), ipaddress.ip_address(self.node.node_ip4)))
        config = ServicesConfig(
            pod_cidrs=(ipaddress.ip_network("2001:db8:10::/64"), ipaddress.ip_network("192.0.2.0/24"))
        )
        return compile_table(services, slices, view, config)

    def apply(self, table: ServicesTable) -> str:
        script = render_full(table) if self.applied is None else render_update(self.applied, table)
        assert script is not None
        if script:
            nft(self.node.node, script)
        self.applied, self.last_script = table, script
        return script


def nft(ns: Netns, script: str) -> None:
    done = subprocess.run(
        ["ip", "netns", "exec", ns.name, "nft", "-f", "-"], input=script, capture_output=True, text=True, timeout=30
    )
    if done.returncode != 0:
        raise AssertionError(f"nft refused the script: {done.stderr.strip()}\n{script[:4000]}")


def connect(src: Netns, addr: str, port: int, proto: str, n: int = 1) -> list[str]:
    done = subprocess.run(
        ["ip", "netns", "exec", src.name, sys.executable, "-c", CLIENT, addr, str(port), proto, str(n)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def names(answers: list[str]) -> set[str]:
    return {a.split()[0] for a in answers}


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    if shutil.which("nft") is None:
        pytest.fail("nft not found: these tests load the services table with Debian's nftables package")
    import os

    if os.geteuid() != 0:
        pytest.fail("this test needs root (network namespaces, nftables); CI runs as root")
    with NetnsPool("fl-svc-") as pool:
        node = PolicyNode(pool)
        servers: list[subprocess.Popen] = []
        try:
            # ICMP errors are rate limited per peer: the tests refuse one client many times in a row.
            node.node.run("sysctl", "-qw", "net.ipv4.icmp_ratelimit=0", "net.ipv6.icmp.ratelimit=0")
            pods = {name: node.add_pod(f"default/{name}", ip6, ip4) for name, (ip6, ip4) in PODS.items()}
            router = pool.create("router")
            pool.veth(node.node, "uplink", router, "eth0")
            node.node.ip("-6", "addr", "add", f"{UPLINK6}/64", "dev", "uplink", "nodad")
            node.node.ip("addr", "add", f"{UPLINK4}/25", "dev", "uplink")
            node.node.ip("-6", "route", "add", "default", "via", ROUTER6)
            node.node.ip("route", "add", "default", "via", ROUTER4)
            router.ip("-6", "addr", "add", f"{ROUTER6}/64", "dev", "eth0", "nodad")
            router.ip("addr", "add", f"{ROUTER4}/25", "dev", "eth0")
            router.ip("-6", "route", "add", f"{node.node_ip6}/128", "via", UPLINK6)
            router.ip("route", "add", f"{node.node_ip4}/32", "via", UPLINK4)
            for name in ("a", "b"):
                proc = subprocess.Popen(
                    ["ip", "netns", "exec", pods[name].netns.name, sys.executable, "-c", SERVER, name,
                     str(BACKEND_TCP), str(BACKEND_UDP)],
                    stdout=subprocess.PIPE,
                    text=True,
                )  # fmt: skip
                servers.append(proc)
                assert proc.stdout is not None
                if proc.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"backend {name} did not start")
            w = World(node, router, pods, servers)
            w.apply(w.compile())
            yield w
        finally:
            for proc in servers:
                stop(proc)
            node.close()


@pytest.fixture
def settled(world: World) -> World:
    """The world with every Service as cluster_objects() has it (a test that changes it is undone here)."""
    world.apply(world.compile())
    return world


FAMILIES = pytest.mark.parametrize("family", [0, 1], ids=["ipv6", "ipv4"])


@FAMILIES
@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_cluster_ip_spreads_over_both_backends(settled: World, family: int, proto: str) -> None:
    port = 80 if proto == "tcp" else 53
    answers = connect(settled.pods["c"].netns, WEB[family], port, proto, n=24)
    assert names(answers) == {"a", "b"}, answers
    client = PODS["c"][family]
    assert {a.split()[1] for a in answers} == {client}, "pod → ClusterIP keeps the client's address"


@FAMILIES
@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_no_endpoints_is_refused_at_once(settled: World, family: int, proto: str) -> None:
    port = 80 if proto == "tcp" else 53
    assert connect(settled.pods["c"].netns, EMPTY[family], port, proto, n=3) == ["refused"] * 3


@FAMILIES
def test_a_port_no_service_has_is_refused(settled: World, family: int) -> None:
    assert connect(settled.pods["c"].netns, WEB[family], 81, "tcp") == ["refused"]


@FAMILIES
def test_client_ip_affinity_sticks(settled: World, family: int) -> None:
    answers = connect(settled.pods["c"].netns, STICKY[family], 80, "tcp", n=12)
    assert len(names(answers)) == 1, answers
    assert names(connect(settled.pods["c"].netns, STICKY[family], 53, "udp", n=6)) <= {"a", "b"}


@FAMILIES
def test_node_port_on_the_nodes_address(settled: World, family: int) -> None:
    node_ip = (settled.node.node_ip6, settled.node.node_ip4)[family]
    from_pod = connect(settled.pods["c"].netns, node_ip, WEB_NODEPORT, "tcp", n=16)
    assert names(from_pod) == {"a", "b"}, from_pod
    from_outside = connect(settled.router, node_ip, WEB_NODEPORT, "tcp", n=16)
    assert names(from_outside) == {"a", "b"}, from_outside
    router = (ROUTER6, ROUTER4)[family]
    assert router not in {a.split()[1] for a in from_outside}, "eTP Cluster: traffic from outside is masqueraded"


@FAMILIES
def test_external_traffic_policy_local_keeps_the_client_and_stays_local(settled: World, family: int) -> None:
    node_ip = (settled.node.node_ip6, settled.node.node_ip4)[family]
    answers = connect(settled.router, node_ip, LOCAL_NODEPORT, "tcp", n=10)
    router = (ROUTER6, ROUTER4)[family]
    assert answers == [f"a {router}"] * 10, "only this node's endpoint, client address preserved"
    # from a pod the ClusterIP still reaches every endpoint (iTP Cluster)
    assert names(connect(settled.pods["c"].netns, LOCAL[family], 80, "tcp", n=24)) == {"a", "b"}


@FAMILIES
def test_hairpin_is_masqueraded(settled: World, family: int) -> None:
    own = PODS["a"][family]
    for proto, port in (("tcp", 80), ("udp", 53)):
        answers = connect(settled.pods["a"].netns, SOLO[family], port, proto, n=2)
        assert [a.split()[0] for a in answers] == ["a", "a"], answers
        assert own not in {a.split()[1] for a in answers}, "a pod reaching itself must see the node as its peer"


@FAMILIES
def test_the_node_itself_reaches_a_cluster_ip(settled: World, family: int) -> None:
    answers = connect(settled.node.node, WEB[family], 80, "tcp", n=16)
    assert names(answers) == {"a", "b"}, answers
    assert connect(settled.node.node, EMPTY[family], 80, "tcp") == ["refused"]


def test_an_incremental_update_takes_an_endpoint_out_and_back(world: World) -> None:
    world.apply(world.compile())
    script = world.apply(world.compile({"a": {}, "b": {"ready": False}}))
    # element writes only (per port and family, 2 × 2: the spread element's delete and add, the endpoints
    # going from the numbered map to the one-endpoint map), and the shared chains for one endpoint made
    lines = script.splitlines()
    elements = [line for line in lines if " element " in line]
    assert all(line.split()[4].startswith(("rand", "nprand")) for line in lines if line not in elements), script
    assert len(elements) <= 4 * 4 + 2, script
    for family in (0, 1):
        assert names(connect(world.pods["c"].netns, WEB[family], 80, "tcp", n=12)) == {"a"}
        assert names(connect(world.pods["c"].netns, WEB[family], 53, "udp", n=4)) == {"a"}
    # b terminating but serving, a gone: KEP-1669 falls back to b
    world.apply(world.compile({"b": {"ready": False, "serving": True, "terminating": True}}))
    for family in (0, 1):
        assert names(connect(world.pods["c"].netns, WEB[family], 80, "tcp", n=6)) == {"b"}
    world.apply(world.compile({}))
    for family in (0, 1):
        assert connect(world.pods["c"].netns, WEB[family], 80, "tcp") == ["refused"]
    world.apply(world.compile())
    for family in (0, 1):
        assert names(connect(world.pods["c"].netns, WEB[family], 80, "tcp", n=24)) == {"a", "b"}


def test_network_policy_holds_behind_a_cluster_ip(settled: World) -> None:
    """A Service is never a way around a policy: translated in prerouting, the connection meets the
    backend's ingress rules in ``inet flock``'s forward chain with the backend's own address."""
    from flock.policy import Namespace, NetworkPolicy, PolicyPod, compile_ruleset
    from flock.policy._nft import render_full as render_policy

    w = settled
    only_b_to_a = NetworkPolicy.from_object(
        {
            "metadata": {"namespace": "default", "name": "only-b-to-a"},
            "spec": {"podSelector": {"matchLabels": {"app": "a"}}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "b"}}}]}]},
        }
    )  # fmt: skip
    pods = [
        PolicyPod(
            "default",
            name,
            {"app": name},
            tuple(ipaddress.ip_address(a) for a in PODS[name]),
            node=NODE,
            host_veth=pod.veth,
        )
        for name, pod in w.pods.items()
    ]
    ruleset = compile_ruleset([only_b_to_a], [Namespace("default", {})], pods, pods)
    nft(w.node.node, render_policy(ruleset))
    try:
        for family in (0, 1):
            # solo's one endpoint is pod a: c is refused the ClusterIP as it is refused a itself (dropped: no answer)
            assert connect(w.pods["c"].netns, SOLO[family], 80, "tcp") == ["timeout"]
            assert connect(w.pods["c"].netns, PODS["a"][family], BACKEND_TCP, "tcp") == ["timeout"]
            # b may reach a, through the Service too, and a sees b's own address
            assert connect(w.pods["b"].netns, SOLO[family], 80, "tcp") == [f"a {PODS['b'][family]}"]
        # web's endpoints are a and b: from c only b ever answers
        assert names(connect(w.pods["c"].netns, WEB[0], 80, "tcp", 6)) <= {"b", "timeout"}
    finally:
        nft(w.node.node, "delete table inet flock\n")
    assert connect(w.pods["c"].netns, SOLO[0], 80, "tcp") == [f"a {PODS['c'][0]}"]  # and without it, c gets in


def test_connections_are_counted_per_service_port_across_an_endpoint_flip(settled: World) -> None:
    def counts() -> dict[tuple[str, str, str], ServicePortCounts]:
        per_element = {}
        for name in COUNTED_MAPS:
            raw = call_in_netns(settled.node.node.path, functools.partial(element_counters, TABLE, name))
            per_element.update({(name, decode_key(key)): figures for key, figures in raw.items()})
        assert settled.applied is not None
        return service_connections(per_element, settled.applied.counted)  # type: ignore[arg-type]

    web, empty = ("default", "web", "http"), ("default", "empty", "http")
    before = counts()
    client = settled.pods["c"].netns
    assert len(connect(client, WEB[0], 80, "tcp", n=5) + connect(client, WEB[1], 80, "tcp", n=3)) == 8
    script = settled.apply(settled.compile({"a": {}, "b": {"ready": False}}))
    # element writes (and the shared chains for one endpoint): the ClusterIP's counted element stays
    assert "service-ips" not in script and "flush chain inet flock-services rand" not in script
    assert names(connect(client, WEB[0], 80, "tcp", n=4)) == {"a"}
    assert connect(client, EMPTY[1], 80, "tcp", n=2) == ["refused"] * 2
    after = counts()
    assert after[web].connections - before[web].connections == 12
    assert after[web].rejected == 0
    assert after[empty].rejected - before[empty].rejected == 2 and after[empty].connections == 0


# Sends N datagrams from one socket bound to one source port (one conntrack entry), one JSON list of answers.
FIXED_SOURCE = textwrap.dedent(
    """
    import json, socket, sys
    addr, port, sport, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.bind(("::" if fam == socket.AF_INET6 else "0.0.0.0", sport))
    s.settimeout(2.0)
    out = []
    for _ in range(n):
        s.sendto(b"x", (addr, port))
        try:
            out.append(s.recvfrom(512)[0].decode())
        except OSError as exc:
            out.append(f"error {exc}")
    print(json.dumps(out))
    """
)


def udp_from(src: Netns, addr: str, port: int, sport: int, n: int) -> list[str]:
    done = subprocess.run(
        ["ip", "netns", "exec", src.name, sys.executable, "-c", FIXED_SOURCE, addr, str(port), str(sport), str(n)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@FAMILIES
def test_a_udp_flow_to_a_removed_endpoint_moves_once_its_conntrack_entry_is_forgotten(
    settled: World, family: int
) -> None:
    client, sport = settled.pods["c"].netns, 40100 + family
    first = names(udp_from(client, WEB[family], 53, sport, 3))
    assert len(first) == 1 and first <= {"a", "b"}, first  # one flow, one endpoint
    (chosen,) = first
    other = "b" if chosen == "a" else "a"
    web = {"a": {}, "b": {}}
    web[chosen] = {"ready": False}
    services, before = cluster_objects()
    _, after = cluster_objects(web)
    node = NodeView(NODE, (ipaddress.ip_address(settled.node.node_ip6), ipaddress.ip_address(settled.node.node_ip4)))
    config = ServicesConfig()
    (svc,) = [s for s in services if s.name == "web"]
    old, new = (compile_service(svc, [s for s in eps if s.service == "web"], node, config) for eps in (before, after))
    assert old is not None and new is not None
    stale = stale_flows(old.udp, new.udp)
    # the UDP port of both families loses the endpoint (the TCP port needs nothing)
    assert {(s.address, s.port, s.endpoint) for s in stale} == {
        (ipaddress.ip_address(WEB[f]), 53, ipaddress.ip_address(PODS[chosen][f])) for f in (0, 1)
    }
    settled.apply(settled.compile(web))
    # the entry outlives the endpoint: the flow still reaches it (its server still runs)
    assert names(udp_from(client, WEB[family], 53, sport, 2)) == {chosen}
    deleted = call_in_netns(settled.node.node.path, functools.partial(forget_stale, stale))
    assert deleted >= 1
    assert names(udp_from(client, WEB[family], 53, sport, 3)) == {other}


def test_both_backends_read_the_same_element_counters(settled: World) -> None:
    from flock.policy import LibNftables, NftCommand

    assert connect(settled.pods["c"].netns, WEB[0], 80, "tcp", n=3)
    node = settled.node.node

    async def read() -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
        lib = LibNftables(node.path)
        try:
            fast = await lib.element_counters(TABLE, "service-ips6", decode_key)
        finally:
            lib.close()
        slow = await NftCommand(("ip", "netns", "exec", node.name, "nft")).element_counters(
            TABLE, "service-ips6", decode_key
        )
        return fast, slow

    fast, slow = trio.run(read)
    assert fast == slow and fast[f"{WEB[0]} . tcp . 80"][0] >= 3, (fast, slow)

    async def tables() -> list[bool]:
        lib, cmd = LibNftables(node.path), NftCommand(("ip", "netns", "exec", node.name, "nft"))
        try:
            return [await b.has_table(t) for b in (lib, cmd) for t in (TABLE, "no-such-table")]
        finally:
            lib.close()

    assert trio.run(tables) == [True, False, True, False]
    assert set(fast) == {k for k, _ in settled.applied.elements["service-ips6"]}  # type: ignore[union-attr]
