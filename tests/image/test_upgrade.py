"""The upgrade drill (issue 26): the previous release rolled to this one and back under traffic.

The previous release (flock.testing.releases.PREVIOUS_RELEASE) is built from git
history by its own recipe (``scripts/build-image --ref``) and runs a three-node
image lab with its own ``deploy/`` (``flock-lab up --image OLD --manifest-ref``).
Pods on every node: dual-stack and IPv6-only ones, an anycast service with a
replica on two nodes, and a NetworkPolicy in force (``secure/vault`` admits
``role=client`` only).  While a continuous probe runs —

* ping at 20 Hz between pods on different nodes (IPv6 and IPv4, to the
  anycast address, and to the policed pod from its allowed client),
* a new TCP connection at 10 Hz per pair (each must complete and get the pod
  server's greeting within 1 s),
* two held TCP connections across nodes echoing a message every 50 ms,
* and the pair the policy blocks (``secure/intruder`` → ``secure/vault``)
  tried with TCP and ping at the same rates,

— ``flock-lab upgrade --image NEW`` replaces each node's pod in turn as the
DaemonSet's RollingUpdate (maxUnavailable 1) does, then ``flock-lab upgrade
--image OLD --manifest-ref PREVIOUS_RELEASE`` rolls back the same way.  The
fabric's sessions are restart-safe (``--fabric-bfd graceful``): a fabric
that withdraws a node on BFD loss flaps its pod block for the second BIRD
takes to restart, graceful restart or not.

Goals, asserted: no probe lost, no pod's address or MAC changed (and CNI
CHECK passes with the result the old release's ADD gave), the blocked pair
never connected, every preStop hook ran and no container was restarted.  The
figures are printed as one JSON line (for BENCHMARKS.md).
"""

from __future__ import annotations

import errno
import json
import re
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from flock.lab import LabPlan, apply_objects, down, load_pods, pod_add, pod_check, pod_del, server_version, up
from flock.lab._image import ImageSettings
from flock.lab._nsio import run_in, socket_in
from flock.lab._pods import LabPod, parse_annotations
from flock.lab._policy import wait_applied
from flock.lab._ports import PortSpec
from flock.lab._releases import deploy_from_git
from flock.lab._state import load_procs
from flock.testing.releases import PREVIOUS_RELEASE

pytestmark = pytest.mark.image

DRILL_DEADLINE_S = 480
ANYCAST6, ANYCAST4 = "2001:db8:53::53", "192.0.2.153"
PING_INTERVAL_S = 0.05  # 20 Hz
TCP_INTERVAL_S = 0.1  # 10 Hz
HELD_INTERVAL_S = 0.05
PROBE_TIMEOUT_S = 1.0  # a probe not answered within this is lost
HELD_PORT = 7000
# The pods: (node, key, annotations, labels).  Each serves 80/TCP (dual-stack unless ipv4=false).
PODS: tuple[tuple[str, str, tuple[str, ...], dict[str, str]], ...] = (
    ("node1", "drill/web-1", (), {}),
    ("node1", "drill/dns-1", (f"anycast={ANYCAST6},{ANYCAST4}",), {"app": "dns"}),
    ("node1", "secure/intruder", ("ipv4=false",), {"app": "intruder"}),
    ("node2", "drill/web-2", (), {}),
    ("node2", "secure/vault", ("ipv4=false",), {"app": "vault"}),
    ("node3", "drill/v6-3", ("ipv4=false",), {}),
    ("node3", "drill/dns-3", (f"anycast={ANYCAST6},{ANYCAST4}",), {"app": "dns"}),
    ("node3", "secure/client", ("ipv4=false",), {"app": "client", "role": "client"}),
)
POLICY = {
    "apiVersion": "networking.k8s.io/v1",
    "kind": "NetworkPolicy",
    "metadata": {"name": "vault-from-clients", "namespace": "secure"},
    "spec": {
        "podSelector": {"matchLabels": {"app": "vault"}},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}],
    },
}


