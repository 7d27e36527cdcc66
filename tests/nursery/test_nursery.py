"""The supervisor in virtual time (autojump_clock): exact restart times, escalation, readiness."""

import logging
import random

import pytest
import trio

from flock.nursery import Backoff, ChildSpec, Restart, RestartIntensity, Supervisor, SupervisorEscalation

FAST = Backoff(initial=1.0, factor=2.0, cap=5.0)


class Boom(Exception):
    pass


def test_backoff_is_exponential_capped_and_jitter_is_the_callers_draw():
    b = Backoff(initial=0.5, factor=2.0, cap=4.0)
    assert [b.delay(n) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert b.delay(10_000) == 4.0
    j = Backoff(initial=1.0, factor=2.0, cap=30.0, jitter=0.5)
    assert j.delay(2) == j.delay(2, u=0.5) == 4.0  # the middle of the band: the mean is the exponential
    assert j.delay(2, u=0.0) == 2.0
    assert j.delay(2, u=0.75) == 5.0
    rng1, rng2 = random.Random(7), random.Random(7)
    assert [j.delay(3, rng1.random()) for _ in range(5)] == [j.delay(3, rng2.random()) for _ in range(5)]
    with pytest.raises(ValueError):
        Backoff(jitter=1.5)
    with pytest.raises(ValueError):
        Backoff(initial=-1)


def test_restart_intensity_counts_a_sliding_window():
    r = RestartIntensity(max_restarts=2, period=10.0)
    h = r.admit((), 0.0)
    assert h == (0.0,)
    h = r.admit(h, 5.0)
    assert h == (0.0, 5.0)
    assert r.admit(h, 9.0) is None
    assert r.admit(h, 10.5) == (5.0, 10.5)
    assert RestartIntensity(max_restarts=0).admit((), 1.0) is None


async def test_crashing_child_restarts_at_exact_backoff_times(autojump_clock):
    starts = []

    async def crasher(*, task_status):
        starts.append(trio.current_time())
        task_status.started()
        if len(starts) == 6:
            await trio.sleep_forever()
        raise Boom("again")

    sup = Supervisor("root", [ChildSpec("crasher", crasher, backoff=FAST)], intensity=RestartIntensity(10, 100.0))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            await trio.sleep(50)
            nursery.cancel_scope.cancel()
    assert starts == [0.0, 1.0, 3.0, 7.0, 12.0, 17.0]
    assert sup.restarts("crasher") == 5


async def test_backoff_resets_after_a_long_healthy_run(autojump_clock):
    starts = []

    async def flaky(*, task_status):
        starts.append(trio.current_time())
        task_status.started()
        await trio.sleep(10 if len(starts) == 2 else 0)
        if len(starts) == 4:
            await trio.sleep_forever()
        raise Boom

    spec = ChildSpec("flaky", flaky, backoff=Backoff(initial=1.0, factor=2.0, cap=60.0, reset_after=10.0))
    sup = Supervisor("root", [spec], intensity=RestartIntensity(10, 100.0))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            await trio.sleep(30)
            nursery.cancel_scope.cancel()
    # crash at 0 → +1; ran 10 s (reset) → +1 again; then +2.
    assert starts == [0.0, 1.0, 12.0, 14.0]


async def test_escalation_cancels_siblings_and_propagates(autojump_clock, caplog):
    sibling_cancelled_at = []

    async def sibling(*, task_status):
        task_status.started()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            sibling_cancelled_at.append(trio.current_time())
            raise

    async def crasher(*, task_status):
        task_status.started()
        await trio.sleep(1)
        raise Boom("disk on fire")

    sup = Supervisor(
        "root",
        [ChildSpec("sibling", sibling), ChildSpec("crasher", crasher, backoff=FAST)],
        intensity=RestartIntensity(max_restarts=2, period=60.0),
    )
    caplog.set_level(logging.ERROR, logger="flock.nursery")
    with trio.fail_after(60):
        with pytest.raises(SupervisorEscalation) as info:
            await sup.run()
    # crash at 1 → restart at 2, crash at 3 → restart at 5, crash at 6 → third restart refused.
    assert sibling_cancelled_at == [6.0]
    assert info.value.child == "crasher" and info.value.supervisor == "root"
    assert isinstance(info.value.__cause__, Boom)
    assert "more than 2 restarts in 60 s" in str(info.value)
    assert [r.getMessage() for r in caplog.records] == ["child crasher failed"] * 3


async def test_readiness_waits_for_every_child_in_order(autojump_clock):
    order = []

    def service(name, delay):
        async def run(*, task_status):
            await trio.sleep(delay)
            order.append((name, trio.current_time()))
            task_status.started()
            await trio.sleep_forever()

        return ChildSpec(name, run)

    sup = Supervisor("root", [service("store", 2), service("rpc", 3)])
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            assert sup.ready == frozenset()
            await nursery.start(sup.run)
            assert trio.current_time() == 5.0
            assert order == [("store", 2.0), ("rpc", 5.0)]
            assert sup.ready == {"store", "rpc"}
            nursery.cancel_scope.cancel()


async def test_child_failing_before_ready_delays_readiness_by_its_backoff(autojump_clock):
    attempts = []

    async def slow_start(*, task_status):
        attempts.append(trio.current_time())
        if len(attempts) < 3:
            raise Boom("not yet")
        task_status.started()
        await trio.sleep_forever()

    sup = Supervisor("root", [ChildSpec("w", slow_start, backoff=FAST)])
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            assert trio.current_time() == 3.0
            assert attempts == [0.0, 1.0, 3.0]
            nursery.cancel_scope.cancel()


async def test_readiness_is_lost_while_a_child_restarts(autojump_clock):
    async def once_crashing(*, task_status):
        task_status.started()
        await trio.sleep(1)
        raise Boom

    sup = Supervisor(
        "root", [ChildSpec("c", once_crashing, backoff=Backoff(initial=4.0))], intensity=RestartIntensity(10, 60)
    )
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            await trio.sleep(2)
            assert sup.ready == frozenset()  # crashed at 1, back at 5
            await trio.sleep(3.5)
            assert sup.ready == {"c"}
            nursery.cancel_scope.cancel()


async def test_policies_decide_what_is_restarted(autojump_clock):
    runs = {"permanent": 0, "transient-ok": 0, "transient-crash": 0, "temporary": 0}

    def child(name, restart, crash):
        async def run(*, task_status):
            runs[name] += 1
            task_status.started()
            await trio.sleep(1)
            if crash:
                raise Boom(name)

        return ChildSpec(name, run, restart=restart, backoff=Backoff(initial=1.0, factor=1.0))

    sup = Supervisor(
        "root",
        [
            child("permanent", Restart.PERMANENT, crash=False),
            child("transient-ok", Restart.TRANSIENT, crash=False),
            child("transient-crash", Restart.TRANSIENT, crash=True),
            child("temporary", Restart.TEMPORARY, crash=True),
        ],
        intensity=RestartIntensity(100, 60.0),
    )
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            await trio.sleep(10.5)
            nursery.cancel_scope.cancel()
    # period 2 s (1 s running + 1 s backoff) → runs at 0,2,4,6,8,10.
    assert runs == {"permanent": 6, "transient-ok": 1, "transient-crash": 6, "temporary": 1}


async def test_temporary_child_failing_before_ready_escalates(autojump_clock):
    async def broken(*, task_status):
        raise Boom("config missing")

    with trio.fail_after(60):
        with pytest.raises(SupervisorEscalation) as info:
            await Supervisor("root", [ChildSpec("t", broken, restart=Restart.TEMPORARY)]).run()
    assert isinstance(info.value.__cause__, Boom)


async def test_cancellation_is_never_a_crash(autojump_clock, caplog):
    starts = []

    async def worker(*, task_status):
        starts.append(trio.current_time())
        task_status.started()
        with trio.CancelScope() as inner:
            inner.cancel()  # a child's own cancelled scope is its business
            await trio.sleep_forever()
        await trio.sleep_forever()

    sup = Supervisor("root", [ChildSpec("w", worker)], intensity=RestartIntensity(0, 60.0))
    caplog.set_level(logging.DEBUG, logger="flock.nursery")
    with trio.fail_after(60):
        with trio.move_on_after(5):
            await sup.run()
    assert trio.current_time() == 5.0
    assert starts == [0.0]
    assert sup.restarts("w") == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_nested_supervisor_escalation_is_a_crash_of_the_parents_child(autojump_clock):
    inner_starts = []

    async def crasher(*, task_status):
        inner_starts.append(trio.current_time())
        task_status.started()
        raise Boom

    inner = Supervisor(
        "inner",
        [ChildSpec("c", crasher, backoff=Backoff(initial=1.0, factor=1.0))],
        intensity=RestartIntensity(1, 60.0),
    )
    outer = Supervisor(
        "outer",
        [ChildSpec("inner", inner.run, backoff=Backoff(initial=10.0, factor=1.0))],
        intensity=RestartIntensity(1, 60.0),
    )
    with trio.fail_after(60):
        with pytest.raises(SupervisorEscalation) as info:
            await outer.run()
    # inner: runs at 0, 1, escalates at 1; outer restarts it at 11: runs at 11, 12, escalates; outer gives up.
    assert inner_starts == [0.0, 1.0, 11.0, 12.0]
    assert info.value.supervisor == "outer" and info.value.child == "inner"
    assert isinstance(info.value.__cause__, SupervisorEscalation)


async def test_a_fatal_failure_escalates_at_once_other_failures_restart(autojump_clock):
    runs = []

    async def child(*, task_status):
        runs.append(trio.current_time())
        await trio.sleep(1)
        raise (Boom if len(runs) < 2 else KeyError)("broken for good")

    sup = Supervisor(
        "root", [ChildSpec("db", child, backoff=FAST, fatal=(KeyError,))], intensity=RestartIntensity(5, 60.0)
    )
    with trio.fail_after(60):
        with pytest.raises(SupervisorEscalation) as info:
            await sup.run()
    # Boom at 1 → restarted at 2; KeyError at 3 → no restart, no backoff.
    assert runs == [0.0, 2.0] and trio.current_time() == 3.0
    assert info.value.fatal and isinstance(info.value.__cause__, KeyError)
    assert "a restart cannot fix" in str(info.value)
