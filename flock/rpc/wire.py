"""Wire protocol v1 between the shim and flock-agent (DESIGN: "Wire protocol").

One connection per request; each side sends exactly one line of UTF-8 JSON
ending in ``\\n``.  Standard library only and Python 3.8 syntax: the shim
bundles this module and runs it on the host's python3.

Decoding never raises anything but :class:`~flock.errors.CniError`:
an oversized line, bad UTF-8 or invalid JSON is code 6; an unknown ``op`` or a
missing / mistyped field is code 4 naming the field; a protocol version the
agent does not speak is code 202 listing the versions it does.
"""

from __future__ import annotations

import json
from types import MappingProxyType

from flock.errors import DECODE_ERROR, INCOMPATIBLE_PROTOCOL, INVALID_ENV, CniError

# typing costs milliseconds at import and the shim is on the pod start-up path;
# annotations are strings (see __future__), so it is only needed by checkers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PROTOCOL_VERSION = 1
SPOKEN_VERSIONS = (1,)

# Longest request or response line, newline excluded.  A pod's network
# configuration is a few KiB; anything near this is garbage or an attack.
MAX_LINE_BYTES = 1 << 20

OPS = ("ADD", "DEL", "CHECK", "STATUS", "GC")

# Deepest JSON nesting accepted (a network configuration nests a handful of
# levels).  json.loads manages ~1000, but repr() and json.dumps of such a
# value a few frames deeper then raise RecursionError far from the input.
MAX_JSON_DEPTH = 64

# Name of the directory where the shim records a DEL the agent could not take
# and the agent replays it from (shared by both ends).
PENDING_DELETES = "pending-deletes"

# Which request strings must be non-empty, per op (CNI spec 1.1, "Parameters").
# DEL may come without a netns (the sandbox is already gone).
REQUIRED_FIELDS = MappingProxyType(
    {
        "ADD": ("containerID", "netns", "ifName"),
        "CHECK": ("containerID", "netns", "ifName"),
        "DEL": ("containerID", "ifName"),
        "STATUS": (),
        "GC": (),
    }
)

_STRING_FIELDS = ("containerID", "netns", "ifName", "args", "path")
_CONTAINER_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def valid_container_id(value: str) -> bool:
    """CNI spec: alphanumeric plus ``_ . -``, starting with an alphanumeric.

    flock uses the ID as a file name (pending deletes) and a database key, so
    anything else is refused before it can name a path.
    """
    return bool(value) and value[0].isascii() and value[0].isalnum() and _CONTAINER_ID_CHARS.issuperset(value)


