"""podman (Debian's 4.3, CNI backend, runc) drives flock end to end.

A podman network made by ``flock-install-cni --podman-network``; podman with
its own storage in the node's network namespace; a container from a locally
imported busybox-static image.  podman passes CNI_ARGS with K8S_POD_NAME
(the container name) only: flock serves it as a container without a pod.
``-p`` reaches flock as runtimeConfig.portMappings (hostPort); the node runs
two flock networks (the default one and podman's), and a GC concerns its own.
"""

from __future__ import annotations

import ipaddress
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flock import installer
from flock.apiserver import PODS, pod_object
from flock.model import PortMapping
from flock.netlink import host_ifname
from flock.testing.agentlab import NODE, wait_for
from flock.testing.policy_net import probe, stop
from flock.testing.runtimes import Podman
from flock.testing.runtimes._hostport import NODE4, NODE6, address_uplink, http_get, mentions, serve_in
from flock.testing.runtimes._podman import missing_tools

pytestmark = pytest.mark.runtimes
NETWORK = "flock-podman"
# podman's containers have no pod to annotate: the node's defaults give them both families (hostPorts on both).
NODE_FAMILIES = {"ipv6": True, "ipv4": True}
GROUP = "root:x:0:\n"  # /etc/group in the busybox image: what its httpd -h /etc serves at /group


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
    assert row.ip6 in ipaddress.ip_network("2001:db8:0:1::/64") and row.ip4 is not None, row
    inspect = podman("inspect", "app_1", "--format", "{{json .NetworkSettings.Networks}}")
    assert inspect.returncode == 0, inspect.stderr
    net = json.loads(inspect.stdout)[NETWORK]
    assert net["GlobalIPv6Address"] == str(row.ip6), net
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


def _httpd(podman: Podman, name: str, *publish: str) -> str:
    """A busybox httpd container serving the image's /etc on port 80, published with ``-p`` *publish*."""
    argv = ["run", "-d", "--name", name, "--network", NETWORK, *(a for p in publish for a in ("-p", p))]
    run = podman(*argv, podman.image, "/bin/busybox", "httpd", "-f", "-p", "80", "-h", "/etc")
    assert run.returncode == 0, run.stderr
    return run.stdout.strip().splitlines()[-1]


def test_podman_publish_is_a_host_port_until_rm(runtime_node, podman):
    """``podman run -p 8080:80`` on a flock network: podman (CNI backend) passes the mapping as
    runtimeConfig.portMappings and flock DNATs the node's addresses to the container until ``rm -f``."""
    node = runtime_node
    address_uplink(node.lab)
    cid = _httpd(podman, "web_1", "8080:80")
    row = node.lab.rows()[cid]
    assert (row.network, row.port_mappings) == (NETWORK, (PortMapping(8080, 80),)), row
    assert row.ip4 is not None, row  # NODE_FAMILIES
    assert mentions(node.lab, row.ip6, row.ip4)
    # From another machine on the uplink and from the node itself, on both families (once httpd is up:
    # `podman run -d` returns before it listens).
    wait_for("web_1's httpd behind 8080", lambda: http_get(node.lab.up, NODE6, 8080, "/group"))
    for src in (node.lab.up, node.lab.node):
        for addr in (NODE6, NODE4):
            assert http_get(src, addr, 8080, "/group") == GROUP, (src.name, addr)

    rm = podman("rm", "--force", "--time", "0", "web_1")
    assert rm.returncode == 0, rm.stderr
    assert cid not in node.lab.rows() and host_ifname(cid) not in node.lab.flock_links()
    wait_for("web_1's hostPort to go", lambda: mentions(node.lab, row.ip6, row.ip4) == [])
    assert http_get(node.lab.up, NODE4, 8080, "/group") is None
    own = serve_in(node.lab.node.path, "8080/tcp")  # the port is the node's own again
    try:
        assert probe(node.lab.up, NODE6, 8080, "tcp") and probe(node.lab.up, NODE4, 8080, "tcp")
    finally:
        stop(own)


def test_gc_concerns_its_own_network_only(runtime_node, podman):
    """A GC for the default network (the kubelet's runtime cleaning up) leaves a podman container's
    attachment on flock-podman alone — allocation, veth, hostPort — and a GC for flock-podman keeps the
    attachments it lists; one that lists none releases it (podman's rm then still succeeds)."""
    node = runtime_node
    address_uplink(node.lab)
    names = {json.loads(p.read_text())["name"] for p in node.cni_conf.glob("*.conflist")}
    assert names == {"flock", NETWORK}, names  # flock-install-cni's default network, and podman's
    cid = _httpd(podman, "gc_1", "8081:80")
    row = node.lab.rows()[cid]
    assert (row.network, row.if_name) == (NETWORK, "eth0"), row

    def kept() -> None:
        assert node.lab.rows()[cid] == row
        assert host_ifname(cid) in node.lab.flock_links()
        assert http_get(node.lab.up, NODE6, 8081, "/group") == GROUP
        assert http_get(node.lab.up, NODE4, 8081, "/group") == GROUP

    wait_for("gc_1's httpd behind 8081", lambda: http_get(node.lab.up, NODE6, 8081, "/group"))
    kept()
    gc = node.lab.cni("GC", name="flock", **{"cni.dev/valid-attachments": []})
    assert gc.status == 0, gc
    kept()
    attachment = {"containerID": cid, "ifname": "eth0"}
    gc = node.lab.cni("GC", name=NETWORK, **{"cni.dev/valid-attachments": [attachment]})
    assert gc.status == 0, gc
    kept()

    # The control: flock-podman's GC without the container releases it (its GC is not a no-op).
    gc = node.lab.cni("GC", name=NETWORK, **{"cni.dev/valid-attachments": []})
    assert gc.status == 0, gc
    assert cid not in node.lab.rows() and host_ifname(cid) not in node.lab.flock_links()
    wait_for("gc_1's hostPort to go", lambda: mentions(node.lab, row.ip6, row.ip4) == [])
    rm = podman("rm", "--force", "--time", "0", "gc_1")
    assert rm.returncode == 0, rm.stderr
