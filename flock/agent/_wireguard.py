"""The agent's WireGuard service (issue 36): key, publication, device, peers, routes, fail-closed guard.

Composed only with ``--encryption wireguard`` (:func:`wireguard_part`); the tree gains::

    ├── wireguard               WireGuardService: key loaded or created, device ensured, then every change of
    │                           the cluster → peers (one node's change: one peer's ``wg set``), routes, guard;
    │                           a full reconcile at start and every RESYNC_SECONDS
    └── api
        ├── wireguard-nodeconfigs   every NodeConfig: pod blocks and status.wireguard.publicKey → ClusterView
        ├── wireguard-nodes         every Node: status.addresses (the endpoints) → ClusterView
        └── wireguard-publish       this node's public key → its NodeConfig's status (merge patch on the status
                                    subresource), at every start and whenever the published key differs

Without encryption the tree gains ``wireguard-off`` instead, which removes the guard's table (a node
switched off must not keep dropping its pods' traffic).

Error handling: the service retries a failed device, route or nft step itself (:data:`RETRY`), so a
missing wireguard-go or a refused transaction is a readiness note and a log line, never a restart
loop that would take the agent down; the guard table, once written, stays in force meanwhile.  The
watchers and the publisher run under the API link's supervisor (restarted with backoff on errors).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from flock.model import MTU_DEFAULT
from flock.nursery import Backoff, ChildSpec, Restart
from flock.policy import NftBackend, NftError
from flock.state import WIREGUARD_OVERHEAD, Gate, PodMtu
from flock.watchers import ChangeType, Informer, InformerSettings, KubeClient, KubeError
from flock.wireguard import (
    GUARD_COUNTER,
    GUARD_TABLE,
    ROUTE_TABLE,
    RULE_PRIORITY,
    Dataplane,
    DeviceChoice,
    DeviceError,
    DeviceRoutes,
    DeviceState,
    EncryptionSettings,
    KeyStore,
    NodeAddresses,
    NodeConfigWireGuard,
    NodeKey,
    Peer,
    PublicKey,
    Refusal,
    WireGuardDevice,
    parse_counter,
    peers_changed,
    plan_dataplane,
    render_guard,
    render_read_counter,
    render_remove,
)

log = logging.getLogger("flock.wireguard")

RESYNC_SECONDS = 60.0  # a full reconcile (wg show, every peer compared) this often
DEBOUNCE_SECONDS = 0.1  # changes arriving within this are applied together
FORGET_POLL_SECONDS = 1.0  # after a rotation: how often the peers' handshakes are checked
# After a rotation, the previous key is forgotten this long after it even if some peer has not shaken hands with
# the new one (a node down, or not reading NodeConfigs): such a peer would otherwise block every later rotation.
# The device never uses the previous key; forgetting it only ends "rotation pending".  Named in a warning.
FORGET_AFTER_SECONDS = 180.0
RETRY = Backoff(initial=1.0, factor=2.0, cap=30.0)
PUBLISH_RETRY = Backoff(initial=1.0, factor=2.0, cap=30.0)
NODECONFIG_PATH = "/apis/flock.fritzlab.net/v1alpha1/nodeconfigs"
MERGE_PATCH = "application/merge-patch+json"


NOTE = "wireguard"  # the readiness note's topic
# ADD waits behind this gate while the guard is not in force yet (an agent's first start with encryption, before
# the informers have listed every node's pod blocks): no pod of this node exists before its traffic is guarded.
GUARD_GATE = Gate("wireguard-guard", "the cluster's pod blocks are not guarded yet", label="encryption: ")


class MtuRefused(ValueError):
    """The fabric is too small for IPv6 inside the tunnel (the text says by how much and what to do)."""


def _name_key(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


@attrs.define(eq=False)
class ClusterView:
    """Every node's NodeConfig and Node as the WireGuard service reads them; one owner (the informers
    write, the service reads).  *version* counts changes; :meth:`wait_changed` waits for the next."""

    nodeconfigs: dict[str, NodeConfigWireGuard] = attrs.field(factory=dict)
    nodes: dict[str, NodeAddresses] = attrs.field(factory=dict)
    nodeconfigs_listed: bool = False
    nodes_listed: bool = False
    version: int = 0
    _changed: trio.Event = attrs.field(factory=trio.Event)

    @property
    def listed(self) -> bool:
        """Both kinds listed once: before that, an empty view would remove every peer."""
        return self.nodeconfigs_listed and self.nodes_listed

    def put_nodeconfig(self, name: str, value: NodeConfigWireGuard | None) -> None:
        _put(self.nodeconfigs, name, value)
        self._bump()

    def put_node(self, name: str, value: NodeAddresses | None) -> None:
        _put(self.nodes, name, value)
        self._bump()

    def mark_listed(self, *, nodeconfigs: bool = False, nodes: bool = False) -> None:
        self.nodeconfigs_listed |= nodeconfigs
        self.nodes_listed |= nodes
        self._bump()

    async def wait_changed(self, seen: int) -> None:
        while self.version == seen:
            await self._changed.wait()

    def _bump(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = trio.Event()


def _put(table: dict[str, Any], name: str, value: Any) -> None:
    if value is None:
        table.pop(name, None)
    else:
        table[name] = value


@attrs.define(eq=False)
class _Latest:
    """A public key that changes, and a wait for a change."""

    value: PublicKey | None = None
    _changed: trio.Event = attrs.field(factory=trio.Event)

    def set(self, value: PublicKey) -> None:
        if value != self.value:
            self.value = value
            self._changed.set()
            self._changed = trio.Event()

    async def wait_other(self, seen: PublicKey | None) -> PublicKey:
        """The value once it is set and differs from *seen*."""
        while self.value is None or self.value == seen:
            await self._changed.wait()
        return self.value


@attrs.frozen
class PeerStatus:
    node: str
    public_key: str
    endpoint: str | None
    allowed_ips: tuple[str, ...]
    latest_handshake: int | None
    rx_bytes: int
    tx_bytes: int


@attrs.define(eq=False)
class WireGuardService:
    """Supervised service: this node's WireGuard dataplane follows *cluster* (see the module doc).

    ``started()`` once the key is loaded: the device, its peers, routes and the guard follow once both
    informers have listed (until then the device is left as it is: an agent restart changes nothing),
    and each failure is retried.  *guarded* is called whenever the guard is in force."""

    node: str
    store: KeyStore
    device: WireGuardDevice
    routes: DeviceRoutes
    nft: NftBackend
    cluster: ClusterView
    settings: EncryptionSettings
    resync_seconds: float = RESYNC_SECONDS
    debounce_seconds: float = DEBOUNCE_SECONDS
    retry: Backoff = RETRY
    # The pods' MTU (the fabric's less WireGuard's overhead; refused below 1280) and where readiness notes go
    mtu: Callable[[], PodMtu] = lambda: PodMtu(MTU_DEFAULT - WIREGUARD_OVERHEAD[6], "default")
    note: Callable[[str, str | None], None] = lambda topic, text: None
    # Called whenever the guard is in force: the last agent's table found at start, or a guard written
    guarded: Callable[[], None] = lambda: None
    clock: Callable[[], float] = time.time  # Unix time: what handshake times are compared with
    forget_after: float = FORGET_AFTER_SECONDS
    _keys: NodeKey | None = attrs.field(init=False, default=None)
    _public: _Latest = attrs.field(init=False, factory=_Latest)  # the key's public half
    # The public key of the private key the device carries: what may be published (a key published before
    # the device has it would send the peers' handshakes to a device that cannot answer them, and a
    # refused handshake is retried only after 5 s)
    _device_key: _Latest = attrs.field(init=False, factory=_Latest)
    _applied: dict[str, Peer] | None = attrs.field(init=False, default=None)  # None: reconcile in full
    _dataplane: Dataplane | None = attrs.field(init=False, default=None)
    _rotated_at: float | None = attrs.field(init=False, default=None)  # Unix time of the rotation in progress
    _device_lock: trio.Lock = attrs.field(init=False, factory=trio.Lock)  # one writer of the device at a time
    _refusals: tuple[Refusal, ...] = attrs.field(init=False, default=())
    last_error: str | None = attrs.field(init=False, default=None)
    reconciles: int = attrs.field(init=False, default=0)
    peer_updates: int = attrs.field(init=False, default=0)  # incremental `wg set`s

    @property
    def public_key(self) -> PublicKey | None:
        return self._keys.public_key if self._keys is not None else None

    @property
    def dataplane(self) -> Dataplane | None:
        return self._dataplane

    async def wait_key_changed(self, seen: PublicKey | None) -> PublicKey:
        return await self._public.wait_other(seen)

    @property
    def device_key(self) -> PublicKey | None:
        """The public key of what the device carries (None: not configured yet)."""
        return self._device_key.value

    async def wait_device_key(self, seen: PublicKey | None) -> PublicKey:
        """The device's key once it is set and differs from *seen*."""
        return await self._device_key.wait_other(seen)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._set_keys(await trio.to_thread.run_sync(self.store.load_or_create))
        if await self.nft.has_table(GUARD_TABLE):
            self.guarded()  # the last agent's guard is in force until the first pass replaces it
        # Started before the device: nothing after this child in the tree (BIRD, BGP) may wait on WireGuard; the
        # device is brought up by the first pass, and retried.  Pods wait for the guard (GUARD_GATE), not this.
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._forget_previous_keys)
            await self._follow()

    async def _forget_previous_keys(self) -> None:
        while True:
            await trio.sleep(FORGET_POLL_SECONDS)
            try:
                await self.forget_when_every_peer_has_the_new_key()
            except (DeviceError, OSError) as exc:
                log.warning("WireGuard: cannot check the peers' handshakes", extra={"error": str(exc)[:300]})

    async def _follow(self) -> None:
        seen, full_at = -1, -math.inf
        failures = 0
        while True:
            with trio.move_on_after(max(0.0, full_at + self.resync_seconds - trio.current_time())):
                await self.cluster.wait_changed(seen)
                await trio.sleep(self.debounce_seconds)
            seen = self.cluster.version
            full = trio.current_time() >= full_at + self.resync_seconds or self._applied is None
            try:
                await self.reconcile(full=full)
            except (DeviceError, NftError, MtuRefused) as exc:
                self._applied = None  # the device's state is unknown: the next pass reads it
                delay = self._failed(exc, failures)
                failures += 1
                await trio.sleep(delay)
                continue
            failures = 0
            if full:
                full_at = trio.current_time()

    async def reconcile(self, *, full: bool) -> None:
        """Apply what the cluster says: in *full* (the device read, every peer compared, the device created
        again if it went), or only the peers that changed since the last pass (one ``wg set`` naming them)."""
        async with self._device_lock:
            await self._reconcile(full=full)

    async def _reconcile(self, *, full: bool) -> None:
        keys = self._keys
        assert keys is not None
        if not self.cluster.listed:
            return
        dp = plan_dataplane(self.node, self.cluster.nodeconfigs.values(), self.cluster.nodes, self.settings)
        if dp.refusals != self._refusals:
            for refusal in sorted(set(dp.refusals) - set(self._refusals)):
                log.warning(
                    "WireGuard: refused",
                    extra={"node": refusal.node, "reason": str(refusal.reason), "detail": refusal.detail},
                )
            self._refusals = dp.refusals
        # The guard first: whatever fails after it, nothing leaves in the clear.
        await self.nft.run(render_guard(self.device.name, dp.local, dp.guarded))
        self.guarded()
        # The rules follow this node's own pod blocks only: read and written at a full pass or when those move.
        rules_stale = full or self._dataplane is None or self._dataplane.local != dp.local
        self._dataplane = dp
        mtu = self.mtu()
        self.note(NOTE, mtu.refused)
        if mtu.refused is not None:
            raise MtuRefused(mtu.refused)
        if self.device.mtu != mtu.value:
            self.device.mtu = mtu.value  # set by the next ensure()
            full = True
        desired = dict(dp.peers)
        port = self.settings.listen_port
        if full or self._applied is None:
            await self.device.ensure()
            await self.device.configure(keys.current, port, dp.peer_list)
        else:
            changed = peers_changed(self._applied, desired)
            if changed:
                known = DeviceState.configured(keys.public_key, port, self._applied.values())
                await self.device.update(known, keys.current, port, dp.peer_list)
                self.peer_updates += 1
                log.info("WireGuard peers updated", extra={"nodes": changed[:20], "count": len(changed)})
        self._device_key.set(keys.public_key)
        self._applied = desired
        await self.routes.apply(dp.routes, dp.local if rules_stale else None)
        self.reconciles += 1
        self.last_error = None

    async def rotate(self) -> NodeKey:
        """A new key for this node (flockctl wireguard rotate): on disk first (the old one kept as
        ``private.key.previous``), then on the device, then published (the publisher follows the key).
        Peers lose at most the time until they read the new key.  RotationPending while the previous
        rotation's key is kept (not every peer has shaken hands with the new one yet)."""
        async with self._device_lock:
            keys = await trio.to_thread.run_sync(self.store.rotate)
            self._rotated_at = self.clock()
            self._set_keys(keys)
            if self._applied is not None:
                peers = list(self._applied.values())
                before = keys.previous.public_key if keys.previous is not None else keys.public_key
                known = DeviceState.configured(before, self.settings.listen_port, peers)
                await self.device.update(known, keys.current, self.settings.listen_port, peers)
                self._device_key.set(keys.public_key)
            # else: the next full pass configures the device with it, and the key is published then
        log.info("WireGuard key rotated; publishing", extra={"public_key": keys.public_key.base64})
        return keys

    async def forget_when_every_peer_has_the_new_key(self) -> bool:
        """Forget the previous key once every peer has shaken hands after the rotation (with the new key:
        the device has no other).  True when there is no previous key (any more)."""
        keys = self._keys
        if keys is None or keys.previous is None:
            return True
        state = await self.device.show()
        since = self._rotated_at if self._rotated_at is not None else self.clock()
        self._rotated_at = since
        # wg reports handshakes in whole seconds: one in the rotation's second counts (the device has had only
        # the new key since, and the key file is bookkeeping: the device never reads the previous one).
        waiting = [k for k, p in state.peers.items() if p.latest_handshake is None or p.latest_handshake < int(since)]
        if waiting and self.clock() - since < self.forget_after:
            return False
        self._set_keys(await trio.to_thread.run_sync(self.store.forget_previous))
        if waiting:
            names = {peer.public_key: name for name, peer in (self._dataplane.peers if self._dataplane else ())}
            log.warning(
                "WireGuard previous key forgotten although some peers have not shaken hands with the new one; "
                "they reach this node again once they read its NodeConfig",
                extra={"after_s": self.forget_after, "nodes": sorted(names.get(k, "?") for k in waiting)[:20]},
            )
        else:
            log.info("WireGuard previous key forgotten: every peer has the new one", extra={"peers": len(state.peers)})
        return True

    async def admin_status(self) -> dict[str, Any]:
        """What ``flockctl status`` shows of encryption: the device, the key (public), the peers with their
        handshakes, the guard's drops, refusals and the last error.  Never the private key."""
        keys = self._keys
        try:
            peers: list[dict[str, Any]] | None = [attrs.asdict(p) for p in await self.peer_status()]
            device_error = None
        except DeviceError as exc:
            peers, device_error = None, str(exc)[:300]
        dropped = await self.dropped()
        dp = self._dataplane
        return {
            "mode": "wireguard",
            "device": self.device.name,
            "kind": str(self.device.kind) if self.device.kind is not None else None,
            "mtu": self.device.mtu,
            "listen_port": self.settings.listen_port,
            "public_key": keys.public_key.base64 if keys is not None else None,
            "rotation_pending": keys is not None and keys.previous is not None,
            "peers": peers,
            "device_error": device_error,
            "guard": {
                "table": f"inet {GUARD_TABLE}",
                "counter": GUARD_COUNTER,
                "dropped_packets": dropped[0] if dropped is not None else None,
                "dropped_bytes": dropped[1] if dropped is not None else None,
                "guarded_blocks": len(dp.guarded) if dp is not None else 0,
            },
            "allow_plaintext_to": sorted(self.settings.allow_plaintext_to),
            "refusals": [str(r) for r in (dp.refusals if dp is not None else ())][:20],
            "error": self.last_error,
            "now": int(self.clock()),
        }

    async def dropped(self) -> tuple[int, int] | None:
        """(packets, bytes) the guard dropped; None when it has no table yet."""
        try:
            return parse_counter(await self.nft.run(render_read_counter()))
        except (NftError, ValueError):
            return None

    async def peer_status(self) -> list[PeerStatus]:
        """The device's peers, named by node (never the private key)."""
        state = await self.device.show()
        names = {peer.public_key: name for name, peer in (self._dataplane.peers if self._dataplane else ())}
        return [
            PeerStatus(
                names.get(key, "?"),
                str(key),
                str(p.endpoint) if p.endpoint is not None else None,
                tuple(str(n) for n in p.sorted_allowed_ips),
                p.latest_handshake,
                p.rx_bytes,
                p.tx_bytes,
            )
            for key, p in sorted(state.peers.items(), key=lambda kv: names.get(kv[0], "~"))
        ]

    # -- internals ------------------------------------------------------------------------------

    def _set_keys(self, keys: NodeKey) -> None:
        self._keys = keys
        self._public.set(keys.public_key)

    def _failed(self, exc: Exception, failures: int) -> float:
        delay = self.retry.delay(failures)
        self.last_error = str(exc)[:500]
        log.error("WireGuard: %s; retrying", self.last_error, extra={"retry_in": delay})
        return delay


