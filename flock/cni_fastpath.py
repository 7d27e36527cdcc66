"""The CNI plugin's fast path: the bundle's main script (see :mod:`flock.shim_bundle`).

Every pod start and stop execs the plugin twice or more, so its cost over a
bare ``python3 -I -S`` is paid per pod.  That cost is imports and compiling:
``json`` pulls in ``re`` (~6 ms), a zipapp's ``runpy`` ~3.5 ms, and a main
script is compiled at every run (it never gets a .pyc).  So this file is small
and imports only modules that are built in or already loaded at start-up
(``os``, ``sys``, ``_json``, ``_socket``, ``time``, ``fcntl``), and it handles
the common invocations itself:

- VERSION;
- ADD, CHECK, DEL, STATUS, GC whose configuration and environment pass a
  *conservative* subset of :mod:`flock.cni_shim`'s checks: the configuration
  is parsed with ``_json``'s C scanner (no ``re``), and forwarded to the agent
  as the raw bytes it came in (line breaks, which JSON allows only as white
  space, become spaces); the agent parses and validates it again.

Anything else (a check this file is unsure of, an error to format, an agent
that is unreachable, a DEL to journal, a reply other than a plain success)
goes to :func:`flock.cni_shim.run`, the full implementation and the authority
on every error: before dialling, by running it instead; after dialling, by
running it with the reply already received (so a request is sent once).
Because this file only ever *accepts less* than the full shim, the two agree
on every input (the tests run both on the same inputs).

Standard library only, Python 3.8 syntax; annotations are strings by hand (``from __future__``
imports the ``__future__`` module at run time).  In the bundle, ``_BUNDLE`` holds
the other shim modules (source, and bytecode for the building interpreter),
imported from there only when needed.
"""

import posix as os  # what os wraps, already loaded at start-up (os itself is not, under -S)
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, TextIO

# Set by the bundle's loader (flock.shim_bundle) to its embedded modules, packed; None when flock is installed.
_BUNDLE = None  # type: Any

# The CNI versions flock speaks (flock.rpc.cniresult imports them from here).
SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST_VERSION = SUPPORTED_VERSIONS[-1]
# Copies of constants defined in flock.rpc.wire / flock.cni_shim, which this
# file must not import on the fast path (tests/shim check each copy equals its original).
OPS = ("ADD", "DEL", "CHECK", "STATUS", "GC")
FD_OPS = ("ADD", "CHECK")
FD_OPTIONAL_OPS = ("DEL",)
REQUIRED_ENV = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME"),
    "STATUS": (),
    "GC": (),
}
PROTOCOL_VERSION = 2
MAX_REQUEST_BYTES = 8 << 20
MAX_JSON_DEPTH = 64
MAX_CONTAINER_ID_CHARS = 200
MAX_CNI_ARG_CHARS = 4096

# Defined here (the fast path needs them) and imported by flock.cni_shim.
DEFAULT_SOCKET = "/run/flock/flock.sock"
RPC_TIMEOUT_S = 30.0
RPC_TIMEOUT_MIN_S = 0.1
RPC_TIMEOUT_MAX_S = 300.0
# The namespace is opened as the agent will use it; O_NONBLOCK and O_NOCTTY
# keep a FIFO or a terminal named as CNI_NETNS from blocking or adopting us.
NETNS_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_NS_GET_NSTYPE = 0xB703  # linux/nsfs.h
_CLONE_NEWNET = 0x40000000
# sun_path is 108 bytes on Linux, the terminating NUL included.
MAX_SOCKET_PATH_BYTES = 107

# What the fast path accepts without asking flock.cni_shim: plain ASCII names.
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_RESERVED_IF_NAMES = (".", "..", "all", "default")


class AgentUnreachable(Exception):
    """No answer from flock-agent: connect failed, or the call ran out of time."""


class ReplyTooLarge(Exception):
    """The agent's reply line passed the size limit: ``args == (size, more)``."""


def main() -> None:
    """The bundle's entry point."""
    # posix.environ holds bytes; decoded as os.environ decodes them.
    env = {k.decode("utf-8", "surrogateescape"): v.decode("utf-8", "surrogateescape") for k, v in os.environ.items()}
    status = run(env, sys.stdin.buffer.read(), sys.stdout)
    if "flock.cni_shim" in sys.modules:
        sys.exit(status)  # the full shim ran: the interpreter's ordinary exit
    # The fast path alone ran: it wrote its output through sys.stdout and holds
    # nothing else to finish, so the interpreter's teardown (a millisecond or
    # two of freeing every object, per plugin call) is skipped.
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        status = 120  # what the interpreter's exit returns when flushing its streams fails
    os._exit(status)


