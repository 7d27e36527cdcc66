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
import time

import trio
from labkit import emit, lab, stats_ms

from flock.apiserver import PODS
from flock.lab import LabPlan, api_client, established, fabric_has, graceful_restart_under_ping, pod_add, run_in

ANYCAST = "2001:db8:53::53"
POLL_S = 0.01


async def until(plan: LabPlan, net: str, present: bool, limit: float = 20.0) -> float:
    start = time.perf_counter()
    with trio.fail_after(limit):
        while await fabric_has(plan, net) != present:  # noqa: ASYNC110  BIRD's routes: nothing to wait on
            await trio.sleep(POLL_S)
    return time.perf_counter() - start


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
            drill = await graceful_restart_under_ping(
                plan, n1, client.netns, target, plan.dir / f"ping-{i}.log", count=100, poll=POLL_S
            )
            assert drill.sent, drill.ping_summary
            lost.append(drill.sent - drill.received)
            back.append(drill.back_s)
            fabric_gaps += drill.fabric_gap
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
