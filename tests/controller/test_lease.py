"""Leader election in virtual time (autojump_clock), against the API server's real store (resourceVersion
checked as over HTTP): the pure decision, takeover within 15 s of the leader's death, hand-over on a clean
exit, renewals refused by 409s."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio

from flock.apiserver import LEASES, LOADBALANCERPOOLS, NAMESPACES, SERVICES, ObjectStore, Resource, StatusError
from flock.controller import Elector, Kind, LeaseSettings, Take, WaitUntil, decide
from flock.controller._api import LEASES as LEASES_KIND
from flock.controller._api import NAMESPACES as NAMESPACES_KIND
from flock.controller._api import POOLS, Conflict, NotFound
from flock.controller._api import SERVICES as SERVICES_KIND

_RESOURCES: dict[Kind, Resource] = {
    LEASES_KIND: LEASES,
    POOLS: LOADBALANCERPOOLS,
    SERVICES_KIND: SERVICES,
    NAMESPACES_KIND: NAMESPACES,
}


@attrs.define(eq=False)
class StoreApi:
    """The API server's store in this thread (no HTTP, so virtual time holds); *dead*: every call fails
    as to a crashed process's peer; *conflicts*: that many lease writes refused with 409 first."""

    store: ObjectStore
    dead: bool = False
    conflicts: int = 0

    def _check(self) -> None:
        if self.dead:
            raise OSError("connection refused")

    def _wrap(self, call: Any, *args: Any, **kw: Any) -> dict[str, Any]:
        self._check()
        try:
            answer: dict[str, Any] = call(*args, **kw)
        except StatusError as e:
            error = {409: Conflict, 404: NotFound}.get(e.code)
            if error is None:
                raise
            raise error("call", "-", e.code, str(e)) from None
        return answer

    async def list(self, kind: Kind) -> list[dict[str, Any]]:
        self._check()
        return self.store.list(_RESOURCES[kind])[0]

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self._wrap(self.store.get, _RESOURCES[kind], name, namespace)

    async def create(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        return self._wrap(self.store.create, _RESOURCES[kind], obj, obj["metadata"].get("namespace"))

    async def replace(self, kind: Kind, obj: dict[str, Any], *, status: bool = False) -> dict[str, Any]:
        self._check()
        if self.conflicts:
            self.conflicts -= 1
            raise Conflict("PUT", "-", 409, "injected")
        meta = obj["metadata"]
        if status:
            return self._wrap(
                self.store.set_status,
                _RESOURCES[kind],
                meta["name"],
                obj.get("status"),
                meta.get("namespace"),
                meta.get("resourceVersion"),
            )
        return self._wrap(self.store.update, _RESOURCES[kind], obj, meta.get("namespace"))


def test_decide() -> None:
    assert decide(None, "a", 0.0, 10.0, 1.0) == Take()
    assert decide("", "a", 0.0, 10.0, 1.0) == Take()
    assert decide("a", "a", 0.0, 10.0, 1.0) == Take()
    assert decide("b", "a", 3.0, 10.0, 5.0) == WaitUntil(13.0)
    assert decide("b", "a", 3.0, 10.0, 13.0) == Take()


def test_settings_follow_client_gos_rule() -> None:
    LeaseSettings(lease_seconds=10, renew_seconds=7, retry_seconds=2)
    with pytest.raises(ValueError, match="lease"):
        LeaseSettings(lease_seconds=10, renew_seconds=10, retry_seconds=2)
    with pytest.raises(ValueError, match="retry"):
        LeaseSettings(lease_seconds=10, renew_seconds=2, retry_seconds=2)


@attrs.define(eq=False)
class Work:
    """What a leader runs: records when it started and when it was cancelled."""

    started: list[float] = attrs.Factory(list)
    stopped: list[float] = attrs.Factory(list)
    leading: trio.Event = attrs.Factory(trio.Event)

    async def __call__(self) -> None:
        self.started.append(trio.current_time())
        self.leading.set()
        try:
            await trio.sleep_forever()
        finally:
            self.stopped.append(trio.current_time())


def _store() -> ObjectStore:
    store = ObjectStore()
    store.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}})
    return store


async def test_takeover_within_15_s_of_the_leaders_death(autojump_clock: trio.testing.MockClock) -> None:
    store = _store()
    api_a, api_b = StoreApi(store), StoreApi(store)
    work_a, work_b = Work(), Work()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            a_scope = trio.CancelScope()

            async def run_a() -> None:
                with a_scope:
                    await Elector(api_a, "a").run(work_a)

            nursery.start_soon(run_a)
            await trio.sleep(0.5)
            nursery.start_soon(Elector(api_b, "b").run, work_b)
            await trio.sleep(4.5)
            assert work_a.started == [0.0] and work_b.started == []
            api_a.dead = True  # the process dies: no more writes, not even a release
            a_scope.cancel()
            death = trio.current_time()
            await work_b.leading.wait()
            assert work_b.started[0] - death <= 15.0
            # A renewed at t=4, B saw that at 4.5 and may take over 10 s later.
            assert work_b.started == [pytest.approx(14.5)]
            lease = store.get(LEASES, "flock-controller", "kube-system")
            assert lease["spec"]["holderIdentity"] == "b"
            assert lease["spec"]["leaseTransitions"] == 1
            nursery.cancel_scope.cancel()


async def test_a_clean_exit_hands_over_at_once(autojump_clock: trio.testing.MockClock) -> None:
    store = _store()
    work_a, work_b = Work(), Work()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            a_scope = trio.CancelScope()

            async def run_a() -> None:
                with a_scope:
                    await Elector(StoreApi(store), "a").run(work_a)

            nursery.start_soon(run_a)
            await trio.sleep(0.5)
            nursery.start_soon(Elector(StoreApi(store), "b").run, work_b)
            await trio.sleep(4.5)
            a_scope.cancel()  # SIGTERM: the lease is given up
            await work_b.leading.wait()
            assert work_b.started[0] - 5.0 <= 2.0  # B's next look
            nursery.cancel_scope.cancel()


async def test_renewals_refused_past_the_deadline_stop_the_work(autojump_clock: trio.testing.MockClock) -> None:
    store = _store()
    api = StoreApi(store)
    work = Work()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(Elector(api, "a").run, work)
            await trio.sleep(1.0)
            api.conflicts = 3  # renewals at 2, 4, 6 refused; 8 succeeds: still leading
            await trio.sleep(8.0)
            assert work.started == [0.0] and work.stopped == []
            api.conflicts = 100  # every renewal from t=10 on refused
            await trio.sleep(20.0)
            assert work.stopped, "the work must stop once no renewal succeeded for the renew deadline"
            # Renewed last at t=8; the next renewal starts at 10 and is given up 7 s later.
            assert work.stopped[0] == pytest.approx(17.0)
            assert work.stopped[0] < 8.0 + 10.0  # before anyone else may take over
            nursery.cancel_scope.cancel()
