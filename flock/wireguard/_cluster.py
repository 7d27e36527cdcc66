"""What the agent's WireGuard service reads of the cluster, and what it makes of it (pure).

Two kinds of objects, each kept as a small value made at decode time:

- every node's **NodeConfig** (:class:`NodeConfigWireGuard`): its pod blocks (``spec.cidr6``,
  ``spec.cidr4``) and its published key (``status.wireguard.publicKey``).  Both come in one object,
  so a node's key and its allowed IPs change together, in one watch event;
- every node's **Node** (:class:`NodeAddresses`): ``status.addresses``, InternalIP before ExternalIP
  (what kubelet reports, and what BGP, the API server and the probes reach the node on).  NodeConfig
  holds no node address (``bgp.routerID`` is an identifier, not necessarily an address of the node),
  so the endpoints come from Node objects, as ClusterNetworkPolicy's ``nodes`` peers do.

:func:`plan_dataplane` turns both, this node's name and the settings into the
:class:`Dataplane`: the peers (:func:`flock.wireguard.desired_peers`), the routes through the
device (the peers' allowed IPs), and the fail-closed guard's sets — this node's pod blocks, and
the pod blocks no packet from them may reach except through the device.  Bad input is a named
:class:`Refusal`, never an exception: a key that is no key, a block that is no CIDR, a remote
block overlapping this node's.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from flock.wireguard._keys import InvalidKey, PublicKey
from flock.wireguard._model import IPAddress, IPNetwork, Peer, network_order
from flock.wireguard._peers import NodeWireGuard, PeerPlan, Refusal, RefusalReason, desired_peers

# The order node addresses are used in: what kubelet reports as the node's own first.
_ADDRESS_TYPES = ("InternalIP", "ExternalIP")


def _mapping(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _problem_text(value: object) -> str:
    return repr(str(value)[:48])


@attrs.frozen
class NodeConfigWireGuard:
    """One NodeConfig as the WireGuard service reads it.  *problems*: what was unusable (named)."""

    name: str
    pod_blocks: tuple[IPNetwork, ...] = ()
    public_key: PublicKey | None = None
    problems: tuple[tuple[RefusalReason, str], ...] = ()

    @classmethod
    def read(cls, obj: Mapping[str, Any]) -> NodeConfigWireGuard:
        meta, spec, status = _mapping(obj, "metadata"), _mapping(obj, "spec"), _mapping(obj, "status")
        name = str(meta.get("name", ""))
        problems: list[tuple[RefusalReason, str]] = []
        blocks: list[IPNetwork] = []
        for field, version in (("cidr6", 6), ("cidr4", 4)):
            raw = spec.get(field)
            if raw is None:
                continue
            try:
                block = ipaddress.ip_network(str(raw), strict=True)
                if block.version != version:
                    raise ValueError(f"not IPv{version}")
            except ValueError:
                problems.append(
                    (RefusalReason.INVALID_BLOCK, f"spec.{field} {_problem_text(raw)} is no IPv{version} CIDR")
                )
                continue
            blocks.append(block)
        key: PublicKey | None = None
        raw_key = _mapping(status, "wireguard").get("publicKey")
        if raw_key is not None:
            try:
                key = PublicKey.from_base64(str(raw_key), "status.wireguard.publicKey")
            except InvalidKey as exc:  # the text is not echoed: InvalidKey never carries it
                problems.append((RefusalReason.INVALID_KEY, str(exc)))
        return cls(name, tuple(blocks), key, tuple(problems))


@attrs.frozen
class NodeAddresses:
    """One Node's addresses, InternalIP first, then ExternalIP (other entries are names, not addresses)."""

    name: str
    addresses: tuple[IPAddress, ...] = ()

    @classmethod
    def read(cls, obj: Mapping[str, Any]) -> NodeAddresses:
        meta, status = _mapping(obj, "metadata"), _mapping(obj, "status")
        raw = status.get("addresses")
        entries: list[Any] = raw if isinstance(raw, list) else []
        found: list[IPAddress] = []
        for wanted in _ADDRESS_TYPES:
            for entry in entries:
                if not isinstance(entry, Mapping) or entry.get("type") != wanted:
                    continue
                try:
                    address = ipaddress.ip_address(str(entry.get("address", "")))
                except ValueError:
                    continue
                if address not in found:
                    found.append(address)
        return cls(str(meta.get("name", "")), tuple(found))


