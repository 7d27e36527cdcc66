"""The LoadBalancer controller's loop: reconcile, read again after a 409, resync on a period."""

from __future__ import annotations

import logging

import attrs
import trio

from ._api import ApiRefused, ObjectApi
from ._ipam import Plan
from ._reconcile import Fence, Fenced, Stale, reconcile

log = logging.getLogger("flock.controller.ipam")

# How soon a pass runs again after a 409 (another writer moved): at once, but never in a tight loop.
STALE_RETRY_SECONDS = 0.05


@attrs.define(eq=False)
class LoadBalancerController:
    """Runs while its elector leads (the elector's *work*); returns when fenced off."""

    api: ObjectApi
    fence: Fence
    resync_seconds: float = 1.0
    error_retry_seconds: float = 2.0
    identity: str = "flock-controller"  # the Events' reportingInstance
    passes: int = attrs.field(default=0, init=False)
    conflicts: int = attrs.field(default=0, init=False)
    failures: int = attrs.field(default=0, init=False)
    last_plan: Plan | None = attrs.field(default=None, init=False)  # what the last complete pass planned

    async def run(self) -> None:
        while True:
            try:
                self.last_plan = await reconcile(self.api, self.fence, self.identity)
                self.passes += 1
            except Stale:
                self.conflicts += 1
                log.info("a write met a newer object: reading again")
                await trio.sleep(STALE_RETRY_SECONDS)
                continue
            except Fenced:
                log.warning("no longer holding the lease: stopping writes")
                return
            except (ApiRefused, OSError) as e:
                self.failures += 1
                log.warning("reconcile failed", extra={"error": str(e)})
                await trio.sleep(self.error_retry_seconds)
                continue
            await trio.sleep(self.resync_seconds)
