"""What the fake API server's watches send, counted: each real watch's events and bytes (as its
client receives them), and virtual watches, which must count exactly what real watches with the
same selectors receive for the same writes — without a connection each."""

from __future__ import annotations

import http.client
import json
import random
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from flock.apiserver import ADDRESSGROUPS, PODS, ApiServer, StatusError, pod_object

WATCH_LIST = {
    "watch": "1",
    "sendInitialEvents": "true",
    "resourceVersionMatch": "NotOlderThan",
    "allowWatchBookmarks": "true",
}
GROUP_LABEL = "flock.fritzlab.net/group"


def raw_stream(api: ApiServer, path: str, **query: str) -> Iterator[bytes]:
    """One watch's lines exactly as received (chunk framing removed by http.client)."""
    host, port = urllib.parse.urlsplit(api.url).netloc.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path + "?" + urllib.parse.urlencode(query), headers={"User-Agent": "traffic-test/1"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        while line := resp.readline():
            yield line
    finally:
        conn.close()


def call(api: ApiServer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    host, port = urllib.parse.urlsplit(api.url).netloc.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        data = None if body is None else json.dumps(body)
        conn.request(method, path, data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_each_watch_counts_the_lines_its_client_received() -> None:
    with ApiServer(bookmark_interval=3600) as api:
        for i in range(4):
            api.create(PODS, pod_object("a", f"p{i}", f"n{i % 2}", labels={"app": "x"}))
        lines = raw_stream(api, "/api/v1/pods", fieldSelector="spec.nodeName=n1", **WATCH_LIST)
        received = [next(lines) for _ in range(3)]  # p1, p3, the initial-events-end bookmark
        api.patch(PODS, "p1", {"metadata": {"labels": {"app": "y"}}}, "a")
        api.create(PODS, pod_object("a", "p9", "n0"))  # not this watch's
        api.delete(PODS, "p3", "a")
        received += [next(lines) for _ in range(2)]
        assert [json.loads(line)["type"] for line in received] == ["ADDED", "ADDED", "BOOKMARK", "MODIFIED", "DELETED"]
        (watch,) = [w for w in api.watch_traffic()["watches"] if w["open"]]
        assert watch == {
            "id": watch["id"],
            "resource": "pods",
            "namespace": None,
            "labelSelector": "",
            "fieldSelector": "spec.nodeName=n1",
            "userAgent": "traffic-test/1",
            "events": 5,
            "bytes": sum(len(line) for line in received),
            "open": True,
        }
        status, report = call(api, "GET", "/debug/flock/watches")
        assert status == 200 and report["totals"]["pods"] == {"watches": 1, "events": 5, "bytes": watch["bytes"]}
        lines.close()


def test_initial_bytes_are_what_a_watch_list_starts_with() -> None:
    with ApiServer(bookmark_interval=3600) as api:
        for i in range(5):
            api.create(PODS, pod_object("a", f"p{i}", "n1", labels={"app": "xy"[i % 2]}))
        events, size = api.initial_bytes("pods", label_selector="app=x")
        lines = raw_stream(api, "/api/v1/pods", labelSelector="app=x", **WATCH_LIST)
        received = [next(lines) for _ in range(events)]
        assert json.loads(received[-1])["type"] == "BOOKMARK" and events == 4
        assert sum(len(line) for line in received) == size
        lines.close()
        status, body = call(api, "GET", "/debug/flock/initial-bytes?resource=pods&labelSelector=app%3Dx")
        assert status == 200 and body == {"events": events, "bytes": size}


# ---- virtual watches equal real ones ------------------------------------------------------------

NODES, APPS, NAMESPACES = ("n0", "n1", "n2"), ("x", "y", "z"), ("a", "b")
# (namespace, fieldSelector, labelSelector): indexed by field, by label, by namespace, and not at all.
SELECTIONS = [
    (None, "", ""),
    (None, "spec.nodeName=n1", ""),
    (None, "spec.nodeName=n2", "app in (x,y)"),
    (None, "", "app in (x,z)"),
    (None, "", "app=y,tier!=db"),
    (None, "", "!tier"),
    (None, "", "app notin (x),tier"),
    ("a", "", ""),
    ("b", "", "app=z"),
    (None, "metadata.name=p3", ""),
    (None, "spec.nodeName!=n0", "tier in (web)"),
]


def random_labels(rng: random.Random) -> dict[str, str]:
    labels = {"app": rng.choice(APPS)}
    if rng.random() < 0.6:
        labels["tier"] = rng.choice(("web", "db"))
    return labels


def random_writes(api: ApiServer, rng: random.Random, count: int) -> None:
    """Creates, relabels (objects entering and leaving selections), annotations and deletes."""
    present = {p["metadata"]["name"]: p["metadata"]["namespace"] for p in api.list(PODS)}
    for i in range(count):
        op = rng.random()
        if not present or op < 0.3:
            name, ns = f"p{rng.randrange(12)}", rng.choice(NAMESPACES)
            if name in present:
                continue
            api.create(PODS, pod_object(ns, name, rng.choice(NODES), labels=random_labels(rng)))
            present[name] = ns
        elif op < 0.65:
            name = rng.choice(sorted(present))
            api.patch(PODS, name, {"metadata": {"labels": random_labels(rng) | {"tier": None}}}, present[name])
        elif op < 0.8:
            name = rng.choice(sorted(present))
            api.patch(PODS, name, {"metadata": {"annotations": {"i": str(i)}}}, present[name])
        else:
            name = rng.choice(sorted(present))
            api.delete(PODS, name, present.pop(name))


@pytest.mark.parametrize("seed", range(8))
def test_virtual_watches_count_what_real_watches_with_the_same_selectors_receive(seed: int) -> None:
    rng = random.Random(seed)
    with ApiServer(bookmark_interval=3600) as api:
        random_writes(api, rng, 15)  # a cluster before the watches start: initial events
        streams, virtual = [], []
        for ns, fields, labels in SELECTIONS:
            path = f"/api/v1/namespaces/{ns}/pods" if ns else "/api/v1/pods"
            query = {"fieldSelector": fields, "labelSelector": labels} | WATCH_LIST
            events, _ = api.initial_bytes("pods", ns, labels, fields)
            lines = raw_stream(api, path, **query)
            initial = [next(lines) for _ in range(events)]  # read: the watch has started
            streams.append((lines, initial))
            virtual.append(
                api.virtual_watches.add(
                    "pods", namespace=ns, label_selector=labels, field_selector=fields, count=3, initial_events=True
                )
            )
        random_writes(api, rng, 60)
        totals = api.virtual_watches.totals()["pods"]
        assert totals["watches"] == 3 * len(SELECTIONS)
        assert totals["events"] == 3 * sum(v.events for v in virtual)
        assert totals["bytes"] == 3 * sum(v.bytes for v in virtual)
        for (lines, received), watch, selection in zip(streams, virtual, SELECTIONS, strict=True):
            received += [next(lines) for _ in range(watch.events - len(received))]
            assert sum(len(line) for line in received) == watch.bytes, selection
            lines.close()
        served = {w["id"]: w for w in api.watch_traffic()["watches"]}
        # Nothing more was written to any real watch than its virtual twin counted.
        assert sorted((w["events"], w["bytes"]) for w in served.values()) == sorted(
            (v.events, v.bytes) for v in virtual
        )


def test_a_rewatch_counts_the_objects_it_gains_or_a_whole_watch_list() -> None:
    with ApiServer() as api:
        for group in ("g1", "g2", "g3"):
            for n in range(2):
                api.create(
                    ADDRESSGROUPS,
                    {
                        "kind": "AddressGroup",
                        "metadata": {"name": f"{group}-{n}", "labels": {GROUP_LABEL: group}},
                        "group": group,
                        "members": [{"namespace": "a", "name": f"p{i}"} for i in range(n + 1)],
                    },
                )
        agent = api.virtual_watches.add("addressgroups", label_selector=f"{GROUP_LABEL} in (g1)", count=10)
        assert (agent.events, agent.bytes) == (0, 0)
        events, size = agent.rewatch(label_selector=f"{GROUP_LABEL} in (g1,g2)")
        g2_events, g2_bytes = api.initial_bytes("addressgroups", label_selector=f"{GROUP_LABEL}=g2")
        assert events == g2_events - 1 == 2  # g2's two slices, no bookmark
        end = g2_bytes - size  # what the bookmark line weighs
        api.patch(ADDRESSGROUPS, "g3-0", {"members": []})  # not the agent's
        api.patch(ADDRESSGROUPS, "g2-1", {"members": []})  # now the agent's
        assert agent.events == 3
        whole = agent.rewatch(label_selector=f"{GROUP_LABEL} in (g3)", initial_events="all")
        assert whole == api.initial_bytes("addressgroups", label_selector=f"{GROUP_LABEL}=g3")
        assert agent.rewatch(label_selector=f"{GROUP_LABEL}=g1", initial_events="none") == (0, 0)
        assert api.virtual_watches.totals()["addressgroups"]["events"] == 10 * agent.events
        assert end > 0
        with pytest.raises(StatusError) as exc:
            agent.rewatch(label_selector="in (")
        assert exc.value.code == 400
        agent.close()
        api.patch(ADDRESSGROUPS, "g1-0", {"members": []})
        assert api.virtual_watches.totals()["addressgroups"]["watches"] == 0
        assert api.virtual_watches.totals()["addressgroups"]["events"] == 10 * agent.events


def test_virtual_watches_over_http() -> None:
    with ApiServer() as api:
        for i in range(4):
            api.create(PODS, pod_object("a", f"p{i}", f"n{i}"))
        agents = [{"resource": "pods", "fieldSelector": f"spec.nodeName=n{i}"} for i in range(4)]
        status, body = call(api, "POST", "/debug/flock/virtual-watches", agents)
        assert status == 201 and len(body["ids"]) == 4
        status, body = call(
            api, "POST", "/debug/flock/virtual-watches", {"resource": "pods", "count": 4, "initialEvents": True}
        )
        assert status == 201
        api.patch(PODS, "p2", {"metadata": {"labels": {"a": "b"}}}, "a")
        status, body = call(api, "GET", "/debug/flock/virtual-watches?watches=true")
        line = len(json.dumps({"type": "MODIFIED", "object": api.get(PODS, "p2", "a")}, separators=(",", ":"))) + 1
        initial = api.initial_bytes("pods")
        assert body["count"] == 5
        assert body["totals"]["pods"]["watches"] == 8
        assert body["totals"]["pods"]["events"] == 1 + 4 * (initial[0] + 1)
        per_watch = {w["fieldSelector"]: w for w in body["watches"]}
        assert per_watch["spec.nodeName=n2"]["bytes"] == line and per_watch["spec.nodeName=n0"]["events"] == 0
        watch_id = per_watch["spec.nodeName=n0"]["id"]
        status, body = call(
            api, "POST", f"/debug/flock/virtual-watches/{watch_id}/rewatch", {"fieldSelector": "spec.nodeName=n2"}
        )
        assert status == 200 and body == {"events": 1, "bytes": line - len("MODIFIED") + len("ADDED")}
        status, body = call(api, "DELETE", f"/debug/flock/virtual-watches/{watch_id}")
        assert status == 200
        status, body = call(api, "POST", "/debug/flock/virtual-watches", {"resource": "nope"})
        assert status == 404
        status, body = call(api, "POST", "/debug/flock/virtual-watches", {"resource": "pods", "labelSelector": "a in"})
        assert status == 400 and body["message"].startswith("unable to parse requirement")
        status, body = call(api, "DELETE", "/debug/flock/virtual-watches")
        assert status == 200 and body == {"removed": 4}
        assert api.virtual_watches.totals() == {}
