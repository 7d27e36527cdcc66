"""End to end on one node: the real `flock` plugin → real flock-agent → real
kernel (namespaces) and real bird2, with the flock/testing API server."""

from __future__ import annotations

import ipaddress
import json

import pytest

from flock.apiserver import PODS, pod_object
from flock.ipam import fnv1a_64
from flock.testing.agentlab import CIDR6, open_lab, wait_for

pytestmark = pytest.mark.usefixtures("require_root", "require_bird")
A = "flock.fritzlab.net/"


@pytest.fixture
def lab(tmp_path):
    with open_lab(tmp_path, "fl-pods-") as lab:
        yield lab


def test_add_check_del_gc_through_the_real_plugin(lab):
    pod_ns = lab.pool.create("pod")
    lab.api.create(
        PODS,
        pod_object(
            "shop",
            "web-0",
            "host001",
            annotations={
                A + "ipv4": "true",
                A + "ip-algo": "namespace:16,random:48",
                A + "addresses": "2001:db8:0:1:ffff::10",
                A + "anycast": "2001:db8:aaaa::1",
            },
        ),
    )
    agent = lab.agent()
    agent.wait_ready()

    # Bad input first: a clear error naming the annotation and its value, and nothing left behind.
    lab.api.create(PODS, pod_object("shop", "bad-0", "host001", annotations={A + "cidr6": "2001:db8:9::/64"}))
    bad_add = lab.cni("ADD", "c0ffee00", pod_ns, "bad-0", namespace="shop")
    assert (bad_add.status, bad_add.code) == (1, 7), bad_add
    assert bad_add.json["details"].startswith(f"{A}cidr6='2001:db8:9::/64'")
    bad_args = lab.cni("ADD", "c0ffee00", pod_ns, "Bad_Name", namespace="shop")
    assert bad_args.code == 4 and "K8S_POD_NAME='Bad_Name'" in bad_args.json["details"]
    assert lab.rows() == {} and lab.flock_links() == set() and lab.flock_routes() == []
    assert "eth0" not in pod_ns.ip("-o", "link")

    add = lab.cni("ADD", "c0ffee01", pod_ns, "web-0", namespace="shop")
    assert add.status == 0, add
    result = add.json
    ips = [ipaddress.ip_interface(i["address"]) for i in result["ips"]]
    ip6, ip4, extra = ips
    # The annotations are honoured: IPv4 too, the namespace's bits at the top of the identifier, the extra address.
    assert ip6.network.prefixlen == 128 and ip6.ip in ipaddress.ip_network(CIDR6)
    assert (int(ip6.ip) >> 48) & 0xFFFF == fnv1a_64("shop") & 0xFFFF
    assert str(ip4) == "198.51.100.2/32" and str(extra) == "2001:db8:0:1:ffff::10/128"
    assert [i.get("gateway") for i in result["ips"]] == ["fe80::1", "169.254.1.1", None]
    host_if = result["interfaces"][0]["name"]
    # Every interface with the MAC the kernel gave it; the pod's with its sandbox; ips point at it.
    host_mac = json.loads(lab.node.ip("-j", "link", "show", "dev", host_if))[0]["address"]
    pod_mac = json.loads(pod_ns.ip("-j", "link", "show", "dev", "eth0"))[0]["address"]
    assert result["interfaces"] == [
        {"name": host_if, "mac": host_mac},
        {"name": "eth0", "mac": pod_mac, "sandbox": pod_ns.path},
    ]
    assert {i["interface"] for i in result["ips"]} == {1}

    # In the pod namespace: the addresses (anycast too) and the default routes.
    pod_addrs = pod_ns.ip("-o", "addr", "show", "dev", "eth0")
    for addr in (str(ip6), str(ip4), str(extra), "2001:db8:aaaa::1/128"):
        assert addr in pod_addrs
    assert "default via fe80::1 dev eth0" in pod_ns.ip("-6", "route")
    assert "default via 169.254.1.1 dev eth0" in pod_ns.ip("-4", "route")
    # On the node: a route per address through the pod's veth, the block blackholed.
    routes = lab.flock_routes()
    for addr in (ip6.ip, ip4.ip, extra.ip, "2001:db8:aaaa::1"):
        assert any(r.startswith(f"{addr} ") and f"dev {host_if} " in r for r in routes), (addr, routes)
    assert f"blackhole {CIDR6}" in lab.node.ip("-6", "route", "show", "proto", "70")
    assert pod_ns.run("ping", "-c1", "-W2", "fe80::1%eth0", check=False).returncode == 0

    # BIRD: the agent rendered the node's block, anycast and peer, and BIRD learned the pod's route from the kernel.
    conf = wait_for(
        "the rendered BIRD config", lambda: "tor1" in lab.bird_config.read_text() and lab.bird_config.read_text()
    )
    assert CIDR6 in conf and "2001:db8:aaaa::1" in conf
    wait_for("BIRD to learn the pod route", lambda: str(ip6.ip) in lab.birdc("show", "route", "for", str(ip6.ip)))

    # CHECK passes, then names a MAC that is not the kernel's and the address removed by hand.
    assert lab.cni("CHECK", "c0ffee01", pod_ns, "web-0", namespace="shop", prevResult=result).status == 0
    other_mac = "02:00:00:00:00:01" if pod_mac != "02:00:00:00:00:01" else "02:00:00:00:00:02"
    wrong = {**result, "interfaces": [result["interfaces"][0], {**result["interfaces"][1], "mac": other_mac}]}
    check = lab.cni("CHECK", "c0ffee01", pod_ns, "web-0", namespace="shop", prevResult=wrong)
    assert (check.status, check.code) == (1, 120), check
    assert check.json["details"] == f"pod eth0: MAC is {pod_mac}, prevResult says {other_mac}", check.json
    pod_ns.ip("addr", "del", str(extra), "dev", "eth0")
    check = lab.cni("CHECK", "c0ffee01", pod_ns, "web-0", namespace="shop", prevResult=result)
    assert (check.status, check.code) == (1, 120), check
    assert check.json["details"] == f"pod eth0: address {extra} missing", check.json
    bad = lab.cni("CHECK", "c0ffee01", pod_ns, "web-0", namespace="shop", prevResult={"ips": [{"address": "nope"}]})
    assert bad.code == 7 and "prevResult.ips[0].address='nope'" in bad.json["details"]

    # DEL, twice: both succeed; nothing of the pod is left.
    for _ in range(2):
        out = lab.cni("DEL", "c0ffee01", pod_ns, "web-0", namespace="shop")
        assert (out.status, out.stdout) == (0, ""), out
    assert lab.flock_links() == set() and lab.flock_routes() == [] and lab.rows() == {}
    assert "2001:db8:aaaa::1" not in pod_ns.ip("-o", "addr")
    wait_for("BIRD to drop the anycast address", lambda: "2001:db8:aaaa::1" not in lab.bird_config.read_text())

    # GC keeps exactly the valid attachments.
    pods = {}
    for name in ("a", "b", "c"):
        pods[name] = lab.pool.create(f"pod{name}")
        lab.api.create(PODS, pod_object("default", name, "host001"))
        assert lab.cni("ADD", f"c0ffee0{name}", pods[name], name).status == 0
    # DEL after the sandbox's namespace is gone: success, and the node's routes to it go too.
    lab.pool.delete(pods["c"])
    assert lab.cni("DEL", "c0ffee0c", None, "c").status == 0
    assert set(lab.rows()) == {"c0ffee0a", "c0ffee0b"} and len(lab.flock_routes()) == 2
    keep = [{"containerID": "c0ffee0b", "ifname": "eth0"}]
    gc = lab.cni("GC", **{"cni.dev/valid-attachments": keep})
    assert (gc.status, gc.stdout) == (0, ""), gc
    assert set(lab.rows()) == {"c0ffee0b"}
    assert len(lab.flock_links()) == 1 and all(
        r.split(" dev ")[1].split()[0] in lab.flock_links() for r in lab.flock_routes()
    )
    assert len(lab.flock_routes()) == 1  # b's /128 only
    assert "eth0" not in pods["a"].ip("-o", "link") and "eth0" in pods["b"].ip("-o", "link")

    # Metrics count what happened.
    status, text = agent.get("/metrics")
    assert status == 200 and 'flock_cni_requests_total{code="0",op="ADD"} 4.0' in text
    assert 'flock_cni_requests_total{code="7",op="ADD"} 1.0' in text
    assert 'flock_allocations{state="committed"} 1.0' in text
    assert agent.get("/healthz") == (200, "ok\n")
    assert agent.stop() == 0


