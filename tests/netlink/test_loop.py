"""The netlink worker's private asyncio loop is plain asyncio, whatever event
loop policy the agent's process has installed (trio-asyncio's, in flock-agent)."""

import asyncio

import trio
import trio_asyncio

from flock.netlink import _conn


def _trio_asyncio_policy() -> bool:
    return type(asyncio.get_event_loop_policy()).__module__.startswith("trio_asyncio")


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


async def test_run_blocking_uses_a_plain_asyncio_loop_beside_trio_asyncio():
    with trio.fail_after(10):
        async with trio_asyncio.open_loop():
            assert _trio_asyncio_policy()
            loop_type = await trio.to_thread.run_sync(_conn.run_blocking, _loop_type)
            assert loop_type is asyncio.SelectorEventLoop
            # And the worker thread's loop left the policy alone.
            assert _trio_asyncio_policy()
