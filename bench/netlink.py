"""A pod's kernel set-up and teardown alone: flock.netlink's setup_pod and
teardown_pod in a throw-away node namespace, no agent, no API, no store.

Two ways in, per pod: ``direct`` calls setup_pod on this thread (blocking;
on a checkout whose setup_pod is a coroutine, through ``_conn.run_blocking``
as its worker does), ``worker`` awaits ``NetlinkWorker.setup`` from Trio,
which is the agent's "netlink" ADD stage (thread hop included).  Every pod is
then removed with ``NetlinkWorker.teardown`` (the DEL stage).  Each call's
X

Pods are dual-stack (a /128 and a /32, no anycast): the common case.
``--before DIR`` runs another checkout (e.g. ``git archive main | tar -x -C
DIR``) the same way, the two taking turns round by round in one node
namespace, so load from elsewhere hits both alike.

    python bench/netlink.py [--pods 20] [--rounds 5] [--before DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import ipaddress
import json
import os
import resource
import subprocess
import sys
import threading
import time

from stats import percentile, rerun_in_node_namespace  # bench/stats.py

OPS = ("setup_direct", "setup_worker", "teardown")


def _cpu() -> float:
    # The sum is exact (the scheduler's runtime); Linux splits it into user
    # and system by sampling ticks, too coarse for one call.
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Samples:
    def __init__(self) -> None:
        self.data: dict[str, dict[str, list[float]]] = {op: {"wall": [], "cpu": []} for op in OPS}
        self.data["kernel"] = {}  # batch kind -> the send() of each: the kernel's work (netlink runs in the sender)

    def timed(self, op: str, start: float, cpu0: float) -> None:
        self.data[op]["wall"].append((time.perf_counter() - start) * 1000)
        self.data[op]["cpu"].append((_cpu() - cpu0) * 1000)


def worker(pods: int, tag: str) -> dict:
    """One process's share: *pods* pods (plus a warm-up) set up and torn down."""
    import trio

    from flock.model import Allocation
    from flock.netlink import NetlinkWorker, _apply, _conn, _nsenter
    from flock.netlink.desired import DataplaneSettings, pod_plan
    from flock.testing.netns import netns_pool

    settings = DataplaneSettings()
    lock = threading.Lock()
    blocking = not inspect.iscoroutinefunction(_apply.setup_pod)
    # What NetlinkWorker passes, where setup_pod takes it.
    netns_thread = _nsenter.NetnsThread() if "netns_thread" in inspect.signature(_apply.setup_pod).parameters else None
    samples = Samples()

    def alloc(i: int, path: str) -> Allocation:
        return Allocation(
            container_id=f"bench-{tag}-{i}",
            namespace="bench",
            pod=f"p{i}",
            pod_uid=f"u{i}",
            if_name="eth0",
            netns=path,
            ip6=ipaddress.ip_address(f"2001:db8:9::{i + 1:x}"),
            ip4=ipaddress.ip_address(f"198.51.100.{i + 1}"),
        )

    def setup_direct(a: Allocation) -> None:
        fd = os.open(a.netns, os.O_RDONLY | os.O_CLOEXEC)
        try:
            kw = {"pod_netns": fd, "host_netns": None, "anycast_lock": lock, "settings": settings}
            if netns_thread is not None:
                kw["netns_thread"] = netns_thread
            if blocking:
                _apply.setup_pod(pod_plan(a, settings), **kw)
            else:
                _conn.run_blocking(_apply.setup_pod, pod_plan(a, settings), **kw)
        finally:
            os.close(fd)

    async def run(allocs: list[Allocation], direct: list[Allocation]) -> None:
        w = NetlinkWorker(settings=settings)
        for i, a in enumerate(allocs):
            t0, c0 = time.perf_counter(), _cpu()
            await w.setup(a)
            if i:
                samples.timed("setup_worker", t0, c0)
        for i, a in enumerate(allocs + direct):
            t0, c0 = time.perf_counter(), _cpu()
            await w.teardown(a.container_id)
            if i and i != len(allocs):
                samples.timed("teardown", t0, c0)

    timing = kernel_timing(samples.data["kernel"])
    with netns_pool(f"fl-bnl-{tag}-") as pool:
        allocs = [alloc(i, pool.create(f"p{i}").path) for i in range(2 * pods + 2)]
        trio.run(NetlinkWorker(settings=settings).prepare_node, "uplink")
        # Outside Trio: a coroutine setup_pod needs its own asyncio loop on this thread.
        direct = allocs[pods + 1 :]
        for i, a in enumerate(direct):
            t0, c0 = time.perf_counter(), _cpu()
            with timing(i > 0):
                setup_direct(a)
            if i:
                samples.timed("setup_direct", t0, c0)
        trio.run(run, allocs[: pods + 1], direct)
    return samples.data


