"""The policy service: the watchers' changes + this node's attachments → the ruleset's change → one nftables transaction.

The service keeps a :class:`PolicyEngine` (built once from the inputs as
they are, then fed the inputs' journal, change by change) and hands its
changes to the applier: set elements that moved and the structure when it
changed, so a remote pod's change costs work for the selectors it touches.
Also the ADD gate: :meth:`PolicyService.ensure` returns once a ruleset that
includes the new pod (its chains, its addresses in every set it belongs to)
is in the kernel.

Error handling: a transaction nft refuses changed nothing (batches are
atomic); it is counted, the readiness gate closes with nft's message, and the
same (or a newer) ruleset is retried with backoff — never a partial one.  A
bug (a ruleset the renderer refuses) propagates to the supervisor.
"""

from __future__ import annotations

import ipaddress
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import attrs
import trio

from flock.faults import Fault, PolicyNotEnforceable
from flock.model import Allocation, NodeConfig
from flock.nursery import Backoff

from ._backend import NftError
from ._cluster import ClusterNetworkPolicy, Tier
from ._engine import PolicyEngine
from ._inputs import InputJournal, PolicySource
from ._metrics import PolicyMetrics
from ._model import PolicyPod
from ._model import Protocol as L4
from ._ruleset import HostPort, NatFamily, Ruleset, RulesetChange

log = logging.getLogger("flock.policy")

POLICY_GATE = "policy"
WAITING_FOR_WATCHERS = "waiting for the first lists of NetworkPolicies, Namespaces and Pods"
COUNTERS_EVERY_S = 15.0
# New UDP/SCTP hostPorts wait this long before their conntrack entries are deleted: the kernel walks its
# whole conntrack table for it (tens of ms on a busy node), kept out of ADD's own window, and the
# hostPorts of pods starting together share one walk.  The pod cannot be sending yet anyway.
FORGET_AFTER_S = 0.05
APPLY_BACKOFF = Backoff(initial=0.2, factor=2.0, cap=30.0, jitter=0.2)


class LocalPods(Protocol):
    """This node's attachments, pending and committed (flock.state.NodeState is one)."""

    @property
    def version(self) -> int: ...

    async def wait_changed(self, since: int) -> int: ...

    @property
    def allocations(self) -> Mapping[str, Allocation]: ...

    @property
    def allocations_loaded(self) -> bool:
        """True once start-up has rebuilt the view from the store (before it, the view is empty, not true)."""
        ...


class Readiness(Protocol):
    def open_gate(self, gate: str) -> None: ...

    def close_gate(self, gate: str, reason: str) -> None: ...


class Watermark(Protocol):
    """How far the watchers reflect the cluster (flock.watchers.PolicyWatcher)."""

    @property
    def watermark(self) -> int: ...

    async def wait_watermark(self, resource_version: int) -> int: ...


class RulesetApplier(Protocol):
    async def apply_change(self, change: RulesetChange) -> object:
        """Make the kernel hold ``change.whole()`` (incrementally when *change* continues the last one applied)."""
        ...

    async def counters(self) -> dict[str, tuple[int, int]]: ...


class PolicyGate(Protocol):
    """What ADD awaits after the netlink setup, before it commits (within its deadline)."""

    async def ensure(self, alloc: Allocation) -> None: ...


def nat_plan(config: NodeConfig | None) -> tuple[NatFamily, ...]:
    """natOutgoing as *config* says: per family enabled (and with a pod block), masquerade what leaves the
    block for anywhere but the node's blocks, announceRanges and clusterRanges."""
    if config is None:
        return ()
    out = []
    blocks = [b for b in (config.cidr6, config.cidr4) if b is not None]
    for block in blocks:
        if not config.nat_outgoing.enabled(block.version):
            continue
        inside = [n for n in (*blocks, *config.announce_ranges, *config.cluster_ranges) if n.version == block.version]
        exempt = tuple(ipaddress.collapse_addresses(inside))  # type: ignore[type-var]
        out.append(NatFamily(block.version, (block,), exempt))
    return tuple(out)


_L4 = {"tcp": L4.TCP, "udp": L4.UDP, "sctp": L4.SCTP}


def hostports_of(alloc: Allocation) -> tuple[HostPort, ...]:
    """*alloc*'s hostPort mappings as DNAT rules: one per mapping and family (the pod's own address of
    the family; an unspecified hostIP means any address of its family, as the portmap plugin reads it)."""
    out = []
    for m in alloc.port_mappings:
        for pod_ip in (alloc.ip6, alloc.ip4):
            if pod_ip is None or (m.host_ip is not None and m.host_ip.version != pod_ip.version):
                continue
            host_ip = None if m.any_host else m.host_ip
            out.append(HostPort(m.host_port, _L4[m.protocol], pod_ip, m.container_port, host_ip))
    return tuple(out)


