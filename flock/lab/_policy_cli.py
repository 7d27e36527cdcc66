"""The policy commands of ``flock-lab`` (their arguments and what they print).

``ns add|label``, ``pod label``, ``node label``, ``apply``, ``delete``,
``probe``, ``matrix``, ``explain`` and ``policy wait``; :mod:`flock.lab.cli` adds them to
its parser and hands them their arguments.  Exit codes: 0 done (probe: connected), 1 refused or
not as wanted (probe: blocked; policy wait: timed out), 2 the command could
not do its job (probe, matrix, explain and policy wait only; other commands exit 1).
``explain`` exits as ``flockctl policy explain``: 0 allowed, 1 denied, 2 cannot tell.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import trio

from flock.lab._explain import Answer, Asked, blocked_by, explain, explain_all
from flock.lab._plan import LabPlan
from flock.lab._pods import load_pods, parse_labels, pod_label
from flock.lab._policy import (
    POLICY_WAIT_S,
    apply,
    delete,
    node_label,
    ns_add,
    ns_label,
    server_version,
    wait_applied,
)
from flock.lab._ports import PortSpec
from flock.lab._probe import ProbeResult, matrix, probe, truth_tables
from flock.lab._state import LabError, require_state
from flock.policy import explanation_text

COMMANDS = ("ns", "node", "apply", "delete", "probe", "matrix", "explain", "policy")
EXIT_ERROR = 2


def _family(text: str) -> int:
    if text not in ("4", "6"):
        raise argparse.ArgumentTypeError(f"--family {text!r}: expected 6 or 4")
    return int(text)


def add_commands(
    sub: argparse._SubParsersAction,
    pod: argparse._SubParsersAction,
    pod_add: argparse.ArgumentParser,
    common: argparse.ArgumentParser,
) -> None:
    """Add the policy commands to flock-lab's parser (*pod*: the ``pod`` subcommands)."""
    pod_add.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", help="pod label (default: app=NAME)"
    )
    pod_add.add_argument(
        "--port",
        action="append",
        default=[],
        metavar="[NAME=]PORT/PROTO",
        help="containerPort (TCP, UDP or SCTP); the pod serves each TCP and UDP port on IPv6 and IPv4",
    )
    s = pod.add_parser("label", parents=[common], help="set or remove labels of a pod")
    s.add_argument("pod", metavar="NAMESPACE/NAME")
    s.add_argument("labels", nargs="*", metavar="KEY=VALUE")
    s.add_argument("--remove", action="append", default=[], metavar="KEY")

    ns = sub.add_parser("ns", help="namespaces and their labels").add_subparsers(dest="ns_command", required=True)
    s = ns.add_parser("add", parents=[common], help="create a Namespace (the API server labels it with its name)")
    s.add_argument("namespace")
    s.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    s = ns.add_parser("label", parents=[common], help="set or remove labels of a Namespace")
    s.add_argument("namespace")
    s.add_argument("labels", nargs="*", metavar="KEY=VALUE")
    s.add_argument("--remove", action="append", default=[], metavar="KEY")

    node = sub.add_parser("node", help="the labels of the lab's Node objects").add_subparsers(
        dest="node_command", required=True
    )
    s = node.add_parser("label", parents=[common], help="set or remove labels of a Node")
    s.add_argument("node")
    s.add_argument("labels", nargs="*", metavar="KEY=VALUE")
    s.add_argument("--remove", action="append", default=[], metavar="KEY")

    s = sub.add_parser(
        "apply",
        parents=[common],
        help="create or replace NetworkPolicies, ClusterNetworkPolicies and Namespaces from YAML",
    )
    s.add_argument("file", metavar="FILE", help="YAML, one or more documents ('-': standard input)")
    s = sub.add_parser(
        "delete",
        parents=[common],
        help="delete networkpolicy NS/NAME, clusternetworkpolicy (cnp) NAME or namespace NAME",
    )
    s.add_argument("kind", metavar="KIND", help="networkpolicy (netpol), clusternetworkpolicy (cnp) or namespace (ns)")
    s.add_argument("name", metavar="NAME", help="NS/NAME of a NetworkPolicy, NAME otherwise")

    s = sub.add_parser(
        "probe",
        parents=[common],
        help="one TCP connect or UDP echo, saying who answered (served_by: through a Service, which pod) and the "
        "source address it saw; exit 0 connected, 1 blocked, 2 error",
    )
    s.add_argument("source", metavar="FROM", help="NS/POD, a node name or internet (up --internet)")
    s.add_argument(
        "target",
        metavar="TO",
        help="NS/POD, a node name (its address: NodePorts), internet or an address (a ClusterIP, an external "
        "or load-balancer address)",
    )
    s.add_argument("port", metavar="PORT/PROTO")
    s.add_argument("--family", type=_family, default=None, help="6 (default) or 4")
    s = sub.add_parser("matrix", parents=[common], help="every pod to every pod on every port, concurrently")
    s.add_argument(
        "--port", action="append", default=[], metavar="PORT/PROTO", help="default: every TCP/UDP port pods declare"
    )
    s.add_argument("--family", type=_family, default=6, help="6 (default) or 4")
    s.add_argument(
        "--to",
        action="append",
        default=[],
        metavar="TARGET",
        help="probe these (NS/POD, a node name or an address) from every pod, instead of every pod",
    )
    s.add_argument(
        "--explain-all",
        action="store_true",
        help="ask the agents to explain every pair, not only the blocked ones (--json: each result's explanation)",
    )
    s = sub.add_parser(
        "explain",
        parents=[common],
        help="flockctl policy explain, asked of the agent on the node that matters (the source pod's; "
        "else the destination's): exit 0 allowed, 1 denied, 2 cannot tell",
        description="May FROM open a connection to TO, and which policy and rule decide: `flockctl policy "
        "explain` on the admin socket of the agent of the source pod's node (else of the destination pod's, "
        "else of a node end's), printed as flockctl prints it; --json adds `asked`, the node asked.",
        epilog="exit codes: 0 allowed; 1 denied; 2 cannot tell (why is printed) or no agent answers",
    )
    s.add_argument("source", metavar="FROM", help="NS/POD, a node name, an address or internet (up --internet)")
    s.add_argument("target", metavar="TO", help="NS/POD, a node name, an address or internet")
    s.add_argument("port", metavar="PORT/PROTO", help="80/TCP, 53/UDP, 3868/SCTP")
    s.add_argument("--family", type=_family, default=None, help="6 or 4 (default: the agent's choice, IPv6 first)")
    s.add_argument(
        "--verify",
        action="store_true",
        help="and send the first packet for real, traced by nftables (exit 3 when the kernel disagrees)",
    )

    policy = sub.add_parser("policy", help="NetworkPolicy and ClusterNetworkPolicy enforcement").add_subparsers(
        dest="policy_command", required=True
    )
    s = policy.add_parser(
        "wait", parents=[common], help="return when every agent has applied the latest policy objects"
    )
    s.add_argument("--timeout", type=float, default=POLICY_WAIT_S, help="seconds (default %(default)s)")


