"""compile_table and the nft text: what each Service shape becomes, and the size of an update."""

from __future__ import annotations

import ipaddress
import random
import re
from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from flock.services import (
    AllowList,
    Counted,
    EndpointSlice,
    NodeView,
    Service,
    ServicesConfig,
    ServicesTable,
    compile_table,
    render_full,
    render_update,
)
from flock.testing import services as objects

NODE = NodeView("node-a", (ipaddress.ip_address("2001:db8:ffff::1"), ipaddress.ip_address("198.51.100.1")))
CONFIG = ServicesConfig(
    pod_cidrs=(ipaddress.ip_network("2001:db8:10::/64"), ipaddress.ip_network("192.0.2.0/24")),
    allow=AllowList.of_cidrs((ipaddress.ip_network("198.51.100.0/25"),)),
)
PORTS = [objects.slice_port("http", 8080)]
NFT_NAME = re.compile(r"[a-z][a-z0-9]*-[a-z2-7]{13}(-[a-z0-9./-]{1,40})?\Z")


def compile_objs(services: list[dict[str, Any]], slices: list[dict[str, Any]], **kw: Any) -> ServicesTable:
    return compile_table(
        [Service.from_object(s) for s in services],
        [EndpointSlice.from_object(s) for s in slices],
        kw.pop("node", NODE),
        kw.pop("config", CONFIG),
    )


def svc(name: str = "web", ip: str = "fd00:96::10", **kw: Any) -> dict[str, Any]:
    node_port = kw.pop("node_port", None)
    return objects.service(name, [ip], [objects.port("http", 80, target=8080, node_port=node_port)], **kw)


def eps(name: str = "web", *endpoints: dict[str, Any]) -> dict[str, Any]:
    return objects.endpoint_slice(name, list(endpoints), PORTS)


def verdicts(table: ServicesTable, name: str) -> dict[str, str | None]:
    return dict(table.elements[name])


def test_a_cluster_ip_with_two_endpoints() -> None:
    t = compile_objs(
        [svc()], [eps("web", objects.endpoint("2001:db8:10::1"), objects.endpoint("2001:db8:10::2", "node-b"))]
    )
    key = "fd00:96::10 . tcp . 80"
    assert verdicts(t, "service-ips6") == {key: "goto pick6"}  # counted per element: the port's connections
    assert t.counted[("service-ips6", key)] == Counted("default", "web", "http", "connections")
    assert verdicts(t, "spread6") == {key: "goto rand6-2"}
    assert verdicts(t, "endpoints6-tcp") == {
        f"{key} . 0": "2001:db8:10::1 . 8080",
        f"{key} . 1": "2001:db8:10::2 . 8080",
    }
    assert t.chains["rand6-2"] == tuple(
        f"meta l4proto {p} dnat ip6 to ip6 daddr . meta l4proto . {p} dport . numgen random mod 2 map @endpoints6-{p}"
        for p in ("tcp", "udp", "sctp")
    )
    assert t.elements["cluster-ips6"] == {("fd00:96::10", None)}
    # only this node's endpoint can reach itself through this node
    assert t.elements["hairpin6"] == {("2001:db8:10::1 . 2001:db8:10::1", None)}
    assert t.elements["no-endpoint-services6"] == frozenset()
    assert set(t.chains) == {"rand6-2"}  # no chain of its own: a Service is elements of shared maps


def test_no_endpoints_rejects_and_unready_is_no_endpoint() -> None:
    t = compile_objs(
        [svc(node_port=30080, type="NodePort")], [eps("web", objects.endpoint("2001:db8:10::1", ready=False))]
    )
    assert t.chains == {}
    assert verdicts(t, "no-endpoint-services6") == {"fd00:96::10 . tcp . 80": "goto reject-services"}
    assert verdicts(t, "no-endpoint-nodeports6") == {"tcp . 30080": "goto reject-services"}
    rejected = Counted("default", "web", "http", "rejected")
    assert t.counted == {
        ("no-endpoint-services6", "fd00:96::10 . tcp . 80"): rejected,
        ("no-endpoint-nodeports6", "tcp . 30080"): rejected,
    }
    assert t.elements["service-ips6"] == frozenset() and t.elements["spread6"] == frozenset()


