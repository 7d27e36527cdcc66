import ipaddress
import logging
import random

import pytest

from flock.ipam import (
    AddressConflict,
    Addresses,
    AnnotationError,
    Ipam,
    PoolExhausted,
    fnv1a_64,
)
from flock.model import Allocation
from flock.pods import ADDRESS_EXHAUSTED, cni_error
from flock.testing.ipam import P, node, pod, replica

A = ipaddress.ip_address
ALGO = "namespace:16,app:16,random:32"


def ipam(seed=1, **kw) -> Ipam:
    return Ipam(node(**kw), random.Random(seed))


def ident(addr, prefixlen=64):
    return int(addr) & ((1 << (128 - prefixlen)) - 1)


def test_random_v6_and_lowest_v4():
    im = ipam()
    first = im.allocate("c1", pod("a"))
    second = im.allocate("c2", pod("b"))
    assert first.ip6 in ipaddress.ip_network("2001:db8:0:1::/64") and first.ip6 != second.ip6
    assert (first.ip4, second.ip4) == (A("198.51.100.2"), A("198.51.100.3"))


def test_allocate_is_idempotent_per_container():
    im = ipam()
    assert im.allocate("c1", pod("a")) == im.allocate("c1", pod("a"))
    assert im.allocator.in_use() == 2


def test_ip_algo_replicas_share_app_bits_and_namespaces_differ():
    im = ipam(ip_algo=ALGO)
    one = im.allocate("c1", replica("web-7d9c5b8f6d-aaaaa"))
    two = im.allocate("c2", replica("web-7d9c5b8f6d-bbbbb"))
    rolled = im.allocate("c3", replica("web-5b8f6d7d9c-ccccc", rs="web-5b8f6d7d9c", template_hash="5b8f6d7d9c"))
    other_ns = im.allocate("c4", replica("web-7d9c5b8f6d-aaaaa", namespace="staging"))
    top = lambda a: ident(a.ip6) >> 32  # noqa: E731 - namespace and app bits
    assert top(one) == top(two) == top(rolled)
    assert top(one) == ((fnv1a_64("prod") & 0xFFFF) << 16) | (fnv1a_64("web") & 0xFFFF)
    assert top(other_ns) >> 16 == fnv1a_64("staging") & 0xFFFF
    assert top(other_ns) & 0xFFFF == top(one) & 0xFFFF
    assert len({one.ip6, two.ip6, rolled.ip6}) == 3


def test_ip_algo_is_deterministic_for_a_seed():
    a = ipam(seed=5, ip_algo=ALGO).allocate("c1", replica("web-7d9c5b8f6d-aaaaa"))
    b = ipam(seed=5, ip_algo=ALGO).allocate("c1", replica("web-7d9c5b8f6d-aaaaa"))
    assert a == b


def test_collision_redraws_the_random_part():
    p = replica("web-7d9c5b8f6d-aaaaa")
    wanted = ipam(seed=9, ip_algo=ALGO).allocate("probe", p).ip6
    im = ipam(seed=9, ip_algo=ALGO)
    im.mark_in_use("squatter", Addresses(ip6=wanted))
    got = im.allocate("c1", p).ip6
    assert got != wanted
    assert ident(got) >> 32 == ident(wanted) >> 32


def test_collision_increments_n_then_exhausts_naming_the_cidr():
    im = ipam(ip_algo="namespace:16,app:16,pod:24,n:8")  # every host bit fixed but n
    got = [im.allocate(f"c{i}", pod("same")).ip6 for i in range(16)]
    assert [ident(a) & 0xFF for a in got] == list(range(16))
    with pytest.raises(PoolExhausted) as info:
        im.allocate("c16", pod("same"))
    assert cni_error(info.value).code == ADDRESS_EXHAUSTED  # the CNI table's choice
    assert "2001:db8:0:1::/64" in str(info.value)
    assert "collided 16 times" in info.value.details
    assert im.allocator.held("c16") is None


def test_all_zero_identifier_is_skipped():
    im = ipam(ip_algo="n:8")
    got = im.allocate("c1", pod("a", annotations={"cidr6": "2001:db8:0:1:ff::/120"})).ip6
    assert got == A("2001:db8:0:1:ff::1")


