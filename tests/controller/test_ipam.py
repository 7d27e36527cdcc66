"""The pure LoadBalancer allocator: each rule by example, then invariants over random clusters (hypothesis)."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st

from flock.controller import LbService, Pool, Reason, plan
from flock.policy import LabelSelector

A = ipaddress.ip_address
N = ipaddress.ip_network


def svc(name: str, *families: int, **kw: object) -> LbService:
    return LbService("default", name, families or (4,), **kw)  # type: ignore[arg-type]


POOL = Pool("lab", (N("2001:db8:ee::/126"), N("192.0.2.224/30")))


def test_one_address_per_family_lowest_first() -> None:
    p = plan([POOL], [svc("a", 6, 4), svc("b", 4)])
    assert p.services["default/a"].addresses == (A("2001:db8:ee::"), A("192.0.2.224"))
    assert p.services["default/a"].condition.reason is Reason.ALLOCATED
    assert p.services["default/b"].addresses == (A("192.0.2.225"),)
    counts = p.pools["lab"].counts
    assert (counts[4].total, counts[4].used, counts[4].free) == (4, 2, 2)
    assert (counts[6].total, counts[6].used) == (4, 1)


def test_existing_allocation_kept_and_new_service_avoids_it() -> None:
    p = plan([POOL], [svc("z", 4, current=(A("192.0.2.224"),)), svc("a", 4)])
    assert p.services["default/z"].addresses == (A("192.0.2.224"),)
    assert p.services["default/a"].addresses == (A("192.0.2.225"),)


def test_exhausted() -> None:
    services = [svc(f"s{i}", 4) for i in range(5)]
    p = plan([POOL], services)
    assert p.services["default/s4"].addresses == ()
    assert p.services["default/s4"].condition.reason is Reason.POOL_EXHAUSTED
    assert p.services["default/s4"].condition.status == "False"


def test_requested_outside_every_pool_gets_a_condition_and_nothing() -> None:
    p = plan([POOL], [svc("a", 4, requested=(A("198.51.100.7"),))])
    assert p.services["default/a"].addresses == ()
    assert p.services["default/a"].condition.reason is Reason.NOT_IN_POOL
    assert any("default/a" in c for c in p.pools["lab"].conflicts)


def test_requested_inside_is_given_and_in_use_is_refused() -> None:
    p = plan([POOL], [svc("a", 4, requested=(A("192.0.2.226"),)), svc("b", 4, requested=(A("192.0.2.226"),))])
    assert p.services["default/a"].addresses == (A("192.0.2.226"),)
    assert p.services["default/b"].condition.reason is Reason.ADDRESS_IN_USE


def test_sharing_with_the_same_key_and_no_port_clash() -> None:
    web = svc("web", 4, sharing_key="k", ports=frozenset({("TCP", 80)}))
    dns = svc("dns", 4, sharing_key="k", ports=frozenset({("UDP", 53)}))
    clash = svc("web2", 4, sharing_key="k", ports=frozenset({("TCP", 80)}))
    p = plan([POOL], [web, dns, clash])
    assert p.services["default/dns"].addresses == p.services["default/web"].addresses
    assert p.services["default/web2"].addresses != p.services["default/web"].addresses


def test_selectors_disabled_and_overlapping_pools() -> None:
    only_blue = Pool("blue", (N("192.0.2.240/30"),), service_selector=LabelSelector((("color", "blue"),)))
    off = Pool("a-off", (N("192.0.2.232/30"),), disabled=True)
    overlap = Pool("z-overlap", (N("192.0.2.224/29"),))
    p = plan([POOL, only_blue, off, overlap], [svc("plain", 4), svc("b", 4, labels=(("color", "blue"),))])
    assert p.services["default/plain"].addresses == (A("192.0.2.224"),)
    assert p.services["default/b"].addresses == (A("192.0.2.240"),)  # blue < lab by name
    assert p.pools["z-overlap"].conflicts and not p.pools["z-overlap"].usable
    assert not p.pools["a-off"].usable
    assert p.services["default/plain"].addresses[0] not in N("192.0.2.232/30")


def test_no_pool_for_the_family() -> None:
    p = plan([Pool("v4", (N("192.0.2.224/30"),))], [svc("a", 6)])
    assert p.services["default/a"].condition.reason is Reason.NO_POOL


def test_from_object_reads_class_annotations_and_status() -> None:
    obj = {
        "metadata": {
            "namespace": "n",
            "name": "s",
            "annotations": {"metallb.universe.tf/loadBalancerIPs": "192.0.2.225"},
        },
        "spec": {"type": "LoadBalancer", "ipFamilies": ["IPv4"], "ports": [{"port": 80}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.225", "ipMode": "VIP"}]}},
    }
    s = LbService.from_object(obj)
    assert s is not None and s.requested == (A("192.0.2.225"),) and s.current == (A("192.0.2.225"),)
    assert s.ports == frozenset({("TCP", 80)})
    assert LbService.from_object({**obj, "spec": {**obj["spec"], "loadBalancerClass": "other"}}) is None
    assert LbService.from_object({**obj, "spec": {"type": "ClusterIP"}}) is None


# ---- invariants over random clusters ---------------------------------------------------------

_V4 = [N(f"192.0.2.{b}/30") for b in (224, 228, 232, 236)] + [N("192.0.2.224/29")]
_V6 = [N("2001:db8:ee::/126"), N("2001:db8:ee::4/126")]

pools_st = st.lists(
    st.builds(
        Pool,
        name=st.sampled_from(["a", "b", "c", "d"]),
        blocks=st.lists(st.sampled_from(_V4 + _V6), min_size=1, max_size=2, unique=True).map(tuple),
        service_selector=st.sampled_from([LabelSelector(), LabelSelector((("tier", "web"),))]),
        disabled=st.booleans(),
    ),
    max_size=3,
    unique_by=lambda p: p.name,
)
addresses_st = st.sampled_from(
    [A(f"192.0.2.{n}") for n in range(222, 242)] + [A(f"2001:db8:ee::{n}") for n in range(8)]
)
services_st = st.lists(
    st.builds(
        LbService,
        namespace=st.just("default"),
        name=st.sampled_from([f"s{i}" for i in range(10)]),
        families=st.sampled_from([(4,), (6,), (6, 4), (4, 6)]),
        ports=st.frozensets(st.sampled_from([("TCP", 80), ("TCP", 443), ("UDP", 53)]), min_size=1),
        labels=st.sampled_from([(), (("tier", "web"),)]),
        requested=st.lists(addresses_st, max_size=2, unique=True).map(tuple),
        sharing_key=st.sampled_from([None, "k"]),
        current=st.lists(addresses_st, max_size=2, unique=True).map(tuple),
    ),
    max_size=8,
    unique_by=lambda s: s.name,
)


@settings(max_examples=300, deadline=None)
@given(pools_st, services_st)
def test_invariants(pools: list[Pool], services: list[LbService]) -> None:
    p = plan(pools, services)
    assert p == plan(list(reversed(pools)), list(reversed(services)))  # deterministic, order-free
    usable = [pool for pool in pools if p.pools[pool.name].usable]
    by = {s.key: s for s in services}
    holders: dict[object, list[LbService]] = {}
    for key, allocation in p.services.items():
        s = by[key]
        assert len({a.version for a in allocation.addresses}) == len(allocation.addresses)  # one per family
        for address in allocation.addresses:
            assert address.version in s.families
            assert any(pool.holds(address) and pool.serves(s) for pool in usable)  # inside an allowed pool
            if s.requested:
                assert address in s.requested
            holders.setdefault(address, []).append(s)
    for sharers in holders.values():  # no duplicates except proper sharing
        if len(sharers) > 1:
            assert all(x.sharing_key == "k" for x in sharers)
            for i, x in enumerate(sharers):
                for y in sharers[i + 1 :]:
                    assert not (x.ports & y.ports)
    # Stable: a held address still allowed to the first claimant (by key) under a valid request is kept.
    for s in sorted(services, key=lambda s: s.key):
        for address in s.current:
            ok = (
                address.version in s.families
                and (not s.requested or address in s.requested)
                and len({a.version for a in s.requested}) == len(s.requested)  # else nothing: InvalidRequest
                and any(pool.holds(address) and pool.serves(s) for pool in usable)
                and not any(o.key < s.key and address in o.current for o in services)
                and sum(1 for a in s.current if a.version == address.version) == 1
            )
            if ok:
                assert address in p.services[s.key].addresses
    # Requested honoured when possible: a lone requester of an allowed address gets it.
    for s in services:
        if s.request_error is None and s.requested and p.services[s.key].condition.reason is Reason.ALLOCATED:
            assert set(p.services[s.key].addresses) == {a for a in s.requested if a.version in s.families}
    # Counts: used never exceeds total, and equals the addresses given inside the pool.
    for pool in usable:
        for family, count in p.pools[pool.name].counts.items():
            given_here = {a for a in holders if a.version == family and pool.holds(a)}  # type: ignore[attr-defined]
            assert count.used == len(given_here) <= count.total


def test_external_ips_outside_every_pool_get_a_condition() -> None:
    from flock.controller._ipam import ExternalIps, external_ip_conditions

    public = Pool("public", (N("198.51.100.0/26"),), service_selector=LabelSelector((("tier", "public"),)))
    raw = {"metadata": {"namespace": "shop", "name": "web", "labels": {"tier": "public"}}, "spec": {}}
    assert ExternalIps.from_object(raw) is None  # no externalIPs: no condition either
    raw["spec"]["externalIPs"] = ["198.51.100.7", "203.0.113.7"]
    mixed = ExternalIps.from_object(raw)
    inside = ExternalIps("shop", "in", (A("198.51.100.8"),), labels=(("tier", "public"),))
    unlabelled = ExternalIps("shop", "plain", (A("198.51.100.9"),))
    hostile = ExternalIps.from_object({"metadata": {"name": "x"}, "spec": {"externalIPs": ["not-an-ip" * 40]}})
    assert mixed is not None and hostile is not None
    found = external_ip_conditions([public, POOL], [mixed, inside, unlabelled, hostile])
    assert found["shop/web"].reason is Reason.NOT_IN_POOL and found["shop/web"].status == "False"
    assert "203.0.113.7" in found["shop/web"].message and "198.51.100.7" not in found["shop/web"].message
    assert (found["shop/in"].reason, found["shop/in"].status) == (Reason.IN_POOL, "True")
    assert found["shop/plain"].reason is Reason.NOT_IN_POOL  # in a pool it may not use (its selector)
    assert found["/x"].reason is Reason.INVALID_REQUEST and len(found["/x"].message) < 120  # bounded


def test_pools_status_names_every_address_outside_every_pool() -> None:
    from flock.controller._ipam import ExternalIps

    many = ExternalIps("shop", "many", tuple(A(f"203.0.113.{i}") for i in range(1, 11)))
    inside = ExternalIps("shop", "in", (A("192.0.2.225"),))
    pinned = svc("pinned", 4, requested=(A("198.51.100.7"),))
    result = plan([POOL], [pinned], [many, inside])
    assert set(result.external) == {"shop/many", "shop/in"}
    assert result.external["shop/in"].reason is Reason.IN_POOL
    assert result.pools["lab"].conflicts == (
        "Service default/pinned: requested 198.51.100.7 outside every pool it may use",
        "Service shop/many: externalIP 203.0.113.1, externalIP 203.0.113.2, externalIP 203.0.113.3, "
        "externalIP 203.0.113.4 and 6 more outside every pool it may use",
    )
    assert plan([POOL], [], [inside]).pools["lab"].conflicts == ()


def test_conflict_messages_are_bounded_by_whole_lines() -> None:
    from flock.controller._reconcile import MESSAGE_LIMIT, bounded

    assert bounded([]) == "" and bounded(["a", "b"]) == "a; b"
    lines = [f"Service default/s{i}: requested 203.0.113.{i} outside every pool it may use" for i in range(100)]
    text = bounded(lines)
    assert len(text) <= MESSAGE_LIMIT and text.endswith("; and 87 more") and lines[12] in text
    assert len(bounded(["z" * 5000, "b"])) <= MESSAGE_LIMIT


def test_a_service_that_does_not_parse_gets_a_condition_not_a_crash() -> None:
    def lb(spec: dict[str, object], annotations: dict[str, str] | None = None) -> LbService:
        raw = {"metadata": {"name": "odd", "namespace": "shop", "annotations": annotations or {}}, "spec": spec}
        found = LbService.from_object({**raw, "spec": {"type": "LoadBalancer", **spec}})
        assert found is not None
        return found

    for bad in ({"ports": [{"port": "http"}]}, {"ports": [{"protocol": "TCP"}]}, {"ports": ["80"]}):
        odd = lb(bad)
        assert odd.request_error is not None and odd.request_error.startswith("spec.ports does not parse")
        assert plan([POOL], [odd]).services["shop/odd"].condition.reason is Reason.INVALID_REQUEST
    huge = lb({}, {"flock.fritzlab.net/loadBalancerIPs": "x" * 100_000})
    assert huge.request_error is not None and len(huge.request_error) < 300
