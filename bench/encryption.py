"""Pod to pod across two nodes, with and without encryption (issue 36): throughput and latency.

Two two-node flock-labs up at once in one run: a plain one and one with
``--encrypt`` (every agent ``--encryption wireguard`` over Debian's
wireguard-go, userspace: this machine's kernel has no WireGuard module).  In
each, one dual-stack pod on node1 and one on node2.  Measured between the
two pods, per IP version, the two labs in turn (the order alternating from
one round to the next), ``--rounds`` times:

- **throughput**: one TCP stream node1's pod → node2's pod for ``--seconds``
  (``sendall`` of 256 KiB blocks), counted at the receiver from its first
  byte to its last; both ends are threads of this process, their sockets
  made inside the pods' namespaces (:func:`flock.lab.socket_in`);
- **CPU** during the stream: the wireguard-go processes of both nodes
  (utime + stime from /proc/PID/stat) and this process (the sender and the
  receiver: their syscalls, and the kernel's TCP work done in them), as CPU
  seconds per GB carried; the sender's TCP retransmissions, and the
  datagrams the receiving node dropped for a full UDP socket buffer (with
  encryption: wireguard-go's socket, read more slowly than it fills);
- **TCP round trip**: ``--pings`` 1-byte request/response exchanges on one
  connection (TCP_NODELAY), timed at the client; p50 and p99;
- **ICMP round trip**: ``ping -i 0.005`` from node1's pod, p50 and p99 of the
  replies' times.

Per figure the median over the rounds (of the rounds' p50 and p99 for the
round trips), and the ratio encrypted / plain.  The pods' MTU in each lab
is shown: with encryption the agents lower it by WireGuard's overhead (80
bytes over IPv6), so the same stream is carried in more, smaller packets.

The machine has no iperf3/netperf: both ends are Python threads, good for
about 1.8 GB/s over the plain lab's veths on its 2 cores (the harness's
bound, not the veths'), far above what the tunnel carries here, so the
encrypted figure is the tunnel's.  What one run showed (BENCHMARKS.md): the
stream through wireguard-go is CPU-bound (1.4 of the 2 cores in the two
wireguard-go processes), and about one datagram in ten is dropped at the
receiving node's UDP socket (RcvbufErrors: the receiving wireguard-go reads
its socket more slowly than the sender fills it), each drop a TCP
retransmission.

**What the kernel module would change** (production's WireGuard; none here).
wireguard-go is a process: every packet crosses /dev/net/tun on both nodes
(the stack → wireguard-go → its UDP socket on the sender, the reverse on the
receiver), with a copy and a system call or more each way and the Go
scheduler in between; Debian's build (v0.0.20220316) reads and writes the
TUN device one MTU-sized packet at a time, without offloads, so a TCP
stream is segmented before it reaches the tunnel and nothing coalesces it
after.  The kernel's WireGuard (mainline since Linux 5.6) is a network
device: packets never leave the kernel, encryption and decryption run on
per-CPU workers (its multicore queueing over workqueues and NAPI), it takes
GSO super-packets from the stack and segments them itself just before
encrypting, hands decrypted packets to GRO (napi_gro_receive), and takes
datagrams from the UDP layer's encapsulation hook, with no socket buffer for
them to overflow (its own queues are bounded).  Expect most of the
throughput gap and of the added CPU a byte to close, and the added round
trip (four hand-offs to wireguard-go and back, each a wake-up of a
process) to shrink towards the ChaCha20-Poly1305 work itself; by how much on
a 2-core machine shared with the pods this machine cannot show.  Later
wireguard-go releases (from 2023, Tailscale's work) batch packets and use
segmentation offload on the TUN device and the UDP socket, and narrow the
gap too; they are not what Debian ships here.

    python bench/encryption.py [--seconds 4] [--rounds 3] [--pings 2000] [--families 6,4] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio
from labkit import emit

from flock.lab import LabPlan, down, pod_add, run_in, socket_in, up
from flock.testing.benchkit import percentile

DUAL = {"flock.fritzlab.net/ipv4": "true"}
BLOCK = 256 * 1024
STREAM_PORT, ECHO_PORT = 5201, 5202
IO_TIMEOUT = 15.0
MODES = ("plain", "encrypted")
CLK_TCK = os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def lab_with_pods(encrypt: bool) -> AsyncIterator[tuple[LabPlan, Any, Any]]:
    """A two-node lab (under /run: unix socket paths) with a dual-stack pod on
    each node, taken down and removed afterwards, also on failure."""
    directory = Path(tempfile.mkdtemp(prefix="flab-b", dir="/run"))
    plan = LabPlan.make(directory, 2, encrypt=encrypt)
    try:
        await up(plan)
        a = await pod_add(plan, "node1", "bench/a", DUAL)
        b = await pod_add(plan, "node2", "bench/b", DUAL)
        yield plan, a, b
    finally:
        with trio.move_on_after(60, shield=True):
            await down(directory)
        shutil.rmtree(directory, ignore_errors=True)


def blocking(sock: socket.socket) -> socket.socket:
    sock.settimeout(IO_TIMEOUT)
    return sock


def listener(netns: str, family: int, port: int) -> socket.socket:
    sock = blocking(socket_in(netns, family, socket.SOCK_STREAM))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
    sock.listen(1)
    return sock


def connected(netns: str, family: int, host: str, port: int) -> socket.socket:
    sock = blocking(socket_in(netns, family, socket.SOCK_STREAM))
    sock.connect((host, port))
    return sock


def in_thread(fn, *args) -> tuple[threading.Thread, dict[str, Any]]:
    """*fn(*args)* on a thread; its result or exception in the dict after join."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn(*args)
        except BaseException as exc:  # handed to the caller
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def joined(thread: threading.Thread, out: dict[str, Any]) -> Any:
    thread.join(IO_TIMEOUT + 5)
    if thread.is_alive():
        raise TimeoutError("a bench thread did not finish")
    if "error" in out:
        raise out["error"]
    return out["result"]


