"""flockctl: the operator's view of one node and its repair tool.

Talks to the local flock-agent over its admin socket only; ``ipam check``
also reads the API server itself (``--kubeconfig`` or in-cluster).

Exit codes: 0 ok; 1 problems found (check), refused (release), node not
ready (status), nothing matched (pods with a filter), BGP not established or
BIRD unreachable (bgp); 2 usage error or the agent unreachable.  ``policy
explain``: 0 allowed, 1 denied, 2 cannot tell (why is printed), a usage error
or the agent unreachable; with ``--verify`` also 2 when the kernel could not
be asked (why is printed) and 3 when the kernel disagrees with the explanation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flock.policy import Explanation, Party, Query, Verdict, explanation_text
from flock.services._view import view_text

from ._protocol import DEFAULT_ADMIN_SOCKET, AdminRefused, AdminUnreachable, ask

EXIT_OK, EXIT_PROBLEMS, EXIT_UNREACHABLE = 0, 1, 2
EXIT_DISAGREES = 3  # policy explain --verify: the kernel did not do what the explanation says


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [[str(c) for c in header], *[["-" if c in (None, "") else str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def _age(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


# -- commands ---------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> tuple[dict[str, Any], str, int]:
    st = ask(args.socket, "status")
    nc = st["nodeconfig"]
    lines = [f"node        {st['node']}  {'READY' if st['ready'] else 'NOT READY'}"]
    for reason in st["not_ready"]:
        lines.append(f"  not ready: {reason}")
    for note in st["notes"]:
        lines.append(f"  degraded:  {note}")
    if nc is None:
        lines.append("nodeconfig  none yet")
    else:
        lines.append(
            f"nodeconfig  {nc['cidr6']} {nc['cidr4'] or ''}  families {','.join(nc['families'])}  "
            f"AS {nc['asn'] or '-'}  router-id {nc['router_id'] or '-'}  peers {len(nc['peers'])}  "
            f"rv {nc['resource_version'] or '-'}"
        )
    if st.get("mtu"):
        lines.append(f"mtu         {st['mtu']['value']}  ({st['mtu']['source']}; new pods, existing ones keep theirs)")
    a = st["allocations"]
    lines.append(f"pods        {a.get('committed', 0)} committed, {a.get('pending', 0)} pending")
    lines.append(
        f"deletes     {len(st['queued_deletes'])} queued"
        + (f": {', '.join(st['queued_deletes'][:5])}" if st["queued_deletes"] else "")
        + (
            f"; {st['veth_removals']['pending']} veth removals pending"
            if st.get("veth_removals", {}).get("pending")
            else ""
        )
    )
    if st["pools"]:
        lines.append("")
        lines.append(
            table(
                [
                    [
                        p["family"],
                        p["cidr"],
                        p["used"],
                        p["free"],
                        f"{100 * p['used'] / p['usable']:.1f}%" if p["usable"] else "-",
                        "yes" if p["cidr"] in st["exhausted"] else "no",
                    ]
                    for p in st["pools"]
                ],
                ["FAMILY", "BLOCK", "USED", "FREE", "USE%", "EXHAUSTED"],
            )
        )
    bgp = st["bgp"]
    lines.append("")
    if bgp is None:
        lines.append("bgp         no BIRD on this node")
    elif not bgp["reachable"]:
        lines.append(f"bgp         unreachable: {bgp['error']}")
    else:
        lines.append(
            table(
                [[s["name"], s["neighbor"], s["state"], s["info"]] for s in bgp["sessions"]],
                ["SESSION", "NEIGHBOR", "STATE", "INFO"],
            )
        )
    pol = st.get("policy")
    if pol is not None:
        lines.extend(policy_lines(pol))
    proxy = st.get("service_proxy")
    if proxy is not None:
        lines.append(service_proxy_line(proxy))
    if st.get("encryption") is not None:
        lines.extend(encryption_lines(st["encryption"]))
    ag = st["agent"]
    lines.append("")
    lines.append(
        f"agent       flock {ag['version']}  pid {ag['pid']}  up {_age(ag['uptime_s'])}  "
        f"CNI wire v{','.join(map(str, ag['cni_wire_versions']))}  admin v{ag['admin_protocol_version']}"
    )
    return st, "\n".join(lines), EXIT_OK if st["ready"] else EXIT_PROBLEMS


def encryption_lines(enc: dict[str, Any]) -> list[str]:
    """``status``'s part on encryption: the device, the key, the guard's drops, each peer's handshake."""
    if enc.get("mode") != "wireguard":
        return ["", "encryption  off (pod traffic between nodes is not encrypted)"]
    guard = enc["guard"]
    dropped = "-" if guard["dropped_packets"] is None else f"{guard['dropped_packets']} packets"
    lines = [
        "",
        f"encryption  WireGuard  device {enc['device']} ({enc['kind'] or 'not up'})  mtu {enc['mtu'] or '-'}  "
        f"port {enc['listen_port']}  key {enc['public_key'] or '-'}"
        + ("  (rotation: waiting for every peer's handshake)" if enc["rotation_pending"] else ""),
        f"  guard     {guard['table']} counter {guard['counter']}: {dropped} dropped, "
        f"{guard['guarded_blocks']} remote pod blocks reachable through the tunnel only"
        + (f"; in the clear to {', '.join(enc['allow_plaintext_to'])}" if enc["allow_plaintext_to"] else ""),
    ]
    if enc.get("error"):
        lines.append(f"  error     {enc['error']}")
    if enc.get("device_error"):
        lines.append(f"  device    {enc['device_error']}")
    for refusal in enc.get("refusals") or []:
        lines.append(f"  refused   {refusal}")
    peers = enc.get("peers") or []
    if peers:
        now = enc.get("now") or 0
        lines.append(
            table(
                [
                    [
                        p["node"],
                        p["endpoint"] or "-",
                        "never" if not p["latest_handshake"] else f"{_age(max(0, now - p['latest_handshake']))} ago",
                        p["rx_bytes"],
                        p["tx_bytes"],
                        ",".join(p["allowed_ips"]),
                    ]
                    for p in peers
                ],
                ["PEER", "ENDPOINT", "HANDSHAKE", "RX", "TX", "ALLOWED IPS"],
            )
        )
    return lines


