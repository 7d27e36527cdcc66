"""flock-controller's /healthz, /readyz and /metrics (the agent's :class:`flock.health.HealthServer`).

``/healthz`` answers while the Trio loop runs (the server is part of it); ``/readyz`` is 200 once the
API server answered a look at the Lease within :data:`STALE_ANSWER_S` — the writer and the standby
alike (the standby is ready to take over; it is not a Service backend) — noting which one it is.

The listeners are one per address family (``::`` and ``0.0.0.0``: the kubelet probes the pod's
primary address, of either family); a family the pod lacks is skipped.
"""

from __future__ import annotations

import errno
import logging

import attrs
import trio

from flock.health import HealthServer, Metrics

from ._lease import Elector
from ._metrics import ControllerCollector, GroupProgress, Progress

log = logging.getLogger("flock.controller")

# A replica that has not heard from the API server for this long is not ready (renewals every 2 s).
STALE_ANSWER_S = 30.0
ALL_FAMILIES = ("::", "0.0.0.0")  # probes and scrapes come to the pod's address


@attrs.frozen
class ControllerReadiness:
    elector: Elector

    def not_ready(self) -> list[str]:
        answered = self.elector.answered_at
        if answered is None:
            return ["the API server has not answered yet"]
        ago = trio.current_time() - answered
        if ago > STALE_ANSWER_S:
            return [f"the API server last answered {ago:.0f} s ago"]
        return []

    def notes(self) -> list[str]:
        return ["leading: this replica writes"] if self.elector.leading else ["standing by: another replica writes"]


def controller_metrics(progress: Progress, elector: Elector, groups: GroupProgress | None = None) -> Metrics:
    metrics = Metrics()
    metrics.registry.register(ControllerCollector(progress, lambda: elector.leading, groups))
    return metrics


async def serve_health(
    port: int,
    elector: Elector,
    progress: Progress,
    hosts: tuple[str, ...] = ALL_FAMILIES,
    *,
    groups: GroupProgress | None = None,
    task_status: trio.TaskStatus[list[HealthServer]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve on *port* at each of *hosts* that binds; started() with the servers (their bound ports).
    Error handling: no host binding at all propagates (the port is taken: the pod must not run blind)."""
    readiness, metrics = ControllerReadiness(elector), controller_metrics(progress, elector, groups)
    async with trio.open_nursery() as nursery:
        servers: list[HealthServer] = []
        skipped: list[OSError] = []
        for host in hosts:
            server = HealthServer(host, port, readiness, metrics)
            try:
                await nursery.start(server.run)
            except OSError as exc:
                if exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                    raise
                log.info("health listener skipped", extra={"address": f"{host}:{port}", "error": str(exc)})
                skipped.append(exc)
                continue
            servers.append(server)
        if not servers:
            raise skipped[-1]
        task_status.started(servers)
