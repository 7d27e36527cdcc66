"""Supervision: child specs with restart policies, backoff, restart intensity, escalation."""

from flock.nursery._policy import Backoff, ChildSpec, Restart, RestartIntensity
from flock.nursery._supervisor import Supervisor, SupervisorEscalation

__all__ = ["Backoff", "ChildSpec", "Restart", "RestartIntensity", "Supervisor", "SupervisorEscalation"]
