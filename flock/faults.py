"""Typed failures, raised by the layer that detects them (ipam, netlink, store,
pods) and turned into CNI error codes in one table at the CNI boundary
(:mod:`flock.pods._cni_codes`).  None of them carries a code.

Standard library only, with no flock imports: every layer can raise these
without depending on the layers above it.
"""

from __future__ import annotations


class Fault(Exception):
    """Base: ``msg`` is short and stable, ``details`` names the field and the value."""

    def __init__(self, msg: str, details: str = "") -> None:
        super().__init__(msg, details)
        self.msg = msg
        self.details = details

    def __str__(self) -> str:
        return f"{self.msg}: {self.details}" if self.details else self.msg


class NetnsUnusable(Fault):
    """The pod's network namespace is missing or is not one flock may use."""


class IfNameTaken(Fault):
    """The pod's namespace already has an interface of that name that flock did not make."""


class KernelRefused(Fault):
    """A netlink or sysctl operation failed (the kernel said no, or could not be read)."""


class AllocationUnusable(Fault):
    """An allocation the dataplane cannot realise (a field it cannot plan)."""


class NodeUnprepared(Fault):
    """The node lacks what pods need from it (a route to the pod gateway, the uplink)."""


class StoreUnavailable(Fault):
    """The allocation database cannot be used."""


class PolicyNotEnforceable(Fault):
    """nftables refuses this node's NetworkPolicy ruleset: a pod is not started unprotected."""
