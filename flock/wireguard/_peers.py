"""The peers this node's WireGuard device should have, from what is known of every node (pure).

One peer per other node that has published a key: its allowed IPs are that node's pod blocks (both
families), its endpoint that node's address of the family the fabric runs on.  What cannot be given
is refused by name, never guessed:

- a node without a key yet (its pods are unreachable through the tunnel until it has one: the
  fail-closed rules, not this module, keep that traffic from leaving in the clear);
- a node without an address of the fabric's family, or whose address lies in a pod block (the
  tunnel's own packets would be routed into the tunnel);
- a key claimed by two nodes, or this node's own key claimed by another (``wg`` keeps one peer per key);
- a pod block claimed by two nodes (or overlapping another node's, or this node's): the block goes to
  neither, since WireGuard routes by allowed IPs and one block given to two peers would send one
  node's traffic to the other.  The rest of each node's blocks are kept.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable

import attrs

from flock.wireguard._keys import PublicKey
from flock.wireguard._model import Endpoint, IPAddress, IPNetwork, Peer, network_order

BlocksByLength = dict[tuple[int, int], dict[int, IPNetwork]]  # (family, prefix length) → first address → block
DEFAULT_KEEPALIVE_S = 25  # wg(8)'s advice; also: a peer added with it sends a keepalive at once (a handshake)


def _addresses(items: Iterable[IPAddress]) -> tuple[IPAddress, ...]:
    return tuple(items)


def _blocks(items: Iterable[IPNetwork]) -> tuple[IPNetwork, ...]:
    return tuple(items)


@attrs.frozen
class NodeWireGuard:
    """What flock knows of one node for WireGuard: its name, published key, addresses and pod blocks."""

    name: str
    public_key: PublicKey | None
    addresses: tuple[IPAddress, ...] = attrs.field(converter=_addresses)
    pod_blocks: tuple[IPNetwork, ...] = attrs.field(converter=_blocks)


class RefusalReason(enum.StrEnum):
    NO_KEY = "no-key"
    NO_ENDPOINT = "no-endpoint"
    DUPLICATE_KEY = "duplicate-key"
    OWN_KEY = "own-key"
    BLOCK_CONFLICT = "block-conflict"
    INVALID_KEY = "invalid-key"  # status.wireguard.publicKey is no WireGuard key
    INVALID_BLOCK = "invalid-block"  # spec.cidr6/cidr4 is no CIDR of its family


@attrs.frozen(order=True)
class Refusal:
    """Something of node *node* that was not given to the device, and why (*detail* names the rest)."""

    node: str
    reason: RefusalReason
    detail: str

    def __str__(self) -> str:
        return f"node {self.node}: {self.reason}: {self.detail}"


@attrs.frozen
class PeerPlan:
    """The desired peers (by node name) and what was refused."""

    peers: tuple[tuple[str, Peer], ...]
    refusals: tuple[Refusal, ...]

    @property
    def peer_list(self) -> list[Peer]:
        return [peer for _, peer in self.peers]


def desired_peers(
    me: str,
    nodes: Iterable[NodeWireGuard],
    *,
    fabric_family: int,
    listen_port: int,
    persistent_keepalive: int | None = DEFAULT_KEEPALIVE_S,
) -> PeerPlan:
    """The peers of node *me* among *nodes* (which may include *me*; a name given twice: the last wins).

    *fabric_family*: 4 or 6, the family of the node addresses the tunnel runs over; *listen_port*:
    every node's WireGuard port (one cluster-wide setting)."""
    if fabric_family not in (4, 6):
        raise ValueError(f"fabric_family: expected 4 or 6, got {fabric_family!r}")
    by_name = {node.name: node for node in nodes}
    mine = by_name.get(me)
    others = sorted((node for name, node in by_name.items() if name != me), key=lambda n: n.name)
    refusals: list[Refusal] = []
    refused: set[str] = set()

    def refuse(node: str, reason: RefusalReason, detail: str, whole: bool = True) -> None:
        refusals.append(Refusal(node, reason, detail))
        if whole:
            refused.add(node)

    keyed: dict[PublicKey, list[str]] = defaultdict(list)
    for node in others:
        if node.public_key is None:
            refuse(node.name, RefusalReason.NO_KEY, "no public key published yet")
        elif mine is not None and node.public_key == mine.public_key:
            refuse(node.name, RefusalReason.OWN_KEY, f"its key {node.public_key} is this node's ({me})")
        else:
            keyed[node.public_key].append(node.name)
    for key, names in keyed.items():
        if len(names) > 1:
            for name in names:
                refuse(name, RefusalReason.DUPLICATE_KEY, f"key {key} is claimed by {', '.join(names)}")

    everyone = [mine, *others] if mine is not None else others
    lost = _conflicting_blocks(everyone)
    blocks_by_length: BlocksByLength = defaultdict(dict)
    for block in (block for node in everyone for block in node.pod_blocks):
        blocks_by_length[block.version, block.prefixlen][int(block.network_address)] = block
    peers: list[tuple[str, Peer]] = []
    for node in others:
        for block, claimants in sorted(lost.get(node.name, {}).items(), key=lambda kv: network_order(kv[0])):
            refuse(
                node.name,
                RefusalReason.BLOCK_CONFLICT,
                f"pod block {block} overlaps {', '.join(sorted(claimants))}'s: given to no peer",
                whole=False,
            )
        if node.name in refused:
            continue
        address = next((a for a in node.addresses if a.version == fabric_family), None)
        if address is None:
            refuse(node.name, RefusalReason.NO_ENDPOINT, f"no IPv{fabric_family} node address (the fabric's family)")
            continue
        inside = _block_holding(address, blocks_by_length)
        if inside is not None:  # the tunnel's own packets would be routed into the tunnel
            refuse(node.name, RefusalReason.NO_ENDPOINT, f"its address {address} lies in pod block {inside}")
            continue
        assert node.public_key is not None  # refused above otherwise
        blocks = frozenset(node.pod_blocks) - lost.get(node.name, {}).keys()
        peer = Peer(node.public_key, Endpoint(address, listen_port), blocks, persistent_keepalive)
        peers.append((node.name, peer))
    return PeerPlan(tuple(peers), tuple(refusals))


