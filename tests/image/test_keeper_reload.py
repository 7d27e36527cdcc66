"""The keeper replaces processes as a kubelet replaces a pod (what ``flock-lab upgrade`` drives):
a reload stops what is gone or changed — preStop hook first, SIGTERM, SIGKILL after the spec's
grace — then starts what is new, and leaves the rest running.  Real processes, no lab."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import trio

from flock.lab.keeper import MIN_TERM_GRACE_S, Keeper, ProcessSpec, load_spec_file

pytestmark = pytest.mark.image


def _status(path: Path) -> dict:
    return json.loads(path.read_text())


async def test_reload_replaces_changed_processes_runs_their_hooks_and_keeps_the_rest(tmp_path: Path) -> None:
    hook, seen = tmp_path / "hook", tmp_path / "seen"
    # On SIGTERM it records whether its preStop hook had run, then exits.
    graceful = f"trap 'cat {hook} > {seen} 2>&1; kill $!; exit 0' TERM; sleep 600 & wait"
    stays = ProcessSpec("stays", ("sleep", "600"), tmp_path / "stays.log")
    old = ProcessSpec(
        "pod", ("sh", "-c", graceful), tmp_path / "pod.log", pre_stop=("sh", "-c", f"echo hooked > {hook}"), grace=5
    )
    gone = ProcessSpec("gone", ("sleep", "600"), tmp_path / "gone.log")
    new = ProcessSpec("pod", ("sleep", "601"), tmp_path / "pod.log", grace=5)
    status = tmp_path / "procs.json"
    keeper = Keeper((stays, old, gone), status, stop_grace=2)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(keeper.run)
            before = _status(status)["processes"]
            await keeper.reconcile((stays, new), 7)
            after = _status(status)
            restarts = keeper.restarts
            keeper.request_stop()
    assert seen.read_text() == "hooked\n"  # the hook ran before the signal
    assert after["generation"] == 7 and sorted(after["processes"]) == ["pod", "stays"]
    assert after["processes"]["stays"]["pid"] == before["stays"]["pid"]  # untouched
    assert after["processes"]["pod"]["pid"] != before["pod"]["pid"]
    assert after["processes"]["pod"]["argv"] == ["sleep", "601"] and after["processes"]["pod"]["running"]
    assert restarts == {"stays": 0, "pod": 0}  # replaced, not restarted; "gone" forgotten


async def test_a_process_that_ignores_sigterm_is_killed_when_its_grace_is_over(tmp_path: Path) -> None:
    ignores = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    )
    stubborn = ProcessSpec("stubborn", (sys.executable, "-c", ignores), tmp_path / "stubborn.log", grace=0.5)
    status = tmp_path / "procs.json"
    keeper = Keeper((stubborn,), status)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(keeper.run)
            log = trio.Path(tmp_path / "stubborn.log")
            while "up" not in await log.read_text():  # noqa: ASYNC110 (a child's output)
                await trio.sleep(0.02)
            start = time.monotonic()
            await keeper.reconcile((), 1)
            took = time.monotonic() - start
            keeper.request_stop()
    # A kubelet gives at least 2 s after SIGTERM, whatever the grace left.
    assert MIN_TERM_GRACE_S <= took < MIN_TERM_GRACE_S + 2, took
    assert _status(status)["processes"] == {}


def test_spec_files_carry_a_generation(tmp_path: Path) -> None:
    spec = ProcessSpec("a", ("true",), tmp_path / "a.log", grace=30.0)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"processes": [spec.to_json()]}))
    assert load_spec_file(path) == (0, (spec,))  # what `up` wrote before there were reloads
    path.write_text(json.dumps({"generation": 3, "processes": [spec.to_json()]}))
    assert load_spec_file(path) == (3, (spec,))
