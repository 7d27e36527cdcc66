"""``flockctl policy explain``: may one end reach another, and why.  Pure: what the agent knows → :class:`Explanation`.

Computed the way the agent enforces it.  The ruleset of the node each end is
on is compiled by the compiler the policy service uses (:class:`Compiler`,
with that end's pod as a local pod of its node: this node's own pods with
their veth and their allocation's addresses, another node's pods as its agent
would see them), the packet is run through it (:mod:`._simulate`, traced), and
the chains and rules it met are named back to what they come from: a tier
chain's rules to their ClusterNetworkPolicy and rule
(:attr:`Ruleset.tier_rules`), a policy chain to its NetworkPolicy
(:attr:`Ruleset.policy_chains`) and each of its rules to the NetworkPolicy rule
that made it (the compiler's layout of that policy, made again and checked
equal to the chain).  The reference evaluator (:func:`evaluate`) must agree,
direction by direction and overall; where it does not, the answer is "cannot
tell" and says so (a bug in flock).  For this node's own pods the ruleset the
policy service last handed to the kernel is run too, and must agree.

Per direction: the source's egress as its node enforces it (the forward
hook's egress chain; a pod reaching its own node meets the input hook: the
Admin tier alone), then the destination's ingress as its node enforces it.
What nothing filters says so: the node reaching its own pods, a pod reaching
itself, an end that is no pod.

Ends (``FROM``/``TO``): ``NS/POD``; an address (a pod's when one selectable
pod has it, a node's when Nodes are listed and one has it, else just an
address); a node's name (its addresses need Nodes listed, which flock watches
only while a ClusterNetworkPolicy has a ``nodes`` peer).  hostNetwork and
finished pods are no pods to policy: they are refused as ``NS/POD``.

Verdicts and exit codes: allowed (0: both directions), denied (1), unknown
(2: an end unknown or ambiguous, no address of the family, the inputs not
listed yet, a disagreement), with ``why``.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Mapping
from typing import Any

import attrs

from flock.fnv import fnv1a_32

from ._cluster import Action, ClusterNetworkPolicy, Tier
from ._compile import FAMILIES, Compiler, _RuleBuilder, rule_labels
from ._inputs import _REQUIRED, PolicySnapshot
from ._model import Direction, IPAddress, Namespace, NetworkPolicy, PolicyPod, Protocol
from ._reference import Endpoint, _direction_allows, evaluate, tier_action
from ._ruleset import Chain, Ruleset
from ._simulate import Packet, Trace, trace_egress, trace_ingress, trace_input

MAX_QUERY = 256  # characters of an end's text


class Verdict(enum.Enum):
    ALLOWED = "allowed"
    DENIED = "denied"
    UNKNOWN = "unknown"  # cannot tell: ``why`` says why

    @property
    def exit_code(self) -> int:
        return {Verdict.ALLOWED: 0, Verdict.DENIED: 1, Verdict.UNKNOWN: 2}[self]


class CannotTell(ValueError):
    """The question has no answer from what the agent knows (the message says why)."""


@attrs.frozen
class Query:
    """``FROM TO PORT/PROTO [--family]`` as asked."""

    source: str
    destination: str
    port: int
    protocol: Protocol
    family: int | None = None  # None: the family the ends have in common (IPv6 first)

    @classmethod
    def parse(cls, source: Any, destination: Any, port: Any, protocol: Any, family: Any = None) -> Query:
        """A query from the wire's fields (:class:`ValueError` saying what was expected and what was got)."""
        for what, text in (("from", source), ("to", destination)):
            if not isinstance(text, str) or not text or len(text) > MAX_QUERY:
                raise ValueError(f"{what}={str(text)[:64]!r}: expected NS/POD, an address or a node name")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"port={str(port)[:16]!r}: expected 1-65535")
        try:
            proto = Protocol(str(protocol).upper())
        except ValueError:
            raise ValueError(f"protocol={str(protocol)[:16]!r}: expected TCP, UDP or SCTP") from None
        if family is not None and (isinstance(family, bool) or family not in FAMILIES):
            raise ValueError(f"family={str(family)[:16]!r}: expected 6 or 4")
        return cls(source, destination, port, proto, family)


