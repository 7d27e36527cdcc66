"""Issue 25 on a lab: natOutgoing to an internet behind the fabric, and the pods' MTU.

One two-node lab for the file, made as a user makes it: ``flock-lab up --mtu
9000 --internet`` (every fabric link at 9000; an "internet" namespace,
192.0.2.100 and 2001:db8:ffff:1::100, outside every cluster range, that routes
back to the nodes' uplink addresses only, never to a pod block).  Its server
answers each TCP connection with the source address it saw, as every lab
pod's and node's server does, so each check is made on the receiving side.
NodeConfigs are changed through the lab's API server; each test puts back
what it changed.

Slow for the main suite (a lab of its own): marked ``netpol``, so .ci/run's
netpol stage (``pytest -n 0 -m netpol tests/lab``) runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from flock.apiserver import NODECONFIGS
from flock.lab import LabPlan, LabPod, NodePlan, api_client, down, pod_add, pod_del, run_in, status, status_text
from flock.lab._plan import BRIDGE, INTERNET4, INTERNET6, INTERNET_LINK, UPLINK
from flock.lab._ports import PortSpec
from flock.lab._probe import ProbeResult, probe
from flock.lab._state import require_state
from flock.lab.cli import main
from flock.model import ANNOTATION_PREFIX
from flock.netlink import host_ifname

pytestmark = pytest.mark.netpol

JUMBO = 9000
POLL_S = 0.1


@pytest.fixture(scope="module")
def lab() -> Iterator[LabPlan]:
    if os.geteuid() != 0:
        pytest.fail("the lab needs root (network namespaces, veths, nftables); CI runs as root")
    for tool in ("bird", "birdc", "nft", "ping"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: scripts/bootstrap installs bird2, nftables and iputils-ping")
    # Unix socket paths hold at most 108 bytes: a short directory of our own.
    directory = Path(tempfile.mkdtemp(prefix="flab-1-", dir="/run"))
    try:
        code = main(["up", "--nodes", "2", "--mtu", str(JUMBO), "--internet", "--dir", str(directory)])
        assert code == 0, f"flock-lab up: exit {code}; see {directory}"
        # What later commands see: the options are kept in lab.json.
        plan = require_state(directory).plan
        assert (plan.uplink_mtu, plan.internet) == (JUMBO, True)
        yield plan
    finally:
        trio.run(down, directory)
        shutil.rmtree(directory, ignore_errors=True)


async def _patch_spec(plan: LabPlan, node: NodePlan, spec: dict[str, Any]) -> None:
    """A merge patch of *node*'s NodeConfig spec (a None value removes the field)."""
    await api_client(plan).patch(NODECONFIGS, node.name, {"spec": spec})


async def _masquerading(node: NodePlan) -> set[int]:
    """The families whose natOutgoing rule is in *node*'s ``inet flock`` table."""
    proc = await run_in(node.netns, ["nft", "list", "table", "inet", "flock"])
    assert proc.returncode == 0, proc.stderr.decode()
    text = proc.stdout.decode()
    return {f for f, ip in ((4, "ip"), (6, "ip6")) if f"{ip} saddr @nat-src-{f} {ip} daddr != @nat-exempt-{f}" in text}


async def _wait_masquerading(node: NodePlan, families: set[int]) -> None:
    while (now := await _masquerading(node)) != families:
        print(f"{node.name} masquerades IPv{sorted(now)}, waiting for IPv{sorted(families)}")
        await trio.sleep(POLL_S)


async def _connects(plan: LabPlan, source: str, target: str, family: int) -> ProbeResult:
    """``flock-lab probe SOURCE TARGET 80/TCP`` until it connects (the caller's deadline bounds it)."""
    while not (r := await probe(plan, source, target, "80/TCP", family)).connected:
        print(f"{source} → {target} IPv{family}: {r.reason}; again")
        await trio.sleep(POLL_S)
    return r