def wireguard_go_pids(plan: LabPlan) -> list[int]:
    """The wireguard-go processes serving this lab's devices (none for a plain lab)."""
    devices = {n.wireguard_device for n in plan.nodes if n.wireguard_device}
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"wireguard-go") and any(a.decode(errors="replace") in devices for a in argv[1:]):
            pids.append(int(entry.name))
    return pids


def cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            text = Path(f"/proc/{pid}/stat").read_text()
            fields = text[text.rindex(")") + 2 :].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def stream(src: str, dst: str, family: int, host: str, seconds: float, wg_pids: list[int]) -> dict[str, float]:
    """One TCP stream src → dst for *seconds*; bytes/s at the receiver and the CPU it cost."""
    server = listener(dst, family, STREAM_PORT)

    def receive() -> tuple[int, float, float]:
        conn, _ = server.accept()
        with conn:
            blocking(conn)
            buf = bytearray(1 << 20)
            view = memoryview(buf)
            n = conn.recv_into(view)
            first = time.perf_counter()
            total, last = 0, first  # the first read starts the clock: its bytes are not counted
            while True:
                n = conn.recv_into(view)
                if not n:
                    return total, first, last
                total += n
                last = time.perf_counter()

    try:
        thread, out = in_thread(receive)
        client = connected(src, family, host, STREAM_PORT)
        wg0, me0 = cpu_s(wg_pids), self_cpu_s()
        payload = memoryview(bytes(BLOCK))
        with client:
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                client.sendall(payload)
            client.shutdown(socket.SHUT_WR)
            total, first, last = joined(thread, out)
        wg1, me1 = cpu_s(wg_pids), self_cpu_s()
    finally:
        server.close()
    gb = total / 1e9
    return {
        "MB_per_s": total / (last - first) / 1e6,
        "bytes": total,
        "wireguard_go_cpu_s_per_GB": (wg1 - wg0) / gb,
        "bench_cpu_s_per_GB": (me1 - me0) / gb,
    }


