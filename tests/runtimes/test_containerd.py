"""containerd's CRI drives flock end to end (Debian's containerd 1.6, runc).

containerd runs in the node's network namespace with its own directories
(flock.testing.runtimes.Containerd) and the node's CNI dirs: the plugin and
the *default* conflist flock-install-cni writes, unedited.  The tests speak
CRI v1 over gRPC as the kubelet does and compare what containerd reports with
flock's store and the node's kernel.  One containerd and one node serve the
module; the agent-restart test goes last.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flock.netlink import host_ifname
from flock.testing import PODS, pod_object
from flock.testing.agentlab import NODE, wait_for
from flock.testing.runtimes import Containerd, CriClient, missing_tools

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
    assert "capabilities" not in doc["plugins"][0]


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
