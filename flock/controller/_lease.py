"""Leader election with a coordination.k8s.io/v1 Lease, client-go's way, in Trio.

:func:`decide` is the pure part: may *me* take the lease now, or when to look
again. A holder's lease runs out ``lease_seconds`` after the record last
*changed as this candidate saw it* (its own clock, never the record's
timestamps: clocks of different machines differ), so a writer dead at t is
replaced by t + lease_seconds + retry_seconds at the latest (10 + 2 = 12 s,
under the 15 s asked for).

:class:`Elector` runs the work while it holds the lease: it takes the lease
with a write guarded by resourceVersion, renews every ``retry_seconds``, and
cancels the work when no renewal succeeded for ``renew_seconds`` (before
another candidate may take over). :meth:`Elector.confirm` renews on demand: a
writer calls it before each write, so that a writer that lost the lease (or was
paused) writes nothing (see :mod:`._reconcile`). On the way out it gives the
lease up (holder emptied) in a shielded scope, so that a rolling update hands
over at once.

Error handling: API errors while taking or renewing are logged and retried
after ``retry_seconds``; a conflict is a lost race, not an error.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from ._api import LEASES, ApiRefused, Conflict, NotFound, ObjectApi

log = logging.getLogger("flock.controller.lease")


@attrs.frozen
class LeaseSettings:
    """client-go's rule: lease > renew deadline > 1.2 × retry period."""

    namespace: str = "kube-system"
    name: str = "flock-controller"
    lease_seconds: float = 10.0
    renew_seconds: float = 7.0
    retry_seconds: float = 2.0

    def __attrs_post_init__(self) -> None:
        if not self.lease_seconds > self.renew_seconds > 1.2 * self.retry_seconds > 0:
            raise ValueError(
                f"want lease {self.lease_seconds} > renew {self.renew_seconds} > 1.2 x retry {self.retry_seconds}"
            )


@attrs.frozen
class Take:
    """Write the lease now (create it, renew ours, or take over a free or expired one)."""


@attrs.frozen
class WaitUntil:
    """Another holds it; look again at *when* (the candidate's own clock)."""

    when: float


def decide(holder: str | None, me: str, observed_at: float, lease_seconds: float, now: float) -> Take | WaitUntil:
    """*holder*: the record's holderIdentity (None or "": free); *observed_at*: when this candidate
    last saw the record change."""
    if not holder or holder == me:
        return Take()
    expires = observed_at + lease_seconds
    return Take() if now >= expires else WaitUntil(expires)


def _micro_time(at: datetime.datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _wall() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@attrs.define(eq=False)
class Elector:
    api: ObjectApi
    identity: str
    settings: LeaseSettings = attrs.field(factory=LeaseSettings)
    wall: Callable[[], datetime.datetime] = _wall  # the record's times (for people reading it)
    _seen_version: str | None = attrs.field(default=None, init=False)
    _seen_at: float = attrs.field(default=0.0, init=False)
    _renewed_at: float | None = attrs.field(default=None, init=False)  # trio clock of our last write
    _leading: bool = attrs.field(default=False, init=False)
    _answered_at: float | None = attrs.field(default=None, init=False)  # trio clock of the API's last answer

    @property
    def leading(self) -> bool:
        return self._leading

    @property
    def answered_at(self) -> float | None:
        """When the API server last answered a look at the Lease (trio clock); None: never yet."""
        return self._answered_at

    async def run(self, work: Callable[[], Awaitable[None]]) -> None:
        """Take the lease, run *work* while holding it, stand again when it is lost; until cancelled."""
        try:
            while True:
                await self._acquire()
                self._leading = True
                log.info("leading", extra={"identity": self.identity, "lease": self.settings.name})
                async with trio.open_nursery() as nursery:

                    async def keep() -> None:
                        await self._keep()
                        nursery.cancel_scope.cancel()

                    async def lead() -> None:
                        await work()
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(keep)
                    nursery.start_soon(lead)
                self._leading = False
                log.warning("lost the lease", extra={"identity": self.identity, "lease": self.settings.name})
        finally:
            if self._leading:
                self._leading = False
                with trio.move_on_after(2, shield=True):
                    await self._release()

    async def confirm(self) -> bool:
        """Hold the lease now (renew it, or take it if free or expired): True if this candidate
        holds it after this call. A writer asks before each write, whatever it believes."""
        return await self._try()

    async def _acquire(self) -> None:
        while True:
            if await self._try():
                return
            await trio.sleep(self.settings.retry_seconds)

    async def _keep(self) -> None:
        """Renew every retry period; return when none succeeded for the renew deadline."""
        while True:
            await trio.sleep(self.settings.retry_seconds)
            if not await self._renew_within_deadline():
                return

    async def _renew_within_deadline(self) -> bool:
        with trio.move_on_after(self.settings.renew_seconds):
            while True:
                if await self._try():
                    return True
                await trio.sleep(self.settings.retry_seconds)
        return False

    async def _try(self) -> bool:
        s = self.settings
        now = trio.current_time()
        try:
            try:
                lease = await self.api.get(LEASES, s.name, s.namespace)
            except NotFound:
                self._answered_at = now
                await self.api.create(LEASES, self._record(None))
                self._mark_written(now)
                return True
            self._answered_at = now
            version = str(lease["metadata"].get("resourceVersion"))
            if version != self._seen_version:
                self._seen_version, self._seen_at = version, now
            spec = lease.get("spec") or {}
            verdict = decide(spec.get("holderIdentity"), self.identity, self._seen_at, s.lease_seconds, now)
            if isinstance(verdict, WaitUntil):
                return False
            written = await self.api.replace(LEASES, self._record(lease))
            self._seen_version = str(written["metadata"].get("resourceVersion"))
            self._mark_written(now)
            return True
        except Conflict:
            return False  # another candidate wrote first
        except (ApiRefused, OSError) as e:
            log.warning("lease write failed", extra={"identity": self.identity, "error": str(e)})
            return False

    def _mark_written(self, now: float) -> None:
        self._seen_at = now
        self._renewed_at = now

    def _record(self, old: dict[str, Any] | None) -> dict[str, Any]:
        s = self.settings
        now = _micro_time(self.wall())
        spec = dict((old or {}).get("spec") or {})
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if old is not None else 0)
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=int(s.lease_seconds), renewTime=now)
        meta = {"name": s.name, "namespace": s.namespace}
        if old is not None:
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    async def _release(self) -> None:
        s = self.settings
        try:
            lease = await self.api.get(LEASES, s.name, s.namespace)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"]["holderIdentity"] = ""
            await self.api.replace(LEASES, lease)
            log.info("released the lease", extra={"identity": self.identity, "lease": s.name})
        except (ApiRefused, OSError) as e:
            log.warning("lease release failed", extra={"identity": self.identity, "error": str(e)})
