"""``flock-lab explain`` and the matrix's marks: ``flockctl policy explain``, asked of the right agent.

Each lab node's agent serves flockctl's admin socket (``admin.sock`` beside
its CNI socket, ``nodes/<node>/run/``).  ``explain`` asks one of them, with
flockctl's own client (:func:`flock.ctl.ask`, the admin wire's one request),
the question flockctl asks (op ``policy-explain``), and shows the answer as
flockctl does (:func:`flock.policy.explanation_text`; its JSON as is).  The
agent asked is the one that matters most: the source pod's node for a pod
source (it checks that pod's egress against the ruleset in force), else the
destination pod's node, else the source node's, the destination node's,
or (two addresses) the first node's.

FROM and TO are what the agent takes (``NS/POD``, an address, a node's name),
plus the lab's ``internet`` (its address of the family).  The matrix asks
for every blocked cell (:func:`explain_all`, concurrently) and names what
blocked it with :func:`blocked_by`.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import trio

from flock.ctl import AdminRefused, AdminUnreachable, ask
from flock.lab._plan import INTERNET, INTERNET4, INTERNET6, LabPlan, NodePlan
from flock.lab._pods import LabPod, load_pods
from flock.lab._ports import PortSpec
from flock.lab._state import LabError
from flock.policy import Explanation, Party, Query, Verdict

EXPLAIN_TIMEOUT_S = 30.0  # one answer (the agent compiles the rulesets of the ends' nodes)
PARALLEL_EXPLAINS = 4  # requests in flight per agent (its admin socket serves 8 at once, backlog 16)
OP = "policy-explain"
_EXIT_CODES = {v.value: v.exit_code for v in Verdict}


@attrs.frozen
class Asked:
    """One question, as the agent is asked it: FROM, TO, the port and the family (None: the agent's choice)."""

    source: str
    target: str
    port: PortSpec
    family: int | None = None
    verify: bool = False  # and send the first packet for real, traced by nftables (flockctl's --verify)


@attrs.frozen
class Answer:
    """An agent's explanation (flockctl's JSON) and which node's agent gave it."""

    node: str
    doc: Mapping[str, Any]

    @property
    def verdict(self) -> str:
        return str(self.doc.get("verdict", Verdict.UNKNOWN.value))

    @property
    def exit_code(self) -> int:
        """flockctl's: 0 allowed, 1 denied, 2 cannot tell; with --verify 3 when the kernel disagrees, and 2
        when it could not be asked."""
        code = _EXIT_CODES.get(self.verdict, Verdict.UNKNOWN.exit_code)
        verify = self.doc.get("verify")
        if isinstance(verify, Mapping):
            if verify.get("status") == "disagrees":
                return 3
            if verify.get("status") != "agrees":
                return Verdict.UNKNOWN.exit_code
        return code

    def to_json(self) -> dict[str, Any]:
        return {**self.doc, "asked": self.node}


def admin_socket(node: NodePlan) -> str:
    """Where the node's agent serves flockctl (its default: ``admin.sock`` beside ``--socket``)."""
    return str(node.socket.parent / "admin.sock")


def _lab_name(text: str, plan: LabPlan, family: int | None) -> str:
    """The agent's name for *text*: the lab's ``internet`` is its address of the family."""
    if text != INTERNET:
        return text
    if plan.internet_netns is None:
        raise LabError("this lab has no internet: `flock-lab up --internet` makes one")
    return str(INTERNET4 if family == 4 else INTERNET6)


def _where(text: str, plan: LabPlan, pods: Sequence[LabPod]) -> tuple[str | None, bool]:
    """(the lab node *text* is on or is, whether it is a pod) for a pod's key or address, or a node's name or address."""
    for pod in pods:
        if text == pod.key or text in pod.addresses(6) + pod.addresses(4):
            return pod.node, True
    for node in plan.nodes:
        if text in (node.name, str(node.addr6), str(node.addr4)):
            return node.name, False
    if "/" in text:
        return None, False  # no pod of the lab's making: the agent may know it all the same
    try:
        ipaddress.ip_address(text)
        return None, False
    except ValueError:
        pass
    nodes = ", ".join(n.name for n in plan.nodes)
    raise LabError(f"{text!r}: expected NS/POD, a node name, internet or an address (nodes: {nodes})")


def node_to_ask(plan: LabPlan, pods: Sequence[LabPod], source: str, target: str) -> NodePlan:
    """The source pod's node; else the destination pod's; else the source node, the destination node, the first."""
    (src, src_pod), (dst, dst_pod) = _where(source, plan, pods), _where(target, plan, pods)
    for name, pod in ((src, src_pod), (dst, dst_pod), (src, True), (dst, True)):
        if name is not None and pod:
            return plan.node(name)
    return plan.nodes[0]


def _refused(asked: Asked, exc: AdminRefused) -> dict[str, Any]:
    """What flockctl prints when the agent refuses the op (an agent without it, or without policy)."""
    query = Query.parse(asked.source, asked.target, asked.port.port, asked.port.protocol, asked.family)
    return Explanation(query, Party(query.source), Party(query.destination), Verdict.UNKNOWN, str(exc)).to_json()


async def ask_node(node: NodePlan, asked: Asked) -> Answer:
    """flockctl's ``policy explain`` request to *node*'s agent (:class:`LabError` when no agent answers)."""
    fields: dict[str, Any] = {
        "from": asked.source,
        "to": asked.target,
        "family": asked.family,
        "port": asked.port.port,
        "protocol": asked.port.protocol,
    }
    if asked.verify:
        fields["verify"] = True
    request = functools.partial(ask, admin_socket(node), OP, timeout=EXPLAIN_TIMEOUT_S, **fields)
    try:
        doc = await trio.to_thread.run_sync(request)
    except AdminRefused as exc:
        doc = _refused(asked, exc)
    except AdminUnreachable as exc:
        raise LabError(f"explain: cannot reach the agent on {node.name}: {exc}") from None
    return Answer(node.name, doc)


async def explain(
    plan: LabPlan, source: str, target: str, port_text: str, family: int | None, *, verify: bool = False
) -> Answer:
    """``flock-lab explain FROM TO PORT/PROTO``: asked of the node that matters (see the module doc)."""
    pods = load_pods(plan)
    port = PortSpec.parse(port_text, named=False)
    node = node_to_ask(plan, pods, source, target)
    asked = Asked(_lab_name(source, plan, family), _lab_name(target, plan, family), port, family, verify)
    return await ask_node(node, asked)


async def explain_all(
    plan: LabPlan, questions: Sequence[Asked], pods: Sequence[LabPod] | None = None
) -> list[Answer | str]:
    """Every question, concurrently, each of the node that matters; what could not be asked: why (a str)."""
    pods = load_pods(plan) if pods is None else pods
    answers: list[Answer | str] = ["not asked"] * len(questions)
    limiters = {node.name: trio.CapacityLimiter(PARALLEL_EXPLAINS) for node in plan.nodes}

    async def one(i: int) -> None:
        q = questions[i]
        try:
            node = node_to_ask(plan, pods, q.source, q.target)
            source, target = _lab_name(q.source, plan, q.family), _lab_name(q.target, plan, q.family)
            async with limiters[node.name]:
                answers[i] = await ask_node(node, attrs.evolve(q, source=source, target=target))
        except LabError as exc:
            answers[i] = str(exc)

    async with trio.open_nursery() as nursery:
        for i in range(len(questions)):
            nursery.start_soon(one, i)
    return answers


# -- what blocked it ----------------------------------------------------------------------------


def _decider(direction: Mapping[str, Any]) -> str:
    """The step of a denied direction's path that denied it, in a few words."""
    for step in direction.get("path", ()):
        tier, action, detail = step.get("tier"), step.get("action"), step.get("detail") or ""
        if action != "Deny":
            continue
        if tier in ("Admin", "Baseline"):
            rule = f" rule {step['rule']}" if step.get("rule") else ""
            note = f"; {detail}" if detail else ""
            return f"{tier} ClusterNetworkPolicy {step.get('policy')}{rule} (Deny{note})"
        if tier == "NetworkPolicy":
            isolating = list(step.get("isolated_by") or ())
            if len(isolating) == 1:
                return f"NetworkPolicy {isolating[0]} (isolates, no rule allows)"
            if isolating:
                return f"NetworkPolicies {', '.join(isolating)} (isolate, no rule allows)"
            return "NetworkPolicy (isolated, no rule allows)"
    return f"denied ({direction.get('decided_by') or 'no step says why'})"


def blocked_by(answer: Answer | str) -> str:
    """What blocked a pair, as the agent explains it: ``ingress NetworkPolicy y/deny (isolates, no rule
    allows)``, ``egress Admin ClusterNetworkPolicy guard rule to-db (Deny)``; both directions when both
    deny; what the explanation says when it does not say denied."""
    if isinstance(answer, str):
        return f"explain failed: {answer}"
    doc = answer.doc
    if answer.verdict == Verdict.UNKNOWN.value:
        return f"explain cannot tell: {doc.get('why') or 'no reason given'}"
    if answer.verdict == Verdict.ALLOWED.value:
        return f"explain says allowed (the agent on {answer.node} disagrees with the probe)"
    parts = [
        f"{key} {_decider(d)}"
        for key in ("egress", "ingress")
        if isinstance(d := doc.get(key), Mapping) and d.get("verdict") == Verdict.DENIED.value
    ]
    return "; ".join(parts) or "denied (no direction says why)"