@pytest.fixture(scope="module")
def old_image(build_image) -> dict[str, Any]:
    """The previous release's image, built from git history by its own scripts/build-image."""
    out = build_image("--ref", PREVIOUS_RELEASE)
    if out.returncode != 0:
        pytest.fail(f"scripts/build-image --ref {PREVIOUS_RELEASE[:12]} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout)


# --- the continuous probe --------------------------------------------------------------------


@attrs.define
class Stream:
    """One probe stream: what was sent, when probes were lost (drill seconds), why."""

    name: str
    kind: str  # ping, tcp, held; blocked-ping, blocked-tcp (must never get through)
    sent: int = 0
    lost: list[tuple[float, str]] = attrs.field(factory=list)  # (when, why)
    through: list[float] = attrs.field(factory=list)  # a blocked stream's probes that got through
    max_rtt_ms: float = 0.0

    @property
    def blocked(self) -> bool:
        return self.kind.startswith("blocked")


@attrs.define
class Drill:
    t0: float = attrs.field(factory=time.monotonic)
    wall0: float = attrs.field(factory=time.time)
    streams: list[Stream] = attrs.field(factory=list)
    phases: dict[str, tuple[float, float]] = attrs.field(factory=dict)
    rollouts: dict[str, Any] = attrs.field(factory=dict)  # flock-lab upgrade's documents, by phase
    stop: trio.Event = attrs.field(factory=trio.Event)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def stream(self, name: str, kind: str) -> Stream:
        s = Stream(name, kind)
        self.streams.append(s)
        return s

    def phase_of(self, t: float) -> str:
        """ "upgrade node2" while node2's pod was replaced (from its deletion to Ready), "upgrade"
        between nodes, "steady" outside the rollouts."""
        for name, (a, b) in self.phases.items():
            if a <= t <= b:
                for node in self.rollouts.get(name, {}).get("nodes", []):
                    began = node["began_at"] - self.wall0
                    if began <= t <= began + node["not_ready_s"]:
                        return f"{name} {node['node']}"
                return name
        return "steady"

    async def ticker(self, interval: float, probe: Callable[[], Awaitable[None]]) -> None:
        """*probe* started every *interval* seconds (each in its own task) until the drill stops."""
        async with trio.open_nursery() as nursery:
            deadline = trio.current_time()
            while not self.stop.is_set():
                nursery.start_soon(probe)
                deadline += interval
                with trio.move_on_at(deadline):
                    await self.stop.wait()


def _family(address: str) -> int:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


async def _tcp_once(netns: str, address: str, port: int) -> str | None:
    """A new connection from *netns* that gets the lab server's greeting within PROBE_TIMEOUT_S:
    None, else why not."""
    raw = await trio.to_thread.run_sync(socket_in, netns, _family(address), socket.SOCK_STREAM)
    with trio.socket.from_stdlib_socket(raw) as sock:
        with trio.move_on_after(PROBE_TIMEOUT_S):
            try:
                await sock.connect((address, port))
                greeting = await sock.recv(256)
            except OSError as exc:
                return errno.errorcode.get(exc.errno or 0, str(exc))
            return None if greeting else "closed without a greeting"
        return "timeout"


async def tcp_stream(drill: Drill, name: str, src: LabPod, address: str, port: int, *, blocked: bool) -> None:
    s = drill.stream(name, "blocked-tcp" if blocked else "tcp")

    async def probe() -> None:
        s.sent += 1
        at = drill.now()
        why = await _tcp_once(src.netns, address, port)
        if blocked and why is None:
            s.through.append(round(at, 2))
        elif not blocked and why is not None:
            s.lost.append((round(at, 2), why))

    await drill.ticker(TCP_INTERVAL_S, probe)


async def held_stream(drill: Drill, name: str, src: LabPod, dst: LabPod, address: str) -> None:
    """One TCP connection for the whole drill: a message every 50 ms, echoed by a server in *dst*;
    a message echoed later than 1 s (or never) is lost, a reset or close breaks the stream."""
    s = drill.stream(name, "held")
    listener = trio.socket.from_stdlib_socket(
        await trio.to_thread.run_sync(socket_in, dst.netns, socket.AF_INET6, socket.SOCK_STREAM)
    )
    client = trio.socket.from_stdlib_socket(
        await trio.to_thread.run_sync(socket_in, src.netns, _family(address), socket.SOCK_STREAM)
    )
    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    await listener.bind(("::", HELD_PORT))
    listener.listen(1)
    sent_at: dict[int, float] = {}

    async def echo() -> None:
        conn, _ = await listener.accept()
        with conn:
            while data := await conn.recv(4096):
                while data:
                    data = data[await conn.send(data) :]

    async def send() -> None:
        seq = 0
        while not drill.stop.is_set():
            seq += 1
            sent_at[seq] = drill.now()
            s.sent += 1
            await client.send(seq.to_bytes(8, "big"))
            with trio.move_on_after(HELD_INTERVAL_S):
                await drill.stop.wait()

    async def receive() -> None:
        buf = b""
        while True:
            chunk = await client.recv(4096)
            if not chunk:
                raise OSError(errno.ECONNRESET, "closed by the server")
            buf += chunk
            while len(buf) >= 8:
                seq, buf = int.from_bytes(buf[:8], "big"), buf[8:]
                rtt = drill.now() - sent_at.pop(seq)
                s.max_rtt_ms = max(s.max_rtt_ms, round(rtt * 1000, 1))
                if rtt > PROBE_TIMEOUT_S:
                    s.lost.append((round(drill.now() - rtt, 2), f"echoed after {rtt:.2f} s"))

    with listener, client:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(echo)
            await client.connect((address, HELD_PORT))
            try:
                async with trio.open_nursery() as inner:
                    inner.start_soon(receive)
                    await send()
                    with trio.move_on_after(PROBE_TIMEOUT_S):  # the last echoes
                        while sent_at:  # noqa: ASYNC110 (filled and emptied by the tasks here)
                            await trio.sleep(0.01)
                    inner.cancel_scope.cancel()
            except OSError as exc:
                s.lost.append((round(drill.now(), 2), f"connection broken: {exc}"))
            for seq, at in sent_at.items():
                s.lost.append((round(at, 2), f"message {seq} never echoed"))
            nursery.cancel_scope.cancel()


_PING_LINE = re.compile(r"\[(\d+\.\d+)\] (.*)")
_SEQ = re.compile(r"icmp_seq=(\d+)")


async def ping_stream(drill: Drill, name: str, src: LabPod, address: str, log: Path, *, blocked: bool) -> None:
    """iputils ping at 20 Hz for the whole drill (-O: a line for each request unanswered when the
    next goes out); afterwards every sequence number up to the last answered one that got no
    answer is lost (and the ones after it, if more than a second's worth)."""
    s = drill.stream(name, "blocked-ping" if blocked else "ping")
    argv = ["ip", "netns", "exec", src.netns, "ping", "-D", "-O", "-n", "-i", str(PING_INTERVAL_S)]
    argv += ["-W", str(int(PROBE_TIMEOUT_S)), address]
    with open(log, "wb") as out:  # noqa: ASYNC230 (a local file, opened once)
        proc = await trio.lowlevel.open_process(argv, stdout=out, stderr=out)
    try:
        await drill.stop.wait()
    finally:
        proc.send_signal(signal.SIGINT)
        with trio.move_on_after(5):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    replies: dict[int, float] = {}
    unanswered: dict[int, float] = {}
    transmitted = 0
    for line in (await trio.Path(log).read_text(errors="replace")).splitlines():
        if m := re.match(r"(\d+) packets transmitted", line):
            transmitted = int(m.group(1))
        m = _PING_LINE.match(line)
        seq = _SEQ.search(line)
        if m is None or seq is None:
            continue
        at = float(m.group(1)) - drill.wall0
        if "bytes from" in m.group(2) and "DUP" not in m.group(2):
            replies[int(seq.group(1))] = at
        elif m.group(2).startswith("no answer yet"):
            unanswered.setdefault(int(seq.group(1)), at)
    s.sent = transmitted
    if blocked:
        s.through = [round(t, 2) for t in replies.values()]
        return
    last = max(replies, default=0)
    tail = range(last + 1, transmitted + 1) if transmitted - last > 1 / PING_INTERVAL_S else range(0)
    for seq in [*range(1, last + 1), *tail]:
        if seq not in replies:
            s.lost.append((round(unanswered.get(seq, 0.0), 2), f"icmp_seq={seq} unanswered"))


# --- what must not change ----------------------------------------------------------------------


async def _ip_json(netns: str, *args: str) -> Any:
    proc = await run_in(netns, ["ip", "-j", *args])
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout or b"[]")


