"""The node's running state and its one owner (NodeConfig in force, allocations, readiness)."""

from flock.state._gated import gated
from flock.state._mtu import PodMtu, pod_mtu
from flock.state._node_state import NODECONFIG_GATE, Gate, NodeState

__all__ = ["NODECONFIG_GATE", "Gate", "NodeState", "PodMtu", "gated", "pod_mtu"]
