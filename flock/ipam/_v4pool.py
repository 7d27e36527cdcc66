"""Lowest-free IPv4 allocation without rescans.

Everything at or above ``_fresh`` has never been handed out by this pool;
addresses released below it sit in a min-heap.  Allocation pops the heap or
advances ``_fresh``, skipping what the shared ``taken`` set holds (fixed
addresses, seeded rows, another pool's allocations in an overlapping range).
Each address is skipped at most once per pass of ``_fresh`` and each heap
entry popped once, so a full /16 costs O(n log n), not O(n²).
"""

from __future__ import annotations

import heapq
import ipaddress
from collections.abc import Callable

import attrs


@attrs.define(eq=False)
class LowestFreePool:
    """The usable addresses of one IPv4 CIDR (network, .1, broadcast excluded)."""

    cidr: ipaddress.IPv4Network
    _first: int = attrs.field(init=False)
    _last: int = attrs.field(init=False)
    _fresh: int = attrs.field(init=False)
    _freed: list[int] = attrs.field(init=False, factory=list)
    _in_heap: set[int] = attrs.field(init=False, factory=set)

    def __attrs_post_init__(self) -> None:
        if self.cidr.prefixlen > 30:
            raise ValueError(f"{self.cidr}: /31 and /32 have no usable address")
        base = int(self.cidr.network_address)
        self._first = base + 2  # skip the network address and the first host (.1)
        self._last = int(self.cidr.broadcast_address) - 1
        self._fresh = self._first

    def take(self, taken: Callable[[int], bool]) -> int | None:
        """The lowest free address as an int, or None when the CIDR is full.
        Does not record it: the caller marks it taken."""
        while self._freed:
            addr = heapq.heappop(self._freed)
            self._in_heap.discard(addr)
            if not taken(addr):
                return addr
        while self._fresh <= self._last:
            addr = self._fresh
            self._fresh += 1
            if not taken(addr):
                return addr
        return None

    def give_back(self, addr: int) -> None:
        """*addr* became free; remember it if ``_fresh`` has already passed it."""
        if self._first <= addr < self._fresh and addr not in self._in_heap:
            heapq.heappush(self._freed, addr)
            self._in_heap.add(addr)
