"""flock-agent's health endpoints and metrics."""

from flock.health._metrics import LATENCY_BUCKETS, Metrics
from flock.health._server import HealthServer

__all__ = ["LATENCY_BUCKETS", "HealthServer", "Metrics"]
