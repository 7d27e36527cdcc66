"""Informer timing and the ADD-versus-informer race, in virtual time.

The informers read the fake API server's store directly (flock.testing.StoreSource,
the same store the HTTP server serves), so autojump_clock never jumps over a
pending socket read.  Times asserted are exact virtual times.
"""

from __future__ import annotations

import contextlib
import logging
import random

import attrs
import pytest
import trio

from flock.apiserver import NODECONFIGS, PODS, DeleteOptions, ObjectStore, nodeconfig_object, pod_object
from flock.nursery import Backoff
from flock.testing import StoreSource, serving
from flock.watchers import ChangeType, InformerSettings, ListPage, NodeConfigWatcher, PodWatcher

NODE = "host001"
# List+watch (the reads themselves, WatchList included, are tests/watchers/test_reads.py's).
SETTINGS = InformerSettings(
    watch_seconds=60, request_seconds=5, relist_seconds=600, backoff=Backoff(jitter=0.0), watch_list=False
)


def pod_watcher(store: ObjectStore) -> tuple[PodWatcher, StoreSource]:
    source = StoreSource(store, PODS, f"spec.nodeName={NODE}")
    return PodWatcher(source, NODE, SETTINGS), source


def cache_matches(store: ObjectStore, watcher: PodWatcher) -> None:
    items, _ = store.list(PODS)
    want = {
        f"{o['metadata']['namespace']}/{o['metadata']['name']}": o["metadata"]["resourceVersion"]
        for o in items
        if o["spec"].get("nodeName") == NODE
    }
    assert {k: p.resource_version for k, p in watcher.pods.items()} == want
    # The informer keeps values (a PodRecord a pod), never the objects.
    assert {k: r.local.resource_version for k, r in watcher.informer.objects.items() if r.local} == want


async def test_pod_arriving_after_wait_starts_is_returned_the_moment_it_arrives(autojump_clock: trio.abc.Clock) -> None:
    store = ObjectStore()
    watcher, source = pod_watcher(store)
    with trio.fail_after(30):
        async with serving(watcher) as nursery:
            start = trio.current_time()

            async def scheduler() -> None:
                await trio.sleep(1.0)
                store.create(PODS, pod_object("web", "web-0", NODE, annotations={"flock.fritzlab.net/ipv4": "true"}))

            nursery.start_soon(scheduler)
            pod = await watcher.lookup("web", "web-0")
            assert trio.current_time() - start == 1.0
            assert pod is not None and pod.key == "web/web-0"
            assert pod.annotations == {"flock.fritzlab.net/ipv4": "true"}
            assert source.gets == []  # served by the watch, no direct GET


async def test_cached_pod_is_returned_without_waiting(autojump_clock: trio.abc.Clock) -> None:
    store = ObjectStore()
    store.create(PODS, pod_object("web", "web-0", NODE))
    watcher, _ = pod_watcher(store)
    with trio.fail_after(30):
        async with serving(watcher):
            start = trio.current_time()
            pod = await watcher.wait_for_pod("web", "web-0")
            assert pod.name == "web-0" and trio.current_time() == start


async def test_pod_never_delivered_times_out_then_one_direct_get(autojump_clock: trio.abc.Clock) -> None:
    store = ObjectStore()
    # Not on this node as far as the watch is concerned: the informer never sees it.
    store.create(PODS, pod_object("web", "elsewhere", "host002"))
    watcher, source = pod_watcher(store)
    with trio.fail_after(30):
        async with serving(watcher):
            start = trio.current_time()
            assert await watcher.lookup("web", "missing") is None
            assert trio.current_time() - start == 3.0
            assert source.gets == [("web", "missing")]
            pod = await watcher.lookup("web", "elsewhere")
            assert pod is not None and pod.node_name == "host002"
            assert trio.current_time() - start == 6.0
            assert source.gets == [("web", "missing"), ("web", "elsewhere")]