class _TimedSend:
    def __init__(self, sock: object, into: list[float]) -> None:
        self.sock, self.into = sock, into

    def send(self, data: bytes) -> int:
        t0 = time.perf_counter()
        try:
            return self.sock.send(data)  # type: ignore[attr-defined]
        finally:
            self.into.append((time.perf_counter() - t0) * 1000)

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


def kernel_timing(into: dict[str, list[float]]):
    """A context manager factory: while on, each batched request's send()
    is timed by kind (checkouts without flock.netlink._batch: nothing)."""
    try:
        from pyroute2.netlink.rtnl import RTM_GETLINK, RTM_NEWADDR, RTM_NEWLINK, RTM_NEWROUTE

        from flock.netlink import _batch
    except ImportError:
        return lambda on: contextlib.nullcontext()
    names = {RTM_NEWLINK: "link", RTM_GETLINK: "getlink", RTM_NEWADDR: "addr", RTM_NEWROUTE: "route"}
    original = _batch.RtnlSocket.request

    def timed(self, requests):
        kind = "+".join(names.get(r.msg_type, str(r.msg_type)) for r in requests)
        sock = self._sock
        self._sock = _TimedSend(sock, into.setdefault(kind, []))
        try:
            return original(self, requests)
        finally:
            self._sock = sock

    @contextlib.contextmanager
    def on(active: bool):
        if active:
            _batch.RtnlSocket.request = timed
        try:
            yield
        finally:
            _batch.RtnlSocket.request = original

    return on


def figures(values: list[float]) -> dict:
    ordered = sorted(values)
    return {
        "min": round(ordered[0], 3),
        "median": round(ordered[len(ordered) // 2], 3),
        "p99": round(percentile(ordered, 0.99), 3),
        "mean": round(sum(ordered) / len(ordered), 3),
        "n": len(ordered),
    }


def inside(pods: int, rounds: int, before: str | None) -> dict:
    impls: dict[str, dict | None] = {"this": None}
    if before is not None:
        impls["before"] = {**os.environ, "PYTHONPATH": os.path.abspath(before)}
        where = subprocess.run(
            [sys.executable, "-c", "import flock; print(flock.__file__)"],
            env=impls["before"],
            cwd="/",
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if not where.startswith(os.path.abspath(before)):
            raise RuntimeError(f"--before {before}: imported flock from {where}")
    merged: dict[str, Samples] = {name: Samples() for name in impls}
    for r in range(rounds):
        for name, env in impls.items():
            out = subprocess.run(
                [sys.executable, __file__, "--worker", "--pods", str(pods), "--tag", f"{name[0]}{r}"],
                env=env,
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:
                raise RuntimeError(f"{name} round {r}: exit {out.returncode}: {out.stderr[-2000:]}")
            data = json.loads(out.stdout.splitlines()[-1])
            for op in (*OPS, "kernel"):
                for kind, values in data[op].items():
                    merged[name].data[op].setdefault(kind, []).extend(values)
    results = {
        name: {op: {kind: figures(v) for kind, v in s.data[op].items()} for op in (*OPS, "kernel")}
        for name, s in merged.items()
    }
    for op in OPS:
        for name in impls:
            f = results[name][op]
            print(
                f"{op:13} {name:7} wall ms min {f['wall']['min']:7.2f} median {f['wall']['median']:7.2f} "
                f"p99 {f['wall']['p99']:7.2f} | CPU ms median {f['cpu']['median']:6.2f} mean {f['cpu']['mean']:6.2f}"
                f"  (n={f['wall']['n']})",
                flush=True,
            )
    kernel = results["this"]["kernel"]
    if kernel:
        print("setup_direct this: kernel time per batched send (ms, median / mean):", flush=True)
        for kind, f in kernel.items():
            print(f"    {kind:40} {f['median']:6.3f} / {f['mean']:6.3f}", flush=True)
        total = sum(f["mean"] for f in kernel.values())
        print(f"    {'all, per pod (sum of means)':40} {total:6.3f}", flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=20, help="pods per round and implementation")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; implementations take turns")
    ap.add_argument("--before", metavar="DIR", help="also run the flock checkout in DIR, side by side")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tag", default="x", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.pods, args.tag)))
        return
    if args.inside:
        results = inside(args.pods, args.rounds, args.before)
        print(json.dumps({"bench": "netlink", "pods": args.pods, "rounds": args.rounds, "results": results}))
        return
    extra = ["--pods", str(args.pods), "--rounds", str(args.rounds)]
    if args.before:
        extra += ["--before", os.path.abspath(args.before)]
    sys.exit(rerun_in_node_namespace(__file__, extra))


if __name__ == "__main__":
    main()
