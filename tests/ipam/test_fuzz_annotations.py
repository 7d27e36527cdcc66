"""Property tests: any value of any ``flock.fritzlab.net/*`` annotation either
resolves to a request inside this node's blocks or is an AnnotationError
(code 7) naming the annotation and its value — never another exception.

Values are built from tokens that trip address parsers: whitespace, trailing
commas, IPv6 scope IDs, zone-less link-local, IPv4-mapped IPv6, upper case,
leading zeros, host bits, huge prefix lengths, non-ASCII digits."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flock.errors import INVALID_CONFIG, quote
from flock.ipam import (
    ADDRESSES,
    ANYCAST,
    CIDR4,
    CIDR6,
    IP_ALGO,
    IPV4,
    IPV6,
    AnnotationError,
    Ipam,
    LayoutError,
    PoolExhausted,
    parse_layout,
    parse_request,
)
from flock.pods import cni_error
from flock.testing.ipam import node, pod

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NODE = node(cidr6="2001:db8:0:1::/64", cidr4="198.51.100.0/24")

ADDRESS_TOKENS = (
    "2001:db8:0:1::5",
    "2001:DB8:0:1::5",
    "2001:db8::5%eth0",
    "2001:db8::5%",
    "fe80::1",
    "fe80::1%eth0",
    "::ffff:198.51.100.7",
    "::ffff:c633:6407",
    "::198.51.100.7",
    "198.51.100.7",
    "198.051.100.7",
    "010.0.0.1",
    "198.51.100.0",
    "198.51.100.255",
    "2001:db8:0:1::",
    "::",
    "::1",
    "ff02::1",
    "224.0.0.1",
    "127.0.0.1",
    "203.0.113.9",
    "2001:db8:ffff::9",
    "2001:db8::5/128",
    "198.51.100.７",
    "1.2.3",
    "2001:db8:::5",
    " ",
    "",
)
CIDR_TOKENS = (
    "2001:db8:0:1::/64",
    "2001:db8:0:1:1::/80",
    "2001:DB8:0:1:1::/80",
    "2001:db8:0:1:1::%eth0/80",
    "2001:db8:0:1:1::/80%eth0",
    "2001:db8:0:1::1/64",
    "2001:db8:0:1::/999",
    "2001:db8:0:1::/-1",
    "2001:db8:0:1::/0064",
    "2001:db8::/32",
    "::/0",
    "2001:db8:0:1::/127",
    "2001:db8:0:1::/128",
    "fe80::/64",
    "::ffff:0:0/96",
    "2001:db8:0:2::/64",
    "198.51.100.0/24",
    "198.51.100.0/25",
    "198.51.100.128/25",
    "198.51.100.1/24",
    "198.51.100.0/31",
    "198.51.100.0/30",
    "198.051.100.0/24",
    "0.0.0.0/0",
    "198.51.100.0/33",
    "198.51.100.0/２４",
    "203.0.113.0/24",
    "198.51.100.0/ 24",
    "",
)
ALGO_TOKENS = (
    "random:16",
    "n:4",
    "namespace:16",
    "app:16",
    "pod:8",
    "image:8",
    "node:8",
    "random:0",
    "random:128",
    "random:-1",
    "random:１６",
    "random:²",
    "random:" + "9" * 5000,
    "bogus:3",
    "random",
    "n:4:4",
    "random:16 ",
    "",
    "random:64",
)
SEPARATORS = (",", ", ", " ,", ",,", "\t,", ",\n")
WHITESPACE = ("", " ", "\t", "\n", "\u00a0", "\u2003")


@st.composite
def joined(draw, tokens):
    """One to three items, mostly tokens (one in ten arbitrary text), joined by
    comma variants and padded with (Unicode) whitespace."""
    token = st.integers(0, 9).flatmap(lambda i: st.text(max_size=6) if i == 0 else st.sampled_from(tokens))
    items = draw(st.lists(token, min_size=1, max_size=3))
    pad = st.sampled_from(WHITESPACE)
    out = draw(pad) + items[0]
    for item in items[1:]:
        out += draw(st.sampled_from(SEPARATORS)) + item
    if draw(st.integers(0, 5)) == 0:
        out += ","  # trailing comma
    return out + draw(pad)


FLAGS = st.sampled_from(("true", "false", "TRUE", " false ", "yes", "1", "", "truee", "\u00a0true"))
VALUES = {
    IPV6: FLAGS,
    IPV4: FLAGS,
    CIDR6: joined(CIDR_TOKENS),
    CIDR4: joined(CIDR_TOKENS),
    IP_ALGO: joined(ALGO_TOKENS),
    ANYCAST: joined(ADDRESS_TOKENS),
    ADDRESSES: joined(ADDRESS_TOKENS),
}


PLAIN = {
    IPV6: "true",
    IPV4: "true",
    CIDR6: "2001:db8:0:1:1::/80",
    CIDR4: "198.51.100.128/25",
    IP_ALGO: "pod:8,random:16",
    ANYCAST: "203.0.113.10",
    ADDRESSES: "2001:db8:ffff::20",
}


@st.composite
def annotation_dicts(draw):
    """One or two fuzzed annotations among others with plain valid values, so a
    value the parser wrongly accepts is not masked by another one it rejects."""
    fuzzed = draw(st.lists(st.sampled_from(sorted(VALUES)), unique=True, min_size=1, max_size=2))
    plain = draw(st.lists(st.sampled_from(sorted(set(VALUES) - set(fuzzed))), unique=True, max_size=3))
    return {**{key: PLAIN[key] for key in plain}, **{key: draw(VALUES[key]) for key in fuzzed}}


def assert_plain_unicast(addr) -> None:
    assert "%" not in str(addr) and getattr(addr, "scope_id", None) is None
    assert getattr(addr, "ipv4_mapped", None) is None
    assert not (addr.is_unspecified or addr.is_multicast or addr.is_loopback or addr.is_link_local)


def check_verdict(annotations: dict[str, str]) -> None:
    try:
        req = parse_request(annotations, NODE, None)
    except AnnotationError as err:
        assert cni_error(err).code == INVALID_CONFIG
        assert err.annotation in annotations or err.annotation in (IPV6, IPV4, CIDR4)
        assert err.details.startswith(f"{err.annotation}={quote(err.value, 512)}")  # a bounded prefix of the value
        if err.annotation in annotations:
            assert err.value == annotations[err.annotation]
        return
    if req.cidr6 is not None:
        assert req.cidr6.subnet_of(NODE.cidr6) and "%" not in str(req.cidr6)
        assert req.cidr6.prefixlen <= 127
    if req.cidr4 is not None:
        assert req.cidr4.subnet_of(NODE.cidr4) and req.cidr4.prefixlen <= 30
    for addr in req.anycast + req.addresses:
        assert_plain_unicast(addr)
    assert not set(req.anycast) & set(req.addresses)


@FUZZ
@given(annotation_dicts())
def test_any_annotations_resolve_inside_the_node_or_name_the_annotation(annotations):
    check_verdict(annotations)


@FUZZ
@given(joined(ALGO_TOKENS))
def test_any_ip_algo_parses_or_is_a_layout_error(text):
    try:
        layout = parse_layout(text)
    except LayoutError as exc:
        assert exc.value == text and exc.reason
        return
    assert 1 <= layout.bits <= 127 and all(f.bits >= 1 for f in layout.fields)


@pytest.mark.parametrize(
    "key, value, reason",
    [
        (ADDRESSES, "2001:db8::5%eth0", "not an IP address without a scope ID"),
        (ANYCAST, "2001:db8::5%eth0", "not an IP address without a scope ID"),
        (ADDRESSES, "2001:db8::5%", "not an IP address without a scope ID"),
        (CIDR6, "2001:db8:0:1:1::%eth0/80", "is not a CIDR"),
        (ADDRESSES, "::ffff:198.51.100.7", "IPv4-mapped"),
        (ANYCAST, "::ffff:203.0.113.9", "IPv4-mapped"),
        (IP_ALGO, "random:" + "9" * 5000, "is not a positive integer"),
        (IP_ALGO, "random:²", "is not a positive integer"),
        (IP_ALGO, "random:１６", "is not a positive integer"),
    ],
)
def test_regressions_now_rejected_naming_the_annotation(key, value, reason):
    # Each was accepted (scope IDs, IPv4-mapped, fullwidth digits) or crashed
    # with ValueError (5000 digits, '²') before.
    with pytest.raises(AnnotationError) as info:
        parse_request({key: value}, NODE, None)
    assert cni_error(info.value).code == INVALID_CONFIG and info.value.annotation == key and info.value.value == value
    assert reason in info.value.details


@FUZZ
@given(annotation_dicts())
def test_allocate_leaves_no_holding_when_the_annotations_are_bad(annotations):
    ipam = Ipam(NODE)
    ipam.allocate("keep", pod("other"))
    before = ipam.allocator.in_use()
    p = pod(annotations={k.removeprefix("flock.fritzlab.net/"): v for k, v in annotations.items()})
    try:
        held = ipam.allocate("c1", p)
    except (AnnotationError, PoolExhausted):
        assert ipam.allocator.in_use() == before and ipam.allocator.held("c1") is None
        return
    for addr in (held.ip6, held.ip4):
        if addr is not None:
            assert addr in (NODE.cidr6 if addr.version == 6 else NODE.cidr4)
    ipam.release("c1")
    assert ipam.allocator.in_use() == before