def cmd_wireguard_rotate(args: argparse.Namespace) -> tuple[dict[str, Any], str, int]:
    try:
        out = ask(args.socket, "wireguard-rotate")
    except AdminRefused as exc:
        return {"refused": exc.error, "details": exc.details}, f"refused: {exc.error}\n  {exc.details}", EXIT_PROBLEMS
    text = (
        f"rotated: public key {out['public_key']} (was {out['previous_public_key']}); published to this node's "
        "NodeConfig; the previous key is forgotten once every peer has shaken hands with the new one"
    )
    return {**out, "refused": None}, text, EXIT_OK


def service_proxy_line(proxy: dict[str, Any]) -> str:
    """``status``'s and ``services``' line on the service proxy."""
    line = f"services    {proxy['state']}"
    if proxy["enabled"]:
        line += f": {proxy['services']} Services, {proxy['endpoint_slices']} EndpointSlices"
    if proxy["conflicts"]:
        line += f"; {len(proxy['conflicts'])} address conflicts: " + "; ".join(proxy["conflicts"][:3])
    return line


def cmd_services(args: argparse.Namespace) -> tuple[dict[str, Any], str, int]:
    out = ask(args.socket, "services", **({"service": args.service} if args.service else {}))
    lines = [service_proxy_line(out["proxy"])] if out["proxy"] is not None else ["services    no service proxy"]
    if out.get("node_addresses"):
        lines.append(f"            NodePorts answer on {', '.join(out['node_addresses'])}")
    bgp = out.get("bgp")
    if bgp is not None:
        line = f"bgp         {bgp['routes']} Service routes announced"
        if bgp["leaving"]:
            phase = "withdrawn but the last-resort ones" if bgp["withdrawn"] else "with GRACEFUL_SHUTDOWN"
            line += f"; leaving ({'; '.join(bgp['leaving'])}): {phase}"
        lines.append(line)
    if args.service:
        lines += ["", *(view_text(view) for view in out["services"])]
    elif out["services"]:
        rows = []
        for view in out["services"]:
            ports = ",".join(
                f"{p['port']}{':' + str(p['node_port']) if p['node_port'] else ''}/{p['protocol']}"
                for p in view["ports"]
            )
            chosen = sum(
                1 for p in view["ports"] for fam in p["families"].values() for ep in fam["endpoints"] if ep["chosen"]
            )
            refused = any(fam["outcome"].startswith("refused") for p in view["ports"] for fam in p["families"].values())
            rows.append(
                [
                    f"{view['namespace']}/{view['name']}",
                    view["type"],
                    ",".join(view["cluster_ips"]) or "None",
                    ",".join(view["external_addresses"]) or "-",
                    ports or "-",
                    "refused (no endpoints)" if refused else str(chosen),
                ]
            )
        lines += ["", table(rows, ["SERVICE", "TYPE", "CLUSTER-IPS", "EXTERNAL", "PORTS", "ENDPOINTS CHOSEN"])]
    proxy = out["proxy"]
    ok = proxy is not None and (proxy["state"] in ("in sync", "applying") or not proxy["enabled"])
    return out, "\n".join(lines), EXIT_OK if ok else EXIT_PROBLEMS


