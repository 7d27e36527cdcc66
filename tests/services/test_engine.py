"""The incremental engine against compile_table, the reference: after any sequence of writes the engine's
table is compile_table's, and each delta, as text, turns the table before it into the table after it."""

from __future__ import annotations

import ipaddress
import random
from typing import Any

import attrs
from hypothesis import event, given, settings
from hypothesis import strategies as st

from flock.services import (
    AllowList,
    AnnouncePool,
    EndpointSlice,
    NodeView,
    Service,
    ServiceInputs,
    ServicesConfig,
    ServicesEngine,
    ServicesTable,
    compile_table,
    render_update,
)
from flock.services._inputs import ENDPOINT_SLICES, SERVICES
from flock.testing import services as objects

from .test_compile import CONFIG, NODE, apply_text

# Few names, addresses and ports, so that Services collide: two claim one externalIP or NodePort, a slice
# moves from one Service to another, a healthCheckNodePort is shared.  Namespaces "a" and "a-b" order
# differently as tuples than as "ns/name" strings.
NAMESPACES = ("a", "a-b")
NAMES = ("web", "db", "x")
SLICE_NAMES = ("s1", "s2", "s3")


def random_service(rng: random.Random, namespace: str, name: str) -> dict[str, Any]:
    ips = rng.choice(
        [["fd00:96::1"], ["fd00:96::2", "203.0.113.2"], ["203.0.113.3"], [f"fd00:96::{rng.randint(1, 9)}"], ["None"]]
    )
    kw: dict[str, Any] = {}
    if rng.random() < 0.3:
        kw["affinity_timeout"] = rng.choice([60, 600])
    if rng.random() < 0.4:
        kw["etp"] = "Local"
        if rng.random() < 0.7:
            kw["health_check_node_port"] = rng.choice([32000, 32001])
    if rng.random() < 0.2:
        kw["itp"] = "Local"
    node_port = rng.choice([None, 30000, 30001])
    externals = rng.sample(["198.51.100.7", "198.51.100.8", "2001:db8:ff::7", "198.51.100.200"], rng.randint(0, 2))
    ports = [objects.port("http", 80, target=8080, node_port=node_port)]
    if rng.random() < 0.5:
        ports.append(objects.port("dns", 53, protocol="UDP", node_port=rng.choice([None, 30001])))
    return objects.service(
        name,
        ips,
        ports,
        namespace=namespace,
        type="NodePort" if node_port else "ClusterIP",
        external_ips=externals,
        **kw,
    )


def random_slice(rng: random.Random, namespace: str, name: str) -> dict[str, Any]:
    family = rng.choice(["IPv6", "IPv4"])
    fmt = "2001:db8:10::{}" if family == "IPv6" else "192.0.2.{}"
    endpoints = [
        objects.endpoint(
            fmt.format(rng.randint(1, 5)),
            rng.choice(["node-a", "node-b", None]),
            ready=rng.random() < 0.7,
            serving=rng.choice([None, True, False]),
            terminating=rng.choice([None, True]),
        )
        for _ in range(rng.randint(0, 3))
    ]
    ports = [objects.slice_port("http", rng.choice([8080, 8081])), objects.slice_port("dns", 5353, "UDP")]
    raw = objects.endpoint_slice(
        rng.choice(NAMES), endpoints, ports, name=name, namespace=namespace, address_type=family
    )
    if rng.random() < 0.1:
        del raw["metadata"]["labels"]  # a slice of no Service
    return raw


NODES = (NODE, NodeView("node-a", (ipaddress.ip_address("2001:db8:ffff::2"),)), NodeView("node-b"))
CONFIGS = (CONFIG, ServicesConfig(pod_cidrs=(ipaddress.ip_network("2001:db8:10::/64"),)))

step = st.tuples(st.sampled_from(["service", "slice", "delete-service", "delete-slice", "node"]), st.integers(0, 2**32))


def as_text(table: ServicesTable) -> tuple[dict[str, tuple[str, ...]], set[str], dict[str, set[str]]]:
    elements = {k: {f"{key} : {v}" if v else key for key, v in e} for k, e in table.elements.items()}
    return dict(table.chains), set(table.affinity_sets), elements


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(step, min_size=1, max_size=4), min_size=1, max_size=12))
def test_the_engine_follows_compile_table_and_its_deltas_apply(batches: list[list[tuple[str, int]]]) -> None:
    inputs = ServiceInputs()
    journal = inputs.journal()
    node, config = NODE, CONFIG
    engine = ServicesEngine(node, config)
    held = engine.table()
    assert held == compile_table([], [], node, config)
    for batch in batches:  # the writes of one batch reach the engine together, as a burst reaches the proxy
        rebuilt = False
        for what, seed in batch:
            rng = random.Random(seed)
            namespace = rng.choice(NAMESPACES)
            if what == "service":
                obj = Service.from_object(random_service(rng, namespace, rng.choice(NAMES)))
                inputs.set(SERVICES, obj.key, obj)
            elif what == "slice":
                eps = EndpointSlice.from_object(random_slice(rng, namespace, rng.choice(SLICE_NAMES)))
                inputs.set(ENDPOINT_SLICES, eps.key, eps)
            elif what == "delete-service":
                inputs.delete(SERVICES, f"{namespace}/{rng.choice(NAMES)}")
            elif what == "delete-slice":
                inputs.delete(ENDPOINT_SLICES, f"{namespace}/{rng.choice(SLICE_NAMES)}")
            else:
                node, config, rebuilt = rng.choice(NODES), rng.choice(CONFIGS), True
        changes = journal.drain()
        before = engine.table()
        assert before == held
        if rebuilt:
            first = engine.rebuild(node, config)
            chains, sets, elements = apply_text(held, first.script())
            held = engine.table()
            assert (chains, sets, elements) == as_text(held)
        delta = engine.update(inputs.services, inputs.slices, changes.services, changes.slices)
        after = engine.table()
        reference = compile_table(inputs.services.values(), inputs.slices.values(), node, config)
        assert after == reference
        assert after.conflicts == reference.conflicts
        assert after.counted == reference.counted
        assert engine.health_checks == reference.health_checks
        script = delta.script()
        assert script == render_update(held, after)  # the same transaction a whole diff would make
        assert apply_text(held, script) == as_text(after)
        assert delta.health_changed or held.health_checks == after.health_checks
        event(f"conflicts: {bool(after.conflicts)}")
        event(f"a Service took a key over: {_took_over(held, after)}")
        event(f"health checks: {len(after.health_checks)}")
        held = after


