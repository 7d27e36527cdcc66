"""The lab's policy tooling without a lab: port specs, YAML documents, and the pod
server probed across a real veth between two namespaces of this test."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from flock.apiserver import NAMESPACES, NETWORKPOLICIES
from flock.lab._podserver import start_server, stop_server
from flock.lab._policy import _resource_of, read_documents
from flock.lab._ports import PortSpec
from flock.lab._probe import Endpoint, ProbeResult, probe_all, probe_one, truth_tables
from flock.lab._procs import is_running
from flock.lab._state import LabError
from flock.testing.netns import Netns, NetnsPool


def test_port_specs() -> None:
    assert PortSpec.parse("80/TCP") == PortSpec(80, "TCP")
    assert PortSpec.parse("81/udp") == PortSpec(81, "UDP")
    assert PortSpec.parse("serve-81-udp=81/UDP") == PortSpec(81, "UDP", "serve-81-udp")
    assert PortSpec.parse("9000") == PortSpec(9000, "TCP")
    assert PortSpec.parse("http=8080/SCTP").container_port() == {
        "containerPort": 8080,
        "protocol": "SCTP",
        "name": "http",
    }
    for bad, why in (
        ("0/TCP", "not a port number"),
        ("70000/TCP", "not a port number"),
        ("80/ICMP", "not one of TCP, UDP, SCTP"),
        ("http=80", "expected PORT/PROTO"),
        ("80=80/TCP", "IANA service name"),
        ("a--b=80/TCP", "IANA service name"),
        ("x", "expected"),
    ):
        with pytest.raises(LabError, match=why):
            PortSpec.parse(bad, named=not bad.startswith("http="))


def test_yaml_documents(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        """
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: x}
spec: {podSelector: {}}
---
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Namespace, metadata: {name: y, labels: {ns: y}}}
"""
    )
    docs = read_documents(str(path))
    assert [d["kind"] for d in docs] == ["NetworkPolicy", "Namespace"]
    assert [_resource_of(d, "doc") for d in docs] == [NETWORKPOLICIES, NAMESPACES]
    with pytest.raises(
        LabError,
        match=r"v1 Pod: the lab applies networking\.k8s\.io/v1 NetworkPolicy, "
        r"policy\.networking\.k8s\.io/v1alpha2 ClusterNetworkPolicy and v1 Namespace",
    ):
        _resource_of({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}, "document 1")
    with pytest.raises(LabError, match=r"no metadata\.name"):
        _resource_of({"apiVersion": "v1", "kind": "Namespace", "metadata": {}}, "document 1")
    (tmp_path / "bad.yaml").write_text("a: [unclosed\n")
    with pytest.raises(LabError, match="is not YAML"):
        read_documents(str(tmp_path / "bad.yaml"))
    (tmp_path / "empty.yaml").write_text("---\n")
    with pytest.raises(LabError, match="holds no object"):
        read_documents(str(tmp_path / "empty.yaml"))
    with pytest.raises(LabError, match="cannot read"):
        read_documents(str(tmp_path / "missing.yaml"))


def test_truth_tables_mark_connected_blocked_and_errors() -> None:
    results = [
        ProbeResult("x/a", "x/a", "80/TCP", 6, True, "connected"),
        ProbeResult("x/a", "x/b", "80/TCP", 6, False, "timeout"),
        ProbeResult("x/b", "x/a", "80/TCP", 6, False, "no IPv6 address", error=True),
        ProbeResult("x/b", "x/b", "80/TCP", 6, True, "connected"),
    ]

    class Pod:
        def __init__(self, key: str) -> None:
            self.key = key

    text = truth_tables([Pod("x/a"), Pod("x/b")], [PortSpec(80)], results, 6)  # type: ignore[list-item]
    rows = text.splitlines()
    assert rows[0].startswith("reachability on 80/TCP, IPv6")
    assert rows[2].split() == ["x/a", ".", "X"] and rows[3].split() == ["x/b", "?", "."]
    assert rows[-1] == "4 probes: 2 connected, 1 blocked, 1 errors"
    assert set(results[0].to_json()) == {"from", "to", "port", "family", "connected"}


@pytest.fixture
def pair(require_root: None) -> Iterator[tuple[Netns, Netns]]:
    """Client and server namespaces joined by a veth: 2001:db8:7::1/2 and 192.0.2.1/2."""
    with NetnsPool(prefix="flpr-") as pool:
        client, server = pool.create("c"), pool.create("s")
        pool.veth(client, "eth0", server, "eth0")
        for ns, host in ((client, 1), (server, 2)):
            ns.ip("link", "set", "lo", "up")
            ns.ip("addr", "add", f"2001:db8:7::{host}/64", "dev", "eth0", "nodad")
            ns.ip("addr", "add", f"192.0.2.{host}/24", "dev", "eth0")
            ns.ip("link", "set", "eth0", "up")
        # Routed to the server, which drops it without an answer: a blackhole route (with no route at all
        # the server's kernel answers ICMPv6 "no route" whenever the host-wide ICMP rate limit lets it).
        client.ip("route", "add", "2001:db8:9::/64", "via", "2001:db8:7::2")
        server.ip("route", "add", "blackhole", "2001:db8:9::/64")
        client.ip("route", "add", "unreachable", "2001:db8:a::/64")
        yield client, server


async def test_pod_server_answers_every_port_on_both_families_and_probes_tell_why(
    pair: tuple[Netns, Netns], tmp_path: Path
) -> None:
    client, server = pair
    with trio.fail_after(30):
        ports = [PortSpec(80, "TCP"), PortSpec(81, "UDP"), PortSpec(81, "TCP")]
        ref = await start_server(server.name, "x/s", ports, tmp_path / "x_s.serve")
        try:
            src = Endpoint("x/c", client.name)
            dst = Endpoint("x/s", server.name, ("2001:db8:7::2", "192.0.2.2"))
            wanted = [
                (src, dst, PortSpec(p, proto), family) for p, proto in ((80, "TCP"), (81, "UDP")) for family in (6, 4)
            ]
            results = await probe_all(wanted)
            assert [(r.port, r.family, r.connected, r.reason) for r in results] == [
                ("80/TCP", 6, True, "connected"),
                ("80/TCP", 4, True, "connected"),
                ("81/UDP", 6, True, "connected"),
                ("81/UDP", 4, True, "connected"),
            ]
            assert [r.address for r in results] == ["2001:db8:7::2", "192.0.2.2"] * 2
            # UDP echoes say who answered and whom they saw; TCP does when asked (peer=True).
            assert [(r.served_by, r.seen_as) for r in results[2:]] == [("x/s", "2001:db8:7::1"), ("x/s", "192.0.2.1")]
            told = await probe_one(src, dst, PortSpec(81, "TCP"), 4, peer=True)
            assert (told.served_by, told.seen_as) == ("x/s", "192.0.2.1")

            refused = await probe_one(src, dst, PortSpec(82, "TCP"), 6)
            assert (refused.connected, refused.reason, refused.error) == (False, "refused", False)
            udp_refused = await probe_one(src, dst, PortSpec(82, "UDP"), 4)  # ICMP port unreachable
            assert (udp_refused.connected, udp_refused.reason) == (False, "refused")
            start = trio.current_time()
            dropped = await probe_one(src, Endpoint("2001:db8:9::1", None, ("2001:db8:9::1",)), PortSpec(80), 6)
            assert (dropped.connected, dropped.reason) == (False, "timeout")
            assert 0.9 <= trio.current_time() - start < 1.5  # the lab's 1 s budget
            no_route = await probe_one(src, Endpoint("2001:db8:a::1", None, ("2001:db8:a::1",)), PortSpec(80), 6)
            assert (no_route.connected, no_route.reason) == (False, "unreachable")

            no_v4 = await probe_one(src, Endpoint("x/v6", server.name, ("2001:db8:7::2",)), PortSpec(80), 4)
            assert no_v4.error and "no IPv4 address" in no_v4.reason
            sctp = await probe_one(src, dst, PortSpec(80, "SCTP"), 6)
            assert sctp.error and "SCTP" in sctp.reason
            assert json.loads(json.dumps(results[0].to_json())) == {
                "from": "x/c",
                "to": "x/s",
                "port": "80/TCP",
                "family": 6,
                "connected": True,
            }
        finally:
            await stop_server(ref)
        assert not is_running(ref)
        after = await probe_one(src, dst, PortSpec(80, "TCP"), 6)
        assert (after.connected, after.reason) == (False, "refused")


async def test_pod_server_that_cannot_bind_is_an_error(pair: tuple[Netns, Netns], tmp_path: Path) -> None:
    _, server = pair
    with trio.fail_after(30):
        ref = await start_server(server.name, "x/s", [PortSpec(80)], tmp_path / "one.serve")
        try:
            with pytest.raises(LabError, match=r"port server of x/t exited: .*Address already in use"):
                await start_server(server.name, "x/t", [PortSpec(80)], tmp_path / "two.serve")
        finally:
            await stop_server(ref)
        with pytest.raises(LabError, match="does not exist"):
            await start_server("flpr-no-such-netns", "x/u", [PortSpec(80)], tmp_path / "three.serve")
