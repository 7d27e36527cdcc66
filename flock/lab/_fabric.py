"""What the fabric's BIRD sees, and the graceful-restart drill under traffic
(for tests/lab/test_bgp_lab.py and bench/lab_bgp.py alike)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import attrs
import trio

from flock.lab._plan import LabPlan, NodePlan
from flock.lab._state import process_refs


async def birdc(ctl: Path, *args: str) -> str:
    """``birdc -s CTL ARGS``'s output ("" when BIRD does not answer)."""
    proc = await trio.run_process(
        ["birdc", "-s", str(ctl), *args], capture_stdout=True, capture_stderr=True, check=False
    )
    return proc.stdout.decode(errors="replace")


async def fabric_has(plan: LabPlan, net: str) -> bool:
    """Whether the fabric's BIRD has a route to *net*."""
    return net in await birdc(plan.fabric_dir / "bird.ctl", "show", "route", net)


async def established(ctl: Path, protocol: str) -> bool:
    """Whether the BIRD at *ctl* has its BGP session *protocol* Established."""
    return "Established" in await birdc(ctl, "show", "protocols", protocol)


@attrs.frozen
class RestartDrill:
    """How a graceful restart of one node went (see :func:`graceful_restart_under_ping`)."""

    ping_summary: str  # ping's own output
    ping_status: int
    sent: int
    received: int
    fabric_gap: bool  # the fabric lost the node's block at some point
    back_s: float  # SIGKILL of the agent → the node's BIRD Established again
    agent_replaced: bool  # the keeper started a new agent process


async def graceful_restart_under_ping(
    plan: LabPlan, node: NodePlan, client_netns: str, target: str, log: Path, *, count: int, poll: float = 0.05
) -> RestartDrill:
    """Ping *target* from *client_netns* (every 50 ms, *count* times) while
    *node* does what the DaemonSet's preStop hook and the kubelet do on a
    restart: ``birdc graceful restart``, the agent killed (the keeper starts
    it again).  The fabric's view of the node's block is watched throughout."""
    async with await trio.open_file(log, "wb") as out:
        pinger = await trio.lowlevel.open_process(
            [
                "ip",
                "netns",
                "exec",
                client_netns,
                "ping",
                "-n",
                "-q",
                "-i",
                "0.05",
                "-c",
                str(count),
                "-W",
                "1",
                target,
            ],
            stdout=out.wrapped,
            stderr=subprocess.STDOUT,
        )
    await trio.sleep(1)
    gap = False

    async def watch() -> None:
        nonlocal gap
        while True:
            gap |= not await fabric_has(plan, str(node.cidr6))
            await trio.sleep(poll)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        await birdc(node.bird_ctl, "graceful", "restart")
        agent_pid = process_refs(plan.dir)[f"agent-{node.name}"].pid
        os.kill(agent_pid, signal.SIGKILL)
        killed = time.monotonic()
        with trio.fail_after(30):
            while not await established(node.bird_ctl, "bgp_fabric"):  # noqa: ASYNC110  BIRD's state
                await trio.sleep(poll)
        back = time.monotonic() - killed
        nursery.cancel_scope.cancel()
    status = await pinger.wait()
    summary = await trio.Path(log).read_text()
    sent = received = 0
    for line in summary.splitlines():
        if "packets transmitted" in line:
            sent, received = (int(part.split()[0]) for part in line.split(",")[:2])
    return RestartDrill(
        ping_summary=summary,
        ping_status=status,
        sent=sent,
        received=received,
        fabric_gap=gap,
        back_s=back,
        agent_replaced=process_refs(plan.dir)[f"agent-{node.name}"].pid != agent_pid,
    )
