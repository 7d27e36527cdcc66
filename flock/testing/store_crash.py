"""The crash test's writer: allocations forever, announcing each write on
stdout before it starts and acknowledging it when it is done, until the test
SIGKILLs it.

Run as ``python -m flock.testing.store_crash STATE_DIR [WRITERS]``: a zygote that
imports flock once, then for each number FIRST read from stdin forks a writer
starting at row FIRST, says ``pid <pid>``, waits for it and says
``dead <signal>``.  Without WRITERS the writer drives :class:`SyncStore`
directly, one write at a time; with WRITERS it drives the Trio store with
that many concurrent tasks, so writes are group-committed (each
acknowledgement then also says how many calls have shared a transaction).
Forking from a zygote keeps each of the many kills cheap (no interpreter
start-up), and the writer is a real process that dies with SIGKILL.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import sys
from collections.abc import Awaitable, Callable

import trio

from flock.model import Allocation, AllocationState
from flock.store import Store, SyncStore, open_store


def expected(n: int) -> Allocation:
    """Row number *n*, every field derived from *n*, so any mix-up shows."""
    cid = f"c{n:08d}"
    return Allocation(
        container_id=cid,
        namespace=f"ns{n % 7}",
        pod=f"pod-{n}",
        pod_uid=f"uid-{n:x}",
        if_name="eth0",
        netns=f"/var/run/netns/cni-{cid}",
        ip6=ipaddress.IPv6Address(0x20010DB8000000010000000000000000 + n),
        ip4=ipaddress.IPv4Address(0xC6336400 + n % 256),  # 198.51.100.0/24
        anycast=(ipaddress.ip_address("2001:db8:ffff::53"),) if n % 2 else (),
        addresses=tuple(ipaddress.ip_address(f"2001:db8:0:1:ff::{n % 97 + i:x}") for i in range(n % 3)),
        state=AllocationState.PENDING,
        created=float(n),
        updated=float(n),
    )


def main(state_dir: str, first: int) -> None:
    store = SyncStore.open(state_dir)
    say("ready")
    n = first
    while True:
        cid = expected(n).container_id
        step("p", cid, functools.partial(store.put, expected(n)))
        step("c", cid, functools.partial(store.commit, cid, now=float(n) + 0.5))
        if n % 3 == 2:
            old = expected(n - 1).container_id
            step("d", old, functools.partial(store.delete, old))
        n += 1


def main_grouped(state_dir: str, first: int, writers: int) -> None:
    """Like :func:`main`, with *writers* tasks; task t writes rows
    first + t, first + t + writers, … and deletes its own earlier rows."""

    async def writer(store: Store, t: int) -> None:
        n = first + t
        while True:
            cid = expected(n).container_id
            await astep("p", cid, store, functools.partial(store.put, expected(n)))
            await astep("c", cid, store, functools.partial(store.commit, cid, now=float(n) + 0.5))
            if (n - first) // writers % 3 == 2:
                old = expected(n - writers).container_id
                await astep("d", old, store, functools.partial(store.delete, old))
            n += writers

    async def run() -> None:
        async with open_store(state_dir) as store:
            say("ready")
            async with trio.open_nursery() as nursery:
                for t in range(writers):
                    nursery.start_soon(writer, store, t)

    trio.run(run)


async def astep(op: str, cid: str, store: Store, write: Callable[[], Awaitable[object]]) -> None:
    say(f"{op} {cid}")
    await write()
    say(f"{op.upper()} {cid} {store.grouped_calls}")


def step(op: str, cid: str, write: Callable[[], object]) -> None:
    """Announce a write (lower-case op), do it, acknowledge it (upper-case)."""
    say(f"{op} {cid}")
    write()
    say(f"{op.upper()} {cid}")


def say(line: str) -> None:
    # One write(2) of under PIPE_BUF bytes: a kill cannot cut it, and the
    # zygote's and the writer's lines never interleave mid-line.
    os.write(1, (line + "\n").encode())


def zygote(state_dir: str, writers: int) -> None:
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            try:
                if writers:
                    main_grouped(state_dir, int(line), writers)
                else:
                    main(state_dir, int(line))
            finally:
                os._exit(1)
        say(f"pid {pid}")
        _, status = os.waitpid(pid, 0)
        # Printed after the writer is gone, so everything it wrote precedes it.
        say(f"dead {os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1}")


if __name__ == "__main__":
    zygote(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
