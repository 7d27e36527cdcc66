"""What the input rules of issue 12 cost, and what refusing hostile input costs.

- claims-5000:   an ``anycast`` annotation of 5,000 addresses, refused (the
                 limit is counted before anything is parsed; it took 13-17 s)
- claims-64:     64 anycast addresses, accepted (parse + policy per address)
- netns-verify:  the shim's open + fstat + NS_GET_NSTYPE of CNI_NETNS (per ADD)
- agent-refusal: one wire-v2 DEL carrying an fd it does not announce, refused
                 by a running RpcServer (unix socket round trip, fd received
                 and closed), client in a thread of this process

Usage: .venv/bin/python bench/input_rules.py [--rounds N]   (root: makes one netns)
Prints a table, then the figures as one JSON line.
"""

from __future__ import annotations

import argparse
import array
import json
import logging
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import trio

from flock import cni_common
from flock.ipam import AnnotationError, parse_request
from flock.rpc.server import RpcServer
from flock.testing.ipam import P, node
from flock.testing.netns import netns_pool


def timed(fn, rounds: int) -> float:
    """Median microseconds per call of *fn* over *rounds* rounds of 10 calls."""
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(10):
            fn()
        samples.append((time.perf_counter() - t) / 10 * 1e6)
    return statistics.median(samples)


def claims(count: int):
    nc = node()
    value = ",".join(f"2001:db8:aaaa::{i + 1:x}" for i in range(count))

    def run() -> None:
        try:
            parse_request({P + "anycast": value}, nc, None)
        except AnnotationError:
            pass

    return run


def netns_verify(path: str):
    def run() -> None:
        os.close(cni_common.open_netns_fd(path))

    return run


async def agent_refusal(rounds: int, plain: Path) -> float:
    async def handler(request):
        return {}

    with tempfile.TemporaryDirectory() as tmp:
        server = RpcServer(Path(tmp) / "flock.sock", handler=handler)
        line = (
            json.dumps(
                {
                    "version": 2,
                    "op": "DEL",
                    "containerID": "c1",
                    "netns": "/x",
                    "ifName": "eth0",
                    "config": {},
                    "netnsFd": False,
                }
            ).encode()
            + b"\n"
        )
        fd = os.open(plain, os.O_RDONLY)
        samples = []
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)

            def call() -> None:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(server.path))
                    s.sendmsg([line], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())])
                    assert b"unexpected file descriptor" in s.recv(65536)

            for _ in range(rounds):
                t = time.perf_counter()
                await trio.to_thread.run_sync(call)
                samples.append((time.perf_counter() - t) * 1e6)
            nursery.cancel_scope.cancel()
        os.close(fd)
    return statistics.median(samples)


def main() -> None:
    logging.disable(logging.WARNING)  # the server logs every refusal; not what is measured
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    results = {
        "claims-5000": timed(claims(5000), args.rounds),
        "claims-64": timed(claims(64), max(args.rounds // 10, 5)),
    }
    with netns_pool("fl-bench-in-") as pool, tempfile.TemporaryDirectory() as tmp:
        results["netns-verify"] = timed(netns_verify(pool.create("pod").path), args.rounds)
        plain = Path(tmp) / "plain"
        plain.write_text("not a namespace")
        results["agent-refusal"] = trio.run(agent_refusal, args.rounds, plain)
    for name, us in results.items():
        print(f"{name:<15} {us:10.1f} us (median)")
    print(
        json.dumps(
            {"bench": "input_rules", "rounds": args.rounds, "median_us": {k: round(v, 1) for k, v in results.items()}}
        )
    )


if __name__ == "__main__":
    main()
