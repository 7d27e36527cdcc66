"""Per-chain counters → per Service port: one series per port whatever its families and endpoints."""

from __future__ import annotations

from flock.services import EndpointSlice, Service, ServicePortCounts, compile_table, service_connections
from flock.testing import services as objects

from .test_compile import CONFIG, NODE


def test_counters_add_up_per_service_port_over_families_and_entry_chains() -> None:
    svc = Service.from_object(
        objects.service(
            "web",
            ["fd00:96::1", "203.0.113.1"],
            [objects.port("http", 80, target=8080, node_port=30080), objects.port("dns", 53, protocol="UDP")],
            type="NodePort",
            etp="Local",
        )
    )
    ports = [objects.slice_port("http", 8080), objects.slice_port("dns", 5353, "UDP")]
    slices = [
        EndpointSlice.from_object(
            objects.endpoint_slice(
                "web", [objects.endpoint("2001:db8:10::1"), objects.endpoint("2001:db8:10::2", "node-b")], ports
            )
        ),
        EndpointSlice.from_object(objects.endpoint_slice("web", [objects.endpoint("192.0.2.1", "node-b")], ports)),
    ]
    idle = Service.from_object(objects.service("idle", ["fd00:96::2"], [objects.port()]))
    table = compile_table([svc, idle], slices, NODE, CONFIG)
    kinds = {(c.service, c.port, c.kind, chain.split("-")[0]) for chain, c in table.counted.items()}
    assert kinds == {
        ("web", "http", "connections", "svc6"),  # pods and the node: the cluster endpoints
        ("web", "http", "connections", "loc6"),  # eTP Local: this node's endpoints
        ("web", "http", "connections", "svc4"),
        ("web", "http", "rejected", "rej4"),  # no IPv4 endpoint on this node: external traffic dropped
        ("web", "dns", "connections", "svc6"),
        ("web", "dns", "connections", "svc4"),
        ("idle", "80", "rejected", "rej6"),  # an unnamed port goes by its number
    }
    per_chain = {chain: (10 + i, 1000) for i, chain in enumerate(sorted(table.counted))}
    per_chain["services"] = (99, 0)  # the skeleton's chains are nobody's
    totals = service_connections(per_chain, table.counted)
    expected: dict[tuple[str, str, str], list[int]] = {}
    for chain, c in table.counted.items():
        figures = expected.setdefault((c.namespace, c.service, c.port), [0, 0])
        figures[c.kind == "rejected"] += per_chain[chain][0]
    assert totals == {k: ServicePortCounts(*v) for k, v in expected.items()}
    assert list(totals) == sorted(totals)
    # a chain the kernel has no figure for yet (just added) counts zero; its port is still listed
    assert service_connections({}, table.counted)[("default", "idle", "80")] == ServicePortCounts(0, 0)
