"""Hypothesis drives the real flock-agent process over its socket with
requests a runtime, a broken shim or an attacker could send: any version,
op, IDs, netns paths, ifNames, configs, and fds that do or do not match what
the line announces.  The agent never dies, every answer is a result or a CNI
error with a code and a bounded message, no fd leaks, and afterwards the
store, the addresses and the kernel agree."""

from __future__ import annotations

import array
import ipaddress
import json
import os
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flock.apiserver import PODS, pod_object
from flock.netlink import host_ifname
from flock.testing.agentlab import CIDR6, open_lab, wait_for

pytestmark = pytest.mark.usefixtures("require_root")
FUZZ = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
CIDS = ("c0ffee01", "c0ffee02", "c0ffee03")
ANNOTATED = {
    "svc-0": {"anycast": "203.0.113.9", "ipv4": "true"},
    "svc-1": {"anycast": "2001:db8:aaaa::1,203.0.113.9", "ipv4": "true"},
    "evil-0": {"anycast": "192.0.2.1"},  # the node's uplink
    "evil-1": {"addresses": "2001:db8:ffff::1"},  # the BGP peer
    "evil-2": {"anycast": "255.255.255.255,8.8.8.8"},
    "evil-3": {"anycast": ",".join(f"2001:db8:aaaa::{i:x}" for i in range(5000))},
    "evil-4": {"cidr6": "2001:db8:9::/64", "ip-algo": "random:" + "9" * 3000},
}
ARGS = tuple(f"K8S_POD_NAMESPACE=default;K8S_POD_NAME={name}" for name in ("web-0", *ANNOTATED))


class World:
    """One agent and the files and namespaces the strategies point at."""

    def __init__(self, lab, tmp_path):
        self.lab = lab
        self.plain = tmp_path / "plain"
        self.plain.write_text("not a namespace")
        loop = tmp_path / "loop"
        loop.symlink_to(loop)
        self.pods = [lab.pool.create("pod") for _ in range(2)]
        self.netns_paths = [
            *(p.path for p in self.pods),
            lab.node.path,
            "/proc/self/ns/net",
            str(self.plain),
            str(loop),
            str(tmp_path / "missing"),
            "/" + "n" * 300,
            "relative/ns",
            "",
        ]
        flags = os.O_RDONLY | os.O_CLOEXEC
        self.fds = {
            "pod0": os.open(self.pods[0].path, flags),
            "pod1": os.open(self.pods[1].path, flags),
            "node": os.open(lab.node.path, flags),
            "file": os.open(self.plain, flags),
            "uts": os.open("/proc/self/ns/uts", flags),
        }
        lab.api.create(PODS, pod_object("default", "web-0", "host001"))
        # Pods whose annotations claim addresses: allowed, foreign, hostile, oversized.
        a = "flock.fritzlab.net/"
        for name, wanted in ANNOTATED.items():
            lab.api.create(
                PODS, pod_object("default", name, "host001", annotations={a + k: v for k, v in wanted.items()})
            )
        self.agent = lab.agent()
        self.agent.wait_ready()
        self.baseline_fds = self.open_fds()

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.agent.proc.pid}/fd"))

    def close(self):
        for fd in self.fds.values():
            os.close(fd)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz-agent")
    with open_lab(tmp, "fl-fuzz-", bird=False) as lab:
        w = World(lab, tmp)
        try:
            yield w
            assert w.agent.proc.poll() is None
            assert w.agent.stop() == 0
        finally:
            w.close()


good_configs = st.sampled_from(
    [
        {"cniVersion": "1.1.0"},
        {"cniVersion": "0.4.0", "prevResult": {"cniVersion": "0.4.0", "ips": []}},
        {"cniVersion": "1.1.0", "cni.dev/valid-attachments": [{"containerID": CIDS[0], "ifname": "eth0"}]},
    ]
)
configs = st.one_of(
    good_configs,
    st.just({"cniVersion": "9" * 10_000}),
    st.dictionaries(st.text(max_size=6), st.none() | st.integers() | st.text(max_size=10), max_size=3),
    st.just([]),
)


