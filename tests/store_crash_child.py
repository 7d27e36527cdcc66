"""The crash test's writer: allocations forever, announcing each write on
stdout before it starts and acknowledging it when it is done, until the test
SIGKILLs it.

Run as ``python store_crash_child.py STATE_DIR``: a zygote that imports flock
once, then for each number FIRST read from stdin forks a writer starting at
row FIRST, says ``pid <pid>``, waits for it and says ``dead <signal>``.
Forking from a zygote keeps each of the many kills cheap (no interpreter
start-up), and the writer is a real process that dies with SIGKILL.
"""

from __future__ import annotations

import ipaddress
import os
import sys

from flock.model import Allocation, AllocationState
from flock.store import SyncStore


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
        step("p", cid, lambda: store.put(expected(n)))
        step("c", cid, lambda: store.commit(cid, now=float(n) + 0.5))
        if n % 3 == 2:
            step("d", expected(n - 1).container_id, lambda: store.delete(expected(n - 1).container_id))
        n += 1


def step(op: str, cid: str, write) -> None:
    """Announce a write (lower-case op), do it, acknowledge it (upper-case)."""
    say(f"{op} {cid}")
    write()
    say(f"{op.upper()} {cid}")


def say(line: str) -> None:
    # One write(2) of under PIPE_BUF bytes: a kill cannot cut it, and the
    # zygote's and the writer's lines never interleave mid-line.
    os.write(1, (line + "\n").encode())


def zygote(state_dir: str) -> None:
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            try:
                main(state_dir, int(line))
            finally:
                os._exit(1)
        say(f"pid {pid}")
        _, status = os.waitpid(pid, 0)
        # Printed after the writer is gone, so everything it wrote precedes it.
        say(f"dead {os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1}")


if __name__ == "__main__":
    zygote(sys.argv[1])