async def identity(plan: LabPlan, pod: LabPod) -> dict[str, Any]:
    """The pod's interface (MAC, addresses) and its host side (veth name, MAC), as the kernel has them."""
    (link,) = await _ip_json(pod.netns, "addr", "show", "dev", pod.if_name)
    node = plan.node(pod.node)
    peers = [x for x in await _ip_json(node.netns, "link", "show") if x.get("ifindex") == link.get("link_index")]
    return {
        "mac": link.get("address"),
        "addresses": sorted(a["local"] for a in link.get("addr_info", []) if a.get("scope") == "global"),
        "host_veth": [(p["ifname"], p.get("address")) for p in peers],
    }


async def identities(plan: LabPlan) -> dict[str, dict[str, Any]]:
    return {pod.key: await identity(plan, pod) for pod in load_pods(plan)}


async def flock_lab(plan: LabPlan, *args: str) -> dict[str, Any]:
    """``flock-lab ARGS --dir LAB --json`` as an operator runs it; its JSON document."""
    proc = await trio.run_process(
        [sys.executable, "-m", "flock.lab.cli", *args, "--dir", str(plan.dir), "--json"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"flock-lab {' '.join(args)} exited {proc.returncode}:\n{proc.stderr.decode()[-3000:]}")
    return json.loads(proc.stdout)


def _addr(pod: LabPod, family: int) -> str:
    return pod.addresses(family)[0]


# --- the drill -----------------------------------------------------------------------------------


async def test_rolling_upgrade_and_rollback_lose_nothing(image, old_image, capsys) -> None:
    image_dir = Path(image["dir"])
    new_tag, old_tag = image["image"], old_image["image"]
    old_deploy = await trio.to_thread.run_sync(deploy_from_git, PREVIOUS_RELEASE, image_dir / "manifests")
    directory = Path(tempfile.mkdtemp(prefix="flab-u-"))
    plan = LabPlan.make(directory, 3, fabric_bfd="graceful")
    drill = Drill()
    rollouts = drill.rollouts
    changed: dict[str, Any] = {}
    checks: dict[str, list[str]] = {}
    started = time.monotonic()
    try:
        with trio.fail_after(DRILL_DEADLINE_S):
            await up(plan, image=ImageSettings(old_tag, image_dir, old_deploy))
            for node, key, notes, labels in PODS:
                await pod_add(
                    plan, node, key, parse_annotations(notes), labels=labels, ports=[PortSpec.parse("80/TCP")]
                )
            await apply_objects(plan, [POLICY])
            with trio.fail_after(30):
                await wait_applied(plan, await server_version(plan), {})
            pods = {p.key: p for p in load_pods(plan)}
            web1, web2, v63 = pods["drill/web-1"], pods["drill/web-2"], pods["drill/v6-3"]
            client, vault, intruder = pods["secure/client"], pods["secure/vault"], pods["secure/intruder"]
            # Before anything moves: the policy is in force, everything else connects.
            assert await _tcp_once(intruder.netns, _addr(vault, 6), 80) is not None, "the policy is not in force"
            for src, dst in ((client, vault), (web1, web2), (v63, web1)):
                assert await _tcp_once(src.netns, _addr(dst, 6), 80) is None, (src.key, dst.key)
            before = await identities(plan)
            logs = directory / "probes"
            logs.mkdir()

            async with trio.open_nursery() as nursery:
                pings = [
                    ("web-1 → web-2 v6", web1, _addr(web2, 6)),
                    ("web-2 → v6-3 v6", web2, _addr(v63, 6)),
                    ("v6-3 → web-1 v6", v63, _addr(web1, 6)),
                    ("web-1 → web-2 v4", web1, _addr(web2, 4)),
                    ("web-2 → web-1 v4", web2, _addr(web1, 4)),
                    ("web-2 → anycast v6", web2, ANYCAST6),
                    ("web-2 → anycast v4", web2, ANYCAST4),
                    ("client → vault v6 (allowed)", client, _addr(vault, 6)),
                ]
                for i, (name, src, address) in enumerate(pings):
                    nursery.start_soon(
                        lambda n=name, s=src, a=address, i=i: ping_stream(
                            drill, f"ping {n}", s, a, logs / f"ping-{i}.log", blocked=False
                        )
                    )
                nursery.start_soon(
                    lambda: ping_stream(
                        drill, "ping intruder → vault v6", intruder, _addr(vault, 6), logs / "blocked.log", blocked=True
                    )
                )
                tcps = [
                    ("web-1 → web-2 v6", web1, _addr(web2, 6)),
                    ("web-2 → v6-3 v6", web2, _addr(v63, 6)),
                    ("v6-3 → web-1 v6", v63, _addr(web1, 6)),
                    ("web-1 → web-2 v4", web1, _addr(web2, 4)),
                    ("web-2 → anycast v6", web2, ANYCAST6),
                    ("client → vault v6 (allowed)", client, _addr(vault, 6)),
                ]
                for name, src, address in tcps:
                    nursery.start_soon(
                        lambda n=name, s=src, a=address: tcp_stream(drill, f"tcp {n}", s, a, 80, blocked=False)
                    )
                nursery.start_soon(
                    lambda: tcp_stream(drill, "tcp intruder → vault v6", intruder, _addr(vault, 6), 80, blocked=True)
                )
                nursery.start_soon(lambda: held_stream(drill, "held web-1 → v6-3 v6", web1, v63, _addr(v63, 6)))
                nursery.start_soon(lambda: held_stream(drill, "held web-2 → web-1 v4", web2, web1, _addr(web1, 4)))
                await trio.sleep(2)

                # Upgrade: the previous release → this tree, the manifest of this tree.
                a = drill.now()
                rollouts["upgrade"] = await flock_lab(plan, "upgrade", "--image", new_tag)
                drill.phases["upgrade"] = (a, drill.now())
                changed["upgrade"] = _diff(before, await identities(plan))
                checks["upgrade"] = await _check_all(plan)
                # A pod the new release adds, which the old one must keep (and delete) after the rollback.
                await pod_add(plan, "node2", "drill/late-2", parse_annotations(["ipv4=true"]))
                late = await identities(plan)
                await trio.sleep(1)

                # Rollback: this tree → the previous release with its own manifest, docs/upgrading.md's way.
                a = drill.now()
                rollouts["downgrade"] = await flock_lab(
                    plan, "upgrade", "--image", old_tag, "--manifest-ref", PREVIOUS_RELEASE
                )
                drill.phases["downgrade"] = (a, drill.now())
                changed["downgrade"] = _diff(late, await identities(plan))
                checks["downgrade"] = await _check_all(plan)
                await trio.sleep(2)
                drill.stop.set()
            await pod_del(plan, "drill/late-2")
            procs = load_procs(plan.dir)["processes"]
            keeper_log = (plan.dir / "keeper.log").read_text()
            bird_logs = {node.name: (node.dir / "bird.log").read_text() for node in plan.nodes}
    finally:
        with trio.move_on_after(60, shield=True):
            await down(plan.dir)
            await trio.run_process(["rm", "-rf", "--", str(directory)], check=False)

    hooks = [json.loads(line) for line in keeper_log.splitlines() if '"pre-stop"' in line]
    restarts = {name: p["restarts"] for name, p in procs.items() if name.startswith(("agent-", "bird-"))}
    figures = _figures(drill, rollouts, changed, old_image, image, len(PODS), time.monotonic() - started)
    with capsys.disabled():
        print("\nupgrade drill: " + json.dumps(figures), flush=True)
    problems = [
        f"{s.name}: {len(s.lost)} of {s.sent} lost: "
        + ", ".join(f"{t:.2f} s ({drill.phase_of(t)}): {why}" for t, why in s.lost[:8])
        for s in drill.streams
        if s.lost
    ]
    problems += [f"{s.name}: BLOCKED PAIR GOT THROUGH at {s.through[:8]}" for s in drill.streams if s.through]
    problems += [f"{phase}: pods changed: {diff}" for phase, diff in changed.items() if diff]
    problems += [f"{phase}: CNI CHECK failed: {failed}" for phase, failed in checks.items() if failed]
    if len(hooks) != 2 * len(plan.nodes):  # BIRD's, per node, upgrade and rollback
        problems.append(f"expected {2 * len(plan.nodes)} preStop hooks, the keeper ran {len(hooks)}: {hooks}")
    for node, text in bird_logs.items():
        # The hook stops BIRD itself (its exec's status says little): BIRD's log says how it went down.
        graceful, plain = (
            text.count("Shutting down for graceful restart"),
            len(re.findall(r"Shutting down$", text, re.M)),
        )
        if graceful != 2 or plain:
            problems.append(f"{node}'s BIRD went down {graceful} times for graceful restart, {plain} times plainly")
    problems += [f"{name} restarted {n} times" for name, n in restarts.items() if n]
    if not all(s.sent for s in drill.streams):
        problems.append(f"a stream sent nothing: {[s.name for s in drill.streams if not s.sent]}")
    assert not problems, "\n".join(problems) + "\nnodes: " + json.dumps(rollouts)


def _diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {k: {"before": v, "after": after.get(k)} for k, v in before.items() if after.get(k) != v}


async def _check_all(plan: LabPlan) -> list[str]:
    """CNI CHECK of every pod with the result its ADD returned; the pods it failed for."""
    failed = []
    for pod in load_pods(plan):
        try:
            await pod_check(plan, pod.key)
        except Exception as exc:  # the message is the figure
            failed.append(f"{pod.key}: {exc}")
    return failed


def _figures(
    drill: Drill,
    rollouts: dict[str, Any],
    changed: dict[str, Any],
    old: dict[str, Any],
    new: dict[str, Any],
    pods: int,
    seconds: float,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "drill": "rolling upgrade and rollback, 3 nodes",
        "from": old["image"],
        "to": new["image"],
        "pods": pods,
        "probe_streams": len(drill.streams),
        "probes_sent": sum(s.sent for s in drill.streams if not s.blocked),
        "probes_lost": sum(len(s.lost) for s in drill.streams),
        "blocked_probes": sum(s.sent for s in drill.streams if s.blocked),
        "blocked_got_through": sum(len(s.through) for s in drill.streams),
        "held_max_rtt_ms": max((s.max_rtt_ms for s in drill.streams if s.kind == "held"), default=None),
        "seconds": round(seconds, 1),
    }
    for phase, doc in rollouts.items():
        lost = sum(1 for s in drill.streams for t, _ in s.lost if drill.phase_of(t).startswith(phase))
        out[phase] = {
            "seconds": doc["seconds"],
            "probes_lost": lost,
            "pods_changed": len(changed.get(phase, {})),
            "not_ready_s": {n["node"]: n["not_ready_s"] for n in doc["nodes"]},
            "agent_ready_s": {n["node"]: n["agent_ready_s"] for n in doc["nodes"]},
        }
    return out
