"""containerd's CRI drives flock end to end (Debian's containerd 1.6, runc).

containerd runs in the node's network namespace with its own directories
(flock.testing.runtimes.Containerd) and the node's CNI dirs: the plugin and
the *default* conflist flock-install-cni writes, unedited.  The tests speak
CRI v1 over gRPC as the kubelet does and compare what containerd reports with
flock's store and the node's kernel (hostPorts included: a sandbox's
PortMappings probed from another machine on the uplink, the node and a pod).
One containerd and one node serve the module; the agent-restart test goes last.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc  # type: ignore[import-untyped]
import pytest

from flock.apiserver import PODS, pod_object
from flock.model import PortMapping
from flock.netlink import host_ifname
from flock.testing.agentlab import NODE, wait_for
from flock.testing.policy_net import probe, stop
from flock.testing.runtimes import Containerd, CriClient, CriPortMapping, missing_tools
from flock.testing.runtimes._hostport import NODE4, NODE6, address_uplink, flock_table, mentions, probe_in, serve_in

pytestmark = pytest.mark.runtimes
A = "flock.fritzlab.net/"


@pytest.fixture(scope="module")
def containerd(runtime_node) -> Iterator[Containerd]:
    if missing := missing_tools():
        pytest.fail(f"missing {', '.join(missing)}: scripts/bootstrap installs Debian's containerd and runc")
    node = runtime_node
    ctrd = Containerd(Path(tempfile.mkdtemp(prefix="fl-ctrd-")), node.lab.node.path, node.cni_bin, node.cni_conf)
    try:
        ctrd.start()
    except Exception as exc:
        log = ctrd.log_tail()
        ctrd.stop()
        pytest.fail(f"containerd did not start: {exc}\n{log}")
    try:
        yield ctrd
    finally:
        ctrd.stop()


@pytest.fixture
def cri(containerd) -> CriClient:
    assert containerd.cri is not None
    return containerd.cri


def new_pod(node, name: str, **annotations: str) -> str:
    """The Pod object (the kubelet's pods exist on the API server first); its UID."""
    obj = node.lab.api.create(
        PODS, pod_object("cri", name, NODE, annotations={A + k: v for k, v in annotations.items()})
    )
    return obj["metadata"]["uid"]


def run_sandbox(cri: CriClient, node, name: str, **annotations: str) -> str:
    return cri.run_pod_sandbox(name, "cri", new_pod(node, name, **annotations))


def remove_sandbox(cri: CriClient, sid: str) -> None:
    cri.stop_pod_sandbox(sid)
    cri.remove_pod_sandbox(sid)


def assert_gone(node, sid: str, addresses: list[str]) -> None:
    assert sid not in node.lab.rows()
    assert host_ifname(sid) not in node.lab.flock_links()
    routes = node.lab.flock_routes()
    assert not [r for r in routes if r.split()[0].split("/")[0] in addresses], routes


def test_containerd_speaks_cri_v1_and_takes_the_default_conflist(runtime_node, cri):
    name, version, api = cri.version()
    assert (name, api) == ("containerd", "v1") and version.startswith("1.6"), (name, version, api)
    (conflist,) = runtime_node.cni_conf.glob("*.conflist")
    doc = json.loads(conflist.read_text())
    # As flock-install-cni writes it by default: no edits for containerd's libcni 1.1.
    assert doc["cniVersion"] == "1.0.0" and doc["cniVersions"] == ["0.4.0", "1.0.0", "1.1.0"]
    # hostPort: containerd passes a sandbox's PortMappings as runtimeConfig.portMappings.
    assert doc["plugins"][0]["capabilities"] == {"portMappings": True}, doc


def test_sandbox_ips_are_flocks_allocation_reachable_and_released(runtime_node, containerd, cri):
    node = runtime_node
    sid = run_sandbox(cri, node, "web-0", ipv4="true")
    status = cri.pod_sandbox_status(sid)
    row = node.lab.rows()[sid]
    assert status.ready and (row.namespace, row.pod, row.state.value) == ("cri", "web-0", "committed")
    # ip_pref = "ipv6": the pod's /128 is its primary IP, then its /32.
    assert status.ips == (str(row.ip6), str(row.ip4)), (status, row)
    # The agent reached the netns containerd mounted under its own state dir (netns_mounts_under_state_dir).
    assert row.netns.startswith(str(containerd.directory / "state") + "/"), row.netns

    # Another pod on the node (attached through the same plugin) reaches the sandbox on both families.
    other = node.lab.pool.create("peer")
    node.lab.api.create(PODS, pod_object("cri", "peer", NODE, annotations={A + "ipv4": "true"}))
    add = node.lab.cni("ADD", "c0ffee0peer", other, "peer", namespace="cri")
    assert add.status == 0, add
    for ip in status.ips:
        ping = other.run("ping", "-c1", "-W3", ip, check=False)
        assert ping.returncode == 0, (ip, ping.stdout, ping.stderr)
    assert node.lab.cni("DEL", "c0ffee0peer", other, "peer", namespace="cri").status == 0

    remove_sandbox(cri, sid)
    assert_gone(node, sid, list(status.ips))


def test_eight_concurrent_sandboxes_get_distinct_addresses(runtime_node, cri):
    node = runtime_node
    names = [f"par-{i}" for i in range(8)]
    uids = {n: new_pod(node, n) for n in names}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        sids = list(pool.map(lambda n: cri.run_pod_sandbox(n, "cri", uids[n]), names))
    statuses = [cri.pod_sandbox_status(s) for s in sids]
    ips = [s.ips[0] for s in statuses]
    assert len(set(ips)) == 8 and all(
        ipaddress.ip_address(ip) in ipaddress.ip_network("2001:db8:0:1::/64") for ip in ips
    )
    rows = node.lab.rows()
    assert {str(rows[s].ip6) for s in sids} == set(ips)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda s: remove_sandbox(cri, s), sids))
    for sid, ip in zip(sids, ips, strict=True):
        assert_gone(node, sid, [ip])


