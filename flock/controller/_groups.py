"""Address groups: flock-controller works out once what each node's policies need and writes it.

Informers (:mod:`flock.watchers`) keep every Pod, Namespace, NetworkPolicy and
ClusterNetworkPolicy in a :class:`flock.policy.PolicyInputs` — the same watchers
and values an agent used to run — plus the Nodes' names and the controller's own
AddressGroups and NodeAddressGroups.  A :class:`flock.policy._groups.GroupPlanner`
follows the inputs' journal; a :class:`flock.groups.SliceBook` cuts the groups
into slices and knows what the API server holds; each pass writes the
difference (see :mod:`flock.groups._slices` for the order).

**Passes.**  The first change after a quiet spell waits :data:`DEBOUNCE_S`, and
passes are at least :data:`MIN_INTERVAL_S` apart: under 100 pod changes a second
a pass takes what a tenth of a second brought, and one slice changed by several
pods is written once.  A remote change thus reaches an agent within about
``MIN_INTERVAL_S`` + one write + one watch event.

**Start.**  Nothing is written before every informer has listed: the book is
loaded from what the controller wrote before (members stay in their slices), then
the first pass writes what differs — after a restart, only what changed meanwhile.

**Writes.**  Each write is preceded, once a pass, by the Lease's fence (a writer
that lost the Lease writes nothing more) and carries the resourceVersion this
controller last saw of the object; a 409 or 404 re-reads that one object and the
next pass writes it again.  A write refused otherwise (422: a schema stricter than
ours) is logged with the object's name and retried at the next pass.
"""

from __future__ import annotations

import gc
import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import attrs
import trio

from flock.groups import (
    ADDRESS_GROUPS,
    NODE_GROUPS,
    SliceBook,
    Write,
    decode_members,
    decode_node_groups,
    slice_index,
)
from flock.model import InvalidObject
from flock.policy import InputChanges, PolicyInputs
from flock.policy import Kind as InputKind
from flock.policy._groups import GroupPlanner
from flock.watchers import (
    Change,
    ChangeType,
    Informer,
    InformerSettings,
    KubeApiError,
    ListWatchSource,
    PolicyWatcher,
)

from ._api import ApiRefused, Conflict, Kind, NotFound, ObjectApi
from ._reconcile import Fence

log = logging.getLogger("flock.controller.groups")

REFUSED_RETRY_S = 60.0  # the CRDs not installed (404) or not allowed (403): asked again this often
DEBOUNCE_S = 0.05
MIN_INTERVAL_S = 0.1
WRITERS = 8  # writes in flight at once
SETTINGS = InformerSettings(watch_seconds=300)
_PREFIX = "/apis/flock.fritzlab.net/v1alpha1"
ADDRESS_GROUP_KIND = Kind(_PREFIX, ADDRESS_GROUPS, False)
NODE_GROUPS_KIND = Kind(_PREFIX, NODE_GROUPS, False)


class GroupSources(Protocol):
    """Where the informers read (a :class:`flock.watchers.KubeClient`)."""

    def all_pods(self) -> ListWatchSource: ...

    def namespaces(self) -> ListWatchSource: ...

    def network_policies(self) -> ListWatchSource: ...

    def cluster_network_policies(self) -> ListWatchSource: ...

    def nodes(self) -> ListWatchSource: ...

    def address_groups(self, label_selector: str = "") -> ListWatchSource: ...

    def node_address_groups(self, node: str | None = None) -> ListWatchSource: ...


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


@attrs.frozen
class _Held:
    """What the controller keeps of one of its own objects: its version, and (for resuming) its content."""

    version: str
    content: Any


def _held_group(obj: Mapping[str, Any]) -> _Held:
    try:
        group, members, _ = decode_members(obj)
    except InvalidObject:
        return _Held(_version(obj), None)  # rewritten whole at the next pass
    return _Held(_version(obj), (group, members))


def _held_node(obj: Mapping[str, Any]) -> _Held:
    try:
        return _Held(_version(obj), decode_node_groups(obj))
    except InvalidObject:
        return _Held(_version(obj), None)


