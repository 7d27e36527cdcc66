"""Operational failures on one node, against a real flock-agent process: what an
operator hits (broken state directory, two agents, API server trouble, BIRD
missing, signals) and what the agent must do about it."""

from __future__ import annotations

import time

import pytest

from agent_lab import Lab
from flock.testing import ApiServer
from flock.testing.netns import netns_pool

pytestmark = pytest.mark.usefixtures("require_root")
# Fatal start-up problems must end the process well before restart intensity
# would (5 restarts with backoff ≈ 15 s): a generous bound, not a timing figure.
FAST_EXIT_S = 10


@pytest.fixture
def lab(tmp_path):
    with netns_pool("fl-fault-") as pool, ApiServer() as api:
        lab = Lab(tmp_path, pool, api, bird=False)
        try:
            yield lab
        finally:
            lab.close()


def _fatal_exit(agent) -> str:
    began = time.monotonic()
    rc = agent.proc.wait(timeout=30)
    took = time.monotonic() - began
    text = agent.log.read_text()
    assert rc == 1, text[-2000:]
    assert took < FAST_EXIT_S, f"exit took {took:.1f} s: hidden behind restarts"
    fatal = [line for line in text.splitlines() if line.startswith("flock-agent: fatal: ")]
    assert len(fatal) == 1, text[-2000:]
    return fatal[0]


def test_corrupt_database_exits_at_once_naming_the_file_and_the_remedy(lab):
    lab.state_dir.mkdir(mode=0o700)
    (lab.state_dir / "flock.db").write_bytes(b"not sqlite " * 500)
    line = _fatal_exit(lab.agent())
    assert f"{lab.state_dir / 'flock.db'}: file is not a database" in line
    assert "Restore the file from a backup, or move it" in line
    assert (lab.state_dir / "flock.db").read_bytes() == b"not sqlite " * 500  # never "repaired" behind the operator's back


def test_state_dir_that_is_not_a_directory_exits_at_once(lab):
    lab.state_dir.write_text("oops")
    line = _fatal_exit(lab.agent())
    assert line == f"flock-agent: fatal: state directory {lab.state_dir}: exists and is not a directory; " \
                   "mount a writable directory there or pass --state-dir"


def test_second_agent_on_the_socket_exits_at_once_and_the_first_keeps_serving(lab):
    first = lab.agent()
    first.wait_ready()
    line = _fatal_exit(lab.agent())
    assert line == f"flock-agent: fatal: another flock-agent answers on {lab.socket}"
    assert first.proc.poll() is None and lab.socket.exists()
    assert lab.cni("STATUS").status == 0
