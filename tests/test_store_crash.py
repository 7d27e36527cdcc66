"""Kill a writer with SIGKILL at random points, many times: after each kill
the store opens, every row is intact and pending or committed, and every
write the child acknowledged is there."""

import random
import signal
import subprocess
import sys
from pathlib import Path

import attrs

from flock.model import AllocationState
from flock.store import SyncStore
from store_crash_child import expected

CHILD = Path(__file__).with_name("store_crash_child.py")
KILLS = 20


def test_sigkill_at_random_points_never_leaves_a_half_written_row(tmp_path):
    rng = random.Random(20261121)
    acked: dict[str, str] = {}  # container ID → last acknowledged op (P, C or D)
    for run in range(KILLS):
        child = subprocess.Popen(
            [sys.executable, str(CHILD), str(tmp_path), str(run * 1_000_000)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout.readline() == "ready\n"
            for _ in range(rng.randrange(0, 120)):
                op, cid = child.stdout.readline().split()
                acked[cid] = op
            child.send_signal(signal.SIGKILL)  # the child keeps writing until it lands
            for line in child.stdout:  # what it finished before dying
                op, _, cid = line.strip().partition(" ")
                if cid:  # a line cut by the kill has no ID: nothing acknowledged
                    acked[cid] = op
        finally:
            child.kill()
            child.wait()
            child.stdout.close()
        assert child.returncode == -signal.SIGKILL

        store = SyncStore.open(tmp_path)
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
            else:
                assert cid in rows, f"run {run}: acknowledged {cid} is missing"
                if op == "C":
                    assert rows[cid].state is AllocationState.COMMITTED
    assert sum(op == "C" for op in acked.values()) > KILLS  # the test really wrote
