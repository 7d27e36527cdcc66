"""Agent restart with many pods, and the agent's memory.

A two-node flock-lab.  node1 gets --pods pods through the installed shim (the
first 10 dual stack, the rest IPv6 only: a lab node's IPv4 block is a /26); a
prober pod on node2 pings five of them (IPv6 first/quarter/half/last, IPv4
first) every 10 ms throughout.  Then node1's agent gets SIGTERM --restarts
times; the lab's keeper starts it again after its restart delay (0.5 s the
first time, doubling after: a crash loop's backoff).  That delay is the
lab's stand-in for the kubelet, whose own first restart of an exited
container waits for nothing but its next pod sync: it is not flock's time,
and the figure that counts is flock's part.  Measured per restart:

- SIGTERM → the old process has exited (a pidfd of it turns readable),
- old process gone → new process exec'd (the keeper's delay: not flock's),
- exec → the new agent's first log line (interpreter and imports),
- exec → /readyz answers 200 (polled every 10 ms), and the CPU the new
  process used until then,
- flock's own part, SIGTERM → ready without the keeper's delay
  (SIGTERM → exit plus exec → ready), and the raw SIGTERM → ready (for the
  first restart, with the keeper's 0.5 s),
- the agent's log lines from SIGTERM to ready, as offsets (the timeline).

Ping replies lost over all restarts, CNI CHECK of every pod afterwards, and
RSS (VmRSS) of node1's agent: idle, with the pods, after the restarts.

``--before DIR`` runs the flock-agent of another checkout (e.g. ``git archive
main | tar -x -C DIR``) in turn with this one, in the same lab: the agent's
program is a small script that execs one or the other, switched before each
SIGTERM, so the restarts alternate before → this → before …; the old
process's shutdown counts for the old one's checkout, the new process's
start-up for the new one's.  Both run as ``python -P -c`` with PYTHONPATH set
to their checkout, the same interpreter and libraries.

    python bench/lab_restart.py [--pods 250] [--parallel 10] [--restarts 3] [--before DIR]
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from labkit import FlockRuntime, emit, ip, lab

from flock.lab import agent_ready, exec_conflist, in_netns, load_procs

DUAL = {"flock.fritzlab.net/ipv4": "true"}
THIS = str(Path(__file__).resolve().parent.parent)
# Log lines left out of the timeline: one per request.
QUIET = {"request served"}


def agent_pid(plan, node: str) -> int:
    return load_procs(plan.dir)["processes"][f"agent-{node}"]["pid"]


def rss_kib(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text)[1])


def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def exec_time(pid: int) -> float:
    """When *pid* was started, as a time.time() value (clock-tick resolution)."""
    start = int(_stat(pid)[19]) / os.sysconf("SC_CLK_TCK")
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - start)


def cpu_s(pid: int) -> float:
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def log_time(ts: str) -> float:
    """The agent's JSON log "ts" (UTC, ms) as a time.time() value."""
    whole, ms = ts.rstrip("Z").split(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + int(ms) / 1000


def read_log(path: Path, since: float, until: float) -> list[tuple[float, dict[str, Any]]]:
    lines = []
    for raw in path.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(raw)
            t = log_time(entry["ts"])
        except (ValueError, KeyError):
            continue
        if since - 0.002 <= t <= until + 0.002:
            lines.append((t, entry))
    return lines


def agent_program(work: Path, before: str | None) -> tuple[list[str], Path]:
    """The agent's program for the lab (a script) and the file that picks the checkout it runs."""
    choice = work / "variant"
    choice.write_text("this\n")
    checkouts = {"this": THIS, **({"before": os.path.abspath(before)} if before else {})}
    for name, source in checkouts.items():
        found = subprocess.run(
            [sys.executable, "-P", "-c", "import flock._entry; print(flock._entry.__file__)"],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": source},
            cwd="/",
        ).stdout.strip()
        if not found.startswith(source + "/"):
            raise SystemExit(f"{name} checkout {source}: imported flock._entry from {found or 'nowhere'}")
    run = "import sys; from flock._entry import agent; sys.argv[0] = 'flock-agent'; agent()"
    script = work / "flock-agent"
    script.write_text(
        "#!/bin/sh\ncd /\n"
        + "".join(
            f'if [ "$(cat {choice})" = {name} ]; then\n'
            f'  PYTHONPATH={source} exec {sys.executable} -P -c "{run}" "$@"\nfi\n'
            for name, source in checkouts.items()
        )
        + "exit 99\n"
    )
    script.chmod(0o755)
    return [str(script)], choice


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


async def restart_once(plan, node) -> dict[str, Any]:
    """SIGTERM node's agent and wait for its successor's /readyz; the timings (seconds)."""
    old = agent_pid(plan, node.name)
    pidfd = os.pidfd_open(old)
    t: dict[str, float] = {}
    try:
        t["kill"] = time.time()
        os.kill(old, signal.SIGTERM)
        async with trio.open_nursery() as nursery:

            async def exited() -> None:
                await trio.lowlevel.wait_readable(pidfd)
                t["exit"] = time.time()

            nursery.start_soon(exited)
            with trio.fail_after(120):
                while True:
                    pid = agent_pid(plan, node.name)
                    if pid != old and await agent_ready(node):
                        t["ready"] = time.time()
                        cpu = cpu_s(pid)
                        break
                    await trio.sleep(0.01)
    finally:
        os.close(pidfd)
    t["exec"] = exec_time(pid)
    timeline = read_log(node.dir / "agent.log", t["kill"], t["ready"] + 0.5)
    first = next((at for at, entry in timeline if at >= t["exec"] - 0.01 and entry.get("msg") == "starting"), None)
    # The agent's own account, where it has one: its age when ready and when each gate opened.
    ready_line = next((entry for _, entry in timeline if entry.get("msg") == "ready"), {})
    return {
        "sigterm_to_exit_s": t["exit"] - t["kill"],
        "exit_to_exec_s": t["exec"] - t["exit"],
        "exec_to_first_log_s": None if first is None else first - t["exec"],
        "exec_to_ready_s": t["ready"] - t["exec"],
        "cpu_to_ready_s": cpu,
        "flock_sigterm_to_ready_s": (t["exit"] - t["kill"]) + (t["ready"] - t["exec"]),
        "sigterm_to_ready_s": t["ready"] - t["kill"],
        "agent_ready_s": ready_line.get("since_exec_s"),
        "gates_opened_s": ready_line.get("gates_opened_s"),
        "timeline": [
            [round(at - t["kill"], 3), entry.get("msg")] for at, entry in timeline if entry.get("msg") not in QUIET
        ],
    }


def summarize(samples: list[dict[str, Any]], key: str) -> dict[str, float] | None:
    values = [s[key] for s in samples if s.get(key) is not None]
    if not values:
        return None
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "n": len(values),
    }