async def test_caller_deadline_bounds_wait_for_pod(autojump_clock: trio.abc.Clock) -> None:
    watcher, _ = pod_watcher(ObjectStore())
    with trio.fail_after(30):
        async with serving(watcher):
            start = trio.current_time()
            with trio.move_on_after(2.5) as scope:
                await watcher.wait_for_pod("web", "web-0")
            assert scope.cancelled_caught and trio.current_time() - start == 2.5
            assert watcher._waiters == {}  # the abandoned wait left nothing behind


async def test_pod_bound_to_this_node_later_arrives_as_added(autojump_clock: trio.abc.Clock) -> None:
    store = ObjectStore()
    created = store.create(PODS, pod_object("web", "web-0"))  # not scheduled yet
    watcher, _ = pod_watcher(store)
    with trio.fail_after(30):
        async with serving(watcher):
            with watcher.subscribe() as changes:
                created["spec"]["nodeName"] = NODE
                store.update(PODS, created)
                change = await changes.receive()
                assert (change.type, change.pod.key) == (ChangeType.ADDED, "web/web-0")
                store.delete(PODS, "web-0", "web")
                change = await changes.receive()
                assert (change.type, change.pod.key) == (ChangeType.DELETED, "web/web-0")
            cache_matches(store, watcher)


async def test_terminating_pod_stays_until_removed(autojump_clock: trio.abc.Clock) -> None:
    """A graceful delete only marks the pod (deletionTimestamp): it keeps its sandbox and addresses
    until the kubelet's CNI DEL, so the agent keeps it cached (its policy value too) until DELETED."""
    store = ObjectStore()
    store.create(PODS, pod_object("web", "web-0", NODE))
    store.set_status(PODS, "web-0", {"phase": "Running", "podIPs": [{"ip": "2001:db8:0:1::5"}]}, "web")
    watcher, _ = pod_watcher(store)
    with trio.fail_after(30):
        async with serving(watcher):
            with watcher.subscribe() as changes:
                store.delete(PODS, "web-0", "web", DeleteOptions(5))
                change = await changes.receive()
                assert (change.type, change.pod.key) == (ChangeType.MODIFIED, "web/web-0")
                assert watcher.get("web", "web-0") is not None
                (record,) = watcher.informer.objects.values()
                assert [str(a) for a in record.policy.addresses] == ["2001:db8:0:1::5"]
                store.delete(PODS, "web-0", "web", DeleteOptions(0))
                change = await changes.receive()
                assert (change.type, change.pod.key) == (ChangeType.DELETED, "web/web-0")
            assert watcher.get("web", "web-0") is None


async def test_410_mid_stream_relists_and_emits_only_the_differences(autojump_clock: trio.abc.Clock) -> None:
    store = ObjectStore()
    for i in range(3):
        store.create(PODS, pod_object("ns", f"p{i}", NODE))
    watcher, _ = pod_watcher(store)
    with trio.fail_after(30):
        async with serving(watcher):
            with watcher.subscribe() as changes:
                # While nobody watches, history moves on and is compacted away.
                store.compact(expire_watches=True)
                store.delete(PODS, "p0", "ns")
                p1 = store.get(PODS, "p1", "ns")
                p1["metadata"]["annotations"] = {"x": "y"}
                store.update(PODS, p1)
                store.create(PODS, pod_object("ns", "p3", NODE))
                seen = set()
                while len(seen) < 3:
                    change = await changes.receive()
                    seen.add((change.type, change.pod.name))
                await trio.sleep(1)
                assert seen == {(ChangeType.DELETED, "p0"), (ChangeType.MODIFIED, "p1"), (ChangeType.ADDED, "p3")}
                with pytest.raises(trio.WouldBlock):
                    changes.receive_nowait()  # p2 unchanged: no event for it
            cache_matches(store, watcher)


async def test_transient_list_failures_back_off_exponentially(autojump_clock: trio.abc.Clock) -> None:
    store = ObjectStore()
    watcher, source = pod_watcher(store)
    source.fail_lists = 3
    with trio.fail_after(30):
        start = trio.current_time()
        async with serving(watcher):
            # 0.5 + 1.0 + 2.0 (no jitter in SETTINGS) before the fourth list succeeds.
            assert trio.current_time() - start == 3.5


