"""The fake API server's lists and WatchList against kube-apiserver 1.32's rules, over real HTTP.

Each rule names where the real server makes it: ``validation.go``
(apimachinery's ListOptions validation), ``cacher.go`` (``shouldDelegateList``:
which lists the watch cache answers, whole), ``etcd3/store.go`` and
``storage/continue.go`` (pages, continue tokens, compaction).
"""

from __future__ import annotations

import base64
import http.client
import json
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from flock.apiserver import PODS, ApiServer, pod_object
from flock.apiserver._status import EXPIRED_LIST, INCONSISTENT_CONTINUE

WATCH_LIST = {"watch": "1", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"}


def request(api: ApiServer, path: str, **query: str) -> tuple[int, Any]:
    """One GET; the decoded body (a list of lines' objects for a watch)."""
    host, port = urllib.parse.urlsplit(api.url).netloc.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path + ("?" + urllib.parse.urlencode(query) if query else ""))
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    if query.get("watch") and resp.status == 200:
        return resp.status, [json.loads(line) for line in body.splitlines() if line.strip()]
    return resp.status, json.loads(body)


def pods(api: ApiServer, **query: str) -> dict[str, Any]:
    status, body = request(api, "/api/v1/pods", **query)
    assert status == 200, body
    return body


def names(body: dict[str, Any]) -> list[str]:
    return [f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in body["items"]]


def fill(api: ApiServer, count: int) -> None:
    for i in range(count):
        ns = "abc"[i % 3]
        api.create(PODS, pod_object(ns, f"p{i:02d}", f"n{i % 2}", labels={"gen": "1"}))


def token(value: str) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    return decoded


def test_pages_cover_every_object_once_at_the_first_pages_version() -> None:
    """etcd pages by key at the first page's revision: a pod created between pages is not
    listed, one deleted or changed between pages is listed as it was."""
    with ApiServer() as api:
        fill(api, 25)
        first = pods(api, limit="10")
        rv = first["metadata"]["resourceVersion"]
        assert len(first["items"]) == 10 and first["metadata"]["remainingItemCount"] == 15
        assert token(first["metadata"]["continue"]) == {"v": "meta.k8s.io/v1", "rv": int(rv), "start": "b/p01\x00"}
        snapshot = sorted(f"{'abc'[i % 3]}/p{i:02d}" for i in range(25))
        assert names(first) == snapshot[:10]  # etcd's key order: namespace/name

        api.create(PODS, pod_object("c", "p99", "n0"))  # after the page's key: still not listed
        api.delete(PODS, "p23", "c")  # not listed yet: listed as it was
        api.patch(PODS, "p02", {"metadata": {"labels": {"gen": "2"}}}, "c")
        seen, body = list(names(first)), first
        while body["metadata"].get("continue"):
            body = pods(api, limit="10", **{"continue": body["metadata"]["continue"]})
            assert body["metadata"]["resourceVersion"] == rv
            seen += names(body)
            labels = {o["metadata"]["name"]: o["metadata"]["labels"]["gen"] for o in body["items"]}
            assert labels.get("p02", "1") == "1"
        assert seen == snapshot
        assert "remainingItemCount" not in body["metadata"] and "continue" not in body["metadata"]


def test_a_namespaces_pages_and_a_field_selectors() -> None:
    with ApiServer() as api:
        fill(api, 12)
        status, body = request(api, "/api/v1/namespaces/b/pods", limit="3")
        assert status == 200 and len(body["items"]) == 3 and body["metadata"]["remainingItemCount"] == 1
        assert token(body["metadata"]["continue"])["start"] == "p07\x00"  # relative to the namespace's prefix
        status, rest = request(
            api, "/api/v1/namespaces/b/pods", limit="3", **{"continue": body["metadata"]["continue"]}
        )
        assert [o["metadata"]["name"] for o in rest["items"]] == ["p10"]

        # A selector: a page is filled by matching objects; no remainingItemCount (it would be a guess).
        on_n1 = pods(api, limit="4", fieldSelector="spec.nodeName=n1")
        assert [o["spec"]["nodeName"] for o in on_n1["items"]] == ["n1"] * 4
        assert "remainingItemCount" not in on_n1["metadata"]
        rest = pods(api, limit="4", fieldSelector="spec.nodeName=n1", **{"continue": on_n1["metadata"]["continue"]})
        assert len(on_n1["items"]) + len(rest["items"]) == 6


