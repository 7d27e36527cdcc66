"""Pod lifecycle: the ADD/DEL/CHECK/STATUS/GC handler and the node bring-up.

Depends only on the protocols in ``_protocols`` (store, dataplane, pod
lookup), on :class:`flock.state.NodeState` and on pure packages: importing
it needs neither pyroute2 nor kubernetes-asyncio.  CNI error codes are
chosen in one table (``_cni_codes``) from the typed errors in ``_errors``.
"""

from flock.pods._args import PodRef, pod_ref
from flock.pods._bringup import NODECONFIG_WAIT_S, NodeBringUp
from flock.pods._cni_codes import ADDRESS_EXHAUSTED, CHECK_FAILED, CNI_CODES, HOST_PORT_IN_USE, cni_error
from flock.pods._errors import (
    AddTimedOut,
    CheckFailed,
    ContainerInUse,
    HostPortInUse,
    InvalidCniArgs,
    InvalidNetworkConfig,
    NotReady,
    PodLookupFailed,
    PodNotFound,
    PodOperationError,
    Unavailable,
    UnknownContainer,
)
from flock.pods._handler import ADD_DEADLINE_S, ADD_GATE, POD_LOOKUP_DEADLINE_S, VALID_ATTACHMENTS, PodHandler
from flock.pods._locks import KeyedLocks
from flock.pods._ports import MAX_PORT_MAPPINGS, HostPortClaims, port_mappings
from flock.pods._protocols import (
    AllocationStore,
    Checkpoint,
    CleanupReport,
    Dataplane,
    NoCheckpoint,
    NoPolicy,
    PodLookup,
    PolicyGate,
)
from flock.pods._removals import VethRemovals
from flock.pods._result import cni_result, prev_result_addresses, result_addresses
from flock.rpc import PENDING_DELETES  # the shim's journal of DELs, replayed at start-up

__all__ = [
    "ADDRESS_EXHAUSTED",
    "ADD_DEADLINE_S",
    "ADD_GATE",
    "CHECK_FAILED",
    "CNI_CODES",
    "HOST_PORT_IN_USE",
    "MAX_PORT_MAPPINGS",
    "NODECONFIG_WAIT_S",
    "PENDING_DELETES",
    "POD_LOOKUP_DEADLINE_S",
    "VALID_ATTACHMENTS",
    "AddTimedOut",
    "AllocationStore",
    "CheckFailed",
    "Checkpoint",
    "CleanupReport",
    "ContainerInUse",
    "Dataplane",
    "HostPortClaims",
    "HostPortInUse",
    "InvalidCniArgs",
    "InvalidNetworkConfig",
    "KeyedLocks",
    "NoCheckpoint",
    "NoPolicy",
    "NodeBringUp",
    "NotReady",
    "PodHandler",
    "PodLookup",
    "PodLookupFailed",
    "PodNotFound",
    "PodOperationError",
    "PodRef",
    "PolicyGate",
    "Unavailable",
    "UnknownContainer",
    "VethRemovals",
    "cni_error",
    "cni_result",
    "pod_ref",
    "port_mappings",
    "prev_result_addresses",
    "result_addresses",
]
