"""Kill a writer with SIGKILL at random points, many times: after each kill
the store opens, every row is intact and pending or committed, and every
write the writer acknowledged is there."""

import os
import random
import signal
import subprocess
import sys
import threading

import attrs
import pytest

from flock.model import AllocationState
from flock.store import SyncStore
from flock.testing.store_crash import expected

CHILD = ["-m", "flock.testing.store_crash"]
KILLS = 50


@pytest.mark.parametrize("writers", [0, 8], ids=["one-writer", "group-commit"])
def test_sigkill_at_random_points_never_leaves_a_half_written_row(tmp_path, writers):
    """writers=0: SyncStore, one write at a time.  writers=8: the Trio store
    with eight concurrent writers, so kills land inside group commits."""
    rng = random.Random(20261121)
    acked: dict[str, str] = {}  # container ID → last acknowledged op (P, C, D; ? if unknown)
    grouped = 0  # calls that shared a transaction, summed over the writers
    zygote = subprocess.Popen(
        [sys.executable, *CHILD, str(tmp_path), str(writers)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    # A stuck child must fail the test, not hang it: killing the zygote ends its output.
    watchdog = threading.Timer(60, zygote.kill)
    watchdog.start()
    try:
        for run in range(KILLS):
            zygote.stdin.write(f"{run * 1_000_000}\n")
            zygote.stdin.flush()
            lines, pid, wanted = [], None, rng.randrange(0, 60)
            while pid is None or len(lines) < wanted:
                line = zygote.stdout.readline()
                assert line, "the zygote died"
                if line.startswith("pid "):
                    pid = int(line.split()[1])
                else:
                    lines.append(line)
            os.kill(pid, signal.SIGKILL)  # the writer keeps writing until it lands
            while not (line := zygote.stdout.readline()).startswith("dead "):
                assert line, "the zygote died"
                lines.append(line)
            assert line == f"dead {int(signal.SIGKILL)}\n"
            grouped += check_after_kill(tmp_path, run, lines, acked)
    finally:
        watchdog.cancel()
        zygote.kill()
        zygote.wait()
        zygote.stdin.close()
        zygote.stdout.close()
    assert sum(op == "C" for op in acked.values()) > KILLS  # the test really wrote
    if writers:
        assert grouped > KILLS  # the writes really went through group commits


def check_after_kill(state_dir, run, lines, acked) -> int:
    """Check the store after one kill; returns the writer's last grouped-calls count."""
    in_flight = set()  # announced, not acknowledged
    grouped = 0
    for line in lines:
        if line == "ready\n":
            continue
        op, cid, *count = line.split()
        if op.islower():
            in_flight.add(cid)
        else:
            acked[cid] = op
            in_flight.discard(cid)
            grouped = int(count[0]) if count else grouped
    for cid in in_flight:
        acked[cid] = "?"  # the kill landed in this write: either outcome is right

    store = SyncStore.open(state_dir)
    rows = {a.container_id: a for a in store.list()}
    store.close()
    for cid, row in rows.items():
        n = int(cid[1:])
        want = expected(n)
        assert row.state in (AllocationState.PENDING, AllocationState.COMMITTED)
        if row.state is AllocationState.COMMITTED:
            want = attrs.evolve(want, state=AllocationState.COMMITTED, updated=float(n) + 0.5)
        assert row == want, f"run {run}: row {cid} is not what was written"
    for cid, op in acked.items():
        if op == "D":
            assert cid not in rows, f"run {run}: {cid} was deleted but is back"
        elif op != "?":
            assert cid in rows, f"run {run}: acknowledged {cid} is missing"
            if op == "C":
                assert rows[cid].state is AllocationState.COMMITTED
    return grouped


PENDING_THEN_WAIT = """
import sys
from flock.store import SyncStore
from flock.testing.store_crash import expected
store = SyncStore.open(sys.argv[1])
store.put(expected(7))
print("written", flush=True)
sys.stdin.read()  # killed here: no later commit, no close
"""


def test_a_pending_row_survives_sigkill_without_any_later_commit(tmp_path):
    """Writes are not fsynced (flock.store, "Durability"): the WAL frame is in
    the file, so a process crash cannot lose even a pending row."""
    with subprocess.Popen(
        [sys.executable, "-c", PENDING_THEN_WAIT, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout.readline() == "written\n"
            child.send_signal(signal.SIGKILL)
            assert child.wait(timeout=30) == -signal.SIGKILL
        finally:
            child.kill()
    store = SyncStore.open(tmp_path)
    try:
        assert store.get(expected(7).container_id) == expected(7)
        assert store.get(expected(7).container_id).state is AllocationState.PENDING
    finally:
        store.close()
