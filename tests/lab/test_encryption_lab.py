"""WireGuard between nodes on a lab (issue 36), checked the way Cilium's connectivity test checks it: a
capture on the fabric link (an AF_PACKET socket on node2's port of the fabric's bridge) while pods on
two nodes talk.

- Without encryption (a plain lab of its own) the capture sees pod ↔ pod packets in the clear, both
  families: the probe can see plaintext.
- With ``flock-lab up --encrypt`` (every agent ``--encryption wireguard`` over wireguard-go) it sees
  none, only WireGuard datagrams; node ↔ pod traffic and BGP stay outside the tunnel.
- Then, each under a stream of connections between the two pods: node2's key missing (its agent
  stopped, its published key removed), a rotation of node2's key, and node2's agent killed and started
  again by the lab's keeper.  Nothing in the clear in any of them; each stream's loss is printed
  (``pytest -s``) and bounded: none for a rotation or a restart, and for the missing key, what the
  guard dropped (counted by ``plaintext-dropped``) and nothing more once the key is back.

Slow for the main suite (two labs): marked ``encryption``; .ci/run's encryption stage runs it
(``pytest -n 0 -m encryption tests/lab/test_encryption_lab.py``).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from flock.lab import LabPlan, down, load_pods
from flock.lab._fabric import established
from flock.lab._lifecycle import agent_ready
from flock.lab._nsio import run_in
from flock.lab._plan import NodePlan
from flock.lab._ports import PortSpec
from flock.lab._probe import Endpoint, ProbeResult, endpoint_for, probe_one
from flock.lab._state import process_refs, require_state
from flock.lab._stream import StreamResult, stream_between
from flock.lab.cli import main
from flock.testing.wireguard import WireTally, tap

pytestmark = pytest.mark.encryption

HTTP = PortSpec(8080, "TCP")
RATE = 50.0  # connections a second in each stream


def _require_root_and_tools(*tools: str) -> None:
    if os.geteuid() != 0:
        pytest.fail("the lab needs root (network namespaces, veths, nftables, /dev/net/tun); CI runs as root")
    for tool in ("bird", "birdc", "nft", *tools):
        if shutil.which(tool) is None:
            pytest.fail(
                f"{tool} not found: scripts/bootstrap installs bird2, nftables, wireguard-go and wireguard-tools"
            )


def _lab(prefix: str, *flags: str) -> Iterator[LabPlan]:
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir="/run"))  # short: unix socket paths
    try:
        assert main(["up", "--nodes", "2", *flags, "--dir", str(directory)]) == 0
        for node, pod in (("node1", "enc/a"), ("node2", "enc/b"), ("node1", "enc/c")):
            argv = ["pod", "add", node, pod, "--port", "http=8080/TCP", "--label", f"app={pod[-1]}"]
            assert main([*argv, "--dir", str(directory)]) == 0
        yield require_state(directory).plan
    finally:
        trio.run(down, directory)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def encrypted() -> Iterator[LabPlan]:
    _require_root_and_tools("wireguard-go", "wg")
    yield from _lab("flab-w-", "--encrypt", "--internet")


@pytest.fixture
def plain() -> Iterator[LabPlan]:
    _require_root_and_tools()
    yield from _lab("flab-p-")


def ends(lab: LabPlan) -> tuple[Endpoint, Endpoint]:
    pods = load_pods(lab)
    return endpoint_for(lab, "enc/a", pods, source=True), endpoint_for(lab, "enc/b", pods, source=False)


def fabric_tap(lab: LabPlan, node: str = "node2") -> Any:
    """The capture on *node*'s fabric link (its port of the fabric's bridge)."""
    blocks = [str(b) for n in lab.nodes for b in (n.cidr6, n.cidr4)]
    return tap(lab.fabric_netns, lab.node(node).fabric_port, blocks)


async def probes(lab: LabPlan, count: int) -> list[ProbeResult]:
    """*count* connections each way between the two pods, in each family."""
    a, b = ends(lab)
    pods = load_pods(lab)
    back_src, back_dst = endpoint_for(lab, "enc/b", pods, source=True), endpoint_for(lab, "enc/a", pods, source=False)
    out = []
    for _ in range(count):
        for family in (6, 4):
            out.append(await probe_one(a, b, HTTP, family, peer=True))
            out.append(await probe_one(back_src, back_dst, HTTP, family, peer=True))
    return out


async def flockctl(node: NodePlan, *args: str) -> dict[str, Any]:
    argv = [
        str(Path(sys.executable).parent / "flockctl"),
        *args,
        "--json",
        "--socket",
        str(node.dir / "run/admin.sock"),
    ]
    proc = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
    assert proc.returncode == 0, f"flockctl {' '.join(args)} on {node.name}: {proc.stderr.decode()}"
    return json.loads(proc.stdout)


async def encryption_of(node: NodePlan) -> dict[str, Any]:
    status: dict[str, Any] = (await flockctl(node, "status"))["encryption"]
    return status


async def kubectl(lab: LabPlan, *args: str, stdin: str | None = None) -> str:
    binary = shutil.which("kubectl")
    assert binary is not None, "kubectl not found (installed on every machine here)"
    argv = [binary, f"--kubeconfig={lab.dir / 'kubeconfig'}", "--request-timeout=10s", *args]
    data = None if stdin is None else stdin.encode()
    proc = await trio.run_process(argv, stdin=data, capture_stdout=True, capture_stderr=True, check=False)
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr.decode()}"
    return proc.stdout.decode()


async def published_key(lab: LabPlan, node: str) -> str:
    return await kubectl(lab, "get", "nodeconfig", node, "-o", "jsonpath={.status.wireguard.publicKey}")


async def until(condition: Any, what: str, seconds: float = 20) -> None:
    with trio.move_on_after(seconds):
        while not await condition():  # noqa: ASYNC110  another process's state: polled
            await trio.sleep(0.1)
        return
    pytest.fail(f"not within {seconds:g} s: {what}")


@asynccontextmanager
async def stream(lab: LabPlan, family: int = 6) -> AsyncIterator[list[StreamResult]]:
    """Connections from enc/a to enc/b at :data:`RATE` a second while the block runs (and 1 s before
    it, 2 s after); the result in the list yielded, once the block is over."""
    a, b = ends(lab)
    done = trio.Event()
    outcome: list[StreamResult] = []

    async def run() -> None:
        outcome.append(await stream_between(a, b, HTTP, family, rate=RATE, until=done))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await trio.sleep(1)
        yield outcome
        await trio.sleep(2)
        done.set()


def _no_plaintext(tally: WireTally) -> None:
    assert tally.plaintext == 0, f"pod ↔ pod packets in the clear on the fabric: {tally.summary()}"


async def test_the_capture_sees_pod_traffic_in_the_clear_without_encryption(plain: LabPlan) -> None:
    """The probe can see plaintext: the same capture and traffic as below, on a lab without encryption."""
    with trio.fail_after(60):
        async with fabric_tap(plain) as tally:
            results = await probes(plain, 5)
    assert all(r.connected for r in results), [r for r in results if not r.connected]
    print(f"without encryption: {tally.summary()}")
    assert tally.plaintext_by_family[6] > 0 and tally.plaintext_by_family[4] > 0, tally.summary()
    assert not tally.wireguard, tally.summary()


async def test_pod_traffic_between_nodes_is_encrypted(encrypted: LabPlan) -> None:
    """Pod ↔ pod, both directions, both families: answered, and on the fabric only WireGuard datagrams
    (data, type 4) — while node ↔ pod traffic and BGP stay outside the tunnel."""
    node1, node2 = encrypted.nodes
    with trio.fail_after(60):
        await until(lambda: _handshaken(node1, "node2"), "node1's peer node2 has shaken hands (both keys published)")
        async with fabric_tap(encrypted) as tally:
            results = await probes(encrypted, 5)
            pods = load_pods(encrypted)
            from_node = await probe_one(
                endpoint_for(encrypted, "node1", pods, source=True),
                endpoint_for(encrypted, "enc/b", pods, source=False),
                HTTP,
                6,
                peer=True,
            )
        assert all(r.connected for r in results), [r for r in results if not r.connected]
        print(f"with encryption: {tally.summary()}")
        _no_plaintext(tally)
        assert tally.wireguard[4] >= len(results), tally.summary()
        # node ↔ pod is node traffic: outside the tunnel (docs/encryption.md), seen on the link, and answered
        assert from_node.connected and tally.node_pod > 0, (from_node, tally.summary())
        for node in (node1, node2):
            assert await established(node.bird_ctl, "bgp_fabric")
            status = await encryption_of(node)
            assert status["mtu"] == encrypted.uplink_mtu - 80 and status["guard"]["guarded_blocks"] == 2, status
            assert status["error"] is None and status["refusals"] == [], status


async def test_full_size_packets_fit_the_tunnel(encrypted: LabPlan) -> None:
    """The pods' MTU is the fabric's less WireGuard's 80 bytes (calico#6844, cilium#45423, antrea#5868: a
    wrong MTU once encryption is on): a ping of exactly the pod's MTU with don't-fragment crosses the
    tunnel in each family, and one byte more is refused in the pod (its eth0 says 1420)."""
    pods = {p.key: p for p in load_pods(encrypted)}
    a, b = pods["enc/a"], pods["enc/b"]
    mtu = encrypted.uplink_mtu - 80
    link = await run_in(a.netns, ["ip", "-j", "link", "show", "eth0"])
    assert json.loads(link.stdout)[0]["mtu"] == mtu
    for family, header in ((6, 48), (4, 28)):
        target = b.addresses(family)[0]
        fits = await run_in(
            a.netns, ["ping", f"-{family}", "-n", "-c", "3", "-W", "2", "-M", "do", "-s", str(mtu - header), target]
        )
        assert fits.returncode == 0, fits.stdout.decode() + fits.stderr.decode()
        over = await run_in(
            a.netns, ["ping", f"-{family}", "-n", "-c", "1", "-W", "1", "-M", "do", "-s", str(mtu - header + 1), target]
        )
        assert over.returncode != 0, over.stdout.decode()


async def _handshaken(node: NodePlan, peer: str) -> bool:
    status = await encryption_of(node)
    return any(p["node"] == peer and p["latest_handshake"] for p in status["peers"] or ())


async def test_a_missing_key_drops_and_never_sends_in_the_clear(encrypted: LabPlan) -> None:
    """node2's agent stopped (SIGSTOP: it cannot publish again) and its key removed from its NodeConfig's
    status: node1 removes the peer and its routes, its pods' packets to node2 are dropped and counted —
    none in the clear — while node1 itself still reaches node2's pod (node traffic is outside the
    tunnel) and BGP stays up.  node2's agent resumed publishes its key again and the stream recovers."""
    node1, node2 = encrypted.nodes
    agent = process_refs(encrypted.dir)[f"agent-{node2.name}"].pid
    key = await published_key(encrypted, "node2")
    before = (await encryption_of(node1))["guard"]["dropped_packets"]
    pods = load_pods(encrypted)
    with trio.fail_after(90):
        async with fabric_tap(encrypted) as tally, stream(encrypted) as outcome:
            os.kill(agent, signal.SIGSTOP)
            try:
                await kubectl(
                    encrypted, "patch", "nodeconfig", "node2", "--subresource=status", "--type=merge",
                    "-p", '{"status":{"wireguard":null}}',
                )  # fmt: skip
                await until(lambda: _peerless(node1), "node1 removed its peer node2")
                await trio.sleep(2)  # the stream meets the guard
                status = await encryption_of(node1)
                assert "node node2: no-key: no public key published yet" in status["refusals"], status
                assert status["guard"]["dropped_packets"] > before, status
                blocked = await probe_one(*ends(encrypted), HTTP, 4)
                assert not blocked.connected, blocked
                from_node = await probe_one(
                    endpoint_for(encrypted, "node1", pods, source=True),
                    endpoint_for(encrypted, "enc/b", pods, source=False),
                    HTTP,
                    6,
                )
                assert from_node.connected, f"node1 → enc/b outside the tunnel: {from_node}"
                assert await established(node1.bird_ctl, "bgp_fabric")
            finally:
                os.kill(agent, signal.SIGCONT)
            await until(lambda: _key_is(encrypted, "node2", key), "node2 published its key again")
            await until(lambda: _handshaken(node1, "node2"), "node1 peered with node2 again")
        (result,) = outcome
        after = await stream_between(*ends(encrypted), HTTP, 6, rate=RATE, until=2.0)
    print(f"missing key: {result.text()}; then {after.text()}; capture: {tally.summary()}")
    _no_plaintext(tally)
    assert result.lost > 0 and result.answered > 0, result.to_json()  # it waited, then came back
    assert after.lost == 0 and after.refused == 0, after.to_json()


