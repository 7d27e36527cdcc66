"""The netlink worker against the real kernel, in namespaces these tests
create: a "node" namespace stands for the host (with an uplink to an "up"
namespace carrying 192.0.2.1), and one namespace per pod."""

import ipaddress
import os
import re

import attrs
import pytest
import trio

from flock import errors
from flock.faults import Fault, IfNameTaken, NetnsUnusable, NodeUnprepared
from flock.model import Allocation
from flock.netlink import ROUTE_PROTOCOL, STEPS, NetlinkWorker, host_ifname
from flock.pods import cni_error
from flock.testing.netns import netns_pool

ip = ipaddress.ip_address
pytestmark = pytest.mark.usefixtures("require_root")


class InjectedFault(Exception):
    pass


@pytest.fixture
def pool():
    with netns_pool("fl-nl-") as p:
        yield p


@pytest.fixture
def node(pool):
    ns = pool.create("node")
    up = pool.create("up")
    pool.veth(ns, "uplink", up, "eth0")
    ns.ip("addr", "add", "192.0.2.1/24", "dev", "uplink")
    return ns


async def worker_for(node, **kwargs):
    w = NetlinkWorker(host_netns=node.path, **kwargs)
    await w.prepare_node(uplink="uplink")
    return w


def alloc(cid, pod, ip6="2001:db8::5", ip4="198.51.100.5", anycast=(), addresses=()):
    return Allocation(
        container_id=cid,
        namespace="default",
        pod=cid,
        pod_uid="u-" + cid,
        if_name="eth0",
        netns=pod.path,
        ip6=ip(ip6) if ip6 else None,
        ip4=ip(ip4) if ip4 else None,
        anycast=tuple(ip(a) for a in anycast),
        addresses=tuple(ip(a) for a in addresses),
    )


async def run(ns, *argv):
    return await trio.to_thread.run_sync(lambda: ns.run(*argv, check=False))


def snapshot(node, pod):
    """Addresses, routes and host-veth flags, minus what the kernel changes
    on its own (the pod's auto link-local finishing DAD, counters)."""
    out = []
    for ns in (node, pod):
        for cmd in (("-o", "addr"), ("route",), ("-6", "route"), ("-o", "link")):
            text = ns.ip(*cmd)
            lines = [line for line in text.splitlines() if not re.search(r"fe80::(?!1/)[0-9a-f:]+/64", line)]
            out.append("\n".join(re.sub(r"\s+(tentative|valid_lft.*|preferred_lft.*)", "", line) for line in lines))
    return out


def flock_state(node):
    links = [line for line in node.ip("-o", "link").splitlines() if ": flock" in line]
    routes = node.ip("route", "show", "proto", str(ROUTE_PROTOCOL)) + node.ip(
        "-6", "route", "show", "proto", str(ROUTE_PROTOCOL)
    )
    return links, routes.strip()


async def test_pod_reaches_node_over_fe80_1_and_169_254_1_1(pool, node):
    with trio.fail_after(20):
        pod = pool.create("pod")
        w = await worker_for(node)
        attachment = await w.setup(alloc("c1", pod))
        assert attachment.host_ifname == host_ifname("c1") and attachment.pod_ifname == "eth0"
        assert attachment.pod_mac and attachment.pod_mac in pod.ip("link", "show", "eth0")
        assert attachment.host_mac in node.ip("link", "show", host_ifname("c1"))
        assert await w.check(alloc("c1", pod)) == []
        ping6 = await run(pod, "ping", "-6", "-c1", "-W1", "fe80::1%eth0")
        assert ping6.returncode == 0, ping6.stdout + ping6.stderr
        # IPv4: default via 169.254.1.1, answered by proxy ARP on the host veth.
        ping4 = await run(pod, "ping", "-c1", "-W1", "192.0.2.1")
        assert ping4.returncode == 0, ping4.stdout + ping4.stderr
        assert "169.254.1.1" in pod.ip("neigh")


