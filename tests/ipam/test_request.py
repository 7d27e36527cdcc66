import ipaddress

import pytest

from flock.ipam import AnnotationError, PodRequest, parse_request
from flock.pods import cni_error
from flock.testing.ipam import P, node

N = ipaddress.ip_network
BOTH = node()


def req(annotations, nc=BOTH, layout=None) -> PodRequest:
    return parse_request({P + k: v for k, v in annotations.items()}, nc, layout)


def test_family_defaults_come_from_the_nodeconfig():
    r = req({})
    assert (r.cidr6, r.cidr4) == (N("2001:db8:0:1::/64"), N("198.51.100.0/24"))
    only6 = req({}, node(ipv4=False))
    assert (only6.cidr6, only6.cidr4) == (N("2001:db8:0:1::/64"), None)
    asked4 = req({"ipv4": "true", "ipv6": "False"}, node(ipv4=False))
    assert (asked4.cidr6, asked4.cidr4) == (None, N("198.51.100.0/24"))


@pytest.mark.parametrize(
    "key, value, effective",
    [
        ("cidr6", "2001:db8:0:1::/64", "2001:db8:0:1::/64"),  # equal → node block
        ("cidr6", "2001:db8::/48", "2001:db8:0:1::/64"),  # supernet → node block
        ("cidr6", "2001:db8:0:1:abcd::/80", "2001:db8:0:1:abcd::/80"),  # subnet → itself
        (
            "cidr6",
            "2001:db8:0:2::/64,2001:db8:0:1:1::/80,2001:db8:0:1:2::/80",
            "2001:db8:0:1:1::/80",
        ),  # first intersecting
        ("cidr6", "2001:db8:0:2::/64,2001:db8::/32", "2001:db8:0:1::/64"),
        ("cidr4", "198.51.100.0/24", "198.51.100.0/24"),
        ("cidr4", "198.51.0.0/16", "198.51.100.0/24"),
        ("cidr4", "198.51.100.64/26", "198.51.100.64/26"),
        ("cidr4", "203.0.113.0/24, 198.51.100.4/30", "198.51.100.4/30"),
    ],
)
def test_intersection_matrix(key, value, effective):
    r = req({key: value})
    assert getattr(r, key) == N(effective)


def test_ip_algo_pod_beats_node_and_node_applies_otherwise():
    from flock.ipam import parse_layout

    node_layout = parse_layout("namespace:16,random:48")
    assert req({}, layout=node_layout).layout == node_layout
    assert req({"ip-algo": "app:8,n:8"}, layout=node_layout).layout.text == "app:8,n:8"


def test_anycast_and_addresses_parse_in_order():
    r = req({"anycast": "2001:db8:ffff::53, 203.0.113.53", "addresses": "2001:db8:0:1::80"})
    assert r.anycast == (ipaddress.ip_address("2001:db8:ffff::53"), ipaddress.ip_address("203.0.113.53"))
    assert r.addresses == (ipaddress.ip_address("2001:db8:0:1::80"),)
    # Without an IPv6 address of its own, a fixed IPv6 address can carry the pod's IPv6 anycast.
    v4_pod = req({"ipv6": "false", "anycast": "2001:db8:0:1::53", "addresses": "2001:db8:0:1::80"})
    assert v4_pod.cidr6 is None and v4_pod.anycast == (ipaddress.ip_address("2001:db8:0:1::53"),)


NO_V4 = node(cidr4=None, ipv4=False)


