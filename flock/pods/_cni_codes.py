"""The one place CNI error codes are chosen: typed domain errors → CNI error objects.

The pod handler's dispatch (the CNI boundary) turns whatever an operation
raised into a :class:`flock.errors.CniError` here, from the typed errors of
:mod:`flock.faults`, :mod:`flock.ipam` and :mod:`flock.pods`.  An error
already carrying a code (the wire format's own checks, such as cniVersion)
keeps it.  Anything else is a bug: it is not in this table and becomes code
100 in the RPC server.
"""

from __future__ import annotations

from flock import errors
from flock.faults import (
    AllocationUnusable,
    Fault,
    IfNameTaken,
    KernelRefused,
    NetnsUnusable,
    NodeUnprepared,
    PolicyNotEnforceable,
    StoreUnavailable,
)
from flock.ipam import AddressConflict, AnnotationError, PoolExhausted

from ._errors import (
    AddTimedOut,
    CheckFailed,
    ContainerInUse,
    HostPortInUse,
    InvalidCniArgs,
    InvalidNetworkConfig,
    NotReady,
    PodLookupFailed,
    PodNotFound,
    Unavailable,
    UnknownContainer,
)

# flock's own code: CHECK found the pod's network differs from what ADD made.
CHECK_FAILED = 120
# flock's own code for "no free address": not 11 (retrying the same ADD
# cannot help until some pod goes away), not 50 (that claims the plugin as a
# whole cannot serve ADD, which STATUS reports for the node block; a full
# annotation sub-range leaves other pods unaffected), and not 7 (nothing in
# the pod's configuration is wrong).  A code of its own lets operators and
# metrics tell a full pool from a bad annotation.
ADDRESS_EXHAUSTED = 110
# flock's own code for "another pod on this node holds that hostIP:hostPort/protocol": nothing in
# this pod's configuration is malformed (not 7), and only the other pod's going frees it.
HOST_PORT_IN_USE = 111

CNI_CODES: tuple[tuple[type[Fault], int], ...] = (
    (NotReady, errors.TRY_AGAIN_LATER),
    (AddTimedOut, errors.TRY_AGAIN_LATER),
    (PodNotFound, errors.TRY_AGAIN_LATER),
    (PodLookupFailed, errors.TRY_AGAIN_LATER),
    (Unavailable, errors.NOT_AVAILABLE),
    (InvalidCniArgs, errors.INVALID_ENV),
    (ContainerInUse, errors.INVALID_ENV),
    (UnknownContainer, errors.UNKNOWN_CONTAINER),
    (InvalidNetworkConfig, errors.INVALID_CONFIG),
    (AnnotationError, errors.INVALID_CONFIG),
    (CheckFailed, CHECK_FAILED),
    (PoolExhausted, ADDRESS_EXHAUSTED),
    (HostPortInUse, HOST_PORT_IN_USE),
    (AddressConflict, errors.INTERNAL),
    (NetnsUnusable, errors.INVALID_ENV),
    (IfNameTaken, errors.INVALID_ENV),
    (AllocationUnusable, errors.INVALID_CONFIG),
    (NodeUnprepared, errors.INVALID_CONFIG),
    (PolicyNotEnforceable, errors.TRY_AGAIN_LATER),
    (KernelRefused, errors.IO_ERROR),
    (StoreUnavailable, errors.IO_ERROR),
)


def cni_error(exc: Exception) -> errors.CniError | None:
    """The CNI error for *exc*, or None when it is not a known failure (a bug)."""
    if isinstance(exc, errors.CniError):
        return exc
    for kind, code in CNI_CODES:
        if isinstance(exc, kind):
            return errors.CniError(code, exc.msg, exc.details)
    return None