def _names(items: Iterable[str]) -> frozenset[str]:
    return frozenset(items)


# In allow_plaintext_to: every node that has published no key (a cluster switching encryption on node by node)
UNKEYED = "*"


@attrs.frozen
class EncryptionSettings:
    """The cluster's encryption settings (flock-agent's flags, the same on every node).

    *allow_plaintext_to*: nodes whose pods this node may reach in the clear (a migration: nodes that
    do not encrypt yet), :data:`UNKEYED` for every node that has published no key; every other node's
    pod blocks are reachable through the device only.  A node that published a key it cannot be peered
    with (an invalid key, no address) stays guarded under UNKEYED: it says it encrypts."""

    listen_port: int = 51820
    fabric_family: int = 6
    allow_plaintext_to: frozenset[str] = attrs.field(default=frozenset(), converter=_names)


@attrs.frozen
class Dataplane:
    """What this node's WireGuard dataplane should be.

    *peers*: by node name; *routes*: through the device (every peer's allowed IPs); *local*: this
    node's pod blocks (the guard's sources); *guarded*: the pod blocks reachable only through the
    device (every other node's, but those of *allow_plaintext_to*); *refusals*: what was left out."""

    peers: tuple[tuple[str, Peer], ...] = ()
    routes: frozenset[IPNetwork] = frozenset()
    local: frozenset[IPNetwork] = frozenset()
    guarded: frozenset[IPNetwork] = frozenset()
    refusals: tuple[Refusal, ...] = ()

    @property
    def peer_list(self) -> list[Peer]:
        return [peer for _, peer in self.peers]


def plan_dataplane(
    me: str,
    nodeconfigs: Iterable[NodeConfigWireGuard],
    nodes: Mapping[str, NodeAddresses],
    settings: EncryptionSettings,
) -> Dataplane:
    """This node's :class:`Dataplane` from every NodeConfig and Node known (pure)."""
    configs = sorted(nodeconfigs, key=lambda c: c.name)
    refusals = [Refusal(c.name, reason, detail) for c in configs for reason, detail in c.problems]
    known = [
        NodeWireGuard(c.name, c.public_key, nodes[c.name].addresses if c.name in nodes else (), c.pod_blocks)
        for c in configs
    ]
    plan: PeerPlan = desired_peers(me, known, fabric_family=settings.fabric_family, listen_port=settings.listen_port)
    refusals.extend(plan.refusals)
    local = frozenset(block for c in configs if c.name == me for block in c.pod_blocks)
    guarded: set[IPNetwork] = set()
    unkeyed = UNKEYED in settings.allow_plaintext_to
    for c in configs:
        if c.name == me or c.name in settings.allow_plaintext_to:
            continue
        if unkeyed and c.public_key is None and not any(r is RefusalReason.INVALID_KEY for r, _ in c.problems):
            continue
        for block in c.pod_blocks:
            mine = next((own for own in local if own.version == block.version and own.overlaps(block)), None)
            if mine is not None:  # a guard from this node's blocks to themselves would drop local traffic
                refusals.append(
                    Refusal(c.name, RefusalReason.BLOCK_CONFLICT, f"pod block {block} overlaps this node's {mine}")
                )
                continue
            guarded.add(block)
    routes = frozenset(net for _, peer in plan.peers for net in peer.allowed_ips)
    return Dataplane(plan.peers, routes, local, frozenset(guarded), tuple(sorted(set(refusals))))


def peers_changed(before: Mapping[str, Peer], after: Mapping[str, Peer]) -> list[str]:
    """The nodes whose peer differs between two plans (added, removed or changed), sorted."""
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


def sorted_networks(nets: Iterable[IPNetwork]) -> list[IPNetwork]:
    return sorted(nets, key=network_order)