async def _ping(netns: str, address: str, *args: str) -> tuple[bool, str]:
    proc = await run_in(netns, ["ping", "-n", "-c", "1", "-W", "1", *args, address])
    return proc.returncode == 0, (proc.stdout + proc.stderr).decode(errors="replace")


async def _pings(netns: str, address: str, *args: str) -> None:
    """One echo answered (the first may go while a neighbour is resolved: tried until the deadline)."""
    while not (answer := await _ping(netns, address, *args))[0]:
        print(f"ping {' '.join(args)} {address} from {netns}: {answer[1].strip()}; again")
        await trio.sleep(POLL_S)


async def _mtu(netns: str, link: str) -> int:
    proc = await run_in(netns, ["ip", "-j", "link", "show", "dev", link])
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)[0]["mtu"]


async def _pod_mtus(plan: LabPlan, pod: LabPod) -> tuple[int, int]:
    """(the pod's eth0, the node's end of its veth)."""
    return await _mtu(pod.netns, "eth0"), await _mtu(plan.node(pod.node).netns, host_ifname(pod.container_id))


async def _agent_mtu(node: NodePlan) -> dict[str, Any]:
    """``flockctl status --json``'s MTU of *node*'s agent: what new pods get, and why."""
    flockctl = Path(sys.executable).parent / "flockctl"
    argv = [str(flockctl), "status", "--json", "--socket", str(node.socket.parent / "admin.sock")]
    proc = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
    assert proc.stdout, f"flockctl status on {node.name}: exit {proc.returncode}: {proc.stderr.decode()}"
    return json.loads(proc.stdout)["mtu"]


async def _wait_agent_mtu(node: NodePlan, value: int) -> dict[str, Any]:
    while (mtu := await _agent_mtu(node))["value"] != value:
        print(f"{node.name}: MTU {mtu}, waiting for {value}")
        await trio.sleep(POLL_S)
    return mtu


async def test_pods_reach_the_internet_only_through_nat_outgoing(lab: LabPlan) -> None:
    node1, node2 = lab.nodes
    doc = await status(require_state(lab.dir))
    assert doc["internet"]["serve"]["running"] and doc["uplink_mtu"] == JUMBO
    assert f"internet: {INTERNET6} {INTERNET4}" in status_text(doc)

    http = [PortSpec(80, "TCP")]
    a = await pod_add(lab, "node1", "nat/a", ports=http)  # a pod that declares ports is dual-stack
    b = await pod_add(lab, "node2", "nat/b", ports=http)
    try:
        with trio.fail_after(60):
            # The lab's NodeConfigs leave natOutgoing at its defaults: IPv4 on, IPv6 off.
            await _wait_masquerading(node1, {4})
            await _wait_masquerading(node2, {4})
            seen = await _connects(lab, "nat/a", "internet", 4)
            assert seen.seen_as == str(node1.addr4), seen
            await _pings(a.netns, str(INTERNET4))
            # IPv6 leaves with the pod's own address, which the internet has no route back to.
            assert not (r := await probe(lab, "nat/a", "internet", "80/TCP", 6)).connected, r
            # Pod ↔ pod across nodes, and pod → node: never masqueraded (what the receiving side saw).
            for family in (4, 6):
                seen = await _connects(lab, "nat/a", "nat/b", family)
                assert seen.seen_as == a.addresses(family)[0], seen
                seen = await _connects(lab, "nat/b", "nat/a", family)
                assert seen.seen_as == b.addresses(family)[0], seen
                seen = await _connects(lab, "nat/a", "node2", family)
                assert seen.seen_as == a.addresses(family)[0], seen

            # node1: off for IPv4, on for IPv6.
            await _patch_spec(lab, node1, {"natOutgoing": {"ipv4": False, "ipv6": True}})
            await _wait_masquerading(node1, {6})
            assert not (r := await probe(lab, "nat/a", "internet", "80/TCP", 4)).connected, r
            ok, out = await _ping(a.netns, str(INTERNET4))
            assert not ok, out
            seen = await _connects(lab, "nat/a", "internet", 6)
            assert seen.seen_as == str(node1.addr6), seen
            # Per node: node2's pods still leave masqueraded, to node2's address.
            seen = await _connects(lab, "nat/b", "internet", 4)
            assert seen.seen_as == str(node2.addr4), seen
            # Across nodes still the pod's own address, whatever natOutgoing says.
            seen = await _connects(lab, "nat/a", "nat/b", 6)
            assert seen.seen_as == a.addresses(6)[0], seen

            # The defaults again (the field removed).
            await _patch_spec(lab, node1, {"natOutgoing": None})
            await _wait_masquerading(node1, {4})
            seen = await _connects(lab, "nat/a", "internet", 4)
            assert seen.seen_as == str(node1.addr4), seen
    finally:
        with trio.move_on_after(30, shield=True):
            await _patch_spec(lab, node1, {"natOutgoing": None})
            await pod_del(lab, "nat/a")
            await pod_del(lab, "nat/b")


