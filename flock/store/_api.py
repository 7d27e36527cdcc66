"""The Trio face of the store: :func:`open_store` → :class:`Store`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio

from flock.model import DEFAULT_NETWORK, Allocation, AllocationState
from flock.store._schema import MIGRATIONS, Migration
from flock.store._sync import SyncStore
from flock.store._thread import StoreThread

T = TypeVar("T")


@attrs.define(eq=False)
class Store:
    """The allocations, for Trio tasks; get one from :func:`open_store`.

    ``get``/``put``/``commit``/``delete``/``list`` are the pod layer's
    allocation-store protocol; each runs on the store's thread, grouped with
    whatever else is queued at that moment."""

    _thread: StoreThread
    _core: SyncStore

    @property
    def path(self) -> Path:
        return self._core.path

    @property
    def grouped_calls(self) -> int:
        """Calls that shared a transaction with others so far."""
        return self._thread.grouped_calls

    async def settings(self) -> dict[str, Any]:
        return await self._call(self._core.settings)

    async def put(self, allocation: Allocation) -> None:
        await self._call(lambda: self._core.put(allocation))

    async def commit(self, container_id: str, *, now: float | None = None) -> Allocation:
        return await self._call(lambda: self._core.commit(container_id, now=now))

    async def get(self, container_id: str) -> Allocation | None:
        return await self._call(lambda: self._core.get(container_id))

    async def delete(self, container_id: str) -> bool:
        return await self._call(lambda: self._core.delete(container_id))

    async def list(self, state: AllocationState | None = None) -> list[Allocation]:
        return await self._call(lambda: self._core.list(state))

    async def _call(self, fn: Callable[[], T]) -> T:
        return await self._thread.call(fn, group=self._core.run_group)


@contextlib.asynccontextmanager
async def open_store(
    state_dir: os.PathLike[str] | str,
    *,
    migrations: Sequence[Migration] = MIGRATIONS,
    legacy_network: str = DEFAULT_NETWORK,
) -> AsyncIterator[Store]:
    """Open the store on its own thread; close it (shielded) on exit.
    A :class:`~flock.store.StoreError` from opening propagates."""
    thread = StoreThread()
    # Closing is shielded without a deadline: a queued call cannot be
    # abandoned anyway, and closing only waits for the call in flight.
    try:
        core = await thread.call(
            lambda: SyncStore.open(state_dir, migrations=migrations, legacy_network=legacy_network)
        )
        try:
            yield Store(thread, core)
        finally:
            with trio.CancelScope(shield=True):
                await thread.call(core.close)
    finally:
        with trio.CancelScope(shield=True):
            await thread.stop()