def ping_pong(src: str, dst: str, family: int, host: str, count: int) -> list[float]:
    """*count* 1-byte request/response exchanges on one connection; the round trips (s)."""
    server = listener(dst, family, ECHO_PORT)

    def echo() -> None:
        conn, _ = server.accept()
        with conn:
            blocking(conn).setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(64):
                conn.sendall(data)

    try:
        thread, out = in_thread(echo)
        rtts = []
        with connected(src, family, host, ECHO_PORT) as client:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(20 + count):  # 20 to warm up, not counted
                t0 = time.perf_counter()
                client.sendall(b"x")
                if client.recv(64) != b"x":
                    raise RuntimeError("echo: unexpected reply")
                rtts.append(time.perf_counter() - t0)
            client.shutdown(socket.SHUT_WR)
            joined(thread, out)
    finally:
        server.close()
    return rtts[20:]


async def icmp(src: str, host: str, count: int) -> list[float]:
    """ping's reply times (s) from the pod's namespace."""
    got = await run_in(src, ["ping", "-n", "-c", str(count), "-i", "0.005", "-W", "2", host])
    times = [float(t) / 1000 for t in re.findall(rb"time=([0-9.]+) ms", got.stdout)]
    if len(times) < count * 0.9:
        raise RuntimeError(f"ping {host}: {len(times)} of {count} replies: {got.stdout[-300:]!r}")
    return times


async def reachable(src: str, host: str) -> None:
    """Until *host* answers (the tunnel's first handshake, the routes): 30 tries, a second or so each."""
    for _ in range(30):
        if (await run_in(src, ["ping", "-n", "-c", "1", "-W", "1", host])).returncode == 0:
            return
        await trio.sleep(0.2)
    raise RuntimeError(f"{host} does not answer ping from {src}")


async def snmp(netns: str, table: str) -> dict[str, int]:
    """One table ("Tcp", "Udp") of the namespace's /proc/net/snmp."""
    text = (await run_in(netns, ["cat", "/proc/net/snmp"])).stdout.decode()
    names, values = (line.split()[1:] for line in text.splitlines() if line.startswith(table + ":"))
    return dict(zip(names, map(int, values), strict=True))


async def udp_rcvbuf_errors(netns: str) -> int:
    """Datagrams the namespace dropped for a full UDP socket buffer, IPv4 and IPv6."""
    text = (await run_in(netns, ["cat", "/proc/net/snmp6"])).stdout.decode()
    v6 = sum(int(line.split()[1]) for line in text.splitlines() if line.startswith("Udp6RcvbufErrors"))
    return (await snmp(netns, "Udp"))["RcvbufErrors"] + v6


async def pod_mtu(pod) -> int:
    got = await run_in(pod.netns, ["ip", "-j", "link", "show", pod.if_name])
    return json.loads(got.stdout)[0]["mtu"]


async def one_round(setup: dict, mode: str, family: int, args: argparse.Namespace) -> dict[str, Any]:
    plan, a, b = setup[mode]
    host = b.addresses(family)[0]
    fam = socket.AF_INET6 if family == 6 else socket.AF_INET
    wg_pids = wireguard_go_pids(plan)
    if mode == "encrypted" and len(wg_pids) != 2:
        raise RuntimeError(f"expected 2 wireguard-go processes for {plan.dir}, found {wg_pids}")
    await reachable(a.netns, host)
    receiver_node = plan.node(b.node).netns
    retrans, dropped = (await snmp(a.netns, "Tcp"))["RetransSegs"], await udp_rcvbuf_errors(receiver_node)
    tput = await trio.to_thread.run_sync(stream, a.netns, b.netns, fam, host, args.seconds, wg_pids)
    tput["retransmits"] = (await snmp(a.netns, "Tcp"))["RetransSegs"] - retrans
    tput["udp_rcvbuf_drops"] = await udp_rcvbuf_errors(receiver_node) - dropped
    tcp = await trio.to_thread.run_sync(ping_pong, a.netns, b.netns, fam, host, args.pings)
    ping = await icmp(a.netns, host, args.icmp)
    return {
        **tput,
        "tcp_rtt_p50_us": statistics.median(tcp) * 1e6,
        "tcp_rtt_p99_us": percentile(tcp, 0.99) * 1e6,
        "icmp_rtt_p50_us": statistics.median(ping) * 1e6,
        "icmp_rtt_p99_us": percentile(ping, 0.99) * 1e6,
    }