@st.composite
def wire_requests(draw, world):
    if draw(st.integers(0, 2)) == 0:  # a well-formed request, so set-ups and tear-downs happen too
        op = draw(st.sampled_from(["ADD", "ADD", "DEL", "DEL", "CHECK", "GC"]))
        pod = draw(st.sampled_from(["pod0", "pod1"]))
        obj = {
            "version": 2,
            "op": op,
            "containerID": draw(st.sampled_from(CIDS)),
            "netns": world.netns_paths[int(pod[-1])],
            "ifName": draw(st.sampled_from(["eth0", "eth1"])),
            "args": draw(st.sampled_from(ARGS)),
            "config": draw(good_configs),
            "netnsFd": op != "GC",
        }
        return obj, [world.fds[pod]] if op != "GC" else []
    obj: dict = {}
    for name, values in (
        ("version", st.sampled_from([1, 2, 2, 2, 3, "2", None])),
        ("op", st.sampled_from(["ADD", "ADD", "DEL", "CHECK", "STATUS", "GC", "FROB"])),
        ("containerID", st.sampled_from([*CIDS, "../etc", "x" * 5000])),
        ("netns", st.sampled_from(world.netns_paths)),
        ("ifName", st.sampled_from(["eth0", "eth0", "eth1", "all", "eth%d", "uplink", "x" * 16, ""])),
        ("args", st.sampled_from([*ARGS, "K8S_POD_NAME=Bad_Name", ""])),
        ("config", configs),
    ):
        if draw(st.integers(0, 9)):  # mostly present
            obj[name] = draw(values)
    announce = draw(st.sampled_from(["absent", True, True, False, "yes"]))
    if announce != "absent":
        obj["netnsFd"] = announce
    fds = draw(st.sampled_from([[], ["pod0"], ["pod0"], ["pod1"], ["node"], ["file"], ["uts"], ["pod0", "pod1"]]))
    return obj, [world.fds[f] for f in fds]


def call(path, obj, fds) -> dict:
    line = json.dumps(obj).encode() + b"\n"
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(str(path))
        try:
            if fds:
                s.sendmsg([line], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
            else:
                s.sendall(line)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused early; the reply is still there
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = s.recv(65536)
            assert chunk, f"the agent hung up without an answer to {obj!r:.300}"
            reply += chunk
    return json.loads(reply)


def kernel_and_store_agree(world) -> None:
    rows = world.lab.rows()
    links = world.lab.flock_links()
    committed = {cid for cid, a in rows.items() if a.state.value == "committed"}
    assert {host_ifname(cid) for cid in committed} <= links
    assert links <= {host_ifname(cid) for cid in rows}, (links, rows)
    addresses = [a for row in rows.values() for a in (row.ip6, row.ip4, *row.addresses) if a is not None]
    assert len(addresses) == len(set(addresses))
    # Only what the policy allows was ever claimed (and so routed and announced).
    claimed = {a for row in rows.values() for a in (*row.anycast, *row.addresses)}
    assert claimed <= {ipaddress.ip_address("203.0.113.9"), ipaddress.ip_address("2001:db8:aaaa::1")}, claimed
    assert all(a.ip6 in ipaddress.ip_network(CIDR6) for a in rows.values())
    assert "uplink" in world.lab.node.ip("-o", "link")


def test_any_wire_request_with_any_fds_is_answered_and_leaves_agreement(world):
    @FUZZ
    @given(data=st.data())
    def run(data):
        obj, fds = data.draw(wire_requests(world))
        reply = call(world.lab.socket, obj, fds)
        assert set(reply) in ({"result"}, {"error"}), reply
        if "error" in reply:
            err = reply["error"]
            assert isinstance(err["code"], int) and err["code"] > 0
            assert 0 < len(err["msg"]) <= 260 and len(err.get("details", "")) <= 4200
        assert world.agent.proc.poll() is None
        kernel_and_store_agree(world)

    run()
    # Whatever the fuzz left, the agent still serves a good ADD and DEL (deterministic: whether the random
    # draws happened to include a successful DEL is chance).
    for op in ("ADD", "DEL"):
        good = {
            "version": 2, "op": op, "containerID": "c0ffeeff", "netns": world.netns_paths[0], "ifName": "eth9",
            "args": ARGS[0], "config": {"cniVersion": "1.1.0"}, "netnsFd": True,
        }  # fmt: skip
        reply = call(world.lab.socket, good, [world.fds["pod0"]])
        assert "result" in reply, (op, reply)
        kernel_and_store_agree(world)
    assert "c0ffeeff" not in world.lab.rows()
    # No fd leaks: back to (at most) what the agent held before, once transient sockets close.
    wait_for("the agent's fds to settle", lambda: world.open_fds() <= world.baseline_fds, 10)
