"""Production BGP on a two-node flock-lab (issue 17), several rounds each:

- anycast health: a pod's Ready condition flipped in the API server → its
  anycast /128 gone from (back on) the fabric route server's table;
- BFD: node2's uplink goes dark (nftables drops its output) → node2's block
  gone from the fabric's table (BFD 100 ms x 3; the lab's hold timer is 3 s);
- graceful restart: node1's BIRD (`birdc graceful restart`, restarted with -R)
  and its agent (SIGKILL) restarted while a node2 pod pings a node1 pod every
  50 ms → pings lost, and whether the fabric ever lost node1's block.

The fabric's table is polled every 10 ms with birdc, so times carry up to
~10 ms plus one birdc round trip of observation delay.

    python bench/lab_bgp.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import time
from pathlib import Path

import trio
from labkit import emit, lab, stats_ms

from flock.lab import LabPlan, api_client, pod_add, process_refs, run_in
from flock.testing import PODS

ANYCAST = "2001:db8:53::53"
POLL_S = 0.01


async def birdc(ctl: Path, *args: str) -> str:
    proc = await trio.run_process(
        ["birdc", "-s", str(ctl), *args], capture_stdout=True, capture_stderr=True, check=False
    )
    return proc.stdout.decode(errors="replace")


async def on_fabric(plan: LabPlan, net: str) -> bool:
    return net in await birdc(plan.fabric_dir / "bird.ctl", "show", "route", net)


async def until(plan: LabPlan, net: str, present: bool, limit: float = 20.0) -> float:
    start = time.perf_counter()
    with trio.fail_after(limit):
        while await on_fabric(plan, net) != present:  # noqa: ASYNC110  BIRD's routes: nothing to wait on
            await trio.sleep(POLL_S)
    return time.perf_counter() - start


async def established(ctl: Path, protocol: str) -> bool:
    return "Established" in await birdc(ctl, "show", "protocols", protocol)


async def main(rounds: int) -> None:
    async with lab(2) as plan:
        n1, n2 = plan.nodes
        api = api_client(plan)
        web = await pod_add(plan, n1.name, "default/web-1")
        client = await pod_add(plan, n2.name, "default/client-2")
        await pod_add(plan, n1.name, "dns/r-1", {"flock.fritzlab.net/anycast": ANYCAST})
        net = f"{ANYCAST}/128"
        await until(plan, net, True)

        async def set_ready(ready: bool) -> None:
            pod = await api.get(PODS, "r-1", "dns")
            pod["status"] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
            await api.update(PODS, pod)

        withdraw, restore = [], []
        for _ in range(rounds):
            await set_ready(False)
            withdraw.append(await until(plan, net, False))
            await set_ready(True)
            restore.append(await until(plan, net, True))

        cut_file = plan.dir / "cut.nft"
        cut_file.write_text(
            "table inet flab_cut {\n  chain out {\n    type filter hook output priority 0; policy drop;\n  }\n}\n"
        )
        bfd = []
        for _ in range(rounds):
            await until(plan, str(n2.cidr6), True)
            await run_in(n2.netns, ["nft", "-f", str(cut_file)])
            bfd.append(await until(plan, str(n2.cidr6), False))
            await run_in(n2.netns, ["nft", "delete", "table", "inet", "flab_cut"])
            with trio.fail_after(30):
                while not await established(plan.fabric_dir / "bird.ctl", n2.name):  # noqa: ASYNC110  BIRD's state
                    await trio.sleep(0.1)

        lost, fabric_gaps, back = [], 0, []
        target = web.addresses(6)[0]
        for i in range(rounds):
            log = plan.dir / f"ping-{i}.log"
            async with await trio.open_file(log, "wb") as out:
                pinger = await trio.lowlevel.open_process(
                    [
                        "ip",
                        "netns",
                        "exec",
                        client.netns,
                        "ping",
                        "-n",
                        "-q",
                        "-i",
                        "0.05",
                        "-c",
                        "100",
                        "-W",
                        "1",
                        target,
                    ],
                    stdout=out.wrapped,
                )
            await trio.sleep(0.5)
            gap = False

            async def watch() -> None:
                nonlocal gap
                while True:
                    gap |= not await on_fabric(plan, str(n1.cidr6))
                    await trio.sleep(POLL_S)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                await birdc(n1.bird_ctl, "graceful", "restart")
                os.kill(process_refs(plan.dir)[f"agent-{n1.name}"].pid, signal.SIGKILL)
                t0 = time.perf_counter()
                with trio.fail_after(30):
                    while not await established(n1.bird_ctl, "bgp_fabric"):  # noqa: ASYNC110  BIRD's state
                        await trio.sleep(0.05)
                back.append(time.perf_counter() - t0)
                nursery.cancel_scope.cancel()
            await pinger.wait()
            m = re.search(r"(\d+) packets transmitted, (\d+) received", log.read_text())
            assert m, log.read_text()
            lost.append(int(m.group(1)) - int(m.group(2)))
            fabric_gaps += gap
            await trio.sleep(2)  # the keeper's restart backoff resets

        emit(
            {
                "bench": "lab_bgp",
                "rounds": rounds,
                "anycast_withdraw_ms": stats_ms(withdraw),
                "anycast_restore_ms": stats_ms(restore),
                "bfd_withdraw_ms": stats_ms(bfd),
                "graceful_restart": {
                    "pings_lost": lost,
                    "rounds_fabric_lost_node1": fabric_gaps,
                    "bird_back_established_ms": stats_ms(back),
                },
            }
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    trio.run(main, ap.parse_args().rounds)