@pytest.mark.parametrize(
    "annotations, nc, key, value, words",
    [
        ({"ipv6": "yes"}, BOTH, "ipv6", "yes", '"true" or "false"'),
        ({"ipv4": "1"}, BOTH, "ipv4", "1", '"true" or "false"'),
        ({"ipv6": "false", "ipv4": "false"}, BOTH, "ipv6", "false", "at least one family"),
        ({"ipv6": "false"}, NO_V4, "ipv6", "false", "at least one family"),
        ({"ipv4": "true"}, NO_V4, "ipv4", "true", "no spec.cidr4"),
        ({"cidr6": "not-a-cidr"}, BOTH, "cidr6", "not-a-cidr", "is not a CIDR"),
        ({"cidr6": "2001:db8:0:1::1/64"}, BOTH, "cidr6", "2001:db8:0:1::1/64", "zero host bits"),
        ({"cidr6": "198.51.100.0/24"}, BOTH, "cidr6", "198.51.100.0/24", "is IPv4"),
        ({"cidr4": "2001:db8::/64"}, BOTH, "cidr4", "2001:db8::/64", "is IPv6"),
        ({"cidr4": "198.51.100.8/31"}, BOTH, "cidr4", "198.51.100.8/31", "/31 and /32"),
        ({"cidr4": "198.51.100.8/32"}, BOTH, "cidr4", "198.51.100.8/32", "/31 and /32"),
        ({"cidr6": "2001:db8:0:1::5/128"}, BOTH, "cidr6", "2001:db8:0:1::5/128", "/128"),
        (
            {"cidr6": "2001:db8:0:2::/64"},
            BOTH,
            "cidr6",
            "2001:db8:0:2::/64",
            "overlaps this node's block 2001:db8:0:1::/64",
        ),
        ({"cidr4": "203.0.113.0/24"}, BOTH, "cidr4", "203.0.113.0/24", "overlaps this node's block 198.51.100.0/24"),
        ({"cidr6": "2001:db8::/48,2001:db8::/48"}, BOTH, "cidr6", "2001:db8::/48,2001:db8::/48", "appears twice"),
        ({"cidr6": "2001:db8::/48,"}, BOTH, "cidr6", "2001:db8::/48,", "without empty items"),
        ({"cidr4": "198.51.100.0/24"}, NO_V4, "cidr4", "198.51.100.0/24", "IPv4 is off"),
        ({"ipv6": "false", "cidr6": "2001:db8::/48"}, BOTH, "cidr6", "2001:db8::/48", "IPv6 is off"),
        ({"ip-algo": "namespace:16,app:16"}, BOTH, "ip-algo", "namespace:16,app:16", "no room for uniqueness"),
        ({"ip-algo": "colour:8,random:8"}, BOTH, "ip-algo", "colour:8,random:8", "unknown field 'colour'"),
        ({"ip-algo": "namespace:x,random:8"}, BOTH, "ip-algo", "namespace:x,random:8", "not a positive integer"),
        ({"ip-algo": "namespace:65,random:8"}, BOTH, "ip-algo", "namespace:65,random:8", "outside 1..64"),
        ({"ip-algo": "namespace,random:8"}, BOTH, "ip-algo", "namespace,random:8", "is not field:bits"),
        ({"ip-algo": "random:8,random:8"}, BOTH, "ip-algo", "random:8,random:8", "appears twice"),
        ({"ip-algo": ""}, BOTH, "ip-algo", "", "comma-separated list"),
        ({"ip-algo": "random:72"}, BOTH, "ip-algo", "random:72", "needs 72 bits but 2001:db8:0:1::/64 has 64"),
        ({"anycast": "nope"}, BOTH, "anycast", "nope", "'nope' is not an IP address"),
        ({"anycast": "203.0.113.9,203.0.113.9"}, BOTH, "anycast", "203.0.113.9,203.0.113.9", "appears twice"),
        ({"addresses": "ff02::1"}, BOTH, "addresses", "ff02::1", "not a unicast address"),
        (
            {"addresses": "2001:db8:0:1::"},
            BOTH,
            "addresses",
            "2001:db8:0:1::",
            "subnet-router anycast address of this node's block 2001:db8:0:1::/64",
        ),
        (
            {"anycast": "198.51.100.0"},
            BOTH,
            "anycast",
            "198.51.100.0",
            "network address of this node's block 198.51.100.0/24",
        ),
        ({"addresses": "198.51.100.255"}, BOTH, "addresses", "198.51.100.255", "broadcast address"),
        ({"addresses": "203.0.113.7", "anycast": "203.0.113.7"}, BOTH, "addresses", "203.0.113.7", "also in"),
        # The IPv6 anycast route's gateway is one of the pod's own IPv6 addresses (found by the agent fuzz).
        (
            {"ipv6": "false", "anycast": "203.0.113.9,2001:db8:0:1::53"},
            BOTH,
            "anycast",
            "203.0.113.9,2001:db8:0:1::53",
            "'2001:db8:0:1::53' is IPv6 but the pod has no IPv6 address of its own",
        ),
    ],
)
def test_each_annotation_error_names_key_and_value(annotations, nc, key, value, words):
    with pytest.raises(AnnotationError) as info:
        req(annotations, nc)
    err = info.value
    assert cni_error(err).code == 7
    assert err.annotation == P + key
    assert err.value == value
    assert f"{P + key}={value!r}" in err.details
    assert words in err.details
    assert cni_error(err).to_dict()["details"] == err.details


