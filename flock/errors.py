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

# Longest ``details`` kept.  Details quote the offending value; a value near
# the 1 MiB request limit would otherwise make an error reply over that limit,
# which the shim refuses ("message too long") instead of showing the error.
MAX_DETAILS_CHARS = 4096
# Longest ``msg`` kept (messages are short fixed sentences; this is a backstop).
MAX_MSG_CHARS = 256
# How much of one input value an error quotes (see :func:`quote`).
QUOTE_CHARS = 128


def quote(value: object, limit: int = QUOTE_CHARS) -> str:
    """``repr`` of an input value for an error message, at most about *limit*
    characters: a 100 KB string or a deep object is named by its head and
    its size, never echoed whole (and never fully repr'd: that alone could
    take seconds)."""
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
        if len(details) > MAX_DETAILS_CHARS:
            # Keep the head (the field and the start of its value) and the tail
            # (what was expected); the middle is the value's bulk.
            half = MAX_DETAILS_CHARS // 2
            details = f"{details[:half]} …({len(details) - 2 * half} characters cut)… {details[-half:]}"
        if len(msg) > MAX_MSG_CHARS:
            msg = msg[:MAX_MSG_CHARS] + "…"
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