def test_random_v6_small_range_finds_the_last_free_identifier_then_exhausts():
    im = ipam(ipv4=False)
    ask = pod("a", annotations={"cidr6": "2001:db8:0:1:ff::/126"})
    got = {im.allocate(f"c{i}", ask).ip6 for i in range(3)}
    assert got == {A("2001:db8:0:1:ff::1"), A("2001:db8:0:1:ff::2"), A("2001:db8:0:1:ff::3")}
    with pytest.raises(PoolExhausted, match=r"2001:db8:0:1:ff::/126"):
        im.allocate("c3", ask)


def test_v4_skips_network_first_host_and_broadcast_and_exhausts():
    im = ipam(cidr4="198.51.100.0/28")
    got = [im.allocate(f"c{i}", pod(f"p{i}")).ip4 for i in range(13)]
    assert got == [A(f"198.51.100.{i}") for i in range(2, 15)]
    with pytest.raises(PoolExhausted) as info:
        im.allocate("c13", pod("p13"))
    assert "198.51.100.0/28" in info.value.msg
    assert cni_error(info.value).code == ADDRESS_EXHAUSTED  # the CNI table's choice


def test_v4_slash30_has_one_address():
    im = ipam()
    ask = pod("a", annotations={"cidr4": "198.51.100.4/30"})
    assert im.allocate("c1", ask).ip4 == A("198.51.100.6")
    with pytest.raises(PoolExhausted, match=r"198\.51\.100\.4/30"):
        im.allocate("c2", ask)


def test_v4_subrange_and_node_pool_never_collide():
    im = ipam(cidr4="198.51.100.0/29")
    sub = pod("s", annotations={"cidr4": "198.51.100.0/30"})
    assert im.allocate("sub", sub).ip4 == A("198.51.100.2")
    assert [im.allocate(f"c{i}", pod(f"p{i}")).ip4 for i in range(4)] == [A(f"198.51.100.{i}") for i in range(3, 7)]


def test_release_then_reallocate_returns_the_lowest_again():
    im = ipam()
    for i in range(5):
        im.allocate(f"c{i}", pod(f"p{i}"))
    freed = im.release("c1")
    assert freed.ip4 == A("198.51.100.3") and im.allocator.holder(freed.ip6) is None
    assert im.release("c1") is None
    assert im.allocate("c9", pod("p9")).ip4 == A("198.51.100.3")
    assert im.allocate("c10", pod("p10")).ip4 == A("198.51.100.7")
    # a released v6 address can be taken again, here as a fixed address
    taken = im.allocate("c11", pod("p11", annotations={"addresses": str(freed.ip6)}))
    assert taken.addresses == (freed.ip6,)


def test_dual_stack_is_all_or_nothing():
    im = ipam()
    full = pod("a", annotations={"cidr4": "198.51.100.4/30"})
    im.allocate("c1", full)
    before = im.allocator.in_use()
    with pytest.raises(PoolExhausted):
        im.allocate(
            "c2",
            pod(
                "b",
                annotations={"cidr4": "198.51.100.4/30", "addresses": "2001:db8:0:1::99", "anycast": "203.0.113.53"},
            ),
        )
    assert im.allocator.in_use() == before
    assert im.allocator.held("c2") is None
    # the fixed address and the anycast were given back too
    assert im.allocate("c3", pod("c", annotations={"addresses": "2001:db8:0:1::99"})).addresses == (
        A("2001:db8:0:1::99"),
    )
    assert im.allocate("c4", pod("d", annotations={"addresses": "203.0.113.53"})).addresses == (A("203.0.113.53"),)


def test_fixed_addresses_are_reserved_from_the_lowest_free_path():
    im = ipam()
    im.allocate("fixed", pod("f", annotations={"ipv4": "false", "addresses": "198.51.100.2,198.51.100.3"}))
    assert im.allocate("c1", pod("a")).ip4 == A("198.51.100.4")


def test_fixed_address_held_by_another_pod_is_an_error():
    im = ipam()
    im.allocate("c1", pod("a", annotations={"addresses": "2001:db8:0:1::80"}))
    with pytest.raises(AnnotationError) as info:
        im.allocate("c2", pod("b", annotations={"addresses": "2001:db8:0:1::80"}))
    assert info.value.annotation == P + "addresses"
    assert info.value.value == "2001:db8:0:1::80"
    assert "held by container c1" in info.value.details


