"""``flockctl policy explain --verify``, the pure half: the kernel's trace of one packet held to the explanation.

What to send (:func:`verify_plan`): the query's first packet from a socket in
the source pod's network namespace (a :class:`Target`); only a pod on this
node can send it.  :class:`flock.policy._tracer.Tracer` sends it with tracing
on for it alone and hands back what the kernel showed (:class:`Captured`):
the trace events (:class:`flock.policy._nfnetlink.TraceEvent`: chain, rule
handle, verdict) and the rules of ``table inet flock`` at the time
(:class:`flock.policy._nfnetlink.KernelRule`).

Here, all of it pure:

- :func:`place_rules` names each kernel rule by its handle: the compiled rule
  it is (a logged drop is two kernel rules: its log rule, then the drop), a
  base chain's fixed rule, or none of flock's;
- :func:`kernel_trace` turns the events into the walk of each of flock's base
  chains (``egress``, ``ingress`` in the forward hook, ``input``) and the hooks
  the packet got through (the trace table's end chains, :data:`TRACE_END_CHAINS`);
- :func:`verify` holds each walk to the explanation's trace of that direction:
  the same rules in the same order and the same deciding rule, or the two
  part and it says where (:func:`verification_of` for a :class:`Captured`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ._explain import DirectionVerdict, Explanation, Verdict, kernel_step_text
from ._model import IPAddress, Protocol
from ._nfnetlink import Flow, KernelRule, TraceEvent
from ._nft import EGRESS_CHAIN, INGRESS_CHAIN, INPUT_CHAIN, TABLE
from ._ruleset import Ruleset

TRACE_TABLE = "flock-trace"  # the table that traces the probe (``inet``, made by the tracer)
TRACE_END_CHAINS = {"fwd-end": "forward", "in-end": "input"}  # the trace table's markers → the hook they close
_BASE_CHAINS = (EGRESS_CHAIN, INGRESS_CHAIN, INPUT_CHAIN)


# -- what to send and what came back: values ------------------------------------------------------


@attrs.frozen
class Target:
    """What --verify sends: the query's first packet from the source pod (``pod``, on this node, behind
    host veth ``iif``) to the destination's address."""

    pod: str
    iif: str
    saddr: IPAddress
    daddr: IPAddress
    protocol: Protocol
    dport: int


@attrs.frozen
class Captured:
    """What one traced packet left: its flow, the trace events read, ``table inet flock``'s rules when it
    was sent, whether they changed meanwhile, and whether trace messages were lost (the socket full)."""

    flow: Flow
    events: tuple[TraceEvent, ...]
    rules: tuple[KernelRule, ...]
    changed: bool = False
    lost: bool = False


# -- naming the kernel's rules: pure --------------------------------------------------------------


@attrs.frozen
class RulePlace:
    """What a kernel rule of ``table inet flock`` is: rule ``index`` of its compiled chain (``part``
    "rule", or "log": a logged drop's log rule), a base chain's fixed rule (``part`` "base", ``note``
    "established", "vmap" or "always"), or none of the ruleset's (``part`` "foreign", ``note`` why)."""

    chain: str
    handle: int
    part: str
    index: int | None = None
    note: str = ""


@attrs.frozen
class Places:
    """Every rule of the table by handle, and per compiled chain how many rules it has (for its end)."""

    rules: Mapping[int, RulePlace] = attrs.field(factory=dict)
    lengths: Mapping[str, int] = attrs.field(factory=dict)


def _expected(ruleset: Ruleset, chain: str) -> list[tuple[int, str, str]]:
    """(compiled index, part, kernel action) of each kernel rule *chain* should hold."""
    out = []
    for i, rule in enumerate(ruleset.chains[chain].rules):
        if rule.log is not None:
            out.append((i, "log", "log"))
        out.append((i, "rule", rule.verdict))
    return out


