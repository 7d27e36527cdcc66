"""``flock-lab status``: nodes, agents, BGP sessions and attachments, as JSON and as text.

Attachments are what each node's agent holds, whoever made them (the lab's
``pod add``, containerd, podman, CNI used by hand): read from the node's
allocation store through flock's public store API, read-only (SQLite in WAL
mode lets a reader in beside the running agent).  ``flockctl`` will ask the
agent itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import trio

from flock.lab._bird import bgp_sessions
from flock.lab._lifecycle import agent_ready
from flock.lab._plan import INTERNET, INTERNET4, INTERNET6
from flock.lab._pods import load_pods
from flock.lab._procs import ProcRef, is_running
from flock.lab._state import LabState, keeper_running, load_procs
from flock.store import SyncStore


def _proc(procs: dict[str, Any], name: str) -> dict[str, Any]:
    p = procs.get(name)
    if p is None:
        return {"pid": None, "running": False, "restarts": 0}
    return {"pid": p["pid"], "running": is_running(ProcRef(p["pid"], p["start_time"])), "restarts": p["restarts"]}


def _attachments(state_dir: Path) -> list[dict[str, Any]] | None:
    """Every allocation in the node's store (None: no store yet, or unreadable)."""
    if not (state_dir / "flock.db").exists():
        return None
    try:
        store = SyncStore.open(state_dir)
    except Exception:
        return None
    try:
        rows = store.list()
    finally:
        store.close()
    return [
        {
            "container_id": a.container_id,
            "pod": f"{a.namespace}/{a.pod}" if a.namespace else None,
            "label": a.pod,
            "if_name": a.if_name,
            "netns": a.netns,
            "state": a.state.value,
            "ipv6": [str(a.ip6)] if a.ip6 else [],
            "ipv4": [str(a.ip4)] if a.ip4 else [],
            "addresses": [str(x) for x in a.addresses],
            "anycast": [str(x) for x in a.anycast],
        }
        for a in rows
    ]


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
    lab_made = {p.container_id for p in load_pods(plan)}
    attachments = []
    for node in plan.nodes:
        held = await trio.to_thread.run_sync(_attachments, node.state_dir)
        for a in held or []:
            attachments.append(
                {"node": node.name, "made_by": "lab" if a["container_id"] in lab_made else "runtime", **a}
            )
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
        "uplink_mtu": plan.uplink_mtu,
        "internet": None
        if plan.internet_netns is None
        else {
            "netns": plan.internet_netns,
            "address6": str(INTERNET6),
            "address4": str(INTERNET4),
            "serve": _proc(procs, f"serve-{INTERNET}"),
        },
        "nodes": nodes,
        "pods": pods,
        "attachments": attachments,
    }


def _sessions_text(sessions: list[dict[str, Any]] | None) -> str:
    if sessions is None:
        return "BIRD not answering"
    return ", ".join(f"{s['name']} {s['info'] or s['state']}" for s in sessions) or "no sessions"


def status_text(doc: dict[str, Any]) -> str:
    lines = [
        f"lab {doc['dir']} ({doc['phase']}); API server {doc['apiserver']['url']} {'running' if doc['apiserver']['running'] else 'NOT RUNNING'}"
    ]
    lines.append(f"fabric route server: {_sessions_text(doc['fabric']['bgp'])}; links at MTU {doc['uplink_mtu']}")
    if (inet := doc.get("internet")) is not None:
        lines.append(
            f"internet: {inet['address6']} {inet['address4']} (routes back to the nodes' uplinks only: pods reach it "
            f"through natOutgoing; probe target `internet`){'' if inet['serve']['running'] else ', NOT SERVING'}"
        )
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
    attachments = doc.get("attachments", [])
    if not attachments:
        lines.append("no attachments (flock-lab pod add NODE NAMESPACE/NAME, or a runtime using the node's conflist)")
    else:
        rows = [
            (
                a["pod"] or f"container {a['label'] or '(unnamed)'}",
                a["node"],
                a["made_by"],
                a["container_id"][:12],
                ", ".join(a["ipv6"] + a["ipv4"] + a["addresses"])
                + (f"  anycast {', '.join(a['anycast'])}" if a["anycast"] else "")
                + ("" if a["state"] == "committed" else f"  ({a['state']})"),
            )
            for a in attachments
        ]
        width = max(len(r[0]) for r in rows)
        lines.append(f"{'attachment':<{width}}  {'node':<7} {'made by':<8} {'container':<12} addresses")
        for r in rows:
            lines.append(f"{r[0]:<{width}}  {r[1]:<7} {r[2]:<8} {r[3]:<12} {r[4]}")
    return "\n".join(lines)
