"""A supervised service's readiness as a gate of :class:`NodeState`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from flock.state._node_state import Gate, NodeState

Service = Callable[..., Awaitable[Any]]


@attrs.define(eq=False)
class _GateStatus:
    state: NodeState
    gate: Gate
    outer: trio.TaskStatus[None]

    def started(self, value: Any = None) -> None:
        self.state.open_gate(self.gate.name)
        self.outer.started()


def gated(state: NodeState, gate: Gate, run: Service) -> Service:
    """*run* (a ``run(*, task_status)`` service) with *gate* open exactly while it
    serves: closed with the gate's initial reason until it calls ``started()``
    and again once it stops (crash, restart, cancellation)."""

    async def run_gated(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        state.close_gate(gate.name, gate.initial_reason)
        try:
            await run(task_status=_GateStatus(state, gate, task_status))
        finally:
            state.close_gate(gate.name, gate.initial_reason)

    return run_gated