class KeySource(Protocol):
    """Where the publisher reads this node's public key (:class:`WireGuardService`): the key of what the
    device carries, so that no peer uses a key before this node's device answers to it."""

    @property
    def device_key(self) -> PublicKey | None: ...

    async def wait_device_key(self, seen: PublicKey | None) -> PublicKey:
        """The key once the device carries one that differs from *seen*."""
        ...


@attrs.define(eq=False)
class KeyPublisher:
    """Supervised service: this node's public key in its NodeConfig's ``status.wireguard.publicKey``.

    Published once the device carries the key (the service's first pass, or a rotation applied), and
    republished at every start (idempotent: a merge patch of the same value changes nothing), after
    every rotation, and whenever the NodeConfig seen says another key (overwritten, or the object made
    again).  A NodeConfig not there yet (404) is retried (:data:`PUBLISH_RETRY`)."""

    node: str
    service: KeySource
    cluster: ClusterView
    patch: Callable[[str, dict[str, Any]], Any]  # (path, merge patch) → the API server's answer
    retry: Backoff = PUBLISH_RETRY
    published: int = attrs.field(init=False, default=0)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # Started at once: the key comes from the WireGuard service, which the tree starts after the API link
        # (whose start waits for this child): waiting for the key first would deadlock the start.
        task_status.started()
        key = await self.service.wait_device_key(None)
        failures = 0
        while True:
            try:
                await self.publish(key)
                break
            except KubeError as exc:
                delay = self.retry.delay(failures)
                failures += 1
                log.warning("cannot publish the WireGuard key yet", extra={"error": str(exc)[:300], "retry_in": delay})
                await trio.sleep(delay)
        while True:
            await self._wait_stale(key)
            key = self.service.device_key or key
            await self.publish(key)  # a failure here goes to the supervisor: its restart publishes again

    async def _wait_stale(self, key: PublicKey) -> None:
        """Until the key is rotated or this node's NodeConfig says another key."""
        async with trio.open_nursery() as nursery:

            async def rotated() -> None:
                await self.service.wait_device_key(key)
                nursery.cancel_scope.cancel()

            async def overwritten() -> None:
                # Changes after the publish only: what the view held before may predate the patch.
                seen = self.cluster.version
                while True:
                    await self.cluster.wait_changed(seen)
                    seen = self.cluster.version
                    mine = self.cluster.nodeconfigs.get(self.node)
                    if mine is not None and mine.public_key != key:
                        nursery.cancel_scope.cancel()
                        return

            nursery.start_soon(rotated)
            nursery.start_soon(overwritten)

    async def publish(self, key: PublicKey) -> None:
        body = {"status": {"wireguard": {"publicKey": key.base64}}}
        await self.patch(f"{NODECONFIG_PATH}/{self.node}/status", body)
        self.published += 1
        log.info("WireGuard public key published", extra={"node": self.node, "public_key": key.base64})


