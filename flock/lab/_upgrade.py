"""``flock-lab upgrade``: the image lab's DaemonSet rolled to another image and manifest.

What a DaemonSet ``RollingUpdate`` with ``maxUnavailable: 1`` does, node
after node, with the keeper in the kubelet's place:

1. the node's old pod is deleted: the keeper runs its containers' ``preStop``
   hooks (BIRD's ``birdc graceful restart``), sends SIGTERM and, after the
   pod's ``terminationGracePeriodSeconds``, SIGKILL (:meth:`Keeper.reconcile`
   on a spec without them);
2. the new pod's init containers run to completion, from the new image and
   the new manifest (``install-cni`` replaces the shim and conflist on the
   node);
3. its containers start (a spec with them), and the rollout waits until the
   node's pod is Ready: every readiness probe it declares passes, as the
   keeper polls it (the agent's ``/readyz``), which is what gates the next
   node.

For each node it reports how long the pod was not Ready (from the old pod's
deletion to the new one's readiness), and on the way: the old pod gone, the
init containers done, the agent's first ``/readyz`` 200 (polled every 50 ms,
finer than the probe's period) and the node's BGP session Established again.

The manifests' ConfigMaps are written first, as ``kubectl apply -k`` updates
them before the DaemonSet's pods roll.  A rollback is the same command with
the old image and manifest (``--manifest-ref``).

Error handling: a lab that is not an image lab, not up, or whose keeper is
gone; an image not in the lab's image storage; an init container that fails;
a node whose new pod is not Ready within ``ROLLOUT_DEADLINE_S`` — each raises
:class:`LabError` naming it and where to look, and stops the rollout there (as
a stuck rollout stops): the nodes done keep the new pod, the rest the old
one, and the node it stopped at may have none; running ``upgrade`` again
creates it there and goes on.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from flock.lab._bird import all_established, bgp_sessions
from flock.lab._image import (
    ImageSettings,
    check_image,
    container_specs,
    is_pod_container,
    load_manifests,
    run_init_containers,
)
from flock.lab._lifecycle import KEEPER_LOG, SPEC_FILE, agent_ready
from flock.lab._plan import LabPlan, NodePlan
from flock.lab._procs import is_running
from flock.lab._state import LabError, LabState, load_procs, require_state
from flock.lab.keeper import MIN_TERM_GRACE_S, ProcessSpec, load_spec_file

# From the new pod's start to Ready (the agent's readiness probe runs every 5 s).
ROLLOUT_DEADLINE_S = 120.0
POLL_S = 0.05

Report = Callable[[str], None]


@attrs.frozen
class NodeRollout:
    """One node's pod replaced; every time in seconds from the old pod's deletion."""

    node: str
    image: str
    began_at: float  # when the old pod's deletion began (seconds since the epoch)
    stopped_s: float  # the old pod's containers gone (preStop, SIGTERM)
    init_s: float  # the new pod's init containers done
    started_s: float  # its containers started
    agent_ready_s: float  # the agent's /readyz answered 200 first
    not_ready_s: float  # the pod Ready again: its readiness probes passed (what gates the next node)
    bgp_s: float | None  # the node's BIRD has its BGP sessions Established again (None: not by then)

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    def text(self) -> str:
        bgp = "BGP not yet Established" if self.bgp_s is None else f"BGP Established at {self.bgp_s:.1f} s"
        return (
            f"{self.node}: not ready {self.not_ready_s:.1f} s (old pod gone at {self.stopped_s:.1f} s, "
            f"init containers done at {self.init_s:.1f} s, agent /readyz 200 at {self.agent_ready_s:.1f} s, "
            f"readiness probe passed at {self.not_ready_s:.1f} s; {bgp})"
        )


def _write_spec(plan: LabPlan, generation: int, specs: Sequence[ProcessSpec]) -> None:
    path = plan.dir / SPEC_FILE
    tmp = path.with_name(path.name + ".tmp")
    doc = {"generation": generation, "processes": [s.to_json() for s in specs]}
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


async def _apply(state: LabState, generation: int, specs: Sequence[ProcessSpec], limit: float) -> None:
    """Hand the keeper *specs* as *generation* and wait until it has applied them."""
    plan = state.plan
    assert state.keeper is not None
    await trio.to_thread.run_sync(_write_spec, plan, generation, specs)
    os.kill(state.keeper.pid, signal.SIGHUP)
    with trio.move_on_after(limit):
        while True:
            procs = load_procs(plan.dir)
            if procs.get("generation", 0) >= generation:
                return
            if procs.get("reload_error"):
                raise LabError(f"the keeper could not reload: {procs['reload_error']}")
            if not is_running(state.keeper):
                raise LabError(f"the process keeper died; see {plan.dir / KEEPER_LOG}")
            await trio.sleep(POLL_S)
    raise LabError(f"the keeper did not apply spec generation {generation} in {limit:g} s; see {plan.dir / KEEPER_LOG}")


async def _node_established(node: NodePlan) -> bool:
    sessions = await bgp_sessions(node.bird_ctl)
    return bool(sessions) and all_established(sessions, len(sessions or []))


async def roll_node(
    state: LabState, settings: ImageSettings, docs: Sequence[Any], node: NodePlan, report: Report
) -> NodeRollout:
    """Replace *node*'s pod with the one of *settings* (see the module doc)."""
    plan = state.plan
    generation, current = await trio.to_thread.run_sync(load_spec_file, plan.dir / SPEC_FILE)
    old = [s for s in current if is_pod_container(s, plan, node)]
    # Where the pod's containers go in the keeper's order (the end, if an earlier rollout left none).
    at = current.index(old[0]) if old else len(current)
    others = [s for s in current if s not in old]
    new, inits = container_specs(plan, settings, docs, [node])
    grace = max((s.grace for s in old if s.grace is not None), default=30.0)

    start, began_at = time.monotonic(), time.time()
    if old:
        names = ", ".join(s.name for s in old)
        report(f"{node.name}: deleting the old pod ({names}: preStop, SIGTERM, grace {grace:g} s)")
        await _apply(state, generation + 1, others, grace + MIN_TERM_GRACE_S + 10)
    else:
        report(f"{node.name}: no pod runs (an earlier rollout stopped there): creating it")
    stopped = time.monotonic() - start
    report(f"{node.name}: init containers from {settings.image}: {', '.join(r.name for _, r in inits)}")
    await run_init_containers(plan, settings, inits)
    init = time.monotonic() - start
    await _apply(state, generation + 2, [*others[:at], *new, *others[at:]], 30)
    started = time.monotonic() - start
    report(f"{node.name}: {', '.join(s.name for s in new)} started; waiting for the pod to be Ready")
    probed = [s.name for s in new if s.readiness is not None]
    agent_at: float | None = None
    bgp_at: float | None = None
    with trio.move_on_after(ROLLOUT_DEADLINE_S):
        while True:
            now = time.monotonic() - start
            if agent_at is None and await agent_ready(node):
                agent_at = now
            if bgp_at is None and await _node_established(node):
                bgp_at = now
            procs = load_procs(plan.dir).get("processes", {})
            ready = all(procs.get(n, {}).get("ready") is True for n in probed) and all(
                procs.get(s.name, {}).get("running") for s in new
            )
            if ready:
                return NodeRollout(
                    node.name,
                    settings.image,
                    round(began_at, 3),
                    round(stopped, 2),
                    round(init, 2),
                    round(started, 2),
                    round(agent_at if agent_at is not None else now, 2),
                    round(now, 2),
                    None if bgp_at is None else round(bgp_at, 2),
                )
            await trio.sleep(POLL_S)
    raise LabError(
        f"{node.name}: the new pod ({settings.image}) is not Ready {ROLLOUT_DEADLINE_S:g} s after it started; "
        f"the rollout stops here. Logs: {node.dir}/agent.log, {node.dir}/bird.log, {plan.dir / KEEPER_LOG}"
    )