@attrs.frozen
class AgentView:
    """What the agent knows, as explain reads it: the watchers' inputs at one instant, this node's
    attached pods (by key: veth and the allocation's addresses) and the ruleset last handed to the kernel."""

    node: str
    inputs: PolicySnapshot
    local_pods: Mapping[str, PolicyPod] = attrs.field(factory=dict)
    ruleset: Ruleset | None = None  # elements included; None: nothing compiled yet
    resource_version: int = 0  # how far the watchers reflect the cluster
    applied_resource_version: int = 0  # what the ruleset in force was made from
    apply_error: str | None = None  # nft refused the last ruleset (the kernel holds an older one)
    # this node's own addresses (netlink): an address among them is this node, Nodes listed or not
    own_addresses: frozenset[IPAddress] = frozenset()

    def inputs_json(self) -> dict[str, Any]:
        snap = self.inputs
        return {
            "generation": snap.generation,
            "complete": snap.complete,
            "synced": sorted(k.value for k in snap.synced),
            "nodes_known": snap.nodes_known,
            "resource_version": self.resource_version,
            "applied_resource_version": self.applied_resource_version,
            "apply_error": self.apply_error,
        }


@attrs.frozen
class Party:
    """One end: what was asked, and what it is (``kind`` None: not resolved)."""

    query: str
    kind: str | None = None  # "pod", "node" or "address"
    address: IPAddress | None = None
    pod: PolicyPod | None = None  # with a host veth (this node's pods: their own)
    node: str | None = None  # the pod's node, or the node itself
    local: bool = False  # one of this agent's attached pods
    addresses: tuple[IPAddress, ...] = attrs.field(default=(), eq=False)  # every one (before a family is chosen)

    @property
    def endpoint(self) -> Endpoint:
        assert self.address is not None
        return Endpoint(self.address, self.pod, self.node if self.kind == "node" else None)

    @property
    def label(self) -> str:
        if self.pod is not None:
            return self.pod.key
        if self.kind == "node":
            return f"node {self.node}"
        return str(self.address) if self.address is not None else self.query

    def to_json(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "kind": self.kind,
            "pod": self.pod.key if self.pod is not None else None,
            "node": self.node,
            "address": str(self.address) if self.address is not None else None,
        }


@attrs.frozen
class PathStep:
    """One step of a direction's path: a tier consulted and what it did.

    ``tier``: ``Admin``/``Baseline`` (ClusterNetworkPolicy), ``NetworkPolicy``,
    or ``none`` (what no tier decides).  ``action``: a ClusterNetworkPolicy
    rule's ``Accept``/``Deny``/``Pass``; ``Allow`` (a NetworkPolicy rule, or
    nothing denies); ``Deny`` (isolated, no rule allows); ``NoMatch`` (a tier
    or policy entered, no rule of it matches); ``NotIsolated``.
    """

    tier: str
    action: str
    policy: str = ""  # ClusterNetworkPolicy name, or NetworkPolicy "ns/name"
    priority: int | None = None
    rule: str = ""  # a ClusterNetworkPolicy rule's name (or "egress[2]")
    rule_index: int | None = None  # its place in the policy's ingress/egress list
    resource_version: str = ""
    isolated_by: tuple[str, ...] = ()  # the NetworkPolicies isolating the pod (action Deny)
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "action": self.action,
            "policy": self.policy,
            "priority": self.priority,
            "rule": self.rule,
            "rule_index": self.rule_index,
            "resource_version": self.resource_version,
            "isolated_by": list(self.isolated_by),
            "detail": self.detail,
        }


@attrs.frozen
class DirectionVerdict:
    """One direction: whose policy (``subject``), where (``node``, ``hook``), the verdict and the path to it.

    ``decided_by``: ``Admin``, ``NetworkPolicy``, ``Baseline`` (a rule of that tier), ``default``
    (nothing denies), ``no-policy`` (no policy of any tier selects the pod), ``not-a-pod``,
    ``own-node`` (a node and its own pods), ``same-pod``.  ``reference``: the reference evaluator's
    verdict; ``applied``: the ruleset in force on this node (its own pods; None: not checked)."""

    direction: str  # "egress" / "ingress"
    subject: str | None  # the pod ("ns/name") whose policy this is
    node: str | None
    hook: str | None  # "forward", "input"; None: nothing filters
    allowed: bool
    decided_by: str
    path: tuple[PathStep, ...] = ()
    trace: Trace | None = None
    reference: bool | None = None
    applied: bool | None = None

    def to_json(self) -> dict[str, Any]:
        trace = self.trace
        return {
            "direction": self.direction,
            "subject": self.subject,
            "node": self.node,
            "hook": self.hook,
            "verdict": _word(self.allowed),
            "decided_by": self.decided_by,
            "path": [s.to_json() for s in self.path],
            "trace": None
            if trace is None
            else {
                "chain": trace.chain,
                "steps": [{"chain": s.chain, "rule": s.rule, "verdict": s.verdict} for s in trace.steps],
                "verdict": trace.verdict,
            },
            "reference": None if self.reference is None else _word(self.reference),
            "applied": None if self.applied is None else _word(self.applied),
        }