def _out(args: argparse.Namespace, doc: Any, text: str) -> None:
    print(json.dumps(doc, indent=2) if args.json else text, flush=True)


def _error(args: argparse.Namespace, message: str) -> int:
    if args.json:
        print(json.dumps({"error": message}), flush=True)
    print(f"flock-lab: {message}", file=sys.stderr, flush=True)
    return EXIT_ERROR


async def run_command(args: argparse.Namespace) -> int | None:
    """Run a policy command; None when *args* is not one (or is ``pod add``/``del``/``check``)."""
    if args.command == "pod" and args.pod_command == "label":
        plan = require_state(args.dir).plan
        pod = await pod_label(plan, args.pod, parse_labels(args.labels, "label"), args.remove)
        _out(args, {"pod": pod.key, "labels": dict(pod.labels)}, f"pod/{pod.key} labeled: {_labels(pod.labels)}")
        return 0
    if args.command not in COMMANDS:
        return None
    if args.command in ("probe", "matrix", "explain", "policy"):
        try:
            return await _measure(args)
        except LabError as exc:
            return _error(args, str(exc))
    plan = require_state(args.dir).plan
    if args.command == "ns":
        if args.ns_command == "add":
            obj, created = await ns_add(plan, args.namespace, parse_labels(args.label))
            what = "created" if created else "exists; labels set"
        else:
            obj = await ns_label(plan, args.namespace, parse_labels(args.labels, "label"), args.remove)
            what = "labeled"
        labels = obj["metadata"].get("labels") or {}
        _out(
            args,
            {"namespace": args.namespace, "labels": labels},
            f"namespace/{args.namespace} {what}: {_labels(labels)}",
        )
        return 0
    if args.command == "node":
        obj = await node_label(plan, args.node, parse_labels(args.labels, "label"), args.remove)
        labels = obj["metadata"].get("labels") or {}
        _out(args, {"node": args.node, "labels": labels}, f"node/{args.node} labeled: {_labels(labels)}")
        return 0
    if args.command == "apply":
        done = await apply(plan, args.file)
        _out(args, {"applied": done}, "\n".join(f"{d['object']} {d['action']}" for d in done))
        return 0
    gone = await delete(plan, args.kind, args.name)
    _out(args, {"deleted": gone}, f"{gone} deleted")
    return 0


