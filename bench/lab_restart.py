"""Agent restart with many pods, and the agent's memory.

A two-node flock-lab.  node1 gets --pods pods through the installed shim (the
first 10 dual stack, the rest IPv6 only: a lab node's IPv4 block is a /26); a prober pod on node2 pings five of them (IPv6 first/quarter/half/last,
IPv4 first) every 10 ms throughout.  Then node1's agent gets SIGTERM; the
lab's keeper starts it again after its 0.5 s restart delay, as a kubelet
would.  Measured: SIGTERM → /readyz answers 200 again (and new process seen →
ready), ping replies lost during the whole window, and CNI CHECK of every pod
afterwards.  RSS (VmRSS) of node1's agent: idle, with the pods, after restart.

    python bench/lab_restart.py [--pods 250] [--parallel 10]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import time
from pathlib import Path

import trio
from labkit import FlockRuntime, emit, ip, lab

from flock.lab import agent_ready, exec_conflist, in_netns, load_procs

DUAL = {"flock.fritzlab.net/ipv4": "true"}


def agent_pid(plan, node: str) -> int:
    return load_procs(plan.dir)["processes"][f"agent-{node}"]["pid"]


def rss_kib(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text)[1])


async def attach_many(rt: FlockRuntime, count: int, parallel: int) -> list:
    # A node's IPv4 block is a /26 (61 pods): the first 10 are dual stack, the rest IPv6 only.
    atts = [await rt.prepare("restart", f"r{i}", DUAL if i < 10 else {}) for i in range(count)]
    queue = list(reversed(atts))

    async def worker() -> None:
        while queue:
            att = queue.pop()
            await ip("netns", "add", att.netns.rsplit("/", 1)[1])
            out = await rt.add(att)
            assert out.ok, out.stdout

    async with trio.open_nursery() as nursery:
        for _ in range(parallel):
            nursery.start_soon(worker)
    return atts


async def main(args: argparse.Namespace) -> dict:
    async with lab(2) as plan:
        node1 = plan.nodes[0]
        rt1, rt2 = FlockRuntime(plan, 0), FlockRuntime(plan, 1)
        await trio.sleep(1)
        rss_idle = rss_kib(agent_pid(plan, "node1"))
        t0 = time.perf_counter()
        atts = await attach_many(rt1, args.pods, args.parallel)
        attach_s = time.perf_counter() - t0
        await trio.sleep(1)
        rss_loaded = rss_kib(agent_pid(plan, "node1"))
        prober = await rt2.prepare("restart", "prober", DUAL)
        await ip("netns", "add", prober.netns.rsplit("/", 1)[1])
        assert (await rt2.add(prober)).ok
        picks = [atts[0], atts[len(atts) // 4], atts[len(atts) // 2], atts[-1]]
        targets = [rt1.results[a.container_id]["ips"][0]["address"].split("/")[0] for a in picks]
        targets.append(rt1.results[atts[0].container_id]["ips"][1]["address"].split("/")[0])
        pings = [
            await trio.lowlevel.open_process(
                in_netns(prober.netns.rsplit("/", 1)[1], ["ping", "-n", "-q", "-i", "0.01", t]), stdout=-1, stderr=-1
            )
            for t in targets
        ]
        await trio.sleep(1)  # pings flowing before the restart
        old = agent_pid(plan, "node1")
        t_kill = time.perf_counter()
        os.kill(old, signal.SIGTERM)
        t_new = None
        with trio.fail_after(120):
            while True:
                pid = agent_pid(plan, "node1")
                if pid != old and t_new is None:
                    t_new = time.perf_counter()
                if pid != old and await agent_ready(node1):
                    break
                await trio.sleep(0.01)
        t_ready = time.perf_counter()
        await trio.sleep(2)  # and a little after
        lost = []
        for proc, target in zip(pings, targets, strict=True):
            proc.send_signal(signal.SIGINT)
            chunks = [chunk async for chunk in proc.stdout]
            await proc.wait()
            out = b"".join(chunks).decode()
            m = re.search(r"(\d+) packets transmitted, (\d+) received", out)
            lost.append({"target": target, "sent": int(m[1]), "received": int(m[2])})
        rss_after = rss_kib(agent_pid(plan, "node1"))
        check_failures = 0
        for att in atts:
            out = await exec_conflist(
                node1.netns, str(node1.cni_bin), rt1.conflist, "CHECK", att, rt1.results[att.container_id]
            )
            check_failures += not out.ok
        for att in [*atts, prober]:
            await ip("netns", "del", att.netns.rsplit("/", 1)[1])
    doc = {
        "pods": args.pods,
        "attach_s": round(attach_s, 1),
        "restart_sigterm_to_ready_s": round(t_ready - t_kill, 2),
        "restart_new_process_to_ready_s": round(t_ready - t_new, 2),
        "pings": lost,
        "pings_lost": sum(p["sent"] - p["received"] for p in lost),
        "check_failures_after_restart": check_failures,
        "rss_kib": {"idle": rss_idle, f"with_{args.pods}_pods": rss_loaded, "after_restart_with_pods": rss_after},
    }
    print(
        f"{args.pods} pods attached in {doc['attach_s']} s; restart: SIGTERM → ready {doc['restart_sigterm_to_ready_s']} s "
        f"(new process → ready {doc['restart_new_process_to_ready_s']} s); ping replies lost {doc['pings_lost']} of "
        f"{sum(p['sent'] for p in lost)}; CHECK failures after restart {check_failures}; RSS KiB {doc['rss_kib']}",
        flush=True,
    )
    return doc


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--pods", type=int, default=250)
    p.add_argument("--parallel", type=int, default=10)
    emit(trio.run(main, p.parse_args()))
