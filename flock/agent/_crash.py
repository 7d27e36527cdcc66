"""Crash points for the crash tests: SIGKILL the agent at a chosen step of ADD (or of DEL's veth removal).

Off unless ``FLOCK_CRASH_POINT`` names a point; the agent reads it once at
start.  A killed process is what a node power cut or an OOM kill looks like
to the next agent, which is what the crash tests recover from.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping

import attrs

from flock.netlink import STEPS

log = logging.getLogger("flock.agent")

ENV = "FLOCK_CRASH_POINT"
# "before-veth-removal": a DEL has deleted the row and handed the veth to the
# background removal (flock.pods.VethRemovals), which has not started on it.
POINTS = ("before-pending", "after-pending", *(f"setup:{s}" for s in STEPS), "before-commit", "before-veth-removal")


@attrs.frozen
class CrashPoint:
    """Where to die (None: nowhere, the default); a :class:`flock.pods.Checkpoint`."""

    name: str | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.in_(POINTS)))

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> CrashPoint:
        """From ``FLOCK_CRASH_POINT``; ValueError naming the variable for an unknown point."""
        value = environ.get(ENV) or None
        if value is not None and value not in POINTS:
            raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(POINTS)}")
        return cls(value)

    def reached(self, point: str) -> None:
        if point == self.name:
            log.critical("crash point reached: killing the agent", extra={"crash_point": point})
            os.kill(os.getpid(), signal.SIGKILL)

    def setup_fault(self, step: str) -> None:
        """The NetlinkWorker fault hook (runs on a worker thread)."""
        self.reached(f"setup:{step}")
