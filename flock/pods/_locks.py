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
    _idle: trio.Event | None = attrs.field(init=False, default=None)

    def __len__(self) -> int:
        return len(self._entries)

    def busy(self, key: str) -> bool:
        return key in self._entries

    async def wait_idle(self) -> None:
        """Return once no key is held or waited for (at once if none is)."""
        while self._entries:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()
        await trio.lowlevel.checkpoint()

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
                if not self._entries and self._idle is not None:
                    self._idle.set()
                    self._idle = None