def test_internal_local_without_local_endpoints_drops() -> None:
    t = compile_objs([svc(itp="Local")], [eps("web", objects.endpoint("2001:db8:10::1", "node-b"))])
    assert verdicts(t, "no-endpoint-services6") == {"fd00:96::10 . tcp . 80": "drop"}
    t = compile_objs(
        [svc(itp="Local")],
        [eps("web", objects.endpoint("2001:db8:10::1", "node-b"), objects.endpoint("2001:db8:10::2"))],
    )
    assert verdicts(t, "one-endpoint6") == {"fd00:96::10 . tcp . 80": "2001:db8:10::2 . 8080"}  # this node's only
    assert verdicts(t, "spread6") == {"fd00:96::10 . tcp . 80": "goto rand6-1"}
    assert t.chains["rand6-1"] == ("dnat ip6 to ip6 daddr . meta l4proto . th dport map @one-endpoint6",)


def test_a_node_port_spreads_on_every_node_address() -> None:
    t = compile_objs(
        [svc("web", "203.0.113.10", type="NodePort", node_port=30080)],
        [eps("web", objects.endpoint("192.0.2.1"), objects.endpoint("192.0.2.2", "node-b"))],
    )
    assert verdicts(t, "service-nodeports4") == {"tcp . 30080": "goto nppick4"}  # marked for masquerade there
    assert verdicts(t, "nodeport-spread4") == {"198.51.100.1 . tcp . 30080": "goto nprand4-2"}
    assert verdicts(t, "nodeport-endpoints4-tcp") == {
        "198.51.100.1 . tcp . 30080 . 0": "192.0.2.1 . 8080",
        "198.51.100.1 . tcp . 30080 . 1": "192.0.2.2 . 8080",
    }
    assert t.chains["nprand4-2"][0] == (
        "meta l4proto tcp dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 2 map @nodeport-endpoints4-tcp"
    )
    assert verdicts(t, "service-nodeports6") == {}  # an IPv4-only Service


def test_external_local_short_circuits_pods_and_the_node_and_drops_the_rest() -> None:
    t = compile_objs(
        [svc(type="NodePort", node_port=30080, etp="Local", health_check_node_port=32000)],
        [eps("web", objects.endpoint("2001:db8:10::1", "node-b"))],
    )
    (ext,) = [c for c in t.chains if c.startswith("ext6-")]
    to_cluster = "meta l4proto tcp dnat ip6 to [2001:db8:10::1]:8080"
    assert t.chains[ext] == (
        f"ip6 saddr @pod-cidrs6 {to_cluster}",
        "fib saddr type local jump mark-for-masquerade",
        f"fib saddr type local {to_cluster}",
    )  # and no DNAT for anyone else: there is no local endpoint
    assert verdicts(t, "service-nodeports6") == {"tcp . 30080": f"goto {ext}"}
    assert verdicts(t, "no-endpoint-nodeports6") == {"tcp . 30080": "drop"}
    assert verdicts(t, "service-ips6") == {"fd00:96::10 . tcp . 80": "goto pick6"}  # the ClusterIP: any endpoint
    assert t.health_checks[32000].local_endpoints == 0
    t2 = compile_objs(
        [svc(type="NodePort", node_port=30080, etp="Local", health_check_node_port=32000)],
        [eps("web", objects.endpoint("2001:db8:10::1", "node-b"), objects.endpoint("2001:db8:10::2", "node-a"))],
    )
    assert t2.chains[ext][0] == (
        "ip6 saddr @pod-cidrs6 meta l4proto tcp dnat ip6 to numgen random mod 2 map "
        "{ 0 : 2001:db8:10::1 . 8080, 1 : 2001:db8:10::2 . 8080 }"
    )
    assert t2.chains[ext][-1] == "meta l4proto tcp dnat ip6 to [2001:db8:10::2]:8080"
    assert t2.elements["no-endpoint-nodeports6"] == frozenset()
    assert t2.health_checks[32000].local_endpoints == 1


def test_external_addresses_only_inside_the_pools() -> None:
    t = compile_objs(
        [
            svc(
                "web",
                "203.0.113.10",
                external_ips=["198.51.100.7", "198.51.100.200", "203.0.113.99"],
                lb_ips=["198.51.100.8"],
            )
        ],
        [eps("web", objects.endpoint("192.0.2.1"))],
    )
    ways = dict(t.elements["service-ips4"])
    assert ways == {
        "203.0.113.10 . tcp . 80": "goto pick4",
        "198.51.100.7 . tcp . 80": "goto xpick4",  # eTP Cluster: external traffic is masqueraded
        "198.51.100.8 . tcp . 80": "goto xpick4",
    }  # .200 and 203.0.113.99 are outside the pool
    assert set(dict(t.elements["spread4"])) == set(ways)