def place_rules(rules: Iterable[KernelRule], ruleset: Ruleset | None) -> Places:
    """Name each of *rules* (``table inet flock`` in the kernel, in chain order) from *ruleset* (the one in
    force).  A compiled chain's kernel rules are matched to its rules in order by what they do; a kernel
    rule that matches none (put there by hand, say) is "foreign"."""
    chains: dict[str, list[KernelRule]] = {}
    for rule in rules:
        chains.setdefault(rule.chain, []).append(rule)
    compiled = ruleset.chains if ruleset is not None else {}
    places: dict[int, RulePlace] = {}
    for chain, held in chains.items():
        if chain in _BASE_CHAINS:
            for r in held:
                if "ct" in r.expressions and r.action == "accept":
                    places[r.handle] = RulePlace(chain, r.handle, "base", note="established")
                elif r.action == "vmap":
                    places[r.handle] = RulePlace(chain, r.handle, "base", note="vmap")
                elif chain == INPUT_CHAIN and r.action == "accept":
                    places[r.handle] = RulePlace(chain, r.handle, "base", note="always")
                else:
                    places[r.handle] = RulePlace(chain, r.handle, "foreign", note="not one of the base chain's rules")
            continue
        if chain not in compiled:
            for r in held:
                places[r.handle] = RulePlace(
                    chain, r.handle, "foreign", note="a chain the ruleset in force does not have"
                )
            continue
        assert ruleset is not None
        want = _expected(ruleset, chain)
        k = 0
        for r in held:
            if k < len(want) and want[k][2] == r.action:
                places[r.handle] = RulePlace(chain, r.handle, want[k][1], want[k][0])
                k += 1
            else:
                places[r.handle] = RulePlace(chain, r.handle, "foreign", note="not a rule the ruleset in force has")
        if k < len(want):  # not the compiled chain with rules added: name none of it
            why = f"the chain holds {len(held)} rules in the kernel, {len(want)} in the ruleset in force"
            for r in held:
                places[r.handle] = RulePlace(chain, r.handle, "foreign", note=why)
    lengths = {name: len(c.rules) for name, c in compiled.items()}
    return Places(places, lengths)


# -- the kernel's walk: pure -------------------------------------------------------------------------


@attrs.frozen
class KernelStep:
    """One event of a walk, named: a rule that matched (``handle``; ``index``/``part``/``note`` as
    :class:`RulePlace`), a chain's end (``part`` "end", ``index`` its length when known) or the base
    chain's policy (``part`` "policy")."""

    chain: str
    verdict: str
    handle: int | None = None
    index: int | None = None
    part: str = "rule"
    note: str = ""

    def text(self) -> str:
        return kernel_step_text(self.to_json())

    def to_json(self) -> dict[str, Any]:
        return {
            "chain": self.chain,
            "handle": self.handle,
            "rule": self.index,
            "part": self.part,
            "verdict": self.verdict,
            "note": self.note,
        }


@attrs.frozen
class KernelWalk:
    """One of flock's base chains as the kernel walked the packet through it; ``verdict`` "accept" or "drop"."""

    chain: str
    steps: tuple[KernelStep, ...]
    verdict: str

    def to_json(self) -> dict[str, Any]:
        return {"chain": self.chain, "verdict": self.verdict, "steps": [s.to_json() for s in self.steps]}


@attrs.frozen
class KernelTrace:
    """What the kernel did with the probe: ``seen`` (it was traced at all), flock's base chains it met
    (``walks``), the hooks it got through flock's chains of (``passed``: "forward", "input"), and a drop
    by a table not flock's (``dropped_elsewhere``)."""

    flow: Flow
    seen: bool = False
    walks: Mapping[str, KernelWalk] = attrs.field(factory=dict)
    passed: frozenset[str] = frozenset()
    dropped_elsewhere: str = ""
    trace_id: int | None = None

    @property
    def complete(self) -> bool:
        """Its fate is known: through a hook, or dropped."""
        return (
            bool(self.passed) or bool(self.dropped_elsewhere) or any(w.verdict == "drop" for w in self.walks.values())
        )


def _step(event: TraceEvent, places: Places) -> KernelStep:
    if event.kind == "policy":
        return KernelStep(event.chain, event.verdict, part="policy")
    if event.handle is None:
        return KernelStep(event.chain, event.verdict, index=places.lengths.get(event.chain), part="end")
    place = places.rules.get(event.handle)
    if place is None or place.chain != event.chain:
        return KernelStep(
            event.chain, event.verdict, event.handle, part="foreign", note="a rule not in the table's dump"
        )
    return KernelStep(event.chain, event.verdict, event.handle, place.index, place.part, place.note)


