"""What the CNI shim, its fast path and the agent's side of the wire share: one home.

The wire's names and limits (ops, protocol versions, size and depth limits,
which request fields each op needs), the CNI versions flock speaks and the
conversion of an ADD result to them, and the shim's transport (one request
line out, with the pod's namespace fd, one reply line back).  Imported by
:mod:`flock.cni_fastpath`, :mod:`flock.cni_shim`, :mod:`flock.rpc.wire` and
:mod:`flock.rpc.cniresult`; it imports nothing from flock (tests/architecture
checks it), so there is no way round back to any of them.

It is on every pod's start-up path: the shim bundle (:mod:`flock.shim_bundle`)
inlines this module's bytecode beside the fast path's and runs both at every
plugin call.  So, like the fast path: standard library only, Python 3.8
syntax, annotations as strings by hand (``from __future__`` imports a module
at run time), and at module level only what ``python3 -I -S`` has loaded
already (``posix``, ``sys``); anything else is imported late, by the function
that needs it.
"""

import posix as os  # what os wraps, already loaded at start-up (os itself is not, under -S)
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

# A read-only dict view, as types.MappingProxyType (which is this very type) without importing types.
_ReadOnly = type(type.__dict__)

# The CNI versions flock speaks (CNI spec), oldest first.
SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST_VERSION = SUPPORTED_VERSIONS[-1]

# Wire protocol versions (DESIGN: "Wire protocol"): the shim sends PROTOCOL_VERSION, the agent takes any
# of SPOKEN_VERSIONS; from FD_VERSION on, the pod's network namespace travels as a file descriptor.
PROTOCOL_VERSION = 2
SPOKEN_VERSIONS = (1, 2)
FD_VERSION = 2

OPS = ("ADD", "DEL", "CHECK", "STATUS", "GC")
# Ops that need the pod's namespace (version 2: as an fd), and those that may send it.
FD_OPS = ("ADD", "CHECK")
FD_OPTIONAL_OPS = ("DEL",)

# Which request strings must be non-empty, per op (CNI spec 1.1, "Parameters").
# DEL may come without a netns (the sandbox is already gone).
REQUIRED_FIELDS: "Mapping[str, tuple[str, ...]]" = _ReadOnly(
    {
        "ADD": ("containerID", "netns", "ifName"),
        "CHECK": ("containerID", "netns", "ifName"),
        "DEL": ("containerID", "ifName"),
        "STATUS": (),
        "GC": (),
    }
)
# The CNI variable behind each of those request fields.
ENV_OF_FIELD: "Mapping[str, str]" = _ReadOnly(
    {"containerID": "CNI_CONTAINERID", "netns": "CNI_NETNS", "ifName": "CNI_IFNAME"}
)

# The one request size limit, shared by shim and agent: the longest request
# (or response) line, newline excluded.  A network configuration is a few
# KiB; configurations up to 4 MiB fit even when JSON escaping doubles them.
# Over it, ADD/CHECK/STATUS/GC are refused with code 4 ("request too
# large"); the shim sends a DEL without its configuration instead (a DEL
# needs only the container ID).
MAX_REQUEST_BYTES = 8 << 20

# Deepest JSON nesting accepted (a network configuration nests a handful of
# levels).  json.loads manages ~1000, but repr() and json.dumps of such a
# value a few frames deeper then raise RecursionError far from the input.
MAX_JSON_DEPTH = 64

# Characters of a container ID (CNI spec: alphanumeric plus ``_ . -``, an alphanumeric first).
CONTAINER_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
# Longest container ID taken.  Runtimes use 64 hex digits; the ID names a file
# (the DEL journal's ``.<id>.<pid>.tmp``) whose name the kernel caps at 255 bytes.
MAX_CONTAINER_ID_CHARS = 200
# Longest interface name (IFNAMSIZ less its NUL), and names the kernel gives a
# meaning of its own: /proc/sys/net/ipv*/conf/{all,default}.
MAX_IF_NAME_BYTES = 15
RESERVED_IF_NAMES = (".", "..", "all", "default")
# Longest CNI_ARGS key or value taken (a pod name is at most 253 characters).
# Any longer is refused naming the key, so neither the agent's logs nor an
# error carry it.  A CNI_ARGS no longer than this holds no such item.
MAX_CNI_ARG_CHARS = 4096

# CNI error codes are small unsigned numbers; a reply with another is malformed.
MAX_ERROR_CODE = 0xFFFFFFFF

# Name of the directory where the shim records a DEL the agent could not take
# and the agent replays it from (shared by both ends).
PENDING_DELETES = "pending-deletes"

# Where the agent listens unless the configuration's ``socket`` says otherwise.
DEFAULT_SOCKET = "/run/flock/flock.sock"
# sun_path is 108 bytes on Linux, the terminating NUL included.
MAX_SOCKET_PATH_BYTES = 107
# The shim's time bound on one call: longer than the agent's own 25 s ADD
# deadline, so the agent's answer (code 11) normally wins; the configuration's
# ``rpcTimeout`` overrides it within the sane range.
RPC_TIMEOUT_S = 30.0
RPC_TIMEOUT_MIN_S = 0.1
RPC_TIMEOUT_MAX_S = 300.0

# The namespace is opened as the agent will use it; O_NONBLOCK and O_NOCTTY
# keep a FIFO or a terminal named as CNI_NETNS from blocking or adopting us.
NETNS_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_NS_GET_NSTYPE = 0xB703  # linux/nsfs.h
_CLONE_NEWNET = 0x40000000


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


