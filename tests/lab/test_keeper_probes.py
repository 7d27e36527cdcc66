"""The keeper polls liveness and readiness probes as a kubelet does (virtual time)."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
import trio
from trio.testing import MockClock

from flock.lab.keeper import Keeper, ProbeSpec, ProcessSpec


@attrs.frozen
class ScriptedProbe(ProbeSpec):
    """Answers from *script* (then its last answer); notes when it was asked and
    what the status file said about readiness at that moment."""

    script: tuple[bool, ...] = ()
    status_file: Path | None = None
    calls: list[tuple[float, bool | None]] = attrs.field(factory=list, eq=False)

    async def passes(self) -> bool:
        ready = None
        if self.status_file is not None and self.status_file.exists():
            ready = json.loads(self.status_file.read_text())["processes"]["c"]["ready"]
        self.calls.append((trio.current_time(), ready))
        return self.script[min(len(self.calls) - 1, len(self.script) - 1)]


@pytest.fixture
def lazy_autojump() -> MockClock:
    """Virtual time that jumps only after 20 ms of real idleness: the real child
    process the keeper waits for gets to exit before the clock runs on."""
    return MockClock(autojump_threshold=0.02)


def test_probe_specs_round_trip_through_json() -> None:
    spec = ProcessSpec(
        "agent",
        ("podman", "run"),
        Path("/x.log"),
        {"A": "1"},
        ProbeSpec(http=("ns", "127.0.0.1", 9464, "/healthz"), initial_delay=10, period=10, failure_threshold=6),
        ProbeSpec(argv=("podman", "exec", "c", "true"), period=5),
    )
    assert ProcessSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


async def test_failing_liveness_restarts_the_process_after_the_threshold(tmp_path: Path, lazy_autojump) -> None:
    probe = ScriptedProbe(initial_delay=10, period=10, failure_threshold=3, script=(False,))
    keeper = Keeper((ProcessSpec("c", ("sleep", "600"), tmp_path / "c.log", liveness=probe),), tmp_path / "procs.json")
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            start = trio.current_time()
            await nursery.start(keeper.run)
            while keeper.restarts["c"] < 1:  # noqa: ASYNC110 (the keeper offers no event; virtual time)
                await trio.sleep(1)
            keeper.request_stop()
    # Asked at 10, 20, 30 s; the third failure in a row ended the process, which came back.
    assert [round(t - start) for t, _ in probe.calls[:3]] == [10, 20, 30]
    assert "liveness-failed" not in (tmp_path / "c.log").read_text()  # the keeper's own log line, not the process's


async def test_readiness_follows_the_thresholds(tmp_path: Path, lazy_autojump) -> None:
    status = tmp_path / "procs.json"
    probe = ScriptedProbe(
        period=5, failure_threshold=3, script=(False, True, True, False, False, False, True, True), status_file=status
    )
    keeper = Keeper((ProcessSpec("c", ("sleep", "600"), tmp_path / "c.log", readiness=probe),), status)
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            await nursery.start(keeper.run)
            while len(probe.calls) < 8:  # noqa: ASYNC110 (the probe offers no event; virtual time)
                await trio.sleep(1)
            keeper.request_stop()
    # Ready after one pass; still ready after two failures; not ready after the third; ready again after a pass.
    assert [ready for _, ready in probe.calls] == [False, False, True, True, True, True, False, True]
    assert keeper.restarts["c"] == 0


async def test_pre_stop_hook_runs_before_the_signal(tmp_path: Path) -> None:
    hook, seen = tmp_path / "hook", tmp_path / "seen"
    # On SIGTERM the process records whether the hook had already run.
    script = f"trap 'cat {hook} > {seen} 2>&1; kill $!; exit 0' TERM; sleep 600 & wait"
    spec = ProcessSpec("c", ("sh", "-c", script), tmp_path / "c.log", pre_stop=("sh", "-c", f"echo hooked > {hook}"))
    keeper = Keeper((spec,), tmp_path / "procs.json", stop_grace=5)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(keeper.run)
            keeper.request_stop()
    assert seen.read_text() == "hooked\n"
