"""The node's running state and its one owner (NodeConfig in force, allocations, readiness)."""

from flock.state._gated import gated
from flock.state._mtu import WIREGUARD_OVERHEAD, PodMtu, fabric_mtu, pod_mtu
from flock.state._node_state import NODECONFIG_GATE, Gate, NodeState

__all__ = [
    "NODECONFIG_GATE",
    "WIREGUARD_OVERHEAD",
    "Gate",
    "NodeState",
    "PodMtu",
    "fabric_mtu",
    "gated",
    "pod_mtu",
]
