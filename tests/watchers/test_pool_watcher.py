"""The pool watcher (virtual time, over the fake API server's store): LoadBalancerPools and the
namespaces' labels become the service proxy's allow-list; a pool the model refuses allows nothing;
the CRD missing counts as no pools, and installing it later is noticed."""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

import trio

from flock.apiserver import ObjectStore
from flock.apiserver._resources import LOADBALANCERPOOLS, NAMESPACES
from flock.nursery import Backoff
from flock.services import KINDS, POOLS, AllowList, ServiceInputs
from flock.services import Service as ServiceValue
from flock.testing import StoreSource
from flock.testing.services import port, service
from flock.watchers import InformerSettings, PoolWatcher

SETTINGS = InformerSettings(
    watch_seconds=60, request_seconds=5, relist_seconds=600, backoff=Backoff(jitter=0.0), watch_list=False
)


def pool(name: str, *cidrs: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "flock.fritzlab.net/v1alpha1",
        "kind": "LoadBalancerPool",
        "metadata": {"name": name},
        "spec": {"blocks": [{"cidr": c} for c in cidrs], **spec},
    }


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def lb(name: str, ns: str = "default", labels: dict[str, str] | None = None) -> ServiceValue:
    raw = service(name, ["fd00:10:96::a"], [port("http", 80)], type="LoadBalancer", lb_ips=["2001:db8:ee::7"])
    raw["metadata"]["namespace"] = ns
    raw["metadata"]["labels"] = labels or {}
    return ServiceValue.from_object(raw)


ADDRESS = ipaddress.ip_address("2001:db8:ee::7")


async def changed(inputs: ServiceInputs, seen: int, within: float = 10) -> None:
    with trio.fail_after(within):
        await inputs.wait_generation(seen)


async def test_pools_and_namespace_labels_make_the_allow_list(autojump_clock):
    store = ObjectStore()
    inputs = ServiceInputs(required=frozenset((*KINDS, POOLS)))
    store.create(NAMESPACES, namespace("shop", tier="public"))
    store.create(NAMESPACES, namespace("lab"))
    store.create(
        LOADBALANCERPOOLS,
        pool(
            "public",
            "2001:db8:ee::/64",
            namespaceSelector={"matchLabels": {"tier": "public"}},
            communities=["64512:7", "64512:1:2"],
            localPreference=150,
        ),
    )
    w = PoolWatcher(StoreSource(store, LOADBALANCERPOOLS), StoreSource(store, NAMESPACES), inputs, SETTINGS)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await changed(inputs, 0)
        allow = inputs.allow
        (found,) = allow.pools
        assert found.name == "public" and found.local_preference == 150
        assert found.communities.standard == ((64512, 7),) and found.communities.large == ((64512, 1, 2),)
        assert allow.admits(lb("web", "shop"), ADDRESS)
        assert not allow.admits(lb("web", "lab"), ADDRESS)  # the namespace is not selected
        # the lab namespace gets the label: allowed there too, without a restart
        seen = inputs.generation
        labelled = store.get(NAMESPACES, "lab", None)
        labelled["metadata"]["labels"] = {"tier": "public"}
        store.update(NAMESPACES, labelled)
        await changed(inputs, seen)
        assert inputs.allow.admits(lb("web", "lab"), ADDRESS)
        # the pool disabled: nothing is allowed
        seen = inputs.generation
        disabled = store.get(LOADBALANCERPOOLS, "public", None)
        disabled["spec"]["disabled"] = True
        store.update(LOADBALANCERPOOLS, disabled)
        await changed(inputs, seen)
        assert not inputs.allow.admits(lb("web", "shop"), ADDRESS)
        nursery.cancel_scope.cancel()


async def test_namespace_labels_are_kept_only_while_a_pool_selects_namespaces(autojump_clock):
    store, inputs = ObjectStore(), ServiceInputs()
    store.create(NAMESPACES, namespace("shop", tier="public"))
    store.create(LOADBALANCERPOOLS, pool("all", "198.51.100.0/26"))
    w = PoolWatcher(StoreSource(store, LOADBALANCERPOOLS), StoreSource(store, NAMESPACES), inputs, SETTINGS)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await changed(inputs, 0)
        assert inputs.allow.namespaces == ()
        seen = inputs.generation
        ns = store.get(NAMESPACES, "shop", None)
        ns["metadata"]["labels"] = {"tier": "internal"}
        store.update(NAMESPACES, ns)
        await trio.sleep(5)
        assert inputs.generation == seen  # no pool selects namespaces: the proxy is not woken
        nursery.cancel_scope.cancel()


async def test_a_refused_pool_allows_nothing_and_is_named(autojump_clock, caplog):
    store, inputs = ObjectStore(), ServiceInputs()
    store.create(NAMESPACES, namespace("default"))
    # host bits: the CRD's schema would refuse it; the agent does not trust that it ran
    store.create(LOADBALANCERPOOLS, pool("bad", "2001:db8:ee::1/64"))
    store.create(LOADBALANCERPOOLS, pool("good", "198.51.100.0/26"))
    w = PoolWatcher(StoreSource(store, LOADBALANCERPOOLS), StoreSource(store, NAMESPACES), inputs, SETTINGS)
    with caplog.at_level(logging.ERROR, logger="flock.watchers"):
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await changed(inputs, 0)
            assert [p.name for p in inputs.allow.pools] == ["good"]
            assert not inputs.allow.admits(lb("web"), ADDRESS)
            assert list(w.refused) == ["bad"] and "spec.blocks[0].cidr" in w.refused["bad"]
            nursery.cancel_scope.cancel()
    (record,) = [r for r in caplog.records if "refused" in r.getMessage()]
    assert getattr(record, "field", "") == "spec.blocks[0].cidr"


async def test_without_the_crd_the_list_is_empty_and_installing_it_is_noticed(autojump_clock):
    store = ObjectStore()
    inputs = ServiceInputs(required=frozenset((*KINDS, POOLS)))
    store.uninstall(LOADBALANCERPOOLS)
    w = PoolWatcher(
        StoreSource(store, LOADBALANCERPOOLS), StoreSource(store, NAMESPACES), inputs, SETTINGS, crd_retry_seconds=60
    )
    async with trio.open_nursery() as nursery:
        with trio.fail_after(1):
            await nursery.start(w.run)  # at once: nothing else of the agent waits for it
        await changed(inputs, 0)
        # listed with nothing in it: the proxy is not held back (only --service-external-cidr allows)
        assert inputs.allow == AllowList() and w.refusals[POOLS].startswith("not served")
        store.install(LOADBALANCERPOOLS)
        store.create(LOADBALANCERPOOLS, pool("public", "2001:db8:ee::/64"))
        seen = inputs.generation
        await changed(inputs, seen, within=61)
        assert inputs.allow.admits(lb("web"), ADDRESS) and w.refusals == {}
        nursery.cancel_scope.cancel()


def test_the_flag_adds_a_pool_for_every_service() -> None:
    allow = AllowList().with_cidrs([ipaddress.ip_network("2001:db8:ee::/64")])
    assert allow.pool_for(lb("web", "anywhere", {"x": "y"}), ADDRESS).name == "service-external-cidrs"
    assert AllowList().with_cidrs([]) == AllowList()
