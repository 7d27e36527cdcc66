"""The node's running state, with one owner: :class:`NodeState`.

What the agent knows about its node *right now* lives here and nowhere else:
the NodeConfig in force (and whether the API server's copy was deleted or
refused), the allocation view (every allocation this agent holds, pending
ones included), readiness as named gates each with the reason it is closed,
the degraded-but-serving notes, which node blocks are out of addresses, and
what the uplink carries (so the MTU new pods get).

Each part has exactly one way to change it (a method named for the change)
and every change bumps :attr:`NodeState.version` and wakes
:meth:`NodeState.wait_changed`: observers (the BIRD follower, tests) wait for
a version newer than the one they last saw, then read what they need.  Pull
readers (STATUS, ADD, ``/readyz``, metrics) just read.  Nothing here does I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence

import attrs
import trio

from flock.model import Allocation, AllocationState, NodeConfig, PodInfo, ServiceRoutes, UplinkMtu
from flock.state._mtu import PodMtu, pod_mtu

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# The gate :meth:`NodeState.nodeconfig_observed` keeps (when declared): closed
# until a valid NodeConfig for this node has been seen.
NODECONFIG_GATE = "nodeconfig"
_NODECONFIG_NOTES = ("nodeconfig-deleted", "nodeconfig-refused")


@attrs.frozen
class Gate:
    """One condition readiness waits for: ``name`` is how services refer to it,
    ``label`` prefixes its reason in ``/readyz`` (``"ADD not served: "``)."""

    name: str
    initial_reason: str
    label: str = ""


def _gates(gates: Iterable[Gate]) -> tuple[Gate, ...]:
    return tuple(gates)


@attrs.define(eq=False)
class NodeState:
    """The one owner of the node's running state (see the module doc).

    ``gates`` are declared by the composition root, in the order ``/readyz``
    lists them; a gate not declared cannot be changed (a typo would otherwise
    hide a readiness condition).
    """

    node_name: str
    gates: Sequence[Gate] = attrs.field(converter=_gates, default=())
    # bytes a tunnel adds to pod packets between nodes (WireGuard's: flock.state.WIREGUARD_OVERHEAD; 0: none)
    tunnel_overhead: int = 0
    _nodeconfig: NodeConfig | None = attrs.field(init=False, default=None)
    _nodeconfig_deleted: bool = attrs.field(init=False, default=False)
    _nodeconfig_refused: str | None = attrs.field(init=False, default=None)
    _uplink_mtu: UplinkMtu | None = attrs.field(init=False, default=None)
    _allocations: dict[str, Allocation] = attrs.field(init=False, factory=dict)
    _allocations_loaded: bool = attrs.field(init=False, default=False)
    _exhausted: tuple[Network, ...] = attrs.field(init=False, default=())
    _closed: dict[str, str] = attrs.field(init=False, factory=dict)
    _notes: dict[str, str] = attrs.field(init=False, factory=dict)
    _version: int = attrs.field(init=False, default=0)
    _changed: trio.Event = attrs.field(init=False, factory=trio.Event)
    _declared: frozenset[str] = attrs.field(init=False, factory=frozenset)
    _pods: Mapping[str, PodInfo] | None = attrs.field(init=False, default=None)
    # BGP passwords by peer name, read from Secrets: never in a repr or a log.
    _bgp_passwords: dict[str, str] = attrs.field(init=False, factory=dict, repr=False)
    _service_routes: tuple[ServiceRoutes, ...] = attrs.field(init=False, default=())
    _leaving: frozenset[str] = attrs.field(init=False, default=frozenset())
    _leave_withdrawn: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        names = [g.name for g in self.gates]
        if len(set(names)) != len(names):
            raise ValueError(f"gates declared twice: {names}")
        self._declared = frozenset(names)
        self._closed = {g.name: g.initial_reason for g in self.gates}

    # -- observing -----------------------------------------------------------

    @property
    def version(self) -> int:
        """Bumped by every change; compare with what :meth:`wait_changed` returned."""
        return self._version

    async def wait_changed(self, since: int) -> int:
        """The current version as soon as it differs from *since* (at once if it
        already does).  Level-triggered, so a slow observer misses no final
        state, only intermediate ones.  Waits forever: the caller owns the deadline."""
        while self._version == since:
            await self._changed.wait()
        return self._version

    def _bump(self) -> None:
        self._version += 1
        self._changed.set()
        self._changed = trio.Event()

    # -- the NodeConfig ------------------------------------------------------

    @property
    def nodeconfig(self) -> NodeConfig | None:
        """This node's NodeConfig in force: the last valid one the API server
        had (kept when it is deleted or replaced by an invalid one)."""
        return self._nodeconfig

    @property
    def nodeconfig_deleted(self) -> bool:
        return self._nodeconfig_deleted

    @property
    def nodeconfig_refused(self) -> str | None:
        """Why the newest NodeConfig on the API server was refused (None: accepted)."""
        return self._nodeconfig_refused

    def nodeconfig_observed(self, current: NodeConfig | None, *, deleted: bool, refused: str | None) -> None:
        """What the NodeConfig watcher sees: the last valid value, whether the
        object is gone from the server, why the newest one was refused."""
        # A watcher that starts afresh (a new API connection) and first sees an
        # invalid object has no valid value yet: the one in force stays.
        current = current if current is not None else self._nodeconfig
        if (current, deleted, refused) == (self._nodeconfig, self._nodeconfig_deleted, self._nodeconfig_refused):
            return
        self._nodeconfig, self._nodeconfig_deleted, self._nodeconfig_refused = current, deleted, refused
        node = self.node_name
        self._put_note(
            "nodeconfig-deleted",
            f"NodeConfig {node} was deleted; existing pods keep the last one seen (cidr6 {current.cidr6}), "
            "ADD waits: recreate it, or drain the node before removing flock"
            if current is not None and deleted
            else None,
        )
        self._put_note(
            "nodeconfig-refused",
            f"NodeConfig {node} update refused ({refused}); serving with the previous one"
            if current is not None and refused is not None
            else None,
        )
        if NODECONFIG_GATE in self._declared:
            if current is None:
                self._closed[NODECONFIG_GATE] = f"NodeConfig {node} not loaded" + (f" ({refused})" if refused else "")
            else:
                self._closed.pop(NODECONFIG_GATE, None)
        self._bump()

    # -- the MTU --------------------------------------------------------------

    @property
    def uplink_mtu(self) -> UplinkMtu | None:
        """The last reading of the default route's interface (None: not read yet)."""
        return self._uplink_mtu

    def uplink_mtu_observed(self, uplink: UplinkMtu) -> None:
        if uplink != self._uplink_mtu:
            self._uplink_mtu = uplink
            self._bump()

    @property
    def pod_mtu(self) -> PodMtu:
        """The MTU in force for new pods and where it came from (see :func:`flock.state.pod_mtu`).
        Existing pods keep the one they were set up with."""
        return pod_mtu(self._nodeconfig, self._uplink_mtu, self.tunnel_overhead)

    # -- the allocation view -------------------------------------------------

    @property
    def allocations(self) -> Mapping[str, Allocation]:
        """Every allocation this agent holds, pending ones included (read-only view)."""
        return self._allocations

    @property
    def allocations_loaded(self) -> bool:
        """True once start-up has rebuilt the view from the store."""
        return self._allocations_loaded

    def load_allocations(self, rows: Iterable[Allocation]) -> None:
        """Replace the whole view (start-up's rebuild from the store)."""
        self._allocations = {a.container_id: a for a in rows}
        self._allocations_loaded = True
        self._bump()

    def put_allocation(self, allocation: Allocation) -> None:
        if self._allocations.get(allocation.container_id) == allocation:
            return
        self._allocations[allocation.container_id] = allocation
        self._bump()

    def drop_allocation(self, container_id: str) -> None:
        if self._allocations.pop(container_id, None) is not None:
            self._bump()

    def allocation_counts(self) -> dict[AllocationState, int]:
        counts = dict.fromkeys(AllocationState, 0)
        for alloc in self._allocations.values():
            counts[alloc.state] += 1
        return counts

    # -- the pods on this node (for health-aware anycast) ---------------------

    @property
    def pods(self) -> Mapping[str, PodInfo] | None:
        """The pod informer's cache ("namespace/name" → PodInfo) while it runs, else None."""
        return self._pods

    def pods_observed(self, pods: Mapping[str, PodInfo] | None) -> None:
        """The pod watcher's live cache (None: no watcher running)."""
        self._pods = pods
        self._bump()

    def pods_changed(self) -> None:
        """A pod in the cache changed readiness, appeared or went."""
        self._bump()

    # -- BGP passwords -------------------------------------------------------

    @property
    def bgp_passwords(self) -> Mapping[str, str]:
        """Passwords by peer name, as read from the Secrets the NodeConfig names."""
        return self._bgp_passwords

    def set_bgp_passwords(self, passwords: Mapping[str, str]) -> None:
        if dict(passwords) != self._bgp_passwords:
            self._bgp_passwords = dict(passwords)
            self._bump()

    # -- Service routes ------------------------------------------------------

    @property
    def service_routes(self) -> tuple[ServiceRoutes, ...]:
        """The Service addresses this node announces, by pool (the service proxy's announcements)."""
        return self._service_routes

    def set_service_routes(self, routes: Iterable[ServiceRoutes]) -> None:
        routes = tuple(routes)
        if routes != self._service_routes:
            self._service_routes = routes
            self._bump()

    @property
    def leaving(self) -> frozenset[str]:
        """Why this node is leaving (agent stopping, node cordoned, excluded from load balancers); empty:
        it is not.  Leaving, its Service routes carry GRACEFUL_SHUTDOWN, then are withdrawn."""
        return self._leaving

    def set_leaving(self, reason: str, on: bool) -> None:
        leaving = self._leaving | {reason} if on else self._leaving - {reason}
        if leaving != self._leaving:
            self._leaving = leaving
            if not leaving:
                self._leave_withdrawn = False
            self._bump()

    @property
    def leave_withdrawn(self) -> bool:
        """Leaving, and past the graceful-shutdown period: only the last-resort routes stay."""
        return self._leave_withdrawn

    def set_leave_withdrawn(self, withdrawn: bool) -> None:
        withdrawn = withdrawn and bool(self._leaving)
        if withdrawn != self._leave_withdrawn:
            self._leave_withdrawn = withdrawn
            self._bump()

    # -- pool exhaustion -----------------------------------------------------

    @property
    def exhausted(self) -> tuple[Network, ...]:
        """Node blocks of the default families with no free address (STATUS answers 50)."""
        return self._exhausted

    def set_exhausted(self, blocks: Iterable[Network]) -> None:
        blocks = tuple(blocks)
        if blocks != self._exhausted:
            self._exhausted = blocks
            self._bump()

    # -- readiness -----------------------------------------------------------

    def open_gate(self, gate: str) -> None:
        self._set_gate(gate, None)

    def close_gate(self, gate: str, reason: str) -> None:
        self._set_gate(gate, reason)

    def _set_gate(self, gate: str, reason: str | None) -> None:
        if gate not in self._declared:
            raise KeyError(f"readiness gate {gate!r} was not declared")
        if self._closed.get(gate) == reason:
            return
        if reason is None:
            del self._closed[gate]
        else:
            self._closed[gate] = reason
        self._bump()

    def reason(self, gate: str) -> str:
        """Why *gate* is closed; empty when it is open."""
        return self._closed.get(gate, "")

    def not_ready(self) -> list[str]:
        """Every closed gate's reason, in declaration order (empty: ready)."""
        return [g.label + self._closed[g.name] for g in self.gates if g.name in self._closed]

    @property
    def ready(self) -> bool:
        return not self._closed

    # -- degraded-but-serving notes ------------------------------------------

    def set_note(self, topic: str, text: str | None) -> None:
        """A degraded state that does not stop ADD (None: resolved)."""
        if self._notes.get(topic) != text:
            self._put_note(topic, text)
            self._bump()

    def _put_note(self, topic: str, text: str | None) -> None:
        if text is None:
            self._notes.pop(topic, None)
        else:
            self._notes[topic] = text

    def notes(self) -> list[str]:
        """The NodeConfig's notes first (deleted, refused), then the others as they came."""
        own = [self._notes[t] for t in _NODECONFIG_NOTES if t in self._notes]
        return own + [text for topic, text in self._notes.items() if topic not in _NODECONFIG_NOTES]
