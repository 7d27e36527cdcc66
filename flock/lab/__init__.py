"""flock-lab: a routed multi-node flock cluster in network namespaces on one machine."""

from flock.lab._check import Probe, matrix_text, reachability, summary, wait_anycast_routes
from flock.lab._fabric import RestartDrill, birdc, established, fabric_has, graceful_restart_under_ping
from flock.lab._lifecycle import agent_ready, api_client, down, up
from flock.lab._nsio import in_netns, netns_path, run_in, socket_in
from flock.lab._plan import LabPlan, NodePlan
from flock.lab._pods import CniFailure, LabPod, finish_pod, load_pods, pod_add, pod_check, pod_del, pod_label, pod_ready
from flock.lab._policy import apply_objects, delete, ns_add, ns_label, server_version, wait_applied
from flock.lab._ports import PortSpec
from flock.lab._probe import Endpoint, ProbeResult, matrix, probe_all, probe_one
from flock.lab._routes import FabricPath, FabricRoute, fabric_routes, parse_routes
from flock.lab._runtime import CniParams, PluginOutcome, exec_conflist, exec_plugin, load_conflist
from flock.lab._state import LabError, LabState, load_procs, load_state, process_refs
from flock.lab._status import status, status_text

__all__ = [
    "CniFailure",
    "CniParams",
    "Endpoint",
    "FabricPath",
    "FabricRoute",
    "LabError",
    "LabPlan",
    "LabPod",
    "LabState",
    "NodePlan",
    "PluginOutcome",
    "PortSpec",
    "Probe",
    "ProbeResult",
    "RestartDrill",
    "agent_ready",
    "api_client",
    "apply_objects",
    "birdc",
    "delete",
    "down",
    "established",
    "exec_conflist",
    "exec_plugin",
    "fabric_has",
    "fabric_routes",
    "finish_pod",
    "graceful_restart_under_ping",
    "in_netns",
    "load_conflist",
    "load_pods",
    "load_procs",
    "load_state",
    "matrix",
    "matrix_text",
    "netns_path",
    "ns_add",
    "ns_label",
    "parse_routes",
    "pod_add",
    "pod_check",
    "pod_del",
    "pod_label",
    "pod_ready",
    "probe_all",
    "probe_one",
    "process_refs",
    "reachability",
    "run_in",
    "server_version",
    "socket_in",
    "status",
    "status_text",
    "summary",
    "up",
    "wait_anycast_routes",
    "wait_applied",
]
