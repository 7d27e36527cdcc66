"""The crash test's child: writes allocations forever, acknowledging each
finished write on stdout, until the parent SIGKILLs it.

Run as ``python store_crash_child.py STATE_DIR FIRST``.
"""

from __future__ import annotations

import ipaddress
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
    print("ready", flush=True)
    n = first
    while True:
        row = expected(n)
        store.put(row)
        print("P", row.container_id, flush=True)
        store.commit(row.container_id, now=float(n) + 0.5)
        print("C", row.container_id, flush=True)
        if n % 3 == 2:
            victim = expected(n - 1).container_id
            store.delete(victim)
            print("D", victim, flush=True)
        n += 1


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
