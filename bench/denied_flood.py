"""Denied traffic, logged, under a flood: 10,000 denied packets a second towards one pod (issue 27:
the agent under 20 % of a core, its memory flat).

One node (flock.testing.agentlab: the real flock-agent targeting a node network namespace, the fake API
server, the real shim; no BIRD).  Namespace ``srv`` carries ``flock.fritzlab.net/log-denied: "true"``
and a NetworkPolicy isolating its pods (ingress, no rule); pod ``srv/server`` and pod ``cli/client``
are ADDed through the shim.  From the client's namespace a sender (a process of its own, not counted)
sends UDP datagrams to the server at the rate asked, for the time asked: every one is a new flow's
packet the server's pod chain drops (unreplied UDP stays conntrack state new) and meets the log rule.
The sender paces in 1 ms ticks: the kernel's limit admits one packet per 100 ms, so a port sequence
repeating every multiple of 1,000 packets would have the same ports logged on every lap.

Per case — ``one`` flow (one socket, one port: a retrying client) and ``many`` (every packet to
another port: a scan, each packet a flow of its own) — the figures are the agent process's CPU
(all its threads, from /proc: utime + stime) over the flood, minus what it used idle over as long
just before; its RSS before, every second during, and after; the packets the kernel dropped (the
pod chain's counter); the records the agent read (``flock_policy_denied_packets_total``); its
``policy-denied`` log lines.

    .venv/bin/python bench/denied_flood.py [--rate 10000] [--seconds 10]

``--micro`` adds the reader's own cost per record, in process (no kernel): what a node whose every
pod is flooded would cost, the kernel's limit (10 a second per pod and direction) times its pods.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from flock.apiserver import NAMESPACES, NETWORKPOLICIES, PODS, namespace_object, network_policy_object, pod_object
from flock.testing.agentlab import Lab, open_lab, wait_for

LOG_DENIED = "flock.fritzlab.net/log-denied"
TICKS_PER_S = os.sysconf("SC_CLK_TCK")

SENDER = textwrap.dedent(
    """
    import socket, sys, time
    addr, rate, seconds, many = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "many"
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    per_tick = max(1, rate // 1000)
    tick = per_tick / rate
    sent, port, start = 0, 10000, time.monotonic()
    next_tick = start
    while (now := time.monotonic()) - start < seconds:
        for _ in range(per_tick):
            if many:
                port = 1024 + (sent % 64007)  # not a multiple of the limiter's 1,000-packet period
            try:
                sock.sendto(b"denied?", (addr, port))
            except OSError:
                pass
            sent += 1
        next_tick += tick
        if next_tick > now:
            time.sleep(next_tick - now)
    print(sent, time.monotonic() - start, flush=True)
    """
)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S  # utime, stime (fields 14, 15)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmRSS")


def metric(lab_agent, name: str) -> float:
    total = 0.0
    for line in lab_agent.get("/metrics")[1].splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def drop_counter(lab: Lab, chain: str) -> int:
    listing = lab.node.run("nft", "list", "chain", "inet", "flock", chain).stdout
    for line in listing.splitlines():
        if "counter packets" in line and line.strip().endswith("drop"):
            return int(line.split("counter packets")[1].split()[0])
    return 0


def setup(lab: Lab) -> tuple[str, str, object]:
    """The namespaces, the policy, both pods ADDed; (server's address, its ingress chain, the client's netns)."""
    api = lab.api
    srv = namespace_object("srv", {"team": "srv"})
    srv["metadata"]["annotations"] = {LOG_DENIED: "true"}
    api.create(NAMESPACES, srv)
    api.create(NAMESPACES, namespace_object("cli", {"team": "cli"}))
    api.create(NETWORKPOLICIES, network_policy_object("srv", "isolate", {"podSelector": {}}))
    netns = {}
    for ns, name, cid in (("srv", "server", "c0000001"), ("cli", "client", "c0000002")):
        api.create(PODS, pod_object(ns, name, "host001", labels={"app": name}))
        netns[name] = lab.pool.create(name[:6])
        out = lab.cni("ADD", cid, netns[name], name, namespace=ns)
        if out.status != 0:
            raise SystemExit(f"ADD {ns}/{name} failed: {out.stdout}")
    rows = lab.rows()
    server = rows["c0000001"]
    chain = f"in-{lab_veth(lab, server.ip6)}"
    wait_for(
        "the log rule in the server's chain",
        lambda: "log prefix" in lab.node.run("nft", "list", "chain", "inet", "flock", chain, check=False).stdout,
        30,
    )
    return str(server.ip6), chain, netns["client"]


def lab_veth(lab: Lab, address) -> str:
    """The host veth routing *address* (flock's /128 route)."""
    route = lab.node.ip("-6", "route", "show", f"{address}/128")
    return route.split(" dev ")[1].split()[0]


def flood(lab: Lab, agent, client, server_ip: str, chain: str, rate: int, seconds: float, flows: str) -> dict:
    assert agent.proc is not None
    pid = agent.proc.pid
    # idle, as long as the flood: what the agent costs without it
    idle_cpu0 = cpu_seconds(pid)
    time.sleep(seconds)
    idle_cpu = cpu_seconds(pid) - idle_cpu0
    records0 = metric(agent, "flock_policy_denied_packets_total")
    dropped0 = drop_counter(lab, chain)
    lines0 = sum(1 for r in agent.records() if r.get("op") == "policy-denied")
    rss_before = rss_mib(pid)
    cpu0, wall0 = cpu_seconds(pid), time.monotonic()
    sender = subprocess.Popen(
        ["ip", "netns", "exec", client.name, sys.executable, "-c", SENDER, server_ip, str(rate), str(seconds), flows],
        stdout=subprocess.PIPE,
        text=True,
    )
    rss_during = []
    while sender.poll() is None:
        time.sleep(1.0)
        rss_during.append(rss_mib(pid))
    wall = time.monotonic() - wall0
    cpu = cpu_seconds(pid) - cpu0
    assert sender.stdout is not None
    sent, send_seconds = sender.stdout.read().split()
    sender.stdout.close()
    time.sleep(0.5)  # the last records' flush (50 ms) and the agent's read
    dropped = drop_counter(lab, chain) - dropped0
    return {
        "flows": flows,
        "sent": int(sent),
        "send_rate_pps": round(int(sent) / float(send_seconds)),
        "dropped": dropped,
        "dropped_rate_pps": round(dropped / float(send_seconds)),
        "records_read": int(metric(agent, "flock_policy_denied_packets_total") - records0),
        "log_lines": sum(1 for r in agent.records() if r.get("op") == "policy-denied") - lines0,
        "agent_cpu_percent": round(100 * cpu / wall, 2),
        "agent_idle_cpu_percent": round(100 * idle_cpu / seconds, 2),
        "agent_cpu_percent_over_idle": round(100 * (cpu / wall - idle_cpu / seconds), 2),
        "rss_mib_before": rss_before,
        "rss_mib_during_max": max(rss_during) if rss_during else rss_before,
        "rss_mib_after": rss_mib(pid),
        "rss_mib_during": rss_during,
        "overruns": metric(agent, "flock_policy_denied_log_overruns_total"),
    }


def micro(records: int = 100_000) -> dict:
    """The reader's CPU per record, in process: parse + look up + count + dedupe (+ a line per new flow)."""
    import ipaddress
    import logging
    import socket
    import struct

    import trio

    from flock.logs import JsonFormatter
    from flock.model import Allocation
    from flock.policy import Namespace, NetworkPolicy, PolicyInputs, PolicyPod, compile_ruleset
    from flock.policy._denylog import DenyLogService, parse_messages
    from flock.policy._metrics import DeniedCounters
    from flock.testing.policy import MemoryLocalPods

    server = PolicyPod(
        "srv", "server", {"app": "s"}, (ipaddress.ip_address("2001:db8:1::a"),), host_veth="flock0000000a"
    )
    deny = NetworkPolicy.from_object({"metadata": {"namespace": "srv", "name": "isolate"}, "spec": {"podSelector": {}}})
    rs = compile_ruleset([deny], [Namespace("srv", (), True)], [server], [server])
    prefix = next(iter(rs.denials))

    def record(dport: int) -> bytes:
        def attr(kind: int, data: bytes) -> bytes:
            return struct.pack("=HH", 4 + len(data), kind) + data + b"\0" * (-len(data) % 4)

        udp = struct.pack(">HHHH", 40000, dport, 8, 0)
        packet = struct.pack(">IHBB", 6 << 28, 8, 17, 64) + ipaddress.ip_address("2001:db8:2::c").packed
        packet += server.addresses[0].packed + udp
        body = struct.pack("=BBH", socket.AF_INET6, 0, 0) + attr(10, prefix.encode() + b"\0") + attr(9, packet)
        return struct.pack("=IHHII", 16 + len(body), 4 << 8, 0, 0, 0) + body

    handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115  (the bench's life)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("flock.policy.denied")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    local = MemoryLocalPods()
    local.load([Allocation("c1", "srv", "server", "u", "eth0", "/x", ip6=server.addresses[0])])  # type: ignore[arg-type]

    class Applied:
        applied = rs

    out = {}
    for flows, ports in (("one", 1), ("many", 50000)):
        svc = DenyLogService(Applied(), local, PolicyInputs(), DeniedCounters())
        batches = [b"".join(record(10000 + (i * 16 + j) % ports) for j in range(16)) for i in range(records // 16)]

        async def run(svc=svc, batches=batches) -> float:
            began = time.thread_time()
            for data in batches:
                await svc.handle(list(parse_messages(data)))
            return time.thread_time() - began

        seconds = trio.run(run)
        out[flows] = {"us_per_record": round(1e6 * seconds / records, 2), "lines": svc.lines}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=10_000, help="packets a second")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--micro", action="store_true", help="also the reader's cost per record, in process")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="fl-bdf-") as tmp, open_lab(Path(tmp), "fl-bdf-", bird=False) as lab:
        agent = lab.agent()
        agent.wait_ready()
        server_ip, chain, client = setup(lab)
        for flows in ("one", "many"):
            r = flood(lab, agent, client, server_ip, chain, args.rate, args.seconds, flows)
            results.append(r)
            print(
                f"{flows:>4} flow(s): {r['dropped_rate_pps']} denied packets/s for {args.seconds:.0f} s → "
                f"{r['records_read']} records, {r['log_lines']} lines; agent {r['agent_cpu_percent']} % of a core "
                f"({r['agent_idle_cpu_percent']} % idle); RSS {r['rss_mib_before']} → {r['rss_mib_after']} MiB "
                f"(max {r['rss_mib_during_max']})",
                flush=True,
            )
        agent.stop()
    doc: dict = {"bench": "denied_flood", "rate": args.rate, "seconds": args.seconds, "results": results}
    if args.micro:
        doc["reader_per_record"] = micro()
        print(f"reader, in process: {doc['reader_per_record']}", flush=True)
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
