"""hostPort end to end on one node: the real `flock` plugin → real flock-agent → nftables in the node's
namespace.  ``runtimeConfig.portMappings`` (the conflist's ``portMappings`` capability) becomes DNAT in
``inet flock`` before ADD returns; a second pod claiming the port is refused (code 111) and leaves
nothing; the mappings survive an agent restart (restored from the store) and go with DEL and GC — a
GC scoped to its own network."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flock.apiserver import PODS, pod_object
from flock.testing.agentlab import Lab, open_lab, wait_for
from flock.testing.netns import Netns
from flock.testing.policy_net import SERVER, probe, stop

pytestmark = pytest.mark.usefixtures("require_root")
A = "flock.fritzlab.net/"
NODE6, NODE4 = "2001:db8:fffe::1", "192.0.2.1"  # the node's uplink addresses (192.0.2.1 is the lab's)
OUT6, OUT4 = "2001:db8:fffe::2", "192.0.2.2"  # another machine on the uplink


def _mapping(host_port: int, container_port: int, protocol: str = "tcp", host_ip: str | None = None) -> dict:
    out: dict = {"hostPort": host_port, "containerPort": container_port, "protocol": protocol}
    if host_ip is not None:
        out["hostIP"] = host_ip
    return out


def _ports(*mappings: dict) -> dict:
    return {"runtimeConfig": {"portMappings": list(mappings)}}


def _serve(ns: Netns, *specs: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns.name, sys.executable, "-c", SERVER, *specs], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


UDP_FROM = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("", int(sys.argv[1])))
s.settimeout(1.0)
s.sendto(b"ping", (sys.argv[2], int(sys.argv[3])))
try:
    print("echo" if s.recvfrom(64)[0] == b"ping" else "other")
except OSError:
    print("no answer")
"""


def _udp_from(ns: Netns, sport: int, addr: str, port: int) -> str:
    """One datagram from source port *sport* (the same flow each time); "echo" if it came back."""
    done = subprocess.run(
        ["ip", "netns", "exec", ns.name, sys.executable, "-c", UDP_FROM, str(sport), addr, str(port)],
        capture_output=True,
        text=True,
        timeout=20,
    )
    return done.stdout.strip()


def _hostport_rules(lab: Lab) -> str:
    """The elements of flock's hostPort maps ("tcp . 8080 : 2001:db8:… . 80" …), one a line."""
    out = []
    for name in ("hp-any-6", "hp-ip-6", "hp-any-4", "hp-ip-4"):
        done = lab.node.run("nft", "-j", "list", "map", "inet", "flock", name, check=False)
        if done.returncode != 0:
            continue
        for item in json.loads(done.stdout)["nftables"]:
            for elem in item.get("map", {}).get("elem", []):
                key, value = elem
                key = key["concat"] if isinstance(key, dict) else [key]
                out.append(f"{' . '.join(map(str, key))} : {' . '.join(map(str, value['concat']))}")
    return "\n".join(out)


@pytest.fixture
def lab(tmp_path):
    with open_lab(tmp_path, "fl-hp-", bird=False) as lab:
        lab.node.ip("-6", "addr", "add", f"{NODE6}/64", "dev", "uplink", "nodad")
        lab.up.ip("-6", "addr", "add", f"{OUT6}/64", "dev", "eth0", "nodad")
        lab.up.ip("addr", "add", f"{OUT4}/24", "dev", "eth0")
        yield lab


def test_host_ports_from_add_to_gc_across_a_restart(lab: Lab) -> None:
    servers: list[subprocess.Popen] = []
    try:
        _run(lab, servers)
    finally:
        for proc in servers:
            stop(proc)