async def _measure(args: argparse.Namespace) -> int:
    plan = require_state(args.dir).plan
    if args.command == "probe":
        r = await probe(plan, args.source, args.target, args.port, args.family)
        if r.error:
            return _error(args, f"probe {r.source} → {r.target} {r.port} IPv{r.family}: {r.reason}")
        doc = {
            **r.to_json(),
            "address": r.address,
            "result": r.reason,
            "served_by": r.served_by or None,
            "seen_as": r.seen_as or None,
        }
        verdict = "connected" if r.connected else f"blocked ({r.reason})"
        if r.served_by:
            verdict += f", served by {r.served_by}"
        if r.seen_as:
            verdict += f", seen as {r.seen_as}"
        _out(args, doc, f"{r.source} → {r.target} [{r.address}] {r.port} IPv{r.family}: {verdict}")
        return 0 if r.connected else 1
    if args.command == "matrix":
        pods, ports, results = await matrix(plan, args.port, args.family, args.to)
        if not pods:
            return _error(args, "matrix: the lab has no pods (flock-lab pod add …)")
        if not ports:
            return _error(args, "matrix: no TCP or UDP port to probe (give --port PORT/PROTO)")
        explained = await _explain_results(plan, results, args.explain_all)
        blocked = {(r.source, r.target, r.port) for r in results if not r.connected and not r.error}
        causes = {key: blocked_by(a) for key, a in explained.items() if key in blocked}
        text = truth_tables(pods, ports, results, args.family, args.to or None, causes)
        docs = []
        for r in results:
            doc = r.to_json()
            key = (r.source, r.target, r.port)
            if key in causes:
                doc["blocked_by"] = causes[key]
            if args.explain_all:
                answer = explained.get(key)
                doc["explanation"] = answer.to_json() if isinstance(answer, Answer) else {"error": answer}
            docs.append(doc)
        _out(args, {"results": docs}, text)
        errors = [r for r in results if r.error]
        for r in errors[:5]:
            print(f"flock-lab: {r.source} → {r.target} {r.port}: {r.reason}", file=sys.stderr)
        return EXIT_ERROR if errors else 0
    if args.command == "explain":
        answer = await explain(plan, args.source, args.target, args.port, args.family, verify=args.verify)
        _out(args, answer.to_json(), f"{explanation_text(answer.doc)}\nasked    the agent on {answer.node}")
        return answer.exit_code
    target = await server_version(plan)
    applied: dict[str, int | None] = {}
    start = trio.current_time()
    with trio.move_on_after(args.timeout):
        await wait_applied(plan, target, applied)
    ok = all(v is not None and v >= target for v in applied.values())
    doc = {"resourceVersion": target, "nodes": applied, "ok": ok, "waited": round(trio.current_time() - start, 3)}
    missing = [node for node, v in doc["nodes"].items() if v is None]
    if missing and not doc["ok"]:
        return _error(
            args,
            f"policy wait: the agents on {', '.join(missing)} do not report flock_policy_applied_resource_version "
            "on their /metrics (an agent without NetworkPolicy support?)",
        )
    behind = ", ".join(f"{n} at {v}" for n, v in doc["nodes"].items() if v is None or v < doc["resourceVersion"])
    text = (
        f"every agent has applied resourceVersion {doc['resourceVersion']} ({doc['waited']} s)"
        if doc["ok"]
        else f"timed out after {args.timeout:g} s waiting for resourceVersion {doc['resourceVersion']}: {behind}"
    )
    _out(args, doc, text)
    return 0 if doc["ok"] else 1


async def _explain_results(
    plan: LabPlan, results: list[ProbeResult], every: bool
) -> dict[tuple[str, str, str], Answer | str]:
    """The agents' explanations of the blocked results (*every*: of every result that was probed), by
    (from, to, port): asked of what was probed, the target's address for a target that is no pod."""
    wanted = [r for r in results if not r.error and (every or not r.connected)]
    pods = load_pods(plan)
    keys = {p.key for p in pods}
    questions = [
        Asked(r.source, r.target if r.target in keys else r.address, PortSpec.parse(r.port, named=False), r.family)
        for r in wanted
    ]
    answers = await explain_all(plan, questions, pods)
    return {(r.source, r.target, r.port): a for r, a in zip(wanted, answers, strict=True)}


def _labels(labels: dict[str, str] | Any) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(dict(labels).items())) or "(none)"
