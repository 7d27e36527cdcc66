"""MTU against the real kernel: the default route's interface MTU as the
agent detects it, both veth ends set from one MTU, and CHECK naming a
mismatch.  Namespaces as in test_worker: a "node" namespace with uplinks."""

from __future__ import annotations

import ipaddress
import json

import pytest
import trio

from flock.model import Allocation, UplinkMtu
from flock.netlink import NetlinkWorker, host_ifname
from flock.netlink._uplink import read_uplink_mtu
from flock.testing.netns import netns_pool

pytestmark = pytest.mark.usefixtures("require_root")
ip = ipaddress.ip_address


@pytest.fixture
def pool():
    with netns_pool("fl-mtu-") as p:
        yield p


@pytest.fixture
def node(pool):
    return pool.create("node")


@pytest.fixture
def uplink(pool, node):
    """uplink(name, mtu, *addresses): an interface of the node (a veth to a
    namespace of its own; this kernel may lack the dummy driver)."""

    def make(name: str, mtu: int, *addresses: str) -> None:
        pool.veth(node, name, pool.create("up"), "eth0")
        node.ip("link", "set", name, "mtu", str(mtu))
        for address in addresses:
            node.ip("addr", "add", address, "dev", name, *(("nodad",) if ":" in address else ()))

    return make


def link_mtu(ns, name: str) -> int:
    (link,) = json.loads(ns.ip("-j", "link", "show", "dev", name))
    return link["mtu"]


def test_no_default_route_reads_1500(node, uplink):
    uplink("up0", 9000, "2001:db8:f::2/64", "192.0.2.2/24")
    assert read_uplink_mtu(node.path) == UplinkMtu(1500, "", 0)


def test_ipv6_default_route_first(node, uplink):
    uplink("up6", 9000, "2001:db8:f::2/64")
    uplink("up4", 1450, "192.0.2.2/24")
    node.ip("route", "add", "default", "via", "192.0.2.1", "dev", "up4")
    assert read_uplink_mtu(node.path) == UplinkMtu(1450, "up4", 4)
    node.ip("-6", "route", "add", "default", "via", "2001:db8:f::1", "dev", "up6")
    assert read_uplink_mtu(node.path) == UplinkMtu(9000, "up6", 6)


def test_lowest_metric_wins_and_a_route_mtu_caps_the_link(node, uplink):
    uplink("fast", 9000, "2001:db8:f::2/64")
    uplink("slow", 1500, "2001:db8:e::2/64")
    node.ip("-6", "route", "add", "default", "via", "2001:db8:e::1", "dev", "slow", "metric", "200")
    node.ip("-6", "route", "add", "default", "via", "2001:db8:f::1", "dev", "fast", "metric", "100")
    assert read_uplink_mtu(node.path) == UplinkMtu(9000, "fast", 6)
    node.ip("-6", "route", "change", "default", "via", "2001:db8:f::1", "dev", "fast", "metric", "100", "mtu", "8000")
    assert read_uplink_mtu(node.path) == UplinkMtu(8000, "fast", 6)


def test_multipath_default_route_counts_its_smallest_link(node, uplink):
    uplink("tor1", 9000, "192.0.2.2/24")
    uplink("tor2", 4000, "198.51.100.2/24")
    node.ip("route", "add", "default", "nexthop", "via", "192.0.2.1", "nexthop", "via", "198.51.100.1")
    assert read_uplink_mtu(node.path) == UplinkMtu(4000, "tor1,tor2", 4)


def test_default_route_found_among_many_routes(node, uplink, tmp_path):
    uplink("up0", 9000, "2001:db8:f::2/64")
    batch = tmp_path / "routes"
    batch.write_text("".join(f"route add 2001:db8:{i:x}::/48 via 2001:db8:f::1 dev up0\n" for i in range(1, 2001)))
    node.ip("-6", "-batch", str(batch))
    node.ip("-6", "route", "add", "default", "via", "2001:db8:f::1", "dev", "up0")
    assert read_uplink_mtu(node.path) == UplinkMtu(9000, "up0", 6)


def pod_alloc(cid: str, pod) -> Allocation:
    return Allocation(
        container_id=cid,
        namespace="default",
        pod=cid,
        pod_uid="u-" + cid,
        if_name="eth0",
        netns=pod.path,
        ip6=ip("2001:db8::5"),
        ip4=ip("198.51.100.5"),
    )


async def test_detected_9000_gives_both_veth_ends_9000_and_check_names_a_mismatch(pool, node, uplink):
    with trio.fail_after(20):
        uplink("up0", 9000, "2001:db8:f::2/64", "192.0.2.1/24")
        node.ip("-6", "route", "add", "default", "via", "2001:db8:f::1", "dev", "up0")
        w = NetlinkWorker(host_netns=node.path)
        await w.prepare_node(uplink="up0")
        detected = await w.uplink_mtu()
        assert detected == UplinkMtu(9000, "up0", 6)

        pod = pool.create("pod")
        a = pod_alloc("c1", pod)
        await w.setup(a, mtu=detected.mtu)
        host = host_ifname("c1")
        assert (link_mtu(node, host), link_mtu(pod, "eth0")) == (9000, 9000)
        assert await w.check(a) == []
        assert await w.check(a, mtu=9000) == []

        # By hand in the pod: CHECK names both ends.
        pod.ip("link", "set", "eth0", "mtu", "1400")
        assert await w.check(a) == [f"pod eth0: MTU is 1400, host {host} has 9000 (ADD sets both ends alike)"]
        assert await w.check(a, mtu=9000) == ["pod eth0: MTU is 1400, ADD set 9000"]

        # A re-run ADD converges it back.
        await w.setup(a, mtu=9000)
        assert link_mtu(pod, "eth0") == 9000 and await w.check(a) == []


async def test_an_explicit_mtu_applies_to_both_ends_on_create_and_converge(pool, node, uplink):
    with trio.fail_after(20):
        uplink("up0", 1500, "192.0.2.1/24")
        w = NetlinkWorker(host_netns=node.path)
        await w.prepare_node(uplink="up0")
        pod = pool.create("pod")
        a = pod_alloc("c2", pod)
        await w.setup(a, mtu=1400)  # the batched path of a new pod
        assert (link_mtu(node, host_ifname("c2")), link_mtu(pod, "eth0")) == (1400, 1400)
        await w.setup(a, mtu=1450)  # the veth exists: the converging path
        assert (link_mtu(node, host_ifname("c2")), link_mtu(pod, "eth0")) == (1450, 1450)
        assert await w.check(a, mtu=1450) == []