def run(env: "Mapping[str, str]", stdin: bytes, stdout: "TextIO") -> int:
    """One plugin invocation, as :func:`flock.cni_shim.run` (same status and output)."""
    command = env.get("CNI_COMMAND", "")
    if command == "VERSION":
        config = loads(stdin)
        version = config.get("cniVersion") if isinstance(config, dict) and not json_too_deep(config) else None
        _print(stdout, {"cniVersion": version if version in SUPPORTED_VERSIONS else LATEST_VERSION,
                        "supportedVersions": list(SUPPORTED_VERSIONS)})  # fmt: skip
        return 0
    prepared = _prepare(command, env, stdin)
    if prepared is None:
        return _full().run(env, stdin, stdout)
    socket_path, timeout, line, netns_fd, cni_version = prepared
    try:
        outcome = _outcome(socket_path, line, timeout, netns_fd)
    finally:
        if netns_fd is not None:
            os.close(netns_fd)
    if isinstance(outcome, bytes):
        reply = loads(outcome)
        result = reply.get("result") if isinstance(reply, dict) and "error" not in reply else None
        if isinstance(result, dict):
            if command == "ADD":
                try:
                    _print(stdout, convert_result(result, cni_version))
                except Exception:
                    pass  # a malformed result: the full shim names what is wrong
                else:
                    return 0
            else:
                return 0
    return _full().run(env, stdin, stdout, call=_replay(outcome))


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
    SUPPORTED_VERSIONS (see :mod:`flock.rpc.cniresult`, which checks the
    version and names a :class:`MalformedResult` as a CNI error).  Defined
    here so the shim's fast path converts an ADD's result without importing
    anything."""
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


def _prepare(
    command: str, env: "Mapping[str, str]", stdin: bytes
) -> "tuple[str, float, bytes, int | None, str] | None":
    """``(socket, timeout, request line, netns fd, cniVersion)``, or None when
    the full shim must decide (nothing has been opened or sent then)."""
    if command not in OPS or len(stdin) > MAX_REQUEST_BYTES:
        return None
    config = loads(stdin)
    if not isinstance(config, dict):
        return None
    cni_version = config.get("cniVersion")
    if cni_version not in SUPPORTED_VERSIONS:
        return None
    for name in REQUIRED_ENV[command]:
        if not env.get(name):
            return None
    container_id, netns, if_name = env.get("CNI_CONTAINERID", ""), env.get("CNI_NETNS", ""), env.get("CNI_IFNAME", "")
    if container_id and not (
        len(container_id) <= MAX_CONTAINER_ID_CHARS and container_id[0] in _ALNUM and _ID_CHARS.issuperset(container_id)
    ):
        return None
    if len(env.get("CNI_ARGS", "")) > MAX_CNI_ARG_CHARS and command != "DEL":
        return None  # perhaps a key or value over the limit: the full shim decides
    if if_name and not (len(if_name) <= 15 and if_name not in _RESERVED_IF_NAMES and _ID_CHARS.issuperset(if_name)):
        return None
    if netns and not (netns.startswith("/") and "\0" not in netns):
        return None
    socket_path = config.get("socket", DEFAULT_SOCKET)
    if not (isinstance(socket_path, str) and socket_path.startswith("/") and "\0" not in socket_path):
        return None
    try:
        if len(socket_path.encode("utf-8")) > MAX_SOCKET_PATH_BYTES:
            return None
    except UnicodeError:
        return None
    timeout = config.get("rpcTimeout", RPC_TIMEOUT_S)
    if type(timeout) not in (int, float) or not RPC_TIMEOUT_MIN_S <= timeout <= RPC_TIMEOUT_MAX_S:
        return None
    if json_too_deep(config):
        return None
    from _json import encode_basestring_ascii as quote

    netns_fd = None
    if netns and command in FD_OPS + FD_OPTIONAL_OPS:
        try:
            netns_fd = open_netns_fd(netns)
        except OSError:
            if command not in FD_OPTIONAL_OPS:
                return None  # the full shim words the error
    # The configuration as it came (it parsed as JSON, so a line break is white space, never in a string).
    raw = stdin.strip(b" \t\r\n").replace(b"\n", b" ").replace(b"\r", b" ")
    head = '{"version":%d,"op":"%s","containerID":%s,"netns":%s,"ifName":%s,"args":%s,"path":%s,"config":' % (  # noqa: UP031
        PROTOCOL_VERSION,
        command,
        quote(container_id),
        quote(netns),
        quote(if_name),
        quote(env.get("CNI_ARGS", "")),
        quote(env.get("CNI_PATH", "")),
    )
    line = head.encode("ascii") + raw + (b',"netnsFd":true}\n' if netns_fd is not None else b',"netnsFd":false}\n')
    if len(line) - 1 > MAX_REQUEST_BYTES:
        if netns_fd is not None:
            os.close(netns_fd)
        return None
    return socket_path, float(timeout), line, netns_fd, cni_version


def _outcome(socket_path: str, line: bytes, timeout: float, netns_fd: "int | None") -> "bytes | Exception":
    try:
        return call(socket_path, line, timeout, netns_fd)
    except (AgentUnreachable, ReplyTooLarge) as exc:
        return exc


def _replay(outcome: "bytes | Exception") -> "Callable[..., bytes]":
    """A ``call`` for the full shim that gives the exchange already made, then dials for real."""
    pending = [outcome]

    def replay(socket_path: str, line: bytes, timeout: float, netns_fd: "int | None" = None) -> bytes:
        if not pending:
            return call(socket_path, line, timeout, netns_fd)
        got = pending.pop()
        if isinstance(got, Exception):
            raise got
        return got

    return replay


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


class _Context:
    """What ``_json.make_scanner`` reads: json.loads' defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo = None

    @staticmethod
    def parse_constant(name: str) -> float:
        return {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}[name]


