"""What the dataplane benches share: median/p99 summaries, --parallel/--rounds
parsing, and re-running a bench inside a fresh "node" namespace."""

from __future__ import annotations

import os
import subprocess
import sys

from flock.testing.benchkit import percentile, summary  # noqa: F401  (the benches import them from here)


def parallel_rounds(ap, args) -> tuple[list[int], list[int]]:
    """``--parallel 1,10 --rounds 20,5`` as two lists of equal length (argparse error otherwise)."""
    parallel = [int(x) for x in args.parallel.split(",")]
    rounds = [int(x) for x in args.rounds.split(",")]
    if len(parallel) != len(rounds):
        ap.error("--parallel and --rounds need the same number of entries")
    return parallel, rounds


def rerun_in_node_namespace(script: str, extra_args: list[str]) -> int:
    """Run *script* ``--inside`` a fresh node namespace with an uplink (so
    prepare_node finds a route to 169.254.1.1); the host is never touched."""
    from flock.testing.netns import netns_pool

    with netns_pool("fl-bench-") as pool:
        node, up = pool.create("node"), pool.create("up")
        pool.veth(node, "uplink", up, "eth0")
        node.ip("addr", "add", "192.0.2.1/24", "dev", "uplink")
        cmd = ["ip", "netns", "exec", node.name, sys.executable, os.path.abspath(script), "--inside", *extra_args]
        return subprocess.run(cmd).returncode
