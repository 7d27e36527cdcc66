"""Production BGP end to end in one flock-lab (issue 17): the fabric route server
speaks graceful restart, BFD and TCP MD5 with every node, as a ToR would.

One lab, one test, in order (a module fixture would outlive a trio test's
deadline): communities seen on the fabric; a pod's Ready condition flipped in
the API server withdraws and restores its anycast route on the fabric; BIRD
and the agent of a node restart while another node pings its pod, without a
lost ping; a wrong password keeps the session down and /readyz says why;
cutting a node's uplink is caught by BFD before the hold timer. BIRD's BFD
shares fate with its BGP, so the fabric cannot tell a restart from a dead
link: node1's port is restart-safe, node2's fails fast (NodePlan.fabric_bfd). Elapsed times
are printed (pytest -s shows them); the bounds asserted are generous, the
figures are in BENCHMARKS.md.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from flock.apiserver import PODS, SECRETS
from flock.lab import LabPlan, birdc, down, established, fabric_has, graceful_restart_under_ping, pod_add, up
from flock.lab._lifecycle import HEALTH_ADDRESS, api_client
from flock.lab._nsio import http_in, run_in
from flock.lab._plan import AGENT_NAMESPACE, BGP_SECRET

ANYCAST = "2001:db8:53::53"
# Bounds for what the fabric must see; generous for a loaded CI machine. The
# lab's hold timer is 3 s (keepalive 1 s): without BFD a dead link is noticed
# 2-3 s after the cut, so "under 1.9 s" can only be BFD.
ANYCAST_BOUND_S = 2.0
BFD_BOUND_S = 1.9


async def elapsed_until(condition: Callable[[], Awaitable[bool]], poll: float = 0.02) -> float:
    start = time.monotonic()
    # Conditions on the kernel and BIRD: nothing in this process to wait on.
    while not await condition():  # noqa: ASYNC110
        await trio.sleep(poll)
    return time.monotonic() - start


async def readyz(node) -> str:
    host, port = HEALTH_ADDRESS.rsplit(":", 1)
    _, body = await trio.to_thread.run_sync(http_in, node.netns, host, int(port), "GET", "/readyz", None, 2.0)
    return body.decode()


async def test_graceful_restart_bfd_communities_passwords_and_anycast_health(
    require_root: None, require_bird: None
) -> None:
    directory = Path(tempfile.mkdtemp(prefix="flab-b-"))
    plan = LabPlan.make(directory, 2)
    n1, n2 = plan.nodes
    fabric = plan.fabric_dir / "bird.ctl"
    timings: dict[str, float] = {}
    try:
        with trio.fail_after(120):
            await up(plan)  # returns once every session (signed, with BFD) is Established
            api = api_client(plan)

            async def bfd_up() -> bool:
                rows = (await birdc(fabric, "show", "bfd", "sessions")).splitlines()
                return all(any(str(n.addr6) in r and " Up " in r for r in rows) for n in plan.nodes)

            await elapsed_until(bfd_up)

            # --- communities, as the fabric received them --------------------------
            route = await birdc(fabric, "show", "route", str(n1.cidr6), "all")
            assert re.search(rf"BGP\.community:.*\({n1.asn},100\)", route), route
            assert re.search(rf"BGP\.large_community:.*\({n1.asn}, 1, 1\)", route), route

            # --- health-aware anycast ---------------------------------------------
            web = await pod_add(plan, n1.name, "default/web-1")
            client = await pod_add(plan, n2.name, "default/client-2")
            await pod_add(plan, n1.name, "dns/r-1", {"flock.fritzlab.net/anycast": ANYCAST})
            net = f"{ANYCAST}/128"
            await elapsed_until(lambda: fabric_has(plan, net))
            anycast_route = await birdc(fabric, "show", "route", net, "all")
            assert re.search(rf"BGP\.community:.*\({n1.asn},200\)", anycast_route), anycast_route

            async def set_ready(ready: bool) -> None:
                pod = await api.get(PODS, "r-1", "dns")
                pod["status"] = {
                    "conditions": [
                        {"type": "PodScheduled", "status": "True"},
                        {"type": "Ready", "status": "True" if ready else "False"},
                    ]
                }
                await api.update(PODS, pod)

            await set_ready(False)
            timings["anycast withdrawn after Ready=False"] = await elapsed_until(lambda: _not(fabric_has(plan, net)))
            # Withdrawn from the fabric, still routed on the node (its own traffic reaches the pod).
            proc = await run_in(n1.netns, ["ip", "-6", "route", "show", "exact", net])
            assert proc.stdout.strip(), "the node's own anycast route must stay"
            await set_ready(True)
            timings["anycast back after Ready=True"] = await elapsed_until(lambda: fabric_has(plan, net))

            # --- graceful restart: BIRD and the agent of node1 restart under traffic --
            # node1's fabric port treats a BFD failure as a restart (NodePlan.fabric_bfd).
            drill = await graceful_restart_under_ping(
                plan, n1, client.netns, web.addresses(6)[0], directory / "ping.log", count=120
            )
            timings["node1 BIRD back to Established"] = drill.back_s
            assert drill.agent_replaced
            assert drill.ping_status == 0 and " 0% packet loss" in drill.ping_summary, drill.ping_summary
            assert not drill.fabric_gap, "the fabric dropped node1's block during a graceful restart"

            # --- a wrong password keeps the session down; /readyz says why --------------
            secret = await api.get(SECRETS, BGP_SECRET, AGENT_NAMESPACE)
            good = dict(secret["data"])
            secret["data"] = {**good, n2.name: "d3JvbmctcGFzc3dvcmQ="}  # base64 of "wrong-password"
            await api.update(SECRETS, secret)
            await elapsed_until(lambda: _not(established(fabric, n2.name)), poll=0.1)
            await trio.sleep(2)  # the session keeps failing to open, it does not come back
            assert not await established(fabric, n2.name)
            note = await readyz(n2)
            assert "BGP peer fabric" in note and "not established" in note, note
            assert f"Secret {AGENT_NAMESPACE}/{BGP_SECRET} key '{n2.name}'" in note, note
            assert "wrong-password" not in note
            secret = await api.get(SECRETS, BGP_SECRET, AGENT_NAMESPACE)
            secret["data"] = good
            await api.update(SECRETS, secret)
            await elapsed_until(lambda: established(fabric, n2.name), poll=0.1)

            # --- BFD: node2's uplink goes dark (packets dropped, the link stays up) ------
            # node2's fabric port fails fast (BFD on); node1's is restart-safe (see NodePlan.fabric_bfd).
            await elapsed_until(lambda: fabric_has(plan, str(n2.cidr6)))
            cut = directory / "cut.nft"
            cut.write_text(
                "table inet flab_cut {\n  chain out {\n    type filter hook output priority 0; policy drop;\n  }\n}\n"
            )
            assert (await run_in(n2.netns, ["nft", "-f", str(cut)])).returncode == 0
            timings["fabric withdrew node2 (BFD) after the cut"] = await elapsed_until(
                lambda: _not(fabric_has(plan, str(n2.cidr6)))
            )
            why = await birdc(fabric, "show", "protocols", "all", n2.name)
            await run_in(n2.netns, ["nft", "delete", "table", "inet", "flab_cut"])
            assert "BFD session down" in why, why
            await elapsed_until(lambda: established(fabric, n2.name), poll=0.1)

        print("\n" + "\n".join(f"{what}: {seconds:.3f} s" for what, seconds in timings.items()))
        assert timings["anycast withdrawn after Ready=False"] < ANYCAST_BOUND_S, timings
        assert timings["anycast back after Ready=True"] < ANYCAST_BOUND_S, timings
        assert timings["fabric withdrew node2 (BFD) after the cut"] < BFD_BOUND_S, timings
    finally:
        with trio.move_on_after(30, shield=True):
            await down(directory)
            await trio.run_process(["rm", "-rf", "--", str(directory)], check=False)


async def _not(awaitable: Awaitable[bool]) -> bool:
    return not await awaitable
