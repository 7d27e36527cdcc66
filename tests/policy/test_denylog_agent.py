"""Denied traffic, logged, through the whole agent: the Namespace annotation read by the watchers, the
log rules in the node's table, the "policy-log" service's line and counter for a blocked probe (within
a second), and the annotation switched off again (the log rules leave the table, in place).

The real flock-agent (flock.testing.agentlab: the fake API server, a node network namespace, the real
shim; no BIRD).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from flock.apiserver import NAMESPACES, NETWORKPOLICIES, PODS, namespace_object, network_policy_object, pod_object
from flock.netns import call_in_netns
from flock.testing.agentlab import open_lab, wait_for

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("require_root")]

LOG_DENIED = "flock.fritzlab.net/log-denied"
SERIES = (
    'flock_policy_denied_packets_total{direction="Ingress",namespace="srv",policy="isolate",rule="",'
    'tier="NetworkPolicy"}'
)


def test_a_blocked_probe_is_one_line_and_one_count_naming_the_policy(tmp_path: Path) -> None:
    with open_lab(tmp_path, "fl-dla-", bird=False) as lab:
        agent = lab.agent()
        agent.wait_ready()
        srv = namespace_object("srv", {"team": "srv"})
        srv["metadata"]["annotations"] = {LOG_DENIED: "true"}
        lab.api.create(NAMESPACES, srv)
        lab.api.create(NAMESPACES, namespace_object("cli"))
        lab.api.create(NETWORKPOLICIES, network_policy_object("srv", "isolate", {"podSelector": {}}))
        netns = {}
        for ns, name, cid in (("srv", "server", "c0000001"), ("cli", "client", "c0000002")):
            lab.api.create(PODS, pod_object(ns, name, "host001"))
            netns[name] = lab.pool.create(name[:6])
            assert lab.cni("ADD", cid, netns[name], name, namespace=ns).status == 0
        server = lab.rows()["c0000001"].ip6
        veth = lab.node.ip("-6", "route", "show", f"{server}/128").split(" dev ")[1].split()[0]

        def chain() -> str:
            return lab.node.run("nft", "list", "chain", "inet", "flock", f"in-{veth}", check=False).stdout

        wait_for("the log rule", lambda: "log prefix" in chain())

        sock = call_in_netns(netns["client"].name, lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM))
        with sock:
            sock.setblocking(False)
            sent = time.monotonic()
            with pytest.raises(BlockingIOError):
                sock.connect((str(server), 81))

            def denied_lines() -> list[dict]:
                return [r for r in agent.records() if r.get("op") == "policy-denied"]

            (line,) = wait_for("the denied line", denied_lines, 5)
            took = time.monotonic() - sent
        assert took < 1.0, took
        assert line["msg"] == "denied ingress cli/client → srv/server TCP/81: NetworkPolicy srv/isolate"
        assert (line["pod"], line["src_pod"], line["policies"], line["dport"]) == (
            "srv/server",
            "cli/client",
            ["srv/isolate"],
            81,
        )
        series = [m for m in agent.get("/metrics")[1].splitlines() if m.startswith(SERIES)]
        assert series == [f"{SERIES} 1.0"]
        assert len(denied_lines()) == 1

        # switched off: the server's chain loses its log rule, the table its meters
        lab.api.patch(NAMESPACES, "srv", {"metadata": {"annotations": {LOG_DENIED: "false"}}})
        wait_for("the log rule gone", lambda: "log prefix" not in chain() and "drop" in chain())
        assert "denylog" not in lab.node.run("nft", "list", "table", "inet", "flock").stdout
        agent.stop()
