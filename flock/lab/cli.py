"""``flock-lab``: the command line of the lab (see docs/lab.md and ``flock-lab --help``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from flock.lab._check import matrix_text, reachability, summary, wait_anycast_routes
from flock.lab._image import DEFAULT_IMAGE_DIR, add_image_arguments, add_manifest_arguments, image_settings
from flock.lab._kubelet import LAB_GRACE_S
from flock.lab._lifecycle import down, host_kubeconfig, up
from flock.lab._plan import (
    DEFAULT_DIR,
    DEFAULT_MTU,
    FABRIC_BFD_MODES,
    INTERNET4,
    INTERNET6,
    MAX_MTU,
    MIN_MTU,
    LabPlan,
)
from flock.lab._pods import (
    LabPod,
    load_pods,
    parse_annotations,
    parse_labels,
    pod_add,
    pod_check,
    pod_del,
    pod_ready,
)
from flock.lab._policy_cli import add_commands as add_policy_commands
from flock.lab._policy_cli import run_command as run_policy_command
from flock.lab._ports import PortSpec
from flock.lab._routes import fabric_routes, named, routes_text
from flock.lab._state import LabError, require_state
from flock.lab._status import status, status_text
from flock.lab._stream import stream
from flock.lab._upgrade import upgrade

ANYCAST_WAIT_S = 15.0

# The demo's pods: (node, pod, annotations, owner).  IPv6-only by default
# (the lab's NodeConfigs), dual stack by annotation, ip-algo replicas of one
# ReplicaSet on both nodes, a cidr6 sub-range, and one anycast service
# (IPv6 and IPv4) with a replica on each node.
DEMO_ANYCAST = "2001:db8:53::53,192.0.2.153"
DEMO_ALGO = "namespace:16,app:16,random:32"
DEMO_PODS: tuple[tuple[str, str, dict[str, str], str | None], ...] = (
    ("node1", "default/web-1", {}, None),
    ("node1", "default/dual-1", {"ipv4": "true"}, None),
    ("node2", "default/dual-2", {"ipv4": "true"}, None),
    ("node1", "shop/cart-7d9f8c6b5-x2xkq", {"ip-algo": DEMO_ALGO}, "ReplicaSet/cart-7d9f8c6b5"),
    ("node2", "shop/cart-7d9f8c6b5-k8q4m", {"ip-algo": DEMO_ALGO}, "ReplicaSet/cart-7d9f8c6b5"),
    ("node2", "batch/job-1", {"cidr6": "2001:db8:0:2:ba7c::/80"}, None),
    ("node1", "dns/resolver-1", {"ipv4": "true", "anycast": DEMO_ANYCAST}, None),
    ("node2", "dns/resolver-2", {"ipv4": "true", "anycast": DEMO_ANYCAST}, None),
)


def _default_dir() -> Path:
    return Path(os.environ.get("FLOCK_LAB_DIR", str(DEFAULT_DIR)))


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dir", type=Path, default=_default_dir(), help="lab directory (default $FLOCK_LAB_DIR or %(default)s)"
    )
    common.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    p = argparse.ArgumentParser(
        prog="flock-lab",
        description="A routed multi-node flock cluster in network namespaces on this machine (needs root).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser(
        "up", parents=[common], help="start a lab; returns when every agent is ready and every BGP session is up"
    )
    s.add_argument("--nodes", type=int, default=2, help="number of nodes, 1-8 (default %(default)s)")
    s.add_argument(
        "--mtu",
        type=int,
        default=DEFAULT_MTU,
        help=f"MTU of every fabric link, which the agents detect and give their pods, {MIN_MTU}-{MAX_MTU} (default %(default)s)",
    )
    s.add_argument(
        "--internet",
        action="store_true",
        help=f"an internet namespace behind the fabric ({INTERNET6}, {INTERNET4}) routing back to the nodes only: "
        "pods reach it through natOutgoing (`flock-lab probe NS/POD internet 80/TCP --family 4`)",
    )
    s.add_argument(
        "--encrypt",
        action="store_true",
        help="the agents encrypt pod traffic between nodes with WireGuard (wireguard-go), fail closed "
        "(flock-agent --encryption wireguard; docs/encryption.md)",
    )
    s.add_argument(
        "--fabric-bfd",
        choices=FABRIC_BFD_MODES,
        default="mixed",
        help="how the fabric's sessions take BFD going down: mixed (default), node1's port as a graceful "
        "restart and the others' withdrawing at once; graceful, every port (what a rolling upgrade needs)",
    )
    add_image_arguments(s)
    s = sub.add_parser(
        "upgrade",
        parents=[common],
        help="roll an image lab's DaemonSet to another image and manifest, node by node, as RollingUpdate "
        "with maxUnavailable 1 does (preStop, SIGTERM, init containers, readiness gates the next node)",
    )
    s.add_argument("--image", metavar="REF", required=True, help="the new image (in the lab's image directory)")
    s.add_argument(
        "--image-dir",
        type=Path,
        default=None,
        help="scripts/build-image's directory holding the image (default: the one the lab was started with)",
    )
    add_manifest_arguments(s)
    s.add_argument(
        "--node", action="append", default=[], metavar="NODE", help="only these nodes, in this order (default: all)"
    )
    sub.add_parser(
        "down", parents=[common], help="stop every lab process, remove every namespace and file (safe to repeat)"
    )
    sub.add_parser("status", parents=[common], help="nodes, agents, BGP sessions, pods")
    sub.add_parser(
        "kubeconfig",
        parents=[common],
        help="print the path of a kubeconfig for kubectl on this host (the API server on 127.0.0.1)",
    )
    sub.add_parser("check", parents=[common], help="all-pairs reachability between pods and anycast from every node")
    s = sub.add_parser(
        "stream",
        parents=[common],
        help="short TCP connections from SOURCE to TARGET at a steady rate: how many were answered (and by "
        "which pod), refused or lost — run it across a rolling restart or a drain",
    )
    s.add_argument("source", help="NS/POD, a node name or internet")
    s.add_argument("target", help="NS/POD, a node name, internet or an address (a Service's)")
    s.add_argument("port", help="PORT/TCP")
    s.add_argument("--seconds", type=float, default=10.0, help="how long (default %(default)s)")
    s.add_argument("--rate", type=float, default=50.0, help="connections a second (default %(default)s)")
    s.add_argument("--family", type=int, choices=(4, 6), default=None)
    fabric = sub.add_parser("fabric", help="what the fabric's BGP route server holds").add_subparsers(
        dest="fabric_command", required=True
    )
    fabric.add_parser(
        "routes",
        parents=[common],
        help="every route the fabric learned: prefix, the nodes it forwards to (ECMP), and each path's next hop, "
        "communities and local preference",
    )
    s = sub.add_parser("demo", parents=[common], help="up with 2 nodes, a handful of pods, status, check, then down")
    s.add_argument("--keep", action="store_true", help="leave the lab running afterwards")
    add_image_arguments(s)
    pod = sub.add_parser("pod", help="add, check or delete a pod").add_subparsers(dest="pod_command", required=True)
    s = pod.add_parser("add", parents=[common], help="create a Pod and attach it through the installed CNI plugin")
    pod_add_parser = s
    s.add_argument("node")
    s.add_argument("pod", metavar="NAMESPACE/NAME")
    s.add_argument(
        "--annotation",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="pod annotation; a KEY without '/' means flock.fritzlab.net/KEY",
    )
    s.add_argument("--image", default="registry.example/app:1")
    s.add_argument("--owner", metavar="KIND/NAME", help="controller owner reference, e.g. ReplicaSet/web-7d9f8c6b5")
    s = pod.add_parser(
        "del",
        parents=[common],
        help="delete the pod as a kubelet would: marked terminating (a graceful DELETE), served for --grace "
        "seconds, then CNI DEL and the Pod removed",
    )
    s.add_argument("pod", metavar="NAMESPACE/NAME")
    s.add_argument(
        "--grace",
        type=int,
        default=LAB_GRACE_S,
        metavar="SECONDS",
        help="the DELETE's gracePeriodSeconds: how long the terminating pod keeps serving (default %(default)s)",
    )
    s = pod.add_parser("check", parents=[common], help="CNI CHECK with the cached result")
    s.add_argument("pod", metavar="NAMESPACE/NAME")
    s = pod.add_parser(
        "ready",
        parents=[common],
        help="set the pod's readiness (Ready and ContainersReady, its container's ready), as a readiness probe",
    )
    s.add_argument("pod", metavar="NAMESPACE/NAME")
    s.add_argument("ready", choices=("true", "false"))
    add_policy_commands(sub, pod, pod_add_parser, common)
    return p


def _out(args: argparse.Namespace, doc: Any, text: str) -> None:
    print(json.dumps(doc, indent=2) if args.json else text, flush=True)


def _reporter():
    # Progress goes to stderr, so --json output stays one document on stdout.
    return lambda line: print(f"flock-lab: {line}", file=sys.stderr, flush=True)


def _pod_line(pod: LabPod) -> str:
    addrs = ", ".join(pod.addresses(6) + pod.addresses(4))
    extra = f" + anycast {', '.join(pod.anycast)}" if pod.anycast else ""
    return f"{pod.key:<28} on {pod.node}: {addrs}{extra}"


async def _check(args: argparse.Namespace, plan: LabPlan) -> int:
    pods = load_pods(plan)
    with trio.move_on_after(ANYCAST_WAIT_S):
        await wait_anycast_routes(plan, pods)
    probes = await reachability(plan, pods)
    result = summary(probes)
    _out(args, result, matrix_text(pods, probes))
    return 0 if result["ok"] else 1


async def _demo(args: argparse.Namespace) -> int:
    say = (lambda line: None) if args.json else (lambda line: print(line, flush=True))
    report = _reporter()
    plan = LabPlan.make(args.dir, 2)
    doc: dict[str, Any] = {"pods": []}
    try:
        say(f"== flock-lab demo: 2 nodes in network namespaces, BGP to a route server, lab dir {plan.dir}")
        await up(plan, report, image_settings(args))
        say("== every agent is ready, every BGP session Established")
        say("")
        say("== adding pods through the installed CNI plugin (as containerd would)")
        for node, key, wanted, owner in DEMO_PODS:
            notes = parse_annotations([f"{k}={v}" for k, v in wanted.items()])
            pod = await pod_add(plan, node, key, notes, owner=owner)
            doc["pods"].append({"pod": pod.key, "node": pod.node, "annotations": notes, "result": dict(pod.result)})
            what = ", ".join(f"{k}={v}" for k, v in wanted.items()) or "defaults (IPv6 only)"
            say(f"   {_pod_line(pod)}   [{what}]")
        say("")
        say("== status")
        doc["status"] = await status(require_state(plan.dir))
        say(status_text(doc["status"]))
        say("")
        say("== check: every pod pings every other pod; every node pings the anycast service")
        pods = load_pods(plan)
        with trio.move_on_after(ANYCAST_WAIT_S):
            await wait_anycast_routes(plan, pods)
        probes = await reachability(plan, pods)
        doc["check"] = summary(probes)
        say(matrix_text(pods, probes))
    finally:
        if not args.keep:
            say("")
            say("== down")
            doc["down"] = await down(plan.dir, report)
            say(f"   removed {len(doc['down']['namespaces'])} namespaces, every process and file of the lab")
        else:
            say("")
            say(f"== the lab keeps running: flock-lab status / check / pod add … / down (--dir {plan.dir})")
    if args.json:
        print(json.dumps(doc, indent=2))
    return 0 if doc["check"]["ok"] else 1


async def _upgrade(args: argparse.Namespace) -> int:
    state = require_state(args.dir)
    if args.image_dir is None:
        args.image_dir = Path((state.image or {}).get("image_dir", DEFAULT_IMAGE_DIR))
    settings = image_settings(args)
    assert settings is not None  # --image is required
    doc = await upgrade(args.dir, settings, _reporter(), args.node or None)
    lines = [f"rolled to {doc['image']} (manifests {doc['manifest']}) in {doc['seconds']:.1f} s"]
    for node in doc["nodes"]:
        bgp = "-" if node["bgp_s"] is None else f"{node['bgp_s']:.1f}"
        lines.append(
            f"  {node['node']}: not ready {node['not_ready_s']:.1f} s "
            f"(stopped {node['stopped_s']:.1f}, init {node['init_s']:.1f}, agent ready {node['agent_ready_s']:.1f}, "
            f"BGP {bgp})"
        )
    _out(args, doc, "\n".join(lines))
    return 0


async def run(args: argparse.Namespace) -> int:
    report = _reporter()
    if args.command == "up":
        plan = LabPlan.make(
            args.dir,
            args.nodes,
            uplink_mtu=args.mtu,
            internet=args.internet,
            fabric_bfd=args.fabric_bfd,
            encrypt=args.encrypt,
        )
        image = image_settings(args)
        if plan.encrypt and image is not None:
            raise LabError("--encrypt: a lab of processes only (an image lab runs the manifests' DaemonSet as it is)")
        state = await up(plan, report, image)
        doc = await status(state)
        _out(args, doc, status_text(doc))
        return 0
    if args.command == "down":
        doc = await down(args.dir, report)
        _out(
            args,
            doc,
            f"lab in {doc['dir']} is down: {doc['processes']} processes stopped, {len(doc['namespaces'])} namespaces deleted, files removed: {doc['files_removed']}",
        )
        return 0
    if args.command == "demo":
        return await _demo(args)
    if args.command == "upgrade":
        return await _upgrade(args)
    if (code := await run_policy_command(args)) is not None:
        return code
    state = require_state(args.dir)
    plan = state.plan
    if args.command == "status":
        doc = await status(state)
        _out(args, doc, status_text(doc))
        return 0
    if args.command == "check":
        return await _check(args, plan)
    if args.command == "stream":
        if not (0 < args.seconds <= 3600 and 0 < args.rate <= 1000):
            raise LabError("--seconds 0-3600 and --rate 0-1000 (connections a second)")
        result = await stream(
            plan, args.source, args.target, args.port, args.family, seconds=args.seconds, rate=args.rate
        )
        _out(args, result.to_json(), result.text())
        return 0 if result.refused == 0 and result.lost == 0 else 1
    if args.command == "fabric":
        names = {str(a): n.name for n in plan.nodes for a in (n.addr6, n.addr4)}
        routes = named(await fabric_routes(plan.fabric_dir / "bird.ctl"), names)
        _out(args, {"routes": [r.to_json() for r in routes]}, routes_text(routes))
        return 0
    if args.command == "kubeconfig":
        path = host_kubeconfig(state)
        server = json.loads(path.read_text())["clusters"][0]["cluster"]["server"]
        _out(args, {"kubeconfig": str(path), "server": server}, str(path))
        return 0
    if args.pod_command == "add":
        pod = await pod_add(
            plan,
            args.node,
            args.pod,
            parse_annotations(args.annotation),
            args.image,
            args.owner,
            labels=parse_labels(args.label),
            ports=[PortSpec.parse(p) for p in args.port],
        )
        _out(args, pod.to_json(), json.dumps(dict(pod.result), indent=2))
        return 0
    if args.pod_command == "check":
        pod = await pod_check(plan, args.pod)
        _out(args, {"pod": pod.key, "ok": True}, f"CHECK {pod.key}: ok")
        return 0
    if args.pod_command == "ready":
        written = await pod_ready(plan, args.pod, args.ready == "true")
        ready = [c["status"] for c in written["conditions"] if c["type"] == "Ready"]
        _out(args, {"pod": args.pod, "ready": args.ready == "true"}, f"{args.pod}: Ready={''.join(ready)}")
        return 0
    pod = await pod_del(plan, args.pod, args.grace)
    _out(args, {"pod": pod.key, "deleted": True}, f"DEL {pod.key}: ok")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return trio.run(run, args)
    except OSError as exc:
        # The lab's API server or an agent did not answer: the lab is down or broken.
        print(
            f"flock-lab: {exc}: is the lab up? `flock-lab status` shows what runs; `flock-lab down` then `up` rebuilds it",
            file=sys.stderr,
        )
        return 1
    except (LabError, ValueError) as exc:
        if getattr(args, "json", False):
            print(json.dumps({"error": str(exc), **({"cni": exc.error} if hasattr(exc, "error") else {})}))
        print(f"flock-lab: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("flock-lab: interrupted; `flock-lab down` removes what was made", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