def test_a_sandboxs_port_mappings_are_host_ports_until_it_is_removed(runtime_node, containerd, cri):
    """The kubelet's hostPorts as a sandbox's PortMappings: containerd passes them (the conflist's
    portMappings capability) and flock DNATs the node's addresses to the sandbox — from another machine,
    from the node and from a pod on it — until StopPodSandbox+RemovePodSandbox."""
    node = runtime_node
    address_uplink(node.lab)
    ports = (
        CriPortMapping(80, 8080),
        CriPortMapping(53, 5353, "udp"),
        CriPortMapping(80, 9090, host_ip=NODE4),  # this address only
    )
    sid = cri.run_pod_sandbox("hp-0", "cri", new_pod(node, "hp-0", ipv4="true"), port_mappings=ports)
    row = node.lab.rows()[sid]
    assert row.network == "flock" and row.port_mappings == (
        PortMapping(8080, 80),
        PortMapping(5353, 53, "udp"),
        PortMapping(9090, 80, "tcp", ipaddress.ip_address(NODE4)),
    ), row
    # In flock's table before ADD returned (the DNAT to both addresses, the hairpin set).
    mapped = mentions(node.lab, row.ip6, row.ip4)
    assert mapped and all(p in flock_table(node.lab) for p in ("8080", "5353", "9090")), flock_table(node.lab)

    # A pod on the node (attached through the same plugin) to probe from.
    peer = node.lab.pool.create("hppeer")
    node.lab.api.create(PODS, pod_object("cri", "hp-peer", NODE, annotations={A + "ipv4": "true"}))
    assert node.lab.cni("ADD", "c0ffee0hp", peer, "hp-peer", namespace="cri").status == 0
    # The sandbox is a pause process: the server runs in the network namespace containerd mounted.
    server = serve_in(row.netns, "80/tcp", "53/udp")
    try:
        for src in (node.lab.up, node.lab.node, peer):
            for addr in (NODE6, NODE4):
                for port, proto in ((8080, "tcp"), (5353, "udp")):
                    assert probe(src, addr, port, proto), (src.name, addr, port, proto)
        assert probe(node.lab.up, NODE4, 9090, "tcp") and not probe(node.lab.up, NODE6, 9090, "tcp")
        # The sandbox through its own hostPort (hairpin).
        assert probe_in(row.netns, NODE6, 8080, "tcp") and probe_in(row.netns, NODE4, 5353, "udp")

        # Another sandbox asking for a held port: RunPodSandbox fails with flock's message, nothing kept.
        with pytest.raises(grpc.RpcError) as refused:
            cri.run_pod_sandbox("hp-1", "cri", new_pod(node, "hp-1"), port_mappings=(CriPortMapping(8000, 8080),))
        details = refused.value.details()
        assert "hostPort already in use" in details and "pod cri/hp-0" in details, details
        assert {r.pod for r in node.lab.rows().values()} == {"hp-0", "hp-peer"}
        assert mentions(node.lab, row.ip6, row.ip4) == mapped

        remove_sandbox(cri, sid)
        assert_gone(node, sid, [str(row.ip6), str(row.ip4)])
        # DEL answers before the policy service's next ruleset is in: nothing of the sandbox in flock's table.
        wait_for("the sandbox's hostPorts to go", lambda: mentions(node.lab, row.ip6, row.ip4) == [])
    finally:
        stop(server)
    assert not probe(node.lab.up, NODE4, 8080, "tcp") and not probe(peer, NODE6, 5353, "udp")
    # The port is the node's own again: nothing left in the way of a server the node runs there.
    own = serve_in(node.lab.node.path, "8080/tcp")
    try:
        assert probe(node.lab.up, NODE6, 8080, "tcp") and probe(peer, NODE4, 8080, "tcp")
    finally:
        stop(own)
    assert node.lab.cni("DEL", "c0ffee0hp", peer, "hp-peer", namespace="cri").status == 0


def test_stop_while_the_agent_is_down_is_queued_and_replayed(runtime_node, cri):
    node = runtime_node
    sid = run_sandbox(cri, node, "late-0")
    ip = cri.pod_sandbox_status(sid).ips[0]
    assert node.agent.stop() == 0
    try:
        # The kubelet's StopPodSandbox must not fail on an absent agent: the shim queues the DEL.
        cri.stop_pod_sandbox(sid)
        cri.remove_pod_sandbox(sid)
        assert sid in node.lab.rows()  # nothing applied yet
    finally:
        node.restart_agent()
    wait_for("the queued DEL to be replayed", lambda: sid not in node.lab.rows(), 30)
    assert_gone(node, sid, [ip])
    queued = [p for p in node.lab.tmp.rglob("pending-deletes/*") if p.is_file()]
    assert queued == []
