"""podman (Debian's 4.3, CNI backend, runc) drives flock end to end.

A podman network made by ``flock-install-cni --podman-network``; podman with
its own storage in the node's network namespace; a container from a locally
imported busybox-static image.  podman passes CNI_ARGS with K8S_POD_NAME
(the container name) only: flock serves it as a container without a pod.
"""

from __future__ import annotations

import ipaddress
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flock import installer
from flock.netlink import host_ifname
from flock.testing import PODS, pod_object
from flock.testing.agentlab import NODE
from flock.testing.runtimes import Podman
from flock.testing.runtimes._podman import missing_tools

pytestmark = pytest.mark.runtimes
NETWORK = "flock-podman"


@pytest.fixture(scope="module")
def podman(runtime_node) -> Iterator[Podman]:
    if missing := missing_tools():
        pytest.fail(f"missing {', '.join(missing)}: scripts/bootstrap installs Debian's podman, runc and conmon")
    node = runtime_node
    # What an operator runs for podman: the installer with --podman-network.
    argv = [
        f"--cni-bin-dir={node.cni_bin}",
        f"--cni-conf-dir={node.cni_conf}",
        f"--socket={node.lab.socket}",
        f"--podman-network={NETWORK}",
        "--log-format=text",
    ]
    assert installer.main(argv) == 0
    pm = Podman(Path(tempfile.mkdtemp(prefix="fl-pm-")), node.lab.node.path, node.cni_bin, node.cni_conf)
    try:
        pm.setup()
    except Exception as exc:
        pm.close()
        pytest.fail(f"podman setup failed: {exc}")
    try:
        yield pm
    finally:
        pm.close()


def test_a_podman_container_gets_flocks_address_reaches_a_pod_and_rm_releases_it(runtime_node, podman):
    node = runtime_node
    networks = podman("network", "ls", "--format", "{{.Name}} {{.Driver}}")
    assert networks.returncode == 0 and f"{NETWORK} flock" in networks.stdout, (networks.stdout, networks.stderr)

    run = podman("run", "-d", "--name", "app_1", "--network", NETWORK, podman.image, "/bin/sleep", "3600")
    assert run.returncode == 0, run.stderr
    cid = run.stdout.strip().splitlines()[-1]
    row = node.lab.rows()[cid]
    # No Kubernetes pod: no namespace, the container name as its label, NodeConfig defaults (IPv6 and IPv4 here).
    assert (row.namespace, row.pod, row.state.value) == ("", "app_1", "committed")
    assert row.ip6 in ipaddress.ip_network("2001:db8:0:1::/64")
    inspect = podman("inspect", "app_1", "--format", "{{json .NetworkSettings.Networks}}")
    assert inspect.returncode == 0, inspect.stderr
    net = json.loads(inspect.stdout)[NETWORK]
    assert net["GlobalIPv6Address"] == str(row.ip6), net
    if row.ip4 is not None:
        assert net["IPAddress"] == str(row.ip4), net
    assert net["MacAddress"], net  # podman refuses a result without MACs

    # The container reaches a pod on the node (attached the Kubernetes way, through the same plugin).
    peer = node.lab.pool.create("pmpeer")
    node.lab.api.create(PODS, pod_object("default", "peer", NODE))
    add = node.lab.cni("ADD", "c0ffee0pm", peer, "peer")
    assert add.status == 0, add
    peer_ip = add.json["ips"][0]["address"].split("/")[0]
    ping = podman("exec", "app_1", "ping", "-c1", "-W3", peer_ip)
    assert ping.returncode == 0, (ping.stdout, ping.stderr)
    assert node.lab.cni("DEL", "c0ffee0pm", peer, "peer").status == 0

    rm = podman("rm", "--force", "--time", "0", "app_1")
    assert rm.returncode == 0, rm.stderr
    assert cid not in node.lab.rows()
    assert host_ifname(cid) not in node.lab.flock_links()
    assert not [r for r in node.lab.flock_routes() if r.startswith(f"{row.ip6} ")]
