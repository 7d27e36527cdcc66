"""Run supervised services for the length of a block, as a supervisor would."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import trio


@contextlib.asynccontextmanager
async def serving(*services: Any) -> AsyncIterator[trio.Nursery]:
    """Start each ``service.run`` (waiting for its ``task_status.started()``),
    yield the nursery they run in, and cancel them when the block ends."""
    async with trio.open_nursery() as nursery:
        for service in services:
            await nursery.start(service.run)
        yield nursery
        nursery.cancel_scope.cancel()
