"""An agent's policy peers from address groups (issue 35): its own pods, and the members of the groups it needs.

With ``--policy-peers=groups`` the agent does not watch every Pod of the cluster.  It watches:

- **its own pods** (``spec.nodeName=<node>``, the API server's indexed watch): the link's one pod
  informer, whose changes reach :attr:`PeerFeed.local_listener`;
- **its NodeAddressGroups** (``metadata.name=<node>``): the names of the groups its pods need,
  written by flock-controller;
- **those groups' AddressGroups** (``flock.fritzlab.net/group in (…)``), watched again whenever
  that set changes (the old watch's members stay until the new one has listed: a change of the
  set never empties a peer set on the way).

What reaches ``inputs`` (:class:`flock.policy.PolicyInputs`, Kind.POD): every pod of this node
as its own informer sees it, and every member of every slice held, a pod held by several slices
once (the newest value).  The policy engine then compiles as it always has: a selector is
matched against the members' labels, so a pod the agent knows through one group is right for
every selector (see :mod:`flock.policy._groups`).

Pods count as listed (``inputs`` complete for Kind.POD, so the first ruleset is applied) once
this node's pods are listed, its NodeAddressGroups has been read and the slices of the groups it
names are listed — or, in a cluster without any NetworkPolicy or ClusterNetworkPolicy (both listed,
none), at once: nothing needs a peer.  Until flock-controller has written this node's object the agent applies no
ruleset: a node without its groups would enforce policies with empty peer sets (denying traffic
they allow, and letting through what a ClusterNetworkPolicy's Deny names).  It logs why.

A member the wire format refuses is left out (not a peer: fail closed) and logged once per slice
version; a slice that cannot be read at all is left out whole.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import attrs
import trio

from flock.groups import GROUP_LABEL, decode_members, decode_node_groups
from flock.model import InvalidObject
from flock.policy import Kind, PolicyInputs, PolicyPod

from ._informer import Change, ChangeType, Informer, InformerSettings, ListWatchSource

log = logging.getLogger("flock.watchers.groups")

_POLICY_KINDS = frozenset({Kind.NETWORK_POLICY, Kind.CLUSTER_POLICY})


class GroupSources(Protocol):
    def node_address_groups(self, node: str | None = None) -> ListWatchSource: ...

    def address_groups(self, label_selector: str = "") -> ListWatchSource: ...


class Progress(Protocol):
    """Where the feed reports that pods are listed and through which resourceVersion (the policy
    watcher's pod feed: its watermark and ``synced``)."""

    def pods_progressed(self, listed: bool, resource_version: str) -> None: ...


def group_selector(groups: frozenset[str]) -> str:
    """The label selector of *groups*' slices."""
    return f"{GROUP_LABEL} in ({','.join(sorted(groups))})"


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


@attrs.frozen
class _Slice:
    group: str
    members: Mapping[str, PolicyPod]


def _slice(obj: Mapping[str, Any]) -> _Slice | InvalidObject:
    try:
        group, members, refused = decode_members(obj)
    except InvalidObject as exc:
        exc.__traceback__ = None
        return exc
    for why in refused[:3]:
        log.error("AddressGroup %s: a member refused: %s", _name(obj), why, extra={"object": _name(obj)})
    return _Slice(group, members)


def _needs(obj: Mapping[str, Any]) -> frozenset[str] | InvalidObject:
    try:
        return decode_node_groups(obj)
    except InvalidObject as exc:
        exc.__traceback__ = None
        return exc


def _ignore(change: Change) -> None:
    return None


@attrs.define(eq=False)
class _LocalListener:
    """The pod informer's second listener: this node's pods, as policy values."""

    feed: PeerFeed

    def on_change(self, change: Change) -> None:
        value = None if change.type is ChangeType.DELETED else change.object.policy
        self.feed.local_changed(change.key, value if isinstance(value, PolicyPod) else None)

    def on_listed(self, objects: Mapping[str, Any]) -> None:
        self.feed.local_listed(
            {k: r.policy for k, r in objects.items() if isinstance(getattr(r, "policy", None), PolicyPod)}
        )

    def on_progress(self, resource_version: str) -> None:
        self.feed.local_version = resource_version
        self.feed.report()


@attrs.define(eq=False)
class _SliceListener:
    feed: PeerFeed

    def on_change(self, change: Change) -> None:
        self.feed.slice_changed(change.key, None if change.type is ChangeType.DELETED else change.object)

    def on_listed(self, objects: Mapping[str, Any]) -> None:
        self.feed.slices_listed(objects)

    def on_progress(self, resource_version: str) -> None:
        self.feed.slices_version = resource_version
        self.feed.report()


@attrs.define(eq=False)
class PeerFeed:
    """Writes Kind.POD of *inputs* from this node's pods and its groups' members (see the module doc)."""

    inputs: PolicyInputs
    node: str
    progress: Progress | None = None
    settings: InformerSettings = attrs.Factory(InformerSettings)
    _local: dict[str, PolicyPod] = attrs.field(init=False, factory=dict)
    _slices: dict[str, _Slice] = attrs.field(init=False, factory=dict)  # slice name →
    _holders: dict[str, dict[str, PolicyPod]] = attrs.field(init=False, factory=dict)  # pod key → slice → member
    _groups: frozenset[str] | None = attrs.field(init=False, default=None)  # the node's needs (None: unread)
    _watched: frozenset[str] | None = attrs.field(init=False, default=None)  # the groups whose slices are listed
    _needs_changed: trio.Event = attrs.field(init=False, factory=trio.Event)
    local_listed_once: bool = attrs.field(init=False, default=False)
    local_version: str = attrs.field(init=False, default="")
    slices_version: str = attrs.field(init=False, default="")

    @property
    def local_listener(self) -> _LocalListener:
        return _LocalListener(self)

    @property
    def groups(self) -> frozenset[str] | None:
        """The groups this node's NodeAddressGroups names (None: not read yet)."""
        return self._groups

    @property
    def listed(self) -> bool:
        """This node's pods are listed, and either its groups' slices are, or the cluster has no policy at
        all (listed, none: nothing needs a peer, so a start does not wait for flock-controller; a policy
        created later gets its peers one controller pass after it, as on a running node)."""
        if not self.local_listed_once:
            return False
        if self._groups is not None and self._watched == self._groups:
            return True
        inputs = self.inputs
        return inputs.synced >= _POLICY_KINDS and not inputs.policies and not inputs.cluster_policies

    def report(self) -> None:
        if self.progress is None:
            return
        versions = [v for v in (self.local_version, self.slices_version if self._groups else "") if v]
        mark = min(versions, key=lambda v: int(v) if v.isdigit() else 0) if versions else ""
        self.progress.pods_progressed(self.listed, mark)

    # -- this node's pods --------------------------------------------------------------------------

    def local_changed(self, key: str, pod: PolicyPod | None) -> None:
        if pod is None:
            self._local.pop(key, None)
        else:
            self._local[key] = pod
        self._write(key)

    def local_listed(self, pods: Mapping[str, PolicyPod]) -> None:
        gone = [k for k in self._local if k not in pods]
        for key in gone:
            del self._local[key]
            self._write(key)
        for key, pod in pods.items():
            if self._local.get(key) is not pod:
                self._local[key] = pod
                self._write(key)
        self.local_listed_once = True
        self._maybe_synced()

    # -- the groups' slices ------------------------------------------------------------------------

    def slice_changed(self, name: str, value: _Slice | InvalidObject | None) -> None:
        if isinstance(value, InvalidObject):
            log.error("AddressGroup %s refused: %s", name, value, extra={"object": name, "field": value.field})
            value = None
        before = self._slices.pop(name, None)
        if value is not None:
            self._slices[name] = value
        keys = set(before.members) if before is not None else set()
        for key in keys:
            held = self._holders.get(key)
            if held is not None:
                held.pop(name, None)
                if not held:
                    del self._holders[key]
        if value is not None:
            for key, pod in value.members.items():
                self._holders.setdefault(key, {})[name] = pod
            keys.update(value.members)
        for key in keys:
            self._write(key)

    def slices_listed(self, objects: Mapping[str, Any]) -> None:
        for name in [n for n in self._slices if n not in objects]:
            self.slice_changed(name, None)

    # -- inputs ------------------------------------------------------------------------------------

    def _value(self, key: str) -> PolicyPod | None:
        local = self._local.get(key)
        if local is not None:
            return local
        held = self._holders.get(key)
        if not held:
            return None
        return next(reversed(held.values()))  # the newest slice's

    def _write(self, key: str) -> None:
        value = self._value(key)
        if value is None:
            self.inputs.delete(Kind.POD, key)
        else:
            self.inputs.set(Kind.POD, key, value)

    def _maybe_synced(self) -> None:
        if self.listed:
            self.inputs.mark_synced(Kind.POD)
        self.report()

    # -- the watches -------------------------------------------------------------------------------

    async def run(self, kube: GroupSources, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch this node's NodeAddressGroups, and the slices of the groups it names; started() at once."""
        custom = attrs.evolve(self.settings, watch_list=False)  # custom objects: no sendInitialEvents
        needs = Informer(
            kube.node_address_groups(self.node),
            _name,
            self._needs_change,
            custom,
            name=f"nodeaddressgroups {self.node}",
            transform=_needs,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(needs.run)
            nursery.start_soon(self._follow_policies)
            task_status.started()
            with trio.move_on_after(10.0) as waited:
                await needs.wait_ready()
                while self._groups is None:
                    await self._needs_changed.wait()
            if waited.cancelled_caught:
                log.warning(
                    "no NodeAddressGroups %s yet: NetworkPolicy waits for flock-controller to write it",
                    self.node,
                    extra={"node": self.node},
                )
            while True:
                while self._groups is None:
                    await self._needs_changed.wait()
                await self._watch_slices(kube, self._groups)

    async def _follow_policies(self) -> None:
        """Until the pods count as listed: the policies' lists may be what makes them so (none at all)."""
        while not self.listed:
            await self.inputs.wait_generation(self.inputs.generation)
            self._maybe_synced()

    def _needs_change(self, change: Change) -> None:
        value = change.object
        if change.type is ChangeType.DELETED:
            return  # keep the last list: a node's object is deleted only with the node
        if isinstance(value, InvalidObject):
            log.error("NodeAddressGroups %s refused: %s", change.key, value, extra={"object": change.key})
            return
        if value != self._groups:
            self._groups = value
            self._needs_changed.set()
            self._needs_changed = trio.Event()

    async def _watch_slices(self, kube: GroupSources, groups: frozenset[str]) -> None:
        """The slices of *groups*, until the node's set changes (then this returns)."""
        changed = self._needs_changed
        if not groups:
            self.slices_listed({})
            self._watched = groups
            self._maybe_synced()
            await changed.wait()
            return
        custom = attrs.evolve(self.settings, watch_list=False)
        listener = _SliceListener(self)
        informer = Informer(
            kube.address_groups(group_selector(groups)),
            _name,
            _ignore,
            custom,
            name=f"addressgroups of {self.node}",
            listeners=(listener,),
            transform=_slice,
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(informer.run)
            self._watched = groups
            self._maybe_synced()
            await changed.wait()
            nursery.cancel_scope.cancel()