def kernel_trace(events: Iterable[TraceEvent], flow: Flow, places: Places) -> KernelTrace:
    """The probe's way through the node's chains, from the trace *events* (in the order read): the
    events of the first trace that carries *flow*, each base chain's from the event carrying the packet."""
    trace_id = None
    walks: dict[str, KernelWalk] = {}
    passed: set[str] = set()
    elsewhere = ""
    current: str | None = None  # the flock base chain being walked (None: another chain)
    steps: list[KernelStep] = []

    def close() -> None:
        if current is not None:
            verdict = "drop" if steps and steps[-1].verdict == "drop" else "accept"
            walks[current] = KernelWalk(current, tuple(steps), verdict)

    for event in events:
        if trace_id is None:
            if event.packet != flow:
                continue
            trace_id = event.trace_id
        elif event.trace_id != trace_id:
            continue
        if event.packet is not None:  # a base chain's first event
            close()
            current = event.chain if event.table == TABLE and event.chain in _BASE_CHAINS else None
            steps = []
        if event.table == TRACE_TABLE:
            if event.chain in TRACE_END_CHAINS:
                passed.add(TRACE_END_CHAINS[event.chain])
            continue
        if current is not None and event.table == TABLE:
            if event.handle is None and event.kind != "policy" and event.chain == current:
                continue  # the base chain's end: its policy follows
            steps.append(_step(event, places))
        elif event.table != TABLE and event.verdict == "drop" and not elsewhere:
            where = f" rule handle {event.handle}" if event.handle is not None else f" ({event.kind})"
            elsewhere = f"table {event.table} chain {event.chain}{where}"
    close()
    return KernelTrace(flow, trace_id is not None, walks, frozenset(passed), elsewhere, trace_id)


# -- held to the explanation: pure ---------------------------------------------------------------


@attrs.frozen
class Decision:
    """What decided a direction: ``verdict`` at ``chain`` rule ``index`` (a step), or nothing (chain None:
    no rule of flock's decided, the packet went on)."""

    verdict: str  # "accept" / "drop"
    chain: str | None = None
    index: int | None = None
    step: KernelStep | None = None  # the kernel's

    def same(self, other: Decision) -> bool:
        return (self.verdict, self.chain, self.index) == (other.verdict, other.chain, other.index)

    def kernel_text(self) -> str:
        s = self.step
        if s is None:
            return "let it through (no rule of flock's decided)"
        verb = "dropped" if self.verdict == "drop" else "accepted"
        if s.part == "policy":
            return f"dropped it by {s.chain}'s policy"
        if s.part == "base" and s.note == "established":
            return f"accepted it as a flow conntrack already knows ({s.chain}'s ct state rule, handle {s.handle})"
        if s.part == "base":
            return f"accepted it before any policy ({s.chain}'s rule handle {s.handle})"
        if s.index is None:
            return f"{verb} it at {s.chain} rule handle {s.handle} ({s.note})"
        return f"{verb} it at {s.chain}[{s.index}] (rule handle {s.handle})"

    def expected_text(self) -> str:
        if self.chain is None:
            return "it goes through (no rule decides)"
        return f"it is {'dropped' if self.verdict == 'drop' else 'accepted'} at {self.chain}[{self.index}]"


def _expected_decision(d: DirectionVerdict) -> Decision:
    trace = d.trace
    if trace is None or trace.chain is None:
        return Decision("accept")
    matched = [s for s in trace.steps if not s.end]
    if matched and matched[-1].verdict in ("accept", "drop"):
        return Decision(matched[-1].verdict, matched[-1].chain, matched[-1].rule)
    return Decision("accept")


def _kernel_decision(walk: KernelWalk) -> Decision:
    last = walk.steps[-1] if walk.steps else None
    if last is None or last.verdict not in ("accept", "drop") or (last.part == "policy" and last.verdict == "accept"):
        return Decision("accept")
    # a base chain's own rule or policy decides no direction the explanation names: never the same as its
    where = f"{last.chain}:{last.note or last.part}" if last.part in ("base", "policy") else last.chain
    return Decision(last.verdict, where, last.index, last)


@attrs.frozen
class DirectionCheck:
    """One direction held to the kernel: ``status`` "agrees", "disagrees" or "not-verified" (``why``)."""

    direction: str
    status: str
    why: str = ""
    walk: KernelWalk | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "why": self.why,
            "kernel": self.walk.to_json() if self.walk is not None else None,
        }


