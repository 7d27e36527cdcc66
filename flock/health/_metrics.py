"""flock-agent's metrics through prometheus-client, in a registry of their own.

:class:`Metrics` owns a :class:`prometheus_client.CollectorRegistry` (never
the library's global default one, so two agents in one test process or a
library that registers its own metrics cannot collide), with the library's
process and platform collectors, the CNI request counter and latency
histogram, and whatever gauges the composition root registers (read when
scraped, from their owners).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import attrs
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Seconds; an ADD is milliseconds normally, up to the 25 s deadline at worst.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0)
# Seconds, for one stage of a request (a store commit, a netlink step): tenths of a millisecond and up.
STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


@attrs.frozen
class _CounterFunction(Collector):
    """A counter whose value its owner keeps (read when scraped)."""

    name: str
    documentation: str
    read: Callable[[], float]

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation, value=self.read())


@attrs.frozen
class _LabelledGaugeFunction(Collector):
    """A gauge whose label values are known only when scraped (e.g. BGP peers)."""

    name: str
    documentation: str
    label: str
    read: Callable[[], Mapping[str, float]]

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, number in sorted(self.read().items()):
            family.add_metric([value], number)
        yield family


@attrs.define(eq=False)
class Metrics:
    """Request counts and latencies by op, plus gauges and counters read when scraped."""

    registry: CollectorRegistry = attrs.field(init=False, factory=lambda: CollectorRegistry(auto_describe=True))
    _requests: Counter = attrs.field(init=False)
    _latency: Histogram = attrs.field(init=False)
    _stages: Histogram = attrs.field(init=False)
    # Label children by label values: ``labels()`` validates and locks on every call (several per request).
    _children: dict[tuple[str, int], tuple[Counter, Histogram]] = attrs.field(init=False, factory=dict)
    _stage_children: dict[tuple[str, str], Histogram] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self._requests = Counter(
            "flock_cni_requests",
            "CNI requests served by flock-agent, by op and result code (0: success).",
            ["op", "code"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "flock_cni_request_duration_seconds",
            "Time flock-agent took to answer a CNI request.",
            ["op"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._stages = Histogram(
            "flock_cni_stage_duration_seconds",
            "Time flock-agent spent in one stage of a CNI request (pod lookup, ipam, store, netlink, ...).",
            ["op", "stage"],
            buckets=STAGE_BUCKETS,
            registry=self.registry,
        )

    def observe(self, op: str, code: int, seconds: float) -> None:
        """One request served: *code* 0 for success, else the CNI error code."""
        children = self._children.get((op, code))
        if children is None:
            children = self._children[(op, code)] = (
                self._requests.labels(op=op, code=str(code)),
                self._latency.labels(op=op),
            )
        children[0].inc()
        children[1].observe(max(0.0, seconds))

    def stage(self, op: str, stage: str, seconds: float) -> None:
        """One stage of an *op* request took *seconds* (see :class:`flock.pods.PodHandler`)."""
        child = self._stage_children.get((op, stage))
        if child is None:
            child = self._stage_children[(op, stage)] = self._stages.labels(op=op, stage=stage)
        child.observe(max(0.0, seconds))

    def requests(self, op: str, code: int = 0) -> int:
        value = self.registry.get_sample_value("flock_cni_requests_total", {"op": op, "code": str(code)})
        return int(value or 0)

    def gauge(self, name: str, documentation: str, read: Callable[[], float]) -> None:
        """Export ``read()`` as gauge *name*, read at each scrape."""
        Gauge(name, documentation, registry=self.registry).set_function(read)

    def labelled_gauge(
        self, name: str, documentation: str, label: str, values: Sequence[str], read: Callable[[], Mapping[str, float]]
    ) -> None:
        """Export ``read()[value]`` as gauge *name* with ``label=value`` for each of *values*."""
        gauge = Gauge(name, documentation, [label], registry=self.registry)

        def reader(value: str) -> Callable[[], float]:
            return lambda: read().get(value, 0.0)

        for value in values:
            gauge.labels(value).set_function(reader(value))

    def dynamic_gauge(self, name: str, documentation: str, label: str, read: Callable[[], Mapping[str, float]]) -> None:
        """Export ``read()`` (label value → number) as gauge *name*, labels as they are when scraped."""
        self.registry.register(_LabelledGaugeFunction(name, documentation, label, read))

    def counter(self, name: str, documentation: str, read: Callable[[], float]) -> None:
        """Export ``read()`` as counter *name* (``_total`` is appended), its owner keeping the count."""
        self.registry.register(_CounterFunction(name, documentation, read))

    def exposition(self) -> bytes:
        """The Prometheus text format of everything registered (see :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)