async def upgrade(
    directory: Path,
    settings: ImageSettings,
    report: Report = lambda line: None,
    nodes: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Roll every node's pod (or *nodes*', in that order) to *settings*' image and manifest, one
    node at a time; returns ``{"image", "manifest", "nodes": [NodeRollout…], "seconds"}``."""
    state = require_state(directory)
    plan = state.plan
    if state.image is None:
        raise LabError(f"the lab in {plan.dir} runs flock as host processes: only an image lab (up --image) upgrades")
    if state.phase != "up" or state.keeper is None or not is_running(state.keeper):
        raise LabError(f"the lab in {plan.dir} is not up (phase {state.phase}): `flock-lab up --image …` first")
    recorded = Path(state.image["image_dir"])
    if settings.image_dir != recorded:
        raise LabError(
            f"--image-dir {settings.image_dir}: this lab's podman reads images from {recorded} only "
            f"(build the new image there: scripts/build-image --dir {recorded})"
        )
    try:
        order = [plan.node(n) for n in nodes] if nodes else list(plan.nodes)
    except KeyError as exc:
        raise LabError(f"no node {exc.args[0]!r} in this lab: {', '.join(n.name for n in plan.nodes)}") from None
    docs = load_manifests(settings.deploy_dir)
    await check_image(plan, settings)
    report(f"rolling {len(order)} nodes to {settings.image} (manifests {settings.deploy_dir}), one at a time")
    begin = time.monotonic()
    done: list[NodeRollout] = []
    per_node = dict(state.image.get("nodes") or {})
    for node in order:
        rollout = await roll_node(state, settings, docs, node, report)
        done.append(rollout)
        report(rollout.text())
        per_node[node.name] = {"image": settings.image, "deploy_dir": str(settings.deploy_dir)}
        image = {**state.image, "nodes": per_node}
        if all(per_node.get(n.name, {}).get("image") == settings.image for n in plan.nodes):
            image = {**image, **settings.to_json()}
        state = attrs.evolve(state, image=image)
        state.save()
    return {
        "image": settings.image,
        "manifest": str(settings.deploy_dir),
        "nodes": [r.to_json() for r in done],
        "seconds": round(time.monotonic() - begin, 2),
    }
