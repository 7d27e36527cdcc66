"""How an informer reads a whole collection, in virtual time against the fake API
server's store (flock.testing.StoreSource: the same rules as over HTTP).

WatchList first; paged lists when the server refuses it; an expired continue
token relists from the start with a consistent read, after a random spread;
and what the informer keeps of each object is a value, never the object.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from flock.apiserver import PODS, ApiServer, ObjectStore, pod_object
from flock.model import PodInfo
from flock.nursery import Backoff
from flock.policy import PolicyPod
from flock.testing import StoreSource, serving
from flock.watchers import InformerSettings, ListOptions, ListPage, PodWatcher, open_kube_client
from flock.watchers._values import PodRecord, PodTransform, Shared

NODE = "host001"
SETTINGS = InformerSettings(
    watch_seconds=60, request_seconds=5, page_size=500, relist_spread=2.0, backoff=Backoff(jitter=0.0)
)


def fill(store: ObjectStore, count: int, *, node_every: int = 10) -> None:
    for i in range(count):
        node = NODE if i % node_every == 0 else f"host{i % 7 + 2:03d}"
        store.create(PODS, pod_object(f"ns{i % 3}", f"web-{i:05d}", node, labels={"app": f"web{i % 5}"}))


def want(store: ObjectStore) -> dict[str, tuple[PolicyPod, PodInfo | None]]:
    """Every pod as a policy value (no resourceVersion kept), with its PodInfo where it is bound to this node."""
    out: dict[str, tuple[PolicyPod, PodInfo | None]] = {}
    for obj in store.list(PODS)[0]:
        meta = obj["metadata"]
        local = obj["spec"].get("nodeName") == NODE
        policy = attrs.evolve(PolicyPod.from_object(obj), resource_version="")
        out[f"{meta['namespace']}/{meta['name']}"] = (policy, PodInfo.from_object(obj) if local else None)
    return out


def cached(watcher: PodWatcher) -> dict[str, tuple[PolicyPod, PodInfo | None]]:
    return {key: (record.policy, record.local) for key, record in watcher.informer.objects.items()}


def cluster_watcher(source: StoreSource, settings: InformerSettings = SETTINGS) -> PodWatcher:
    return PodWatcher(source, NODE, settings)


async def test_watch_list_reads_the_collection_without_a_list(autojump_clock: trio.abc.Clock) -> None:
    store = ObjectStore()
    fill(store, 1200)
    source = StoreSource(store, PODS)
    watcher = cluster_watcher(source)
    with trio.fail_after(60):
        async with serving(watcher):
            assert source.list_requests == [] and source.lists == 0
            assert source.watch_requests == [("", True)]  # a consistent WatchList, then its watch goes on
            assert watcher.informer.uses_watch_list
            assert cached(watcher) == want(store)
            assert len(watcher.pods) == 120
            store.create(PODS, pod_object("ns0", "late", NODE))
            with watcher.subscribe() as changes:
                await changes.receive()
            assert cached(watcher) == want(store)
            assert source.watch_requests == [("", True)]  # the change came on the same stream


async def test_refused_watch_list_falls_back_to_paged_lists(autojump_clock: trio.abc.Clock) -> None:
    store = ObjectStore()
    fill(store, 1200)
    # A server without WatchList whose watch cache pages (1.33's snapshots).
    source = StoreSource(store, PODS, watch_list=False, paged_cache_lists=True)
    watcher = cluster_watcher(source)
    with trio.fail_after(60):
        async with serving(watcher):
            assert not watcher.informer.uses_watch_list
            assert cached(watcher) == want(store)
            requests = source.list_requests
            # The first page from the watch cache ("0"), the rest by continue token alone.
            assert requests[0] == ListOptions("0", limit=500)
            assert [(r.resource_version, r.resource_version_match, r.limit) for r in requests[1:]] == [
                ("", "", 500)
            ] * 2
            assert all(r.continue_ for r in requests[1:])
            rv = watcher.informer.resource_version
            assert source.watch_requests == [("", True), (rv, False)]


async def test_a_cache_that_does_not_page_answers_whole_and_is_read_item_by_item(
    autojump_clock: trio.abc.Clock,
) -> None:
    store = ObjectStore()
    fill(store, 1200)
    source = StoreSource(store, PODS, watch_list=False)  # 1.32: a list at "0" ignores limit
    watcher = cluster_watcher(source)
    with trio.fail_after(60):
        async with serving(watcher):
            assert source.list_requests == [ListOptions("0", limit=500)]
            assert cached(watcher) == want(store)


@attrs.define(eq=False)
class CompactsAfterFirstPage(StoreSource):
    """The store's history is compacted (past the list's version) right after the first page."""

    compacted: bool = False
    compacted_at: float = 0.0

    async def list(self, options: ListOptions | None = None, on_item: Any = None) -> Any:
        page = await super().list(options, on_item)  # type: ignore[arg-type]
        if not self.compacted and isinstance(page, ListPage) and page.continue_:
            self.compacted = True
            self.compacted_at = trio.current_time()
            self.store.create(PODS, pod_object("ns0", "between-pages", NODE))
            self.store.compact()
        return page


async def test_expired_continue_relists_from_the_start_consistently_after_a_spread(
    autojump_clock: trio.abc.Clock,
) -> None:
    store = ObjectStore()
    fill(store, 1200)
    source = CompactsAfterFirstPage(store, PODS, watch_list=False, paged_cache_lists=True)
    watcher = attrs.evolve(cluster_watcher(source), settings=SETTINGS)
    watcher.informer.rng.seed(7)
    spread = random.Random(7).random() * SETTINGS.relist_spread
    with trio.fail_after(60):
        async with serving(watcher):
            requests = source.list_requests
            # page 1 at "0", page 2's token expired (410), then a consistent list from the start.
            assert requests[0] == ListOptions("0", limit=500)
            assert requests[1].continue_ and requests[2] == ListOptions(limit=500)
            assert [r.continue_ != "" for r in requests[2:]] == [False, True, True]
            assert cached(watcher) == want(store)
            assert "ns0/between-pages" in watcher.pods
            # The relist waited its random share of relist_spread (5,000 agents get the 410 at once).
            assert trio.current_time() - source.compacted_at == pytest.approx(spread)


async def test_relist_without_cause_never_happens_by_default(autojump_clock: trio.abc.Clock) -> None:
    assert InformerSettings().relist_seconds == float("inf")
    store = ObjectStore()
    fill(store, 20)
    source = StoreSource(store, PODS, watch_list=False)
    watcher = cluster_watcher(source, attrs.evolve(SETTINGS, relist_seconds=float("inf")))
    with trio.fail_after(10_000):
        async with serving(watcher):
            await trio.sleep(5000)  # watches end every 60 s and resume from the last version
            assert len(source.list_requests) == 1
            assert len(source.watch_requests) > 50


async def test_a_relist_reads_the_watch_cache_at_the_version_seen(autojump_clock: trio.abc.Clock) -> None:
    store = ObjectStore()
    fill(store, 20)
    source = StoreSource(store, PODS, watch_list=False)
    watcher = cluster_watcher(source, attrs.evolve(SETTINGS, relist_seconds=100))
    with trio.fail_after(1000):
        async with serving(watcher):
            rv = watcher.informer.resource_version
            await trio.sleep(150)
            # Not older than what was seen, no limit: the watch cache answers, etcd is not asked.
            assert source.list_requests[1] == ListOptions(rv, "NotOlderThan")


@attrs.define(eq=False)
class IgnoresSendInitialEvents(StoreSource):
    """A server from before WatchList: the parameter is dropped, the watch starts where it says."""

    def watch(self, resource_version: str, timeout_seconds: int, *, send_initial_events: bool = False) -> Any:
        return super().watch(resource_version or str(self.store.resource_version), timeout_seconds)


async def test_a_server_ignoring_send_initial_events_is_read_with_lists(autojump_clock: trio.abc.Clock) -> None:
    store = ObjectStore()
    fill(store, 30)
    source = IgnoresSendInitialEvents(store, PODS, bookmark_seconds=1.0)
    watcher = cluster_watcher(source)
    with trio.fail_after(60):
        async with serving(watcher):
            assert not watcher.informer.uses_watch_list
            assert source.list_requests == [ListOptions("0", limit=500)]
            assert cached(watcher) == want(store)


def test_the_transform_keeps_values_and_shares_what_repeats() -> None:
    transform = PodTransform(NODE)
    labels = {"app": "web", "pod-template-hash": "7d9f8c6b5"}

    def pod(name: str, node: str) -> dict[str, Any]:
        obj = pod_object("shop", name, node, labels=dict(labels), annotations={"team": "a"})
        obj["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
        obj["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": 8080}]
        obj["spec"]["containers"][0]["env"] = [{"name": "SECRET_TOKEN", "value": "hunter2"}]
        obj["status"] = {"phase": "Running", "podIPs": [{"ip": "2001:db8::1"}]}
        return obj

    here, there = transform(pod("a", NODE)), transform(pod("b", "host002"))
    assert isinstance(here, PodRecord) and isinstance(there, PodRecord)
    assert isinstance(there.policy, PolicyPod) and there.local is None  # a remote pod: its policy value alone
    assert isinstance(here.local, PodInfo) and here.local.annotations == {"team": "a"}
    # One label set and one port set for every pod that has them; no resourceVersion kept.
    assert isinstance(here.policy, PolicyPod)
    assert here.policy.labels is there.policy.labels
    assert here.policy.named_ports is there.policy.named_ports
    assert here.policy.resource_version == there.policy.resource_version == ""
    # Nothing of the object beyond what flock reads: no env, no managedFields anywhere in the value.
    assert "hunter2" not in repr(here) and "managedFields" not in repr(here) and "kubelet" not in repr(here)
    # A status update that changes nothing flock reads is no change.
    again = pod("b", "host002")
    again["metadata"]["resourceVersion"] = "999"
    again["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    assert transform(again) == there


def test_shared_values_are_dropped_once_nothing_else_holds_them() -> None:
    shared = Shared(prune_from=4)
    kept = [shared(("app", f"v{i}")) for i in range(3)]
    for i in range(3):
        shared(("tmp", f"v{i}"))  # held by no one once the call returns
    assert len(shared) == 6
    assert shared.prune() == 3 and len(shared) == 3
    assert all(shared(("app", f"v{i}")) is kept[i] for i in range(3))


@pytest.mark.parametrize("refuse", [True, False])
async def test_every_read_ends_equal_to_the_store_under_churn(autojump_clock: trio.abc.Clock, refuse: bool) -> None:
    store = ObjectStore()
    fill(store, 700)
    rng = random.Random(3)
    source = StoreSource(store, PODS, watch_list=not refuse, paged_cache_lists=True, bookmark_seconds=1.0)
    watcher = cluster_watcher(source)
    churn: Callable[[], None]

    def churn() -> None:
        name = f"web-{rng.randrange(700):05d}"
        ns = f"ns{int(name[4:]) % 3}"
        try:
            if rng.random() < 0.3:
                store.delete(PODS, name, ns)
            else:
                obj: Mapping[str, Any] = store.get(PODS, name, ns)
                store.patch(PODS, name, {"metadata": {"labels": {"app": f"web{rng.randrange(9)}"}}}, ns)
                del obj
        except Exception:  # already deleted
            store.create(PODS, pod_object(ns, name, NODE))

    with trio.fail_after(600):
        async with serving(watcher):
            for _ in range(50):
                churn()
                await trio.sleep(0.5)
            store.compact(expire_watches=True)  # every watch gets 410: relist
            for _ in range(50):
                churn()
                await trio.sleep(0.5)
            await trio.sleep(30)
            assert cached(watcher) == want(store)


async def test_a_watch_410_relists_from_the_watch_cache_at_the_version_seen(autojump_clock: trio.abc.Clock) -> None:
    store = ObjectStore()
    fill(store, 20)
    source = StoreSource(store, PODS, watch_list=False)
    watcher = cluster_watcher(source)
    with trio.fail_after(100):
        async with serving(watcher):
            seen = watcher.informer.resource_version
            store.compact(expire_watches=True)  # the open watch gets its 410
            await trio.sleep(SETTINGS.relist_spread + 1)
            # client-go's rule: only a list's own 410 (or a reset) needs a consistent read from etcd.
            assert source.list_requests[1:] == [ListOptions(seen, "NotOlderThan")]
            assert cached(watcher) == want(store)


async def test_a_rerun_informer_reports_started_again(autojump_clock: trio.abc.Clock) -> None:
    """A supervisor restarts a crashed child by calling run() on the same object."""
    store = ObjectStore()
    fill(store, 20)
    for watch_list in (True, False):
        watcher = cluster_watcher(StoreSource(store, PODS, watch_list=watch_list))
        with trio.fail_after(60):
            for _ in range(2):
                async with trio.open_nursery() as nursery:
                    await nursery.start(watcher.run)
                    nursery.cancel_scope.cancel()
        assert cached(watcher) == want(store)


async def test_a_bug_behind_a_list_item_propagates_instead_of_being_retried(tmp_path: Path) -> None:
    """Only the body's decoding is the API server's fault; what the caller raises is its own."""
    with trio.fail_after(30), ApiServer() as api:
        api.create(PODS, pod_object("ns0", "web-0", NODE))
        async with open_kube_client(api.write_kubeconfig(tmp_path / "kc")) as kube:

            def broken(obj: object) -> None:
                raise ValueError("a bug in a listener")

            with pytest.raises(ValueError, match="a bug in a listener"):
                await kube.all_pods().list(ListOptions("0", limit=500), broken)
