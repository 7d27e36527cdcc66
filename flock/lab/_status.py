"""``flock-lab status``: nodes, agents, BGP sessions and pods, as JSON and as text."""

from __future__ import annotations

from typing import Any

import attrs
import trio

from flock.lab._bird import bgp_sessions
from flock.lab._lifecycle import agent_ready
from flock.lab._pods import load_pods
from flock.lab._procs import ProcRef, is_running
from flock.lab._state import LabState, keeper_running, load_procs


def _proc(procs: dict[str, Any], name: str) -> dict[str, Any]:
    p = procs.get(name)
    if p is None:
        return {"pid": None, "running": False, "restarts": 0}
    return {"pid": p["pid"], "running": is_running(ProcRef(p["pid"], p["start_time"])), "restarts": p["restarts"]}


async def status(state: LabState) -> dict[str, Any]:
    plan = state.plan
    procs = load_procs(plan.dir).get("processes", {})
    nodes: list[dict[str, Any]] = []

    async def one(node: Any, out: dict[str, Any]) -> None:
        sessions = await bgp_sessions(node.bird_ctl)
        out.update(
            name=node.name,
            netns=node.netns,
            address6=str(node.addr6),
            address4=str(node.addr4),
            asn=node.asn,
            cidr6=str(node.cidr6),
            cidr4=str(node.cidr4),
            agent={**_proc(procs, f"agent-{node.name}"), "ready": await agent_ready(node)},
            bird=_proc(procs, f"bird-{node.name}"),
            bgp=None if sessions is None else [attrs.asdict(s) | {"established": s.established} for s in sessions],
        )

    async with trio.open_nursery() as nursery:
        for node in plan.nodes:
            out: dict[str, Any] = {}
            nodes.append(out)
            nursery.start_soon(one, node, out)
    fabric_sessions = await bgp_sessions(plan.fabric_dir / "bird.ctl")
    pods = [
        {
            "pod": p.key,
            "node": p.node,
            "netns": p.netns,
            "container_id": p.container_id,
            "ipv6": p.addresses(6),
            "ipv4": p.addresses(4),
            "anycast": p.anycast,
        }
        for p in load_pods(plan)
    ]
    return {
        "dir": str(plan.dir),
        "phase": state.phase,
        "keeper": {"pid": state.keeper.pid if state.keeper else None, "running": keeper_running(state)},
        "apiserver": {"url": plan.apiserver_url, **_proc(procs, "apiserver")},
        "fabric": {
            "netns": plan.fabric_netns,
            "bird": _proc(procs, "bird-fabric"),
            "bgp": None
            if fabric_sessions is None
            else [attrs.asdict(s) | {"established": s.established} for s in fabric_sessions],
        },
        "nodes": nodes,
        "pods": pods,
    }


def _sessions_text(sessions: list[dict[str, Any]] | None) -> str:
    if sessions is None:
        return "BIRD not answering"
    return ", ".join(f"{s['name']} {s['info'] or s['state']}" for s in sessions) or "no sessions"


def status_text(doc: dict[str, Any]) -> str:
    lines = [
        f"lab {doc['dir']} ({doc['phase']}); API server {doc['apiserver']['url']} {'running' if doc['apiserver']['running'] else 'NOT RUNNING'}"
    ]
    lines.append(f"fabric route server: {_sessions_text(doc['fabric']['bgp'])}")
    lines.append("")
    lines.append(f"{'node':<7} {'uplink':<20} {'pod blocks':<40} {'agent':<22} bgp")
    for n in doc["nodes"]:
        agent = n["agent"]
        state = "ready" if agent["ready"] else ("running, not ready" if agent["running"] else "NOT RUNNING")
        if agent["restarts"]:
            state += f" ({agent['restarts']} restarts)"
        lines.append(
            f"{n['name']:<7} {n['address6']:<20} {n['cidr6'] + ' ' + n['cidr4']:<40} {state:<22} {_sessions_text(n['bgp'])}"
        )
    lines.append("")
    if not doc["pods"]:
        lines.append("no pods (flock-lab pod add NODE NAMESPACE/NAME)")
    else:
        width = max(len(p["pod"]) for p in doc["pods"])
        lines.append(f"{'pod':<{width}}  {'node':<7} addresses")
        for p in doc["pods"]:
            addrs = ", ".join(p["ipv6"] + p["ipv4"])
            extra = f"  anycast {', '.join(p['anycast'])}" if p["anycast"] else ""
            lines.append(f"{p['pod']:<{width}}  {p['node']:<7} {addrs}{extra}")
    return "\n".join(lines)
