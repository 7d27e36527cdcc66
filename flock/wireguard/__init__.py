"""WireGuard between nodes (issue 36), first slice: keys, the device, the desired peers.

- :mod:`._keys`: the node's private key on disk (0600 in a 0700 directory, created atomically,
  re-read, rotated beside and switched by one rename) and :class:`PrivateKey`, which never shows itself.
- :mod:`._device`: one interface driven the same way whether the kernel module or wireguard-go
  runs it (``ip link`` / ``wireguard-go`` to create, ``wg set`` / ``wg show dump`` to configure).
- :mod:`._peers`: pure, every node's key, addresses and pod blocks → this node's peers, with refusals.

See docs/encryption.md for what is tested where and what the rest of issue 36 adds.
"""

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

__all__ = [
    "DEFAULT_KEEPALIVE_S",
    "Change",
    "DeviceChoice",
    "DeviceError",
    "DeviceKind",
    "DeviceState",
    "Endpoint",
    "InvalidKey",
    "KernelWireGuardMissing",
    "KeyFileCorrupt",
    "KeyFileUnsafe",
    "KeyStore",
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
    "Tools",
    "WireGuardDevice",
    "desired_peers",
    "plan_set",
]
