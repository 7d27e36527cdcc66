"""The cluster's selectable pods, indexed for the policy engine: what a selector picks, and who else holds an address.

Pods are kept as the watchers' values (never copied), in groups of one
namespace and one label set (the replicas of a template: selectors see them
as one), indexed by namespace and by label pair (for the label keys peer
selectors require: ``app``, ``tier`` — never ``pod-template-hash``); every
address points back to the pod(s) holding it.  What a set holds is not stored: the kernel has
it, and it is derived from these indices — whole when a set is new
(:meth:`Peers.selected`, :meth:`Peers.declaring`), or for one element when a
pod lets go of it (:meth:`Peers.held`: does another pod still put it there?).
This node's pods (the values with a ``host_veth``) are also kept by key: the
named-port sets of ingress rules hold only theirs.

An index bucket holds one item as itself, a few in a list, more in a set:
most label pairs (pod-template-hash) and addresses have one; a group's
members are a list, a dict by key once many.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

import attrs

from ._cluster import ClusterNetworkPolicy
from ._compile import FAMILIES
from ._model import NAMESPACE_NAME_LABEL, IPAddress, Labels, LabelSelector, NetworkPolicy, PolicyPod, Protocol

Element = object  # an address, or (address, protocol, port) for a named port
Pair = tuple[str, str]

_FEW = 16  # a list holds up to this many; then a set (buckets) or a dict by key (a group's members)


@attrs.define(eq=False, slots=True, weakref_slot=False)
class Group:
    """Selectable pods of one namespace with one label set."""

    namespace: str
    labels: Labels
    members: list[PolicyPod] | dict[str, PolicyPod] = attrs.field(factory=list)

    def add(self, key: str, pod: PolicyPod) -> None:
        members = self.members
        if isinstance(members, dict):
            members[key] = pod
        else:
            members.append(pod)
            if len(members) > _FEW:
                self.members = {p.key: p for p in members}

    def remove(self, key: str, pod: PolicyPod) -> None:
        members = self.members
        if isinstance(members, dict):
            del members[key]
            return
        members.remove(pod)  # by identity first, then by value

    def pods(self) -> Iterable[PolicyPod]:
        return self.members.values() if isinstance(self.members, dict) else self.members

    def __len__(self) -> int:
        return len(self.members)


def _put(table: dict[Any, Any], key: object, item: object) -> None:
    """Add *item* to the bucket *key*: the item itself, then a list, then a set once large."""
    have = table.get(key)
    if have is None:
        table[key] = item
    elif type(have) is list:
        have.append(item)
        if len(have) > _FEW:
            table[key] = set(have)
    elif type(have) is set:
        have.add(item)
    else:
        table[key] = [have, item]


def _take(table: dict[Any, Any], key: object, item: object) -> None:
    """Remove *item* (the object added, or one equal to it) from the bucket *key*."""
    have = table[key]
    if type(have) is set:
        have.remove(item)
        if not have:
            del table[key]
    elif type(have) is list:
        have.remove(item)  # by identity first, then by value
        if len(have) == 1:
            table[key] = have[0]
    elif have is item or have == item:
        del table[key]
    else:
        raise KeyError(key)


def _bucket(table: dict[Any, Any], key: object) -> Collection[Any]:
    have = table.get(key)
    if have is None:
        return ()
    return have if type(have) in (list, set) else (have,)


@attrs.define(eq=False)
class Filled:
    """A set pods fill (one nft set per family): a peer selector's, or a named port's."""

    names: dict[int, str]  # family → set name

    def elements(self, pod: PolicyPod) -> set[Element]:
        """What *pod* puts in these sets (if it is one of their pods)."""
        raise NotImplementedError


@attrs.define(eq=False)
class Selector(Filled):
    """A peer selector: pods in *scope* (or in the namespaces *ns_sel* picks) that *pod_sel* picks."""

    scope: str | None = None
    ns_sel: LabelSelector | None = None
    pod_sel: LabelSelector | None = None
    named: list[NamedPorts] = attrs.field(factory=list)  # the named-port sets restricted to its pods

    @property
    def namespace(self) -> str | None:
        """The one namespace this selector can pick pods of, if it says so."""
        if self.scope is not None:
            return self.scope
        assert self.ns_sel is not None
        for key, value in self.ns_sel.match_labels:
            if key == NAMESPACE_NAME_LABEL:
                return value
        return None

    @property
    def pair(self) -> Pair | None:
        """A label pair every pod it picks has, if any."""
        if self.pod_sel is not None and self.pod_sel.match_labels:
            return self.pod_sel.match_labels[0]
        return None

    def elements(self, pod: PolicyPod) -> set[Element]:
        return set(pod.addresses)


@attrs.define(eq=False)
class NamedPorts(Filled):
    """The pods of a scope declaring one of *ports* (name, protocol): their (address, protocol, port) for each.

    The scope: every pod of the cluster; this node's pods (*local*); or the pods *selector* picks."""

    ports: frozenset[tuple[str, Protocol]] = frozenset()
    local: bool = False
    selector: Selector | None = None

    def elements(self, pod: PolicyPod) -> set[Element]:
        """*pod*'s elements here (it is the caller who checks that *selector* picks it)."""
        if self.local and pod.host_veth is None:
            return set()
        return {
            (a, np.protocol, np.port)
            for np in pod.named_ports
            if (np.name, np.protocol) in self.ports
            for a in pod.addresses
        }

    def declared_by(self, pod: PolicyPod) -> bool:
        return any((np.name, np.protocol) in self.ports for np in pod.named_ports)