async def test_setup_twice_gives_identical_state(pool, node):
    with trio.fail_after(20):
        pod = pool.create("pod")
        w = await worker_for(node)
        a = alloc("c1", pod, anycast=["2001:db8:aa::1"], addresses=["203.0.113.7"])
        await w.setup(a)
        first = snapshot(node, pod)
        await w.setup(a)
        assert snapshot(node, pod) == first
        assert await w.check(a) == []


@pytest.mark.parametrize("step", STEPS)
async def test_failure_after_each_step_then_rerun_converges(pool, node, step):
    with trio.fail_after(20):
        pod = pool.create("pod")
        a = alloc("c1", pod, anycast=["2001:db8:aa::1"])

        def fault(name):
            if name == step:
                raise InjectedFault(name)

        broken = await worker_for(node, fault=fault)
        with pytest.raises(InjectedFault):
            await broken.setup(a)
        w = NetlinkWorker(host_netns=node.path)
        await w.setup(a)
        assert await w.check(a) == []
        ping6 = await run(pod, "ping", "-6", "-c1", "-W1", "fe80::1%eth0")
        assert ping6.returncode == 0


async def test_both_setup_paths_call_the_fault_hook_once_per_step_in_order(pool, node):
    """The fresh path batches steps (the host link's marker, address and up
    in one datagram, its sysctls written before it): the hooks still come
    in STEPS order, once each, as on the converging path."""
    with trio.fail_after(20):
        pod = pool.create("pod")
        seen: list[str] = []
        w = await worker_for(node, fault=seen.append)
        a = alloc("c1", pod, anycast=["2001:db8:aa::1"])
        await w.setup(a)
        assert seen == list(STEPS)
        seen.clear()
        await w.setup(a)  # the veth exists: the converging path
        assert seen == list(STEPS)


async def test_setup_converges_after_addresses_change(pool, node):
    with trio.fail_after(20):
        pod = pool.create("pod")
        w = await worker_for(node)
        await w.setup(alloc("c1", pod, ip6="2001:db8::5"))
        moved = alloc("c1", pod, ip6="2001:db8::6")
        await w.setup(moved)
        assert await w.check(moved) == []
        assert "2001:db8::5" not in node.ip("-6", "route") + pod.ip("addr")


async def test_setup_replaces_a_stale_host_veth_whose_peer_is_elsewhere(pool, node):
    with trio.fail_after(20):
        pod, elsewhere = pool.create("pod"), pool.create("old")
        pool.veth(node, host_ifname("c1"), elsewhere, "eth0")
        w = await worker_for(node)
        a = alloc("c1", pod)
        await w.setup(a)
        assert await w.check(a) == []
        assert "eth0" not in elsewhere.ip("link")


async def test_setup_converges_from_dual_stack_to_v6_only(pool, node):
    with trio.fail_after(20):
        pod = pool.create("pod")
        w = await worker_for(node)
        await w.setup(alloc("c1", pod))
        v6_only = alloc("c1", pod, ip4=None)
        await w.setup(v6_only)
        assert await w.check(v6_only) == []
        assert pod.ip("-4", "route").strip() == "" and "198.51.100.5" not in node.ip("route")


@pytest.mark.parametrize("routes", [True, False], ids=["leaving-routes", "link-only"])
async def test_teardown_twice_succeeds_and_leaves_nothing(pool, node, routes):
    with trio.fail_after(20):
        pod = pool.create("pod")
        w = await worker_for(node)
        await w.setup(alloc("c1", pod))
        await w.teardown("c1", pod.path, "eth0", routes=routes)
        await w.teardown("c1", pod.path, "eth0", routes=routes)
        assert flock_state(node) == ([], "")
        assert "eth0" not in pod.ip("link")


async def test_teardown_with_pod_netns_already_deleted_cleans_host_side(pool, node):
    with trio.fail_after(20):
        pod = pool.create("pod")
        w = await worker_for(node)
        await w.setup(alloc("c1", pod, anycast=["203.0.113.9"]))
        pool.delete(pod)
        await w.teardown("c1", pod.path, "eth0")
        await w.teardown("c1", None, None)
        assert flock_state(node) == ([], "")
        assert not await trio.Path(pod.path).exists()  # teardown must never recreate it