def _run(lab: Lab, servers: list[subprocess.Popen]) -> None:
    agent = lab.agent()
    agent.wait_ready()
    for name in ("web-0", "web-1", "web-2"):
        lab.api.create(PODS, pod_object("default", name, "host001", annotations={A + "ipv4": "true"}))
    web0, web1, web2 = (lab.pool.create(n) for n in ("web0", "web1", "web2"))

    # Bad input: a clear error naming the field and the value; nothing stored, nothing in the kernel.
    bad = lab.cni("ADD", "c0ffee00", web0, "web-0", **_ports(_mapping(0, 80)))
    assert (bad.status, bad.code) == (1, 7), bad
    assert bad.json["details"].startswith("runtimeConfig.portMappings[0].hostPort=0: expected"), bad.json
    assert lab.rows() == {} and lab.flock_links() == set()

    # A UDP client already sending to 5353 before the pod exists: its conntrack entry (no NAT) would
    # keep bypassing the mapping; ADD clears the entries of flows to its UDP hostPorts.
    assert _udp_from(lab.up, 40053, NODE4, 5353) == "no answer"

    # ADD: the DNAT is in before ADD returns.
    add = lab.cni("ADD", "c0ffee01", web0, "web-0", **_ports(_mapping(8080, 80), _mapping(5353, 53, "udp")))
    assert add.status == 0, add
    servers.append(_serve(web0, "80/tcp", "53/udp"))
    rules = _hostport_rules(lab)
    assert "tcp . 8080 : " in rules and "udp . 5353 : " in rules, rules
    # the same flow (source port): mapped once its entry is gone (the agent deletes it right after the DNAT is in)
    wait_for("the old UDP flow to reach the pod", lambda: _udp_from(lab.up, 40053, NODE4, 5353) == "echo")
    reachable = [
        (lab.up, NODE4, 8080, "tcp"),  # another machine, both families
        (lab.up, NODE6, 8080, "tcp"),
        (lab.up, NODE4, 5353, "udp"),
        (lab.node, NODE4, 8080, "tcp"),  # the node itself
        (web0, NODE4, 8080, "tcp"),  # the pod through its own hostPort (hairpin)
    ]
    for src, addr, port, proto in reachable:
        assert probe(src, addr, port, proto), (src.name, addr, port, proto)

    # Another pod asking for the same port: refused, naming who holds it, leaving nothing behind.
    for clash in (_mapping(8080, 8000), _mapping(8080, 80, host_ip=NODE4)):
        out = lab.cni("ADD", "c0ffee02", web1, "web-1", **_ports(clash))
        assert (out.status, out.code) == (1, 111), out
        assert "pod default/web-0" in out.json["details"] and "8080/tcp" in out.json["details"], out.json
        assert set(lab.rows()) == {"c0ffee01"} and len(lab.flock_links()) == 1
    # The same port number on another protocol, or another port, is free; a hostIP mapping answers there only.
    assert lab.cni("ADD", "c0ffee02", web1, "web-1", **_ports(_mapping(8080, 80, "udp"))).status == 0
    assert lab.cni("ADD", "c0ffee03", web2, "web-2", **_ports(_mapping(9090, 80, host_ip=NODE4))).status == 0
    servers.append(_serve(web1, "80/udp"))
    servers.append(_serve(web2, "80/tcp"))
    assert probe(lab.up, NODE4, 8080, "udp") and probe(web2, NODE4, 8080, "tcp")  # a pod reaching another's
    assert probe(lab.up, NODE4, 9090, "tcp") and not probe(lab.up, NODE6, 9090, "tcp")

    # The agent killed and restarted: the mappings stay in the kernel, then are the new agent's (from the store).
    agent.kill()
    assert probe(lab.up, NODE4, 8080, "tcp")
    agent = lab.agent()
    agent.wait_ready()
    again = lab.cni("ADD", "c0ffee04", lab.pool.create("web4"), "web-1", **_ports(_mapping(9090, 1)))
    assert (again.status, again.code) == (1, 111), again  # the claims came back with the rows
    repeated = lab.cni("ADD", "c0ffee01", web0, "web-0", **_ports(_mapping(8080, 80), _mapping(5353, 53, "udp")))
    assert repeated.json == add.json
    other = lab.cni("ADD", "c0ffee01", web0, "web-0", **_ports(_mapping(8080, 80)))  # a retry asking for less
    assert (other.status, other.code) == (1, 4) and "5353/udp" in other.json["details"], other
    assert probe(lab.up, NODE6, 8080, "tcp") and probe(lab.up, NODE4, 9090, "tcp")

    # DEL takes its mappings with it.
    assert lab.cni("DEL", "c0ffee01", web0, "web-0").status == 0
    wait_for("web-0's DNAT to go", lambda: "tcp . 8080" not in _hostport_rules(lab))
    assert not probe(lab.up, NODE4, 8080, "tcp")
    assert "5353" not in _hostport_rules(lab)

    # GC concerns its own network only: another network's GC leaves flock-net's attachments alone.
    gc_other = lab.cni("GC", name="other-net", **{"cni.dev/valid-attachments": []})
    assert gc_other.status == 0, gc_other
    assert set(lab.rows()) == {"c0ffee02", "c0ffee03"}
    assert lab.cni("GC", **{"cni.dev/valid-attachments": [{"containerID": "c0ffee03", "ifname": "eth0"}]}).status == 0
    assert set(lab.rows()) == {"c0ffee03"}
    wait_for("web-1's DNAT to go", lambda: "8080" not in _hostport_rules(lab))
    assert not probe(lab.up, NODE4, 8080, "udp") and probe(lab.up, NODE4, 9090, "tcp")
    assert all(r.network == "flock-net" for r in lab.rows().values())
    assert lab.cni("DEL", "c0ffee03", web2, "web-2").status == 0
    # Nothing mapped: the hostports chain is empty (the table stays for natOutgoing, on for IPv4 by default).
    wait_for("the last DNAT to go", lambda: _hostport_rules(lab) == "")
    assert not probe(lab.up, NODE4, 9090, "tcp")