def peer_pod_selectors(
    policies: Iterable[NetworkPolicy], cluster: Iterable[ClusterNetworkPolicy]
) -> Iterator[LabelSelector]:
    """Every pod selector a peer of *policies* or *cluster* policies has (what picks remote pods)."""
    for policy in policies:
        for rule in (*policy.ingress, *policy.egress):
            for peer in rule.peers:
                if peer.pod_selector is not None:
                    yield peer.pod_selector
    for cnp in cluster:
        for crule in (*cnp.ingress, *cnp.egress):
            for cpeer in crule.peers:
                if cpeer.pods is not None:
                    yield cpeer.pods[1]


def index_keys(policies: Iterable[NetworkPolicy], cluster: Iterable[ClusterNetworkPolicy]) -> frozenset[str]:
    """The label keys :meth:`Peers.index_label_keys` takes: those peer selectors' matchLabels require."""
    return frozenset(key for sel in peer_pod_selectors(policies, cluster) for key, _ in sel.match_labels)


def family(element: Element) -> int:
    return element[0].version if isinstance(element, tuple) else element.version  # type: ignore[attr-defined]


def _address(element: Element) -> IPAddress:
    return element[0] if isinstance(element, tuple) else element  # type: ignore[return-value]


@attrs.define(eq=False)
class Peers:
    """The cluster's selectable pods (see the module doc); namespaces' labels as selectors read them."""

    # namespace → label set → group; label pair (of the keys indexed) → group(s); address → pod(s) holding it
    _groups: dict[str, dict[Labels, Group]] = attrs.field(init=False, factory=dict)
    _pair_keys: frozenset[str] = attrs.field(init=False, default=frozenset())
    _by_pair: dict[Pair, Group | list[Group] | set[Group]] = attrs.field(init=False, factory=dict)
    _holders: dict[IPAddress, PolicyPod | list[PolicyPod]] = attrs.field(init=False, factory=dict)
    _addresses: dict[int, int] = attrs.field(init=False, factory=lambda: dict.fromkeys(FAMILIES, 0))  # per family
    _ns_labels: dict[str, Mapping[str, str]] = attrs.field(init=False, factory=dict)
    _local: dict[str, PolicyPod] = attrs.field(init=False, factory=dict)  # this node's pods, by key

    @property
    def families(self) -> tuple[int, ...]:
        """The families some pod has an address of."""
        return tuple(f for f in FAMILIES if self._addresses[f])

    # -- changes -----------------------------------------------------------------------------------

    def add(self, key: str, pod: PolicyPod) -> None:
        groups = self._groups.get(pod.namespace)
        if groups is None:
            groups = self._groups[pod.namespace] = {}
        group = groups.get(pod.labels)
        if group is None:
            group = groups[pod.labels] = Group(pod.namespace, pod.labels)
            for pair in pod.labels:
                if pair[0] in self._pair_keys:
                    _put(self._by_pair, pair, group)
        group.add(key, pod)
        if pod.host_veth is not None:
            self._local[key] = pod
        for a in pod.addresses:
            self._addresses[a.version] += 1
            _put(self._holders, a, pod)

    def remove(self, key: str, pod: PolicyPod) -> None:
        groups = self._groups[pod.namespace]
        group = groups[pod.labels]
        group.remove(key, pod)
        if pod.host_veth is not None:
            del self._local[key]
        if not group:
            del groups[pod.labels]
            if not groups:
                del self._groups[pod.namespace]
            for pair in pod.labels:
                if pair[0] in self._pair_keys:
                    _take(self._by_pair, pair, group)
        for a in pod.addresses:
            self._addresses[a.version] -= 1
            _take(self._holders, a, pod)

    def index_label_keys(self, keys: frozenset[str]) -> None:
        """Index groups by their pairs of label *keys* from now on (the keys peer selectors require)."""
        if keys == self._pair_keys:
            return
        gone, new = self._pair_keys - keys, keys - self._pair_keys
        self._pair_keys = keys
        if gone:
            self._by_pair = {pair: groups for pair, groups in self._by_pair.items() if pair[0] not in gone}
        if new:
            for by_labels in self._groups.values():
                for group in by_labels.values():
                    for pair in group.labels:
                        if pair[0] in new:
                            _put(self._by_pair, pair, group)

    def set_namespace(self, name: str, labels: Mapping[str, str] | None) -> Mapping[str, str]:
        """Namespace *name* has *labels* now (None: unknown); returns the labels it had."""
        before = self.namespace_labels(name)
        if labels is None:
            self._ns_labels.pop(name, None)
        else:
            self._ns_labels[name] = labels
        return before

    # -- reading -----------------------------------------------------------------------------------

    def namespace_labels(self, namespace: str) -> Mapping[str, str]:
        labels = self._ns_labels.get(namespace)
        return labels if labels is not None else {NAMESPACE_NAME_LABEL: namespace}

    def selects(
        self, selector: Selector, namespace: str, labels: Mapping[str, str], ns_labels: Mapping[str, str] | None = None
    ) -> bool:
        """Does *selector* pick a pod of *namespace* with *labels* (the namespace's labels: *ns_labels* or its own)?"""
        if selector.scope is not None and namespace != selector.scope:
            return False
        if selector.ns_sel is not None and not selector.ns_sel.matches(
            ns_labels if ns_labels is not None else self.namespace_labels(namespace)
        ):
            return False
        return selector.pod_sel is None or selector.pod_sel.matches(labels)

    def held(
        self,
        source: Filled,
        element: Element,
        besides: PolicyPod | None,
        namespace: tuple[str, Mapping[str, str]] | None = None,
    ) -> bool:
        """Does a pod other than *besides* put *element* in *source*'s set?

        *namespace*: (name, labels) to read that namespace's labels as (a relabelling in progress)."""
        selector = (
            source if isinstance(source, Selector) else source.selector if isinstance(source, NamedPorts) else None
        )
        for holder in _bucket(self._holders, _address(element)):
            if holder is besides:
                continue
            if selector is not None:
                ns_labels = namespace[1] if namespace is not None and holder.namespace == namespace[0] else None
                if not self.selects(selector, holder.namespace, dict(holder.labels), ns_labels):
                    continue
            if selector is source or element in source.elements(holder):
                return True
        return False

    def groups_in(self, namespace: str) -> Iterable[Group]:
        return self._groups.get(namespace, {}).values()

    def selected(self, selector: Selector) -> Iterator[PolicyPod]:
        """Every pod *selector* picks, found through the indices: the groups of its namespace, or the
        fewer of those with a label pair it requires and those of the namespaces it picks."""
        groups: Collection[Group] | Iterable[Group]
        namespace = selector.namespace
        if namespace is not None:
            groups = self.groups_in(namespace)
        else:
            assert selector.ns_sel is not None
            ns_sel = selector.ns_sel
            picked = [g for name, g in self._groups.items() if ns_sel.matches(self.namespace_labels(name))]
            groups = (g for by_labels in picked for g in by_labels.values())
            pairs = [p for p in selector.pod_sel.match_labels if p[0] in self._pair_keys] if selector.pod_sel else []
            if pairs:
                fewest: Collection[Group] = min((_bucket(self._by_pair, pair) for pair in pairs), key=len)
                if len(fewest) < sum(len(by_labels) for by_labels in picked):
                    groups = fewest
        for group in groups:
            if self.selects(selector, group.namespace, dict(group.labels)):
                yield from group.pods()

    def declaring(self, ports: NamedPorts) -> Iterator[PolicyPod]:
        """Every pod of *ports*' scope declaring one of them: this node's, those its selector picks, or
        (a scan of the groups) the whole cluster's."""
        pods: Iterable[PolicyPod]
        if ports.local:
            pods = self._local.values()
        elif ports.selector is not None:
            pods = self.selected(ports.selector)
        else:
            pods = (pod for by_labels in self._groups.values() for group in by_labels.values() for pod in group.pods())
        for pod in pods:
            if pod.named_ports and ports.declared_by(pod):
                yield pod

    def elements(self, source: Filled, family_: int) -> set[Element]:
        """What *source*'s set of *family_* holds now."""
        pods = self.selected(source) if isinstance(source, Selector) else self.declaring(source)  # type: ignore[arg-type]
        return {e for pod in pods for e in source.elements(pod) if family(e) == family_}
