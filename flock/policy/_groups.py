"""Address groups: which pods each node must know as policy peers, worked out once for the cluster.

flock-controller (issue 35) runs this so that an agent needs neither every
Pod of the cluster nor anything it does not use.  A **group** is what one
of this node's sets is filled from (:mod:`._compile`'s specs):

- a peer selector (:class:`PeerSelection`: the pods a pod/namespace
  selector picks) — its members are those pods;
- the cluster-wide pods declaring a named port (:class:`NamedSelection`:
  an egress rule's named port with no selector peer) — its members are the
  pods declaring one of the names.

A node **needs** the groups of the sets its pods' chains use, computed by
:meth:`Compiler.needed_specs` (the selection :meth:`Compiler.layout` makes,
so the agent and the controller cannot disagree on which policies select a
pod).  A node's pods are the pods bound to it that a policy can select
(hostNetwork and finished pods have no chain), with or without an address
yet: the controller sees a pod bound before its sandbox's ADD runs, so a
node usually has the groups before the pod's chains are compiled.

A member is the :class:`PolicyPod` itself (labels, addresses, named
ports): the agent matches selectors against it with the code it runs
today, so a pod it learns of through one group is also right for every
other selector it has (a pod in two groups is the same value in both).

:class:`GroupPlanner` follows the inputs change by change (like the agent's
:class:`PolicyEngine`) and hands over what moved (:meth:`GroupPlanner.drain`):
members per group, the groups that came and went, and each node's needs
that changed.  Work per pod change: the groups whose selector can pick it
(indexed by namespace and one required label pair) and, if its node's
selection can change (labels, namespace, node, selectable), that node's
needs.  A NetworkPolicy's change recomputes the nodes with pods in its
namespace; a ClusterNetworkPolicy's, every node's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from ._cluster import ClusterNetworkPolicy
from ._compile import FAMILIES, Compiler, NamedPortsSpec, PeerSelection, PodsSpec, _id
from ._inputs import InputChanges, PolicySource
from ._model import NetworkPolicy, PolicyPod, Protocol
from ._peers import NamedPorts, Pair, Peers, Selector, index_keys, peer_pod_selectors


@attrs.frozen(cache_hash=True)
class NamedSelection:
    """Every pod of the cluster declaring one of *ports* (name, protocol)."""

    ports: tuple[tuple[str, Protocol], ...]


GroupSpec = PeerSelection | NamedSelection


def group_name(spec: GroupSpec) -> str:
    """The group's name: stable across processes and releases (a hash of what it selects), ≤ 19 characters."""
    if isinstance(spec, PeerSelection):
        return "p-" + _id("pods", *spec.parts)
    return "n-" + _id("named", tuple((n, p.value) for n, p in spec.ports))


def _member(pod: PolicyPod | None) -> PolicyPod | None:
    """*pod* if it can be a peer (selectable, with an address): what a group lists."""
    return pod if pod is not None and pod.selectable and pod.addresses else None


def _subject(pod: PolicyPod | None) -> PolicyPod | None:
    """*pod* if it counts as its node's pod for the node's needs (bound, selectable)."""
    return pod if pod is not None and pod.node and pod.selectable else None


def _selection_key(pod: PolicyPod | None) -> tuple[object, ...] | None:
    """What a node's needs read of one of its pods."""
    return None if pod is None else (pod.namespace, pod.labels, pod.node)


def peer_label_keys(policies: Iterable[NetworkPolicy], cluster: Iterable[ClusterNetworkPolicy]) -> frozenset[str]:
    """Every pod label key a peer selector reads (matchLabels and matchExpressions): what a member carries."""
    return frozenset(
        key
        for sel in peer_pod_selectors(policies, cluster)
        for key in (*(k for k, _ in sel.match_labels), *(r.key for r in sel.match_expressions))
    )


def pruned(pod: PolicyPod, keys: frozenset[str]) -> PolicyPod:
    """*pod* with only the labels of *keys*: what a group lists of it.

    Every peer selector of the cluster reads only keys of *keys*, so it picks the pruned pod exactly when
    it picks the pod (an ``NotIn``/``DoesNotExist`` on a key of *keys* sees that key as it is); a label no
    selector reads — a rollout's ``version``, ``pod-template-hash`` — changes no member, and no slice is
    rewritten for it."""
    if all(k in keys for k, _ in pod.labels):
        return pod
    return attrs.evolve(pod, labels=tuple((k, v) for k, v in pod.labels if k in keys))