def test_one_nodes_pages_from_the_node_index_are_as_of_the_first_page() -> None:
    """Pods moved onto the node or off it between pages: listed as they were at the first page."""
    with ApiServer() as api:
        for i in range(8):
            api.create(PODS, pod_object("a", f"p{i}", "n1" if i % 2 else "n2"))
        first = pods(api, limit="2", fieldSelector="spec.nodeName=n1")
        assert names(first) == ["a/p1", "a/p3"]
        for name, node in (("p4", "n1"), ("p5", "n2")):  # p4 arrives on n1, p5 leaves it
            api.delete(PODS, name, "a")
            api.create(PODS, pod_object("a", name, node))
        rest = pods(api, limit="2", fieldSelector="spec.nodeName=n1", **{"continue": first["metadata"]["continue"]})
        assert names(rest) == ["a/p5", "a/p7"] and "continue" not in rest["metadata"]
        assert names(pods(api, fieldSelector="spec.nodeName=n1")) == ["a/p1", "a/p3", "a/p4", "a/p7"]


def test_an_expired_continue_is_410_with_a_token_for_the_rest_at_the_latest_version() -> None:
    with ApiServer() as api:
        fill(api, 6)
        first = pods(api, limit="2")
        api.create(PODS, pod_object("c", "p99", "n0"))
        api.compact()
        status, body = request(api, "/api/v1/pods", limit="2", **{"continue": first["metadata"]["continue"]})
        assert (status, body["reason"], body["code"], body["message"]) == (410, "Expired", 410, INCONSISTENT_CONTINUE)
        inconsistent = body["metadata"]["continue"]
        assert token(inconsistent) == {"v": "meta.k8s.io/v1", "rv": -1, "start": "a/p03\x00"}
        rest, latest = [], str(api.store.resource_version)
        body = pods(api, limit="2", **{"continue": inconsistent})
        while True:
            assert body["metadata"]["resourceVersion"] == latest
            rest += names(body)
            if not body["metadata"].get("continue"):
                break
            body = pods(api, limit="2", **{"continue": body["metadata"]["continue"]})
        assert rest == ["b/p01", "b/p04", "c/p02", "c/p05", "c/p99"]  # the new pod too: inconsistent


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"resourceVersion": "3"}, "specifying resource version is not allowed when using continue"),
        ({"continue": "bm90IGpzb24"}, "invalid continue token: continue key is not valid"),
        ({"continue": "e30"}, "invalid continue token: continue key is not valid: server does not recognize"),
    ],
)
def test_bad_continues_are_400(query: dict[str, str], message: str) -> None:
    with ApiServer() as api:
        fill(api, 3)
        page = pods(api, limit="1")
        status, body = request(api, "/api/v1/pods", limit="1", **{"continue": page["metadata"]["continue"], **query})
        assert (status, body["reason"]) == (400, "BadRequest") and body["message"].startswith(message)
        # resourceVersion=0 with a continue is allowed (and ignored).
        assert pods(api, limit="1", resourceVersion="0", **{"continue": page["metadata"]["continue"]})["items"]


def test_the_watch_cache_answers_lists_at_0_whole_unless_it_pages_snapshots() -> None:
    with ApiServer() as api:
        fill(api, 7)
        whole = pods(api, limit="2", resourceVersion="0")  # hasLimit := Limit > 0 && resourceVersion != "0"
        assert len(whole["items"]) == 7 and "continue" not in whole["metadata"]
        assert len(pods(api, resourceVersion="3")["items"]) == 7  # not older than 3, no limit: the cache
        assert len(pods(api, limit="2", resourceVersionMatch="NotOlderThan", resourceVersion="0")["items"]) == 7
        assert len(pods(api, limit="2")["items"]) == 2  # "" with a limit: etcd pages
        assert len(pods(api)["items"]) == 7
    with ApiServer(paged_cache_lists=True) as api:
        fill(api, 7)
        page = pods(api, limit="2", resourceVersion="0")
        assert len(page["items"]) == 2 and page["metadata"]["continue"]