def _word(allowed: bool) -> str:
    return Verdict.ALLOWED.value if allowed else Verdict.DENIED.value


@attrs.frozen
class Explanation:
    query: Query
    source: Party
    destination: Party
    verdict: Verdict
    why: str = ""  # for UNKNOWN: why
    family: int | None = None
    egress: DirectionVerdict | None = None
    ingress: DirectionVerdict | None = None
    reference: bool | None = None
    inputs: Mapping[str, Any] = attrs.field(factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.source.to_json(),
            "to": self.destination.to_json(),
            "port": self.query.port,
            "protocol": self.query.protocol.value,
            "family": self.family,
            "verdict": self.verdict.value,
            "why": self.why,
            "egress": self.egress.to_json() if self.egress is not None else None,
            "ingress": self.ingress.to_json() if self.ingress is not None else None,
            "reference": None if self.reference is None else _word(self.reference),
            "inputs": dict(self.inputs),
            "notes": list(self.notes),
        }

    def text(self) -> str:
        return explanation_text(self.to_json())


# -- the ends --------------------------------------------------------------------------------


def _resolve(text: str, view: AgentView, pods: Mapping[str, PolicyPod]) -> Party:
    snap = view.inputs
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        address = None
    if address is not None:
        holders = sorted((p for p in pods.values() if p.selectable and address in p.addresses), key=lambda p: p.key)
        if len(holders) > 1:
            names = ", ".join(p.key for p in holders[:5]) + (
                f" and {len(holders) - 5} more" if len(holders) > 5 else ""
            )
            raise CannotTell(f"{address} is ambiguous: the address of {len(holders)} pods ({names})")
        if holders:  # that address of the pod (the family asked for, too)
            return attrs.evolve(_pod_party(text, holders[0], view), addresses=(address,))
        nodes = sorted(n.name for n in snap.nodes.values() if address in n.addresses)
        if len(nodes) > 1:
            raise CannotTell(f"{address} is ambiguous: an address of nodes {', '.join(nodes[:5])}")
        if nodes:
            return Party(text, "node", address, node=nodes[0], addresses=(address,))
        if address in view.own_addresses:  # this node's, known without Node objects
            return Party(text, "node", address, node=view.node, addresses=(address,))
        return Party(text, "address", address, addresses=(address,))
    if "/" in text:
        pod = pods.get(text)
        if pod is None:
            raise CannotTell(f"pod {text} is unknown to the agent (no such pod, or not listed yet)")
        if not pod.selectable:
            raise CannotTell(
                f"pod {text} is hostNetwork or has finished: policy sees only its addresses; "
                "ask for its node or its address"
            )
        if not pod.addresses:
            raise CannotTell(f"pod {text} has no address yet")
        return _pod_party(text, pod, view)
    node = snap.nodes.get(text)
    if node is not None:
        if not node.addresses:
            raise CannotTell(f"node {text} has no address in its status")
        return Party(text, "node", node=text, addresses=node.addresses)
    if text == view.node and view.own_addresses:
        # this agent's node: its own addresses (link-local ones and the pods' gateways left out)
        mine = tuple(sorted((a for a in view.own_addresses if not a.is_link_local), key=lambda a: (a.version != 6, a)))
        if mine:
            return Party(text, "node", node=text, addresses=mine)
    if not snap.nodes_known and (text == view.node or any(p.node == text for p in pods.values())):
        raise CannotTell(
            f"the addresses of node {text} are unknown: flock lists Nodes only while a ClusterNetworkPolicy "
            "has a nodes peer; ask for the node's address"
        )
    raise CannotTell(f"{text}: no such pod (NS/POD), node, or address")


