"""The one place where asyncio meets Trio.

kubernetes-asyncio (and aiohttp under it) are asyncio libraries; flock is a
Trio program.  trio-asyncio runs an asyncio loop inside the Trio run, owned by
the Trio task that opens it, and :meth:`AsyncioBridge.call` runs an asyncio
coroutine function from Trio.  Cancelling the calling Trio task cancels the
asyncio task (aiohttp then closes the connection it was using).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import attrs
import trio_asyncio

T = TypeVar("T")


@attrs.define(eq=False)
class AsyncioBridge:
    """Handle on a running trio-asyncio loop; valid inside :func:`open_bridge`."""

    _loop: Any

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run asyncio coroutine function *fn* on the loop and return its result.

        Its exceptions propagate unchanged; Trio cancellation cancels it.
        """
        return await trio_asyncio.aio_as_trio(fn, loop=self._loop)(*args, **kwargs)

    async def call_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a plain function that needs a running asyncio loop (e.g. closing a response)."""

        async def on_loop() -> T:
            return fn(*args)

        return await self.call(on_loop)

    def soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Schedule a plain function on the asyncio loop, from Trio, without waiting for it
        (no asyncio task: the cheap way to wake an asyncio waiter once per chunk)."""
        self._loop.call_soon(fn, *args)


def _sole_exception(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


@contextlib.asynccontextmanager
async def open_bridge() -> AsyncIterator[AsyncioBridge]:
    """Run an asyncio loop for the lifetime of the block (one per process is enough).

    trio-asyncio's loop runs in a nursery of its own; an error raised in the
    block comes out as itself, not wrapped in that nursery's ExceptionGroup.
    """
    try:
        async with trio_asyncio.open_loop() as loop:
            yield AsyncioBridge(loop)
    except BaseExceptionGroup as group:
        sole = _sole_exception(group)
        if sole is group:
            raise
        raise sole from None
