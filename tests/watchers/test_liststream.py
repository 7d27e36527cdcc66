"""The list answer decoder: every item handed on alone, whatever the chunking; broken
bodies refused with ListDecodeError, never a wrong item."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flock.watchers._liststream import ListDecodeError, ListDecoder


def decode(body: bytes, sizes: list[int]) -> tuple[list[Any], dict[str, Any]]:
    decoder = ListDecoder(max_item_chars=2**20)
    items: list[Any] = []
    pos, i = 0, 0
    while pos < len(body):
        size = sizes[i % len(sizes)]
        items += decoder.feed(body[pos : pos + size])
        pos, i = pos + size, i + 1
    items += decoder.close()
    return items, decoder.fields


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    items=st.lists(json_values, max_size=8),
    meta=st.dictionaries(st.text(max_size=5), json_values, max_size=3),
    before=st.booleans(),
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=5),
    indent=st.sampled_from([None, 1]),
)
def test_any_chunking_gives_the_items_and_fields_json_loads_gives(
    items: list[Any], meta: dict[str, Any], before: bool, sizes: list[int], indent: int | None
) -> None:
    doc = {"metadata": meta, "items": items} if before else {"items": items, "metadata": meta}
    body = json.dumps(doc, indent=indent, ensure_ascii=False).encode()
    got, fields = decode(body, sizes)
    assert got == items
    assert fields == {"metadata": meta}


def test_utf8_split_inside_a_character_and_numbers_at_a_chunk_end() -> None:
    body = '{"metadata":{"n":-1.25e3},"items":[{"name":"é☃𝄞"}, 12.5, -3]}'.encode()
    for size in range(1, 12):
        assert decode(body, [size]) == ([{"name": "é☃𝄞"}, 12.5, -3], {"metadata": {"n": -1250.0}})


def test_items_null_and_empty() -> None:
    assert decode(b'{"metadata":{},"items":null}', [3]) == ([], {"metadata": {}})
    assert decode(b'{"items":[]}', [1]) == ([], {})
    assert decode(b"{}", [1]) == ([], {})


@pytest.mark.parametrize(
    "body",
    [
        b'{"items":[{"a":1},]}',  # trailing comma in the array
        b'{"items":[1],}',  # trailing comma in the object
        b'{"items":[{"a":1}',  # cut short
        b'{"items":[{"a":"unterminated',
        b"[1, 2]",  # not an object
        b'{"items":[1] "x":2}',
        b'{"items":{"a":1}}',
        b'{"a":1}}',
        b'{"items":[' + b"[" * 100_000 + b"]" * 100_000 + b"]}",  # nested past the interpreter's limit
        b'{"items":[tru]}',
    ],
)
def test_a_broken_body_is_refused(body: bytes) -> None:
    with pytest.raises(ListDecodeError):
        decode(body, [7])


def test_an_item_over_the_bound_is_refused_before_the_body_ends() -> None:
    decoder = ListDecoder(max_item_chars=1000)
    decoder.feed(b'{"items":[{"a":"')
    with pytest.raises(ListDecodeError, match="larger than 1000"):
        for _ in range(100):
            decoder.feed(b"x" * 100)


def test_a_big_item_in_small_chunks_is_not_rescanned_per_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    import flock.watchers._liststream as liststream

    tries = 0
    real = liststream._DECODER.raw_decode

    class Counting:
        def raw_decode(self, text: str, pos: int) -> Any:
            nonlocal tries
            tries += 1
            return real(text, pos)

    monkeypatch.setattr(liststream, "_DECODER", Counting())
    item = {"blob": "".join(random.Random(1).choice("abc") for _ in range(400_000))}
    body = json.dumps({"metadata": {}, "items": [item]}).encode()
    got, _ = decode(body, [1024])  # ~400 chunks
    assert got == [item]
    assert tries < 40  # doubling: ~log2(400), plus the keys and the metadata
