"""Label selectors (apimachinery's ``labels.Parse`` and ``Requirement.Matches``) on the fake API
server's lists and watches over real HTTP, and the AddressGroup / NodeAddressGroups custom
resources (issue 35) served, selected and schema-checked."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flock.apiserver import ADDRESSGROUPS, NODEADDRESSGROUPS, PODS, ApiServer, StatusError, pod_object
from flock.apiserver._labels import LabelSelector, LabelSelectorError
from flock.apiserver._resources import CUSTOMRESOURCEDEFINITIONS

REPO = Path(__file__).resolve().parents[2]
GROUP_LABEL = "flock.fritzlab.net/group"


def request(api: ApiServer, path: str, **query: str) -> tuple[int, Any]:
    host, port = urllib.parse.urlsplit(api.url).netloc.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path + ("?" + urllib.parse.urlencode(query) if query else ""))
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    return resp.status, json.loads(body)


def stream(api: ApiServer, path: str, **query: str) -> Iterator[dict[str, Any]]:
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


def names(body: dict[str, Any]) -> list[str]:
    return [o["metadata"]["name"] for o in body["items"]]


# ---- parsing and matching ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "labels", "selected"),
    [
        ("", {}, True),
        ("app=web", {"app": "web"}, True),
        ("app==web", {"app": "db"}, False),
        ("app!=web", {}, True),  # a missing label passes the negations
        ("app!=web", {"app": "web"}, False),
        ("app in (web,db)", {"app": "db"}, True),
        ("app in (web,db)", {}, False),
        ("app notin (web,db)", {"app": "x"}, True),
        ("app notin (web,db)", {}, True),
        ("app", {"app": ""}, True),
        ("!app", {"app": ""}, False),
        ("!app", {"tier": "x"}, True),
        ("  app  in ( web , db ) ,  tier  ", {"app": "web", "tier": "x"}, True),
        ("app=web,tier=db", {"app": "web", "tier": "x"}, False),
        ("gen>3", {"gen": "4"}, True),
        ("gen>3", {"gen": "three"}, False),
        ("gen<3", {}, False),
        ("app=", {"app": ""}, True),  # an empty value
        ("app in ()", {"app": ""}, True),
        ("in in (notin)", {"in": "notin"}, True),  # keywords are identifiers where a key or value goes
        ("example.com/app=x", {"example.com/app": "x"}, True),
    ],
)
def test_selectors_parse_and_match_as_apimachinery(text: str, labels: dict[str, str], selected: bool) -> None:
    assert LabelSelector.parse(text).matches(labels) is selected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("app in (a", "unable to parse requirement: found '', expected: ',' or ')'"),
        ("app in a", "unable to parse requirement: found 'a' expected: '('"),
        ("a=b c", "found 'c', expected: ',' or 'end of string'"),
        (",a", "found ',', expected: !, identifier, or 'end of string'"),
        ("a,", "found '', expected: identifier after ','"),
        ("a (", "unable to parse requirement: found '(', expected: in, notin, =, ==, !=, gt, lt"),
        ("!a=b", "found '=', expected: ',' or 'end of string'"),
        ("-a=b", 'unable to parse requirement: <nil>: Invalid value: "-a": name part must consist of'),
        ("a/b/c", 'unable to parse requirement: <nil>: Invalid value: "a/b/c": a qualified name must'),
        ("a=-x", 'unable to parse requirement: values[0][a]: Invalid value: "-x": a valid label must be'),
        ("a>x", "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators"),
        ("a=" + "x" * 64, "must be no more than 63 characters"),
    ],
)
def test_bad_selectors_are_refused_with_upstreams_message(text: str, message: str) -> None:
    with pytest.raises(LabelSelectorError) as exc:
        LabelSelector.parse(text)
    assert str(exc.value).startswith(message) or message in str(exc.value)


# ---- lists and watches over HTTP -------------------------------------------------------------


def fill(api: ApiServer) -> None:
    for i in range(9):
        labels = {"app": "abc"[i % 3]}
        if i % 2:
            labels["tier"] = "web"
        api.create(PODS, pod_object("ns" + str(i % 2), f"p{i}", f"n{i % 3}", labels=labels))


def test_lists_select_by_label_and_field_and_page() -> None:
    with ApiServer() as api:
        fill(api)
        status, body = request(api, "/api/v1/pods", labelSelector="app in (a,b),!tier")
        assert status == 200 and sorted(names(body)) == ["p0", "p4", "p6"]
        status, body = request(api, "/api/v1/namespaces/ns1/pods", labelSelector="app notin (a)")
        assert sorted(names(body)) == ["p1", "p5", "p7"]
        status, body = request(api, "/api/v1/pods", labelSelector="tier=web", fieldSelector="spec.nodeName=n1")
        assert names(body) == ["p1", "p7"]
        # Paged: each page holds at most `limit` keys' worth, the selection applied to them (etcd's).
        seen, query = [], {"labelSelector": "app=a", "limit": "2"}
        while True:
            status, body = request(api, "/api/v1/pods", **query)
            assert status == 200 and len(body["items"]) <= 2
            assert "remainingItemCount" not in body["metadata"]  # never with a selector
            seen += names(body)
            if not body["metadata"].get("continue"):
                break
            query = {"labelSelector": "app=a", "limit": "2", "continue": body["metadata"]["continue"]}
        assert sorted(seen) == ["p0", "p3", "p6"]


def test_a_bad_label_selector_is_400() -> None:
    with ApiServer() as api:
        status, body = request(api, "/api/v1/pods", labelSelector="app in (a")
        assert status == 400 and body["reason"] == "BadRequest"
        assert body["message"] == "unable to parse requirement: found '', expected: ',' or ')'"
        status, body = request(api, "/api/v1/pods", watch="1", labelSelector="=x")
        assert status == 400 and "expected: !, identifier, or 'end of string'" in body["message"]


def test_watches_see_objects_enter_and_leave_a_label_selection() -> None:
    with ApiServer(bookmark_interval=3600) as api:
        fill(api)
        events = stream(
            api,
            "/api/v1/pods",
            watch="1",
            labelSelector="app=a,tier",
            sendInitialEvents="true",
            resourceVersionMatch="NotOlderThan",
            allowWatchBookmarks="true",
        )
        added, end = next(events), next(events)
        assert (added["type"], added["object"]["metadata"]["name"]) == ("ADDED", "p3")
        assert end["type"] == "BOOKMARK" and end["object"]["metadata"]["annotations"] == {
            "k8s.io/initial-events-end": "true"
        }
        api.patch(PODS, "p0", {"metadata": {"labels": {"tier": "db"}}}, "ns0")  # enters
        api.patch(PODS, "p0", {"metadata": {"annotations": {"x": "y"}}}, "ns0")  # stays
        api.patch(PODS, "p3", {"metadata": {"labels": {"app": "b"}}}, "ns1")  # leaves
        api.patch(PODS, "p4", {"metadata": {"labels": {"x": "1"}}}, "ns0")  # never in
        api.delete(PODS, "p0", "ns0")
        got = [next(events) for _ in range(4)]
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in got] == [
            ("ADDED", "p0"),
            ("MODIFIED", "p0"),
            ("DELETED", "p3"),
            ("DELETED", "p0"),
        ]
        assert got[2]["object"]["metadata"]["labels"]["app"] == "b"  # the object as it now is
        events.close()


# ---- AddressGroup and NodeAddressGroups ------------------------------------------------------


def address_group(group: str, n: int, members: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "flock.fritzlab.net/v1alpha1",
        "kind": "AddressGroup",
        "metadata": {"name": f"{group}-{n}", "labels": {GROUP_LABEL: group}},
        "group": group,
        "selection": {"podSelector": {"matchLabels": {"app": group}}},
        "members": members,
    }


MEMBER = {
    "namespace": "shop",
    "name": "web-0",
    "node": "n1",
    "labels": {"app": "web"},
    "ips": ["2001:db8::1", "10.0.0.1"],
    "ports": [{"name": "http", "protocol": "TCP", "port": 80}],
}


def install_crds(api: ApiServer) -> None:
    for doc in yaml.safe_load_all((REPO / "deploy" / "crd-addressgroups.yaml").read_text()):
        api.create(CUSTOMRESOURCEDEFINITIONS, doc)


def test_address_groups_are_selected_by_group_and_node_groups_by_name() -> None:
    with ApiServer() as api:
        install_crds(api)
        for group in ("g1", "g2", "g3"):
            for n in range(2):
                api.create(ADDRESSGROUPS, address_group(group, n, [MEMBER]))
        for node in ("n1", "n2"):
            api.create(
                NODEADDRESSGROUPS,
                {"kind": "NodeAddressGroups", "metadata": {"name": node}, "groups": ["g1", "g3"], "revision": 1},
            )
        path = "/apis/flock.fritzlab.net/v1alpha1/"
        status, body = request(api, path + "addressgroups", labelSelector=f"{GROUP_LABEL} in (g1,g3)")
        assert status == 200 and names(body) == ["g1-0", "g1-1", "g3-0", "g3-1"]
        assert body["items"][0]["members"] == [MEMBER]
        status, body = request(api, path + "nodeaddressgroups", fieldSelector="metadata.name=n2")
        assert status == 200 and names(body) == ["n2"] and body["items"][0]["groups"] == ["g1", "g3"]
        status, body = request(api, path + "addressgroups", fieldSelector="metadata.name=g2-1")
        assert names(body) == ["g2-1"]
        status, body = request(api, path + "loadbalancerpools", fieldSelector="metadata.name=x")
        assert status == 200 and body["items"] == []


@pytest.mark.parametrize(
    ("member", "field"),
    [
        ({**MEMBER, "ports": [{"port": 70000}]}, "members.0.ports.0.port"),
        ({**MEMBER, "ports": [{"port": 80, "protocol": "ICMP"}]}, "members.0.ports.0.protocol"),
        ({**MEMBER, "ips": ["a", "b", "c"]}, "members.0.ips"),
        ({"name": "web-0"}, "members.0"),  # no namespace
    ],
)
def test_the_address_group_schema_is_enforced_once_the_crd_is_stored(member: dict[str, Any], field: str) -> None:
    with ApiServer() as api:
        api.create(ADDRESSGROUPS, address_group("g1", 0, [member]))  # no CRD object: not checked
        install_crds(api)
        host, port = urllib.parse.urlsplit(api.url).netloc.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request(
            "POST",
            "/apis/flock.fritzlab.net/v1alpha1/addressgroups",
            json.dumps(address_group("g1", 1, [member])),
            {"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        body = json.loads(resp.read())
        conn.close()
        assert resp.status == 422 and body["reason"] == "Invalid", body
        assert any(c["field"].startswith(field) for c in body["details"]["causes"]), body


def test_a_nodes_groups_are_a_set() -> None:
    with ApiServer() as api:
        install_crds(api)
        with pytest.raises(StatusError) as exc:
            api.create(
                NODEADDRESSGROUPS, {"kind": "NodeAddressGroups", "metadata": {"name": "n1"}, "groups": ["g", "g"]}
            )
        assert exc.value.code == 422 and "Duplicate value" in exc.value.message


def test_address_groups_generation_counts_changes_of_their_top_level_fields() -> None:
    with ApiServer() as api:
        install_crds(api)
        created = api.create(ADDRESSGROUPS, address_group("g1", 0, [MEMBER]))
        assert created["metadata"]["generation"] == 1
        labelled = api.patch(ADDRESSGROUPS, "g1-0", {"metadata": {"labels": {"x": "y"}}})
        assert labelled["metadata"]["generation"] == 1
        emptied = api.patch(ADDRESSGROUPS, "g1-0", {"members": []})
        assert emptied["metadata"]["generation"] == 2
