"""The pure values a supervisor decides with: restart policy, backoff, restart intensity."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Any

import attrs


class Restart(enum.Enum):
    """When a child is restarted (Erlang/OTP's terms)."""

    PERMANENT = "permanent"  # always: after a crash and after a normal return
    TRANSIENT = "transient"  # after a crash only; a normal return means done
    TEMPORARY = "temporary"  # never; a crash after readiness is logged and dropped


def _non_negative(_inst: object, attr: attrs.Attribute, value: float) -> None:
    if value < 0:
        raise ValueError(f"{attr.name}={value!r}: expected >= 0")


@attrs.frozen
class Backoff:
    """Exponential delay before retry *attempt* (0-based: 0 is the first retry).

    ``base(n) = min(cap, initial * factor**n)``.  With ``jitter`` (a fraction)
    the delay is spread over ``base ± jitter·base`` by a draw ``u`` in [0, 1)
    that the caller supplies, so the function stays pure and tests choose their
    randomness: ``base * (1 - jitter + 2·jitter·u)``.  The middle draw
    (``u = 0.5``, the default) gives exactly ``base``, so the mean delay does
    not depend on the jitter.  ``reset_after``: a run that lasted this long
    resets *n* to 0 (the supervisor's rule; retry loops that see progress
    directly reset on it instead).

    The one backoff of flock: the supervisor's restarts, the BIRD reloader's
    and the informers' retries all use it.
    """

    initial: float = attrs.field(default=0.5, validator=_non_negative)
    factor: float = attrs.field(default=2.0, validator=_non_negative)
    cap: float = attrs.field(default=30.0, validator=_non_negative)
    jitter: float = attrs.field(default=0.0, validator=[_non_negative, attrs.validators.le(1.0)])
    reset_after: float = attrs.field(default=60.0, validator=_non_negative)

    def delay(self, attempt: int, u: float = 0.5) -> float:
        # Past ~64 doublings every sane cap is reached; avoids float overflow.
        base = min(self.cap, self.initial * self.factor ** min(attempt, 64))
        return base * (1.0 - self.jitter + 2.0 * self.jitter * u)


@attrs.frozen
class RestartIntensity:
    """At most ``max_restarts`` restarts within any ``period`` seconds."""

    max_restarts: int = attrs.field(default=5, validator=attrs.validators.ge(0))
    period: float = attrs.field(default=60.0, validator=_non_negative)

    def admit(self, history: tuple[float, ...], now: float) -> tuple[float, ...] | None:
        """The restart times to keep if a restart at *now* is allowed, else None (escalate)."""
        recent = (*(t for t in history if t > now - self.period), now)
        return recent if len(recent) <= self.max_restarts else None


@attrs.frozen
class ChildSpec:
    """One supervised service: ``fn(task_status=...)`` runs it, calling
    ``task_status.started()`` once it really serves."""

    name: str
    fn: Callable[..., Awaitable[Any]]
    restart: Restart = Restart.PERMANENT
    backoff: Backoff = Backoff()
    # Failures a restart cannot fix (a corrupt database, another agent on the
    # socket): escalate at once instead of hiding them behind restarts.
    fatal: tuple[type[Exception], ...] = ()