async def test_check_reports_what_was_changed_by_hand(pool, node):
    with trio.fail_after(20):
        pod = pool.create("pod")
        w = await worker_for(node)
        a = alloc("c1", pod)
        await w.setup(a)
        host = host_ifname("c1")
        pod.ip("addr", "del", "2001:db8::5/128", "dev", "eth0")
        node.ip("route", "del", "198.51.100.5/32")
        node.run("sysctl", "-qw", f"net.ipv4.conf.{host}.proxy_arp=0")
        assert await w.check(a) == [
            f"host {host}: sysctl net/ipv4/conf/{host}/proxy_arp is 0, expected 1",
            f"host: route 198.51.100.5/32 dev {host} scope link missing",
            "pod eth0: address 2001:db8::5/128 missing",
        ]
        await w.setup(a)
        assert await w.check(a) == []
        await w.teardown("c1", pod.path, "eth0")
        assert await w.check(a) == [f"host {host}: interface missing", "pod eth0: interface missing in " + pod.path]


async def test_setup_refuses_missing_netns_without_creating_it(pool, node):
    with trio.fail_after(20):
        w = await worker_for(node)
        ghost = pool.create("pod")
        pool.delete(ghost)
        with pytest.raises(NetnsUnusable) as info:
            await w.setup(alloc("c1", ghost))
        assert cni_error(info.value).code == errors.INVALID_ENV and ghost.path in info.value.details
        assert not await trio.Path(ghost.path).exists()
        assert flock_state(node) == ([], "")


async def test_setup_refuses_a_netns_path_that_is_no_namespace(pool, node, tmp_path):
    with trio.fail_after(20):
        w = await worker_for(node)
        plain = tmp_path / "netns"
        plain.write_text("")
        a = Allocation("c1", "default", "c1", "u", "eth0", str(plain), ip6=ip("2001:db8::5"))
        with pytest.raises(NetnsUnusable) as info:
            await w.setup(a)
        assert cni_error(info.value).code == errors.INVALID_ENV and str(plain) in info.value.details
        assert "not a network namespace" in info.value.details
        with pytest.raises(NetnsUnusable) as info:
            await w.check(a)
        assert cni_error(info.value).code == errors.INVALID_ENV and "not a network namespace" in info.value.details
        await w.teardown("c1", str(plain), "eth0")
        assert flock_state(node) == ([], "")


async def test_setup_refuses_a_foreign_interface_named_ifname(pool, node):
    with trio.fail_after(20):
        pod = pool.create("pod")
        pool.veth(pod, "eth0", pool.create("other"), "x0")
        w = await worker_for(node)
        with pytest.raises(IfNameTaken) as info:
            await w.setup(alloc("c1", pod))
        assert "ifName='eth0'" in info.value.details and cni_error(info.value).code == errors.INVALID_ENV


async def test_failed_setup_and_teardown_never_delete_a_foreign_ifname(pool, node):
    # The "uplink deleted" report: ADD into a netns whose ifName is not flock's
    # (a veth, like a lab uplink, and a dummy), then the rollback's teardown.
    with trio.fail_after(20):
        pod = pool.create("pod")
        pool.veth(pod, "eth0", pool.create("other"), "x0")
        pool.veth(pod, "eth1", pool.create("other"), "x1")
        w = await worker_for(node)
        for name in ("eth0", "eth1"):
            a = attrs.evolve(alloc("c1", pod), if_name=name)
            before = snapshot(node, pod)
            with pytest.raises(Fault) as info:
                await w.setup(a)
            assert cni_error(info.value).code == errors.INVALID_ENV and f"ifName={name!r}" in info.value.details
            await w.teardown("c1", pod.path, name)
            assert snapshot(node, pod) == before
            assert name in pod.ip("-o", "link")