def policy_lines(pol: dict[str, Any]) -> list[str]:
    """``status``'s policy part: the table in force, ClusterNetworkPolicies, refused objects, fail-closed rules."""
    lines = []
    if pol["error"]:
        lines.append(f"policy      NOT APPLIED: {pol['error']}")
    elif not pol["applied"]:
        lines.append("policy      nothing applied yet")
    else:
        lines.append(
            f"policy      applied (resourceVersion {pol['applied_resource_version']}): "
            f"{pol['isolated_pods']} isolated pods, {pol['chains']} chains, {pol['sets']} sets"
        )
    tiers = pol.get("cluster_policies")
    if tiers is not None:
        counts = ", ".join(f"{n} {tier}" for tier, n in tiers.items())
        lines.append(f"cluster     {sum(tiers.values())} ClusterNetworkPolicies ({counts})")

    def listed(title: str, entries: list[str], total: int) -> None:
        for i, entry in enumerate(entries):
            lines.append(f"{title if i == 0 else '':<12}{entry}")
        if total > len(entries):
            lines.append(f"{'':<12}… and {total - len(entries)} more")

    listed(
        "refused",
        [f"{r['object']}: {r['why']}" for r in pol.get("refused", [])],
        pol.get("refused_total", 0),
    )
    listed(
        "fail-closed",
        [f"ClusterNetworkPolicy {r['policy']} {r['rule']}" for r in pol.get("fail_closed", [])],
        pol.get("fail_closed_total", 0),
    )
    return lines


def cmd_pods(args: argparse.Namespace) -> tuple[dict[str, Any], str, int]:
    out = ask(args.socket, "pods")
    pods = [
        p
        for p in out["pods"]
        if (args.namespace is None or p["namespace"] == args.namespace)
        and (args.pod is None or p["pod"] == args.pod)
        and (args.address is None or args.address.split("/")[0] in (*p["addresses"], *p["anycast"]))
        and (args.network is None or p.get("network") == args.network)
    ]
    result = {"pods": pods, "kernel_read": out["kernel_read"]}
    with_ports = any(p.get("ports") for p in pods)  # the column only where some pod has a hostPort
    rows = [
        [
            p["container_id"][:16],
            f"{p['namespace']}/{p['pod']}" if p["namespace"] else f"(no pod) {p['pod']}".rstrip(),
            " ".join(p["addresses"]),
            " ".join(p["anycast"]),
            p["host_veth"] + ("" if p["host_veth_present"] in (True, None) else " (missing)"),
            p["state"] + ("" if p["netns_alive"] else ", netns gone"),
            _age(p["age_s"]),
            *([", ".join(p.get("ports", ()))] if with_ports else []),
        ]
        for p in pods
    ]
    headers = ["CONTAINER", "POD", "ADDRESSES", "ANYCAST", "HOST VETH", "STATE", "AGE"]
    text = table(rows, headers + (["HOST PORTS"] if with_ports else []))
    filtered = args.namespace or args.pod or args.address or args.network
    return result, text, EXIT_PROBLEMS if filtered and not pods else EXIT_OK