def _pod_party(text: str, pod: PolicyPod, view: AgentView) -> Party:
    local = view.local_pods.get(pod.key) is pod
    if pod.host_veth is None:  # another node's pod (or one not attached here yet): a veth as its agent's
        pod = attrs.evolve(pod, host_veth=f"flock{fnv1a_32(pod.key):08x}")
    return Party(text, "pod", pod=pod, node=pod.node or None, local=local, addresses=pod.addresses)


def _family(wanted: int | None, src: Party, dst: Party) -> int:
    """The family asked for, or the one an address end has, or the one both ends have (IPv6 first)."""
    if wanted is not None:
        for party in (src, dst):
            if not any(a.version == wanted for a in party.addresses):
                raise CannotTell(f"{party.label} has no IPv{wanted} address")
        return wanted
    given = {p.addresses[0].version for p in (src, dst) if _is_address(p.query)}
    if len(given) > 1:
        raise CannotTell(f"{src.query} and {dst.query} are addresses of different families")
    for family in given or FAMILIES:
        if all(any(a.version == family for a in p.addresses) for p in (src, dst)):
            return family
    raise CannotTell(f"{src.label} and {dst.label} have no address family in common")


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _at(party: Party, family: int) -> Party:
    return attrs.evolve(party, address=next(a for a in party.addresses if a.version == family))


# -- naming what the packet met ---------------------------------------------------------------

_ACTIONS = {"accept": Action.ACCEPT, "drop": Action.DENY, "return": Action.PASS}


def _cnp_rule_index(cnp: ClusterNetworkPolicy, direction: Direction, label: str) -> int | None:
    """The place of the rule the compiler labelled *label* (labels are the compiler's own, never parsed:
    a rule may well be named "block-ingress[0]")."""
    return next((i for i, own in enumerate(rule_labels(cnp, direction)) if own == label), None)


def np_rule_index(policy: NetworkPolicy, direction: Direction, chain: Chain, index: int) -> int | None:
    """The rule of *policy* that the compiler turned into rule *index* of its *chain* (None: the chain is
    not laid out as the compiler lays out that policy, for any set of families)."""
    rules = policy.ingress if direction is Direction.INGRESS else policy.egress
    for count in range(len(FAMILIES), -1, -1):
        for start in range(len(FAMILIES) - count + 1):
            builder = _RuleBuilder(FAMILIES[start : start + count])
            owners: list[int] = []
            body: list[object] = []
            for i, rule in enumerate(rules):
                made = builder.rules(policy, rule, direction)
                body += made
                owners += [i] * len(made)
            if tuple(body) == chain.rules:
                return owners[index] if 0 <= index < len(owners) else None
    return None


def _isolating(snap: PolicySnapshot, pod: PolicyPod, direction: Direction) -> tuple[NetworkPolicy, ...]:
    labels = pod.label_map
    return tuple(
        p
        for _, p in sorted(snap.policies.items())
        if p.namespace == pod.namespace and direction in p.policy_types and p.pod_selector.matches(labels)
    )


def _path(
    rs: Ruleset, trace: Trace, pod: PolicyPod, direction: Direction, snap: PolicySnapshot
) -> tuple[tuple[PathStep, ...], str]:
    """The steps *trace* (through the chains of *pod* in *rs*) stands for, and what decided."""
    steps: list[PathStep] = []
    decided = "default"
    isolating = _isolating(snap, pod, direction)
    way = direction.value.lower()
    not_isolated = PathStep(
        "NetworkPolicy", "NotIsolated", detail=f"no NetworkPolicy selects {pod.key} for {way}: not isolated"
    )
    for step in trace.steps:
        owners = rs.tier_rules.get(step.chain)
        if owners is not None:
            tier = Tier.ADMIN if step.chain.startswith("ta-") else Tier.BASELINE
            if step.end:
                steps.append(PathStep(tier.value, "NoMatch", detail="no rule matches"))
                continue
            name, label = owners[step.rule]
            cnp = snap.cluster_policies.get(name)
            action = _ACTIONS[step.verdict]
            detail = ""
            index = None
            if cnp is not None:
                index = _cnp_rule_index(cnp, direction, label)
                rules = cnp.ingress if direction is Direction.INGRESS else cnp.egress
                rule = rules[index] if index is not None and index < len(rules) else None
                if rule is not None and rule.unreadable:
                    detail = f"fails closed: {rule.unreadable}"
                elif rule is not None and rule.action is not action:
                    detail = "fails closed: Nodes are not listed, so a nodes peer may be any address"
            steps.append(
                PathStep(
                    tier.value,
                    action.value,
                    name,
                    cnp.priority if cnp is not None else None,
                    label,
                    index,
                    cnp.resource_version if cnp is not None else "",
                    detail=detail,
                )
            )
            if action is not Action.PASS:
                decided = tier.value
            continue
        key = rs.policy_chains.get(step.chain)
        if key is not None:
            policy = snap.policies.get(key)
            rv = policy.resource_version if policy is not None else ""
            if step.end:
                steps.append(PathStep("NetworkPolicy", "NoMatch", key, resource_version=rv, detail="no rule allows"))
                continue
            index = np_rule_index(policy, direction, rs.chains[step.chain], step.rule) if policy is not None else None
            steps.append(PathStep("NetworkPolicy", "Allow", key, rule_index=index, resource_version=rv))
            decided = "NetworkPolicy"
            continue
        # the pod's own chain: jumps to the tiers and policies, the isolation's drop, or its end
        if step.verdict.startswith("jump "):
            if step.verdict[5:].startswith("tb-") and not isolating:
                steps.append(not_isolated)
            continue
        if step.verdict == "drop":
            steps.append(
                PathStep(
                    "NetworkPolicy",
                    "Deny",
                    isolated_by=tuple(p.key for p in isolating),
                    detail="isolated; no rule of these policies allows it",
                )
            )
            decided = "NetworkPolicy"
        elif step.end:
            if not isolating and not_isolated not in steps:
                steps.append(not_isolated)
            steps.append(PathStep("none", "Allow", detail="no policy denies it"))
    return tuple(steps), decided