async def main(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="flock-restart-"))
    program, choice = agent_program(work, args.before)
    variants = ["before", "this"] if args.before else ["this"]
    samples: list[dict[str, Any]] = []
    async with lab(2, agent_program=program) as plan:
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
        running = "this"
        for i in range(args.restarts * len(variants)):
            new = variants[i % len(variants)]
            choice.write_text(new + "\n")
            sample = await restart_once(plan, node1)
            samples.append({"old": running, "new": new, **sample})
            print(
                f"restart {i + 1}: {running} → {new}; SIGTERM → old exit {sample['sigterm_to_exit_s']:.3f} s, "
                f"new exec → ready {sample['exec_to_ready_s']:.3f} s (CPU {sample['cpu_to_ready_s']:.2f} s), "
                f"flock's part {sample['flock_sigterm_to_ready_s']:.3f} s",
                flush=True,
            )
            running = new
            await trio.sleep(args.settle)
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
    keys = (
        "sigterm_to_exit_s",
        "exit_to_exec_s",
        "exec_to_first_log_s",
        "exec_to_ready_s",
        "cpu_to_ready_s",
        "flock_sigterm_to_ready_s",
        "sigterm_to_ready_s",
    )
    by_variant = {}
    for variant in variants:
        # The old process's shutdown belongs to its checkout, the new one's start-up to its own.
        olds = [s for s in samples if s["old"] == variant]
        news = [s for s in samples if s["new"] == variant]
        figures = {k: summarize(olds if k == "sigterm_to_exit_s" else news, k) for k in keys}
        exit_m, ready_m = figures["sigterm_to_exit_s"], figures["exec_to_ready_s"]
        if exit_m and ready_m:
            # SIGTERM → exit of this checkout's agent plus exec → ready of this checkout's agent.
            figures["flock_sigterm_to_ready_s"] = {"median": round(exit_m["median"] + ready_m["median"], 3)}
        figures["timeline"] = news[-1]["timeline"] if news else None
        figures["gates_opened_s"] = news[-1]["gates_opened_s"] if news else None
        by_variant[variant] = figures
    doc = {
        "pods": args.pods,
        "attach_s": round(attach_s, 1),
        "restarts": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in s.items()} for s in samples],
        "by_checkout": by_variant,
        "pings": lost,
        "pings_lost": sum(p["sent"] - p["received"] for p in lost),
        "check_failures_after_restart": check_failures,
        "rss_kib": {"idle": rss_idle, f"with_{args.pods}_pods": rss_loaded, "after_restart_with_pods": rss_after},
        "load": os.getloadavg(),
    }
    for variant, figures in by_variant.items():
        med = {k: (f["median"] if f else None) for k, f in figures.items() if k in keys or k.startswith("flock")}
        print(
            f"{variant}: SIGTERM → exit {med['sigterm_to_exit_s']} s; exec → first log {med['exec_to_first_log_s']} s; "
            f"exec → ready {med['exec_to_ready_s']} s (CPU {med['cpu_to_ready_s']} s); "
            f"flock's SIGTERM → ready {med['flock_sigterm_to_ready_s']} s (medians)",
            flush=True,
        )
    first = samples[0]
    print(
        f"first restart ({first['new']}), the keeper's delay included: SIGTERM → ready "
        f"{first['sigterm_to_ready_s']:.3f} s (keeper {first['exit_to_exec_s']:.3f} s; it doubles on each restart)",
        flush=True,
    )
    print(
        f"{args.pods} pods attached in {doc['attach_s']} s; ping replies lost {doc['pings_lost']} of "
        f"{sum(p['sent'] for p in lost)}; CHECK failures after the restarts {check_failures}; RSS KiB {doc['rss_kib']}",
        flush=True,
    )
    return doc


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--pods", type=int, default=250)
    p.add_argument("--parallel", type=int, default=10)
    p.add_argument("--restarts", type=int, default=3, help="restarts per checkout")
    p.add_argument("--settle", type=float, default=1.5, help="seconds between a restart's ready and the next SIGTERM")
    p.add_argument("--before", metavar="DIR", help="also restart into the flock-agent of the checkout in DIR, in turn")
    emit(trio.run(main, p.parse_args()))
