"""Which slice holds which member, and which objects must be written: flock-controller's book.

The planner (:class:`flock.policy._groups.GroupPlanner`) says what each group holds; the book cuts
groups into slices of at most :data:`MAX_MEMBERS` and remembers what the API server holds, so a
pass writes only the objects whose content differs:

- **Stable slices.**  A member stays in its slice while it stays in the group; a new member goes
  to the lowest-numbered slice with room, preferring one already being written in this pass (so a
  burst of new pods is one write, not one per slice: EndpointSlice's controller does the same).
  A slice that empties is deleted; the group's other slices are left alone.
- **Resuming, not rebuilding.**  At start the book is loaded from the objects the controller
  wrote before (:meth:`SliceBook.written_slice`, :meth:`SliceBook.written_node`), members
  stay where they were, and the first pass writes only what changed while no controller ran: a
  restart is not a storm.
- **Order** (:meth:`SliceBook.pending`): slices created and updated, then the nodes' lists, then
  the slices deleted — an agent that reads a group name in its node's list finds the group's
  slices already there, and a slice goes only once no node names its group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from flock.policy import PolicyPod
from flock.policy._groups import GroupSpec, same_member

from ._wire import MAX_MEMBERS, address_group, node_address_groups, slice_name

_UNREADABLE = frozenset({""})  # no group has an empty name: never what is wanted


def _same(a: Mapping[str, PolicyPod], b: Mapping[str, PolicyPod]) -> bool:
    return a.keys() == b.keys() and all(same_member(a[k], b[k]) for k in a)


@attrs.define(eq=False)
class _Group:
    spec: GroupSpec | None  # None: known only from what was written (a group no longer planned)
    slices: dict[int, dict[str, PolicyPod]] = attrs.field(factory=dict)
    where: dict[str, int] = attrs.field(factory=dict)  # member key → slice


@attrs.frozen
class Write:
    """One object to write: *body* None deletes it."""

    kind: str  # "AddressGroup" or "NodeAddressGroups"
    name: str
    body: dict[str, Any] | None


@attrs.define(eq=False)
class SliceBook:
    """Desired slices and node lists, and what the API server holds of them (see the module doc)."""

    max_members: int = MAX_MEMBERS
    _groups: dict[str, _Group] = attrs.field(init=False, factory=dict)
    _written: dict[str, dict[str, PolicyPod]] = attrs.field(init=False, factory=dict)  # slice name → members
    _nodes: dict[str, frozenset[str]] = attrs.field(init=False, factory=dict)  # desired
    _nodes_written: dict[str, frozenset[str]] = attrs.field(init=False, factory=dict)
    _dirty: set[tuple[str, int]] = attrs.field(init=False, factory=set)
    _dirty_nodes: set[str] = attrs.field(init=False, factory=set)

    # -- what the API server holds ----------------------------------------------------------------

    def written_slice(self, group: str, index: int, members: Mapping[str, PolicyPod]) -> None:
        """The API server holds slice *index* of *group* with *members* (at start: the controller's own
        objects, read back; members stay in the slice they are in)."""
        g = self._groups.setdefault(group, _Group(None))
        g.slices[index] = dict(members)
        for key in members:
            if key in g.where:  # listed twice: keep the first, the other slice gets rewritten
                g.slices[index].pop(key)
                self._dirty.add((group, index))
            else:
                g.where[key] = index
        self._written[slice_name(group, index)] = dict(members)
        self._dirty.add((group, index))  # compared at the next pending(): a group no one plans goes

    def written_node(self, node: str, groups: frozenset[str] | None) -> None:
        """The API server holds *node*'s list with *groups* (None: unreadable, so written again)."""
        self._nodes_written[node] = groups if groups is not None else _UNREADABLE
        self._dirty_nodes.add(node)

    # -- what is wanted ----------------------------------------------------------------------------

    def set_group(self, group: str, spec: GroupSpec, members: Mapping[str, PolicyPod]) -> None:
        """*group* holds exactly *members* (a group new to the planner, or the first pass after a resume)."""
        g = self._groups.setdefault(group, _Group(spec))
        g.spec = spec
        for key in [k for k in g.where if k not in members]:
            self._take(group, g, key)
        for key, pod in members.items():
            self._put(group, g, key, pod)

    def move(self, group: str, moved: Mapping[str, PolicyPod | None]) -> None:
        """Members of *group* changed: key → the member now (None: gone)."""
        g = self._groups[group]
        for key, pod in moved.items():
            if pod is None:
                if key in g.where:
                    self._take(group, g, key)
            else:
                self._put(group, g, key, pod)

    def drop(self, group: str) -> None:
        """No node needs *group*: its slices go."""
        g = self._groups.get(group)
        if g is None:
            return
        g.spec = None
        for index in list(g.slices):
            g.slices[index] = {}
            self._dirty.add((group, index))
        g.where.clear()

    def set_node(self, node: str, groups: frozenset[str]) -> None:
        self._nodes[node] = groups
        self._dirty_nodes.add(node)

    def forget_node(self, node: str) -> None:
        """*node* is gone from the cluster: its list goes."""
        self._nodes.pop(node, None)
        self._dirty_nodes.add(node)

    # -- the writes --------------------------------------------------------------------------------

    def pending(self) -> list[Write]:
        """The objects to write, in order (see the module doc); each is taken as written once returned
        (a write that fails is put back with :meth:`failed`)."""
        upserts: list[Write] = []
        deletes: list[Write] = []
        for group, index in sorted(self._dirty):
            g = self._groups.get(group)
            name = slice_name(group, index)
            members = g.slices.get(index, {}) if g is not None else {}
            if g is not None and g.spec is None:
                members = {}  # known only from what was written, and no longer planned
            held = self._written.get(name)
            if members:
                assert g is not None and g.spec is not None
                if held is None or not _same(held, members):
                    upserts.append(Write("AddressGroup", name, address_group(group, index, g.spec, members.values())))
                    self._written[name] = dict(members)
            else:
                if held is not None:
                    deletes.append(Write("AddressGroup", name, None))
                    del self._written[name]
                if g is not None:
                    g.slices.pop(index, None)
                    if not g.slices and g.spec is None:
                        del self._groups[group]
        nodes: list[Write] = []
        for node in sorted(self._dirty_nodes):
            want = self._nodes.get(node)
            have = self._nodes_written.get(node)
            if want is None:
                if have is not None:
                    nodes.append(Write("NodeAddressGroups", node, None))
                    del self._nodes_written[node]
            elif want != have:
                nodes.append(Write("NodeAddressGroups", node, node_address_groups(node, want)))
                self._nodes_written[node] = want
        self._dirty.clear()
        self._dirty_nodes.clear()
        return [*upserts, *nodes, *deletes]

    def failed(self, write: Write) -> None:
        """*write* did not happen: what the API server holds is unknown; written again next pass."""
        if write.kind == "AddressGroup":
            self._written.pop(write.name, None)
            group, _, index = write.name.rpartition("-")
            self._dirty.add((group, int(index)))
        else:
            self._nodes_written.pop(write.name, None)
            self._dirty_nodes.add(write.name)

    # -- reading -----------------------------------------------------------------------------------

    def slices(self, group: str) -> Mapping[int, Mapping[str, PolicyPod]]:
        g = self._groups.get(group)
        return g.slices if g is not None else {}

    @property
    def written_groups(self) -> Iterable[str]:
        return list(self._groups)

    # -- inside ------------------------------------------------------------------------------------

    def _take(self, group: str, g: _Group, key: str) -> None:
        index = g.where.pop(key)
        del g.slices[index][key]
        self._dirty.add((group, index))

    def _put(self, group: str, g: _Group, key: str, pod: PolicyPod) -> None:
        index = g.where.get(key)
        if index is not None:
            held = g.slices[index][key]
            g.slices[index][key] = pod
            if not same_member(held, pod):
                self._dirty.add((group, index))
            return
        index = self._room(group, g)
        g.slices.setdefault(index, {})[key] = pod
        g.where[key] = index
        self._dirty.add((group, index))

    def _room(self, group: str, g: _Group) -> int:
        """The slice a new member goes to: one being written already if it has room, else the lowest
        with room, else a new one (the lowest free number)."""
        best: int | None = None
        for index, members in sorted(g.slices.items()):
            if len(members) < self.max_members:
                if (group, index) in self._dirty:
                    return index
                if best is None:
                    best = index
        if best is not None:
            return best
        index = 0
        while index in g.slices:
            index += 1
        return index