# -- one direction ----------------------------------------------------------------------------


@attrs.define(eq=False)
class _Rulesets:
    """The ruleset of each node the question touches, compiled with the ends on it as its local pods."""

    view: AgentView
    pods: Mapping[str, PolicyPod]
    ends: tuple[Party, ...]
    _compiler: Compiler = attrs.field(init=False, factory=Compiler)
    _made: dict[str | None, Ruleset] = attrs.field(init=False, factory=dict)

    def of(self, node: str | None) -> Ruleset:
        rs = self._made.get(node)
        if rs is None:
            snap = self.view.inputs
            local = {p.pod.key: p.pod for p in self.ends if p.pod is not None and p.node == node}
            rs = self._made[node] = self._compiler.compile(
                snap.policies.values(),
                snap.namespaces.values(),
                self.pods.values(),
                local.values(),
                snap.cluster_policies.values(),
                snap.nodes.values(),
                snap.nodes_known,
            )
        return rs


_TRACERS = {"egress": trace_egress, "ingress": trace_ingress, "input": trace_input}


def _traced(
    rulesets: _Rulesets, view: AgentView, party: Party, direction: Direction, hook: str, pkt: Packet
) -> DirectionVerdict:
    """*party*'s pod's policy for *direction*, through the *hook* chain of its node's ruleset."""
    assert party.pod is not None
    rs = rulesets.of(party.node)
    trace = _TRACERS[hook](rs, pkt)
    way = direction.value.lower()
    path: tuple[PathStep, ...]
    if trace.chain is not None:
        path, decided = _path(rs, trace, party.pod, direction, view.inputs)
    elif hook == "input":
        path, decided = (PathStep("Admin", "NoMatch", detail=f"no Admin tier policy selects {party.pod.key}"),), ""
    else:
        path = (PathStep("none", "Allow", detail=f"no policy of any tier selects {party.pod.key} for {way}"),)
        decided = "no-policy"
    if hook == "input" and decided != Tier.ADMIN.value:
        # the NetworkPolicy tier allows node <-> own pods: nothing after the Admin tier is asked
        path += (PathStep("NetworkPolicy", "Allow", detail="a pod may always reach its own node"),)
        decided = "own-node"
    applied = None
    if party.local and view.ruleset is not None:
        applied = _TRACERS[hook](view.ruleset, pkt).allowed
    return DirectionVerdict(
        direction.value.lower(),
        party.pod.key,
        party.node,
        "input" if hook == "input" else "forward",
        trace.allowed,
        decided,
        path,
        trace,
        applied=applied,
    )


def _unfiltered(direction: str, subject: Party | None, node: str | None, decided: str, detail: str) -> DirectionVerdict:
    subject_key = subject.pod.key if subject is not None and subject.pod is not None else None
    return DirectionVerdict(
        direction, subject_key, node, None, True, decided, (PathStep("none", "Allow", detail=detail),)
    )


