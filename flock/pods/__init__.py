"""Pod lifecycle: the ADD/DEL/CHECK/STATUS/GC handler and the agent's start-up sequence."""

from flock.pods._args import PodRef, pod_ref
from flock.pods._crash import ENV as CRASH_POINT_ENV
from flock.pods._crash import POINTS as CRASH_POINTS
from flock.pods._crash import CrashPoint
from flock.pods._handler import ADD_DEADLINE_S, CHECK_FAILED, POD_LOOKUP_DEADLINE_S, VALID_ATTACHMENTS, PodHandler
from flock.pods._locks import KeyedLocks
from flock.pods._ports import AllocationStore, Dataplane, PodLookup
from flock.pods._result import cni_result, prev_result_addresses, result_addresses
from flock.pods._startup import NODECONFIG_WAIT_S, NodeConfigs, PodService
from flock.rpc import PENDING_DELETES  # the shim's journal of DELs, replayed at start-up

__all__ = [
    "ADD_DEADLINE_S",
    "CHECK_FAILED",
    "CRASH_POINTS",
    "CRASH_POINT_ENV",
    "NODECONFIG_WAIT_S",
    "PENDING_DELETES",
    "POD_LOOKUP_DEADLINE_S",
    "VALID_ATTACHMENTS",
    "AllocationStore",
    "CrashPoint",
    "Dataplane",
    "KeyedLocks",
    "NodeConfigs",
    "PodHandler",
    "PodLookup",
    "PodRef",
    "PodService",
    "cni_result",
    "pod_ref",
    "prev_result_addresses",
    "result_addresses",
]
