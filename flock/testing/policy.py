"""In-memory parts for the policy service's tests: this node's attachments, readiness, a watermark.

The kernel side of those tests is real where it matters (flock.policy's
kernel tests); these stand in for flock.state.NodeState and the watchers'
watermark so retry timing can be tested on a virtual clock.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import trio

from flock.model import Allocation


@attrs.define(eq=False)
class MemoryLocalPods:
    """Attachments by container ID with a version and a change signal (as NodeState has)."""

    loaded: bool = True  # start-up's rebuild from the store is done (NodeState.allocations_loaded)
    _allocations: dict[str, Allocation] = attrs.field(init=False, factory=dict)
    _version: int = attrs.field(init=False, default=0)
    _changed: trio.Event = attrs.field(init=False, factory=trio.Event)

    @property
    def version(self) -> int:
        return self._version

    @property
    def allocations(self) -> Mapping[str, Allocation]:
        return self._allocations  # a live view, as NodeState's: readers must copy what they keep

    @property
    def allocations_loaded(self) -> bool:
        return self.loaded

    def load(self, rows: list[Allocation]) -> None:
        """Start-up's rebuild (NodeState.load_allocations)."""
        self._allocations = {a.container_id: a for a in rows}
        self.loaded = True
        self._bump()

    async def wait_changed(self, since: int) -> int:
        while self._version <= since:
            await self._changed.wait()
        return self._version

    def _bump(self) -> None:
        self._version += 1
        self._changed.set()
        self._changed = trio.Event()

    def put(self, alloc: Allocation) -> None:
        self._allocations[alloc.container_id] = alloc
        self._bump()

    def drop(self, container_id: str) -> None:
        if self._allocations.pop(container_id, None) is not None:
            self._bump()


@attrs.define(eq=False)
class GateRecorder:
    """Readiness gates as the service left them: name → reason (None: open)."""

    gates: dict[str, str | None] = attrs.field(factory=dict)

    def open_gate(self, gate: str) -> None:
        self.gates[gate] = None

    def close_gate(self, gate: str, reason: str) -> None:
        self.gates[gate] = reason


@attrs.define(eq=False)
class MemoryWatermark:
    """A watermark the test moves (the watchers' BOOKMARK progress)."""

    _mark: int = attrs.field(init=False, default=0)
    _moved: trio.Event = attrs.field(init=False, factory=trio.Event)

    @property
    def watermark(self) -> int:
        return self._mark

    def move(self, mark: int) -> None:
        self._mark = mark
        self._moved.set()
        self._moved = trio.Event()

    async def wait_watermark(self, resource_version: int) -> int:
        while self._mark < resource_version:
            await self._moved.wait()
        return self._mark
