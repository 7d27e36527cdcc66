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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs


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

    pods: Sequence[str]
    default: bool
    _expected: dict[tuple[str, str], bool] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        self._expected = {(s, d): self.default for s in self.pods for d in self.pods}

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
        for d in self.pods:
            self._expected[(source, d)] = connected

    def expected(self, source: str, target: str) -> bool:
        return True if source == target else self._expected[(source, target)]

    def observed(self, results: Iterable[Mapping[str, Any]], port: str, family: int) -> dict[tuple[str, str], bool]:
        """The measured table of one port and family out of ``matrix --json`` results."""
        return {
            (r["from"], r["to"]): bool(r["connected"])
            for r in results
            if r["port"] == port and r["family"] == family and r["from"] in self.pods and r["to"] in self.pods
        }

    def mismatches(self, results: Iterable[Mapping[str, Any]], port: str, family: int) -> list[str]:
        seen = self.observed(results, port, family)
        wrong = []
        for s in self.pods:
            for d in self.pods:
                if (s, d) not in seen:
                    wrong.append(f"{s} → {d} {port} IPv{family}: not probed")
                elif seen[(s, d)] != self.expected(s, d):
                    want = "connected" if self.expected(s, d) else "blocked"
                    wrong.append(f"{s} → {d} {port} IPv{family}: expected {want}")
        return wrong

    def table(self, results: Iterable[Mapping[str, Any]], port: str, family: int) -> str:
        """Expected and observed side by side (``.`` connected, ``X`` blocked; ``!`` marks a difference)."""
        seen = self.observed(results, port, family)
        width = max(len(p) for p in self.pods) + 1
        head = "".join(f"{p:>{width + 1}}" for p in self.pods)
        lines = [f"{port} IPv{family}: expected | observed", f"{'':<{width}}{head}   |{head}"]
        for s in self.pods:
            want = "".join(f"{'.' if self.expected(s, d) else 'X':>{width + 1}}" for d in self.pods)
            got = ""
            for d in self.pods:
                mark = "?" if (s, d) not in seen else "." if seen[(s, d)] else "X"
                if (s, d) in seen and seen[(s, d)] != self.expected(s, d):
                    mark = "!" + mark
                got += f"{mark:>{width + 1}}"
            lines.append(f"{s:<{width}}{want}   |{got}")
        return "\n".join(lines)
