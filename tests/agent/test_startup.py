"""The end of start-up in virtual time: the "ready" line, and the garbage collector handed back."""

import gc
import logging

import pytest
import trio

from flock.agent._startup import GC_DEADLINE_S, StartupWatch, process_age
from flock.state import Gate, NodeState

GATES = [Gate("api", "not connected"), Gate("add", "start-up has not finished")]


@pytest.fixture
def collector_taken():
    """As ``flock-agent``'s entry point leaves it: the collector off."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was:
            gc.enable()


def ready_lines(caplog):
    return [r for r in caplog.records if r.getMessage() == "ready"]


async def test_ready_is_logged_once_with_each_gates_time_and_the_collector_comes_back(
    autojump_clock, collector_taken, caplog
):
    caplog.set_level(logging.INFO, "flock.agent")
    state = NodeState("host001", GATES)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(StartupWatch(state).run)
            await trio.sleep(1)
            state.open_gate("api")
            await trio.sleep(1)
            assert not ready_lines(caplog) and not gc.isenabled()
            state.open_gate("add")
        # The watch returned by itself: ready, once.
    assert gc.isenabled() and gc.get_freeze_count() > 0
    (line,) = ready_lines(caplog)
    assert set(line.gates_opened_s) == {"api", "add"}
    assert line.since_exec_s == pytest.approx(process_age(), abs=5)
    state.close_gate("add", "again")
    state.open_gate("add")
    assert len(ready_lines(caplog)) == 1


async def test_without_readiness_the_collector_comes_back_at_the_deadline(autojump_clock, collector_taken, caplog):
    caplog.set_level(logging.INFO, "flock.agent")
    state = NodeState("host001", GATES)
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            await nursery.start(StartupWatch(state).run)
            await trio.sleep(GC_DEADLINE_S - 0.5)
            assert not gc.isenabled()
            await trio.sleep(1)
            assert gc.isenabled() and trio.current_time() == GC_DEADLINE_S + 0.5
            await trio.sleep(300)  # still waiting for readiness, without spinning (autojump would not advance)
            assert not ready_lines(caplog)
            state.open_gate("api")
            state.open_gate("add")
    assert len(ready_lines(caplog)) == 1 and trio.current_time() == GC_DEADLINE_S + 300.5


async def test_a_collector_that_was_on_is_left_alone(autojump_clock):
    assert gc.isenabled()
    state = NodeState("host001", GATES)
    state.open_gate("api")
    state.open_gate("add")
    with trio.fail_after(5):
        await StartupWatch(state).run()
    assert gc.isenabled() and gc.get_freeze_count() == 0