def test_anycast_is_shared_but_not_with_an_exclusive_holder():
    im = ipam()
    im.allocate("c1", pod("a", annotations={"anycast": "2001:db8:ffff::53"}))
    im.allocate("c2", pod("b", annotations={"anycast": "2001:db8:ffff::53"}))
    with pytest.raises(AnnotationError) as info:
        im.allocate("c3", pod("c", annotations={"addresses": "2001:db8:ffff::53"}))
    assert info.value.annotation == P + "addresses"
    im.allocate("c4", pod("d", annotations={"addresses": "203.0.113.80"}))
    with pytest.raises(AnnotationError) as info:
        im.allocate("c5", pod("e", annotations={"anycast": "203.0.113.80"}))
    assert info.value.annotation == P + "anycast" and "c4" in info.value.details
    im.release("c1")
    im.release("c2")
    assert im.allocate("c6", pod("f", annotations={"addresses": "2001:db8:ffff::53"})).addresses


def test_mark_in_use_seeds_and_rejects_conflicting_rows():
    im = ipam()
    row = Allocation(
        "old",
        "prod",
        "web-0",
        "uid",
        "eth0",
        "/var/run/netns/x",
        ip6=A("2001:db8:0:1::5"),
        ip4=A("198.51.100.2"),
        anycast=(A("203.0.113.1"),),
    )
    im.mark_in_use("old", Addresses.of(row))
    assert im.allocator.held("old") == Addresses(ip6=row.ip6, ip4=row.ip4, anycast=row.anycast)
    assert im.allocator.holder(A("2001:db8:0:1::5")) == "old"
    assert im.allocate("c1", pod("a")).ip4 == A("198.51.100.3")
    with pytest.raises(AddressConflict) as info:
        im.mark_in_use("dup", Addresses(ip6=A("2001:db8:0:1::6"), ip4=A("198.51.100.2")))
    assert "198.51.100.2" in info.value.details and "old" in info.value.details
    assert im.allocator.holder(A("2001:db8:0:1::6")) is None  # nothing of the bad row stays
    im.release("old")
    assert im.allocate("c2", pod("b")).ip4 == A("198.51.100.2")


def test_invalid_node_ip_algo_is_ignored_and_kept_as_the_problem_without_logging(caplog):
    caplog.set_level(logging.DEBUG)
    im = ipam(ip_algo="namespace:16")
    assert im.default_layout is None
    assert im.layout_problem.value == "namespace:16" and "no room for uniqueness" in im.layout_problem.reason
    assert im.allocate("c1", pod("a")).ip6 is not None
    im.set_node(node(ip_algo="random:72"))  # valid syntax, too wide for the /64
    assert im.default_layout is None
    assert "has 64 host bits" in im.layout_problem.reason
    assert caplog.records == []  # the IPAM is pure: the pod handler reports the problem
    im.set_node(node(ip_algo=ALGO))
    assert im.default_layout.text == ALGO and im.layout_problem is None
    # a pod-level ip-algo that is invalid is an error, not a warning
    with pytest.raises(AnnotationError):
        im.allocate("c2", pod("b", annotations={"ip-algo": "namespace:16"}))


def test_set_node_with_a_new_block_keeps_holdings():
    im = ipam(cidr4="198.51.100.0/28")
    kept = im.allocate("c1", pod("a"))
    im.set_node(node(cidr4="198.51.100.0/24"))
    assert im.allocator.holder(kept.ip4) == "c1"
    assert im.allocate("c2", pod("b")).ip4 == A("198.51.100.3")


def test_layout_places_each_named_field_from_the_top_down():
    im = ipam(ip_algo="image:8,node:8,pod:8,n:8")
    got = im.allocate("c1", pod("web-0", annotations={"cidr6": "2001:db8:0:1::/96"}, image="nginx:1")).ip6
    low = lambda s: fnv1a_64(s) & 0xFF  # noqa: E731
    assert ident(got, 96) == (low("nginx:1") << 24) | (low("host001") << 16) | (low("web-0") << 8) | 0


def test_full_blocks_reports_exhausted_default_families():
    im = ipam(cidr6="2001:db8:0:1::/120", cidr4="198.51.100.0/29")
    assert im.full_blocks() == ()
    for i in range(5):  # .2 … .6
        im.allocate(f"c{i}", pod(f"p{i}"))
    assert im.full_blocks() == (ipaddress.ip_network("198.51.100.0/29"),)
    im.release("c2")
    assert im.full_blocks() == ()
    assert im.allocate("again", pod("again")).ip4 == A("198.51.100.4")  # peeking took nothing
    for i in range(5, 255):
        im.allocate(f"v6-{i}", pod(f"q{i}", annotations={"ipv4": "false"}))
    assert im.full_blocks() == (ipaddress.ip_network("2001:db8:0:1::/120"), ipaddress.ip_network("198.51.100.0/29"))
