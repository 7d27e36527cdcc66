"""Prometheus text exposition (format 0.0.4) of the agent's counters."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

# Seconds; an ADD is milliseconds normally, up to the 25 s deadline at worst.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0)


@attrs.define(eq=False)
class _Histogram:
    counts: list[int] = attrs.field(factory=lambda: [0] * len(LATENCY_BUCKETS))
    total: float = 0.0
    n: int = 0

    def add(self, seconds: float) -> None:
        for i, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                self.counts[i] += 1
        self.total += seconds
        self.n += 1


@attrs.define(eq=False)
class Metrics:
    """Request counts and latencies by op, plus gauges read when scraped.

    ``gauges`` maps a metric name to (help, callable returning
    {label-value-tuple-string: value}) — see :meth:`render`.
    """

    _requests: dict[tuple[str, str], int] = attrs.field(init=False, factory=dict)
    _latency: dict[str, _Histogram] = attrs.field(init=False, factory=dict)
    gauges: dict[str, tuple[str, str, Callable[[], Mapping[str, float]]]] = attrs.field(init=False, factory=dict)

    def observe(self, op: str, code: int, seconds: float) -> None:
        """One request served: *code* 0 for success, else the CNI error code."""
        key = (op, str(code))
        self._requests[key] = self._requests.get(key, 0) + 1
        self._latency.setdefault(op, _Histogram()).add(max(0.0, seconds))

    def requests(self, op: str, code: int = 0) -> int:
        return self._requests.get((op, str(code)), 0)

    def gauge(self, name: str, help_text: str, kind: str, read: Callable[[], Mapping[str, float]]) -> None:
        """Export *read()* as *name*; its keys are label sets already rendered
        (``state="committed"``) or ``""`` for none.  *kind* is gauge or counter."""
        self.gauges[name] = (help_text, kind, read)

    def render(self) -> str:
        out = [
            "# HELP flock_cni_requests_total CNI requests served by flock-agent, by op and result code (0: success).",
            "# TYPE flock_cni_requests_total counter",
        ]
        for (op, code), n in sorted(self._requests.items()):
            out.append(f'flock_cni_requests_total{{op="{op}",code="{code}"}} {n}')
        out += [
            "# HELP flock_cni_request_duration_seconds Time flock-agent took to answer a CNI request.",
            "# TYPE flock_cni_request_duration_seconds histogram",
        ]
        for op, h in sorted(self._latency.items()):
            for bound, count in zip(LATENCY_BUCKETS, h.counts):
                out.append(f'flock_cni_request_duration_seconds_bucket{{op="{op}",le="{bound:g}"}} {count}')
            out.append(f'flock_cni_request_duration_seconds_bucket{{op="{op}",le="+Inf"}} {h.n}')
            out.append(f'flock_cni_request_duration_seconds_sum{{op="{op}"}} {h.total:.6f}')
            out.append(f'flock_cni_request_duration_seconds_count{{op="{op}"}} {h.n}')
        for name, (help_text, kind, read) in sorted(self.gauges.items()):
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            for labels, value in sorted(read().items()):
                out.append(f"{name}{{{labels}}} {value:g}" if labels else f"{name} {value:g}")
        return "\n".join(out) + "\n"
