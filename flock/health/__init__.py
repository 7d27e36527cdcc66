"""flock-agent's health endpoints and metrics (prometheus-client, a registry of its own)."""

from flock.health._metrics import CONTENT_TYPE, LATENCY_BUCKETS, Metrics
from flock.health._server import HealthServer, Readiness

__all__ = ["CONTENT_TYPE", "LATENCY_BUCKETS", "HealthServer", "Metrics", "Readiness"]
