"""WireGuard between nodes (issue 36): keys, the device, the desired peers, the dataplane the agent plans.

- :mod:`._keys`: the node's private key on disk (0600 in a 0700 directory, created atomically,
  re-read, rotated beside and switched by one rename) and :class:`PrivateKey`, which never shows itself.
- :mod:`._device`: one interface driven the same way whether the kernel module or wireguard-go
  runs it (``ip link`` / ``wireguard-go`` to create, ``wg set`` / ``wg show dump`` to configure).
- :mod:`._peers`: pure, every node's key, addresses and pod blocks → this node's peers, with refusals.
- :mod:`._cluster`: pure, every NodeConfig and Node (as read) → this node's :class:`Dataplane` (peers, routes,
  the guard's sets).
- :mod:`._guard`: the fail-closed table ``inet flock-wireguard`` as one nft transaction (pure).
- :mod:`._routes`: the remote pod blocks routed through the device (table 71), for this node's pods (rules).

The agent's service that runs them is :mod:`flock.agent._wireguard`.

See docs/encryption.md for what is tested where and what the rest of issue 36 adds.
"""

from flock.wireguard._cluster import (
    UNKEYED,
    Dataplane,
    EncryptionSettings,
    NodeAddresses,
    NodeConfigWireGuard,
    peers_changed,
    plan_dataplane,
)
from flock.wireguard._device import (
    Change,
    DeviceChoice,
    DeviceError,
    DeviceKind,
    DeviceState,
    KernelWireGuardMissing,
    NotWireGuard,
    PeerState,
    Tools,
    WireGuardDevice,
    plan_set,
)
from flock.wireguard._guard import (
    CHAIN as GUARD_CHAIN,
)
from flock.wireguard._guard import (
    COUNTER as GUARD_COUNTER,
)
from flock.wireguard._guard import (
    TABLE as GUARD_TABLE,
)
from flock.wireguard._guard import (
    parse_counter,
    render_guard,
    render_read_counter,
    render_remove,
)
from flock.wireguard._keys import (
    InvalidKey,
    KeyFileCorrupt,
    KeyFileUnsafe,
    KeyStore,
    NodeKey,
    PrivateKey,
    PublicKey,
    RotationPending,
)
from flock.wireguard._model import Endpoint, Peer
from flock.wireguard._peers import (
    DEFAULT_KEEPALIVE_S,
    NodeWireGuard,
    PeerPlan,
    Refusal,
    RefusalReason,
    desired_peers,
)
from flock.wireguard._routes import ROUTE_PROTOCOL, ROUTE_TABLE, RULE_PRIORITY, DeviceRoutes, RoutePlan, plan_routes

__all__ = [
    "DEFAULT_KEEPALIVE_S",
    "GUARD_CHAIN",
    "GUARD_COUNTER",
    "GUARD_TABLE",
    "ROUTE_PROTOCOL",
    "ROUTE_TABLE",
    "RULE_PRIORITY",
    "UNKEYED",
    "Change",
    "Dataplane",
    "DeviceChoice",
    "DeviceError",
    "DeviceKind",
    "DeviceRoutes",
    "DeviceState",
    "EncryptionSettings",
    "Endpoint",
    "InvalidKey",
    "KernelWireGuardMissing",
    "KeyFileCorrupt",
    "KeyFileUnsafe",
    "KeyStore",
    "NodeAddresses",
    "NodeConfigWireGuard",
    "NodeKey",
    "NodeWireGuard",
    "NotWireGuard",
    "Peer",
    "PeerPlan",
    "PeerState",
    "PrivateKey",
    "PublicKey",
    "Refusal",
    "RefusalReason",
    "RotationPending",
    "RoutePlan",
    "Tools",
    "WireGuardDevice",
    "desired_peers",
    "parse_counter",
    "peers_changed",
    "plan_dataplane",
    "plan_routes",
    "plan_set",
    "render_guard",
    "render_read_counter",
    "render_remove",
]