def valid_if_name(value: str) -> bool:
    """What the kernel accepts as an interface name (``dev_valid_name``): 1 to
    15 bytes, not ``.`` or ``..``, no ``/``, ``:``, NUL or whitespace."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeError:
        return False
    return 0 < size <= 15 and value not in (".", "..") and not any(c in "/:\0" or c.isspace() for c in value)


def valid_netns(value: str) -> bool:
    """An absolute path the agent can open (a NUL would make ``os.open`` raise
    ValueError; a relative path would be resolved against the agent's cwd)."""
    return value.startswith("/") and "\0" not in value


def field_error(name: str, value: str) -> tuple[str, str] | None:
    """``(msg, what was expected)`` when a non-empty request string *value* of
    field *name* is malformed, else None (shared by the shim's env checks)."""
    check = _FIELD_CHECKS.get(name)
    if check is None or not value or check[0](value):
        return None
    return check[1], check[2]


_FIELD_CHECKS = MappingProxyType(
    {
        "containerID": (
            valid_container_id,
            "invalid container ID",
            "expected letters, digits, '_', '.', '-', starting with a letter or digit",
        ),
        "ifName": (
            valid_if_name,
            "invalid interface name",
            "expected 1 to 15 bytes without '/', ':' or whitespace, not '.' or '..'",
        ),
        "netns": (valid_netns, "invalid network namespace path", "expected an absolute path"),
    }
)


def parse_cni_args(args: str) -> dict[str, str]:
    """``K=V;K=V`` (CNI_ARGS) → dict.  Items without ``=`` are ignored."""
    out = {}
    for item in args.split(";"):
        key, sep, value = item.partition("=")
        if sep and key:
            out[key.strip()] = value.strip()
    return out


class Request:
    """One shim → agent request.  Immutable by convention.

    A plain slotted class rather than attrs (not on the host) or dataclasses
    (whose import costs the shim several milliseconds at every pod start).
    """

    __slots__ = ("args", "config", "container_id", "if_name", "netns", "op", "path", "version")

    def __init__(
        self,
        op: str,
        container_id: str = "",
        netns: str = "",
        if_name: str = "",
        args: str = "",
        path: str = "",
        config: dict[str, Any] | None = None,
        version: int = PROTOCOL_VERSION,
    ) -> None:
        self.op = op
        self.container_id = container_id
        self.netns = netns
        self.if_name = if_name
        self.args = args
        self.path = path
        self.config = config if config is not None else {}
        self.version = version

    def _key(self) -> tuple[Any, ...]:
        return (
            *(getattr(self, name) for name in self.__slots__[:-2]),
            json.dumps(self.config, sort_keys=True),
            self.version,
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Request) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Request(op={self.op!r}, container_id={self.container_id!r}, if_name={self.if_name!r}, netns={self.netns!r})"

    @property
    def cni_args(self) -> dict[str, str]:
        return parse_cni_args(self.args)

    @property
    def pod(self) -> str:
        """``namespace/name`` from CNI_ARGS, or ``""`` when the runtime gave none."""
        a = self.cni_args
        ns, name = a.get("K8S_POD_NAMESPACE", ""), a.get("K8S_POD_NAME", "")
        return f"{ns}/{name}" if (ns or name) else ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "op": self.op,
            "containerID": self.container_id,
            "netns": self.netns,
            "ifName": self.if_name,
            "args": self.args,
            "path": self.path,
            "config": self.config,
        }

    def encode(self) -> bytes:
        return _encode_line(self.to_dict())

    @classmethod
    def decode(cls, line: bytes) -> Request:
        """Parse one request line (with or without its ``\\n``); CniError on anything wrong."""
        obj = _decode_line(line, "request")
        if "version" not in obj:
            raise CniError(INVALID_ENV, "request is missing a field", "field 'version' is required")
        version = obj["version"]
        if isinstance(version, bool) or not isinstance(version, int) or version not in SPOKEN_VERSIONS:
            raise CniError(
                INCOMPATIBLE_PROTOCOL,
                "incompatible flock protocol version",
                "request has version={!r}; this agent speaks versions {}".format(
                    version, ", ".join(str(v) for v in SPOKEN_VERSIONS)
                ),
            )
        op = obj.get("op")
        if op is None:
            raise CniError(INVALID_ENV, "request is missing a field", "field 'op' is required")
        if op not in OPS:
            raise CniError(
                INVALID_ENV, "unknown operation", "field 'op'={!r}; expected one of {}".format(op, ", ".join(OPS))
            )
        fields = {}
        for name in _STRING_FIELDS:
            value = obj.get(name, "")
            if not isinstance(value, str):
                raise CniError(
                    INVALID_ENV,
                    "request field has the wrong type",
                    f"field {name!r}={value!r}: expected a string",
                )
            fields[name] = value
        for name in REQUIRED_FIELDS[op]:
            if not fields[name]:
                raise CniError(INVALID_ENV, "request is missing a field", f"field {name!r} is required for {op}")
        for name, value in fields.items():
            invalid = field_error(name, value)
            if invalid is not None:
                msg, expected = invalid
                raise CniError(INVALID_ENV, msg, f"field {name!r}={value!r}: {expected}")
        cid = fields["containerID"]
        if "config" not in obj:
            raise CniError(INVALID_ENV, "request is missing a field", "field 'config' is required")
        config = obj["config"]
        if not isinstance(config, dict):
            raise CniError(
                INVALID_ENV,
                "request field has the wrong type",
                f"field 'config'={config!r}: expected an object",
            )
        return cls(
            op=op,
            container_id=cid,
            netns=fields["netns"],
            if_name=fields["ifName"],
            args=fields["args"],
            path=fields["path"],
            config=config,
            version=version,
        )


