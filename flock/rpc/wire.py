"""Wire protocol (versions 1 and 2) between the shim and flock-agent (DESIGN: "Wire protocol").

One connection per request; each side sends exactly one line of UTF-8 JSON
ending in ``\\n``.  Standard library only and Python 3.8 syntax: the shim
bundles this module and runs it on the host's python3.

Version 2 adds the pod's network namespace as a file descriptor, sent with
the first bytes of the request line as SCM_RIGHTS ancillary data; the line's
``netnsFd`` field says whether one was attached, so an fd lost on the way or
one nobody announced is caught (code 4).  ADD and CHECK need it; DEL sends it
when the namespace could be opened and works without it.

Decoding never raises anything but :class:`~flock.errors.CniError`:
an oversized line, bad UTF-8 or invalid JSON is code 6; an unknown ``op`` or a
missing / mistyped field is code 4 naming the field; a protocol version the
agent does not speak is code 202 listing the versions it does.
"""

from __future__ import annotations

import json
from types import MappingProxyType

from flock.cni_common import (
    CONTAINER_ID_CHARS,
    FD_OPS,
    FD_OPTIONAL_OPS,
    FD_VERSION,
    MAX_CNI_ARG_CHARS,
    MAX_CONTAINER_ID_CHARS,
    MAX_ERROR_CODE,
    MAX_IF_NAME_BYTES,
    MAX_JSON_DEPTH,
    MAX_REQUEST_BYTES,
    OPS,
    REQUIRED_FIELDS,
    RESERVED_IF_NAMES,
    SPOKEN_VERSIONS,
    json_too_deep,
)
from flock.errors import DECODE_ERROR, INCOMPATIBLE_PROTOCOL, INVALID_ENV, CniError, quote

# typing costs milliseconds at import and the shim is on the pod start-up path;
# annotations are strings (see __future__), so it is only needed by checkers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The protocol's versions, limits, ops and required fields are flock.cni_common's: one home,
# shared with the shim and its fast path (the agent's side imports them from here).

MAX_LINE_BYTES = MAX_REQUEST_BYTES  # the one size limit (flock.rpc's name for it)

_STRING_FIELDS = ("containerID", "netns", "ifName", "args", "path")


def valid_container_id(value: str) -> bool:
    """CNI spec: alphanumeric plus ``_ . -``, starting with an alphanumeric;
    at most :data:`MAX_CONTAINER_ID_CHARS`.

    flock uses the ID as a file name (pending deletes) and a database key, so
    anything else is refused before it can name a path.
    """
    return (
        0 < len(value) <= MAX_CONTAINER_ID_CHARS
        and value[0].isascii()
        and value[0].isalnum()
        and CONTAINER_ID_CHARS.issuperset(value)
    )


