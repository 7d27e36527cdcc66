"""``flock-lab fabric routes``' parser, on ``birdc show route all`` output captured from a lab's fabric
(tests/lab/data): every path of every prefix, the ECMP set, a leaving node's graceful shutdown."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from flock.lab._routes import named, parse_routes, routes_text

DATA = Path(__file__).parent / "data"


def by_prefix(name: str):
    return {str(r.prefix): r for r in parse_routes((DATA / name).read_text())}


def test_every_prefix_and_path_is_read() -> None:
    routes = by_prefix("fabric-routes.txt")
    assert set(routes) >= {"198.51.100.0/26", "2001:db8:0:1::/64", "2001:db8:ee::/128", "192.0.2.224/32"}
    block = routes["198.51.100.0/26"]
    (path,) = block.paths
    assert (path.source, path.next_hop, path.local_preference) == ("node1", "2001:db8:ffff::101", 100)
    assert path.communities == ((64513, 100),) and path.large_communities == ((64513, 1, 1),) and path.best
    service = routes["2001:db8:ee::/128"]
    assert sorted(p.source for p in service.forwarding) == ["node1", "node2", "node3"]  # ECMP over every node
    assert sum(p.best for p in service.paths) == 1
    # IPv4 over the IPv6 sessions: the node's IPv6 address is the next hop (RFC 8950 extended next hop)
    four = routes["192.0.2.224/32"]
    assert sorted(p.next_hop for p in four.forwarding) == [f"2001:db8:ffff::10{i}" for i in (1, 2, 3)]


def test_a_leaving_nodes_path_is_learned_and_not_forwarded_over() -> None:
    service = by_prefix("fabric-routes-leaving.txt")["2001:db8:ee::/128"]
    leaving = [p for p in service.paths if p.leaving]
    assert [p.source for p in leaving] == ["node1"] and leaving[0].local_preference == 0
    assert sorted(p.source for p in service.forwarding) == ["node2", "node3"]
    doc = service.to_json()
    assert (
        doc["from"] == ["node2", "node3"]
        and "65535:0" in doc["paths"][[p["from"] for p in doc["paths"]].index("node1")]["communities"]
    )
    assert "leaving (graceful shutdown)" in routes_text([service])


def test_next_hops_get_node_names_and_garbage_is_ignored() -> None:
    (route,) = named(parse_routes((DATA / "fabric-routes.txt").read_text())[:1], {"2001:db8:ffff::101": "node1"})
    assert route.paths[0].next_hop == "node1 (2001:db8:ffff::101)"
    assert parse_routes("BIRD 2.0.12 ready.\nNetwork not found\n\tvia nowhere\n") == []
    assert route.prefix == ipaddress.ip_network("198.51.100.0/26")