def _check(d: DirectionVerdict, base: str | None, kernel: KernelTrace, here: str, hook: str) -> DirectionCheck:
    """Direction *d* against the kernel's walk of flock's *base* chain (None: the packet meets none for it)."""
    name = d.direction
    if d.hook is not None and d.node != here:
        other = "ingress" if name == "egress" else "egress"
        return DirectionCheck(
            name,
            "not-verified",
            f"{name} not verified: {d.subject} is on {d.node or 'no node'}, whose kernel enforces it "
            f"(the packet can be sent only from a pod on this node, and traced only where it passes); "
            f"the {other} part was verified",
        )
    walk = kernel.walks.get(base) if base is not None else None
    expected = _expected_decision(d)
    if walk is None:
        if hook in kernel.passed:  # through the hook and no chain of flock's for it: nothing filtered it
            if expected.chain is None:
                return DirectionCheck(name, "agrees")
            return DirectionCheck(
                name,
                "disagrees",
                f"{name}: the kernel let it through without meeting flock's {base or hook} chain "
                f"where the explanation says {expected.expected_text()}",
            )
        if kernel.dropped_elsewhere or any(w.verdict == "drop" for w in kernel.walks.values()):
            return DirectionCheck(name, "not-verified", f"{name} not verified: the packet was dropped before it")
        return DirectionCheck(
            name, "not-verified", f"{name} not verified: the kernel did not show the packet in flock's {base} chain"
        )
    got = _kernel_decision(walk)
    entry = _entry_parting(d, walk)
    if not got.same(expected):
        why = f"{name}: the kernel {got.kernel_text()} where the explanation says {expected.expected_text()}"
        return DirectionCheck(name, "disagrees", why + (f" ({entry})" if entry else ""), walk)
    parted = entry or _parting(d, walk)
    if parted:
        return DirectionCheck(name, "disagrees", f"{name}: {parted}", walk)
    return DirectionCheck(name, "agrees", walk=walk)


def _entry_parting(d: DirectionVerdict, walk: KernelWalk) -> str:
    """The base chain's map sending the packet to another chain than the explanation's ("" the same)."""
    entry = next((s for s in walk.steps if s.part == "base" and s.note == "vmap"), None)
    named = entry.verdict.removeprefix("jump ").removeprefix("goto ") if entry is not None else None
    want = d.trace.chain if d.trace is not None else None
    if named == want:
        return ""
    return (
        f"the kernel's {walk.chain} chain sent it to {named or 'no chain'} where the explanation names {want or 'none'}"
    )


def _parting(d: DirectionVerdict, walk: KernelWalk) -> str:
    """Where the kernel's rules and the explanation's part ("" nowhere)."""
    trace = d.trace
    expected = [(s.chain, s.rule, s.verdict) for s in (trace.steps if trace is not None else ()) if not s.end]
    met = [s for s in walk.steps if s.handle is not None and s.part not in ("base", "log") and s.verdict != "continue"]
    for i in range(max(len(expected), len(met))):
        e = expected[i] if i < len(expected) else None
        k = met[i] if i < len(met) else None
        if k is not None and e is not None and (k.chain, k.index, k.verdict) == e:
            continue
        kernel = f"met {k.text()}" if k is not None else "met no further rule"
        explained = f"{e[0]}[{e[1]}] {e[2]}" if e is not None else "no further rule"
        return f"the kernel {kernel} where the explanation meets {explained}"
    return ""


@attrs.frozen
class Verification:
    """The kernel held to an explanation: ``status`` "agrees" (every direction it could check),
    "disagrees" (``why``: where they part) or "not-verified" (``why``)."""

    status: str
    why: str = ""
    node: str = ""
    flow: Flow | None = None
    checks: tuple[DirectionCheck, ...] = ()
    notes: tuple[str, ...] = ()
    trace_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        by = {c.direction: c.to_json() for c in self.checks}
        flow = self.flow
        return {
            "status": self.status,
            "why": self.why,
            "node": self.node,
            "probe": None
            if flow is None
            else {
                "from": str(flow.saddr),
                "to": str(flow.daddr),
                "protocol": flow.protocol_name,
                "sport": flow.sport,
                "dport": flow.dport,
                "trace_id": f"{self.trace_id:08x}" if self.trace_id is not None else None,
            },
            "egress": by.get("egress"),
            "ingress": by.get("ingress"),
            "notes": list(self.notes),
        }


