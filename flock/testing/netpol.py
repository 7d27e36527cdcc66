"""The network-policy e2e model of the upstream Kubernetes tests, as plain values.

Namespaces x, y, z, each with pods a, b, c (labels ``pod=<name>``, namespaces
labelled ``ns=<name>``), every pod serving 80 and 81 over TCP and UDP.  A test
states the expected truth table with the same vocabulary as upstream
(``expect_peer``, ``expect_all_ingress`` …), then compares it with what
``flock-lab matrix --json`` measured::

    want = Reachability(MODEL.pods, True)
    want.expect_peer(Peer(), Peer(namespace="x"), False)     # default deny ingress in x
    assert not want.mismatches(results, "80/TCP", 6), want.table(results, "80/TCP", 6)

A pod reaching itself never leaves its network namespace, so no policy can
stop it; the tables expect self-connections to succeed, whatever the rest.
A table may have other columns than its rows (``targets``: the lab's nodes,
say, probed with ``flock-lab matrix --to node1 --to node2``).

:class:`Lab` drives one lab directory through ``flock-lab``'s command line
(in this process), and :func:`model_lab` brings up the two-node lab with the
model in it: what tests/lab's ``netpol`` stage shares.  :meth:`Lab.check`
measures with ``matrix --explain-all`` and also holds every probed pair's
explanation (``flockctl policy explain``, asked of the source pod's agent) to
what the probe met (:func:`explain_drift`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml

from flock.lab import LabPlan, load_pods
from flock.lab.cli import main
from flock.netlink._conntrack import forget
from flock.netlink._nsenter import run_in_netns
from flock.policy import explanation_text


@attrs.frozen
class Model:
    namespaces: tuple[str, ...] = ("x", "y", "z")
    pod_names: tuple[str, ...] = ("a", "b", "c")
    ports: tuple[int, ...] = (80, 81)
    protocols: tuple[str, ...] = ("TCP", "UDP")

    @property
    def pods(self) -> tuple[str, ...]:
        return tuple(f"{ns}/{p}" for ns in self.namespaces for p in self.pod_names)

    def port_args(self) -> list[str]:
        """``--port`` values for a model pod: ``serve-80-tcp=80/TCP`` … (named as upstream)."""
        return [f"serve-{port}-{proto.lower()}={port}/{proto}" for port in self.ports for proto in self.protocols]


MODEL = Model()


@attrs.frozen
class Peer:
    """Matches pods: any namespace/pod when None (upstream's netpol.Peer)."""

    namespace: str | None = None
    pod: str | None = None

    def matches(self, key: str) -> bool:
        ns, _, pod = key.partition("/")
        return (self.namespace is None or ns == self.namespace) and (self.pod is None or pod == self.pod)


@attrs.define
class Reachability:
    """The expected connectivity of every (from, to) pair of *pods*."""

    pods: Sequence[str]  # the rows: sources
    default: bool
    targets: Sequence[str] | None = None  # the columns, when they are not the pods
    _expected: dict[tuple[str, str], bool] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        self._expected = {(s, d): self.default for s in self.pods for d in self.columns}

    @property
    def columns(self) -> Sequence[str]:
        return self.pods if self.targets is None else self.targets

    def expect(self, source: str, target: str, connected: bool) -> None:
        self._expected[(source, target)] = connected

    def expect_peer(self, source: Peer, target: Peer, connected: bool) -> None:
        for s, d in self._expected:
            if source.matches(s) and target.matches(d):
                self._expected[(s, d)] = connected

    def expect_all_ingress(self, target: str, connected: bool) -> None:
        for s in self.pods:
            self._expected[(s, target)] = connected

    def expect_all_egress(self, source: str, connected: bool) -> None:
        for d in self.columns:
            self._expected[(source, d)] = connected

    def expected(self, source: str, target: str) -> bool:
        return True if source == target else self._expected[(source, target)]

    def observed(self, results: Iterable[Mapping[str, Any]], port: str, family: int) -> dict[tuple[str, str], bool]:
        """The measured table of one port and family out of ``matrix --json`` results."""
        return {
            (r["from"], r["to"]): bool(r["connected"])
            for r in results
            if r["port"] == port and r["family"] == family and r["from"] in self.pods and r["to"] in self.columns
        }

    def mismatches(self, results: Iterable[Mapping[str, Any]], port: str, family: int) -> list[str]:
        seen = self.observed(results, port, family)
        wrong = []
        for s in self.pods:
            for d in self.columns:
                if (s, d) not in seen:
                    wrong.append(f"{s} → {d} {port} IPv{family}: not probed")
                elif seen[(s, d)] != self.expected(s, d):
                    want = "connected" if self.expected(s, d) else "blocked"
                    wrong.append(f"{s} → {d} {port} IPv{family}: expected {want}")
        return wrong

    def table(self, results: Iterable[Mapping[str, Any]], port: str, family: int) -> str:
        """Expected and observed side by side (``.`` connected, ``X`` blocked; ``!`` marks a difference)."""
        seen = self.observed(results, port, family)
        width = max(len(p) for p in (*self.pods, *self.columns)) + 1
        head = "".join(f"{p:>{width + 1}}" for p in self.columns)
        lines = [f"{port} IPv{family}: expected | observed", f"{'':<{width}}{head}   |{head}"]
        for s in self.pods:
            want = "".join(f"{'.' if self.expected(s, d) else 'X':>{width + 1}}" for d in self.columns)
            got = ""
            for d in self.columns:
                mark = "?" if (s, d) not in seen else "." if seen[(s, d)] else "X"
                if (s, d) in seen and seen[(s, d)] != self.expected(s, d):
                    mark = "!" + mark
                got += f"{mark:>{width + 1}}"
            lines.append(f"{s:<{width}}{want}   |{got}")
        return "\n".join(lines)


# ---- the model on a flock lab ---------------------------------------------------------------

NODE_OF = {"a": "node1", "b": "node2", "c": "node1"}  # where the model's pods run
NODES = ("node1", "node2")
NS_LABEL = "kubernetes.io/metadata.name"


class Lab:
    """flock-lab's command line, in this process, on one lab directory; it remembers
    what a case changed (policies applied, node labels set) so :meth:`reset` undoes it."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.applied: set[tuple[str, str]] = set()  # NetworkPolicies to delete after a case
        self.applied_cluster: set[str] = set()  # ClusterNetworkPolicies to delete after a case
        self.node_labels: set[tuple[str, str]] = set()  # (node, key) set by a case
        self.plan = LabPlan.make(directory, len(NODES))

    def run(self, *args: str) -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main([*args, "--dir", str(self.dir)])
        return code, out.getvalue()

    def ok(self, *args: str) -> str:
        code, out = self.run(*args)
        assert code == 0, f"flock-lab {' '.join(args)}: exit {code}: {out}"
        return out

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``flock-lab`` as its own process (exit codes as a user sees them)."""
        exe = Path(sys.executable).parent / "flock-lab"
        return subprocess.run(
            [str(exe), *args, "--dir", str(self.dir)], capture_output=True, text=True, timeout=60, check=False
        )

    def apply(self, *docs: dict[str, Any], wait: bool = True) -> None:
        # Remembered first: an apply that fails half-way is undone by reset too.
        for doc in docs:
            if doc["kind"] == "NetworkPolicy":
                self.applied.add((doc["metadata"]["namespace"], doc["metadata"]["name"]))
            elif doc["kind"] == "ClusterNetworkPolicy":
                self.applied_cluster.add(doc["metadata"]["name"])
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump_all(docs, f)
        try:
            self.ok("apply", f.name)
        finally:
            os.unlink(f.name)
        if wait:
            self.wait()

    def delete(self, namespace: str, name: str, wait: bool = True) -> None:
        self.ok("delete", "networkpolicy", f"{namespace}/{name}")
        self.applied.discard((namespace, name))
        if wait:
            self.wait()

    def delete_cluster(self, name: str, wait: bool = True) -> None:
        self.ok("delete", "clusternetworkpolicy", name)
        self.applied_cluster.discard(name)
        if wait:
            self.wait()

    def label_node(self, node: str, *pairs: str, remove: Sequence[str] = (), wait: bool = True) -> None:
        self.ok("node", "label", node, *pairs, *(arg for key in remove for arg in ("--remove", key)))
        self.node_labels |= {(node, pair.partition("=")[0]) for pair in pairs}
        if wait:
            self.wait()

    def wait(self) -> None:
        out = self.ok("policy", "wait", "--timeout", "30", "--json")
        assert json.loads(out)["ok"], out

    def matrix(
        self, ports: Sequence[str], family: int = 6, targets: Sequence[str] = (), explain: bool = False
    ) -> list[dict[str, Any]]:
        """``matrix --json``'s results; with *explain* (``--explain-all``), each with the agents' ``explanation``."""
        self.forget_udp_flows()
        args = ["matrix", "--json", "--family", str(family), *(["--explain-all"] if explain else [])]
        for p in ports:
            args += ["--port", p]
        for t in targets:
            args += ["--to", t]
        return json.loads(self.ok(*args))["results"]

    def forget_udp_flows(self) -> None:
        """Delete the nodes' UDP conntrack entries.  flock keeps flows that are established when a policy
        changes (as Calico and Cilium do); a matrix asks what *new* flows meet, and a UDP probe whose
        source port happens to repeat an earlier case's allowed flow within the entry's lifetime
        (120 s) would ride it.  TCP probes never do: each one is a new connection."""
        for node in self.plan.nodes:
            run_in_netns(f"/run/netns/{node.netns}", functools.partial(forget, (), every_port="udp"))

    def check(self, want: Reachability, ports: Sequence[str] = ("80/TCP",), family: int = 6) -> None:
        """Measure *want*'s table (pods to pods, or to ``want.targets``) and compare; then hold the agents'
        explanations of every probed pair (``flock-lab matrix --explain-all``) to what the probes met."""
        results = self.matrix(ports, family, () if want.targets is None else want.targets, explain=True)
        problems = [m for p in ports for m in want.mismatches(results, p, family)]
        tables = "\n\n".join(want.table(results, p, family) for p in ports)
        assert not problems, f"{len(problems)} probes differ:\n" + "\n".join(problems[:20]) + "\n\n" + tables
        drift = explain_drift(results)
        more = "; ".join(d.splitlines()[0] for d in drift[3:])
        assert not drift, (
            f"{len(drift)} explanations disagree with the probes:\n"
            + "\n\n".join(drift[:3])
            + (f"\n\n… and {len(drift) - 3} more: {more}" if more else "")
        )
        self.verify_sample(results)

    def verify_sample(self, results: Sequence[Mapping[str, Any]]) -> None:
        """``flock-lab explain --verify`` (one real packet, traced by nftables, held to the explanation) of one
        blocked and one allowed pair of the matrix (:func:`verify_pairs`): the kernel must agree (exit 0/1)."""
        for r in verify_pairs(results):
            # the address the probe went to, as the matrix's explanation was asked (a node by name is known to
            # explain only while Nodes are listed)
            target = r["to"] if "/" in r["to"] else (r["explanation"].get("to") or {}).get("address") or r["to"]
            args = ["explain", r["from"], target, r["port"], "--family", str(r["family"]), "--verify", "--json"]
            code, out = self.run(*args)
            doc = json.loads(out) if out.strip().startswith("{") else {}
            verify = doc.get("verify") or {}
            assert code in (0, 1) and verify.get("status") == "agrees", (
                f"flock-lab {' '.join(args[:-1])}: exit {code}, the kernel {verify.get('status')}: "
                f"{verify.get('why') or ''}\n{out[:3000]}"
            )
            assert (code == 0) == bool(r["connected"]), f"--verify says exit {code} where the probe met {r}"

    def address(self, pod: str, family: int) -> str:
        (found,) = [p for p in load_pods(self.plan) if p.key == pod]
        return found.addresses(family)[0]

    def node_address(self, node: str, family: int) -> str:
        plan = self.plan.node(node)
        return str(plan.addr6 if family == 6 else plan.addr4)

    def reset(self) -> None:
        """Back to the model: no policies, the model's labels."""
        # What a case applied (or tried to): gone already, or never made, is fine.
        for namespace, name in sorted(self.applied):
            self.run("delete", "networkpolicy", f"{namespace}/{name}")
        self.applied.clear()
        for name in sorted(self.applied_cluster):
            self.run("delete", "clusternetworkpolicy", name)
        self.applied_cluster.clear()
        for node in NODES:
            keys = sorted(key for n, key in self.node_labels if n == node)
            labels = self.plan.node(node).node_labels()
            self.ok(
                "node",
                "label",
                node,
                *(f"{k}={v}" for k, v in labels.items()),
                *(arg for key in keys if key not in labels for arg in ("--remove", key)),
            )
        self.node_labels.clear()
        for ns in MODEL.namespaces:
            self.ok("ns", "label", ns, f"ns={ns}", "--remove", "team")
            for p in MODEL.pod_names:
                self.ok("pod", "label", f"{ns}/{p}", f"pod={p}", "--remove", "role")
        self.wait()


def explain_drift(results: Iterable[Mapping[str, Any]]) -> list[str]:
    """The results of ``matrix --explain-all`` whose explanation does not say what the probe met: each as
    ``x/a → y/b 80/TCP IPv6: probe blocked, explain allowed (the agent on node1)`` and the explanation's text
    (its path and chains), as flockctl prints it."""
    drift = []
    for r in results:
        doc = r.get("explanation")
        probed = "connected" if r["connected"] else "blocked"
        head = f"{r['from']} → {r['to']} {r['port']} IPv{r['family']}: probe {probed}"
        if not isinstance(doc, Mapping) or "error" in doc:
            why = doc["error"] if isinstance(doc, Mapping) else "the matrix gave no explanation"
            drift.append(f"{head}, not explained: {why}")
            continue
        said = doc.get("verdict")
        if said == ("allowed" if r["connected"] else "denied"):
            continue
        drift.append(f"{head}, explain {said} (the agent on {doc.get('asked')})\n{explanation_text(doc)}")
    return drift


def verify_pairs(results: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One blocked and one allowed pair of a matrix (a pod reaching itself is neither: its packets never leave
    its namespace), each explained by the agent on its source's node (what ``--verify`` sends from)."""
    picked: dict[bool, Mapping[str, Any]] = {}
    for r in results:
        doc = r.get("explanation") or {}
        source = doc.get("from") or {}
        if r["from"] == r["to"] or source.get("kind") != "pod" or source.get("node") != doc.get("asked"):
            continue
        picked.setdefault(bool(r["connected"]), r)
    return [picked[k] for k in (False, True) if k in picked]


@contextlib.contextmanager
def model_lab(prefix: str = "flnp-") -> Iterator[Lab]:
    """A two-node lab (needs root, bird2, nft) with the model's namespaces and pods, down afterwards."""
    # Unix socket paths hold at most 108 bytes: a short directory of our own.
    lab = Lab(Path(tempfile.mkdtemp(prefix=prefix, dir="/run")))
    try:
        lab.ok("up", "--nodes", str(len(NODES)))
        for ns in MODEL.namespaces:
            lab.ok("ns", "add", ns, "--label", f"ns={ns}")
            for p in MODEL.pod_names:
                ports = [arg for port in MODEL.port_args() for arg in ("--port", port)]
                lab.ok("pod", "add", NODE_OF[p], f"{ns}/{p}", "--label", f"pod={p}", *ports)
        lab.wait()
        yield lab
    finally:
        code, out = lab.run("down")
        assert code == 0, out
        shutil.rmtree(lab.dir, ignore_errors=True)
