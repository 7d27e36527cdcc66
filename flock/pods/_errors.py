"""Typed failures of pod operations.  They carry no CNI code: the one table in
:mod:`flock.pods._cni_codes` chooses it at the CNI boundary."""

from __future__ import annotations

from flock.faults import Fault


class PodOperationError(Fault):
    """Base of what the pod handler itself refuses."""


class NotReady(PodOperationError):
    """ADD cannot be served yet (start-up unfinished, NodeConfig missing); retry later."""


class Unavailable(PodOperationError):
    """STATUS: the plugin cannot serve ADD now (not ready, or the node's pool is exhausted)."""


class AddTimedOut(PodOperationError):
    """The whole ADD ran past its deadline; the allocation stays pending."""


class PodNotFound(PodOperationError):
    """The API server has no such pod (yet), or it is another pod of that name."""


class PodLookupFailed(PodOperationError):
    """The API server could not be asked about the pod (unreachable, no answer, no watcher)."""


class InvalidCniArgs(PodOperationError):
    """CNI_ARGS does not name a Kubernetes pod."""


class ContainerInUse(PodOperationError):
    """The container ID already has an allocation for another pod, interface or netns."""


class UnknownContainer(PodOperationError):
    """CHECK of a container flock holds no allocation for."""


class CheckFailed(PodOperationError):
    """CHECK found the pod's network differs from what ADD made."""


class InvalidNetworkConfig(PodOperationError):
    """A field of the network configuration (prevResult, valid-attachments) is missing or malformed."""


class HostPortInUse(PodOperationError):
    """ADD's portMappings ask for a hostIP:hostPort/protocol another container on the node holds."""
