"""flock-lab: a routed multi-node flock cluster in network namespaces on one machine."""

from flock.lab._check import Probe, matrix_text, reachability, summary, wait_anycast_routes
from flock.lab._lifecycle import agent_ready, api_client, down, up
from flock.lab._nsio import in_netns, netns_path, run_in
from flock.lab._plan import LabPlan, NodePlan
from flock.lab._pods import CniFailure, LabPod, load_pods, pod_add, pod_check, pod_del
from flock.lab._runtime import CniParams, PluginOutcome, exec_conflist, exec_plugin, load_conflist
from flock.lab._state import LabError, LabState, load_procs, load_state, process_refs
from flock.lab._status import status, status_text

__all__ = [
    "CniFailure",
    "CniParams",
    "LabError",
    "LabPlan",
    "LabPod",
    "LabState",
    "NodePlan",
    "PluginOutcome",
    "Probe",
    "agent_ready",
    "api_client",
    "down",
    "exec_conflist",
    "exec_plugin",
    "in_netns",
    "load_conflist",
    "load_pods",
    "load_procs",
    "load_state",
    "matrix_text",
    "netns_path",
    "pod_add",
    "pod_check",
    "pod_del",
    "process_refs",
    "reachability",
    "run_in",
    "status",
    "status_text",
    "summary",
    "up",
    "wait_anycast_routes",
]