def encode_result(result: dict[str, Any]) -> bytes:
    """Success response line: ``{"result": {...}}``."""
    return _encode_line({"result": result})


def encode_error(error: CniError) -> bytes:
    """Failure response line: ``{"error": {"code", "msg", "details"}}``."""
    return _encode_line({"error": {"code": error.code, "msg": error.msg, "details": error.details}})


def decode_response(line: bytes) -> dict[str, Any]:
    """The result of a response line; the agent's error is raised as CniError.

    A malformed response is code 6, naming what was wrong.
    """
    obj = _decode_line(line, "response")
    if "error" in obj:
        err = obj["error"]
        if not isinstance(err, dict) or not isinstance(err.get("code"), int) or isinstance(err.get("code"), bool):
            raise CniError(
                DECODE_ERROR,
                "malformed response from flock-agent",
                f"field 'error'={err!r}: expected {{code, msg, details}}",
            )
        raise CniError.from_dict(err)
    if "result" not in obj:
        raise CniError(DECODE_ERROR, "malformed response from flock-agent", "neither 'result' nor 'error' present")
    result = obj["result"]
    if not isinstance(result, dict):
        raise CniError(
            DECODE_ERROR,
            "malformed response from flock-agent",
            f"field 'result'={result!r}: expected an object",
        )
    return result


class LineReader:
    """Collects received bytes until the first ``\\n``, refusing lines over the limit.

    Shared by the agent (Trio stream) and the shim (blocking socket): feed each
    chunk; the first complete line is returned (bytes after it are ignored:
    one message per connection).  Raises CniError(6) once the line exceeds
    *limit* bytes without a newline.
    """

    __slots__ = ("_buf", "_limit")

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self._buf = bytearray()
        self._limit = limit

    @property
    def pending(self) -> int:
        return len(self._buf)

    def feed(self, chunk: bytes) -> bytes | None:
        end = chunk.find(b"\n")
        if end >= 0:
            if len(self._buf) + end > self._limit:
                raise self._too_long()
            return bytes(self._buf + chunk[:end])
        self._buf += chunk
        if len(self._buf) > self._limit:
            raise self._too_long()
        return None

    def eof(self) -> CniError:
        """The error for a peer that closed before its newline."""
        return CniError(
            DECODE_ERROR, "message ended before its newline", f"{len(self._buf)} bytes received without '\\n'"
        )

    def _too_long(self) -> CniError:
        return CniError(DECODE_ERROR, "message too long", f"line exceeds {self._limit} bytes")


def json_too_deep(value: object, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether decoded JSON *value* nests lists/objects more than *limit* deep
    (iterative: this must not recurse itself)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            if depth >= limit:
                return True
            stack.extend((child, depth + 1) for child in item)
    return False


def load_json(text: str) -> object:
    """``json.loads`` that refuses nesting deeper than :data:`MAX_JSON_DEPTH`
    with a ValueError (as for any other invalid JSON), also past the
    interpreter's recursion limit (where json itself raises RecursionError)."""
    try:
        value = json.loads(text)
    except RecursionError:
        # "[" * 100000 fits in one line.
        raise ValueError("nested too deeply") from None
    if json_too_deep(value):
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep")
    return value


def _encode_line(obj: dict[str, Any]) -> bytes:
    # ensure_ascii keeps the line free of raw newlines and encoding surprises.
    return json.dumps(obj, separators=(",", ":")).encode("ascii") + b"\n"


def _decode_line(line: bytes, what: str) -> dict[str, Any]:
    if line.endswith(b"\n"):
        line = line[:-1]
    if len(line) > MAX_LINE_BYTES:
        raise CniError(DECODE_ERROR, "message too long", f"{what} line of {len(line)} bytes exceeds {MAX_LINE_BYTES}")
    try:
        obj = load_json(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CniError(DECODE_ERROR, f"{what} is not UTF-8", str(exc)) from None
    except ValueError as exc:
        raise CniError(DECODE_ERROR, f"{what} is not valid JSON", str(exc)) from None
    if not isinstance(obj, dict):
        raise CniError(DECODE_ERROR, f"{what} is not a JSON object", f"got {type(obj).__name__}")
    return obj