def test_a_del_sent_while_the_agent_is_down_is_applied_when_it_comes_back(lab):
    pod_ns = lab.pool.create("pod")
    lab.api.create(PODS, pod_object("default", "web-0", "host001"))
    agent = lab.agent()
    agent.wait_ready()
    first = lab.cni("ADD", "c0ffee01", pod_ns, "web-0")
    assert first.status == 0 and all(i["mac"] for i in first.json["interfaces"]), first
    assert agent.stop() == 0
    # A repeated ADD after a restart answers the same result, MACs included (read back from the kernel).
    agent = lab.agent()
    agent.wait_ready()
    again = lab.cni("ADD", "c0ffee01", pod_ns, "web-0")
    assert again.json == first.json
    assert agent.stop() == 0
    out = lab.cni("DEL", "c0ffee01", pod_ns, "web-0")
    assert (out.status, out.stdout) == (0, ""), out
    queued = lab.socket.parent / "pending-deletes" / "c0ffee01.json"
    assert json.loads(queued.read_text())["op"] == "DEL"
    assert lab.flock_links() != set()  # nothing applied yet
    agent = lab.agent()
    agent.wait_ready()
    assert not queued.exists()
    assert lab.flock_links() == set() and lab.flock_routes() == [] and lab.rows() == {}
    assert agent.stop() == 0
