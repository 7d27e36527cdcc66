"""The end of start-up: one log line when the agent is first ready, and the
garbage collector handed back.

``flock-agent``'s entry point turns the cyclic garbage collector off before
its imports (``flock._entry``): start-up allocates a great many objects that
all live on (modules, classes, the informers' first lists), and every
collection pass over them is wasted, about a tenth of a restart's CPU.
:class:`StartupWatch` turns it back on once the node is ready, or after
:data:`GC_DEADLINE_S` whatever happens, and first freezes what start-up made
(``gc.freeze``: later collections no longer walk the agent's long-lived
objects).  Where the collector was on to begin with (tests, in-process
agents), it is left alone.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import time

import attrs
import trio

from flock.state import NodeState

log = logging.getLogger("flock.agent")

# Start-up without readiness (no NodeConfig yet, API down) still gets its
# garbage collected from here on.
GC_DEADLINE_S = 10.0


def process_age() -> float | None:
    """Seconds since this process was exec'd (clock-tick resolution), None if unknown."""
    try:
        with open("/proc/self/stat") as f:
            text = f.read()
        start = int(text[text.rindex(")") + 2 :].split()[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return round(time.clock_gettime(time.CLOCK_BOOTTIME) - start, 3)


def collect_again() -> None:
    """Hand the collector back if the entry point took it (see the module doc)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


@attrs.define(eq=False)
class StartupWatch:
    """Supervised service (transient): logs ``ready`` once every readiness gate
    of *state* is open, with the process's age then and when each gate opened
    (seconds since exec), and hands the garbage collector back."""

    state: NodeState
    gc_deadline: float = GC_DEADLINE_S

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        opened: dict[str, float | None] = {}
        deadline = trio.current_time() + self.gc_deadline
        seen = -1
        while True:
            for gate in self.state.gates:
                if gate.name not in opened and not self.state.reason(gate.name):
                    opened[gate.name] = process_age()
            if self.state.ready:
                break
            with trio.move_on_at(deadline):
                seen = await self.state.wait_changed(seen)
            if trio.current_time() >= deadline:
                collect_again()
                deadline = math.inf
        collect_again()
        log.info("ready", extra={"since_exec_s": process_age(), "gates_opened_s": opened})
