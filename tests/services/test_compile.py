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
    CountedChain,
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
    external_pools=(ipaddress.ip_network("198.51.100.0/25"),),
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
    (svc_chain,) = [c for c in t.chains if c.startswith("svc6-")]
    assert verdicts(t, "service-ips6") == {"fd00:96::10 . tcp . 80": f"goto {svc_chain}"}
    assert t.elements["cluster-ips6"] == {("fd00:96::10", None)}
    assert t.elements["no-endpoint-services6"] == frozenset()
    (pick,) = [c for c in t.chains if c.startswith("pick6-")]
    assert t.chains[svc_chain] == (
        "counter",  # the Service port's new connections (kept while endpoints come and go)
        "ip6 daddr fd00:96::10 ip6 saddr != @pod-cidrs6 jump mark-for-masquerade",
        f"goto {pick}",
    )
    assert t.counted[svc_chain] == CountedChain("default", "web", "http", "connections")
    (rule,) = t.chains[pick]
    assert re.fullmatch(r"numgen random mod 2 vmap \{ 0 : goto ep6-\S+, 1 : goto ep6-\S+ \}", rule)
    ep_chains = sorted(c for c in t.chains if c.startswith("ep6-"))
    assert len(ep_chains) == 2
    assert {t.chains[c][-1] for c in ep_chains} == {
        "meta l4proto tcp dnat ip6 to [2001:db8:10::1]:8080",
        "meta l4proto tcp dnat ip6 to [2001:db8:10::2]:8080",
    }
    assert all(t.chains[c][0].endswith("jump mark-for-masquerade") for c in ep_chains)  # hairpin
    assert all(NFT_NAME.match(c) for c in t.chains), list(t.chains)


def test_no_endpoints_rejects_and_unready_is_no_endpoint() -> None:
    t = compile_objs(
        [svc(node_port=30080, type="NodePort")], [eps("web", objects.endpoint("2001:db8:10::1", ready=False))]
    )
    (refused,) = t.chains
    assert t.chains[refused] == ("counter", "goto reject-services") and refused.startswith("rej6-")
    assert t.counted[refused] == CountedChain("default", "web", "http", "rejected")
    assert verdicts(t, "no-endpoint-services6") == {"fd00:96::10 . tcp . 80": f"goto {refused}"}
    assert verdicts(t, "no-endpoint-nodeports6") == {"tcp . 30080": f"goto {refused}"}
    assert t.elements["service-ips6"] == frozenset()


def test_internal_local_without_local_endpoints_drops() -> None:
    t = compile_objs([svc(itp="Local")], [eps("web", objects.endpoint("2001:db8:10::1", "node-b"))])
    (refused,) = t.chains
    assert t.chains[refused] == ("counter", "drop")
    assert verdicts(t, "no-endpoint-services6") == {"fd00:96::10 . tcp . 80": f"goto {refused}"}


def test_external_local_short_circuits_pods_and_the_node_and_drops_the_rest() -> None:
    t = compile_objs(
        [svc(type="NodePort", node_port=30080, etp="Local", health_check_node_port=32000)],
        [eps("web", objects.endpoint("2001:db8:10::1", "node-b"))],
    )
    (ext,) = [c for c in t.chains if c.startswith("ext6-")]
    (cluster,) = [c for c in t.chains if c.startswith("svc6-")]
    assert t.chains[ext] == (
        f"ip6 saddr @pod-cidrs6 goto {cluster}",
        "fib saddr type local jump mark-for-masquerade",
        f"fib saddr type local goto {cluster}",
    )  # and no goto to a local chain: there is no local endpoint
    assert verdicts(t, "service-nodeports6") == {"tcp . 30080": f"goto {ext}"}
    (refused,) = [c for c in t.chains if c.startswith("rej6-")]
    assert t.chains[refused] == ("counter", "drop")
    assert verdicts(t, "no-endpoint-nodeports6") == {"tcp . 30080": f"goto {refused}"}
    assert t.health_checks[32000].local_endpoints == 0
    t2 = compile_objs(
        [svc(type="NodePort", node_port=30080, etp="Local", health_check_node_port=32000)],
        [eps("web", objects.endpoint("2001:db8:10::1", "node-b"), objects.endpoint("2001:db8:10::2", "node-a"))],
    )
    (local,) = [c for c in t2.chains if c.startswith("loc6-")]
    assert t2.chains[ext][-1] == f"goto {local}"
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
    keys = {k.split(" . ")[0] for k, _ in t.elements["service-ips4"]}
    assert keys == {"203.0.113.10", "198.51.100.7", "198.51.100.8"}  # .200 and 203.0.113.99 are outside the pool
    (ext,) = [c for c in t.chains if c.startswith("ext4-")]
    assert t.chains[ext][0] == "jump mark-for-masquerade"  # eTP Cluster: masquerade external traffic


def test_client_ip_affinity() -> None:
    t = compile_objs(
        [svc(affinity_timeout=600)],
        [eps("web", objects.endpoint("2001:db8:10::1"), objects.endpoint("2001:db8:10::2"))],
    )
    assert len(t.affinity_sets) == 2 and all(s.timeout == 600 for s in t.affinity_sets.values())
    (pick,) = [c for c in t.chains if c.startswith("pick6-")]
    assert sum(r.startswith("ip6 saddr @aff6-") for r in t.chains[pick]) == 2
    text = render_full(t)
    assert "flags dynamic,timeout; timeout 600s;" in text


def test_hostile_names_never_reach_the_text_unsanitised() -> None:
    # the model refuses such names; the renderer does not rely on it
    service = Service.from_object(svc())
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
    services, slices = _cluster(1000)
    before = compile_table(services, slices, NODE, CONFIG)
    assert len(render_full(before).splitlines()) > 4000
    _, flipped = _cluster(1000, unready={(500, 1)})
    after = compile_table(services, flipped, NODE, CONFIG)
    update = render_update(before, after)
    assert update is not None
    lines = update.splitlines()
    assert len(lines) == 4, update  # the pick chain: flush + numgen; the endpoint chain: flush + delete
    assert lines[0].startswith("flush chain inet flock-services pick6-") and "default/s500/tcp/80" in lines[0]
    assert "numgen random mod 2" in lines[1]
    assert lines[2].startswith("flush chain") and lines[3].startswith("delete chain")
    assert render_update(after, after) == ""
    back = render_update(after, before)
    assert back is not None and len(back.splitlines()) == 5  # add chain, its two rules, pick chain rewrite
    # a Service's last endpoint going away: elements move from service-ips to no-endpoint-services
    _, none_left = _cluster(1000, unready={(7, 0), (7, 1), (7, 2)})
    empty = render_update(before, compile_table(services, none_left, NODE, CONFIG))
    assert empty is not None and len(empty.splitlines()) <= 16
    assert re.search(
        r"^add element inet flock-services no-endpoint-services6 \{ fd00:96::8 \. tcp \. 80 : goto rej6-\S+ \}$",
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
    (holder,) = [v for k, v in t.elements["service-ips4"] if k.startswith("198.51.100.7 ")]
    assert holder is not None and "default/a/" in holder
    assert t.conflicts == ("default/b: 198.51.100.7 . tcp . 80 in service-ips4 is default/a's",)


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
