"""StoreSource: the same list and WatchList rules as the HTTP server, in virtual time;
ObjectStore's bulk loader and the JSON-lines file the benchmark loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from flock.apiserver import NODECONFIGS, PODS, ObjectStore, StatusError, nodeconfig_object, pod_object
from flock.apiserver._server import load_objects
from flock.testing import StoreSource
from flock.watchers import (
    INITIAL_EVENTS_END,
    KubeApiError,
    ListOptions,
    ResourceExpired,
    ResourceVersionTooLarge,
)


def filled(count: int) -> ObjectStore:
    store = ObjectStore()
    for i in range(count):
        store.create(PODS, pod_object("ab"[i % 2], f"p{i:02d}", "n1"))
    return store


async def read_all(source: StoreSource, first: ListOptions) -> tuple[list[str], set[str]]:
    """Every page of a list: the names in order and the resourceVersions of the pages."""
    seen: list[dict[str, Any]] = []
    page = await source.list(first, seen.append)
    versions = {page.resource_version}
    while page.continue_:
        page = await source.list(ListOptions(limit=first.limit, continue_=page.continue_), seen.append)
        versions.add(page.resource_version)
    return [o["metadata"]["name"] for o in seen], versions


async def test_lists_page_as_the_server_does_and_are_recorded(autojump_clock: trio.abc.Clock) -> None:
    store = filled(7)
    source = StoreSource(store, PODS)
    with trio.fail_after(5):
        got, versions = await read_all(source, ListOptions(limit=3))
        assert got == ["p00", "p02", "p04", "p06", "p01", "p03", "p05"] and versions == {str(store.resource_version)}
        assert source.page_limits == [3, 3, 3] and source.lists == 3
        assert source.list_requests[1].continue_ and not source.list_requests[1].resource_version

        items: list[dict[str, Any]] = []
        page = await source.list(ListOptions("0", limit=3), items.append)  # the watch cache: whole
        assert len(items) == 7 and not page.continue_ and page.remaining_item_count is None
        paged = StoreSource(store, PODS, paged_cache_lists=True)
        page = await paged.list(ListOptions("0", limit=3), [].append)
        assert page.continue_ and page.remaining_item_count == 4


async def test_list_errors_are_the_watchers_errors(autojump_clock: trio.abc.Clock) -> None:
    store = filled(4)
    source = StoreSource(store, PODS)
    with trio.fail_after(10):
        page = await source.list(ListOptions(limit=1), [].append)
        store.create(PODS, pod_object("a", "later", "n1"))
        store.compact()  # the page's version is gone
        with pytest.raises(ResourceExpired, match="410 Expired: The provided continue parameter is too old"):
            await source.list(ListOptions(limit=1, continue_=page.continue_), [].append)
        with pytest.raises(KubeApiError, match="specifying resource version is not allowed") as bad:
            await source.list(ListOptions("3", limit=1, continue_=page.continue_), [].append)
        assert bad.value.status == 400
        with pytest.raises(KubeApiError) as invalid:
            await source.list(ListOptions(resource_version_match="Exact"), [].append)
        assert invalid.value.status == 422

        # Not older than a version the store has not reached: the watch cache waits 3 s, then 504.
        start = trio.current_time()
        future = str(store.resource_version + 1)
        with pytest.raises(ResourceVersionTooLarge):
            await source.list(ListOptions(future, "NotOlderThan"), [].append)
        assert trio.current_time() - start == pytest.approx(3.0)

        async def write_soon() -> None:
            await trio.sleep(1)
            store.create(PODS, pod_object("a", "late", "n1"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_soon)
            start = trio.current_time()
            items: list[dict[str, Any]] = []
            await source.list(ListOptions(future, "NotOlderThan"), items.append)
        assert 1.0 <= trio.current_time() - start < 1.1 and "late" in [o["metadata"]["name"] for o in items]


async def test_watch_list_in_virtual_time(autojump_clock: trio.abc.Clock) -> None:
    store = filled(3)
    source = StoreSource(store, PODS)
    rv = store.resource_version
    with trio.fail_after(10):
        async with source.watch("", 60, send_initial_events=True) as events:
            initial = [await events.__anext__() for _ in range(4)]
            assert [e["type"] for e in initial] == ["ADDED"] * 3 + ["BOOKMARK"]
            meta = initial[-1]["object"]["metadata"]
            assert meta == {"resourceVersion": str(rv), "annotations": {INITIAL_EVENTS_END: "true"}}
            store.delete(PODS, "p01", "b")
            event = await events.__anext__()
            assert event["type"] == "DELETED" and event["object"]["metadata"]["resourceVersion"] == str(rv + 1)
        assert source.watch_requests == [("", True)]

        refusing = StoreSource(store, PODS, watch_list=False)
        with pytest.raises(KubeApiError) as refused:
            async with refusing.watch("", 60, send_initial_events=True):
                pass
        assert refused.value.status == 422 and "WatchList feature gate" in refused.value.message

        # Not older than a version not reached: 3 s, then the stream's ERROR.
        async with source.watch(str(rv + 5), 60, send_initial_events=True) as events:
            assert [e["type"] async for e in events] == ["ERROR"]


async def test_a_label_selected_source_lists_and_watches_its_selection(autojump_clock: trio.abc.Clock) -> None:
    store = ObjectStore()
    for i in range(4):
        store.create(PODS, pod_object("a", f"p{i}", "n1", labels={"app": "xy"[i % 2]}))
    source = StoreSource(store, PODS, field_selector="spec.nodeName=n1", label_selector="app in (x)")
    with trio.fail_after(10):
        got, _ = await read_all(source, ListOptions())
        assert got == ["p0", "p2"]
        async with source.watch(str(store.resource_version), 60) as events:
            store.patch(PODS, "p1", {"metadata": {"labels": {"app": "x"}}}, "a")  # enters
            store.patch(PODS, "p0", {"metadata": {"labels": {"app": "y"}}}, "a")  # leaves
            seen = [await events.__anext__() for _ in range(2)]
            assert [(e["type"], e["object"]["metadata"]["name"]) for e in seen] == [("ADDED", "p1"), ("DELETED", "p0")]


def test_bulk_create_versions_keys_and_duplicates() -> None:
    store = ObjectStore()
    pods = [pod_object(f"ns{i % 3}", f"p{i:04d}", f"n{i % 5}") for i in range(2500)]
    assert store.bulk_create(PODS, pods) == 2500
    items, rv = store.list(PODS)
    assert rv == 2501 and len(items) == 2500
    keys = [f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in items]
    assert keys == sorted(keys)
    assert sorted(int(o["metadata"]["resourceVersion"]) for o in items) == list(range(2, 2502))
    assert all(o["metadata"]["uid"] and o["metadata"]["generation"] == 1 for o in items)
    with pytest.raises(StatusError) as exc:
        store.bulk_create(PODS, [pod_object("new", "q"), pod_object("ns0", "p0000")])
    assert exc.value.code == 409 and store.get(PODS, "q", "new")  # the ones before it were created


def test_loads_json_lines_and_json_files(tmp_path: Path) -> None:
    lines = tmp_path / "cluster.jsonl"
    with lines.open("w") as f:
        f.write(json.dumps(nodeconfig_object("n1")) + "\n")
        for i in range(3):
            f.write(json.dumps(pod_object("a", f"p{i}", "n1")) + "\n\n")
    store = ObjectStore()
    assert load_objects(store, lines) == 4
    assert len(store.list(PODS)[0]) == 3 and len(store.list(NODECONFIGS)[0]) == 1
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps({"kind": "List", "items": [pod_object("b", "q", "n1")]}, indent=2))
    assert load_objects(store, listed) == 1
    listed.write_text(json.dumps([{"kind": "StatefulSet", "metadata": {"name": "s"}}]))
    with pytest.raises(SystemExit, match=r"list\.json: cannot load object of kind 'StatefulSet'"):
        load_objects(store, listed)


def test_a_big_json_lines_file_is_prepared_on_worker_processes_in_order(tmp_path: Path) -> None:
    lines = tmp_path / "pods.jsonl"
    lines.write_text("".join(json.dumps(pod_object(f"ns{i % 7}", f"p{i:04d}", "n1")) + "\n" for i in range(2100)))
    store = ObjectStore()
    assert load_objects(store, lines, workers=2) == 2100
    items, rv = store.list(PODS)
    assert rv == 2101 and len(items) == 2100
    # In the file's order: the versions follow the lines.
    by_name = {o["metadata"]["name"]: int(o["metadata"]["resourceVersion"]) for o in items}
    assert [by_name[f"p{i:04d}"] for i in range(2100)] == list(range(2, 2102))