def cmd_ipam_show(args: argparse.Namespace) -> tuple[dict[str, Any], str, int]:
    out = ask(args.socket, "ipam-show")
    lines = [
        table(
            [
                [
                    b["family"],
                    b["cidr"],
                    "yes" if b["default"] else "no",
                    b["usable"],
                    b["used"],
                    b["free"],
                    b["anycast"],
                ]
                for b in out["blocks"]
            ],
            ["FAMILY", "BLOCK", "DEFAULT", "USABLE", "USED", "FREE", "ANYCAST"],
        )
    ]
    for b in out["blocks"]:
        lines.append("")
        lines.append(f"largest free ranges in {b['cidr']}:")
        for r in b["largest_free"]:
            lines.append(f"  {r['first']} - {r['last']}  ({r['size']} addresses)")
    if out["annotation_cidrs"]:
        lines.append("")
        lines.append("annotation CIDRs (pods' cidr6/cidr4):")
        lines.append(
            table(
                [
                    [c["family"], c["cidr"], c["pods"], c["usable"], c["used"], c["free"]]
                    for c in out["annotation_cidrs"]
                ],
                ["FAMILY", "CIDR", "PODS", "USABLE", "USED", "FREE"],
            )
        )
    if out["outside"]:
        lines.append("")
        lines.append("held outside the node blocks (fixed addresses):")
        lines.append(table([[o["address"], o["container_id"][:16]] for o in out["outside"]], ["ADDRESS", "CONTAINER"]))
    return out, "\n".join(lines), EXIT_OK


def _default_kubeconfig(args: argparse.Namespace) -> tuple[Path | None, str | None]:
    """(kubeconfig, why not) — None with no reason means in-cluster."""
    if args.kubeconfig is not None:
        return args.kubeconfig, None
    if os.environ.get("KUBECONFIG"):
        return Path(os.environ["KUBECONFIG"].split(os.pathsep)[0]), None
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None, None
    home = Path.home() / ".kube" / "config"
    if home.exists():
        return home, None
    return None, "no --kubeconfig, $KUBECONFIG, ~/.kube/config or in-cluster service account"


def cmd_ipam_check(args: argparse.Namespace) -> tuple[dict[str, Any], str, int]:
    out = ask(args.socket, "ipam-check", timeout=90)
    if args.network is not None:
        # One network's attachments only (as a GC for it sees them): other networks' rows and their problems left out.
        others = {a["container_id"] for a in out["allocations"] if a.get("network") != args.network}
        out["allocations"] = [a for a in out["allocations"] if a["container_id"] not in others]
        out["problems"] = [p for p in out["problems"] if p["subject"] not in others]
    problems = list(out["problems"])
    unreached = list(out["unreached"])
    checked = dict(out["checked"])
    if args.no_api:
        unreached.append({"part": "api", "error": "skipped (--no-api)"})
    else:
        kubeconfig, why = _default_kubeconfig(args)
        if why is not None:
            unreached.append({"part": "api", "error": why})
        else:
            import trio

            from ._apicheck import ApiUnreachable, cross_check, read_cluster

            try:
                pods, configs = trio.run(read_cluster, kubeconfig)
            except ApiUnreachable as exc:
                unreached.append({"part": "api", "error": str(exc)})
            else:
                more, counts = cross_check(out["node"], out["nodeconfig"], out["allocations"], pods, configs)
                problems += more
                checked.update(counts)
    result = {"node": out["node"], "checked": checked, "problems": problems, "unreached": unreached}
    lines = [
        "checked     " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in checked.items()),
    ]
    for u in unreached:
        lines.append(f"NOT CHECKED {u['part']}: {u['error']}")
    if problems:
        lines.append("")
        lines.append(
            table([[p["kind"], p["subject"], p["detail"]] for p in problems], ["PROBLEM", "SUBJECT", "DETAIL"])
        )
        lines.append("")
        lines.append("to repair:")
        for subject, remedy in dict.fromkeys((p["subject"], p["remedy"]) for p in problems):
            lines.append(f"  {subject}: {remedy}")
    else:
        lines.append("no problems found" + (" in the parts checked" if unreached else ""))
    return result, "\n".join(lines), EXIT_PROBLEMS if problems else EXIT_OK


def cmd_ipam_release(args: argparse.Namespace) -> tuple[dict[str, Any], str, int]:
    try:
        out = ask(args.socket, "ipam-release", target=args.target, force=args.force)
    except AdminRefused as exc:
        result = {
            "released": [],
            "removed_interfaces": [],
            "removed_routes": [],
            "refused": exc.error,
            "details": exc.details,
        }
        return result, f"refused: {exc.error}\n  {exc.details}", EXIT_PROBLEMS
    out = {**out, "refused": None, "details": ""}
    lines = []
    for r in out["released"]:
        who = f"{r['namespace']}/{r['pod']}" if r["namespace"] else f"no pod {r['pod']}".rstrip()
        lines.append(f"released {r['container_id']} ({who}): {' '.join(r['addresses'] + r['anycast'])}")
    for name in out["removed_interfaces"]:
        lines.append(f"removed interface {name}")
    for route in out["removed_routes"]:
        lines.append(f"removed route {route}")
    return out, "\n".join(lines) or "nothing to remove", EXIT_OK


