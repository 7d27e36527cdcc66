"""The services table kept up to date change by change: work in proportion to what changed.

:class:`ServicesEngine` holds each Service's compiled piece (:func:`compile_service`: its chains,
affinity sets, claims on the shared maps' keys, ClusterIP members, health check) and the table
they add up to.  Given the keys of the Services and EndpointSlices written since the last call
(:class:`flock.services.ServiceJournal`), :meth:`ServicesEngine.update` recompiles only the
Services those keys touch — a Service's own key, and for a slice the Service its
``kubernetes.io/service-name`` label names (the old and the new one when the label changed) — and
returns a :class:`TableDelta`: the table's touched names before and after, which
:func:`render_update` turns into one transaction (an endpoint turning unready: a handful of lines).

It is held to :func:`compile_table`, the reference: after any sequence of updates,
:meth:`ServicesEngine.table` equals ``compile_table`` of the same inputs, including which Service
keeps a map key two claim (the first by namespace/name; when it goes, the next takes over), which
Service's health check a shared healthCheckNodePort answers for (the last, as compile_table lets
it overwrite), and the conflicts reported.

A change of the node's addresses or of the config (:meth:`ServicesEngine.rebuild`) recompiles
every Service, except a change of the allow-list alone (``update(..., allow=)``): only the Services
with external addresses; :meth:`table` builds the whole value (for a full load or a comparison), in time
proportional to the table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from . import _nft
from ._compile import (
    Claim,
    Element,
    NodeView,
    ServicePiece,
    ServicesConfig,
    Space,
    compile_service,
    conflict,
    node_members,
    slice_owner,
)
from ._conntrack import StaleFlows, stale_flows
from ._model import EndpointSlice, Service
from ._pools import AllowList
from ._table import AffinitySet, Counted, HealthCheck, ServicesTable

ServiceId = tuple[str, str]  # (namespace, name): the order compile_table gives Services
_ABSENT = object()


@attrs.frozen
class TableDelta:
    """What one update touched: *before* and *after* hold only the touched chains, sets and elements
    (each as it was and as it is), so ``render_update(before, after)`` is the change as one transaction."""

    before: ServicesTable
    after: ServicesTable
    health_changed: bool = False
    services: int = 0  # Services recompiled

    def script(self) -> str:
        """The transaction ("" when nothing changed in the kernel's view)."""
        text = _nft.render_update(self.before, self.after)
        assert text is not None, "the skeleton does not change in an update"
        return text


@attrs.define(eq=False)
class _Touched:
    """The value each touched name had before the update (``_ABSENT``: it had none)."""

    chains: dict[str, object] = attrs.field(factory=dict)
    sets: dict[str, object] = attrs.field(factory=dict)
    elements: dict[tuple[str, str], object] = attrs.field(factory=dict)
    after: dict[tuple[str, str], object] = attrs.field(factory=dict)  # map elements: the value now (_ABSENT: none)
    health: bool = False


@attrs.define(eq=False)
class ServicesEngine:
    """The services table of *node* under *config*, as pieces per Service and the sum of them."""

    node: NodeView
    config: ServicesConfig
    _services: dict[ServiceId, Service] = attrs.field(init=False, factory=dict)
    _service_keys: dict[str, ServiceId] = attrs.field(init=False, factory=dict)  # inputs key → id
    _slices: dict[str, EndpointSlice] = attrs.field(init=False, factory=dict)  # the slices that feed a Service
    # each Service's slices' keys (a tuple: almost always one or two; a dict costs four times more)
    _slices_of: dict[ServiceId, tuple[str, ...]] = attrs.field(init=False, factory=dict)
    _pieces: dict[ServiceId, ServicePiece] = attrs.field(init=False, factory=dict)
    # the table, summed
    _chains: dict[str, tuple[str, ...]] = attrs.field(init=False, factory=dict)
    _sets: dict[str, AffinitySet] = attrs.field(init=False, factory=dict)
    _counted: dict[tuple[str, str], Counted] = attrs.field(init=False, factory=dict)
    _elements: dict[str, dict[str, str | None]] = attrs.field(init=False, factory=dict)  # the sets' members
    _members: dict[tuple[str, str], int] = attrs.field(init=False, factory=dict)  # set element → holders
    _shared: dict[str, int] = attrs.field(init=False, factory=dict)  # shared chain → the pieces using it
    _claimants: dict[Space, tuple[ServiceId, ...]] = attrs.field(init=False, factory=dict)
    _held: dict[Space, Claim] = attrs.field(init=False, factory=dict)  # what the maps hold: each space's winner's
    _held_count: int = attrs.field(init=False, default=0)
    _health_claimants: dict[int, set[ServiceId]] = attrs.field(init=False, factory=dict)
    _health: dict[int, HealthCheck] = attrs.field(init=False, factory=dict)
    _conflicts: dict[ServiceId, tuple[str, ...]] = attrs.field(init=False, factory=dict)
    _touched: _Touched = attrs.field(init=False, factory=_Touched)
    _stale: list[StaleFlows] = attrs.field(init=False, factory=list)
    _tracking: bool = attrs.field(init=False, default=True)  # record what each change touched (not in load)

    def __attrs_post_init__(self) -> None:
        self._reset_sums()

    # --- reading ---------------------------------------------------------------------------------------------

    @property
    def health_checks(self) -> Mapping[int, HealthCheck]:
        return dict(self._health)

    @property
    def counted(self) -> Mapping[tuple[str, str], Counted]:
        return self._counted

    def slices_of(self, service: Service) -> list[EndpointSlice]:
        """The slices that feed *service* (as the engine holds them)."""
        return [self._slices[key] for key in self._slices_of.get((service.namespace, service.name), ())]

    @property
    def services(self) -> int:
        """Services translated (a piece in the table)."""
        return len(self._pieces)

    @property
    def chains(self) -> int:
        return len(self._chains)

    @property
    def elements(self) -> int:
        return sum(len(e) for e in self._elements.values()) + self._held_count

    @property
    def conflicts(self) -> tuple[str, ...]:
        """As compile_table reports them: by Service (namespace, name), each in the order of its claims."""
        return tuple(c for sid in sorted(self._conflicts) for c in self._conflicts[sid])

    def table(self) -> ServicesTable:
        """The whole table as a value (a copy: proportional to the table)."""
        elements: dict[str, dict[str, str | None]] = {name: dict(e) for name, e in self._elements.items()}
        for claim in self._held.values():
            for (name, key), value in claim.elements().items():
                elements[name][key] = value
        return ServicesTable(
            skeleton=self.config.skeleton,
            chains=dict(self._chains),
            affinity_sets=dict(self._sets),
            elements={name: frozenset(e.items()) for name, e in elements.items()},
            health_checks=dict(self._health),
            conflicts=self.conflicts,
            counted=dict(self._counted),
        )

    # --- changing --------------------------------------------------------------------------------------------

    def load(self, services: Mapping[str, Service], slices: Mapping[str, EndpointSlice]) -> None:
        """Take every Service and slice, recording no delta: what follows is a whole table (:meth:`table`).
        A first load of 10,000 Services × 10 endpoints makes no element's text (a delta would, for all)."""
        self._tracking = False
        try:
            self.update(services, slices, services.keys(), slices.keys())
        finally:
            self._tracking = True
            self._touched = _Touched()

    def update(
        self,
        services: Mapping[str, Service],
        slices: Mapping[str, EndpointSlice],
        service_keys: Iterable[str],
        slice_keys: Iterable[str],
        allow: AllowList | None = None,
    ) -> TableDelta:
        """Follow the written keys (*services*, *slices*: the inputs now); the touched part of the table.
        With *allow*, another allow-list (the LoadBalancerPools changed): the Services with external
        addresses are compiled again too (no other Service depends on it)."""
        dirty: set[ServiceId] = set()
        if allow is not None and allow != self.config.allow:
            self.config = attrs.evolve(self.config, allow=allow)
            dirty.update(sid for sid, svc in self._services.items() if svc.external_ips or svc.load_balancer_ips)
        for key in service_keys:
            old = self._service_keys.pop(key, None)
            if old is not None:
                self._services.pop(old, None)
                dirty.add(old)
            svc = services.get(key)
            if svc is not None:
                sid = (svc.namespace, svc.name)
                self._service_keys[key] = sid
                self._services[sid] = svc
                dirty.add(sid)
        for key in slice_keys:
            before = self._slices.pop(key, None)
            if before is not None:
                owner = slice_owner(before)
                assert owner is not None
                held = tuple(k for k in self._slices_of[owner] if k != key)
                if held:
                    self._slices_of[owner] = held
                else:
                    del self._slices_of[owner]
                dirty.add(owner)
            eps = slices.get(key)
            owner = slice_owner(eps) if eps is not None else None
            if eps is not None and owner is not None:
                self._slices[key] = eps
                self._slices_of[owner] = (*self._slices_of.get(owner, ()), key)
                dirty.add(owner)
        for sid in sorted(dirty):
            self._recompile(sid)
        return self._delta(len(dirty))

    def rebuild(self, node: NodeView, config: ServicesConfig) -> TableDelta:
        """Another node view or config: every Service compiled again (the delta is still the difference)."""
        for name, member in node_members(self.node, self.config):
            self._member(name, member, -1)
        self.node, self.config = node, config
        for name, member in node_members(node, config):
            self._member(name, member, +1)
        for sid in sorted(self._pieces.keys() | self._services.keys()):
            self._recompile(sid)
        return self._delta(len(self._services))

    def _reset_sums(self) -> None:
        for name in _nft.skeleton_names():
            self._elements[name] = {}
        for name, member in node_members(self.node, self.config):
            self._member(name, member, +1)
        self._touched = _Touched()

    def _delta(self, services: int) -> TableDelta:
        touched, self._touched = self._touched, _Touched()
        skeleton = self.config.skeleton
        before_chains = {n: v for n, v in touched.chains.items() if v is not _ABSENT}
        before_sets = {n: v for n, v in touched.sets.items() if v is not _ABSENT}
        before_elements: dict[str, set[tuple[str, str | None]]] = {}
        after_elements: dict[str, set[tuple[str, str | None]]] = {}
        for (name, key), verdict in touched.elements.items():
            if verdict is not _ABSENT:
                before_elements.setdefault(name, set()).add((key, verdict))  # type: ignore[arg-type]
            now = touched.after.get((name, key), _ABSENT) if (name, key) in touched.after else None
            if now is None:  # a member of a set
                if key in self._elements[name]:
                    after_elements.setdefault(name, set()).add((key, None))
            elif now is not _ABSENT:
                after_elements.setdefault(name, set()).add((key, now))  # type: ignore[arg-type]
        before = ServicesTable(
            skeleton=skeleton,
            chains=before_chains,  # type: ignore[arg-type]
            affinity_sets=before_sets,  # type: ignore[arg-type]
            elements={n: frozenset(e) for n, e in before_elements.items()},
        )
        after = ServicesTable(
            skeleton=skeleton,
            chains={n: self._chains[n] for n in touched.chains if n in self._chains},
            affinity_sets={n: self._sets[n] for n in touched.sets if n in self._sets},
            elements={n: frozenset(e) for n, e in after_elements.items()},
        )
        return TableDelta(before, after, touched.health, services)

    def _recompile(self, sid: ServiceId) -> None:
        svc = self._services.get(sid)
        new = None
        if svc is not None:
            mine = (self._slices[key] for key in self._slices_of.get(sid, ()))
            new = compile_service(svc, mine, self.node, self.config)
        old = self._pieces.pop(sid, None)
        if new is not None:
            self._pieces[sid] = new
        self._swap(sid, old, new)

    def take_stale(self) -> list[StaleFlows]:
        """The UDP flows the changes since the last call left stale (see :mod:`._conntrack`)."""
        stale, self._stale = self._stale, []
        return stale

    def _swap(self, sid: ServiceId, old: ServicePiece | None, new: ServicePiece | None) -> None:
        old_udp = old.udp if old is not None else frozenset()
        new_udp = new.udp if new is not None else frozenset()
        if old_udp != new_udp:
            self._stale.extend(stale_flows(old_udp, new_udp))
        touched = self._touched
        old_chains = old.chains if old is not None else {}
        new_chains = new.chains if new is not None else {}
        for name in old_chains.keys() - new_chains.keys():
            touched.chains.setdefault(name, self._chains.get(name, _ABSENT))
            self._chains.pop(name, None)
        for name, rules in new_chains.items():
            if self._chains.get(name) != rules:
                touched.chains.setdefault(name, self._chains.get(name, _ABSENT))
                self._chains[name] = rules
        old_shared = old.shared if old is not None else {}
        new_shared = new.shared if new is not None else {}
        for name in old_shared.keys() - new_shared.keys():
            self._share(name, old_shared[name], -1)
        for name in new_shared.keys() - old_shared.keys():
            self._share(name, new_shared[name], +1)
        old_sets = old.sets if old is not None else {}
        new_sets = new.sets if new is not None else {}
        for name in old_sets.keys() - new_sets.keys():
            touched.sets.setdefault(name, self._sets.get(name, _ABSENT))
            self._sets.pop(name, None)
        for name, s in new_sets.items():
            if self._sets.get(name) != s:
                touched.sets.setdefault(name, self._sets.get(name, _ABSENT))
                self._sets[name] = s
        old_members = frozenset(old.members) if old is not None else frozenset()
        new_members = frozenset(new.members) if new is not None else frozenset()
        for name, member in old_members - new_members:
            self._member(name, member, -1)
        for name, member in new_members - old_members:
            self._member(name, member, +1)
        # key spaces: each is held by its first claimant; settle every space this Service touches
        old_spaces = set(old.claims) if old is not None else set()
        new_spaces = set(new.claims) if new is not None else set()
        for space in old_spaces - new_spaces:  # claimants as tuples: almost always one (a set costs 4 times more)
            claimants = tuple(c for c in self._claimants[space] if c != sid)
            if claimants:
                self._claimants[space] = claimants
            else:
                del self._claimants[space]
        for space in new_spaces - old_spaces:
            self._claimants[space] = (*self._claimants.get(space, ()), sid)
        rivals: set[ServiceId] = {sid}
        for space in old_spaces | new_spaces:
            self._settle(space)
            rivals.update(self._claimants.get(space, ()))
        for rival in rivals:
            self._conflicts_of(rival)
        # health checks: a port two Services name answers for the last of them (compile_table's overwrite)
        old_health = old.health[0] if old is not None and old.health is not None else None
        new_health = new.health[0] if new is not None and new.health is not None else None
        if old_health is not None and old_health != new_health:
            holders = self._health_claimants[old_health]
            holders.discard(sid)
            if not holders:
                del self._health_claimants[old_health]
        if new_health is not None:
            self._health_claimants.setdefault(new_health, set()).add(sid)
        for port in {old_health, new_health} - {None}:
            assert port is not None
            holding = self._health_claimants.get(port)
            check = None
            if holding:
                piece = self._pieces[max(holding)]
                assert piece.health is not None
                check = piece.health[1]
            if self._health.get(port) != check:
                touched.health = True
                if check is None:
                    del self._health[port]
                else:
                    self._health[port] = check

    def _member(self, name: str, member: str, step: int) -> None:
        count = self._members.get((name, member), 0) + step
        if count:
            self._members[(name, member)] = count
        else:
            del self._members[(name, member)]
        if (count == 0) != (member not in self._elements[name]):
            self._touched.elements.setdefault((name, member), self._elements[name].get(member, _ABSENT))
            if count:
                self._elements[name][member] = None
            else:
                del self._elements[name][member]

    def _share(self, name: str, rules: tuple[str, ...], step: int) -> None:
        count = self._shared.get(name, 0) + step
        if count:
            self._shared[name] = count
        else:
            del self._shared[name]
        if (count == 0) != (name not in self._chains):
            self._touched.chains.setdefault(name, self._chains.get(name, _ABSENT))
            if count:
                self._chains[name] = rules
            else:
                del self._chains[name]

    def _settle(self, space: Space) -> None:
        """Make the maps hold *space*'s winner's elements for it (none when nobody claims it)."""
        claimants = self._claimants.get(space)
        winner = self._pieces[min(claimants)] if claimants else None
        claim = winner.claims[space] if winner is not None else None
        held = self._held.pop(space, None)
        if held is not None:
            for element in held.entries:  # only entries are counted (never numbered endpoints)
                self._counted.pop(element, None)
        if claim is not None:
            assert winner is not None
            for element in claim.entries:
                counted = winner.counted.get(element)
                if counted is not None:
                    self._counted[element] = counted
            self._held[space] = claim
        self._held_count += (len(claim) if claim is not None else 0) - (len(held) if held is not None else 0)
        if not self._tracking or claim is held:
            return
        # the elements that differ, before and after (text made for this space only)
        want: dict[Element, str] = claim.elements() if claim is not None else {}
        have: dict[Element, str] = held.elements() if held is not None else {}
        touched = self._touched
        for element in have.keys() - want.keys():
            touched.elements.setdefault(element, have[element])
            touched.after[element] = _ABSENT
        for element, value in want.items():
            if have.get(element, _ABSENT) != value:
                touched.elements.setdefault(element, have.get(element, _ABSENT))
                touched.after[element] = value

    def _conflicts_of(self, sid: ServiceId) -> None:
        piece = self._pieces.get(sid)
        found: list[str] = []
        if piece is not None:
            for space in piece.claims:
                holder = min(self._claimants[space])
                if holder != sid:
                    found.append(conflict(f"{sid[0]}/{sid[1]}", space, f"{holder[0]}/{holder[1]}"))
        if found:
            self._conflicts[sid] = tuple(found)
        else:
            self._conflicts.pop(sid, None)
