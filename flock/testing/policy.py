"""In-memory parts for the policy service's tests and benchmarks: the kernel table, this node's
attachments, readiness, a watermark.

The kernel side of those tests is real where it matters (flock.policy's
kernel tests); these stand in for nft, flock.state.NodeState and the
watchers' watermark so retry timing can be tested on a virtual clock.

:class:`MemoryApplier` applies a :class:`RulesetChange` as
:class:`flock.policy.NftApplier` would have nft apply it — incrementally when
the change continues the one it holds, else whole — and is stricter than the
kernel: a change that deletes an element its set does not hold, adds one it
holds, or moves elements of a set it has not got is a bug in whoever made
the change (:class:`InexactChange`), not a transaction to retry.  *refuse*
makes the next transactions fail as nft's do.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from flock.model import Allocation
from flock.policy import AddressSet, ApplyResult, NftError, Ruleset, RulesetChange, ServiceSet
from flock.policy._nft import summarize


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

    def touched(self) -> None:
        """Something else of the node changed (NodeState bumps its version for a NodeConfig edit too)."""
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


class InexactChange(AssertionError):
    """A change that does not fit what the table holds (its elements moved from a state it never had)."""


@attrs.define(eq=False)
class MemoryApplier:
    refuse: int = 0  # the next *refuse* transactions fail as nft's would (NftError)
    transactions: int = attrs.field(init=False, default=0)
    _structure: Ruleset | None = attrs.field(init=False, default=None)
    _elements: dict[str, set[Any]] = attrs.field(init=False, factory=dict)
    _token: object | None = attrs.field(init=False, default=None)

    @property
    def applied(self) -> Ruleset | None:
        """The whole ruleset the table holds (None: nothing applied yet)."""
        if self._structure is None:
            return None
        rs, held = self._structure, self._elements
        return attrs.evolve(
            rs,
            address_sets={n: attrs.evolve(s, elements=frozenset(held[n])) for n, s in rs.address_sets.items()},
            service_sets={n: attrs.evolve(s, elements=frozenset(held[n])) for n, s in rs.service_sets.items()},
        )

    def _transaction(self) -> None:
        self.transactions += 1
        if self.refuse > 0:
            self.refuse -= 1
            self._structure = self._token = None
            raise NftError(1, "Error: Could not process rule: No such file or directory\n")

    async def apply_change(self, change: RulesetChange) -> ApplyResult:
        start = time.perf_counter()
        new, old = change.structure, self._structure
        if old is not None and change.base is not None and change.base is self._token:
            if new is old and not change.added and not change.removed:
                self._token = change.token
                return ApplyResult("unchanged", time.perf_counter() - start)
            self._transaction()
            self._incremental(old, change)
            self._structure, self._token = new, change.token
            return ApplyResult("incremental", time.perf_counter() - start, summarize(old, change))
        self._transaction()
        whole = change.whole()
        self._elements = {s.name: set(s.elements) for s in _sets(whole)}
        self._structure, self._token = new, change.token
        return ApplyResult("full", time.perf_counter() - start, summarize(None, change))

    def _incremental(self, old: Ruleset, change: RulesetChange) -> None:
        new = change.structure
        before = {s.name: s for s in _sets(old)}
        after = {s.name: s for s in _sets(new)}
        for name in change.added.keys() | change.removed.keys():
            if name not in after:
                raise InexactChange(f"elements moved in set {name}, which the new ruleset does not have")
        for name, s in after.items():
            if name not in before:
                self._elements[name] = set(change.elements(name))
                continue
            if before[name].declaration != s.declaration:
                raise InexactChange(f"set {name} changed its type")
            held = self._elements[name]
            for element in change.removed.get(name, ()):
                if element not in held:
                    raise InexactChange(f"delete element {element} from {name}, which does not hold it")
                held.remove(element)
            for element in change.added.get(name, ()):
                if element in held:
                    raise InexactChange(f"add element {element} to {name}, which holds it")
                held.add(element)
        for name in before.keys() - after.keys():
            del self._elements[name]

    async def counters(self) -> dict[str, tuple[int, int]]:
        return {}


def _sets(rs: Ruleset) -> list[AddressSet | ServiceSet]:
    return [*rs.address_sets.values(), *rs.service_sets.values()]
