"""flock-lab: a routed multi-node flock cluster in network namespaces on one machine."""

from flock.lab._check import Probe, matrix_text, reachability, summary, wait_anycast_routes
from flock.lab._lifecycle import down, up
from flock.lab._plan import LabPlan, NodePlan
from flock.lab._pods import CniFailure, LabPod, load_pods, pod_add, pod_check, pod_del
from flock.lab._runtime import Attachment, PluginOutcome, exec_conflist, exec_plugin, load_conflist
from flock.lab._state import LabError, LabState, load_state
from flock.lab._status import status, status_text

__all__ = [
    "Attachment",
    "CniFailure",
    "LabError",
    "LabPlan",
    "LabPod",
    "LabState",
    "NodePlan",
    "PluginOutcome",
    "Probe",
    "down",
    "exec_conflist",
    "exec_plugin",
    "load_conflist",
    "load_pods",
    "load_state",
    "matrix_text",
    "pod_add",
    "pod_check",
    "pod_del",
    "reachability",
    "status",
    "status_text",
    "summary",
    "up",
    "wait_anycast_routes",
]