@attrs.define(eq=False)
class GroupController:
    """Runs while its elector leads; returns when fenced off (see the module doc)."""

    api: ObjectApi
    kube: GroupSources
    fence: Fence
    settings: InformerSettings = SETTINGS
    debounce_s: float = DEBOUNCE_S
    min_interval_s: float = MIN_INTERVAL_S
    passes: int = attrs.field(default=0, init=False)
    writes: int = attrs.field(default=0, init=False)
    failures: int = attrs.field(default=0, init=False)
    inputs: PolicyInputs = attrs.field(init=False, factory=PolicyInputs)
    planner: GroupPlanner = attrs.field(init=False)
    book: SliceBook = attrs.field(init=False, factory=SliceBook)
    _nodes: set[str] = attrs.field(init=False, factory=set)
    _groups_held: Informer = attrs.field(init=False)
    _nodes_held: Informer = attrs.field(init=False)
    _wake: trio.Event = attrs.field(init=False, factory=trio.Event)
    _nodes_moved: set[str] = attrs.field(init=False, factory=set)
    _versions: dict[tuple[str, str], int] = attrs.field(init=False, factory=dict)  # (kind, name) → newest written
    _members: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self.planner = GroupPlanner(self.inputs)

    async def run(self) -> None:
        """Follow and write while leading; the CRDs refused (not installed, RBAC) → off, asked again later."""
        while True:
            try:
                await self._run()
                return
            except KubeApiError as exc:
                if exc.status not in (403, 404):
                    raise
                log.warning(
                    "address groups off: AddressGroups refused (%s); asking again in %.0f s",
                    exc.status,
                    REFUSED_RETRY_S,
                    extra={"error": str(exc)[:300]},
                )
            await trio.sleep(REFUSED_RETRY_S)

    @property
    def members(self) -> int:
        """Members of every group planned (a pod in two groups counts twice), as of the last pass (read
        by /metrics on the event loop while the planner may be working on its thread)."""
        return self._members

    async def _run(self) -> None:
        # Each leadership starts afresh from the informers and what the API server holds (never from
        # what a previous term planned: another replica may have written since).
        self.inputs = PolicyInputs()
        self.planner = GroupPlanner(self.inputs)
        self.book = SliceBook()
        self._nodes, self._nodes_moved, self._versions = set(), set(), {}
        self._wake = trio.Event()
        watcher = PolicyWatcher(
            self.kube.network_policies(),
            self.kube.namespaces(),
            self.inputs,
            pods=self.kube.all_pods(),
            settings=self.settings,
            cluster_policies=self.kube.cluster_network_policies(),
            nodes=self.kube.nodes(),
        )
        custom = attrs.evolve(self.settings, watch_list=False)  # the custom-object calls have no sendInitialEvents
        self._groups_held = Informer(
            self.kube.address_groups(), _name, _ignore, custom, name="addressgroups (controller)", transform=_held_group
        )
        self._nodes_held = Informer(
            self.kube.node_address_groups(), _name, _ignore, custom, name="nodeaddressgroups", transform=_held_node
        )
        node_names = Informer(
            self.kube.nodes(), _name, self._node_changed, self.settings, name="nodes (controller)", transform=_none
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            for informer in (self._groups_held, self._nodes_held, node_names):
                await nursery.start(informer.run)
            while not watcher.synced:
                await self.inputs.wait_generation(self.inputs.generation)
            await self._follow()
            nursery.cancel_scope.cancel()

    def _node_changed(self, change: Change) -> None:
        if change.type is ChangeType.DELETED:
            self._nodes.discard(change.key)
        else:
            self._nodes.add(change.key)
        self._nodes_moved.add(change.key)
        self._wake.set()

    def _resume(self) -> None:
        """Load the book from what the API server holds of the controller's objects."""
        for name, held in self._groups_held.objects.items():
            content = held.content
            group = content[0] if content is not None else name.rpartition("-")[0]
            index = slice_index(group, name)
            if index is None:
                continue  # not one of ours by its name: left alone
            self.book.written_slice(group, index, content[1] if content is not None else {})
        for name, held in self._nodes_held.objects.items():
            self.book.written_node(name, held.content)

    async def _follow(self) -> None:
        # The planner works on a worker thread (a CNP's change renews every node's needs; the first load
        # reads every pod): the event loop stays free for the Lease's renewals and the informers.  It
        # reads a mirror of the inputs that only this task writes, between the thread's runs.
        live = self.inputs
        mirror = PolicyInputs()
        tables = _tables(live)
        for kind, table in tables.items():
            mirror.replace(kind, dict(table))
        journal = live.journal()  # (taken with the copy: no await between)
        # The generation the mirror holds: a change arriving while a pass writes or plans is after it, and
        # wakes the next pass (waiting past the generation current after the pass would sleep through it).
        seen = live.generation
        self.planner = GroupPlanner(mirror)
        mirrored = mirror.journal()
        self._resume()
        await trio.to_thread.run_sync(self._first_plan, frozenset(self._nodes))
        # What the first plan built lives as long as the term: out of the collector's sight, so a full
        # collection over ~a million objects does not stall a pass by a second (as the agent does at ready).
        gc.collect()
        gc.freeze()
        self._nodes_moved.clear()
        last = -math.inf
        while True:
            if not await self._write(self.book.pending()):
                return
            self.passes += 1
            await self._changed(seen)
            self._wake = trio.Event()
            await trio.sleep_until(max(trio.current_time() + self.debounce_s, last + self.min_interval_s))
            last = trio.current_time()
            seen, changes = live.generation, journal.drain()
            for kind, keys in _keys_of(changes).items():
                table = tables[kind]
                for key in keys:
                    value = table.get(key)
                    if value is None:
                        mirror.delete(kind, key)
                    else:
                        mirror.set(kind, key, value)
            moved, self._nodes_moved = self._nodes_moved, set()
            await trio.to_thread.run_sync(self._plan, mirrored.drain(), frozenset(moved), frozenset(self._nodes))

    def _first_plan(self, nodes: frozenset[str]) -> None:
        """(On a worker thread.)  Every group and every node's list, against what the book was resumed with."""
        self.planner.load()
        self.planner.drain()
        for name, group in self.planner.groups.items():
            self.book.set_group(name, group.spec, group.members)
        for node in nodes | set(self.planner.needs):
            self.book.set_node(node, self.planner.needs.get(node, frozenset()))
        self._members = sum(len(g.members) for g in self.planner.groups.values())

    def _plan(self, changes: InputChanges, nodes_moved: frozenset[str], nodes: frozenset[str]) -> None:
        """(On a worker thread.)  Follow *changes*; what moved goes into the book."""
        self.planner.update(changes)
        planned = self.planner.drain()
        for name in planned.created:
            group = self.planner.groups[name]
            self.book.set_group(name, group.spec, group.members)
        for name, moved in planned.members.items():
            self.book.move(name, moved)
        for name in planned.dropped:
            self.book.drop(name)
        for node in set(planned.nodes) | nodes_moved:
            if node in nodes or node in self.planner.needs:
                self.book.set_node(node, self.planner.needs.get(node, frozenset()))
            else:
                self.book.forget_node(node)
        self._members = sum(len(g.members) for g in self.planner.groups.values())

    async def _changed(self, generation: int) -> None:
        """Until the inputs move past *generation* or a Node comes or goes."""
        async with trio.open_nursery() as waiting:

            async def inputs_changed() -> None:
                await self.inputs.wait_generation(generation)
                waiting.cancel_scope.cancel()

            async def nodes_changed() -> None:
                await self._wake.wait()
                waiting.cancel_scope.cancel()

            waiting.start_soon(inputs_changed)
            waiting.start_soon(nodes_changed)

    async def _write(self, writes: list[Write]) -> bool:
        """Write *writes* in their order's three phases; False when fenced off."""
        if not writes:
            return True
        if not await self.fence():
            log.warning("lost the lease: writing no address group")
            for w in writes:
                self.book.failed(w)
            return False
        phases: list[list[Write]] = [[], [], []]
        for w in writes:
            phases[0 if w.kind == "AddressGroup" and w.body is not None else 1 if w.body is not None else 2].append(w)
        limit = trio.CapacityLimiter(WRITERS)
        for phase in phases:
            async with trio.open_nursery() as nursery:
                for w in phase:
                    nursery.start_soon(self._write_one, w, limit)
        return True

    async def _write_one(self, w: Write, limit: trio.CapacityLimiter) -> None:
        kind, held = (
            (ADDRESS_GROUP_KIND, self._groups_held)
            if w.kind == "AddressGroup"
            else (NODE_GROUPS_KIND, self._nodes_held)
        )
        async with limit:
            known = held.objects.get(w.name)
            # The newer of what the informer has seen and what this controller wrote (its cache may lag).
            version = max(
                int(known.version) if known is not None and known.version.isdigit() else 0,
                self._versions.get((w.kind, w.name), 0),
            )
            try:
                if w.body is None:
                    await self.api.delete(kind, w.name)
                    self._versions.pop((w.kind, w.name), None)
                    self.writes += 1
                    return
                if known is None and not version:
                    got = await self.api.create(kind, w.body)
                else:
                    body = {**w.body, "metadata": {**w.body["metadata"], "resourceVersion": str(version)}}
                    got = await self.api.replace(kind, body)
                self._versions[(w.kind, w.name)] = int(_version(got) or 0)
                self.writes += 1
            except NotFound:
                self._versions.pop((w.kind, w.name), None)
                if w.body is not None:
                    self.book.failed(w)  # gone meanwhile: created at the next pass
                    self._wake.set()
            except (Conflict, ApiRefused, OSError) as exc:
                self.failures += 1
                if isinstance(exc, Conflict):
                    self._versions.pop((w.kind, w.name), None)  # re-read: the informer's is the one to trust
                self.book.failed(w)
                self._wake.set()
                log.warning(
                    "writing %s %s failed; again at the next pass",
                    w.kind,
                    w.name,
                    extra={"object": w.name, "error": str(exc)[:300]},
                )


def _tables(inputs: PolicyInputs) -> dict[InputKind, Mapping[str, Any]]:
    return {
        InputKind.NETWORK_POLICY: inputs.policies,
        InputKind.NAMESPACE: inputs.namespaces,
        InputKind.POD: inputs.pods,
        InputKind.CLUSTER_POLICY: inputs.cluster_policies,
        InputKind.NODE: inputs.nodes,
    }


def _keys_of(changes: InputChanges) -> dict[InputKind, Iterable[str]]:
    return {
        InputKind.NETWORK_POLICY: changes.policies,
        InputKind.NAMESPACE: changes.namespaces,
        InputKind.POD: changes.pods,
        InputKind.CLUSTER_POLICY: changes.cluster_policies,
        InputKind.NODE: changes.nodes,
    }


def _ignore(change: Change) -> None:
    return None


def _none(obj: Mapping[str, Any]) -> None:
    return None