def _addresses(alloc: Allocation) -> tuple:
    addrs = [a for a in (alloc.ip6, alloc.ip4) if a is not None]
    addrs += [a for a in alloc.addresses if a not in addrs]
    return tuple(addrs)


@attrs.frozen
class _Applied:
    generation: int
    ruleset: Ruleset  # its structure: the elements of the sets pods fill are the engine's
    covered: Mapping[str, tuple]  # container ID → addresses its chains and memberships were compiled with
    pods_by_veth: Mapping[str, tuple[str, str]]
    mapped: Mapping[str, tuple[HostPort, ...]] = attrs.field(factory=dict)  # container ID → its hostPorts in force


@attrs.define(eq=False)
class PolicyService:
    """Supervised service keeping ``table inet flock`` equal to what the policies say.

    *host_ifname* maps a container ID to flock's host veth name
    (flock.netlink.host_ifname).  *readiness* gets gate :data:`POLICY_GATE`
    closed while nothing complete is applied or nft refuses; *watermark*
    feeds the ``flock_policy_applied_resource_version`` gauge.
    """

    inputs: PolicySource
    local: LocalPods
    applier: RulesetApplier
    node: str
    host_ifname: Callable[[str], str]
    readiness: Readiness | None = None
    watermark: Watermark | None = None
    metrics: PolicyMetrics | None = None
    backoff: Backoff = APPLY_BACKOFF
    counters_every: float = COUNTERS_EVERY_S
    rand: Callable[[], float] = random.random
    # This node's NodeConfig (its natOutgoing, blocks and ranges go into the same table); None: no NAT.
    nodeconfig: Callable[[], NodeConfig | None] | None = None
    # Deletes the conntrack entries of flows to ((protocol, port), …) (flock.netlink's forget_flows): run
    # in the background once a UDP/SCTP hostPort is in the kernel, so flows already going there (before
    # the pod was up, or to the pod that held the port before) stop bypassing the mapping.
    forget_flows: Callable[[tuple[tuple[str, int], ...]], Awaitable[object]] | None = None
    forget_after: float = FORGET_AFTER_S
    _background: trio.Nursery | None = attrs.field(init=False, default=None)
    _to_forget: set[tuple[str, int]] = attrs.field(init=False, factory=set)  # ports waiting for the next walk
    # (engine structure, nat, hostports, the structure with both): pod churn keeps the object, so set updates stay small
    _node_rules: tuple[Ruleset, tuple[NatFamily, ...], tuple[HostPort, ...], Ruleset] | None = attrs.field(
        init=False, default=None
    )
    _engine: PolicyEngine | None = attrs.field(init=False, default=None)  # built once the inputs are complete
    _journal: InputJournal | None = attrs.field(init=False, default=None)  # the inputs' changes since the engine's
    _applied: _Applied | None = attrs.field(init=False, default=None)
    _applied_event: trio.Event = attrs.field(init=False, factory=trio.Event)
    _failures: int = attrs.field(init=False, default=0)
    _last_error: str | None = attrs.field(init=False, default=None)
    _mark: int = attrs.field(init=False, default=0)
    # container ID → (allocation, the watchers' pod, the local PolicyPod, its addresses): see local_pods
    _local_cache: dict[str, tuple[Allocation, PolicyPod, PolicyPod, tuple]] = attrs.field(init=False, factory=dict)
    # Set (and replaced) whenever the watchers' inputs or this node's attachments change.
    _poked: trio.Event = attrs.field(init=False, factory=trio.Event)
    # The ClusterNetworkPolicies last reported on (log lines for rules failing closed, priority ties)
    _cluster_seen: frozenset[ClusterNetworkPolicy] = attrs.field(init=False, factory=frozenset)
    _ties_seen: frozenset[tuple[str, int, tuple[str, ...]]] = attrs.field(init=False, factory=frozenset)

    @property
    def applied(self) -> Ruleset | None:
        """What the kernel holds: chains, maps, set declarations (elements of the sets pods fill left out)."""
        return self._applied.ruleset if self._applied is not None else None

    def ruleset(self) -> Ruleset | None:
        """The whole ruleset the service last handed to the applier, elements included (O(elements): tools, tests)."""
        return self._engine.ruleset() if self._engine is not None else None

    @property
    def last_error(self) -> str | None:
        return self._last_error

    def local_pods(self, allocations: Mapping[str, Allocation]) -> tuple[list[PolicyPod], dict[str, tuple]]:
        """This node's attachments whose pod the watchers know, as local PolicyPods.

        Each one is derived from its allocation and the watchers' pod value,
        and reused while both are the same objects: a change of one pod costs
        one new value, not one per pod on the node."""
        pods: list[PolicyPod] = []
        covered: dict[str, tuple] = {}
        cache, fresh, known_pods = self._local_cache, {}, self.inputs.pods
        for cid, alloc in allocations.items():
            known = known_pods.get(f"{alloc.namespace}/{alloc.pod}")
            if known is None:
                continue  # labels unknown: left out; ensure() keeps its ADD waiting
            hit = cache.get(cid)
            if hit is not None and hit[0] is alloc and hit[1] is known:
                entry = hit
            else:
                addrs = _addresses(alloc)
                local = attrs.evolve(
                    known, addresses=addrs, node=self.node, host_veth=self.host_ifname(cid), selectable=True
                )
                entry = (alloc, known, local, addrs)
            fresh[cid] = entry
            pods.append(entry[2])
            covered[cid] = entry[3]
        self._local_cache = fresh
        return pods, covered

    async def ensure(self, alloc: Allocation) -> None:
        """Return once the kernel holds a ruleset compiled with *alloc* as a local pod, and its hostPorts.

        The caller bounds the wait (ADD's deadline); a cancelled wait changes nothing.
        """
        ports = hostports_of(alloc)
        # A container without a Kubernetes Pod (podman, nerdctl): no policy can select it, and as a
        # peer it is matched by its addresses (ipBlock) alone — only its hostPorts to wait for.
        want = _addresses(alloc) if alloc.namespace else None
        if want is None and not ports:
            return
        cid = alloc.container_id
        while True:
            applied = self._applied
            if (
                applied is not None
                and (want is None or applied.covered.get(cid) == want)
                and applied.mapped.get(cid, ()) == ports
            ):
                return
            if self._last_error is not None:
                # Fail closed and fast: waiting out ADD's deadline would leave the runtime 25 s per pod
                # and a pending row behind; 11 says "retry", and the service keeps retrying the apply.
                raise PolicyNotEnforceable(
                    "NetworkPolicy cannot be enforced on this node yet",
                    f"nftables refused the ruleset (retrying): {self._last_error[:300]}",
                )
            await self._applied_event.wait()

    async def wait_applied(self, generation: int) -> None:
        """Return once the kernel holds a ruleset made from the inputs' *generation* or a later one.

        The caller bounds the wait (a refused transaction is retried, not reported here)."""
        while self._applied is None or self._applied.generation < generation:
            await self._applied_event.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Apply, then follow changes; started() at once (readiness says whether a ruleset is in)."""
        if self.readiness is not None:
            self.readiness.close_gate(POLICY_GATE, WAITING_FOR_WATCHERS)
        async with trio.open_nursery() as nursery:
            self._background = nursery
            if self.watermark is not None:
                nursery.start_soon(self._follow_watermark)
            nursery.start_soon(self._read_counters)
            nursery.start_soon(self._follow_inputs)
            nursery.start_soon(self._follow_local)
            task_status.started()
            await self._apply_loop()

    async def _apply_loop(self) -> None:
        attempt = 0
        self._engine = self._journal = None  # a restarted service starts from the inputs as they are
        seen: tuple[int, Mapping[str, Allocation], tuple[NatFamily, ...]] | None = None  # what it was made from
        while True:
            generation = self.inputs.generation
            mark = self.watermark.watermark if self.watermark is not None else 0
            local_version = self.local.version
            allocations = dict(self.local.allocations)  # a copy: the owner's view may be live
            nat = nat_plan(self.nodeconfig()) if self.nodeconfig is not None else ()
            # The node's state changes for many reasons (readiness, NodeConfig): only the
            # watchers' inputs and this node's attachments matter here.
            # Before start-up has rebuilt this node's attachments the view is empty, not true: a table
            # compiled from it would drop every running pod's chains. The table in the kernel (a previous
            # agent's) stays until then; ADD cannot be served before it either.
            if self.inputs.complete and self.local.allocations_loaded and seen != (generation, allocations, nat):
                try:
                    await self._apply(generation, mark, allocations, nat)
                    attempt = 0
                    seen = (generation, allocations, nat)
                except NftError as exc:
                    # The engine has moved on; the applier, knowing no more what the kernel holds,
                    # replaces the table with the engine's whole ruleset on the next attempt.
                    self._failed(exc)
                    delay = self.backoff.delay(attempt, self.rand())
                    attempt += 1
                    log.error(
                        "nftables refused the policy ruleset; retrying in %.1f s",
                        delay,
                        extra={"op": "policy", "error": str(exc)[:500], "attempt": attempt},
                    )
                    await trio.sleep(delay)
                    continue
            await self._wait_for_change(generation, local_version)

    def _follow(self, local: list[PolicyPod]) -> RulesetChange:
        """The engine's change for the inputs' writes since the last call, and *local* (no await in here)."""
        if self._engine is None or self._journal is None:
            self._journal = self.inputs.journal()  # with the whole read: nothing can come between them
            self._engine = PolicyEngine(self.inputs)
            self._engine.load(local)
        else:
            self._engine.update(self._journal.drain(), local)
        return self._engine.change()

    def _with_node(
        self, change: RulesetChange, nat: tuple[NatFamily, ...], hostports: tuple[HostPort, ...] = ()
    ) -> RulesetChange:
        """*change* with this node's natOutgoing and hostPorts in its ruleset (the same structure
        object while none of the three changed: pod churn stays a set-element update)."""
        if not nat and not hostports:
            return change
        structure = change.structure
        cached = self._node_rules
        if cached is not None and cached[0] is structure and cached[1] == nat and cached[2] == hostports:
            with_node = cached[3]
        else:
            with_node = attrs.evolve(structure, nat=nat, hostports=hostports)
            self._node_rules = (structure, nat, hostports, with_node)
        whole = change.whole
        return attrs.evolve(
            change, structure=with_node, materialize=lambda: attrs.evolve(whole(), nat=nat, hostports=hostports)
        )

    async def _apply(
        self, generation: int, mark: int, allocations: Mapping[str, Allocation], nat: tuple[NatFamily, ...] = ()
    ) -> None:
        started = time.perf_counter()
        local, covered = self.local_pods(allocations)
        mapped = {cid: ports for cid, a in allocations.items() if a.port_mappings and (ports := hostports_of(a))}
        hostports = tuple(sorted((hp for ports in mapped.values() for hp in ports), key=HostPort.sort_key))
        change = self._with_node(self._follow(local), nat, hostports)
        before = self._applied.ruleset.hostports if self._applied is not None else ()
        result = await self.applier.apply_change(change)
        seconds = time.perf_counter() - started
        self._forget_new_flows(before, change.structure.hostports)
        mode = getattr(result, "mode", "full")
        structure = change.structure
        pods_by_veth = {p.host_veth: (p.namespace, p.name) for p in local if p.host_veth is not None}
        self._applied = _Applied(generation, structure, covered, pods_by_veth, mapped)
        self._applied_event.set()
        self._applied_event = trio.Event()
        self._last_error = None
        if self.readiness is not None:
            self.readiness.open_gate(POLICY_GATE)
        if self.metrics is not None and mode != "unchanged":
            self.metrics.applied(structure, mode, seconds)
        self._report_cluster()
        self._publish(mark)
        if self.watermark is not None and self.inputs.generation == generation:
            # Progress that arrived while the transaction ran (no change since this generation): it is in
            # too.  _follow_watermark skipped it then (generation not applied yet) and waits for more.
            self._publish(self.watermark.watermark)
        if mode != "unchanged":
            log.info(
                "policy ruleset applied",
                extra={
                    "op": "policy",
                    "mode": mode,
                    "seconds": round(seconds, 4),
                    "generation": generation,
                    "resource_version": mark,
                    "policies": len(self.inputs.policies),
                    "cluster_policies": len(self.inputs.cluster_policies),
                    "local_pods": len(local),
                    **getattr(result, "summary", {}),
                },
            )

    def _forget_new_flows(self, before: tuple[HostPort, ...], after: tuple[HostPort, ...]) -> None:
        """UDP/SCTP mappings that are new in the kernel: their ports' conntrack entries go (in the background)."""
        if self.forget_flows is None or self._background is None or before == after:
            return
        old = set(before)
        ports = tuple(
            sorted(
                {
                    (hp.protocol.value.lower(), hp.host_port)
                    for hp in after
                    if hp.protocol is not L4.TCP and hp not in old
                }
            )
        )
        if ports:
            if not self._to_forget:
                self._background.start_soon(self._forget)
            self._to_forget.update(ports)

    async def _forget(self) -> None:
        assert self.forget_flows is not None
        await trio.sleep(self.forget_after)
        ports, self._to_forget = tuple(sorted(self._to_forget)), set()
        try:
            deleted = await self.forget_flows(ports)
        except (Fault, OSError) as exc:  # new flows are mapped all the same: say so, go on
            log.warning("could not clear conntrack for new hostPorts", extra={"op": "policy", "error": str(exc)[:300]})
            return
        if deleted:
            log.info("cleared conntrack entries of flows to new hostPorts", extra={"op": "policy", "entries": deleted})

    def _report_cluster(self) -> None:
        """Log what is new among the ClusterNetworkPolicies compiled with: rules that fail closed, and
        policies sharing tier and priority (ordered by name, which the CRD leaves to the implementation)."""
        current = frozenset(self.inputs.cluster_policies.values())
        if current == self._cluster_seen:
            return
        for cnp in sorted(current - self._cluster_seen, key=lambda p: p.name):
            rules = cnp.unreadable_rules()
            if rules:
                log.warning(
                    "ClusterNetworkPolicy %s: %d rule(s) fail closed (Accept: match nothing; Deny, Pass: deny all)",
                    cnp.name,
                    len(rules),
                    extra={"op": "policy", "policy": cnp.name, "rules": rules[:25]},
                )
        groups: dict[tuple[str, int], list[str]] = {}
        for cnp in current:
            groups.setdefault((cnp.tier.value, cnp.priority), []).append(cnp.name)
        ties = frozenset((t, p, tuple(sorted(names))) for (t, p), names in groups.items() if len(names) > 1)
        for tier, priority, names in sorted(ties - self._ties_seen):
            log.warning(
                "ClusterNetworkPolicies share tier %s and priority %d: flock orders them by name",
                tier,
                priority,
                extra={"op": "policy", "tier": tier, "priority": priority, "policies": list(names[:25])},
            )
        self._cluster_seen, self._ties_seen = current, ties
        if self.metrics is not None:
            for level in Tier:
                self.metrics.cluster_policies.labels(tier=level.value).set(sum(1 for c in current if c.tier is level))
            self.metrics.failing_closed.set(sum(len(c.unreadable_rules()) for c in current))
            self.metrics.priority_ties.set(sum(len(names) for _, _, names in ties))

    @property
    def applied_resource_version(self) -> int:
        return self._mark

    def _publish(self, mark: int) -> None:
        if mark > self._mark:
            self._mark = mark
            if self.metrics is not None:
                self.metrics.applied_resource_version.set(mark)

    def _failed(self, exc: NftError) -> None:
        self._failures += 1
        self._last_error = str(exc)[:500]
        # Wake the ADDs waiting in ensure(): they answer "retry later" now rather than at their deadline.
        self._applied_event.set()
        self._applied_event = trio.Event()
        if self.metrics is not None:
            self.metrics.failures.inc()
        if self.readiness is not None:
            first_line = (exc.stderr.strip().splitlines() or [""])[0][:200]
            self.readiness.close_gate(POLICY_GATE, f"nftables refused the ruleset: {first_line}")

    async def _wait_for_change(self, generation: int, local_version: int) -> None:
        """Until the watchers' inputs are newer than *generation* or this node's
        attachments than *local_version* (at once if already so).

        Two long-lived followers (:meth:`_follow_inputs`, :meth:`_follow_local`)
        poke one event, rather than two tasks started and cancelled per change."""
        while self.inputs.generation == generation and self.local.version == local_version:
            await self._poked.wait()

    def _poke(self) -> None:
        self._poked.set()
        self._poked = trio.Event()

    async def _follow_inputs(self) -> None:
        generation = -1
        while True:
            generation = await self.inputs.wait_generation(generation)
            self._poke()

    async def _follow_local(self) -> None:
        version = -1
        while True:
            version = await self.local.wait_changed(version)
            self._poke()

    async def _follow_watermark(self) -> None:
        """Between changes BOOKMARKs move the watermark on: publish it while the applied generation is the newest."""
        assert self.watermark is not None
        seen = 0
        while True:
            seen = await self.watermark.wait_watermark(seen + 1)
            applied = self._applied
            if applied is None:
                continue
            if applied.generation == self.inputs.generation:
                self._publish(self.watermark.watermark)  # read with the generation check, no await between

    async def _read_counters(self) -> None:
        while True:
            await trio.sleep(self.counters_every)
            applied = self._applied
            if applied is None or self.metrics is None:
                continue
            try:
                per_chain = await self.applier.counters()
            except (NftError, OSError, ValueError) as exc:  # OSError: the netlink rule dump
                log.warning("could not read the policy counters", extra={"op": "policy", "error": str(exc)[:300]})
                continue
            self.metrics.counters(applied.ruleset, per_chain, applied.pods_by_veth)