# -- the whole --------------------------------------------------------------------------------


def explain(view: AgentView, query: Query) -> Explanation:
    """Why *query*'s source may or may not reach its destination, as *view* says (see the module doc)."""
    snap = view.inputs
    src, dst = Party(query.source), Party(query.destination)
    info = view.inputs_json()
    if not snap.complete:
        waiting = ", ".join(sorted(k.value for k in _REQUIRED - snap.synced))
        return Explanation(
            query,
            src,
            dst,
            Verdict.UNKNOWN,
            f"the policy inputs are not listed yet (waiting for {waiting})",
            inputs=info,
        )
    pods = {**snap.pods, **view.local_pods}
    try:
        src = _resolve(query.source, view, pods)
        dst = _resolve(query.destination, view, pods)
        family = _family(query.family, src, dst)
    except CannotTell as exc:
        return Explanation(query, src, dst, Verdict.UNKNOWN, str(exc), query.family, inputs=info)
    src, dst = _at(src, family), _at(dst, family)
    notes: list[str] = []
    egress, ingress, reference = _directions(view, pods, src, dst, query, notes)
    verdict = Verdict.ALLOWED if egress.allowed and ingress.allowed else Verdict.DENIED
    why = ""
    disagree = [
        f"{d.direction}: the compiled ruleset says {_word(d.allowed)}, the reference evaluator {_word(d.reference)}"
        for d in (egress, ingress)
        if d.reference is not None and d.reference != d.allowed
    ]
    if reference is not None and reference != (verdict is Verdict.ALLOWED):
        disagree.append(f"the compiled rulesets say {verdict.value}, the reference evaluator {_word(reference)}")
    in_force = [
        f"{d.direction}: the ruleset in force on {view.node} says {_word(d.applied)}"
        for d in (egress, ingress)
        if d.applied is not None and d.applied != d.allowed
    ]
    if disagree:
        why = "; ".join(disagree) + ": a bug in flock (please report it with this output)"
    elif in_force:
        why = "; ".join(in_force) + (
            f" (nftables refused the last ruleset: {view.apply_error})"
            if view.apply_error
            else " (an apply is pending: run again)"
        )
    elif view.apply_error and any(d.applied is not None for d in (egress, ingress)):
        why = f"nftables refused the last ruleset, the kernel holds an older one: {view.apply_error}"
    if why:
        notes.insert(0, f"computed: {verdict.value}")
        verdict = Verdict.UNKNOWN
    return Explanation(query, src, dst, verdict, why, family, egress, ingress, reference, info, tuple(notes))