def test_node_layout_too_wide_for_a_pod_subrange_names_cidr6():
    from flock.ipam import parse_layout

    wide = parse_layout("namespace:16,app:16,random:32")
    with pytest.raises(AnnotationError) as info:
        req({"cidr6": "2001:db8:0:1:abcd::/80"}, layout=wide)
    assert info.value.annotation == P + "cidr6"
    assert info.value.value == "2001:db8:0:1:abcd::/80"
    assert "has 48 host bits" in info.value.details


PEERED = node(
    bgp={
        "asn": 64512,
        "routerID": "203.0.113.11",
        "peers": [{"name": "tor1", "address": "2001:db8:ffff::1", "asn": 64500}],
    }
)


@pytest.mark.parametrize(
    "value, why",
    [
        ("192.0.2.1", "outside this node's pod blocks and spec.announceRanges"),  # the uplink's
        ("8.8.8.8", "outside"),
        ("2001:db8:0:2::1", "outside"),  # another node's block
        ("255.255.255.255", "not a global unicast address"),
        ("0.0.0.1", "not a global unicast address"),
        ("240.0.0.1", "not a global unicast address"),
        ("2001:db8:ffff::1", "BGP peer tor1"),  # inside announceRanges, still refused
        ("203.0.113.11", "router ID"),
    ],
)
@pytest.mark.parametrize("key", ["anycast", "addresses"])
def test_claimed_addresses_stay_inside_the_allowed_ranges(key, value, why):
    with pytest.raises(AnnotationError) as info:
        parse_request({P + key: value}, PEERED, None)
    err = info.value
    assert why in err.details and repr(value) in err.details
    assert "2001:db8:0:1::/64, 198.51.100.0/24, 2001:db8:8000::/33, 203.0.113.0/24" in err.details


def test_claims_inside_the_block_or_announce_ranges_are_accepted():
    r = parse_request(
        {P + "anycast": "2001:db8:aaaa::1, 203.0.113.53", P + "addresses": "2001:db8:0:1::80"}, PEERED, None
    )
    assert [str(a) for a in r.anycast] == ["2001:db8:aaaa::1", "203.0.113.53"]
    without = node(announce_ranges=())
    with pytest.raises(AnnotationError):
        parse_request({P + "anycast": "2001:db8:aaaa::1"}, without, None)


def test_more_than_64_claims_are_refused_before_parsing_them():
    many = ",".join(f"2001:db8:aaaa::{i:x}" for i in range(5000))
    with pytest.raises(AnnotationError) as info:
        parse_request({P + "anycast": many}, PEERED, None)
    assert "at most 64" in info.value.details and len(info.value.details) < 2048
    # Not parsed: garbage past the limit does not change the answer.
    with pytest.raises(AnnotationError) as info:
        parse_request({P + "anycast": "x," * 65, P + "addresses": ""}, PEERED, None)
    assert "at most 64" in info.value.details
    ok = ",".join(f"2001:db8:aaaa::{i:x}" for i in range(1, 33))
    extra = ",".join(f"203.0.113.{i}" for i in range(100, 132))
    assert len(parse_request({P + "anycast": ok, P + "addresses": extra}, PEERED, None).anycast) == 32


def test_the_nodes_own_addresses_are_refused_even_inside_announce_ranges():
    own = frozenset({ipaddress.ip_address("203.0.113.250")})
    with pytest.raises(AnnotationError) as info:
        parse_request({P + "addresses": "203.0.113.250"}, PEERED, None, own)
    assert "one of this node's own addresses" in info.value.details
    assert parse_request({P + "addresses": "203.0.113.251"}, PEERED, None, own).addresses
