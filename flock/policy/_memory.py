"""An applier keeping ``table inet flock`` in memory: the policy service's tests and benchmarks.

It applies a :class:`RulesetChange` as :class:`NftApplier` would have nft
apply it — incrementally when the change continues the one it holds, else
whole — and is stricter than the kernel: a change that deletes an element
its set does not hold, adds one it holds, or moves elements of a set it has
not got is a bug in whoever made the change (:class:`InexactChange`), not a
transaction to retry.  *refuse* makes the next transactions fail as nft's do.
"""

from __future__ import annotations

import time
from typing import Any

import attrs

from ._apply import ApplyResult
from ._backend import NftError
from ._nft import summarize
from ._ruleset import AddressSet, Ruleset, RulesetChange, ServiceSet


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