async def _peerless(node: NodePlan) -> bool:
    return not (await encryption_of(node))["peers"]


async def _key_is(lab: LabPlan, node: str, key: str) -> bool:
    return await published_key(lab, node) == key


async def test_a_key_rotation_under_a_stream_loses_nothing(encrypted: LabPlan) -> None:
    """``flockctl wireguard rotate`` on node2 under a stream of connections from node1's pod: the new key
    published, node1's peer changed to it in place, nothing in the clear, and no connection lost (the
    issue allows a second; wireguard-go holds what it sends while the session is re-established)."""
    node1, node2 = encrypted.nodes
    old = await published_key(encrypted, "node2")
    with trio.fail_after(60):
        async with fabric_tap(encrypted) as tally, stream(encrypted) as outcome:
            rotated = await flockctl(node2, "wireguard", "rotate")
            assert rotated["public_key"] != old and rotated["previous_public_key"] == old, rotated
            await until(lambda: _key_is(encrypted, "node2", rotated["public_key"]), "the new key published")
            await until(
                lambda: _peer_key_is(node1, "node2", rotated["public_key"]), "node1's peer node2 has the new key"
            )
        (result,) = outcome
        await until(lambda: _rotation_done(node2), "node2 forgot its previous key (every peer shook hands)")
    print(f"rotation: {result.text()}; capture: {tally.summary()}")
    _no_plaintext(tally)
    assert result.refused == 0 and result.lost == 0, result.to_json()
    assert result.answered > 2 * RATE, result.to_json()


