"""BIRD follows the node's state: inputs read from :class:`NodeState`, a poke when they change."""

from __future__ import annotations

import attrs
import trio

from flock.bird import BirdInputs, BirdReloader
from flock.state import NodeState


def bird_inputs(state: NodeState) -> BirdInputs | None:
    """What BIRD's configuration is rendered from; None until start-up has
    loaded the allocations (rendering without them would withdraw anycast
    addresses a predecessor announced)."""
    node = state.nodeconfig
    if node is None or not state.allocations_loaded:
        return None
    return BirdInputs.collect(node, state.allocations.values())


@attrs.define(eq=False)
class BirdFollower:
    """Supervised service: runs *reloader* and pokes it whenever the BIRD inputs
    derived from *state* change (debouncing is the reloader's)."""

    state: NodeState
    reloader: BirdReloader

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.reloader.config_path.parent.mkdir(parents=True, exist_ok=True)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.reloader.run)
            task_status.started()
            seen, poked = self.state.version, bird_inputs(self.state)
            while True:
                seen = await self.state.wait_changed(seen)
                inputs = bird_inputs(self.state)
                if inputs != poked:
                    poked = inputs
                    self.reloader.poke()