def cluster_watchers(
    node: str, service: WireGuardService, cluster: ClusterView, settings: InformerSettings | None = None
) -> Callable[[KubeClient], Sequence[ChildSpec]]:
    """A watcher factory for the API link: every NodeConfig, every Node, and the key's publisher."""
    informer_settings = settings if settings is not None else InformerSettings()

    def factory(client: KubeClient) -> Sequence[ChildSpec]:
        nodeconfigs = Informer(
            client.nodeconfigs(),
            _name_key,
            lambda c: cluster.put_nodeconfig(c.key, None if c.type is ChangeType.DELETED else c.object),
            attrs.evolve(informer_settings, watch_list=False),
            name="nodeconfigs (wireguard)",
            transform=NodeConfigWireGuard.read,
        )
        nodes = Informer(
            client.nodes(),
            _name_key,
            lambda c: cluster.put_node(c.key, None if c.type is ChangeType.DELETED else c.object),
            informer_settings,
            name="nodes (wireguard)",
            transform=NodeAddresses.read,
        )

        async def run_nodeconfigs(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            async with trio.open_nursery() as nursery:
                await nursery.start(nodeconfigs.run)
                cluster.mark_listed(nodeconfigs=True)
                task_status.started()

        async def run_nodes(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            async with trio.open_nursery() as nursery:
                await nursery.start(nodes.run)
                cluster.mark_listed(nodes=True)
                task_status.started()

        async def patch(path: str, body: dict[str, Any]) -> Any:
            return await client.request("PATCH", path, body, content_type=MERGE_PATCH)

        publisher = KeyPublisher(node, service, cluster, patch)
        return [
            ChildSpec("wireguard-nodeconfigs", run_nodeconfigs),
            ChildSpec("wireguard-nodes", run_nodes),
            ChildSpec("wireguard-publish", publisher.run),
        ]

    return factory


@attrs.define(eq=False)
class GuardRemoval:
    """Encryption off: the guard's table, the rules to table 71 and the routes through the device
    removed once (a node switched off must not keep dropping, nor send its pods' traffic into a tunnel
    no longer kept).  The device itself is left (its peers idle without routes): the next switch on
    adopts it."""

    nft: NftBackend
    routes: DeviceRoutes | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # The guard is written before any rule or route and removed after them: no guard table, nothing to do
        # (what every agent without encryption finds, at the cost of one nft list).
        if await self.nft.has_table(GUARD_TABLE):
            if self.routes is not None and (removed := await self.routes.remove()):
                log.info(
                    "encryption is off: flock's rules and routes through the WireGuard device were removed",
                    extra={"routes": len(removed.delete), "rules": len(removed.delete_rules)},
                )
            await self.nft.run(render_remove())
            log.info("encryption is off: the WireGuard guard table was removed", extra={"table": f"inet {GUARD_TABLE}"})
        task_status.started()


@attrs.frozen
class WireGuardPart:
    """What :func:`wireguard_part` adds to the tree: the service (None: encryption off), its child, the
    watcher factory for the API link (None: off)."""

    service: WireGuardService | None
    child: ChildSpec
    watchers: Callable[[KubeClient], Sequence[ChildSpec]] | None


def wireguard_part(
    node: str,
    *,
    encryption: str,
    state_dir: Path,
    host_netns: str | None,
    device: str,
    kind: str,
    port: int,
    fabric: int,
    allow_plaintext_to: Sequence[str],
    table: int = ROUTE_TABLE,
    rule_priority: int = RULE_PRIORITY,
    nft: NftBackend,
    mtu: Callable[[], PodMtu],
    note: Callable[[str, str | None], None],
    guarded: Callable[[], None] = lambda: None,
) -> WireGuardPart:
    """The WireGuard service and its watchers (encryption on), or the guard's removal (off)."""
    if encryption != "wireguard":
        removal = GuardRemoval(nft, DeviceRoutes(device, host_netns, table=table, priority=rule_priority))
        return WireGuardPart(None, ChildSpec("wireguard", removal.run, restart=Restart.TRANSIENT), None)
    cluster = ClusterView()
    service = WireGuardService(
        node=node,
        store=KeyStore(state_dir / "wireguard"),
        device=WireGuardDevice(device, host_netns, DeviceChoice(kind)),
        routes=DeviceRoutes(device, host_netns, table=table, priority=rule_priority),
        nft=nft,
        cluster=cluster,
        settings=EncryptionSettings(port, fabric, allow_plaintext_to),
        mtu=mtu,
        note=note,
        guarded=guarded,
    )
    return WireGuardPart(service, ChildSpec("wireguard", service.run), cluster_watchers(node, service, cluster))


__all__ = [
    "GUARD_GATE",
    "ClusterView",
    "GuardRemoval",
    "KeyPublisher",
    "PeerStatus",
    "WireGuardService",
    "cluster_watchers",
]
