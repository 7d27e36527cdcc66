"""flock-agent: the composition root (CLI → settings → every service, wired once) and its entry point."""

from flock.agent._api import (
    API_GATE,
    NODECONFIG_INFORMER_GATE,
    POD_INFORMER_GATE,
    ApiLink,
    ClusterPods,
    PodWatcherLookup,
)
from flock.agent._bird import BirdFollower, bird_inputs
from flock.agent._cli import (
    DEFAULT_BIRD_CONFIG,
    DEFAULT_BIRD_SOCKET,
    DEFAULT_HEALTH_ADDRESS,
    DEFAULT_SOCKET,
    DEFAULT_STATE_DIR,
    AgentSettings,
    parse_args,
)
from flock.agent._compose import STORE_REMEDY, compose, node_state, run_agent
from flock.agent._crash import CrashPoint
from flock.agent._main import main
from flock.agent._root import (
    EXIT_ESCALATED,
    EXIT_OK,
    ROOT_INTENSITY,
    SHUTDOWN_DEADLINE_S,
    Agent,
    FatalStartError,
    StateDirError,
    check_state_dir,
    serve,
)

__all__ = [
    "API_GATE",
    "DEFAULT_BIRD_CONFIG",
    "DEFAULT_BIRD_SOCKET",
    "DEFAULT_HEALTH_ADDRESS",
    "DEFAULT_SOCKET",
    "DEFAULT_STATE_DIR",
    "EXIT_ESCALATED",
    "EXIT_OK",
    "NODECONFIG_INFORMER_GATE",
    "POD_INFORMER_GATE",
    "ROOT_INTENSITY",
    "SHUTDOWN_DEADLINE_S",
    "STORE_REMEDY",
    "Agent",
    "AgentSettings",
    "ApiLink",
    "BirdFollower",
    "ClusterPods",
    "CrashPoint",
    "FatalStartError",
    "PodWatcherLookup",
    "StateDirError",
    "bird_inputs",
    "check_state_dir",
    "compose",
    "main",
    "node_state",
    "parse_args",
    "run_agent",
    "serve",
]
