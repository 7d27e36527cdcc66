"""One lock per container ID, alive only while someone holds or waits for it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import attrs
import trio


@attrs.define(eq=False)
class _Entry:
    lock: trio.Lock = attrs.field(factory=trio.Lock)
    users: int = 0


@attrs.define(eq=False)
class KeyedLocks:
    """Serializes work per key; different keys run concurrently.

    An entry exists only while a task holds or waits for its key, so a
    node's churn of container IDs never accumulates locks.
    """

    _entries: dict[str, _Entry] = attrs.field(init=False, factory=dict)

    def __len__(self) -> int:
        return len(self._entries)

    def busy(self, key: str) -> bool:
        return key in self._entries

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[key]
