"""The slice book: members stay in their slice, a burst is few writes, a resume writes only what changed,
the order keeps an agent from naming a group before its slices exist; and the wire format refuses what
it cannot read, by field."""

from __future__ import annotations

import ipaddress
import random

import attrs
import pytest

from flock.groups import SliceBook, Write, address_group, decode_members, decode_node_groups, slice_index
from flock.model import InvalidObject
from flock.policy import LabelSelector, NamedPort, PolicyPod, Protocol
from flock.policy._compile import PeerSelection
from flock.policy._groups import NamedSelection

SPEC = PeerSelection("x", None, LabelSelector((("app", "web"),)))


def pod(i: int, *, labels: dict[str, str] | None = None) -> PolicyPod:
    return PolicyPod(
        "x",
        f"p{i}",
        labels if labels is not None else {"app": "web"},
        (ipaddress.ip_address(f"2001:db8::{i:x}"),),
        (NamedPort("http", Protocol.TCP, 80),),
        node=f"n{i % 3}",
    )


def members(*ids: int) -> dict[str, PolicyPod]:
    return {p.key: p for p in map(pod, ids)}


def names(writes: list[Write]) -> list[tuple[str, str, bool]]:
    return [(w.kind, w.name, w.body is not None) for w in writes]


def test_a_group_is_cut_into_slices_and_a_change_rewrites_one() -> None:
    book = SliceBook(max_members=10)
    book.set_group("g", SPEC, members(*range(25)))
    book.set_node("n1", frozenset({"g"}))
    first = book.pending()
    assert names(first) == [
        ("AddressGroup", "g-0", True),
        ("AddressGroup", "g-1", True),
        ("AddressGroup", "g-2", True),
        ("NodeAddressGroups", "n1", True),
    ]
    assert sum(len(w.body["members"]) for w in first if w.kind == "AddressGroup") == 25  # type: ignore[index]
    # one member's address: its slice alone
    book.move("g", {"x/p13": attrs.evolve(pod(13), addresses=(ipaddress.ip_address("2001:db8::ff"),))})
    assert names(book.pending()) == [("AddressGroup", "g-1", True)]
    # a status-only difference (resourceVersion): nothing
    book.move("g", {"x/p3": attrs.evolve(pod(3), resource_version="7")})
    assert book.pending() == []


def test_a_burst_of_new_members_fills_the_slice_being_written() -> None:
    book = SliceBook(max_members=10)
    book.set_group("g", SPEC, members(*range(15)))
    book.pending()
    book.move("g", {"x/p2": None, "x/p12": None})  # room in both slices
    book.move("g", members(100, 101, 102))
    writes = book.pending()
    assert len(writes) == 2  # the two slices a member left; the newcomers went into one of them
    assert sum(len(w.body["members"]) for w in writes) == 16  # type: ignore[index]


def test_an_emptied_slice_is_deleted_after_the_nodes_lists_and_a_dropped_group_goes_whole() -> None:
    book = SliceBook(max_members=2)
    book.set_group("g", SPEC, members(1, 2, 3))
    book.set_node("n1", frozenset({"g"}))
    book.pending()
    book.move("g", {"x/p3": None})
    assert names(book.pending()) == [("AddressGroup", "g-1", False)]
    book.drop("g")
    book.set_node("n1", frozenset())
    assert names(book.pending()) == [("NodeAddressGroups", "n1", True), ("AddressGroup", "g-0", False)]
    book.forget_node("n1")
    assert names(book.pending()) == [("NodeAddressGroups", "n1", False)]


