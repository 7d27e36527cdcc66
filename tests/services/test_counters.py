"""Per-element counters → per Service port: one series per port whatever its families, addresses and endpoints."""

from __future__ import annotations

from flock.services import EndpointSlice, Service, ServicePortCounts, compile_table, decode_key, service_connections
from flock.testing import services as objects

from .test_compile import CONFIG, NODE


def test_counters_add_up_per_service_port_over_families_and_addresses() -> None:
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
    kinds = {(c.service, c.port, c.kind, name) for (name, _), c in table.counted.items()}
    assert kinds == {
        ("web", "http", "connections", "service-ips6"),  # the ClusterIP
        ("web", "http", "connections", "service-nodeports6"),  # eTP Local: this node has an IPv6 endpoint
        ("web", "http", "connections", "service-ips4"),
        ("web", "http", "connections", "service-nodeports4"),  # pods and the node still reach the IPv4 one
        ("web", "http", "rejected", "no-endpoint-nodeports4"),  # no IPv4 endpoint on this node: others dropped
        ("web", "dns", "connections", "service-ips6"),
        ("web", "dns", "connections", "service-ips4"),
        ("idle", "80", "rejected", "no-endpoint-services6"),  # an unnamed port goes by its number
    }
    per_element = {element: (10 + i, 1000) for i, element in enumerate(sorted(table.counted))}
    per_element[("service-ips6", "fd00:96::99 . tcp . 80")] = (99, 0)  # an element nobody counts
    totals = service_connections(per_element, table.counted)
    expected: dict[tuple[str, str, str], list[int]] = {}
    for element, c in table.counted.items():
        figures = expected.setdefault((c.namespace, c.service, c.port), [0, 0])
        figures[c.kind == "rejected"] += per_element[element][0]
    assert totals == {k: ServicePortCounts(*v) for k, v in expected.items()}
    assert list(totals) == sorted(totals)
    # an element the kernel has no figure for yet (just added) counts zero; its port is still listed
    assert service_connections({}, table.counted)[("default", "idle", "80")] == ServicePortCounts(0, 0)


def test_kernel_keys_decode_to_the_text_the_table_writes() -> None:
    v6 = bytes.fromhex("fd000096000000000000000000000010") + bytes([6, 0, 0, 0]) + (80).to_bytes(2, "big") + b"\0\0"
    assert decode_key(v6) == "fd00:96::10 . tcp . 80"
    v4 = bytes([203, 0, 113, 1, 17, 0, 0, 0]) + (53).to_bytes(2, "big") + b"\0\0"
    assert decode_key(v4) == "203.0.113.1 . udp . 53"
    assert decode_key(bytes([132, 0, 0, 0]) + (30080).to_bytes(2, "big") + b"\0\0") == "sctp . 30080"
    assert decode_key(bytes([1, 0, 0, 0, 0, 80, 0, 0])) is None  # ICMP: not a protocol a Service has
    assert decode_key(b"\0" * 5) is None
