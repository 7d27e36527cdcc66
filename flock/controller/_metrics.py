"""flock-controller's metrics, read when scraped from their owners (the elector, the controller's
last pass): passes, conflicts and failed passes; whether this replica leads; per pool and family the
used and free addresses and the conflicts; Services by the reason of their load-balancer condition."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Protocol

import attrs
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ._ipam import Plan


class Progress(Protocol):
    """What a controller tells of its passes (:class:`LoadBalancerController`, :class:`WatchingController`)."""

    @property
    def passes(self) -> int: ...

    @property
    def conflicts(self) -> int: ...

    @property
    def failures(self) -> int: ...

    @property
    def last_plan(self) -> Plan | None: ...


class GroupProgress(Protocol):
    """What the address-group loop tells (:class:`flock.controller._groups.GroupController`)."""

    passes: int
    writes: int
    failures: int

    @property
    def members(self) -> int: ...


@attrs.frozen
class ControllerCollector(Collector):
    progress: Progress
    leading: Callable[[], bool]
    groups: GroupProgress | None = None

    def collect(self) -> Iterator[Metric]:
        p = self.progress
        yield CounterMetricFamily("flock_controller_passes", "Reconcile passes completed.", value=p.passes)
        yield CounterMetricFamily(
            "flock_controller_conflicts", "Passes ended by a write meeting a newer object (409).", value=p.conflicts
        )
        yield CounterMetricFamily(
            "flock_controller_failures", "Passes ended by an API refusal or an I/O error.", value=p.failures
        )
        yield GaugeMetricFamily(
            "flock_controller_leader", "1 while this replica holds the Lease and writes.", value=float(self.leading())
        )
        addresses = GaugeMetricFamily(
            "flock_controller_pool_addresses",
            "A pool's addresses by family and state (used, free), as of the last pass.",
            labels=["pool", "family", "state"],
        )
        conflicts = GaugeMetricFamily(
            "flock_controller_pool_conflicts",
            "What a pool's Conflict condition names (overlaps, addresses outside every pool), as of the last pass.",
            labels=["pool"],
        )
        services = GaugeMetricFamily(
            "flock_controller_services",
            "Services of type LoadBalancer flock serves, by their condition's reason, as of the last pass.",
            labels=["reason"],
        )
        plan = p.last_plan
        if plan is not None:
            for name, status in sorted(plan.pools.items()):
                for family, count in sorted(status.counts.items()):
                    addresses.add_metric([name, f"ipv{family}", "used"], float(count.used))
                    addresses.add_metric([name, f"ipv{family}", "free"], float(count.free))
                conflicts.add_metric([name], float(len(status.conflicts)))
            for reason, n in sorted(Counter(a.condition.reason.value for a in plan.services.values()).items()):
                services.add_metric([reason], float(n))
        yield addresses
        yield conflicts
        yield services
        g = self.groups
        if g is not None:
            yield CounterMetricFamily(
                "flock_controller_group_passes", "Address-group passes completed (issue 35).", value=g.passes
            )
            yield CounterMetricFamily(
                "flock_controller_group_writes",
                "AddressGroup and NodeAddressGroups objects written (created, updated, deleted).",
                value=g.writes,
            )
            yield CounterMetricFamily(
                "flock_controller_group_write_failures", "Writes refused or failed (written again).", value=g.failures
            )
            yield GaugeMetricFamily(
                "flock_controller_group_members", "Members of every address group planned.", value=g.members
            )
