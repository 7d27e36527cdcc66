"""What a hostPort mapping adds to ADD (issue 25: goal < 3 ms added), and to DEL.

One node (flock.testing.agentlab: the real shim, the real flock-agent, the real kernel in a fresh
network namespace, the fake API server; no BIRD), its pods created on the API server ahead.  Each
round ADDs three pods through the shim — one without a mapping, one with a TCP mapping (8080/tcp),
one with a TCP and a UDP mapping (8081/tcp, 5353/udp; a new UDP hostPort also has the agent delete
the conntrack entries of flows to it, as portmap does), both families — in rotating order, then
DELs them; so the machine's drift falls on all three alike.
With ``--mapped N``, N pods with mappings are on the node before the rounds (the hostports chain is
flushed and refilled per change: its cost grows with the node's mappings).

    .venv/bin/python bench/hostport_add.py --rounds 40 --mapped 0,50     # figures, then one JSON line
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from stats import summary

from flock.apiserver import PODS, pod_object
from flock.testing.agentlab import Lab, open_lab

A = "flock.fritzlab.net/"
TCP = [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]
UDP = [
    {"hostPort": 8081, "containerPort": 80, "protocol": "tcp"},
    {"hostPort": 5353, "containerPort": 53, "protocol": "udp"},
]
CASES = (("without", "p", None), ("tcp", "t", TCP), ("tcp_udp", "u", UDP))


def _add(lab: Lab, cid: str, pod: str, mappings: list[dict] | None) -> float:
    netns = lab.pool.create(pod[:8])
    config = {"runtimeConfig": {"portMappings": mappings}} if mappings else {}
    began = time.perf_counter()
    out = lab.cni("ADD", cid, netns, pod, **config)
    took = time.perf_counter() - began
    if out.status != 0:
        raise SystemExit(f"ADD {pod} failed: {out.stdout}")
    return took


def _del(lab: Lab, cid: str, pod: str) -> float:
    began = time.perf_counter()
    out = lab.cni("DEL", cid, None, pod)
    took = time.perf_counter() - began
    if out.status != 0:
        raise SystemExit(f"DEL {pod} failed: {out.stdout}")
    return took


def run(rounds: int, mapped: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="fl-bhp-") as tmp, open_lab(Path(tmp), "fl-bhp-", bird=False) as lab:
        agent = lab.agent()
        agent.wait_ready()
        names = [f"bg-{i}" for i in range(mapped)] + [f"{tag}-{i}" for _, tag, _ in CASES for i in range(rounds)]
        for name in names:  # the lab's IPv4 block is a /29: the pods in the background have IPv6 only
            v4 = "false" if name.startswith("bg-") else "true"
            lab.api.create(PODS, pod_object("default", name, "host001", annotations={A + "ipv4": v4}))
        for i in range(mapped):
            port = 20000 + i
            _add(lab, f"b{i:07x}", f"bg-{i}", [{"hostPort": port, "containerPort": 80, "protocol": "tcp"}])
        add: dict[str, list[float]] = {case: [] for case, _, _ in CASES}
        delete: dict[str, list[float]] = {case: [] for case, _, _ in CASES}
        for i in range(rounds):
            order = [(case, f"{tag}-{i}", f"c{i:07x}{tag}", m) for case, tag, m in CASES]
            order = order[i % 3 :] + order[: i % 3]
            for case, pod, cid, mappings in order:
                add[case].append(_add(lab, cid, pod, mappings))
            for case, pod, cid, _ in order:
                delete[case].append(_del(lab, cid, pod))
            lab.settle()
        rules = lab.node.run("nft", "list", "chain", "inet", "flock", "hostports").stdout.count("dnat")
        agent.stop()
    out: dict = {"mapped_before": mapped, "hostport_rules_at_end": rules}
    for op, samples in (("add", add), ("del", delete)):
        for case, _, _ in CASES:
            out[f"{op}_{case}_ms"] = summary(samples[case], scale=1000)
        for case in ("tcp", "tcp_udp"):
            out[f"{op}_{case}_added_ms"] = {
                k: round(out[f"{op}_{case}_ms"][k] - out[f"{op}_without_ms"][k], 2) for k in ("median", "p99")
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--mapped", default="0,50", help="pods with a mapping already on the node, comma-separated runs")
    args = ap.parse_args()
    results = []
    for mapped in (int(x) for x in args.mapped.split(",")):
        r = run(args.rounds, mapped)
        results.append(r)
        print(
            f"{mapped:>4} mapped pods before: ADD without {r['add_without_ms']['median']:.2f} / "
            f"{r['add_without_ms']['p99']:.2f} ms; with 8080/tcp +{r['add_tcp_added_ms']['median']:.2f} / "
            f"+{r['add_tcp_added_ms']['p99']:.2f}; with 8081/tcp and 5353/udp +{r['add_tcp_udp_added_ms']['median']:.2f} / "
            f"+{r['add_tcp_udp_added_ms']['p99']:.2f}; DEL +{r['del_tcp_added_ms']['median']:.2f} / "
            f"+{r['del_tcp_udp_added_ms']['median']:.2f} (median / p99)"
        )
    print(json.dumps({"bench": "hostport_add", "rounds": args.rounds, "results": results}))


if __name__ == "__main__":
    main()