def cmd_bgp(args: argparse.Namespace) -> tuple[dict[str, Any], str, int]:
    out = ask(args.socket, "bgp")
    if not out["reachable"]:
        return out, f"BIRD unreachable: {out['error']}", EXIT_PROBLEMS
    lines = [
        table(
            [
                [
                    s["name"],
                    s["neighbor"],
                    s["neighbor_as"],
                    s["state"],
                    s["bgp_state"],
                    s["imported"],
                    s["exported"],
                    s["last_error"] or s["info"],
                ]
                for s in out["sessions"]
            ],
            ["SESSION", "NEIGHBOR", "AS", "STATE", "BGP STATE", "IMPORTED", "EXPORTED", "INFO"],
        ),
        "",
        "announced: " + (" ".join(out["exported"]) or "-"),
        "learned:   " + (" ".join(out["learned"]) or "-"),
    ]
    down = [s for s in out["sessions"] if s["bgp_state"] != "Established"]
    return out, "\n".join(lines), EXIT_PROBLEMS if down else EXIT_OK


def port_protocol(text: str) -> tuple[int, str]:
    """``80/TCP``, ``53/udp``, ``3868/SCTP``; a bare port is TCP (as a NetworkPolicy port's default)."""
    port, _, protocol = text.partition("/")
    protocol = protocol.upper() or "TCP"
    if not port.isdigit() or not 1 <= int(port) <= 65535 or protocol not in ("TCP", "UDP", "SCTP"):
        raise argparse.ArgumentTypeError(f"{text[:32]!r}: expected PORT/PROTO (80/TCP, 53/UDP, 3868/SCTP)")
    return int(port), protocol


