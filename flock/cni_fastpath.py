"""The CNI plugin's fast path: the bundle's main script (see :mod:`flock.shim_bundle`).

Every pod start and stop execs the plugin twice or more, so its cost over a
bare ``python3 -I -S`` is paid per pod.  That cost is imports and compiling:
``json`` pulls in ``re`` (~6 ms), a zipapp's ``runpy`` ~3.5 ms, and a main
script is compiled at every run (it never gets a .pyc).  So this file is small
and imports only modules that are built in or already loaded at start-up
(``os``, ``sys``, ``_json``, ``_socket``, ``time``, ``fcntl``) and
:mod:`flock.cni_common` (the constants, limits and transport it shares with
the full shim and the agent; the bundle inlines it beside this file), and it
handles the common invocations itself:

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
imported from there only when needed.  Nothing imports this module (it is an
entry point): the hand-over to :mod:`flock.cni_shim` is one way.
"""

import posix as os  # what os wraps, already loaded at start-up (os itself is not, under -S)
import sys

from flock.cni_common import (
    CONTAINER_ID_CHARS,
    DEFAULT_SOCKET,
    ENV_OF_FIELD,
    FD_OPS,
    FD_OPTIONAL_OPS,
    LATEST_VERSION,
    MAX_CNI_ARG_CHARS,
    MAX_CONTAINER_ID_CHARS,
    MAX_IF_NAME_BYTES,
    MAX_REQUEST_BYTES,
    MAX_SOCKET_PATH_BYTES,
    OPS,
    PROTOCOL_VERSION,
    REQUIRED_FIELDS,
    RESERVED_IF_NAMES,
    RPC_TIMEOUT_MAX_S,
    RPC_TIMEOUT_MIN_S,
    RPC_TIMEOUT_S,
    SUPPORTED_VERSIONS,
    AgentUnreachable,
    ReplyTooLarge,
    call,
    convert_result,
    json_too_deep,
    open_netns_fd,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, TextIO

# Set by the bundle's loader (flock.shim_bundle) to its embedded modules, packed; None when flock is installed.
_BUNDLE = None  # type: Any

# What the fast path accepts without asking flock.cni_shim: plain ASCII names.
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


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
    for field in REQUIRED_FIELDS[command]:
        if not env.get(ENV_OF_FIELD[field]):
            return None
    container_id, netns, if_name = env.get("CNI_CONTAINERID", ""), env.get("CNI_NETNS", ""), env.get("CNI_IFNAME", "")
    if container_id and not (
        len(container_id) <= MAX_CONTAINER_ID_CHARS
        and container_id[0] in _ALNUM
        and CONTAINER_ID_CHARS.issuperset(container_id)
    ):
        return None
    if len(env.get("CNI_ARGS", "")) > MAX_CNI_ARG_CHARS and command != "DEL":
        return None  # perhaps a key or value over the limit: the full shim decides
    if if_name and not (
        len(if_name) <= MAX_IF_NAME_BYTES
        and if_name not in RESERVED_IF_NAMES
        and CONTAINER_ID_CHARS.issuperset(if_name)
    ):
        return None  # ASCII only here, so characters are bytes
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

    Imported late (it costs milliseconds) and by name; cni_shim never imports
    this module (what the two share is in :mod:`flock.cni_common`)."""
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
