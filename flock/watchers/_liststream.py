"""A list answer decoded as it arrives: each of its ``items`` handed on alone.

kube-apiserver answers a list from its watch cache in one body, however many
objects it holds (at 150,000 pods, close to a GiB of JSON).  Decoding that
with one ``json.loads`` would hold the whole text and every raw object at once.
:class:`ListDecoder` instead takes the body chunk by chunk and returns each item
as soon as its closing brace has arrived, so at most one chunk's items (and one
partial item) are held besides what the caller keeps.

The JSON itself is read by the standard library's C scanner
(``JSONDecoder.raw_decode``, one item at a time); this class only walks the
answer's top level (``{"kind": …, "metadata": {…}, "items": [ … ]}``, keys in
any order).  An item cut by a chunk boundary is decoded again once the text
after its start has doubled (or the body has ended): a big item in small chunks
is scanned a logarithmic number of times, not once a chunk.
"""

from __future__ import annotations

import codecs
import json
from typing import Any

_WS = " \t\n\r"
_DECODER = json.JSONDecoder()


class ListDecodeError(ValueError):
    """The body is not a list answer (or is cut short)."""


class ListDecoder:
    """Feed the body with :meth:`feed`, then call :meth:`close`; each returns the
    elements of the top-level ``items`` array completed by then, in order.

    Every other top-level key ends up in :attr:`fields` (``metadata``, ``kind``…).
    *max_item_chars* bounds one item (etcd refuses objects over 1.5 MiB).
    """

    def __init__(self, *, max_item_chars: int = 16 * 2**20) -> None:
        self._out: list[Any] = []
        self._wait_for = 0  # how much pending text a cut value needs before it is tried again
        self._max = max_item_chars
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._text = ""
        self._pos = 0
        # start → key → colon → value (items: items_open → item → item_sep …) → next → end
        self._state = "start"
        self._key = ""
        self.fields: dict[str, Any] = {}

    def feed(self, chunk: bytes) -> list[Any]:
        """The items this chunk completed."""
        text = self._utf8.decode(chunk)
        if self._pos:
            self._text = self._text[self._pos :] + text
            self._pos = 0
        else:
            self._text += text
        if len(self._text) - self._pos >= self._wait_for:
            self._run(final=False)
        if len(self._text) - self._pos > self._max:
            raise ListDecodeError(f"an item of the list is larger than {self._max} characters")
        out, self._out = self._out, []
        return out

    def close(self) -> list[Any]:
        """The items the rest of the body completed; raises if the body was cut short."""
        self._text = self._text[self._pos :] + self._utf8.decode(b"", final=True)
        self._pos = 0
        self._run(final=True)
        if self._state != "end" or self._text[self._pos :].strip(_WS):
            raise ListDecodeError(f"the list answer ends early or has trailing text (state {self._state})")
        out, self._out = self._out, []
        return out

    def _skip(self) -> str:
        """The next non-blank character, or "" when more text is needed (the position is left on it)."""
        text, pos = self._text, self._pos
        n = len(text)
        while pos < n and text[pos] in _WS:
            pos += 1
        self._pos = pos
        return text[pos] if pos < n else ""

    def _value(self, final: bool) -> tuple[bool, Any]:
        """(True, value) when a whole JSON value starts here; (False, None) when it needs more text."""
        try:
            value, end = _DECODER.raw_decode(self._text, self._pos)
        except json.JSONDecodeError as exc:
            # A value cut by the end of the text cannot be told from a broken one until the text
            # ends (the scanner may report a cut string where it starts): wait until what follows
            # its start has doubled, within max_item_chars; at the end of the body it is an error.
            if not final:
                self._wait_for = 2 * (len(self._text) - self._pos)
                return False, None
            raise ListDecodeError(f"not JSON at character {exc.pos}: {exc.msg}") from None
        except RecursionError:
            raise ListDecodeError(f"JSON nested too deeply at character {self._pos}") from None
        if not final and isinstance(value, int | float):
            after = self._text[end : end + 1]
            if not after or after not in _WS + ",]}":
                return False, None  # a number ends only where a delimiter follows it ("-1." may go on)
        self._pos = end
        self._wait_for = 0
        return True, value

    def _run(self, final: bool) -> None:
        while True:
            c = self._skip()
            if not c:
                return
            state = self._state
            if state == "start":
                if c != "{":
                    raise ListDecodeError(f"a list answer is an object, not {c!r}")
                self._pos += 1
                self._state = "first_key"
            elif state in ("key", "first_key", "next"):
                if c == "}" and state != "key":  # "key" follows a comma: a trailing comma is no JSON
                    self._pos += 1
                    self._state = "end"
                    return
                if state == "next":
                    if c != ",":
                        raise ListDecodeError(f"expected ',' or '}}' between fields, not {c!r}")
                    self._pos += 1
                    self._state = "key"
                    continue
                done, key = self._value(final)
                if not done:
                    return
                if not isinstance(key, str):
                    raise ListDecodeError("an object key is not a string")
                self._key = key
                self._state = "colon"
            elif state == "colon":
                if c != ":":
                    raise ListDecodeError(f"expected ':' after {self._key!r}")
                self._pos += 1
                self._state = "items_open" if self._key == "items" else "value"
            elif state == "value":
                done, value = self._value(final)
                if not done:
                    return
                self.fields[self._key] = value
                self._state = "next"
            elif state == "items_open":
                if c == "n":  # "items": null
                    done, _ = self._value(final)
                    if not done:
                        return
                    self._state = "next"
                    continue
                if c != "[":
                    raise ListDecodeError(f"items is not an array (starts with {c!r})")
                self._pos += 1
                self._state = "first_item"
            elif state in ("first_item", "item_sep"):
                if c == "]":
                    self._pos += 1
                    self._state = "next"
                    continue
                if state == "item_sep":
                    if c != ",":
                        raise ListDecodeError(f"expected ',' or ']' between items, not {c!r}")
                    self._pos += 1
                    self._state = "item"
                    continue
                self._state = "item"
            elif state == "item":
                done, item = self._value(final)
                if not done:
                    return
                self._state = "item_sep"
                self._out.append(item)
            else:  # "end"
                raise ListDecodeError(f"text after the end of the list answer: {c!r}")