async def _peer_key_is(node: NodePlan, peer: str, key: str) -> bool:
    return any(p["node"] == peer and p["public_key"] == key for p in (await encryption_of(node))["peers"] or ())


async def _rotation_done(node: NodePlan) -> bool:
    return not (await encryption_of(node))["rotation_pending"]


async def test_an_agent_restart_under_a_stream_loses_nothing(encrypted: LabPlan) -> None:
    """node2's agent killed (SIGKILL) and started again by the keeper, under a stream of connections in
    each family: the device, its peers, the routes and the guard outlive the agent, so nothing is in
    the clear and nothing is lost; the new agent adopts the device as it is."""
    node2 = encrypted.node("node2")
    before = (await encryption_of(node2))["public_key"]
    with trio.fail_after(90):
        async with fabric_tap(encrypted) as tally, stream(encrypted, 6) as six, stream(encrypted, 4) as four:
            agent = process_refs(encrypted.dir)[f"agent-{node2.name}"].pid
            os.kill(agent, signal.SIGKILL)
            await until(lambda: _replaced(encrypted, node2, agent), "the keeper started node2's agent again")
            await until(lambda: agent_ready(node2), "node2's agent ready again", 30)
        (result6,), (result4,) = six, four
    print(f"agent restart: IPv6 {result6.text()}; IPv4 {result4.text()}; capture: {tally.summary()}")
    _no_plaintext(tally)
    for result in (result6, result4):
        assert result.refused == 0 and result.lost == 0, result.to_json()
    status = await encryption_of(node2)
    assert status["public_key"] == before and status["error"] is None, status
    assert [p["node"] for p in status["peers"]] == ["node1"], status