def _directions(
    view: AgentView, pods: Mapping[str, PolicyPod], src: Party, dst: Party, query: Query, notes: list[str]
) -> tuple[DirectionVerdict, DirectionVerdict, bool | None]:
    snap = view.inputs
    port, proto = query.port, query.protocol
    assert src.address is not None and dst.address is not None
    if src.pod is not None and dst.pod is not None and src.pod.key == dst.pod.key:
        detail = "a pod reaching itself never leaves its network namespace"
        return (
            _unfiltered("egress", src, src.node, "same-pod", detail),
            _unfiltered("ingress", dst, dst.node, "same-pod", detail),
            None,
        )
    namespaces: dict[str, Namespace] = dict(snap.namespaces)
    cnps = list(snap.cluster_policies.values())
    nodes = list(snap.nodes.values()) if snap.nodes_known else None
    policies = list(snap.policies.values())
    reference = evaluate(policies, namespaces.values(), src.endpoint, dst.endpoint, port, proto, cnps, nodes)
    rulesets = _Rulesets(view, pods, (src, dst))
    same_node = src.node is not None and src.node == dst.node
    veth_src = (src.pod.host_veth or "") if src.pod is not None else ""
    veth_dst = (dst.pod.host_veth or "") if dst.pod is not None else ""

    def ref(subject: Party, other: Party, direction: Direction) -> bool:
        assert subject.pod is not None
        return _direction_allows(
            policies, cnps, namespaces, nodes, subject.pod, other.endpoint, dst.endpoint, port, proto, direction
        )

    if src.kind == "node" and dst.pod is not None and same_node:
        detail = "the node reaching its own pods is never filtered (kubelet probes)"
        return (
            _unfiltered("egress", None, src.node, "own-node", detail),
            _unfiltered("ingress", dst, dst.node, "own-node", detail),
            reference,
        )
    if dst.kind == "node" and src.pod is not None and same_node:
        pkt = Packet(src.address, dst.address, proto, port, iif=veth_src)
        egress = _traced(rulesets, view, src, Direction.EGRESS, "input", pkt)
        admin = tier_action(
            cnps, Tier.ADMIN, namespaces, nodes, src.pod, dst.endpoint, dst.endpoint, port, proto, Direction.EGRESS
        )
        egress = attrs.evolve(egress, reference=admin is not Action.DENY)
        ingress = _unfiltered(
            "ingress", None, dst.node, "own-node", f"{src.pod.key}'s own node: no ingress policy filters it"
        )
        return egress, ingress, reference
    if src.pod is not None:
        pkt = Packet(src.address, dst.address, proto, port, iif=veth_src, oif=veth_dst if same_node else "")
        egress = attrs.evolve(
            _traced(rulesets, view, src, Direction.EGRESS, "egress", pkt), reference=ref(src, dst, Direction.EGRESS)
        )
    else:
        egress = _unfiltered("egress", None, src.node, "not-a-pod", f"{src.label} is no pod: no egress policy")
    if dst.pod is not None:
        pkt = Packet(src.address, dst.address, proto, port, iif=veth_src if same_node else "", oif=veth_dst)
        ingress = attrs.evolve(
            _traced(rulesets, view, dst, Direction.INGRESS, "ingress", pkt), reference=ref(dst, src, Direction.INGRESS)
        )
    else:
        ingress = _unfiltered("ingress", None, dst.node, "not-a-pod", f"{dst.label} is no pod: no ingress policy")
    for d in (egress, ingress):
        if d.hook is not None and d.node != view.node:
            notes.append(
                f"{d.direction} is enforced by the agent on {d.node or '(no node)'}: computed from this agent's inputs"
            )
    # Nodes are listed only while a ClusterNetworkPolicy has a nodes peer: an address may be a node's unknown
    if not snap.nodes_known and src.pod is not None and dst.kind == "address":
        notes.append(f"if {dst.address} is {src.pod.key}'s own node's, the Admin tier alone decides (input hook)")
    if not snap.nodes_known and dst.pod is not None and src.kind == "address":
        notes.append(f"if {src.address} is {dst.pod.key}'s own node's, nothing filters it (the node's own pod)")
    return egress, ingress, reference


# -- text -------------------------------------------------------------------------------------


def _step_text(step: Mapping[str, Any], direction: str) -> str:
    tier, action, policy, detail = step["tier"], step["action"], step["policy"], step["detail"]
    rv = f"rv {step['resource_version']}" if step["resource_version"] else ""
    if tier in ("Admin", "Baseline"):
        if action == "NoMatch":
            return f"{tier} tier: no rule matches"
        facts = ", ".join(f for f in (f"priority {step['priority']}" if step["priority"] is not None else "", rv) if f)
        text = (
            f"{tier} tier: ClusterNetworkPolicy {policy}{f' ({facts})' if facts else ''} rule {step['rule']}: {action}"
        )
        return f"{text} ({detail})" if detail else text
    if tier == "NetworkPolicy":
        named = f"NetworkPolicy {policy}{f' ({rv})' if rv else ''}"
        if action == "Allow" and policy:
            index = step["rule_index"]
            return f"{named}: {direction}[{'?' if index is None else index}] allows"
        if action == "NoMatch":
            return f"{named}: no rule allows"
        if action == "Deny":
            return f"isolated by {', '.join(step['isolated_by']) or 'NetworkPolicy'}: no rule allows it"
        return f"NetworkPolicy: {detail}"
    return f"→ {detail}"


def _party_text(party: Mapping[str, Any]) -> str:
    kind = party["kind"]
    if kind == "pod":
        facts = [f"pod on {party['node']}" if party["node"] else "pod", party["address"]]
        return f"{party['pod']} ({', '.join(f for f in facts if f)})"
    if kind == "node":
        return f"node {party['node']}" + (f" ({party['address']})" if party["address"] else "")
    if kind == "address":
        return f"{party['address']} (no pod or node known to have it)"
    return party["query"]


def _verdict_word(verdict: str) -> str:
    return verdict.upper() if verdict == Verdict.DENIED.value else verdict


