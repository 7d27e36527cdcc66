"""``flock-lab stream``: short connections, one after another, while something changes (a rolling restart, a
drain): how many were answered, refused or lost, and by whom.

Each connection is a lab probe with the server's answer read (:func:`flock.lab._probe.probe_one` with
``peer``): TCP connects, and the pod that answered names itself.  Connections start every ``1/rate``
seconds whatever the earlier ones do (at most :data:`IN_FLIGHT` at once), so a stall shows up as lost
connections rather than as a slower stream.

- **answered**: connected and the answer came (who served it is counted);
- **refused**: the connection was refused or reset (a REJECT, no endpoint, a RST from a node without
  the flow's conntrack entry) — what a rolling restart done right never shows;
- **lost**: no answer within the probe's 1 s budget (a timeout, or connected but no answer).
"""

from __future__ import annotations

import ipaddress
import time
from collections import Counter
from typing import Any

import attrs
import trio

from flock.lab._plan import LabPlan
from flock.lab._pods import load_pods
from flock.lab._ports import PortSpec
from flock.lab._probe import Endpoint, ProbeResult, endpoint_for, probe_one

IN_FLIGHT = 64


@attrs.frozen
class StreamResult:
    started: int
    answered: int
    refused: int
    lost: int
    served_by: dict[str, int]
    seconds: float
    # the first few refused or lost: (seconds into the stream the connection started, what happened)
    first_failures: tuple[tuple[float, ProbeResult], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "answered": self.answered,
            "refused": self.refused,
            "lost": self.lost,
            "served_by": dict(sorted(self.served_by.items())),
            "seconds": round(self.seconds, 3),
            "first_failures": [
                {"at_s": round(at, 3), "reason": r.reason, "address": r.address} for at, r in self.first_failures
            ],
        }

    def text(self) -> str:
        served = ", ".join(f"{k} {v}" for k, v in sorted(self.served_by.items())) or "nobody"
        return (
            f"{self.started} connections in {self.seconds:.1f} s: {self.answered} answered, "
            f"{self.refused} refused, {self.lost} lost; served by {served}"
        )


def _classify(result: ProbeResult) -> str:
    if result.connected and result.served_by:
        return "answered"
    if result.reason in ("refused", "unreachable"):
        return "refused"
    return "lost"


async def stream_between(
    src: Endpoint, dst: Endpoint, port: PortSpec, family: int, *, rate: float, until: trio.Event | float
) -> StreamResult:
    """Connections from *src* to *dst* at *rate* per second until *until* is set (an Event) or for that
    many seconds (a float)."""
    results: list[tuple[float, ProbeResult]] = []
    limiter = trio.CapacityLimiter(IN_FLIGHT)
    start = time.monotonic()

    async def one() -> None:
        async with limiter:
            at = time.monotonic() - start
            results.append((at, await probe_one(src, dst, port, family, peer=True)))

    deadline = trio.current_time() + until if isinstance(until, float) else None

    def going() -> bool:
        if isinstance(until, trio.Event):
            return not until.is_set()
        return deadline is not None and trio.current_time() < deadline

    async with trio.open_nursery() as nursery:
        tick = trio.current_time()
        while going():
            nursery.start_soon(one)
            tick += 1.0 / rate
            await trio.sleep_until(tick)
    kinds = Counter(_classify(r) for _, r in results)
    served = Counter(r.served_by for _, r in results if _classify(r) == "answered")
    failures = tuple(sorted((at, r) for at, r in results if _classify(r) != "answered"))[:5]
    return StreamResult(
        len(results),
        kinds["answered"],
        kinds["refused"],
        kinds["lost"],
        dict(served),
        time.monotonic() - start,
        failures,
    )


async def stream(
    plan: LabPlan, source: str, target: str, port_text: str, family: int | None, *, seconds: float, rate: float
) -> StreamResult:
    pods = load_pods(plan)
    src = endpoint_for(plan, source, pods, source=True)
    dst = endpoint_for(plan, target, pods, source=False)
    port = PortSpec.parse(port_text, named=False)
    if port.protocol != "TCP":
        raise ValueError(f"{port_text!r}: a stream is of TCP connections")
    if family is None:
        family = ipaddress.ip_address(dst.addresses[0]).version if dst.netns is None else 6
    return await stream_between(src, dst, port, family, rate=rate, until=float(seconds))