def test_exact_and_not_older_than() -> None:
    with ApiServer(resource_version_wait=0.05) as api:
        fill(api, 4)
        rv = api.store.resource_version
        api.create(PODS, pod_object("a", "new", "n0"))
        api.delete(PODS, "p01", "b")
        api.patch(PODS, "p00", {"metadata": {"labels": {"gen": "2"}}}, "a")
        then = ["a/p00", "a/p03", "b/p01", "c/p02"]
        for query in ({"resourceVersionMatch": "Exact"}, {"limit": "10"}):  # Exact, and the legacy exact read
            exact = pods(api, resourceVersion=str(rv), **query)
            assert names(exact) == then and exact["metadata"]["resourceVersion"] == str(rv)
            assert exact["items"][0]["metadata"]["labels"]["gen"] == "1"
        latest = pods(api, resourceVersion=str(rv), resourceVersionMatch="NotOlderThan")
        assert names(latest) == ["a/new", "a/p00", "a/p03", "c/p02"]
        assert latest["metadata"]["resourceVersion"] == str(api.store.resource_version)

        future = str(api.store.resource_version + 5)
        for query in ({}, {"resourceVersionMatch": "NotOlderThan"}, {"resourceVersionMatch": "Exact"}, {"limit": "1"}):
            status, body = request(api, "/api/v1/pods", resourceVersion=future, **query)
            assert (status, body["reason"]) == (504, "Timeout")
            assert (
                body["message"]
                == f"Timeout: Too large resource version: {future}, current: {api.store.resource_version}"
            )
            assert body["details"]["causes"] == [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ]

        api.compact()
        status, body = request(api, "/api/v1/pods", resourceVersion=str(rv), resourceVersionMatch="Exact")
        assert (status, body["reason"], body["message"]) == (410, "Expired", EXPIRED_LIST)
        assert len(pods(api, resourceVersion=str(rv))["items"]) == 4  # not older than: still fine


@pytest.mark.parametrize(
    ("query", "errors"),
    [
        (
            {"resourceVersionMatch": "NotOlderThan"},
            [
                (
                    "resourceVersionMatch",
                    "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
                )
            ],
        ),
        (
            {"resourceVersion": "0", "resourceVersionMatch": "Exact"},
            [("resourceVersionMatch", 'Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion "0"')],
        ),
        (
            {"resourceVersion": "1", "resourceVersionMatch": "Newest"},
            [
                (
                    "resourceVersionMatch",
                    'Unsupported value: "Newest": supported values: "Exact", "NotOlderThan", ""',
                )
            ],
        ),
        ({"sendInitialEvents": "true"}, [("sendInitialEvents", "Forbidden: sendInitialEvents is forbidden for list")]),
        (
            {"resourceVersionMatch": "Exact", "sendInitialEvents": "false"},
            [
                (
                    "resourceVersionMatch",
                    "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
                ),
                ("sendInitialEvents", "Forbidden: sendInitialEvents is forbidden for list"),
            ],
        ),
    ],
)
def test_invalid_list_options_are_422_as_validation_go(query: dict[str, str], errors: list[tuple[str, str]]) -> None:
    with ApiServer() as api:
        status, body = request(api, "/api/v1/pods", **query)
    listed = [f"{field}: {message}" for field, message in errors]
    shown = listed[0] if len(listed) == 1 else "[" + ", ".join(listed) + "]"
    assert (status, body["reason"], body["code"]) == (422, "Invalid", 422)
    assert body["message"] == f'ListOptions.meta.k8s.io "" is invalid: {shown}'
    assert body["details"]["group"] == "meta.k8s.io" and body["details"]["kind"] == "ListOptions"
    assert [(c["field"], c["message"]) for c in body["details"]["causes"]] == errors


# ---- WatchList ------------------------------------------------------------------


def stream(api: ApiServer, path: str, **query: str) -> Iterator[dict[str, Any]]:
    """The events of one watch, read as they come (the connection closed when dropped)."""
    host, port = urllib.parse.urlsplit(api.url).netloc.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path + "?" + urllib.parse.urlencode(query))
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        while line := resp.readline():
            yield json.loads(line)
    finally:
        conn.close()


def is_end(event: dict[str, Any]) -> bool:
    annotations = event["object"]["metadata"].get("annotations") or {}
    return event["type"] == "BOOKMARK" and annotations == {"k8s.io/initial-events-end": "true"}