def _block_holding(address: IPAddress, blocks_by_length: BlocksByLength) -> IPNetwork | None:
    """The pod block *address* lies in, if any: one lookup per prefix length in use, not per block."""
    for (version, length), blocks in blocks_by_length.items():
        if version == address.version:
            width = address.max_prefixlen
            found = blocks.get(int(address) >> (width - length) << (width - length))
            if found is not None:
                return found
    return None


def _conflicting_blocks(nodes: Iterable[NodeWireGuard]) -> dict[str, dict[IPNetwork, set[str]]]:
    """For each node, its blocks that overlap another node's, with the other claimants.

    Per family, the blocks sorted by first address then prefix: CIDR blocks are nested or disjoint,
    so the blocks still open on a stack when one is reached are exactly those that contain it."""
    claims: list[tuple[IPNetwork, str]] = sorted(
        {(block, node.name) for node in nodes for block in node.pod_blocks},
        key=lambda claim: (*network_order(claim[0]), claim[1]),
    )
    lost: dict[str, dict[IPNetwork, set[str]]] = defaultdict(dict)
    stack: list[tuple[IPNetwork, str]] = []
    for block, owner in claims:
        while stack and (
            stack[-1][0].version != block.version or int(stack[-1][0].broadcast_address) < int(block.network_address)
        ):
            stack.pop()
        for outer, outer_owner in stack:
            if outer_owner != owner:
                lost[owner].setdefault(block, set()).add(outer_owner)
                lost[outer_owner].setdefault(outer, set()).add(owner)
        stack.append((block, owner))
    return lost