@pytest.mark.parametrize("which", ["node", "agent"])
async def test_setup_refuses_the_nodes_own_netns_and_changes_nothing(pool, node, which):
    with trio.fail_after(20):
        w = await worker_for(node)
        path = {"node": node.path, "agent": "/proc/self/ns/net"}[which]
        a = attrs.evolve(alloc("c1", pool.create("pod")), netns=path, if_name="uplink")
        before = node.ip("-o", "link"), node.ip("route")
        with pytest.raises(Fault) as info:
            await w.setup(a)
        assert cni_error(info.value).code == errors.INVALID_ENV and "node's own network namespace" in info.value.details
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            with pytest.raises(Fault):
                await w.setup(a, fd)  # the same namespace as an fd
        finally:
            os.close(fd)
        await w.teardown("c1", path, "uplink")
        assert (node.ip("-o", "link"), node.ip("route")) == before


async def test_setup_works_on_the_fd_not_the_path(pool, node):
    with trio.fail_after(20):
        w = await worker_for(node)
        pod = pool.create("pod")
        fd = os.open(pod.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            # The path the allocation names is gone (another mount namespace's view):
            # only the fd leads to the namespace.
            a = attrs.evolve(alloc("c1", pod), netns="/nonexistent/netns")
            await w.setup(a, fd)
            assert "2001:db8::5" in pod.ip("-6", "addr", "show", "dev", "eth0")
            assert await w.check(a, fd) == []
            os.fstat(fd)  # borrowed: still open
        finally:
            os.close(fd)


@pytest.mark.parametrize("routes", [True, False], ids=["leaving-routes", "link-only"])
async def test_host_veth_carries_the_owner_marker_and_unmarked_lookalikes_are_left_alone(pool, node, routes):
    with trio.fail_after(20):
        w = await worker_for(node)
        pod = pool.create("pod")
        await w.setup(alloc("c1", pod))
        assert "alias flock:c1" in node.ip("-d", "link", "show", host_ifname("c1"))
        # A veth with flock's naming that someone else made (its alias says so),
        # and one that belongs to another container (an FNV collision).
        other = pool.create("other")
        pool.veth(node, host_ifname("c2"), other, "o0")
        node.ip("link", "set", host_ifname("c2"), "alias", "not-flock")
        pool.veth(node, host_ifname("c3"), other, "o1")
        node.ip("link", "set", host_ifname("c3"), "alias", "flock:someone-else")
        await w.teardown("c2", routes=routes)
        await w.teardown("c3", routes=routes)
        report = await w.cleanup(["c1", "c3"])
        assert host_ifname("c2") not in report.interfaces
        links = node.ip("-o", "link")
        assert host_ifname("c2") in links and host_ifname("c3") in links
        with pytest.raises(Fault) as info:
            await w.setup(alloc("c3", pool.create("pod"), "2001:db8::7", "198.51.100.7"))
        assert "not flock's veth" in info.value.details
        await w.teardown("c1", routes=routes)
        assert host_ifname("c1") not in node.ip("-o", "link")
        # A veth of flock's naming without any alias: what an agent before markers made; still flock's.
        pool.veth(node, host_ifname("c4"), other, "o2")
        await w.teardown("c4", routes=routes)
        assert host_ifname("c4") not in node.ip("-o", "link")


async def test_cleanup_removes_orphans_and_keeps_explained_pods(pool, node):
    with trio.fail_after(20):
        w = await worker_for(node)
        keep, orphan = pool.create("pod"), pool.create("pod")
        a = alloc("keep", keep, "2001:db8::a", "198.51.100.10", anycast=["203.0.113.9"])
        b = alloc("orphan", orphan, "2001:db8::b", "198.51.100.11", anycast=["203.0.113.9"])
        await w.setup(a)
        await w.setup(b)
        # A flock route through no flock veth (a crash leftover) goes too.
        node.ip("route", "add", "203.0.113.77/32", "dev", "uplink", "proto", str(ROUTE_PROTOCOL))
        report = await w.cleanup(["keep"])
        assert report.interfaces == (host_ifname("orphan"),)
        assert any("203.0.113.77" in r for r in report.routes)
        assert await w.check(a) == []
        assert host_ifname("orphan") not in node.ip("link")
        assert "203.0.113.77" not in node.ip("route")
        assert (await w.cleanup(["keep"])) == type(report)()


async def two_pods_sharing(pool, w, anycast):
    """Pods a1 and b1, both holding *anycast*, set up concurrently."""
    p1, p2 = pool.create("pod"), pool.create("pod")
    a = alloc("a1", p1, "2001:db8::a", "198.51.100.10", anycast=anycast)
    b = alloc("b1", p2, "2001:db8::b", "198.51.100.11", anycast=anycast)
    async with trio.open_nursery() as n:
        n.start_soon(w.setup, a)
        n.start_soon(w.setup, b)
    return p1, a, b


@pytest.mark.parametrize("anycast", ["2001:db8:aa::1", "203.0.113.9"])
async def test_anycast_on_two_pods_is_one_multipath_route(pool, node, anycast):
    with trio.fail_after(20):
        w = await worker_for(node)
        p1, a, b = await two_pods_sharing(pool, w, [anycast])
        fam = "-6" if ":" in anycast else "-4"
        route = node.ip(fam, "route", "show", anycast)
        assert route.count("nexthop") == 2, route
        assert host_ifname("a1") in route and host_ifname("b1") in route
        assert await w.check(a) == [] and await w.check(b) == []
        await w.teardown("a1", p1.path, "eth0")
        route = node.ip(fam, "route", "show", anycast)
        assert "nexthop" not in route and host_ifname("b1") in route, route
        assert await w.check(b) == []


async def test_ensure_anycast_repairs_what_a_vanished_pod_netns_took(pool, node):
    with trio.fail_after(20):
        w = await worker_for(node)
        p1, a, b = await two_pods_sharing(pool, w, ["203.0.113.9", "2001:db8:aa::1"])
        pool.delete(p1)  # the kernel drops the whole IPv4 multipath route with a1's veth
        # The kernel dismantles namespaces asynchronously: nothing in this process to wait on.
        while host_ifname("a1") in node.ip("link"):  # noqa: ASYNC110
            await trio.sleep(0.01)
        assert "203.0.113.9" not in node.ip("route")
        await w.teardown("a1", p1.path, "eth0")
        assert await w.ensure_anycast([a, b]) == [f"203.0.113.9/32 dev {host_ifname('b1')} scope link"]
        assert await w.check(b) == []
        assert await w.ensure_anycast([b]) == []


async def test_resetup_without_an_anycast_address_leaves_its_multipath_route(pool, node):
    with trio.fail_after(20):
        w = await worker_for(node)
        p1, _, b = await two_pods_sharing(pool, w, ["203.0.113.9"])
        a_without = alloc("a1", p1, "2001:db8::a", "198.51.100.10")
        await w.setup(a_without)
        route = node.ip("route", "show", "203.0.113.9")
        assert route.startswith(f"203.0.113.9 dev {host_ifname('b1')} "), route
        assert await w.check(a_without) == [] and await w.check(b) == []


async def test_blackholes_follow_the_node_blocks(pool, node):
    with trio.fail_after(20):
        w = await worker_for(node)
        net = ipaddress.ip_network
        await w.ensure_blackholes([net("2001:db8:0:1::/64"), net("198.51.100.0/24")])
        await w.ensure_blackholes([net("2001:db8:0:1::/64"), net("198.51.100.0/24")])
        assert "blackhole 198.51.100.0/24 proto 70" in node.ip("route")
        assert "blackhole 2001:db8:0:1::/64" in node.ip("-6", "route")
        await w.ensure_blackholes([net("2001:db8:0:2::/64"), None])
        assert "blackhole" not in node.ip("route")
        assert "2001:db8:0:2::/64" in node.ip("-6", "route") and "2001:db8:0:1::/64" not in node.ip("-6", "route")


async def test_prepare_node_without_route_or_uplink_is_a_clear_error(pool):
    with trio.fail_after(20):
        bare = pool.create("node")
        w = NetlinkWorker(host_netns=bare.path)
        with pytest.raises(NodeUnprepared) as info:
            await w.prepare_node()
        assert "169.254.1.1" in info.value.details
        assert bare.run("sysctl", "-n", "net.ipv4.ip_forward").stdout.strip() == "1"


async def test_parallel_setups_converge_and_worker_threads_stay_in_our_netns(pool, node):
    with trio.fail_after(30):
        w = await worker_for(node, max_parallel=4)
        pods = [pool.create("pod") for _ in range(10)]
        allocs = [
            alloc(f"p{i}", pods[i], f"2001:db8::{i + 1:x}", f"198.51.100.{i + 1}", anycast=["2001:db8:aa::1"])
            for i in range(10)
        ]
        async with trio.open_nursery() as n:
            for a in allocs:
                n.start_soon(w.setup, a)
        for a in allocs:
            assert await w.check(a) == []
        assert node.ip("-6", "route", "show", "2001:db8:aa::1").count("nexthop") == 10
        ours = os.readlink("/proc/thread-self/ns/net")
        seen = set()
        async with trio.open_nursery() as n:
            for _ in range(8):

                async def probe():
                    seen.add(await trio.to_thread.run_sync(lambda: os.readlink("/proc/thread-self/ns/net")))

                n.start_soon(probe)
        assert seen == {ours}


def normalized(node, pod):
    """Both sides' links, addresses and routes with what differs between two
    nodes' copies of one pod (MACs, interface indexes, namespace names) masked."""
    out = snapshot(node, pod)
    out.append(node.ip("-d", "link", "show", host_ifname("c1")))
    out.append(pod.ip("-d", "link", "show", "eth0"))
    text = "\n".join(out)
    text = re.sub(r"([0-9a-f]{2}:){5}[0-9a-f]{2}", "MAC", text)
    text = re.sub(r"@if\d+|^\d+: |link-netns \S+|link-netnsid \d+", "", text, flags=re.M)
    return re.sub(r"(carrier_changes|carrier_up_count|carrier_down_count) \d+", "", text)


async def test_fresh_and_converging_setups_make_the_same_kernel_state(pool):
    """A new pod takes the batched path; a pod whose veth exists already
    (here: an attempt cut short right after creating it) the converging one."""
    with trio.fail_after(30):
        nodes = []
        for name in ("n1", "n2"):
            ns, up = pool.create(name), pool.create(name + "up")
            pool.veth(ns, "uplink", up, "eth0")
            ns.ip("addr", "add", "192.0.2.1/24", "dev", "uplink")
            nodes.append(ns)
        pods = [pool.create("pod1"), pool.create("pod2")]
        a = [alloc("c1", pods[0], addresses=["203.0.113.7"]), alloc("c1", pods[1], addresses=["203.0.113.7"])]
        fresh = await worker_for(nodes[0])
        await fresh.setup(a[0])

        def cut(step):
            if step == "veth":
                raise InjectedFault(step)

        broken = await worker_for(nodes[1], fault=cut)
        with pytest.raises(InjectedFault):
            await broken.setup(a[1])
        await NetlinkWorker(host_netns=nodes[1].path).setup(a[1])
        assert normalized(nodes[0], pods[0]) == normalized(nodes[1], pods[1])
        for node in nodes:
            # addrgenmode none before up: the host veth has fe80::1 and no link-local of the kernel's.
            v6 = node.ip("-6", "-o", "addr", "show", "dev", host_ifname("c1"))
            assert re.findall(r"inet6 (\S+)", v6) == ["fe80::1/64"]


async def test_a_refusal_inside_a_batch_names_its_step_and_a_rerun_converges(pool, node):
    with trio.fail_after(30):
        pod = pool.create("pod")
        # IPv6 off in the pod: its eth0 refuses the /128 (the 2nd message of the pod's batch).
        pod.run("sysctl", "-w", "net.ipv6.conf.default.disable_ipv6=1")
        w = await worker_for(node)
        with pytest.raises(Fault) as refused:
            await w.setup(alloc("c1", pod))
        assert refused.value.msg == "netlink pod-addresses failed"
        assert "2001:db8::5" in refused.value.details and "c1" in refused.value.details
        # The messages after it ran: the IPv4 address is there.
        assert "198.51.100.5/32" in pod.ip("-4", "addr", "show", "dev", "eth0")
        pod.run("sysctl", "-w", "net.ipv6.conf.eth0.disable_ipv6=0")
        await w.setup(alloc("c1", pod))
        assert await w.check(alloc("c1", pod)) == []
        ping6 = await run(pod, "ping", "-6", "-c1", "-W1", "fe80::1%eth0")
        assert ping6.returncode == 0, ping6.stdout + ping6.stderr


async def test_a_refusal_in_the_host_links_batch_names_its_step_after_the_marker_and_addrgenmode(pool, node):
    """The host veth's marker, address and up go in one datagram, after its
    sysctls (addrgenmode none among them)."""
    with trio.fail_after(30):
        pod = pool.create("pod")
        host = host_ifname("c1")
        # IPv6 off for new links on the node: the host veth refuses fe80::1.
        node.run("sysctl", "-w", "net.ipv6.conf.default.disable_ipv6=1")
        w = await worker_for(node)
        with pytest.raises(Fault) as refused:
            await w.setup(alloc("c1", pod))
        assert refused.value.msg == "netlink host-address failed"
        assert "fe80::1" in refused.value.details and "c1" in refused.value.details
        link = node.ip("-d", "link", "show", host)
        assert "alias flock:c1" in link and "addrgenmode none" in link  # the steps before it ran
        node.run("sysctl", "-w", "net.ipv6.conf.default.disable_ipv6=0")
        node.run("sysctl", "-w", f"net.ipv6.conf.{host}.disable_ipv6=0")
        await w.setup(alloc("c1", pod))
        assert await w.check(alloc("c1", pod)) == []
        # addrgenmode none was set before the link went up: no link-local of the kernel's.
        v6 = node.ip("-6", "-o", "addr", "show", "dev", host)
        assert re.findall(r"inet6 (\S+)", v6) == ["fe80::1/64"]


async def test_a_failed_host_sysctl_names_its_step_and_leaves_the_link_down_and_unmarked(pool, node):
    with trio.fail_after(30):
        pod = pool.create("pod")
        host = host_ifname("c1")

        def vanish(step):
            # The host veth disappears right after the pair verified: its sysctls are the first to miss it.
            if step == "veth":
                node.ip("link", "del", host)

        w = await worker_for(node, fault=vanish)
        with pytest.raises(Fault) as refused:
            await w.setup(alloc("c1", pod))
        assert refused.value.msg == "netlink host-sysctls failed"
        assert host in refused.value.details
        assert flock_state(node) == ([], "")
        w = await worker_for(node)
        await w.setup(alloc("c1", pod))
        assert await w.check(alloc("c1", pod)) == []


async def test_teardown_without_routes_relies_on_the_kernel_dropping_single_path_routes(pool, node):
    """A pod without anycast addresses: DEL skips the route dump, the kernel
    drops the veth's /128 and /32 with it."""
    with trio.fail_after(20):
        pod = pool.create("pod")
        w = await worker_for(node)
        await w.setup(alloc("c1", pod))
        assert flock_state(node)[0] != []
        await w.teardown("c1", routes=False)
        assert flock_state(node) == ([], "")


@pytest.mark.parametrize("anycast", ["2001:db8:aa::1", "203.0.113.9"])
async def test_leave_routes_keeps_the_veth_and_the_other_pods_multipath_route(pool, node, anycast):
    """Deferred DEL of an anycast pod: it leaves its multipath routes first (an IPv4
    one would die whole with the veth), the veth goes later without a route dump."""
    with trio.fail_after(20):
        w = await worker_for(node)
        _p1, _a, b = await two_pods_sharing(pool, w, [anycast])
        fam = "-6" if ":" in anycast else "-4"
        await w.leave_routes("a1")
        route = node.ip(fam, "route", "show", anycast)
        assert "nexthop" not in route and host_ifname("b1") in route, route
        assert host_ifname("a1") in node.ip("-o", "link")  # still there
        await w.teardown("a1", routes=False)
        assert host_ifname("a1") not in node.ip("-o", "link")
        assert host_ifname("b1") in node.ip(fam, "route", "show", anycast)
        assert await w.check(b) == []
        await w.leave_routes("a1")  # gone already: nothing to do
