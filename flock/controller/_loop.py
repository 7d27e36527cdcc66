"""The LoadBalancer controller's loop: reconcile, read again after a 409, resync on a period."""

from __future__ import annotations

import logging
from typing import Protocol

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
        while (done := await counted_pass(self, self.api)) is not None:
            if done:
                await trio.sleep(self.resync_seconds)


class Counted(Protocol):
    """A controller whose passes :func:`counted_pass` runs and counts."""

    fence: Fence
    identity: str
    error_retry_seconds: float
    passes: int
    conflicts: int
    failures: int
    last_plan: Plan | None


async def counted_pass(owner: Counted, api: ObjectApi) -> bool | None:
    """One :func:`reconcile` pass over *api*, counted on *owner*: True when it completed; False when it
    met a newer object or the API failed (after a pause: try again); None when fenced off (stop)."""
    try:
        owner.last_plan = await reconcile(api, owner.fence, owner.identity)
        owner.passes += 1
        return True
    except Stale:
        owner.conflicts += 1
        log.info("a write met a newer object: planning again")
        await trio.sleep(STALE_RETRY_SECONDS)
    except Fenced:
        log.warning("no longer holding the lease: stopping writes")
        return None
    except (ApiRefused, OSError) as exc:
        owner.failures += 1
        log.warning("reconcile failed", extra={"error": str(exc)[:300]})
        await trio.sleep(owner.error_retry_seconds)
    return False
