"""Property tests: whatever pods ask and in whatever order they come and go,
no address is handed out twice, and every address is a legal one."""

import ipaddress
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flock.ipam import AnnotationError, Ipam, PoolExhausted
from flock.testing.ipam import node, pod

LAYOUTS = (None, "n:4", "random:3", "pod:2,n:3", "namespace:2,random:2", "app:1,n:1,random:1")


@st.composite
def subnet(draw, block):
    """Either nothing, or a CIDR drawn around *block*: a subnet, the block, a supernet."""
    if not draw(st.booleans()):
        return None
    longest = 30 if block.version == 4 else 127
    prefix = draw(st.integers(max(block.prefixlen - 2, 8), min(block.prefixlen + 4, longest)))
    if prefix <= block.prefixlen:
        return block.supernet(new_prefix=prefix)
    subs = 1 << (prefix - block.prefixlen)
    index = draw(st.integers(0, subs - 1))
    size = 1 << (block.max_prefixlen - prefix)
    return ipaddress.ip_network((int(block.network_address) + index * size, prefix))


@st.composite
def scenario(draw):
    block6 = ipaddress.IPv6Network(f"2001:db8:0:1::/{draw(st.sampled_from((116, 118, 120)))}")
    block4 = ipaddress.IPv4Network(f"198.51.100.0/{draw(st.integers(24, 30))}")
    ops = []
    for _ in range(draw(st.integers(1, 60))):
        if ops and draw(st.integers(0, 3)) == 0:
            ops.append(("release", draw(st.integers(0, 10_000))))
            continue
        annotations = {}
        sub6, sub4 = draw(subnet(block6)), draw(subnet(block4))
        if sub6 is not None:
            annotations["cidr6"] = str(sub6)
        if sub4 is not None:
            annotations["cidr4"] = str(sub4)
        families = draw(st.sampled_from(("both", "6", "4")))
        annotations["ipv6"] = str(families != "4").lower()
        annotations["ipv4"] = str(families != "6").lower()
        if families == "6":
            annotations.pop("cidr4", None)
        if families == "4":
            annotations.pop("cidr6", None)
        if draw(st.integers(0, 4)) == 0:  # a fixed address somewhere in a node block
            block = draw(st.sampled_from((block6, block4)))
            annotations["addresses"] = str(block.network_address + draw(st.integers(0, block.num_addresses - 1)))
        layout = draw(st.sampled_from(LAYOUTS))
        if layout:
            annotations["ip-algo"] = layout
        ops.append(("alloc", draw(st.integers(0, 5)), annotations))
    return block6, block4, draw(st.integers(0, 2**32)), ops


# Generation is heavier than the check; a loaded 2-core CI must not fail it as "too slow".
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_no_duplicates_and_every_address_is_legal(case):
    block6, block4, seed, ops = case
    im = Ipam(node(cidr6=str(block6), cidr4=str(block4)), random.Random(seed))
    live: dict[str, tuple] = {}
    for i, op in enumerate(ops):
        if op[0] == "release":
            if live:
                victim = sorted(live)[op[1] % len(live)]
                del live[victim]
                assert im.release(victim) is not None
            continue
        _, pod_no, annotations = op
        the_pod = pod(f"p{pod_no}", annotations=annotations)
        cid = f"c{i}"
        try:
            request = im.request(the_pod)
            got = im.allocate(cid, the_pod)
        except (PoolExhausted, AnnotationError):
            assert im.allocator.held(cid) is None
            continue
        live[cid] = (request, got)

        owned = [a for _, g in live.values() for a in (g.ip6, g.ip4, *g.addresses) if a is not None]
        assert len(owned) == len(set(owned)), "an address was handed out twice"
        assert im.allocator.in_use() == len(owned)
        for request, g in live.values():
            assert (g.ip6 is None) == (request.cidr6 is None)
            assert (g.ip4 is None) == (request.cidr4 is None)
            if g.ip6 is not None:
                assert g.ip6 in request.cidr6 and g.ip6 in block6
                assert g.ip6 != request.cidr6.network_address, "all-zero identifier"
            if g.ip4 is not None:
                net = request.cidr4
                assert g.ip4 in net and g.ip4 in block4
                assert g.ip4 not in (net.network_address, net.network_address + 1, net.broadcast_address)
