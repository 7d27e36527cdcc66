"""Bad and hostile input against the real plugin and the real flock-agent process
(DESIGN "Wire protocol", issue 12): the namespace travels as an fd, the node's
own namespace and foreign interfaces are never touched, every refusal is a
CNI error, and the agent leaks no fd and keeps serving."""

from __future__ import annotations

import array
import json
import os
import socket

import pytest

from flock.apiserver import PODS, pod_object
from flock.rpc.wire import MAX_REQUEST_BYTES
from flock.testing.agentlab import open_lab

pytestmark = pytest.mark.usefixtures("require_root")


@pytest.fixture
def lab(tmp_path):
    with open_lab(tmp_path, "fl-bad-", bird=False) as lab:
        yield lab


def raw_call(path, obj: dict | bytes, fds: list[int] = ()) -> dict:
    """One request as a client of our own making would send it: the line, the fds."""
    line = obj if isinstance(obj, bytes) else json.dumps(obj).encode() + b"\n"
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(20)
        s.connect(str(path))
        if fds:
            s.sendmsg([line], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
        else:
            s.sendall(line)
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    return json.loads(reply)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def request(op: str, cid: str = "c0ffee10", netns: str = "/x", version: int = 2, **extra) -> dict:
    return {
        "version": version,
        "op": op,
        "containerID": cid,
        "netns": netns,
        "ifName": "eth0",
        "args": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0",
        "path": "/opt/cni/bin",
        "config": {"cniVersion": "1.1.0", "prevResult": {"cniVersion": "1.1.0", "ips": []}},
        **extra,
    }


def test_the_nodes_own_netns_and_a_foreign_ifname_are_refused_and_left_alone(lab):
    lab.api.create(PODS, pod_object("default", "web-0", "host001"))
    agent = lab.agent()
    agent.wait_ready()
    # CNI_NETNS = the node itself, ifName = its uplink: refused, the uplink stays.
    uplink_before = lab.node.ip("-o", "link", "show", "uplink")
    routes_before = lab.node.ip("route")
    out = lab.cni("ADD", "c0ffee01", pod="web-0", netns_path=lab.node.path, if_name="uplink")
    assert (out.status, out.code) == (1, 4), out
    assert "node's own network namespace" in out.json["details"]
    assert lab.node.ip("-o", "link", "show", "uplink") == uplink_before
    assert lab.node.ip("route") == routes_before
    assert lab.rows() == {} and lab.flock_links() == set()
    # A pod namespace whose ifName exists already (not flock's): refused, kept.
    pod_ns = lab.pool.create("pod")
    lab.pool.veth(pod_ns, "eth0", lab.pool.create("other"), "x0")
    out = lab.cni("ADD", "c0ffee02", pod_ns, "web-0")
    assert (out.status, out.code) == (1, 4), out
    assert "ifName='eth0'" in out.json["details"]
    assert "eth0" in pod_ns.ip("-o", "link")
    assert lab.rows() == {} and lab.flock_links() == set()
    # DEL and GC of what never got set up succeed and still leave eth0 alone.
    assert lab.cni("DEL", "c0ffee02", pod_ns, "web-0").status == 0
    assert lab.cni("GC", **{"cni.dev/valid-attachments": []}).status == 0
    assert "eth0" in pod_ns.ip("-o", "link")
    assert agent.stop() == 0


def test_wire_fd_mismatches_are_code_4_and_no_fd_leaks(lab, tmp_path):
    lab.api.create(PODS, pod_object("default", "web-0", "host001"))
    agent = lab.agent()
    agent.wait_ready()
    pid = agent.proc.pid
    plain = tmp_path / "plain"
    plain.write_text("not a namespace")
    pod_ns = lab.pool.create("pod")
    baseline = open_fds(pid)
    ns_fd = os.open(pod_ns.path, os.O_RDONLY | os.O_CLOEXEC)
    file_fd = os.open(plain, os.O_RDONLY | os.O_CLOEXEC)
    node_fd = os.open(lab.node.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        cases = [
            (request("ADD", netnsFd=True), [], "none arrived"),  # announced, not sent
            (request("ADD"), [], "netnsFd"),  # version 2 ADD without its fd
            (request("DEL", netnsFd=False), [ns_fd], "announces none"),  # sent, not announced
            (request("ADD", version=1, netns=pod_ns.path), [ns_fd], "announces none"),  # version 1 has none
            (request("STATUS", netnsFd=True), [ns_fd], "takes no network namespace fd"),
            (request("ADD", netnsFd=True), [ns_fd, ns_fd], "at most one"),
            (request("ADD", netnsFd=True), [file_fd], "not a network namespace"),
            (request("ADD", netnsFd=True), [node_fd], "node's own network namespace"),
            (request("CHECK", netnsFd=True), [node_fd], ""),
            (request("ADD", version=1, netns=str(plain)), [], "not a network namespace"),
            (request("ADD", version=1, netns="/" + "n" * 300), [], "File name too long"),
            (request("ADD", version=1, netns=str(tmp_path / "missing")), [], "no such file"),
            (b'{"version": 2, "op": "ADD", "netnsFd": true, garbage\n', [ns_fd], "not valid JSON"),
        ]
        for obj, fds, fragment in cases:
            reply = raw_call(lab.socket, obj, fds)
            assert "error" in reply, (obj, reply)
            assert reply["error"]["code"] in (3, 4, 6, 7), (obj, reply)
            assert fragment in reply["error"]["msg"] + " " + reply["error"].get("details", ""), (obj, reply)
            assert len(json.dumps(reply)) < 8192
        # A good version 2 ADD by fd, then DEL with and without it.
        good = request("ADD", cid="c0ffee11", netns="/not/the/agents/view", netnsFd=True)
        good["config"] = {"cniVersion": "1.1.0"}
        reply = raw_call(lab.socket, good, [ns_fd])
        assert "result" in reply, reply
        assert "eth0" in pod_ns.ip("-o", "link")
        assert "result" in raw_call(lab.socket, request("DEL", cid="c0ffee11", netnsFd=True), [ns_fd])
        assert "result" in raw_call(lab.socket, request("DEL", cid="c0ffee11"))
        assert lab.rows() == {} and lab.flock_links() == set()
    finally:
        for fd in (ns_fd, file_fd, node_fd):
            os.close(fd)
    assert open_fds(pid) == baseline
    assert agent.proc.poll() is None
    assert agent.stop() == 0


def test_del_with_an_unopenable_netns_releases_everything(lab, tmp_path):
    lab.api.create(PODS, pod_object("default", "web-0", "host001"))
    agent = lab.agent()
    agent.wait_ready()
    pod_ns = lab.pool.create("pod")
    assert lab.cni("ADD", "c0ffee01", pod_ns, "web-0").status == 0
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for bad in (str(loop), "/" + "n" * 300, str(tmp_path / "gone")):
        out = lab.cni("DEL", "c0ffee01", pod="web-0", netns_path=bad)
        assert (out.status, out.stdout) == (0, ""), out
    assert lab.rows() == {} and lab.flock_links() == set() and lab.flock_routes() == []
    assert lab.cni("GC", **{"cni.dev/valid-attachments": []}).status == 0
    assert agent.stop() == 0


def test_a_del_over_the_size_limit_is_still_performed(lab):
    lab.api.create(PODS, pod_object("default", "web-0", "host001"))
    agent = lab.agent()
    agent.wait_ready()
    pod_ns = lab.pool.create("pod")
    assert lab.cni("ADD", "c0ffee01", pod_ns, "web-0").status == 0
    big = "x" * (MAX_REQUEST_BYTES + 1024)
    add = lab.cni("ADD", "c0ffee02", pod_ns, "web-0", if_name="eth1", blob=big)
    assert add.code == 4 and add.json["msg"].startswith("request too large")
    out = lab.cni("DEL", "c0ffee01", pod_ns, "web-0", blob=big)
    assert (out.status, out.stdout) == (0, ""), out
    assert lab.rows() == {} and lab.flock_links() == set()
    assert not (lab.socket.parent / "pending-deletes").exists()  # performed, not journaled
    assert agent.stop() == 0


def test_pods_cannot_claim_the_nodes_addresses_peers_or_foreign_ranges(lab):
    # An address of the node's own, inside an announce range (203.0.113.0/24 in the lab).
    lab.node.ip("addr", "add", "203.0.113.250/32", "dev", "uplink")
    A = "flock.fritzlab.net/"
    claims = {
        "own": ("203.0.113.250", "one of this node's own addresses"),
        "peer": ("2001:db8:ffff::1", "BGP peer tor1"),
        "uplink": ("192.0.2.1", "one of this node's own addresses"),
        "fabric": ("192.0.2.99", "outside this node's pod blocks and spec.announceRanges"),
        "world": ("8.8.8.8", "outside"),
        "bcast": ("255.255.255.255", "not a global unicast address"),
        "many": (",".join(f"2001:db8:aaaa::{i:x}" for i in range(5000)), "at most 64"),
    }
    for name, (value, _) in claims.items():
        lab.api.create(PODS, pod_object("default", name, "host001", annotations={A + "anycast": value}))
    lab.api.create(PODS, pod_object("default", "fine", "host001", annotations={A + "anycast": "203.0.113.9"}))
    agent = lab.agent()
    agent.wait_ready()
    for i, (name, (_, why)) in enumerate(claims.items()):
        out = lab.cni("ADD", f"c0ffee1{i}", lab.pool.create("pod"), name)
        assert (out.status, out.code) == (1, 7), (name, out)
        assert why in out.json["details"] and len(out.stdout) < 2048, (name, out.json)
        assert "2001:db8:8000::/33, 203.0.113.0/24" in out.json["details"] or name == "many"
    assert lab.rows() == {} and lab.flock_links() == set()
    ok = lab.cni("ADD", "c0ffee20", lab.pool.create("pod"), "fine")
    assert ok.status == 0, ok
    assert "203.0.113.9" in lab.node.ip("route", "show", "proto", "70")
    assert agent.stop() == 0
