"""Graceful deletion of pods (flock.apiserver._deletion), as kube-apiserver's BeforeDelete with the
pod strategy: the grace each DELETE gives, the mark, the shortening, the final removal, and what
watches see of it."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from flock.apiserver import PODS, SERVICES, DeleteOptions, ObjectStore, StatusError, pod_object
from flock.apiserver._deletion import delete_pod, pod_grace
from flock.apiserver._selectors import FieldSelector

NOW = datetime.datetime(2025, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


def _pod(node: str = "node1", **spec: Any) -> dict[str, Any]:
    obj = pod_object("shop", "web-1", node)
    obj["spec"].update(spec)
    obj["metadata"]["generation"] = 1
    return obj


@pytest.mark.parametrize(
    ("pod", "asked", "grace"),
    [
        (_pod(), None, 30),  # the default terminationGracePeriodSeconds
        (_pod(terminationGracePeriodSeconds=5), None, 5),  # the pod's own
        (_pod(terminationGracePeriodSeconds=5), 2, 2),  # the request's wins
        (_pod(terminationGracePeriodSeconds=5), 60, 60),  # longer too, on a first delete
        (_pod(terminationGracePeriodSeconds=5), -3, 1),  # negative: 1 s
        (_pod(""), 10, 0),  # never scheduled: at once
        ({**_pod(), "status": {"phase": "Succeeded"}}, 10, 0),  # ended: at once
        ({**_pod(), "status": {"phase": "Failed"}}, None, 0),
    ],
)
def test_the_grace_a_delete_gives(pod: dict[str, Any], asked: int | None, grace: int) -> None:
    assert pod_grace(pod, DeleteOptions(asked)) == grace


def test_a_bound_pod_is_marked_then_removed_by_grace_zero() -> None:
    marked = delete_pod(_pod(terminationGracePeriodSeconds=5), DeleteOptions(), NOW)
    assert not marked.remove and marked.changed
    meta = marked.obj["metadata"]
    assert meta["deletionTimestamp"] == "2025-01-02T03:04:10Z" and meta["deletionGracePeriodSeconds"] == 5
    assert meta["generation"] == 2  # BeforeDelete bumps a set generation
    # Deleting again without a grace (kubectl delete twice) keeps what runs, as does a longer one.
    for asked in (None, 5, 30):
        again = delete_pod(marked.obj, DeleteOptions(asked), NOW)
        assert not again.remove and not again.changed and again.obj["metadata"]["deletionGracePeriodSeconds"] == 5
    # A shorter grace moves the deadline earlier by the difference.
    shorter = delete_pod(marked.obj, DeleteOptions(2), NOW)
    assert not shorter.remove and shorter.changed
    assert shorter.obj["metadata"]["deletionTimestamp"] == "2025-01-02T03:04:07Z"
    # The kubelet's final DELETE: gone, its last state carrying grace 0.
    final = delete_pod(shorter.obj, DeleteOptions(0), NOW)
    assert final.remove and final.obj["metadata"]["deletionGracePeriodSeconds"] == 0


def test_grace_zero_or_unbound_removes_at_once() -> None:
    assert delete_pod(_pod(), DeleteOptions(0), NOW).remove
    assert delete_pod(_pod(""), DeleteOptions(), NOW).remove
    # Marked with no grace left (a delete stopped between its two steps): finished by any delete.
    stuck = _pod()
    stuck["metadata"].update(deletionTimestamp="2025-01-02T03:04:05Z", deletionGracePeriodSeconds=0)
    assert delete_pod(stuck, DeleteOptions(), NOW).remove


def test_delete_options_from_body_else_query() -> None:
    assert DeleteOptions.from_request({"gracePeriodSeconds": 3}, {"gracePeriodSeconds": "9"}) == DeleteOptions(3)
    # kubectl's body without a grace: the pod's own (the query is read only without a body).
    assert DeleteOptions.from_request({"propagationPolicy": "Background"}, {}) == DeleteOptions(None)
    assert DeleteOptions.from_request(None, {"gracePeriodSeconds": "0"}) == DeleteOptions(0)
    assert DeleteOptions.from_request(None, {}) == DeleteOptions(None)
    for body, query in (({"gracePeriodSeconds": "3"}, {}), (None, {"gracePeriodSeconds": "soon"})):
        with pytest.raises(StatusError) as exc:
            DeleteOptions.from_request(body, query)
        assert exc.value.code == 400


def test_store_watch_sees_modified_then_deleted() -> None:
    store = ObjectStore()
    events: list[tuple[str, dict[str, Any]]] = []
    sub = store.watch(PODS, None, FieldSelector(), lambda ev: events.append((ev.type, ev.decode()["object"])))
    created = store.create(PODS, _pod(terminationGracePeriodSeconds=2))
    assert "deletionTimestamp" not in created["metadata"]
    marked = store.delete(PODS, "web-1", "shop", DeleteOptions())
    assert marked["metadata"]["deletionGracePeriodSeconds"] == 2
    assert store.get(PODS, "web-1", "shop")["metadata"]["deletionTimestamp"] == marked["metadata"]["deletionTimestamp"]
    # An update can neither clear nor move the mark.
    patched = store.patch(PODS, "web-1", {"metadata": {"deletionTimestamp": None, "labels": {"a": "b"}}}, "shop")
    assert patched["metadata"]["deletionTimestamp"] == marked["metadata"]["deletionTimestamp"]
    # Deleting again changes nothing: no event.
    store.delete(PODS, "web-1", "shop", DeleteOptions())
    store.delete(PODS, "web-1", "shop", DeleteOptions(0))
    with pytest.raises(StatusError):
        store.get(PODS, "web-1", "shop")
    sub.close()
    assert [t for t, _ in events] == ["ADDED", "MODIFIED", "MODIFIED", "DELETED"]
    assert events[-1][1]["metadata"]["deletionGracePeriodSeconds"] == 0
    # A new pod of that name is not being deleted, whatever its body says.
    body = _pod()
    body["metadata"].update(deletionTimestamp="2025-01-02T03:04:05Z", deletionGracePeriodSeconds=3)
    again = store.create(PODS, body)
    assert "deletionTimestamp" not in again["metadata"] and "deletionGracePeriodSeconds" not in again["metadata"]


def test_other_kinds_and_direct_deletes_are_immediate() -> None:
    store = ObjectStore()
    store.create(PODS, _pod())
    store.delete(PODS, "web-1", "shop")  # a test's direct delete (no DeleteOptions): at once
    with pytest.raises(StatusError):
        store.get(PODS, "web-1", "shop")
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"ports": [{"port": 80}]},
    }
    store.create(SERVICES, svc)
    store.delete(SERVICES, "web", "shop", DeleteOptions(30))
    with pytest.raises(StatusError):
        store.get(SERVICES, "web", "shop")


def test_generate_name_makes_a_name() -> None:
    store = ObjectStore()
    body = pod_object("shop", "x")
    del body["metadata"]["name"]
    body["metadata"]["generateName"] = "web-"
    names = {store.create(PODS, body)["metadata"]["name"] for _ in range(20)}
    assert len(names) == 20 and all(n.startswith("web-") and len(n) == 9 for n in names)
    body["metadata"]["generateName"] = "x" * 70 + "-"
    assert len(store.create(PODS, body)["metadata"]["name"]) == 63