def test_client_ip_affinity() -> None:
    t = compile_objs(
        [svc(affinity_timeout=600)],
        [eps("web", objects.endpoint("2001:db8:10::1"), objects.endpoint("2001:db8:10::2"))],
    )
    assert len(t.affinity_sets) == 2 and all(s.timeout == 600 for s in t.affinity_sets.values())
    (pick,) = [c for c in t.chains if c.startswith("svc6-")]
    assert verdicts(t, "service-ips6") == {"fd00:96::10 . tcp . 80": f"goto {pick}"}
    assert sum(r.startswith("ip6 saddr @aff6-") for r in t.chains[pick]) == 2
    assert re.fullmatch(r"numgen random mod 2 vmap \{ 0 : goto ep6-\S+, 1 : goto ep6-\S+ \}", t.chains[pick][-1])
    assert t.elements["spread6"] == frozenset()
    assert all(NFT_NAME.match(c) for c in t.chains), list(t.chains)
    text = render_full(t)
    assert "flags dynamic,timeout; timeout 600s;" in text


def test_hostile_names_never_reach_the_text_unsanitised() -> None:
    # the model refuses such names; the renderer does not rely on it
    service = Service.from_object(svc(affinity_timeout=60))  # chains of its own, named after it
    evil = attrs.evolve(service, namespace="x;flush ruleset", name="a b{}")
    slice_ = EndpointSlice.from_object(eps("web", objects.endpoint("2001:db8:10::1")))
    t = compile_table([evil], [attrs.evolve(slice_, namespace=evil.namespace, service=evil.name)], NODE, CONFIG)
    assert t.chains and all(NFT_NAME.match(c) for c in t.chains), list(t.chains)
    text = render_full(t)
    assert "flush ruleset" not in text and "x;" not in text and "a b" not in text
    assert "-xflushruleset/ab/tcp/80" in text


def _cluster(n: int, unready: set[int] = frozenset()) -> tuple[list[Service], list[EndpointSlice]]:
    services, slices = [], []
    for i in range(n):
        ip6 = f"fd00:96::{i + 1:x}"
        ip4 = f"203.0.113.{i % 250 + 1}" if i < 250 else None
        raw = objects.service(f"s{i}", [ip6] + ([ip4] if ip4 else []), [objects.port("http", 80, target=8080)])
        services.append(Service.from_object(raw))
        endpoints = [
            objects.endpoint(f"2001:db8:10::{i:x}:{j}", "node-a" if j == 0 else "node-b", ready=(i, j) not in unready)
            for j in range(3)
        ]
        slices.append(EndpointSlice.from_object(objects.endpoint_slice(f"s{i}", endpoints, PORTS)))
    return services, slices


def test_an_endpoint_flip_at_a_thousand_services_is_a_handful_of_lines() -> None:
    services, slices = _cluster(1000, unready={(3, 0)})  # one Service with two endpoints: rand6-2 is in use
    before = compile_table(services, slices, NODE, CONFIG)
    assert len(render_full(before).splitlines()) > 20
    _, flipped = _cluster(1000, unready={(3, 0), (500, 1)})
    after = compile_table(services, flipped, NODE, CONFIG)
    update = render_update(before, after)
    assert update is not None
    lines = update.splitlines()
    # the spread element names the chain for two, and the last endpoint element goes (the rest renumbered)
    key = "fd00:96::1f5 . tcp . 80"
    assert lines == [
        f"delete element inet flock-services endpoints6-tcp {{ {key} . 1, {key} . 2 }}",
        f"delete element inet flock-services spread6 {{ {key} }}",
        f"add element inet flock-services endpoints6-tcp {{ {key} . 1 : 2001:db8:10::1f4:2 . 8080 }}",
        f"add element inet flock-services spread6 {{ {key} : goto rand6-2 }}",
    ], update
    assert render_update(after, after) == ""
    back = render_update(after, before)
    assert back is not None and len(back.splitlines()) == 4
    # a Service's last endpoint going away: its element moves from service-ips to no-endpoint-services
    _, none_left = _cluster(1000, unready={(3, 0), (7, 0), (7, 1), (7, 2)})
    empty = render_update(before, compile_table(services, none_left, NODE, CONFIG))
    assert empty is not None and len(empty.splitlines()) <= 10, empty
    assert re.search(
        r"^add element inet flock-services no-endpoint-services6 \{ fd00:96::8 \. tcp \. 80 : goto reject-services \}$",
        empty,
        re.MULTILINE,
    )