_WS = " \t\n\r"


def loads(data: bytes) -> "Any":
    """``json.loads(data.decode())`` for a document that is valid JSON, without
    importing json (whose ``re`` costs milliseconds); None when it is not valid
    (the full shim then says why)."""
    try:
        text = data.decode("utf-8")
        from _json import make_scanner

        start = len(text) - len(text.lstrip(_WS))
        value, end = make_scanner(_Context)(text, start)  # type: ignore[arg-type]  # duck-typed: the C scanner reads attributes
        if text[end:].strip(_WS):
            return None
        return value
    except Exception:  # not JSON, too deep (RecursionError), or no _json: the full shim decides
        return None


def json_too_deep(value: object, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether decoded JSON *value* nests lists/objects more than *limit* deep
    (iterative: this must not recurse itself).  flock.rpc.wire uses it too."""
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


def _default(obj: object) -> "Any":
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def _print(stdout: "TextIO", obj: "dict[str, Any]") -> None:
    """``json.dumps(obj)`` and a newline, through ``_json``'s C encoder."""
    try:
        from _json import encode_basestring_ascii, make_encoder

        text = "".join(
            make_encoder({}, _default, encode_basestring_ascii, None, ": ", ", ", False, False, True)(obj, 0)
        )
    except Exception:  # a python without _json, or whose make_encoder takes other arguments
        import json

        text = json.dumps(obj)
    stdout.write(text + "\n")
    stdout.flush()


def _bundle_imports() -> None:
    """In the bundle: let ``import flock.*`` find the embedded modules."""
    global _BUNDLE
    if _BUNDLE is None or any(isinstance(f, _BundleFinder) for f in sys.meta_path):
        return
    if isinstance(_BUNDLE, str):
        from binascii import a2b_base64
        from marshal import loads as unmarshal
        from zlib import decompress

        _BUNDLE = unmarshal(decompress(a2b_base64(_BUNDLE)))
    sys.meta_path.insert(0, _BundleFinder())


def _full() -> "Any":
    """:mod:`flock.cni_shim`, from the bundle's embedded modules when flock is not installed.

    Looked up by name: cni_shim builds on this module (its transport and
    constants), and this hand-over at run time is the one way back."""
    _bundle_imports()
    return __import__("flock.cni_shim", fromlist=["run"])


class _BundleFinder:
    """Imports ``flock.*`` from ``_BUNDLE``: bytecode for the building interpreter, else source."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> "Any":
        if name not in _BUNDLE["modules"]:
            return None
        bootstrap = sys.modules["_frozen_importlib"]
        return bootstrap.spec_from_loader(name, self, is_package=name in _BUNDLE["packages"])

    def create_module(self, spec: "Any") -> None:
        return None

    def exec_module(self, module: "Any") -> None:
        name = module.__name__
        code = None
        external = sys.modules.get("_frozen_importlib_external")
        if external is not None and getattr(external, "MAGIC_NUMBER", None) == _BUNDLE["magic"]:
            import marshal

            code = marshal.loads(_BUNDLE["code"][name])
        if code is None:
            code = compile(_BUNDLE["modules"][name], "<flock bundle>/" + name, "exec", dont_inherit=True)
        exec(code, module.__dict__)


if __name__ == "__main__":
    main()