def same_member(a: PolicyPod, b: PolicyPod) -> bool:
    """Would a group list *a* and *b* the same way (what the agent reads of a member)?"""
    return (
        a.namespace == b.namespace
        and a.name == b.name
        and a.labels == b.labels
        and a.addresses == b.addresses
        and a.named_ports == b.named_ports
        and a.node == b.node
    )


@attrs.define(eq=False)
class Group:
    """One maintained group: its spec, name, members by pod key, and how many nodes need it."""

    spec: GroupSpec
    name: str
    selector: Selector | None  # a peer selector's (None: a named-port group)
    members: dict[str, PolicyPod] = attrs.field(factory=dict)
    users: int = 0


@attrs.frozen
class GroupChanges:
    """What moved since the previous :meth:`GroupPlanner.drain`.

    ``members``: group name → pod key → the member now (None: gone) — for
    groups that existed before and still do.  ``created``: groups new since
    (whole: read their members from :meth:`GroupPlanner.group`).
    ``dropped``: group names no node needs any more.  ``nodes``: node →
    the group names it needs now (empty: nothing), for nodes whose needs changed.
    """

    members: Mapping[str, Mapping[str, PolicyPod | None]] = attrs.field(factory=dict)
    created: frozenset[str] = frozenset()
    dropped: frozenset[str] = frozenset()
    nodes: Mapping[str, frozenset[str]] = attrs.field(factory=dict)

    def __bool__(self) -> bool:
        return bool(self.members or self.created or self.dropped or self.nodes)


