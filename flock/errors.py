"""CNI errors: the one exception type that crosses from any flock layer to the shim.

Standard library only: the shim (which runs on the host without the flock
package's dependencies) shares this module.
"""

from __future__ import annotations

# Codes from the CNI spec 1.1 ("Error codes"), plus flock's own (>= 100).
INCOMPATIBLE_CNI_VERSION = 1
UNSUPPORTED_FIELD = 2
UNKNOWN_CONTAINER = 3
INVALID_ENV = 4
IO_ERROR = 5
DECODE_ERROR = 6
INVALID_CONFIG = 7
TRY_AGAIN_LATER = 11
NOT_AVAILABLE = 50
LIMITED_CONNECTIVITY = 51
INTERNAL = 100
INCOMPATIBLE_PROTOCOL = 202

# Every error flock prints stays under 4 KiB whatever the input (issue 25): the
# shim's CNI error object, and the agent's reply line it comes from.  Bounds
# are in bytes of the JSON text (``ensure_ascii``, as both ends encode it: a
# control character or a non-ASCII one costs 6 bytes, an astral one 12), so
# no escaping can push a bounded field past its share.
MAX_ERROR_BYTES = 4096
# Longest ``details`` kept: its head (the field and the start of its value)
# and its tail (what was expected); the middle is the value's bulk.
MAX_DETAILS_BYTES = 2048
# Longest ``msg`` kept (messages are short fixed sentences; this is a backstop).
MAX_MSG_BYTES = 256
# How much of one input value an error quotes (see :func:`quote`).
QUOTE_CHARS = 128

_CUT = " …({} characters cut)… "


def json_size(text: str) -> int:
    """Bytes *text* takes as a JSON string with ``ensure_ascii`` (quotes excluded)."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return len(text)
    return sum(_char_size(c) for c in text)


def _char_size(c: str) -> int:
    o = ord(c)
    if 0x20 <= o < 0x7F:
        return 2 if c in '"\\' else 1
    if c in "\n\r\t\b\f":
        return 2
    return 12 if o > 0xFFFF else 6


def _fit(text: str, budget: int) -> int:
    """How many leading characters of *text* fit in *budget* JSON bytes."""
    used = 0
    for i, c in enumerate(text):
        used += _char_size(c)
        if used > budget:
            return i
    return len(text)


def bounded(text: str, limit: int) -> str:
    """*text* whose JSON string form takes at most *limit* bytes: kept whole
    when it fits, else its head and tail around a note of what was cut.  Lone
    surrogates (undecodable bytes from the environment) become ``\\udcXX``
    text, so the result always encodes as UTF-8."""
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) * 12 <= limit or (len(text) <= limit and json_size(text) <= limit):
        return text
    # A character costs at least one byte: nothing past *limit* characters from either end is kept.
    room = max(limit - json_size(_CUT.format(len(text))), 0)
    keep_head = _fit(text[:limit], room * 2 // 3)
    keep_tail = _fit(text[-limit:][::-1], room - json_size(text[:keep_head]))
    tail = text[len(text) - keep_tail :] if keep_tail else ""
    return text[:keep_head] + _CUT.format(len(text) - keep_head - keep_tail) + tail


def quote(value: object, limit: int = QUOTE_CHARS) -> str:
    """``repr`` of an input value for an error message, at most about *limit*
    characters: a 100 KB string or a deep object is named by its head and
    its size, never echoed whole (and never fully repr'd: that alone could
    take seconds).  ``repr`` shows control characters, undecodable bytes (lone
    surrogates) and other unprintable characters as escapes."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}…({len(value)} characters)"
    size = ""
    if isinstance(value, (dict, list)) and len(value) > 16:
        size = f" of {len(value)} items"
        value = dict(list(value.items())[:16]) if isinstance(value, dict) else value[:16]
    try:
        text = repr(value)
    except RecursionError:
        return f"<{type(value).__name__} nested too deeply>"
    if size:
        return f"{text[:limit]}…({type(value).__name__}{size})"
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…({type(value).__name__} of {len(text)} characters)"


class CniError(Exception):
    """A failure the runtime sees as a CNI error object.

    ``msg`` is short and stable; ``details`` names the field and the value
    that caused it, so an operator reading ``kubectl describe pod`` can act.
    """

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        # Bounded here, where every error is built (the agent's domain errors
        # become CniErrors at the CNI boundary; the wire and the shim build their own).
        msg = bounded(str(msg), MAX_MSG_BYTES)
        details = bounded(str(details), MAX_DETAILS_BYTES)
        super().__init__(code, msg, details)
        self.code = int(code)
        self.msg = msg
        self.details = details

    def __str__(self) -> str:
        return f"{self.msg}: {self.details}" if self.details else self.msg

    def to_dict(self) -> dict:
        out = {"code": self.code, "msg": self.msg}
        if self.details:
            out["details"] = self.details
        return out

    @classmethod
    def from_dict(cls, obj: dict) -> CniError:
        return cls(int(obj.get("code", INTERNAL)), str(obj.get("msg", "")), str(obj.get("details", "")))