# (key, label, digits) of the table's rows
ROWS = (
    ("MB_per_s", "throughput, MB/s", 0),
    ("tcp_rtt_p50_us", "TCP round trip p50, µs", 0),
    ("tcp_rtt_p99_us", "TCP round trip p99, µs", 0),
    ("icmp_rtt_p50_us", "ICMP round trip p50, µs", 0),
    ("icmp_rtt_p99_us", "ICMP round trip p99, µs", 0),
    ("wireguard_go_cpu_s_per_GB", "wireguard-go CPU, s/GB", 2),
    ("bench_cpu_s_per_GB", "sender + receiver CPU, s/GB", 2),
    ("retransmits", "segments retransmitted in the stream", 0),
    ("udp_rcvbuf_drops", "tunnel datagrams dropped at node2's UDP socket", 0),
)


def table(medians: dict[str, dict[str, dict[str, float]]], families: list[int]) -> str:
    lines = [
        "| IPv{} | plain | encrypted | encrypted / plain |".format("/".join(map(str, families))),
        "|---|---|---|---|",
    ]
    for family in families:
        for key, label, digits in ROWS:
            p, e = medians[f"v{family}"]["plain"][key], medians[f"v{family}"]["encrypted"][key]
            ratio = "—" if p == 0 else f"{e / p:.2f}"
            lines.append(f"| IPv{family} {label} | {p:,.{digits}f} | {e:,.{digits}f} | {ratio} |")
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    families = [int(f) for f in args.families.split(",")]
    rounds: dict[str, dict[str, list[dict[str, Any]]]] = {f"v{f}": {m: [] for m in MODES} for f in families}
    async with contextlib.AsyncExitStack() as stack:
        t0 = time.perf_counter()
        setup = {mode: await stack.enter_async_context(lab_with_pods(mode == "encrypted")) for mode in MODES}
        mtus = {mode: await pod_mtu(setup[mode][1]) for mode in MODES}
        print(f"labs up with pods in {time.perf_counter() - t0:.1f} s; pod MTU {mtus}", flush=True)
        for r in range(args.rounds):
            order = MODES if r % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                for family in families:
                    got = await one_round(setup, mode, family, args)
                    rounds[f"v{family}"][mode].append(got)
                    print(
                        f"round {r + 1} {mode:<9} IPv{family}: {got['MB_per_s']:,.0f} MB/s, "
                        f"TCP rtt {got['tcp_rtt_p50_us']:.0f}/{got['tcp_rtt_p99_us']:.0f} µs, "
                        f"ICMP {got['icmp_rtt_p50_us']:.0f}/{got['icmp_rtt_p99_us']:.0f} µs, "
                        f"wireguard-go {got['wireguard_go_cpu_s_per_GB']:.2f} s/GB, "
                        f"bench {got['bench_cpu_s_per_GB']:.2f} s/GB, {got['retransmits']} retransmits, "
                        f"{got['udp_rcvbuf_drops']} UDP drops",
                        flush=True,
                    )
    medians = {
        fam: {
            mode: {key: statistics.median(r[key] for r in runs) for key, _, _ in ROWS} for mode, runs in by_mode.items()
        }
        for fam, by_mode in rounds.items()
    }
    print(table(medians, families), flush=True)
    ratios = {
        fam: {key: (m["encrypted"][key] / m["plain"][key] if m["plain"][key] else None) for key, _, _ in ROWS}
        for fam, m in medians.items()
    }
    return {
        "bench": "encryption",
        "seconds": args.seconds,
        "rounds": args.rounds,
        "pings": args.pings,
        "icmp": args.icmp,
        "pod_mtu": mtus,
        "wireguard": "wireguard-go (userspace)",
        "median": medians,
        "ratio_encrypted_to_plain": ratios,
        "per_round": rounds,
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=4.0, help="length of each TCP stream")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every measurement, both labs in turn")
    p.add_argument("--pings", type=int, default=2000, help="TCP request/response exchanges a round")
    p.add_argument("--icmp", type=int, default=200, help="ICMP echo requests a round")
    p.add_argument("--families", default="6,4", help="IP versions, e.g. 6 or 6,4")
    p.add_argument("--json", action="store_true", help="also one JSON line with every figure")
    args = p.parse_args()
    doc = trio.run(main, args)
    if args.json:
        emit(doc)