_LEGACY = ("0.3.0", "0.3.1", "0.4.0")
_INTERFACE_FIELDS_1_0 = ("name", "mac", "sandbox")
_INTERFACE_FIELDS_1_1 = (*_INTERFACE_FIELDS_1_0, "mtu", "socketPath", "pciID")
_ROUTE_FIELDS_1_0 = ("dst", "gw")
_ROUTE_FIELDS_1_1 = (*_ROUTE_FIELDS_1_0, "mtu", "advmss", "priority", "table", "scope")
_IP_FIELDS = ("address", "gateway", "interface")


class MalformedResult(ValueError):
    """A result whose ``key`` is not a list of objects (its ``value`` as found)."""

    def __init__(self, key: str, value: object) -> None:
        super().__init__(key)
        self.key, self.value = key, value


def convert_result(result: "dict[str, Any]", to_version: str) -> "dict[str, Any]":
    """A 1.1.0-form ADD result rewritten for *to_version*, one of
    SUPPORTED_VERSIONS (:func:`flock.rpc.cniresult.convert_result` checks the
    version and names a :class:`MalformedResult` as a CNI error).  Here so the
    shim's fast path converts an ADD's result without importing anything."""
    legacy = to_version in _LEGACY
    newest = to_version == "1.1.0"
    out = {"cniVersion": to_version}  # type: dict[str, Any]
    if "interfaces" in result:
        iface_fields = _INTERFACE_FIELDS_1_1 if newest else _INTERFACE_FIELDS_1_0
        out["interfaces"] = [_pick(iface, iface_fields) for iface in _objects(result, "interfaces")]
    if "ips" in result:
        ips = []
        for ip in _objects(result, "ips"):
            item = _pick(ip, _IP_FIELDS)
            if legacy:
                item["version"] = "6" if ":" in str(ip.get("address", "")) else "4"
            ips.append(item)
        out["ips"] = ips
    if "routes" in result:
        route_fields = _ROUTE_FIELDS_1_1 if newest else _ROUTE_FIELDS_1_0
        out["routes"] = [_pick(route, route_fields) for route in _objects(result, "routes")]
    if "dns" in result:
        out["dns"] = result["dns"]
    return out


def _objects(result: "dict[str, Any]", key: str) -> "list[dict[str, Any]]":
    items = result[key]
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise MalformedResult(key, items)
    return items


def _pick(obj: "dict[str, Any]", keys: "tuple[str, ...]") -> "dict[str, Any]":
    return {k: obj[k] for k in keys if k in obj}


class AgentUnreachable(Exception):
    """No answer from flock-agent: connect failed, or the call ran out of time."""


class ReplyTooLarge(Exception):
    """The agent's reply line passed the size limit: ``args == (size, more)``."""


def call(socket_path: str, line: bytes, timeout: float, netns_fd: "int | None" = None) -> bytes:
    """Send *line* (with *netns_fd* as SCM_RIGHTS on its first bytes), return
    the reply line without its newline; the whole exchange ends within *timeout*.

    AgentUnreachable: connect failed, the agent closed early or went quiet;
    ReplyTooLarge: the reply passed MAX_REQUEST_BYTES without a newline."""
    import _socket
    from time import monotonic

    deadline = monotonic() + timeout
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(socket_path)
        except OSError as exc:
            raise AgentUnreachable(f"connect: {exc}") from None
        buf = b""
        try:
            try:
                if netns_fd is not None:
                    # sendmsg, not socket.send_fds (3.9+): the shim runs on 3.8 too.
                    fds = netns_fd.to_bytes(4, sys.byteorder, signed=True)
                    sent = sock.sendmsg([line], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
                    line = line[sent:]
                sock.sendall(line)
            except (BrokenPipeError, ConnectionResetError):
                # The agent answered early (a refused request) and closed: its
                # reply, if any, is still readable below.
                pass
            while True:
                remaining = deadline - monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no reply within {timeout:g} s")
                sock.settimeout(remaining)
                chunk = sock.recv(65536)
                if not chunk:
                    raise AgentUnreachable(f"connection closed after {len(buf)} bytes of reply")
                end = chunk.find(b"\n")
                if end >= 0:
                    if len(buf) + end > MAX_REQUEST_BYTES:
                        raise ReplyTooLarge(len(buf) + end, False)
                    return buf + chunk[:end]
                buf += chunk
                if len(buf) > MAX_REQUEST_BYTES:
                    raise ReplyTooLarge(len(buf), True)
        except OSError as exc:  # socket.timeout is an OSError
            raise AgentUnreachable("no reply: {}".format(exc or "timed out")) from None
    finally:
        sock.close()


def open_netns_fd(path: str) -> int:
    """Open *path* and check it is a network namespace (OSError otherwise):
    stat first, so a FIFO or a device is never opened, nor sent an ioctl."""
    from _stat import S_ISREG
    from errno import EINVAL

    if not S_ISREG(os.stat(path).st_mode):
        raise OSError(EINVAL, "not a network namespace")
    fd = os.open(path, NETNS_OPEN_FLAGS)
    try:
        if not S_ISREG(os.fstat(fd).st_mode):
            raise OSError(EINVAL, "not a network namespace")
        import fcntl

        try:
            kind = fcntl.ioctl(fd, _NS_GET_NSTYPE)
        except OSError:
            raise OSError(EINVAL, "not a network namespace") from None
        if kind != _CLONE_NEWNET:
            raise OSError(EINVAL, "a namespace, but not a network namespace")
    except BaseException:
        os.close(fd)
        raise
    return fd