async def test_pods_get_the_uplinks_mtu_or_the_nodeconfigs(lab: LabPlan) -> None:
    node1, node2 = lab.nodes
    # The whole path is jumbo: the uplinks, their bridge ports and the bridge.
    for node in lab.nodes:
        assert await _mtu(node.netns, UPLINK) == JUMBO
        assert await _mtu(lab.fabric_netns, node.fabric_port) == JUMBO
    assert await _mtu(lab.fabric_netns, BRIDGE) == JUMBO
    assert await _mtu(lab.fabric_netns, INTERNET_LINK) == JUMBO
    mtu = await _agent_mtu(node1)
    assert mtu["value"] == JUMBO and f"from {UPLINK}'s" in mtu["source"], mtu

    dual = {ANNOTATION_PREFIX + "ipv4": "true"}
    m1 = await pod_add(lab, "node1", "mtu/m-1", dual)
    m2 = await pod_add(lab, "node2", "mtu/m-2", dual)
    m3: LabPod | None = None
    try:
        with trio.fail_after(60):
            assert await _pod_mtus(lab, m1) == (JUMBO, JUMBO)
            assert await _pod_mtus(lab, m2) == (JUMBO, JUMBO)
            # Full-size packets, never fragmented (DF), across nodes: 8952 + 8 + 40 (IPv6), 8972 + 8 + 20 (IPv4).
            await _pings(m1.netns, m2.addresses(6)[0], "-M", "do", "-s", str(JUMBO - 48))
            await _pings(m1.netns, m2.addresses(4)[0], "-M", "do", "-s", str(JUMBO - 28))
            ok, out = await _ping(m1.netns, m2.addresses(6)[0], "-M", "do", "-s", str(JUMBO - 47))
            assert not ok and "message too long" in out.lower(), out

            # NodeConfig spec.mtu wins over the uplink's, for new pods.
            await _patch_spec(lab, node1, {"mtu": 1400})
            mtu = await _wait_agent_mtu(node1, 1400)
            assert mtu["source"] == "nodeconfig", mtu
            m3 = await pod_add(lab, "node1", "mtu/m-3", dual)
            assert await _pod_mtus(lab, m3) == (1400, 1400)
            assert await _pod_mtus(lab, m1) == (JUMBO, JUMBO)  # made before: kept until recreated
            assert (await _agent_mtu(node2))["value"] == JUMBO
            await _pings(m3.netns, m2.addresses(6)[0], "-M", "do", "-s", str(1400 - 48))
            ok, out = await _ping(m3.netns, m2.addresses(6)[0], "-M", "do", "-s", str(1400 - 47))
            assert not ok and "message too long" in out.lower(), out

            await _patch_spec(lab, node1, {"mtu": None})
            await _wait_agent_mtu(node1, JUMBO)
    finally:
        with trio.move_on_after(30, shield=True):
            await _patch_spec(lab, node1, {"mtu": None})
            for pod in (m1, m2, m3):
                if pod is not None:
                    await pod_del(lab, pod.key)
