"""Endpoint choice, table tests after kube-proxy's pkg/proxy/topology_test.go (TestCategorizeEndpoints, no hints)."""

from __future__ import annotations

import ipaddress

import pytest

from flock.services import Backend, EndpointSlice, Family, PortPolicy, Service, backends, categorize
from flock.testing import services as objects


def ep(n: int, *, ready: bool = True, serving: bool | None = None, terminating: bool = False, local: bool = False):
    return Backend(
        ipaddress.ip_address(f"2001:db8:10::{n}"),
        80,
        ready=ready,
        serving=ready if serving is None else serving,
        terminating=terminating,
        local=local,
    )


CLUSTER = PortPolicy(externally_accessible=False, external_local=False, internal_local=False)
ITP_LOCAL = PortPolicy(externally_accessible=False, external_local=False, internal_local=True)
ETP_LOCAL = PortPolicy(externally_accessible=True, external_local=True, internal_local=False)
BOTH_LOCAL = PortPolicy(externally_accessible=True, external_local=True, internal_local=True)

R1, R2 = ep(1), ep(2)
L3, L4 = ep(3, local=True), ep(4, local=True)
T1 = ep(1, ready=False, serving=True, terminating=True)
T3 = ep(3, ready=False, serving=True, terminating=True, local=True)
NS3 = ep(3, ready=False, serving=False, terminating=True, local=True)  # terminating, not serving
U2 = ep(2, ready=False)

CASES = [
    # name, policy, endpoints, cluster, local, has_any
    ("no endpoints", CLUSTER, (), (), (), False),
    ("cluster: ready ones", CLUSTER, (R1, R2, U2), (R1, R2), (), True),
    ("cluster: unready only", CLUSTER, (U2,), (), (), False),
    ("cluster: serving-terminating when none ready", CLUSTER, (T1, U2), (T1,), (), True),
    ("cluster: ready wins over serving-terminating", CLUSTER, (T1, R2), (R2,), (), True),
    ("cluster: terminating and not serving is unusable", CLUSTER, (NS3,), (), (), False),
    ("iTP Local: local ready only", ITP_LOCAL, (R1, L3, L4), (), (L3, L4), True),
    ("iTP Local: no local endpoints, some remote", ITP_LOCAL, (R1, R2), (), (), True),
    ("iTP Local: local serving-terminating fallback", ITP_LOCAL, (R1, T3), (), (T3,), True),
    ("iTP Local: remote serving-terminating counts as any", ITP_LOCAL, (T1,), (), (), True),
    ("eTP Local: cluster and local both", ETP_LOCAL, (R1, L3), (R1, L3), (L3,), True),
    ("eTP Local: no local endpoint", ETP_LOCAL, (R1, R2), (R1, R2), (), True),
    ("eTP Local: local terminating, remote ready", ETP_LOCAL, (R1, T3), (R1,), (T3,), True),
    ("both Local: cluster still used for short circuit", BOTH_LOCAL, (R1, L3), (R1, L3), (L3,), True),
    ("both Local: nothing usable", BOTH_LOCAL, (U2, NS3), (), (), False),
]


@pytest.mark.parametrize(
    ("policy", "endpoints", "cluster", "local", "has_any"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_categorize(policy, endpoints, cluster, local, has_any) -> None:
    got = categorize(endpoints, policy)
    assert (got.cluster, got.local, got.has_any) == (cluster, local, has_any)
    assert set(got.reachable) == set(cluster) | set(local)


def test_policy_predicates() -> None:
    assert CLUSTER.uses_cluster and not CLUSTER.uses_local
    assert not ITP_LOCAL.uses_cluster and ITP_LOCAL.uses_local
    assert ETP_LOCAL.uses_cluster and ETP_LOCAL.uses_local
    assert BOTH_LOCAL.uses_cluster and BOTH_LOCAL.uses_local


def _service() -> Service:
    return Service.from_object(
        objects.service(
            "web", ["fd00:96::10"], [objects.port("http", 80, target=8080), objects.port("dns", 53, protocol="UDP")]
        )
    )


def test_backends_merge_slices_match_ports_by_name_and_dedupe() -> None:
    svc = _service()
    http = svc.ports[0]
    ports = [objects.slice_port("http", 8080), objects.slice_port("dns", 5353, "UDP")]
    s1 = objects.endpoint_slice(
        "web",
        [objects.endpoint("2001:db8:10::2", "n1", ready=False), objects.endpoint("2001:db8:10::1", "n2")],
        ports,
        name="web-1",
    )
    s2 = objects.endpoint_slice("web", [objects.endpoint("2001:db8:10::2", "n1")], ports, name="web-2")
    other = objects.endpoint_slice("api", [objects.endpoint("2001:db8:10::9")], ports, name="api-1")
    v4 = objects.endpoint_slice("web", [objects.endpoint("192.0.2.1")], ports, name="web-4")
    slices = [EndpointSlice.from_object(s) for s in (s2, s1, other, v4)]
    got = backends(svc, http, Family.IPV6, slices, "n1")
    assert [(str(b.address), b.port, b.ready, b.local) for b in got] == [
        ("2001:db8:10::1", 8080, True, False),
        ("2001:db8:10::2", 8080, True, True),  # the ready copy wins over web-1's unready one
    ]
    dns = backends(svc, svc.ports[1], Family.IPV6, slices, "n1")
    assert {b.port for b in dns} == {5353}
    assert [str(b.address) for b in backends(svc, http, Family.IPV4, slices, "n1")] == ["192.0.2.1"]
