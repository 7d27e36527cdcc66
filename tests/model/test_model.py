import ipaddress

import pytest

from flock.model import InvalidObject, NodeConfig, PodInfo


def nodeconfig(**spec):
    return {"metadata": {"name": "host001"}, "spec": {"cidr6": "2001:db8:0:1::/64", **spec}}


def test_nodeconfig_full():
    nc = NodeConfig.from_object(
        {
            "metadata": {
                "name": "host001",
                "resourceVersion": "7",
                "annotations": {"flock.fritzlab.net/ip-algo": "namespace:16,random:48"},
            },
            "spec": {
                "cidr6": "2001:db8:0:1::/64",
                "cidr4": "198.51.100.0/24",
                "families": {"ipv6": True, "ipv4": True},
                "bgp": {
                    "asn": 64512,
                    "routerID": "192.0.2.11",
                    "peers": [{"name": "tor1", "address": "2001:db8:ffff::1", "asn": 64500}],
                },
            },
        }
    )
    assert nc.cidr4 == ipaddress.IPv4Network("198.51.100.0/24")
    assert nc.families.ipv4 and nc.families.ipv6
    assert nc.bgp.peers[0].address == ipaddress.IPv6Address("2001:db8:ffff::1")
    assert nc.ip_algo == "namespace:16,random:48"
    assert nc.resource_version == "7"


@pytest.mark.parametrize(
    "spec, field, value",
    [
        ({"cidr6": "2001:db8::1/64"}, "spec.cidr6", "2001:db8::1/64"),
        ({"cidr6": "198.51.100.0/24"}, "spec.cidr6", "198.51.100.0/24"),
        ({"cidr6": "2001:db8::%x blackhole; } #/64"}, "spec.cidr6", "2001:db8::%x blackhole; } #/64"),
        (
            {
                "bgp": {
                    "asn": 64512,
                    "routerID": "192.0.2.1",
                    "peers": [{"name": "tor", "address": "fe80::1%eth0", "asn": 1}],
                }
            },
            "spec.bgp.peers[0].address",
            "fe80::1%eth0",
        ),
        ({"cidr4": "198.51.100.0/31"}, "spec.cidr4", "198.51.100.0/31"),
        ({"families": {"ipv6": "yes"}}, "spec.families.ipv6", "yes"),
        ({"families": {"ipv4": True}}, "spec.families.ipv4", True),
        ({"bgp": {"asn": 0, "routerID": "192.0.2.1"}}, "spec.bgp.asn", 0),
        ({"bgp": {"asn": 64512, "routerID": "nope"}}, "spec.bgp.routerID", "nope"),
        (
            {"bgp": {"asn": 64512, "routerID": "192.0.2.1", "peers": [{"name": "a; }", "address": "::1", "asn": 1}]}},
            "spec.bgp.peers[0].name",
            "a; }",
        ),
    ],
)
def test_nodeconfig_rejects_with_field_and_value(spec, field, value):
    with pytest.raises(InvalidObject) as info:
        NodeConfig.from_object(nodeconfig(**spec))
    assert info.value.field == field
    assert info.value.value == value
    assert field in str(info.value)


def test_podinfo_equality_sees_annotations_and_is_hashable():
    base = {
        "metadata": {"name": "web-0", "namespace": "prod", "annotations": {"a": "1"}},
        "spec": {"containers": [{"image": "nginx:1"}]},
    }
    changed = {"metadata": {**base["metadata"], "annotations": {"a": "2"}}, "spec": base["spec"]}
    one, two = PodInfo.from_object(base), PodInfo.from_object(changed)
    assert one != two
    assert one.first_image == "nginx:1"
    assert hash(one) == hash(PodInfo.from_object(base))