def valid_if_name(value: str) -> bool:
    """An interface name as the reference plugins accept it (``ValidateInterfaceName``):
    1 to 15 bytes, not ``.``, ``..``, ``all`` or ``default``, no ``/``,
    ``:``, ``%`` (a kernel name template such as ``eth%d``), NUL or whitespace."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeError:
        return False
    return (
        0 < size <= MAX_IF_NAME_BYTES
        and value not in RESERVED_IF_NAMES
        and not any(c in "/:%\0" or c.isspace() for c in value)
    )


def valid_netns(value: str) -> bool:
    """An absolute path the agent can open (a NUL would make ``os.open`` raise
    ValueError; a relative path would be resolved against the agent's cwd)."""
    return value.startswith("/") and "\0" not in value


def cni_args_error(args: str) -> str | None:
    """What is wrong with CNI_ARGS *args* (a key or value over
    :data:`MAX_CNI_ARG_CHARS`, named by the key's head), else None."""
    if len(args) <= MAX_CNI_ARG_CHARS:
        return None
    for item in args.split(";"):
        key, _, value = item.partition("=")
        if len(key) > MAX_CNI_ARG_CHARS:
            return f"a key of {len(key)} characters ({quote(key, 64)}); at most {MAX_CNI_ARG_CHARS}"
        if len(value) > MAX_CNI_ARG_CHARS:
            return f"{quote(key.strip(), 64)} has a value of {len(value)} characters; at most {MAX_CNI_ARG_CHARS}"
    return None


def field_error(name: str, value: str) -> tuple[str, str] | None:
    """``(msg, what was expected)`` when a non-empty request string *value* of
    field *name* is malformed, else None (shared by the shim's env checks).
    ``args`` is checked for every op but DEL (which needs none of it)."""
    if name == "args":
        problem = cni_args_error(value)
        return None if problem is None else ("invalid CNI_ARGS", problem)
    check = _FIELD_CHECKS.get(name)
    if check is None or not value or check[0](value):
        return None
    return check[1], check[2]


_FIELD_CHECKS = MappingProxyType(
    {
        "containerID": (
            valid_container_id,
            "invalid container ID",
            f"expected letters, digits, '_', '.', '-', starting with a letter or digit, at most {MAX_CONTAINER_ID_CHARS}",
        ),
        "ifName": (
            valid_if_name,
            "invalid interface name",
            "expected 1 to 15 bytes without '/', ':', '%' or whitespace, not '.', '..', 'all' or 'default'",
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

    __slots__ = ("args", "config", "container_id", "if_name", "netns", "netns_fd", "op", "path", "version")

    def __init__(
        self,
        op: str,
        container_id: str = "",
        netns: str = "",
        if_name: str = "",
        args: str = "",
        path: str = "",
        config: dict[str, Any] | None = None,
        version: int = 1,  # the shim sends PROTOCOL_VERSION; version 1 is what carries no fd
        netns_fd: int | None = None,
    ) -> None:
        self.op = op
        self.container_id = container_id
        self.netns = netns
        self.if_name = if_name
        self.args = args
        self.path = path
        self.config = config if config is not None else {}
        self.version = version
        # Version 2: the pod's namespace fd that came with the line (owned by
        # whoever received it; never encoded: ``netnsFd`` says whether one rides along).
        self.netns_fd = netns_fd

    def _key(self) -> tuple[Any, ...]:
        return (
            self.op,
            self.container_id,
            self.netns,
            self.if_name,
            self.args,
            self.path,
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
        out = {
            "version": self.version,
            "op": self.op,
            "containerID": self.container_id,
            "netns": self.netns,
            "ifName": self.if_name,
            "args": self.args,
            "path": self.path,
            "config": self.config,
        }  # type: dict[str, Any]
        if self.version >= FD_VERSION:
            out["netnsFd"] = self.netns_fd is not None
        return out

    def as_version(self, version: int) -> Request:
        """This request in wire *version*; version 1 carries no fd (the agent opens the path)."""
        return Request(
            self.op,
            self.container_id,
            self.netns,
            self.if_name,
            self.args,
            self.path,
            self.config,
            version,
            self.netns_fd if version >= FD_VERSION else None,
        )

    def without_config(self) -> Request:
        """This request with only the configuration's ``cniVersion`` (when it is a
        short string): what a DEL needs, for one whose configuration is over the limit."""
        version = self.config.get("cniVersion")
        config = {"cniVersion": version} if isinstance(version, str) and len(version) <= 16 else {}
        return Request(
            self.op,
            self.container_id,
            self.netns,
            self.if_name,
            self.args[:4096],
            self.path[:4096],
            config,
            self.version,
            self.netns_fd,
        )

    def encode(self) -> bytes:
        return _encode_line(self.to_dict())

    @classmethod
    def decode(cls, line: bytes, netns_fd: int | None = None) -> Request:
        """Parse one request line (with or without its ``\\n``); CniError on anything wrong.

        *netns_fd* is the fd that arrived with the line, if any: it must match
        what the line announces (``netnsFd``).  It is not closed here, also
        not on error (the receiver owns it)."""
        obj = _decode_line(line, "request")
        if "version" not in obj:
            raise CniError(INVALID_ENV, "request is missing a field", "field 'version' is required")
        version = obj["version"]
        if isinstance(version, bool) or not isinstance(version, int) or version not in SPOKEN_VERSIONS:
            raise CniError(
                INCOMPATIBLE_PROTOCOL,
                "incompatible flock protocol version",
                "request has version={}; this agent speaks versions {}".format(
                    quote(version), ", ".join(str(v) for v in SPOKEN_VERSIONS)
                ),
            )
        op = obj.get("op")
        if op is None:
            raise CniError(INVALID_ENV, "request is missing a field", "field 'op' is required")
        if op not in OPS:
            raise CniError(
                INVALID_ENV, "unknown operation", "field 'op'={}; expected one of {}".format(quote(op), ", ".join(OPS))
            )
        fields = {}
        for name in _STRING_FIELDS:
            value = obj.get(name, "")
            if not isinstance(value, str):
                raise CniError(
                    INVALID_ENV,
                    "request field has the wrong type",
                    f"field {name!r}={quote(value)}: expected a string",
                )
            fields[name] = value
        for name in REQUIRED_FIELDS[op]:
            if not fields[name]:
                raise CniError(INVALID_ENV, "request is missing a field", f"field {name!r} is required for {op}")
        for name, value in fields.items():
            invalid = field_error(name, value) if name != "args" or op != "DEL" else None
            if invalid is not None:
                msg, expected = invalid
                raise CniError(INVALID_ENV, msg, f"field {name!r}={quote(value)}: {expected}")
        cid = fields["containerID"]
        if "config" not in obj:
            raise CniError(INVALID_ENV, "request is missing a field", "field 'config' is required")
        config = obj["config"]
        if not isinstance(config, dict):
            raise CniError(
                INVALID_ENV,
                "request field has the wrong type",
                f"field 'config'={quote(config)}: expected an object",
            )
        has_fd = obj.get("netnsFd", False)
        if version < FD_VERSION and "netnsFd" in obj:
            raise CniError(
                INVALID_ENV, "request field not in this version", f"field 'netnsFd' needs version {FD_VERSION}"
            )
        if not isinstance(has_fd, bool):
            raise CniError(
                INVALID_ENV, "request field has the wrong type", f"field 'netnsFd'={quote(has_fd)}: expected a boolean"
            )
        if version >= FD_VERSION and op in FD_OPS and not has_fd:
            raise CniError(
                INVALID_ENV,
                "network namespace fd missing",
                f"version {version} {op} must carry the network namespace as a file descriptor (netnsFd)",
            )
        if has_fd and op not in FD_OPS + FD_OPTIONAL_OPS:
            raise CniError(INVALID_ENV, "unexpected file descriptor", f"{op} takes no network namespace fd")
        if has_fd and netns_fd is None:
            raise CniError(
                INVALID_ENV, "network namespace fd missing", "the request announces an fd (netnsFd) but none arrived"
            )
        if netns_fd is not None and not has_fd:
            raise CniError(
                INVALID_ENV,
                "unexpected file descriptor",
                f"a file descriptor arrived with a version {version} request that announces none",
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
            netns_fd=netns_fd,
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
        code = err.get("code") if isinstance(err, dict) else None
        if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= MAX_ERROR_CODE:
            raise CniError(
                DECODE_ERROR,
                "malformed response from flock-agent",
                f"field 'error'={quote(err)}: expected {{code, msg, details}}",
            )
        raise CniError.from_dict(err)
    if "result" not in obj:
        raise CniError(DECODE_ERROR, "malformed response from flock-agent", "neither 'result' nor 'error' present")
    result = obj["result"]
    if not isinstance(result, dict):
        raise CniError(
            DECODE_ERROR,
            "malformed response from flock-agent",
            f"field 'result'={quote(result)}: expected an object",
        )
    return result


class LineReader:
    """Collects received bytes until the first ``\\n``, refusing lines over the limit.

    Shared by the agent (Trio stream) and the shim (blocking socket): feed each
    chunk; the first complete line is returned (bytes after it are ignored:
    one message per connection).  Raises CniError(6) once the line exceeds
    *limit* bytes without a newline.
    """

    __slots__ = ("_buf", "_limit", "_what")

    def __init__(self, limit: int = MAX_REQUEST_BYTES, what: str = "request") -> None:
        self._buf = bytearray()
        self._limit = limit
        self._what = what

    @property
    def pending(self) -> int:
        return len(self._buf)

    def feed(self, chunk: bytes) -> bytes | None:
        end = chunk.find(b"\n")
        if end >= 0:
            if len(self._buf) + end > self._limit:
                raise too_large(self._what, len(self._buf) + end, self._limit)
            return bytes(self._buf + chunk[:end])
        self._buf += chunk
        if len(self._buf) > self._limit:
            raise too_large(self._what, len(self._buf), self._limit, more=True)
        return None

    def eof(self) -> CniError:
        """The error for a peer that closed before its newline."""
        return CniError(
            DECODE_ERROR, "message ended before its newline", f"{len(self._buf)} bytes received without '\\n'"
        )


def too_large(what: str, size: int, limit: int = MAX_REQUEST_BYTES, more: bool = False) -> CniError:
    """The error for a *what* ("request", "response") line of *size* bytes over *limit*."""
    at_least = "at least " if more else ""
    return CniError(
        INVALID_ENV, f"{what} too large ({at_least}{size} bytes, limit {limit})", f"{what} line over {limit} bytes"
    )


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
    if len(line) > MAX_REQUEST_BYTES:
        raise too_large(what, len(line))
    try:
        obj = load_json(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CniError(DECODE_ERROR, f"{what} is not UTF-8", str(exc)[:256]) from None
    except ValueError as exc:
        raise CniError(DECODE_ERROR, f"{what} is not valid JSON", str(exc)[:256]) from None
    if not isinstance(obj, dict):
        raise CniError(DECODE_ERROR, f"{what} is not a JSON object", f"got {type(obj).__name__}")
    return obj