def _took_over(held: ServicesTable, after: ServicesTable) -> bool:
    """A conflict of *held* gone in *after* while its key is still held by someone."""
    gone = set(held.conflicts) - set(after.conflicts)
    return any(c.split(": ", 1)[1].split(" in ")[0] in {k for e in after.elements.values() for k, _ in e} for c in gone)


def _cluster(n: int) -> tuple[dict[str, Service], dict[str, EndpointSlice]]:
    services, slices = {}, {}
    for i in range(n):
        s = Service.from_object(
            objects.service(f"s{i}", [f"fd00:96::{i + 1:x}"], [objects.port("http", 80, target=8080)])
        )
        endpoints = [objects.endpoint(f"2001:db8:10::{i:x}:{j}", "node-b") for j in range(3)]
        e = EndpointSlice.from_object(objects.endpoint_slice(f"s{i}", endpoints, [objects.slice_port("http", 8080)]))
        services[s.key], slices[e.key] = s, e
    return services, slices


def test_an_endpoint_flip_recompiles_one_service_and_writes_a_handful_of_lines() -> None:
    services, slices = _cluster(2000)
    engine = ServicesEngine(NODE, CONFIG)
    engine.update(services, slices, services, slices)
    key = "default/s1234-ipv6"
    raw = objects.endpoint_slice(
        "s1234",
        [objects.endpoint(f"2001:db8:10::{1234:x}:{j}", "node-b", ready=j != 1) for j in range(3)],
        [objects.slice_port("http", 8080)],
    )
    slices[key] = EndpointSlice.from_object(raw)
    delta = engine.update(services, slices, (), (key,))
    assert delta.services == 1
    lines = delta.script().splitlines()
    # elements only: the spread element (for two), the last endpoint element, one renumbered (remote: no hairpin)
    elements = [line for line in lines if " element " in line]
    assert len(elements) == 4, lines
    # and the shared chain for two endpoints, made for the first Service with two
    assert {line.split()[4] for line in lines if line not in elements} == {"rand6-2"}, lines
    assert set(delta.after.chains) == {"rand6-2"}


def test_the_first_claimant_keeps_a_shared_address_and_the_next_takes_over_when_it_goes() -> None:
    shared = ["198.51.100.7"]
    inputs = {}
    for name in ("b", "a"):
        svc = Service.from_object(
            objects.service(name, [f"203.0.113.{ord(name)}"], [objects.port()], external_ips=shared)
        )
        inputs[svc.key] = svc
    eps = {
        f"default/{n}-ipv4": EndpointSlice.from_object(
            objects.endpoint_slice(n, [objects.endpoint(f"192.0.2.{ord(n)}")], [objects.slice_port("", 80)])
        )
        for n in ("a", "b")
    }
    engine = ServicesEngine(NODE, CONFIG)
    engine.update(inputs, eps, inputs, eps)
    assert engine.conflicts == ("default/b: address 198.51.100.7 . tcp . 80 is default/a's",)
    del inputs["default/a"]
    delta = engine.update(inputs, eps, ["default/a"], ())
    assert engine.conflicts == ()
    (added,) = [v for k, v in delta.after.elements["one-endpoint4"] if k.startswith("198.51.100.7 ")]
    assert added == "192.0.2.98 . 80"  # b's endpoint
    assert engine.table() == compile_table(inputs.values(), eps.values(), NODE, CONFIG)


def test_an_allow_list_change_recompiles_only_the_services_with_external_addresses() -> None:
    services, slices = _cluster(200)
    lb = Service.from_object(
        objects.service("lb", ["fd00:96::ffff"], [objects.port("http", 80, target=8080)], lb_ips=["2001:db8:ee::7"])
    )
    lb_slice = EndpointSlice.from_object(
        objects.endpoint_slice(
            "lb", [objects.endpoint("2001:db8:10::ff:1", "node-b")], [objects.slice_port("http", 8080)]
        )
    )
    services[lb.key], slices[lb_slice.key] = lb, lb_slice
    engine = ServicesEngine(NODE, CONFIG)  # the allow-list holds 198.51.100.0/25 only: lb is not translated
    engine.update(services, slices, services, slices)
    before = engine.table()
    assert not any(k.startswith("2001:db8:ee::7 ") for e in before.elements.values() for k, _ in e)
    allow = AllowList.build([AnnouncePool("public", (ipaddress.ip_network("2001:db8:ee::/64"),))])
    delta = engine.update(services, slices, (), (), allow=allow)
    assert delta.services == 1  # lb alone
    after = compile_table(services.values(), slices.values(), NODE, attrs.evolve(CONFIG, allow=allow))
    assert engine.table() == after and engine.config.allow == allow
    assert any(k.startswith("2001:db8:ee::7 ") for e in after.elements.values() for k, _ in e)
    assert apply_text(before, delta.script()) == as_text(after)