def test_a_key_two_services_claim_stays_with_the_first() -> None:
    shared = ["198.51.100.7"]
    t = compile_objs(
        [svc("b", "fd00:96::2", external_ips=shared), svc("a", "fd00:96::1", external_ips=shared)],
        [
            eps("a", objects.endpoint("2001:db8:10::1")),
            objects.endpoint_slice("b", [objects.endpoint("2001:db8:10::2")], PORTS),
        ],
    )
    assert t.elements["service-ips4"] == frozenset()  # IPv6-only Services: the IPv4 externalIP is not theirs
    t = compile_objs(
        [svc("b", "203.0.113.2", external_ips=shared), svc("a", "203.0.113.1", external_ips=shared)],
        [
            objects.endpoint_slice("a", [objects.endpoint("192.0.2.1")], PORTS),
            objects.endpoint_slice("b", [objects.endpoint("192.0.2.2")], PORTS),
        ],
    )
    key = "198.51.100.7 . tcp . 80"
    assert dict(t.elements["one-endpoint4"])[key] == "192.0.2.1 . 8080"  # a's endpoint
    assert t.conflicts == (f"default/b: address {key} is default/a's",)


def test_a_skeleton_change_is_a_full_replace() -> None:
    services, slices = _cluster(3)
    a = compile_table(services, slices, NODE, CONFIG)
    b = compile_table(
        services, slices, NODE, attrs.evolve(CONFIG, skeleton=attrs.evolve(CONFIG.skeleton, masquerade_mark=0x8000))
    )
    assert render_update(a, b) is None


# --- the update, applied to the old table, is the new table ---------------------------------------------------


def apply_text(table: ServicesTable, script: str) -> tuple[dict[str, tuple[str, ...]], set[str], dict[str, set[str]]]:
    """Interpret the update verbs render_update emits, on the (chains, sets, elements) of *table*."""
    chains = {k: tuple(v) for k, v in table.chains.items()}
    sets = set(table.affinity_sets)
    elements = {k: {f"{key} : {v}" if v else key for key, v in e} for k, e in table.elements.items()}
    for line in script.splitlines():
        words = line.split(" ")
        verb, what, name = words[0], words[1], words[4]
        assert words[2:4] == ["inet", "flock-services"], line
        if (verb, what) == ("add", "chain"):
            assert name not in chains
            chains[name] = ()
        elif (verb, what) == ("flush", "chain"):
            chains[name] = ()
        elif (verb, what) == ("delete", "chain"):
            assert chains.pop(name) == (), "a chain is flushed before it is deleted"
        elif (verb, what) == ("add", "rule"):
            chains[name] += (" ".join(words[5:]),)
        elif (verb, what) == ("add", "set"):
            sets.add(name)
        elif (verb, what) == ("delete", "set"):
            sets.remove(name)
        elif what == "element":
            items = line.split(" { ", 1)[1].removesuffix(" }").split(", ")
            if verb == "add":
                assert not {i.split(" : ")[0] for i in items} & {e.split(" : ")[0] for e in elements[name]}
                elements[name] |= set(items)
            else:
                keep = {e for e in elements[name] if e.split(" : ")[0] not in items}
                assert len(keep) == len(elements[name]) - len(items), "deleted keys were there"
                elements[name] = keep
        else:
            raise AssertionError(line)
    return chains, sets, elements


def _random_state(rng: random.Random) -> tuple[list[Service], list[EndpointSlice]]:
    services, slices = objects.random_cluster(rng)
    return [Service.from_object(s) for s in services], [EndpointSlice.from_object(s) for s in slices]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 2**32))
def test_an_update_turns_the_old_table_into_the_new(seed_a: int, seed_b: int) -> None:
    old = compile_table(*_random_state(random.Random(seed_a)), NODE, CONFIG)
    new = compile_table(*_random_state(random.Random(seed_b)), NODE, CONFIG)
    script = render_update(old, new)
    assert script is not None
    chains, sets, elements = apply_text(old, script)
    assert chains == dict(new.chains)
    assert sets == set(new.affinity_sets)
    assert elements == {k: {f"{key} : {v}" if v else key for key, v in e} for k, e in new.elements.items()}
