"""This node's ruleset, kept up to date change by change: what the policy service compiles with.

:func:`compile_ruleset` computes a ruleset from a whole cluster; a
:class:`PolicyEngine` computes the same ruleset once (:meth:`PolicyEngine.load`)
and then follows changes (:meth:`PolicyEngine.update`), doing work in
proportion to what a change touches:

- **Peers** (:mod:`._peers`): the cluster's selectable pods, as the
  watchers' own values in groups of one namespace and label set, indexed by
  namespace, label pair and address.  What a set holds is not kept twice:
  the kernel has it; the indices derive it.
- **What is maintained**: the sets this node's chains use — the peer
  selectors of the policies that select a local pod, each indexed by the
  namespace and the label pair a pod must have to match it, so a pod is
  checked against few; and the named-port sets of their rules, by port
  name: an ingress rule's holds this node's pods only, an egress rule's
  with a selector peer the pods of that selector (it follows the selector),
  one with an ipBlock peer or no peer every pod declaring the name.
- **A remote pod's change** re-indexes that pod, checks the selectors its
  old and new value could match (and their named-port sets), and the
  cluster-wide named-port sets of the names it declares, and notes the
  elements that enter or leave a set (an element leaves only when no other
  pod still puts it there).  **A namespace's** relabelling re-checks the
  namespace selectors, and for those whose verdict flips, the pods of that
  namespace.  **A policy's change or a local pod's** (or a namespace
  switching its denied-traffic log) recomputes this node's chains (few: per
  local pod and direction, and the policies selecting local pods, each
  cached by value); a set newly used is listed once, from the indices; a
  local pod's change also moves its elements in the local named-port sets.
- **Out**: :meth:`PolicyEngine.change` hands over a :class:`RulesetChange`:
  the structure (the same object while unchanged) and the elements that
  moved since the previous change; :meth:`PolicyEngine.ruleset` builds the
  whole ruleset value on demand (O(elements)).

The engine reads the inputs' live tables only in :meth:`PolicyEngine.load` and
:meth:`PolicyEngine.update` (call them without an await since the journal's
drain); what it hands over later reads its own indices.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from ._cluster import PolicyNode
from ._compile import (
    FAMILIES,
    LOCAL,
    Compiler,
    Layout,
    NamedPortsSpec,
    NamedScope,
    NodesSpec,
    PeerSelection,
    PodsSpec,
    check_local,
    node_set,
    selector_set,
    service_set,
)
from ._inputs import InputChanges, PolicySource
from ._model import LabelSelector, Namespace, PolicyPod, Protocol
from ._peers import Element, Filled, NamedPorts, Pair, Peers, Selector, family, index_keys
from ._ruleset import AddressSet, Ruleset, RulesetChange, ServiceSet


def _peer(pod: PolicyPod | None) -> PolicyPod | None:
    """*pod* if a selector can pick it (selectable, with an address)."""
    return pod if pod is not None and pod.selectable and pod.addresses else None


@attrs.define(eq=False)
class NodeSelector(Filled):
    """A ``nodes`` peer: the addresses of the nodes *selector* picks."""

    selector: LabelSelector = attrs.field(factory=LabelSelector)

    def elements(self, node: PolicyNode) -> set[Element]:  # type: ignore[override]
        return set(node.addresses) if self.selector.matches(node.label_map) else set()


def _logs_denied(namespace: Namespace | None) -> bool:
    return namespace is not None and namespace.log_denied


def _same_to_selectors(before: PolicyPod, after: PolicyPod) -> bool:
    """Nothing a selector or a named port reads differs (node, resourceVersion, … may)."""
    return (
        before.namespace == after.namespace
        and (before.labels is after.labels or before.labels == after.labels)
        and before.addresses == after.addresses
        and (before.named_ports is after.named_ports or before.named_ports == after.named_ports)
        and (before.host_veth is None) == (after.host_veth is None)  # local or not: the ingress named-port sets
    )


@attrs.define(eq=False)
class PolicyEngine:
    """The ruleset of this node, followed change by change (see the module doc).

    *inputs* is read live (the watchers' tables).  Local pods are given as
    :func:`compile_ruleset` takes them (``host_veth`` set; a local pod stands
    for the cluster-wide pod with its key, as a peer too).
    """

    inputs: PolicySource
    _compiler: Compiler = attrs.field(init=False, factory=Compiler)
    _peers: Peers = attrs.field(init=False, factory=Peers)
    _locals: list[PolicyPod] = attrs.field(init=False, factory=list)
    _overrides: dict[str, PolicyPod] = attrs.field(init=False, factory=dict)  # local pods by key
    # Maintained sets (the ones the ruleset uses, and until the next change is handed over, the ones it
    # used then), and where a pod finds the selectors it may match: namespace or None → pair or None →
    _selectors: dict[PeerSelection, Selector] = attrs.field(init=False, factory=dict)
    _selector_index: dict[str | None, dict[Pair | None, list[Selector]]] = attrs.field(init=False, factory=dict)
    # named-port sets by (ports, scope); the cluster-wide and the local ones by port (a selector keeps its own)
    _named: dict[tuple[tuple[tuple[str, Protocol], ...], NamedScope], NamedPorts] = attrs.field(
        init=False, factory=dict
    )
    _named_index: dict[tuple[str, Protocol], list[NamedPorts]] = attrs.field(init=False, factory=dict)
    _local_named_index: dict[tuple[str, Protocol], list[NamedPorts]] = attrs.field(init=False, factory=dict)
    # the ruleset: its structure, and which maintained set fills each of its pod sets
    _structure: Ruleset = attrs.field(init=False, factory=Ruleset)
    _families: tuple[int, ...] = attrs.field(init=False, default=())
    _filled: dict[str, tuple[Filled, int]] = attrs.field(init=False, factory=dict)
    # what moved since the last change handed over (set name → elements), and that change
    _added: dict[str, set[Element]] = attrs.field(init=False, factory=dict)
    _removed: dict[str, set[Element]] = attrs.field(init=False, factory=dict)
    # nodes peers, and the nodes (a copy of the inputs' table: what is handed over reads the engine's own state)
    _node_selectors: dict[LabelSelector, NodeSelector] = attrs.field(init=False, factory=dict)
    _nodes: dict[str, PolicyNode] = attrs.field(init=False, factory=dict)
    _nodes_known: bool = attrs.field(init=False, default=True)
    _handed: Ruleset | None = attrs.field(init=False, default=None)
    _handed_sets: frozenset[str] = attrs.field(init=False, default=frozenset())  # its sets pods fill
    _token: object | None = attrs.field(init=False, default=None)

    # -- the whole, and changes ---------------------------------------------------------------

    def load(self, local_pods: Iterable[PolicyPod]) -> None:
        """Build everything from the inputs as they are now (once, at start)."""
        locals_ = check_local(local_pods)
        self._overrides = overrides = {p.key: p for p in locals_}
        for name, ns in self.inputs.namespaces.items():
            self._peers.set_namespace(name, ns.label_map)
        self._nodes = dict(self.inputs.nodes)
        pods = self.inputs.pods
        for key, pod in pods.items():
            peer = _peer(overrides.get(key, pod))
            if peer is not None:
                self._peers.add(key, peer)
        for key, pod in overrides.items():
            peer = _peer(pod)
            if key not in pods and peer is not None:
                self._peers.add(key, peer)
        self._set_policies()
        self._restructure(locals_)

    def update(self, changes: InputChanges, local_pods: Iterable[PolicyPod]) -> None:
        """Follow *changes* (drained from the inputs' journal just now) and this node's *local_pods*."""
        locals_ = check_local(local_pods)
        overrides = {p.key: p for p in locals_}
        pods = self.inputs.pods
        keys = set(changes.pods)
        for key in overrides.keys() | self._overrides.keys():
            if self._overrides.get(key) is not overrides.get(key):
                keys.add(key)  # (an equal new value too: the indices hold the values themselves)
        for key in keys:
            before = self._overrides.get(key)
            if before is None:
                before = changes.pods[key] if key in changes.pods else pods.get(key)
            after = overrides.get(key)
            if after is None:
                after = pods.get(key)
            self._pod_changed(key, _peer(before), _peer(after))
        self._overrides = overrides
        relabelled = False
        for name in changes.namespaces:
            relabelled |= self._namespace_changed(name)
        # A namespace switching its denied-traffic log on or off: its pods' chains (and tier chains) change.
        logging_switched = any(
            _logs_denied(before) != _logs_denied(self.inputs.namespaces.get(name))
            for name, before in changes.namespaces.items()
        )
        for name in changes.nodes:
            self._node_changed(name, changes.nodes[name], self.inputs.nodes.get(name))
        nodes_listed = self.inputs.nodes_known != self._nodes_known  # nodes peers fail closed until then
        if changes.policies or changes.cluster_policies or nodes_listed:
            self._set_policies()
        # A namespace relabelled can change which ClusterNetworkPolicies select this node's pods.
        subjects_moved = relabelled and self._compiler.active and bool(self.inputs.cluster_policies)
        if subjects_moved:
            self._compiler.namespaces_changed()
        if (
            changes.policies
            or changes.cluster_policies
            or nodes_listed
            or subjects_moved
            or logging_switched
            or locals_ != self._locals
            or self._peers.families != self._families
        ):
            self._restructure(locals_)

    def change(self) -> RulesetChange:
        """The ruleset now, as a change from the one handed over before (the first: whole)."""
        new, previous = self._structure, self._handed
        added: dict[str, frozenset[Element]] = {}
        removed: dict[str, frozenset[Element]] = {}
        if previous is not None:
            for name in self._filled if new is not previous else ():
                if name not in self._handed_sets:  # a set new since: whole
                    elements = self._elements(*self._filled[name])
                    if elements:
                        added[name] = frozenset(elements)
            for moved, out in ((self._added, added), (self._removed, removed)):
                for name, elements in moved.items():
                    if elements and name in self._filled:
                        out[name] = frozenset(elements)
        change = RulesetChange(
            new, added, removed, base=self._token if previous is not None else None, materialize=self.ruleset
        )
        self._added, self._removed = {}, {}
        if new is not previous:
            self._handed_sets = frozenset(self._filled)
            self._retire()
        self._handed, self._token = new, change.token
        return change

    def ruleset(self) -> Ruleset:
        """The whole ruleset now, elements included (O(elements): for full applies, tools and tests)."""
        address_sets = dict(self._structure.address_sets)
        service_sets = dict(self._structure.service_sets)
        for name, (source, family_) in self._filled.items():
            elements = frozenset(self._elements(source, family_))
            if isinstance(source, Selector | NodeSelector):
                address_sets[name] = AddressSet(name, family_, False, elements)  # type: ignore[arg-type]
            else:
                service_sets[name] = ServiceSet(name, family_, elements)  # type: ignore[arg-type]
        return attrs.evolve(self._structure, address_sets=address_sets, service_sets=service_sets)

    @property
    def structure(self) -> Ruleset:
        """The ruleset now, with the elements of the sets pods fill left out."""
        return self._structure

    def _logs_denied(self, namespace: str) -> bool:
        return _logs_denied(self.inputs.namespaces.get(namespace))

    def _elements(self, source: Filled, family_: int) -> set[Element]:
        """What *source*'s set of *family_* holds now."""
        if isinstance(source, NodeSelector):
            return {a for node in self._nodes.values() for a in source.elements(node) if family(a) == family_}
        return self._peers.elements(source, family_)

    def _set_policies(self) -> None:
        policies = self.inputs.policies.values()
        cluster = self.inputs.cluster_policies.values()
        self._compiler.set_policies(policies)
        self._nodes_known = self.inputs.nodes_known
        self._compiler.set_cluster_policies(cluster, self._nodes_known)
        self._peers.index_label_keys(index_keys(policies, cluster))

    def _node_changed(self, name: str, before: PolicyNode | None, after: PolicyNode | None) -> None:
        """Node *name* went from *before* to *after*: note what enters or leaves the nodes peers' sets."""
        if after is None:
            self._nodes.pop(name, None)
        else:
            self._nodes[name] = after
        for source in self._node_selectors.values():
            was = source.elements(before) if before is not None else set()
            now = source.elements(after) if after is not None else set()
            for element in was ^ now:
                held = any(
                    element in other.addresses and source.selector.matches(other.label_map)
                    for other_name, other in self._nodes.items()
                    if other_name != name
                )
                if not held:
                    into, undo = (self._added, self._removed) if element in now else (self._removed, self._added)
                    self._note(source.names[family(element)], element, into, undo)

    # -- peers -------------------------------------------------------------------------------------

    def _candidates(self, pod: PolicyPod, into: dict[Selector, None]) -> None:
        """The maintained selectors *pod* could match, by its namespace and label pairs."""
        for where in (pod.namespace, None):
            by_pair = self._selector_index.get(where)
            if by_pair:
                into.update(dict.fromkeys(by_pair.get(None, ())))
                for pair in pod.labels:
                    into.update(dict.fromkeys(by_pair.get(pair, ())))

    def _pod_changed(self, key: str, before: PolicyPod | None, after: PolicyPod | None) -> None:
        """Pod *key* went from *before* to *after* as a peer (None: not one)."""
        if before is after:
            return
        peers = self._peers
        if before is not None and after is not None and _same_to_selectors(before, after):
            peers.remove(key, before)  # the indices hold the watchers' values: the new one from now on
            peers.add(key, after)
            return
        candidates: dict[Selector, None] = {}
        named: dict[NamedPorts, None] = {}
        for pod in (before, after):
            if pod is not None:
                self._candidates(pod, candidates)
                local = pod.host_veth is not None
                for index in (self._named_index, self._local_named_index) if local else (self._named_index,):
                    for np in pod.named_ports if index else ():
                        named.update(dict.fromkeys(index.get((np.name, np.protocol), ())))
        if before is not None:
            peers.remove(key, before)
        if after is not None:
            peers.add(key, after)
        before_labels = dict(before.labels) if before is not None else {}
        after_labels = dict(after.labels) if after is not None else {}
        for selector in candidates:
            was = before is not None and peers.selects(selector, before.namespace, before_labels)
            now = after is not None and peers.selects(selector, after.namespace, after_labels)
            if was or now:
                for source in (selector, *selector.named):
                    self._moved(
                        source,
                        source.elements(before) if was and before is not None else set(),
                        source.elements(after) if now and after is not None else set(),
                        after,
                    )
        for ports in named:
            self._moved(
                ports,
                ports.elements(before) if before is not None else set(),
                ports.elements(after) if after is not None else set(),
                after,
            )

    def _moved(self, source: Filled, before: set[Element], after: set[Element], pod: PolicyPod | None) -> None:
        """One pod's elements in *source*'s sets went from *before* to *after* (the pod's value now: *pod*):
        note what enters or leaves — what no other pod puts there."""
        for element in before ^ after:
            if not self._peers.held(source, element, besides=pod):
                into, undo = (self._added, self._removed) if element in after else (self._removed, self._added)
                self._note(source.names[family(element)], element, into, undo)

    def _note(self, name: str, element: Element, into: dict[str, set[Element]], undo: dict[str, set[Element]]) -> None:
        if name not in self._handed_sets:
            return  # not in the applier's ruleset: a set new to it is handed over whole
        back = undo.get(name)
        if back is not None and element in back:
            back.discard(element)  # in and out again since the last change handed over
            return
        moved = into.get(name)
        if moved is None:
            into[name] = {element}
        else:
            moved.add(element)

    def _namespace_changed(self, name: str) -> bool:
        """Follow namespace *name*'s labels; were they changed?"""
        namespace = self.inputs.namespaces.get(name)
        peers = self._peers
        before = peers.set_namespace(name, namespace.label_map if namespace is not None else None)
        after = peers.namespace_labels(name)
        if before == after:
            return False
        for selector in self._selectors.values():
            if selector.ns_sel is None or selector.ns_sel.matches(before) == selector.ns_sel.matches(after):
                continue
            groups = [
                g for g in peers.groups_in(name) if selector.pod_sel is None or selector.pod_sel.matches(dict(g.labels))
            ]
            for source in (selector, *selector.named):
                seen: set[Element] = set()
                for group in groups:
                    for pod in group.pods():
                        for element in source.elements(pod):
                            if element in seen:
                                continue
                            seen.add(element)
                            held = peers.held(source, element, None)
                            if held != peers.held(source, element, None, namespace=(name, before)):
                                into, undo = (self._added, self._removed) if held else (self._removed, self._added)
                                self._note(source.names[family(element)], element, into, undo)
        return True

    # -- structure ---------------------------------------------------------------------------------

    def _restructure(self, locals_: list[PolicyPod]) -> None:
        """This node's chains, maps and sets anew.

        Sets no longer used stay maintained until the next change is handed
        over (:meth:`_retire`): one used again before that continues where
        the applier's copy of it stands."""
        families = self._peers.families
        layout = (
            self._compiler.layout(locals_, families, self._peers.namespace_labels, self._logs_denied)
            if self._compiler.active
            else None
        )
        specs = layout.specs.values() if layout is not None else ()
        for spec in specs:
            if isinstance(spec, PodsSpec) and spec.peer not in self._selectors:
                self._add_selector(spec.peer)
            elif isinstance(spec, NodesSpec) and spec.selector not in self._node_selectors:
                selector = spec.selector
                self._node_selectors[selector] = NodeSelector({f: node_set(selector, f) for f in FAMILIES}, selector)
        for spec in specs:
            if isinstance(spec, NamedPortsSpec) and (spec.ports, spec.scope) not in self._named:
                self._add_named(spec.ports, spec.scope)  # (after the selectors: a restricted one joins its selector)
        self._locals, self._families = locals_, families
        self._structure, self._filled = self._build(layout)

    def _retire(self) -> None:
        """Stop maintaining the sets the ruleset handed over does not use."""
        used = {id(source) for source, _ in self._filled.values()}
        used.update(id(source.selector) for source, _ in self._filled.values() if isinstance(source, NamedPorts))
        for key in [k for k, v in self._selectors.items() if id(v) not in used]:
            self._drop_selector(key)
        for named in [k for k, v in self._named.items() if id(v) not in used]:
            self._drop_named(named)
        for selector in [k for k, v in self._node_selectors.items() if id(v) not in used]:
            del self._node_selectors[selector]

    def _build(self, layout: Layout | None) -> tuple[Ruleset, dict[str, tuple[Filled, int]]]:
        if layout is None:
            return Ruleset(), {}
        filled: dict[str, tuple[Filled, int]] = {}
        address_sets: dict[str, AddressSet] = dict(layout.address_sets)
        service_sets: dict[str, ServiceSet] = {}
        for name, spec in layout.specs.items():
            if isinstance(spec, PodsSpec):
                filled[name] = (self._selectors[spec.peer], spec.family)
                address_sets[name] = AddressSet(name, spec.family)
            elif isinstance(spec, NodesSpec):
                filled[name] = (self._node_selectors[spec.selector], spec.family)
                address_sets[name] = AddressSet(name, spec.family)
            else:
                filled[name] = (self._named[(spec.ports, spec.scope)], spec.family)
                service_sets[name] = ServiceSet(name, spec.family)
        return layout.ruleset(address_sets, service_sets), filled

    def _add_selector(self, peer: PeerSelection) -> None:
        scope, ns_sel, pod_sel = peer.scope, peer.namespace_selector, peer.pod_selector
        selector = Selector(
            {f: selector_set(scope, ns_sel, pod_sel, f) for f in FAMILIES}, scope=scope, ns_sel=ns_sel, pod_sel=pod_sel
        )
        self._selectors[peer] = selector
        self._selector_index.setdefault(selector.namespace, {}).setdefault(selector.pair, []).append(selector)

    def _drop_selector(self, key: PeerSelection) -> None:
        selector = self._selectors.pop(key)
        by_pair = self._selector_index[selector.namespace]
        same = by_pair[selector.pair]
        same.remove(selector)
        if not same:
            del by_pair[selector.pair]
            if not by_pair:
                del self._selector_index[selector.namespace]

    def _add_named(self, named: tuple[tuple[str, Protocol], ...], scope: NamedScope) -> None:
        selector = self._selectors[scope] if isinstance(scope, PeerSelection) else None
        ports = NamedPorts(
            {f: service_set(named, f, scope) for f in FAMILIES},
            ports=frozenset(named),
            local=scope == LOCAL,
            selector=selector,
        )
        self._named[(named, scope)] = ports
        if selector is not None:
            selector.named.append(ports)  # it moves with the selector's members
            return
        index = self._local_named_index if ports.local else self._named_index
        for port in named:
            index.setdefault(port, []).append(ports)

    def _drop_named(self, key: tuple[tuple[tuple[str, Protocol], ...], NamedScope]) -> None:
        ports = self._named.pop(key)
        if ports.selector is not None:
            ports.selector.named.remove(ports)
            return
        index = self._local_named_index if ports.local else self._named_index
        named, _ = key
        for port in named:
            same = index[port]
            same.remove(ports)
            if not same:
                del index[port]