async def test_watches_ending_at_once_back_off_instead_of_spinning(autojump_clock: trio.abc.Clock) -> None:
    watcher, source = pod_watcher(ObjectStore())
    source.watch_seconds_cap = 0
    with trio.fail_after(30):
        async with serving(watcher):
            await trio.sleep(10)
            # Opened at 0, 0.5, 1.5, 3.5 and 7.5: backing off 0.5, 1, 2, 4 s.
            assert source.watches == 5


def test_backoff_grows_caps_and_jitters() -> None:
    b = Backoff(initial=0.5, cap=30.0, factor=2.0, jitter=0.2)
    assert [b.delay(n, 0.5) for n in range(8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert b.delay(0, 0.0) == pytest.approx(0.4) and b.delay(0, 0.999999) == pytest.approx(0.6)
    rng = random.Random(1)
    assert len({b.delay(3, rng.random()) for _ in range(10)}) == 10


async def test_watch_timeouts_resume_without_relisting_until_the_relist_bound(autojump_clock: trio.abc.Clock) -> None:
    store = ObjectStore()
    watcher, source = pod_watcher(store)
    with trio.fail_after(2000):
        async with serving(watcher):
            await trio.sleep(599)  # watches end every 60 s and resume from the last version
            assert source.lists == 1
            await trio.sleep(2)  # past relist_seconds=600: the next watch round lists again
            assert source.lists == 2


async def test_nodeconfig_invalid_update_keeps_previous_value(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    store = ObjectStore()
    store.create(NODECONFIGS, nodeconfig_object("other", "2001:db8:0:2::/64"))
    watcher = NodeConfigWatcher(StoreSource(store, NODECONFIGS, f"metadata.name={NODE}"), NODE, SETTINGS)
    with trio.fail_after(30):
        async with serving(watcher) as nursery:
            assert watcher.current is None

            async def operator() -> None:
                await trio.sleep(2)
                store.create(NODECONFIGS, nodeconfig_object(NODE, "2001:db8:0:1::/64"))

            nursery.start_soon(operator)
            first = await watcher.wait_changed()
            assert str(first.cidr6) == "2001:db8:0:1::/64" and trio.current_time() == 2.0

            bad = store.get(NODECONFIGS, NODE)
            bad["spec"]["cidr6"] = "not-a-cidr"
            with caplog.at_level(logging.ERROR, logger="flock.watchers"):
                store.update(NODECONFIGS, bad)
                await trio.sleep(1)
            assert watcher.current == first
            assert watcher.invalid is not None and watcher.invalid.field == "spec.cidr6"
            record = next(r for r in caplog.records if r.levelno == logging.ERROR)
            assert record.field == "spec.cidr6" and record.value == "'not-a-cidr'"  # type: ignore[attr-defined]

            good = store.get(NODECONFIGS, NODE)
            good["spec"]["cidr6"] = "2001:db8:0:9::/64"
            store.update(NODECONFIGS, good)
            second = await watcher.wait_changed(first)
            assert str(second.cidr6) == "2001:db8:0:9::/64" and watcher.invalid is None

            values = watcher.values()
            assert await values.__anext__() == second
            await values.aclose()


async def test_api_server_restarted_empty_is_relisted_and_a_lost_nodeconfig_noticed(
    autojump_clock: trio.abc.Clock,
) -> None:
    store = ObjectStore()
    store.create(NODECONFIGS, nodeconfig_object(NODE, "2001:db8:0:1::/64"))
    for i in range(5):
        store.create(PODS, pod_object("web", f"web-{i}", NODE))  # resourceVersions well past a fresh store's
    source = StoreSource(store, NODECONFIGS, f"metadata.name={NODE}")
    # The defaults, not the tests' fast settings: the bound must hold as deployed.
    watcher = NodeConfigWatcher(source, NODE)
    with trio.fail_after(600):
        async with serving(watcher):
            await watcher.wait_changed()
            assert not watcher.deleted and source.lists == 1
            await trio.sleep(100)  # a quiet watch, then the API server comes back empty
            restarted = trio.current_time()
            source.restart_server()
            await watcher.wait_deleted(True)
            assert trio.current_time() - restarted < 30 and source.lists == 2
            assert watcher.current is not None  # the last one stays in force for existing pods
            # And back: recreated on the new server, noticed through the new watch.
            source.store.create(NODECONFIGS, nodeconfig_object(NODE, "2001:db8:0:1::/64"))
            await watcher.wait_deleted(False)
            assert trio.current_time() - restarted < 31


async def test_api_server_down_for_long_is_relisted_within_30_s_of_coming_back(autojump_clock: trio.abc.Clock) -> None:
    store = ObjectStore()
    store.create(NODECONFIGS, nodeconfig_object(NODE, "2001:db8:0:1::/64"))
    for i in range(5):
        store.create(PODS, pod_object("web", f"web-{i}", NODE))
    source = StoreSource(store, NODECONFIGS, f"metadata.name={NODE}")
    watcher = NodeConfigWatcher(source, NODE)
    with trio.fail_after(3000):
        async with serving(watcher):
            await watcher.wait_changed()
            source.fail_lists = 10**6  # every list fails while it is away...
            source.restart_server()  # ...which it is, for a long time: backoff reaches its cap
            await trio.sleep(1000)
            assert not watcher.deleted
            back = trio.current_time()
            source.fail_lists = 0
            await watcher.wait_deleted(True)
            assert trio.current_time() - back <= 24  # the capped backoff (20 s + 20 % jitter)


async def test_a_server_whose_history_is_behind_ours_is_relisted(autojump_clock: trio.abc.Clock) -> None:
    store = ObjectStore()
    for i in range(5):
        store.create(PODS, pod_object("web", f"web-{i}", NODE))
    watcher, source = pod_watcher(store)
    with trio.fail_after(200):
        async with serving(watcher):
            assert source.lists == 1 and len(watcher.pods) == 5
            fresh = ObjectStore()  # restored from an old backup: versions start over, web-0 only
            fresh.create(PODS, pod_object("web", "web-0", NODE))
            source.store = fresh  # swapped under an open watch, without a connection reset
            # The open watch ends (60 s); resuming is refused as too new: relist, within relist_spread.
            await trio.sleep(60 + SETTINGS.relist_spread + 1)
            assert source.lists == 2 and set(watcher.pods) == {"web/web-0"}


@attrs.define(eq=False)
class ReplayingSource:
    """A source whose watch sends an event older than its list (a reset history)."""

    lists: int = 0

    async def list(self, options, on_item):
        await trio.lowlevel.checkpoint()
        self.lists += 1
        obj = pod_object("web", "web-0", NODE)
        obj["metadata"]["resourceVersion"] = "50" if self.lists == 1 else "3"
        on_item(obj)
        return ListPage(obj["metadata"]["resourceVersion"])

    @contextlib.asynccontextmanager
    async def watch(self, resource_version, timeout_seconds, *, send_initial_events=False):
        async def events():
            if self.lists == 1:
                old = pod_object("web", "web-1", NODE)
                old["metadata"]["resourceVersion"] = "7"
                yield {"type": "ADDED", "object": old}
            await trio.sleep(timeout_seconds)

        async with contextlib.aclosing(events()) as stream:
            yield stream

    async def get(self, namespace, name):
        return None


async def test_an_event_older_than_the_cache_means_a_reset_history_and_relists(autojump_clock: trio.abc.Clock) -> None:
    source = ReplayingSource()
    watcher = PodWatcher(source, NODE, SETTINGS)
    with trio.fail_after(60):
        async with serving(watcher):
            await trio.sleep(SETTINGS.relist_spread + 1)  # the relist comes within relist_spread
            assert source.lists == 2 and set(watcher.pods) == {"web/web-0"}
            assert watcher.informer.resource_version == "3"