def explanation_text(doc: Mapping[str, Any]) -> str:
    """An explanation in its JSON form (:meth:`Explanation.to_json`), for people."""
    family = f" over IPv{doc['family']}" if doc["family"] else ""
    lines = [
        f"from     {_party_text(doc['from'])}",
        f"to       {_party_text(doc['to'])}",
        f"         {doc['protocol']}/{doc['port']}{family}",
    ]
    for key in ("egress", "ingress"):
        d = doc[key]
        if d is None:
            continue
        where = (d["subject"] or "no pod") + (f" on {d['node']}" if d["node"] else "")
        hook = f" ({d['hook']} hook)" if d["hook"] else ""
        lines.append(f"{key:<8} {_verdict_word(d['verdict']):<8} {where}{hook}")
        lines += [f"           {_step_text(step, key)}" for step in d["path"]]
        if d["trace"] is not None and d["trace"]["steps"]:
            chains = " → ".join(f"{s['chain']}[{s['rule']}] {s['verdict'] or 'end'}" for s in d["trace"]["steps"])
            lines.append(f"           chains: {chains}")
        if d["applied"] is not None:
            agrees = "agrees" if d["applied"] == d["verdict"] else f"says {_verdict_word(d['applied'])}"
            lines.append(f"           the ruleset in force on {d['node']} {agrees}")
        verified = (doc.get("verify") or {}).get(key)
        if verified is not None:
            lines += _kernel_lines(verified)
    if doc["verdict"] == Verdict.UNKNOWN.value:
        lines.append(f"verdict  CANNOT TELL: {doc['why']}")
    else:
        checked = " (the reference evaluator agrees)" if doc["reference"] is not None else ""
        lines.append(f"verdict  {_verdict_word(doc['verdict'])}{checked}")
    if doc.get("verify") is not None:
        lines += _verify_lines(doc["verify"])
    lines += [f"note     {note}" for note in doc["notes"]]
    inputs = doc["inputs"]
    if inputs:
        lines.append(
            f"inputs   generation {inputs['generation']}; resourceVersion {inputs['resource_version']} watched, "
            f"{inputs['applied_resource_version']} in force" + ("" if inputs["complete"] else "; not all listed yet")
        )
    return "\n".join(lines)


# -- --verify: what the kernel did, next to the explanation -----------------------------------------


def kernel_step_text(step: Mapping[str, Any]) -> str:
    """One step of the kernel's walk (:meth:`flock.policy._trace.KernelStep.to_json`), as the chains line
    writes the explanation's: ``chain[rule, handle H] verdict`` (``?``: no rule of the ruleset in force)."""
    chain, part, verdict = step["chain"], step["part"], step["verdict"]
    if part == "policy":
        return f"{chain} policy {verdict}"
    if part == "end":
        return f"{chain}[{step['rule']}] end" if step["rule"] is not None else f"{chain} end"
    if part == "base":
        return f"{chain}[handle {step['handle']}] {verdict}"
    rule = "?" if step["rule"] is None else step["rule"]
    return f"{chain}[{rule}, handle {step['handle']}] {'log' if part == 'log' else verdict}"


def _kernel_lines(check: Mapping[str, Any]) -> list[str]:
    """A direction's kernel walk and whether it agrees (under its chains line)."""
    walk, status = check["kernel"], check["status"]
    if walk is None:
        word = "agrees" if status == "agrees" else status.replace("-", " ").upper()
        return [f"           kernel {word}: {check['why'] or 'no chain of flock filtered it'}"]
    path = " → ".join(kernel_step_text(s) for s in walk["steps"]) or f"{walk['chain']}: no rule matched"
    return [f"           kernel {'agrees' if status == 'agrees' else 'DISAGREES'}: {path}"]  # why: after the verdict


def _verify_lines(verify: Mapping[str, Any]) -> list[str]:
    """--verify's own lines, after the verdict."""
    status, probe = verify["status"], verify["probe"]
    if status == "agrees":
        sent = ""
        if probe is not None:
            sent = (
                f": one {probe['protocol']} packet {probe['from']} port {probe['sport']} → {probe['to']} port "
                f"{probe['dport']}, traced on {verify['node']} (trace id {probe['trace_id']})"
            )
        lines = [f"kernel   agrees{sent}"]
    elif status == "disagrees":
        lines = [f"kernel   DISAGREES: {verify['why']}"]
    else:
        lines = [f"kernel   NOT VERIFIED: {verify['why']}"]
    return lines + [f"note     {note}" for note in verify["notes"]]