def cmd_policy_explain(args: argparse.Namespace) -> tuple[dict[str, Any], str, int]:
    port, protocol = args.port
    try:
        query = Query.parse(args.source, args.destination, port, protocol, args.family)
    except ValueError as exc:  # a usage error, as argparse's: exit 2
        print(f"flockctl policy explain: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_UNREACHABLE) from None
    fields: dict[str, Any] = {"from": query.source, "to": query.destination, "family": query.family}
    if args.verify:
        fields["verify"] = True
    try:
        out = ask(args.socket, "policy-explain", port=port, protocol=protocol, **fields)
    except AdminRefused as exc:  # an agent without the op, or without a policy service: nothing known
        refused = Explanation(query, Party(query.source), Party(query.destination), Verdict.UNKNOWN, str(exc))
        out = refused.to_json()
    code = {v.value: v.exit_code for v in Verdict}.get(out["verdict"], Verdict.UNKNOWN.exit_code)
    if args.verify:
        if out.get("verify") is None:  # an agent from before --verify ignores the field
            why = "cannot verify: this flock-agent cannot (it is older than --verify)"
            out["verify"] = {"status": "not-verified", "why": why, "node": "", "probe": None}
            out["verify"] |= {"egress": None, "ingress": None, "notes": []}
        status = out["verify"]["status"]
        if status == "disagrees":
            code = EXIT_DISAGREES
        elif status != "agrees":
            code = Verdict.UNKNOWN.exit_code
    return out, explanation_text(out), code


# -- command line --------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output (stable keys)")
    common.add_argument(
        "--socket",
        type=Path,
        default=Path(os.environ.get("FLOCK_ADMIN_SOCKET", DEFAULT_ADMIN_SOCKET)),
        help="the agent's admin socket (default: $FLOCK_ADMIN_SOCKET or %(default)s)",
    )
    p = argparse.ArgumentParser(
        prog="flockctl",
        description="flock's view of this node, and repairs through the agent",
        epilog="exit codes: 0 ok; 1 problems found, refused, not ready or nothing matched; 2 usage or agent unreachable",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    s = sub.add_parser("status", parents=[common], help="readiness, NodeConfig, pools, BGP, queued deletes, versions")
    s.set_defaults(run=cmd_status)
    s = sub.add_parser("pods", parents=[common], help="every attachment on this node")
    s.add_argument("--namespace", "-n")
    s.add_argument("--pod")
    s.add_argument("--address")
    s.add_argument("--network", help="only attachments made through this CNI network (the conflist's name)")
    s.set_defaults(run=cmd_pods)
    ipam = sub.add_parser("ipam", help="addresses: show, check, release").add_subparsers(
        dest="ipam", required=True, metavar="SUBCOMMAND"
    )
    s = ipam.add_parser("show", parents=[common], help="usage per node block, largest free ranges")
    s.set_defaults(run=cmd_ipam_show)
    s = ipam.add_parser("check", parents=[common], help="store vs kernel vs API server; exit 1 on problems")
    s.add_argument("--kubeconfig", type=Path, default=None, help="default: $KUBECONFIG, ~/.kube/config, in-cluster")
    s.add_argument("--no-api", action="store_true", help="check the local parts only")
    s.add_argument("--network", help="only attachments made through this CNI network (the conflist's name)")
    s.set_defaults(run=cmd_ipam_check)
    s = ipam.add_parser("release", parents=[common], help="release a leaked allocation through the agent")
    s.add_argument(
        "target",
        metavar="ADDRESS|CONTAINER|VETH",
        help="an address, a container ID or a unique prefix of one (at least 4 characters: what `pods` shows), "
        "or a flock veth",
    )
    s.add_argument("--force", action="store_true", help="even when its network namespace is still there")
    s.set_defaults(run=cmd_ipam_release)
    wireguard = sub.add_parser("wireguard", help="encryption between nodes: rotate this node's key").add_subparsers(
        dest="wireguard", required=True, metavar="SUBCOMMAND"
    )
    s = wireguard.add_parser("rotate", parents=[common], help="a new WireGuard key for this node, published")
    s.set_defaults(run=cmd_wireguard_rotate)
    s = sub.add_parser("bgp", parents=[common], help="BGP sessions, announced and learned routes (from BIRD)")
    s.set_defaults(run=cmd_bgp)
    s = sub.add_parser(
        "services",
        parents=[common],
        help="what this node translates for each Service: addresses, ports, endpoints chosen and why",
    )
    s.add_argument("service", nargs="?", metavar="NS/NAME", help="one Service in detail")
    s.set_defaults(run=cmd_services)
    policy = sub.add_parser("policy", help="NetworkPolicy and ClusterNetworkPolicy: explain").add_subparsers(
        dest="policy", required=True, metavar="SUBCOMMAND"
    )
    s = policy.add_parser(
        "explain",
        parents=[common],
        help="may FROM open a connection to TO, and which policy and rule decide (as the agent computes it)",
        description="The verdict of the source's egress (on its node) and of the destination's ingress (on "
        "its node), and the ClusterNetworkPolicy and NetworkPolicy rules that decided, computed by the agent "
        "from the inputs it has applied, through the compiler that makes its ruleset, and checked against "
        "the reference evaluator (and, for this node's pods, against the ruleset in force).",
        epilog="exit codes: 0 allowed; 1 denied; 2 cannot tell (why is printed), usage error or agent unreachable; "
        "with --verify also 2 when the kernel could not be asked, 3 when it disagrees with the explanation",
    )
    s.add_argument("source", metavar="FROM", help="NS/POD, an address, or a node's name")
    s.add_argument("destination", metavar="TO", help="NS/POD, an address, or a node's name")
    s.add_argument("port", metavar="PORT/PROTO", type=port_protocol, help="80/TCP, 53/UDP, 3868/SCTP (default TCP)")
    s.add_argument(
        "--family", type=int, choices=(6, 4), help="IPv6 or IPv4 (default: an address's, else both ends' IPv6 first)"
    )
    s.add_argument(
        "--verify",
        action="store_true",
        help="also send one real packet from FROM (a pod on this node) with nftables tracing on for it alone, "
        "print the chains and rule handles it went through and hold them to the explanation (exit 3 if they part)",
    )
    s.set_defaults(run=cmd_policy_explain)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        result, text, code = args.run(args)
    except AdminUnreachable as exc:
        print(f"flockctl: cannot reach flock-agent: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except AdminRefused as exc:
        print(f"flockctl: the agent refused: {exc}", file=sys.stderr)
        return EXIT_PROBLEMS
    if args.json:
        json.dump(result, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print(text)
    return code