def test_a_resume_writes_only_what_changed_and_members_stay_where_they_were() -> None:
    before = SliceBook(max_members=10)
    before.set_group("g", SPEC, members(*range(25)))
    before.set_group("old", SPEC, members(1))
    before.set_node("n1", frozenset({"g", "old"}))
    written = before.pending()

    after = SliceBook(max_members=10)
    for w in written:  # what the API server holds, read back
        assert w.body is not None
        if w.kind == "AddressGroup":
            group, held, refused = decode_members(w.body)
            index = slice_index(group, w.name)
            assert index is not None and not refused
            after.written_slice(group, index, held)
        else:
            after.written_node(w.name, decode_node_groups(w.body))
    now = members(*range(25))
    now["x/p7"] = attrs.evolve(now["x/p7"], labels={"app": "web", "v": "2"})
    after.set_group("g", SPEC, now)  # "old" is no longer planned
    after.set_node("n1", frozenset({"g"}))
    assert names(after.pending()) == [
        ("AddressGroup", "g-0", True),
        ("NodeAddressGroups", "n1", True),
        ("AddressGroup", "old-0", False),
    ]


def test_a_failed_write_is_written_again() -> None:
    book = SliceBook()
    book.set_group("g", SPEC, members(1))
    (write,) = book.pending()
    book.failed(write)
    assert names(book.pending()) == [("AddressGroup", "g-0", True)]


@pytest.mark.parametrize("seed", range(4))
def test_random_moves_keep_every_member_in_exactly_one_slice(seed: int) -> None:
    rnd = random.Random(seed)
    book = SliceBook(max_members=7)
    held: dict[str, PolicyPod] = {}
    book.set_group("g", SPEC, held)
    server: dict[str, dict] = {}
    for _ in range(60):
        moved: dict[str, PolicyPod | None] = {}
        for _ in range(rnd.choice([1, 3, 12])):
            i = rnd.randrange(40)
            if rnd.random() < 0.3:
                moved[f"x/p{i}"] = None
                held.pop(f"x/p{i}", None)
            else:
                moved[f"x/p{i}"] = held[f"x/p{i}"] = pod(i, labels={"app": "web", "r": str(rnd.randrange(3))})
        book.move("g", moved)
        for w in book.pending():
            if w.body is None:
                del server[w.name]
            else:
                server[w.name] = w.body
        seen: dict[str, PolicyPod] = {}
        for body in server.values():
            _, got, _ = decode_members(body)
            assert len(got) <= 7 and got, "a slice is never over-full nor left empty"
            assert not seen.keys() & got.keys(), "a member in two slices"
            seen.update(got)
        assert seen.keys() == held.keys()
        assert all(seen[k].labels == held[k].labels for k in held)


def test_the_wire_format_round_trips_and_refuses_by_field() -> None:
    body = address_group("n-1", 0, NamedSelection((("sql", Protocol.TCP),)), members(1, 2).values())
    group, got, refused = decode_members(body)
    assert group == "n-1" and not refused
    assert got["x/p1"].named_ports == pod(1).named_ports and got["x/p1"].node == "n1"
    assert body["selection"] == {"namedPorts": [{"name": "sql", "protocol": "TCP"}]}
    bad = {**body, "members": [*body["members"], {"namespace": "x", "name": "evil", "ips": ["2001:db8::zz"]}]}
    _, got, refused = decode_members(bad)
    assert set(got) == {"x/p1", "x/p2"}  # the bad member is left out, the others stand
    assert refused[0].field == "members[2].ips[0]"
    bad_port = {"namespace": "x", "name": "p", "ips": [], "ports": [{"name": "h", "protocol": "TCP", "port": 70000}]}
    _, _, refused = decode_members({**body, "members": [bad_port]})
    assert refused[0].field == "members[0].ports[0].port"
    with pytest.raises(InvalidObject, match="group"):
        decode_members({"metadata": {"name": "x"}, "members": []})
    with pytest.raises(InvalidObject, match="groups"):
        decode_node_groups({"metadata": {"name": "n1"}, "groups": ["ok", 7]})
    assert slice_index("p-ab", "p-ab-12") == 12
    assert slice_index("p-ab", "p-ab-012") is None and slice_index("p-ab", "p-abc-1") is None