@attrs.define(eq=False)
class GroupPlanner:
    """The cluster's address groups and each node's needs, followed change by change (see the module doc)."""

    inputs: PolicySource
    _compiler: Compiler = attrs.field(init=False, factory=Compiler)
    _peers: Peers = attrs.field(init=False, factory=Peers)
    # node → its pods (key → pod) for needs; namespace → node → how many of its pods there
    _subjects: dict[str, dict[str, PolicyPod]] = attrs.field(init=False, factory=dict)
    _spread: dict[str, dict[str, int]] = attrs.field(init=False, factory=dict)
    _needs: dict[str, frozenset[str]] = attrs.field(init=False, factory=dict)  # node → group names
    _groups: dict[str, Group] = attrs.field(init=False, factory=dict)  # name →
    _keys: frozenset[str] = attrs.field(init=False, default=frozenset())  # the label keys members carry
    # where a pod finds the groups that may list it: namespace or None → pair or None →; named port →
    _index: dict[str | None, dict[Pair | None, list[Group]]] = attrs.field(init=False, factory=dict)
    _named_index: dict[tuple[str, Protocol], list[Group]] = attrs.field(init=False, factory=dict)
    # what moved since the last drain
    _moved: dict[str, dict[str, PolicyPod | None]] = attrs.field(init=False, factory=dict)
    _created: set[str] = attrs.field(init=False, factory=set)
    _dropped: set[str] = attrs.field(init=False, factory=set)
    _nodes_moved: set[str] = attrs.field(init=False, factory=set)

    # -- reading -----------------------------------------------------------------------------------

    @property
    def groups(self) -> Mapping[str, Group]:
        return self._groups

    @property
    def needs(self) -> Mapping[str, frozenset[str]]:
        """Node → the group names it needs (nodes with none are absent)."""
        return self._needs

    def group(self, name: str) -> Group | None:
        return self._groups.get(name)

    # -- the whole, and changes --------------------------------------------------------------------

    def load(self) -> None:
        """Build everything from the inputs as they are now (once, at start)."""
        for name, ns in self.inputs.namespaces.items():
            self._peers.set_namespace(name, ns.label_map)
        for key, pod in self.inputs.pods.items():
            member = _member(pod)
            if member is not None:
                self._peers.add(key, member)
            self._subject_moved(key, None, _subject(pod))
        self._set_policies()
        self._renew_needs(set(self._subjects))

    def update(self, changes: InputChanges) -> None:
        """Follow *changes* (drained from the inputs' journal just now)."""
        renew: set[str] = set()
        pods = self.inputs.pods
        for key, before in changes.pods.items():
            after = pods.get(key)
            if before is after:
                continue
            self._member_changed(key, _member(before), _member(after))
            b, a = _subject(before), _subject(after)
            if _selection_key(b) != _selection_key(a):
                renew.update(p.node for p in (b, a) if p is not None)
            self._subject_moved(key, b, a)
        cluster_changed = bool(changes.cluster_policies) or (
            bool(changes.nodes) and any(p.uses_nodes for p in self.inputs.cluster_policies.values())
        )
        for name in changes.namespaces:
            # (relabelled: its pods' verdicts in namespace selectors are read anew, whatever the policies)
            if self._namespace_changed(name) and self.inputs.cluster_policies:
                self._compiler.namespaces_changed()
                renew.update(self._spread.get(name, ()))
        if changes.policies or changes.cluster_policies:
            self._set_policies()
        if cluster_changed:
            renew.update(self._subjects)
        else:
            for key in changes.policies:  # "ns/name": the nodes with pods in that namespace
                renew.update(self._spread.get(key.partition("/")[0], ()))
        self._renew_needs(renew)

    def drain(self) -> GroupChanges:
        """What moved since the previous drain (or :meth:`load`)."""
        created = frozenset(self._created)
        moved = {g: m for g, m in self._moved.items() if g not in created and g in self._groups}
        out = GroupChanges(
            members=moved,
            created=created,
            dropped=frozenset(self._dropped - created),
            nodes={n: self._needs.get(n, frozenset()) for n in self._nodes_moved},
        )
        self._moved, self._created, self._dropped, self._nodes_moved = {}, set(), set(), set()
        return out

    # -- needs -------------------------------------------------------------------------------------

    def _set_policies(self) -> None:
        policies, cluster = self.inputs.policies.values(), self.inputs.cluster_policies.values()
        self._compiler.set_policies(policies)
        self._compiler.set_cluster_policies(cluster, True)
        self._peers.index_label_keys(index_keys(policies, cluster))
        wanted = peer_label_keys(policies, cluster)
        if wanted != self._keys:
            self._keys = wanted
            self._reprune()

    def _reprune(self) -> None:
        """The label keys selectors read changed: every member as it is to be carried now."""
        pods = self.inputs.pods
        for group in self._groups.values():
            for key, had in group.members.items():
                full = pods.get(key)
                if full is None:
                    continue
                now = pruned(full, self._keys)
                if not same_member(had, now):
                    group.members[key] = now
                    self._moved.setdefault(group.name, {})[key] = now

    def _subject_moved(self, key: str, before: PolicyPod | None, after: PolicyPod | None) -> None:
        if before is not None:
            on = self._subjects.get(before.node)
            if on is not None and on.pop(key, None) is not None:
                if not on:
                    del self._subjects[before.node]
                spread = self._spread[before.namespace]
                spread[before.node] -= 1
                if not spread[before.node]:
                    del spread[before.node]
                    if not spread:
                        del self._spread[before.namespace]
        if after is not None:
            self._subjects.setdefault(after.node, {})[key] = after
            spread = self._spread.setdefault(after.namespace, {})
            spread[after.node] = spread.get(after.node, 0) + 1

    def _renew_needs(self, nodes: Iterable[str]) -> None:
        active = self._compiler.active
        for node in nodes:
            pods = self._subjects.get(node)
            specs = (
                self._compiler.needed_specs(pods.values(), FAMILIES, self._peers.namespace_labels)
                if pods and active
                else {}
            )
            wanted: dict[str, GroupSpec] = {}
            for spec in specs.values():
                if isinstance(spec, PodsSpec):
                    gspec: GroupSpec = spec.peer
                elif isinstance(spec, NamedPortsSpec) and spec.scope is None:
                    gspec = NamedSelection(spec.ports)
                elif isinstance(spec, NamedPortsSpec) and isinstance(spec.scope, PeerSelection):
                    gspec = spec.scope  # the selector's members carry their named ports
                else:
                    continue  # this node's own named ports; nodes peers (the agent watches Nodes)
                wanted.setdefault(group_name(gspec), gspec)
            before = self._needs.get(node, frozenset())
            after = frozenset(wanted)
            if after == before:
                continue
            for name in after - before:
                self._use(name, wanted[name])
            for name in before - after:
                self._release(name)
            if after:
                self._needs[node] = after
            else:
                self._needs.pop(node, None)
            self._nodes_moved.add(node)

    def _use(self, name: str, spec: GroupSpec) -> None:
        group = self._groups.get(name)
        if group is None:
            group = self._create(name, spec)
        group.users += 1

    def _release(self, name: str) -> None:
        group = self._groups[name]
        group.users -= 1
        if group.users:
            return
        del self._groups[name]
        if group.selector is not None:
            by_pair = self._index[group.selector.namespace]
            same = by_pair[group.selector.pair]
            same.remove(group)
            if not same:
                del by_pair[group.selector.pair]
                if not by_pair:
                    del self._index[group.selector.namespace]
        else:
            assert isinstance(group.spec, NamedSelection)
            for port in group.spec.ports:
                gs = self._named_index[port]
                gs.remove(group)
                if not gs:
                    del self._named_index[port]
        self._moved.pop(name, None)
        if name in self._created:
            self._created.discard(name)
        else:
            self._dropped.add(name)

    def _create(self, name: str, spec: GroupSpec) -> Group:
        if isinstance(spec, PeerSelection):
            selector = Selector({}, scope=spec.scope, ns_sel=spec.namespace_selector, pod_sel=spec.pod_selector)
            members = {p.key: pruned(p, self._keys) for p in self._peers.selected(selector)}
            group = Group(spec, name, selector, members)
            self._index.setdefault(selector.namespace, {}).setdefault(selector.pair, []).append(group)
        else:
            declaring = self._peers.declaring(NamedPorts({}, ports=frozenset(spec.ports)))
            members = {p.key: pruned(p, self._keys) for p in declaring}
            group = Group(spec, name, None, members)
            for port in spec.ports:
                self._named_index.setdefault(port, []).append(group)
        self._groups[name] = group
        self._dropped.discard(name)
        self._created.add(name)
        return group

    # -- members -----------------------------------------------------------------------------------

    def _candidates(self, pod: PolicyPod, into: dict[Group, None]) -> None:
        for where in (pod.namespace, None):
            by_pair = self._index.get(where)
            if by_pair:
                into.update(dict.fromkeys(by_pair.get(None, ())))
                for pair in pod.labels:
                    into.update(dict.fromkeys(by_pair.get(pair, ())))
        for np in pod.named_ports if self._named_index else ():
            into.update(dict.fromkeys(self._named_index.get((np.name, np.protocol), ())))

    def _lists(self, group: Group, pod: PolicyPod) -> bool:
        if group.selector is not None:
            return self._peers.selects(group.selector, pod.namespace, pod.label_map)
        assert isinstance(group.spec, NamedSelection)
        ports = group.spec.ports
        return any((np.name, np.protocol) in ports for np in pod.named_ports)

    def _member_changed(self, key: str, before: PolicyPod | None, after: PolicyPod | None) -> None:
        if before is None and after is None:
            return
        candidates: dict[Group, None] = {}
        for pod in (before, after):
            if pod is not None:
                self._candidates(pod, candidates)
        if before is not None:
            self._peers.remove(key, before)
        if after is not None:
            self._peers.add(key, after)
        for group in candidates:
            now = after is not None and self._lists(group, after)
            had = group.members.get(key)
            if now:
                assert after is not None
                member = pruned(after, self._keys)
                group.members[key] = member
                if had is None or not same_member(had, member):
                    self._moved.setdefault(group.name, {})[key] = member
            elif had is not None:
                del group.members[key]
                self._moved.setdefault(group.name, {})[key] = None

    def _namespace_changed(self, name: str) -> bool:
        """Follow namespace *name*'s labels; were they changed?  Re-lists its pods in the groups whose
        namespace selector's verdict flipped."""
        namespace = self.inputs.namespaces.get(name)
        before = self._peers.set_namespace(name, namespace.label_map if namespace is not None else None)
        after = self._peers.namespace_labels(name)
        if before == after:
            return False
        for group in self._groups.values():
            sel = group.selector
            if sel is None or sel.ns_sel is None or sel.ns_sel.matches(before) == sel.ns_sel.matches(after):
                continue
            for g in self._peers.groups_in(name):
                for pod in g.pods():
                    now = self._lists(group, pod)
                    had = pod.key in group.members
                    if now and not had:
                        member = group.members[pod.key] = pruned(pod, self._keys)
                        self._moved.setdefault(group.name, {})[pod.key] = member
                    elif had and not now:
                        del group.members[pod.key]
                        self._moved.setdefault(group.name, {})[pod.key] = None
        return True