def verify_plan(explanation: Explanation, here: str) -> Target | str:
    """The packet to send for *explanation* from node *here*, or why none can be."""
    src, dst = explanation.source, explanation.destination
    if explanation.verdict is Verdict.UNKNOWN:
        return "cannot verify: the explanation cannot tell, so there is nothing to hold the kernel to"
    if src.pod is None or src.address is None or dst.address is None:
        return "cannot verify: the source is no pod (the packet is sent from inside the source pod)"
    if not src.local or src.pod.host_veth is None:
        where = f"; run it on {src.node}" if src.node and src.node != here else ""
        return f"cannot verify: the source is not on this node{where}"
    if dst.pod is not None and dst.pod.key == src.pod.key:
        return "nothing to verify: a pod reaching itself never leaves its network namespace"
    return Target(
        src.pod.key, src.pod.host_veth, src.address, dst.address, explanation.query.protocol, explanation.query.port
    )


def verify(explanation: Explanation, here: str, kernel: KernelTrace) -> Verification:
    """Hold each direction of *explanation* to what *kernel* shows on node *here*."""
    egress, ingress = explanation.egress, explanation.ingress
    assert egress is not None and ingress is not None
    flow = kernel.flow
    if not kernel.seen:
        why = "cannot verify: the kernel never showed the packet (no trace of it within the wait)"
        return Verification("not-verified", why, here, flow)
    if not kernel.walks and not kernel.passed and not kernel.dropped_elsewhere:
        why = (
            f"cannot verify: the packet came into the node but met none of flock's chains and did not get "
            f"through them within the wait (no route to {flow.daddr}?)"
        )
        return Verification("not-verified", why, here, flow, trace_id=kernel.trace_id)
    into_node = egress.hook == "input"
    if not into_node and EGRESS_CHAIN not in kernel.walks and (INPUT_CHAIN in kernel.walks or "input" in kernel.passed):
        why = (
            f"cannot verify: the kernel delivered the packet to this node itself (the input hook) where the "
            f"explanation has it forwarded: it does not know {flow.daddr} for one of this node's addresses"
        )
        return Verification("not-verified", why, here, flow, trace_id=kernel.trace_id)
    notes = []
    checks = (
        _check(egress, INPUT_CHAIN if into_node else EGRESS_CHAIN, kernel, here, "input" if into_node else "forward"),
        _check(ingress, None if into_node else INGRESS_CHAIN, kernel, here, "input" if into_node else "forward"),
    )
    if not kernel.complete:
        notes.append("the kernel did not show the packet leaving flock's chains within the wait")
    if kernel.dropped_elsewhere:
        notes.append(f"{kernel.dropped_elsewhere} dropped it: that table is not flock's")
    disagree = [c.why for c in checks if c.status == "disagrees"]
    if disagree:
        return Verification("disagrees", "; ".join(disagree), here, flow, checks, tuple(notes), kernel.trace_id)
    if any(c.status == "agrees" for c in checks):
        notes += [c.why for c in checks if c.status == "not-verified"]
        return Verification("agrees", "", here, flow, checks, tuple(notes), kernel.trace_id)
    why = "; ".join(c.why for c in checks if c.why) or "cannot verify"
    return Verification("not-verified", why, here, flow, checks, tuple(notes), kernel.trace_id)


def verification_of(explanation: Explanation, here: str, captured: Captured, ruleset: Ruleset | None) -> Verification:
    """:func:`verify` for what :meth:`Tracer.trace` captured, its rules named from *ruleset* (the one in force)."""
    if captured.changed:
        why = "cannot verify: flock's table changed while the packet was traced: run it again"
        return Verification("not-verified", why, here, captured.flow)
    kernel = kernel_trace(captured.events, captured.flow, place_rules(captured.rules, ruleset))
    result = verify(explanation, here, kernel)
    if captured.lost:
        result = attrs.evolve(result, notes=(*result.notes, "some trace messages were lost (the socket was full)"))
    return result