async def test_services_with_encryption(encrypted: LabPlan) -> None:
    """A NodePort Service whose one endpoint is node2's pod, from node1's pod (its ClusterIP: translated
    on node1, then through the tunnel, nothing in the clear), from node1 itself (node traffic: outside
    the tunnel, answered), and from the internet through node1's NodePort (a client's packet forwarded to
    another node's pod: outside the tunnel — WireGuard would drop its source — and answered)."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "b", "namespace": "enc"},
        "spec": {
            "type": "NodePort",
            "ipFamilyPolicy": "RequireDualStack",
            "selector": {"app": "b"},
            "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    await kubectl(encrypted, "apply", "-f", "-", stdin=json.dumps(service))
    try:
        svc = json.loads(await kubectl(encrypted, "get", "svc", "b", "-n", "enc", "-o", "json"))
        ips = {ipaddress.ip_address(ip).version: ip for ip in svc["spec"]["clusterIPs"]}
        node_port = PortSpec(svc["spec"]["ports"][0]["nodePort"], "TCP")
        pods = load_pods(encrypted)
        a = endpoint_for(encrypted, "enc/a", pods, source=True)
        node1 = endpoint_for(encrypted, "node1", pods, source=True)
        internet = endpoint_for(encrypted, "internet", pods, source=True)
        cases = [
            *((a, Endpoint(ip, None, (ip,)), PortSpec(80, "TCP"), family) for family, ip in ips.items()),
            *((node1, Endpoint(ip, None, (ip,)), PortSpec(80, "TCP"), family) for family, ip in ips.items()),
            *((internet, endpoint_for(encrypted, "node1", pods, source=False), node_port, f) for f in (6, 4)),
        ]
        with trio.fail_after(60):
            async with fabric_tap(encrypted) as tally:
                for src, dst, port, family in cases:
                    while not (r := await probe_one(src, dst, port, family, peer=True)).connected:
                        print(f"{src.label} → {dst.label} {port.label}: {r.reason}; again")
                        await trio.sleep(0.2)
                    assert r.served_by == "enc/b", r
                for _ in range(10):  # and a steady few from the pod, through the tunnel
                    r = await probe_one(*cases[0], peer=True)
                    assert r.connected and r.served_by == "enc/b", r
        print(f"services with encryption: {tally.summary()}")
        _no_plaintext(tally)
        assert tally.wireguard[4] >= 10 and tally.node_pod > 0, tally.summary()
    finally:
        await kubectl(encrypted, "delete", "svc", "b", "-n", "enc", "--wait=false")


async def test_network_policy_holds_through_the_tunnel(encrypted: LabPlan) -> None:
    """A NetworkPolicy on node2's pod admitting node1's enc/a only: enc/a answered through the tunnel,
    enc/c (also on node1) refused — the policy sees the pods' own addresses once the tunnel has
    delivered them, as it does without encryption."""
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "only-a", "namespace": "enc"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "b"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}], "ports": [{"port": 8080}]}],
        },
    }
    pods = load_pods(encrypted)
    b = endpoint_for(encrypted, "enc/b", pods, source=False)
    a, c = (endpoint_for(encrypted, key, pods, source=True) for key in ("enc/a", "enc/c"))
    await kubectl(encrypted, "apply", "-f", "-", stdin=json.dumps(policy))
    try:
        with trio.fail_after(60):
            for family in (6, 4):
                while (await probe_one(c, b, HTTP, family)).connected:  # noqa: ASYNC110  another node's table
                    await trio.sleep(0.2)  # until node2's agent enforces it
                async with fabric_tap(encrypted) as tally:
                    allowed = [await probe_one(a, b, HTTP, family, peer=True) for _ in range(5)]
                    refused = [await probe_one(c, b, HTTP, family) for _ in range(3)]
                assert all(r.connected and r.served_by == "enc/b" for r in allowed), allowed
                assert not any(r.connected for r in refused), refused
                _no_plaintext(tally)
    finally:
        await kubectl(encrypted, "delete", "networkpolicy", "only-a", "-n", "enc", "--wait=false")


async def _replaced(lab: LabPlan, node: NodePlan, old: int) -> bool:
    ref = process_refs(lab.dir).get(f"agent-{node.name}")
    return ref is not None and ref.pid != old