def test_watch_list_initial_events_their_bookmark_then_changes() -> None:
    with ApiServer() as api:
        fill(api, 5)
        rv = api.store.resource_version
        events = stream(api, "/api/v1/pods", **WATCH_LIST, allowWatchBookmarks="true", timeoutSeconds="10")
        initial = [next(events) for _ in range(6)]
        assert [e["type"] for e in initial] == ["ADDED"] * 5 + ["BOOKMARK"] and is_end(initial[-1])
        assert initial[-1]["object"]["metadata"]["resourceVersion"] == str(rv)
        assert initial[-1]["object"]["kind"] == "Pod" and initial[-1]["object"]["apiVersion"] == "v1"
        assert sorted(e["object"]["metadata"]["name"] for e in initial[:5]) == [f"p{i:02d}" for i in range(5)]
        api.patch(PODS, "p01", {"metadata": {"labels": {"gen": "2"}}}, "b")
        changed = next(events)
        assert changed["type"] == "MODIFIED" and changed["object"]["metadata"]["resourceVersion"] == str(rv + 1)
        events.close()


def test_watch_list_variants() -> None:
    with ApiServer(resource_version_wait=0.05) as api:
        fill(api, 3)
        rv = api.store.resource_version
        # Without allowWatchBookmarks: the initial events, no bookmark (the cacher's isListWatchRequest).
        status, events = request(api, "/api/v1/pods", **WATCH_LIST, timeoutSeconds="0.1")
        assert status == 200 and [e["type"] for e in events] == ["ADDED"] * 3
        # SetListOptionsDefaults: a watch from "0" (or "") is a WatchList when the gate is on.
        status, events = request(
            api, "/api/v1/pods", watch="1", resourceVersion="0", allowWatchBookmarks="1", timeoutSeconds="0.1"
        )
        assert [e["type"] for e in events[:4]] == ["ADDED"] * 3 + ["BOOKMARK"] and is_end(events[3])
        # A version compacted away is fine: not older than it.
        api.compact()
        status, events = request(api, "/api/v1/pods", **WATCH_LIST, resourceVersion="1", timeoutSeconds="0.1")
        assert [e["type"] for e in events] == ["ADDED"] * 3
        # sendInitialEvents=false: from now on, nothing initial.
        query = {**WATCH_LIST, "sendInitialEvents": "false", "timeoutSeconds": "0.1"}
        assert request(api, "/api/v1/pods", **query) == (200, [])
        # A version the server has not reached: the watch cache waits, then ends the stream with the 504.
        status, events = request(api, "/api/v1/pods", **WATCH_LIST, resourceVersion=str(rv + 9), timeoutSeconds="1")
        assert status == 200 and [e["type"] for e in events] == ["ERROR"]
        assert (events[0]["object"]["code"], events[0]["object"]["reason"]) == (504, "Timeout")
        assert events[0]["object"]["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"


@pytest.mark.parametrize(
    ("query", "errors"),
    [
        (
            {"sendInitialEvents": "true"},
            [
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
            ],
        ),
        (
            {"resourceVersion": "5", "resourceVersionMatch": "NotOlderThan"},
            [
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless "
                "sendInitialEvents is provided"
            ],
        ),
        (
            {"sendInitialEvents": "true", "resourceVersionMatch": "Exact"},
            [
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                'resourceVersionMatch: Unsupported value: "Exact": supported values: "NotOlderThan"',
            ],
        ),
    ],
)
def test_invalid_watch_options_are_422(query: dict[str, str], errors: list[str]) -> None:
    with ApiServer() as api:
        status, body = request(api, "/api/v1/pods", watch="1", allowWatchBookmarks="true", **query)
    shown = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    assert (status, body["reason"]) == (422, "Invalid")
    assert body["message"] == f'ListOptions.meta.k8s.io "" is invalid: {shown}'


def test_without_the_watch_list_gate_send_initial_events_is_refused() -> None:
    with ApiServer(watch_list=False) as api:
        fill(api, 2)
        status, body = request(api, "/api/v1/pods", **WATCH_LIST, allowWatchBookmarks="true")
        assert (status, body["reason"]) == (422, "Invalid")
        assert body["message"] == (
            'ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: '
            "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
        )
        # The legacy watch from "0": the objects as ADDED, no annotated bookmark.
        status, events = request(api, "/api/v1/pods", watch="1", resourceVersion="0", timeoutSeconds="0.1")
        assert [e["type"] for e in events] == ["ADDED", "ADDED"]
