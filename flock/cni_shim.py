"""``flock``, the CNI plugin: environment + stdin → one RPC to flock-agent → stdout.

Runs on the host, where flock is not installed: standard library only, Python
3.8 syntax, and it may import only :mod:`flock.cni_common`, :mod:`flock.errors`
and the stdlib modules of :mod:`flock.rpc` (``flock.shim_bundle`` packs
exactly those into one file).  It is on every pod's start-up path, so it
imports little and late.  :mod:`flock.cni_fastpath`, the bundle's entry
point, hands over to :func:`run`; this module never imports it.

Error handling: nothing is retried here; the container runtime retries.
Every failure becomes the CNI error object on stdout and exit status 1:

- bad configuration JSON → 6; unsupported ``cniVersion`` → 1; a missing or
  invalid ``CNI_*`` variable → 4 (all checked before dialling);
- ADD or CHECK whose ``CNI_NETNS`` cannot be opened as a network namespace → 4
  naming the path and the OS error (the namespace travels to the agent as an
  fd: wire version 2); a DEL without one goes ahead by container ID;
- a request over the shared size limit (``MAX_REQUEST_BYTES``) → 4, except a
  DEL, which is sent without its configuration (it needs none);
- agent unreachable or silent past the call's deadline: ADD, CHECK and GC → 11
  (try again later), STATUS → 50, DEL → the request is recorded in flock's
  own pending-deletes directory for the agent to replay, and succeeds;
- an error the agent answers is passed through unchanged.

The pending-deletes directory is never derived from the request (the
configuration's ``socket`` only says where to dial): it is
``/run/flock/pending-deletes`` unless the installer baked another one into
the bundle (``flock/_site.py``, from its own ``--socket``) or the runtime's
environment sets ``FLOCK_PENDING_DELETES``.
"""

from __future__ import annotations

import json
import os
import sys
from types import MappingProxyType

from flock.cni_common import (
    DEFAULT_SOCKET,
    ENV_OF_FIELD,
    FD_OPS,
    FD_OPTIONAL_OPS,
    LATEST_VERSION,
    MAX_ERROR_CODE,
    MAX_REQUEST_BYTES,
    MAX_SOCKET_PATH_BYTES,
    OPS,
    PENDING_DELETES,
    PROTOCOL_VERSION,
    REQUIRED_FIELDS,
    RPC_TIMEOUT_MAX_S,
    RPC_TIMEOUT_MIN_S,
    RPC_TIMEOUT_S,
    SUPPORTED_VERSIONS,
    AgentUnreachable,
    ReplyTooLarge,
    open_netns_fd,
)
from flock.cni_common import call as _transport
from flock.errors import (
    DECODE_ERROR,
    INCOMPATIBLE_PROTOCOL,
    INTERNAL,
    INVALID_CONFIG,
    INVALID_ENV,
    IO_ERROR,
    MAX_ERROR_BYTES,
    NOT_AVAILABLE,
    TRY_AGAIN_LATER,
    CniError,
    bounded,
    quote,
)
from flock.rpc.cniresult import check_cni_version, convert_result, version_reply
from flock.rpc.wire import Request, decode_response, field_error, load_json, too_large

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, TextIO

DEFAULT_PENDING_DELETES_DIR = "/run/flock/" + PENDING_DELETES
PENDING_DELETES_ENV = "FLOCK_PENDING_DELETES"

# The variables checked before dialling (the agent checks the same request fields again).
_CHECKED_ENV = MappingProxyType({**ENV_OF_FIELD, "args": "CNI_ARGS"})


def run(env: Mapping[str, str], stdin: bytes, stdout: TextIO, call: Callable[..., bytes] | None = None) -> int:
    """One plugin invocation; returns the exit status (0 or 1).

    *call* exchanges the request line with the agent (:func:`_call`'s
    signature); the fast path passes one that gives the reply it already has."""
    config = {}  # type: dict[str, Any]
    try:
        command = env.get("CNI_COMMAND", "")
        if command == "VERSION":
            config = _parse_config(stdin, lenient=True)
            _print(stdout, version_reply(config.get("cniVersion")))
            return 0
        if command not in OPS:
            raise CniError(
                INVALID_ENV,
                "invalid CNI_COMMAND",
                "CNI_COMMAND={}; expected one of VERSION, {}".format(quote(command), ", ".join(OPS)),
            )
        if len(stdin) > MAX_REQUEST_BYTES and command != "DEL":
            raise too_large("request", len(stdin))
        config = _parse_config(stdin, lenient=False)
        cni_version = check_cni_version(config)
        request = _build_request(command, env, config)
        socket_path, timeout = _settings(config)
        netns_fd = _open_netns(command, request.netns)
        try:
            request.netns_fd = netns_fd
            result = _exchange(request, socket_path, timeout, pending_deletes_dir(env), call or _call)
        finally:
            if netns_fd is not None:
                os.close(netns_fd)
        if command == "ADD":
            _print(stdout, convert_result(result, cni_version))
        return 0
    except Exception as exc:  # a bug here must still reach the runtime as a CNI error
        err = exc if isinstance(exc, CniError) else CniError(INTERNAL, "flock shim failed", repr(exc))
        requested = config.get("cniVersion")
        # Only a version flock knows is echoed: a 100 KB one is not.
        version = requested if isinstance(requested, str) and requested in SUPPORTED_VERSIONS else LATEST_VERSION
        stdout.write(error_document(version, err.code, err.msg, err.details))
        stdout.flush()
        return 1


def main() -> None:
    """Console-script and zipapp entry point."""
    sys.exit(run(os.environ, sys.stdin.buffer.read(), sys.stdout))


def _parse_config(stdin: bytes, lenient: bool) -> dict[str, Any]:
    try:
        config = load_json(stdin.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError and too deep nesting are ValueErrors too
        if lenient:
            return {}
        raise CniError(DECODE_ERROR, "network configuration is not valid JSON", f"stdin: {exc}") from None
    if not isinstance(config, dict):
        if lenient:
            return {}
        raise CniError(
            DECODE_ERROR, "network configuration is not a JSON object", f"stdin holds a {type(config).__name__}"
        )
    return config


def _build_request(command: str, env: Mapping[str, str], config: dict[str, Any]) -> Request:
    for field in REQUIRED_FIELDS[command]:
        name = ENV_OF_FIELD[field]
        if not env.get(name):
            raise CniError(INVALID_ENV, "missing environment variable", f"{name} is required for {command}")
    checked = ENV_OF_FIELD if command == "DEL" else _CHECKED_ENV  # a DEL needs no CNI_ARGS: never refused for it
    for field, name in checked.items():
        invalid = field_error(field, env.get(name, ""))
        if invalid is not None:
            msg, expected = invalid
            raise CniError(INVALID_ENV, msg, f"{name}={quote(env[name])}: {expected}")
    return Request(
        op=command,
        container_id=env.get("CNI_CONTAINERID", ""),
        netns=env.get("CNI_NETNS", ""),
        if_name=env.get("CNI_IFNAME", ""),
        args=env.get("CNI_ARGS", ""),
        path=env.get("CNI_PATH", ""),
        config=config,
        version=PROTOCOL_VERSION,
    )


def _settings(config: dict[str, Any]) -> tuple[str, float]:
    socket_path = config.get("socket", DEFAULT_SOCKET)
    if not _is_socket_path(socket_path):
        raise CniError(
            INVALID_CONFIG,
            "invalid network configuration",
            f"socket={quote(socket_path)}: expected an absolute path of at most {MAX_SOCKET_PATH_BYTES} bytes without NUL",
        )
    timeout = config.get("rpcTimeout", RPC_TIMEOUT_S)
    # Compared before float(): an integer too large for a float must not escape as OverflowError,
    # and inf / 1e300 overflow socket.settimeout.
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not RPC_TIMEOUT_MIN_S <= timeout <= RPC_TIMEOUT_MAX_S
    ):
        raise CniError(
            INVALID_CONFIG,
            "invalid network configuration",
            f"rpcTimeout={quote(timeout)}: expected a number of seconds from {RPC_TIMEOUT_MIN_S:g} to {RPC_TIMEOUT_MAX_S:g}",
        )
    return socket_path, float(timeout)


def _open_netns(command: str, path: str) -> int | None:
    """CNI_NETNS opened as the fd the request carries (None: the op sends none).

    ADD and CHECK need it: failing to open it, or finding it is not a network
    namespace, is code 4 naming the path and why.  A DEL sends it when it
    can and goes ahead without it otherwise (the sandbox may be gone).
    """
    if command not in FD_OPS + FD_OPTIONAL_OPS or not path:
        return None
    try:
        return open_netns_fd(path)
    except OSError as exc:
        if command in FD_OPTIONAL_OPS:
            return None
        reason = f"[Errno {exc.errno}] {exc.strerror}" if exc.errno is not None else str(exc)
        raise CniError(INVALID_ENV, "cannot open the network namespace", f"CNI_NETNS={quote(path)}: {reason}") from None


def _is_socket_path(value: object) -> bool:
    """An absolute path the kernel can take as an AF_UNIX address.  A NUL would
    silently cut the path short (the kernel reads up to the first NUL)."""
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        return False
    try:
        return len(os.fsencode(value)) <= MAX_SOCKET_PATH_BYTES
    except UnicodeError:
        return False


def _exchange(
    request: Request, socket_path: str, timeout: float, journal: str, call: Callable[..., bytes]
) -> dict[str, Any]:
    line = request.encode()
    if len(line) > MAX_REQUEST_BYTES:
        if request.op != "DEL":
            raise too_large("request", len(line))
        # A DEL needs only the container ID (and names the netns and ifName for the log).
        request = request.without_config()
        line = request.encode()
    try:
        try:
            return decode_response(call(socket_path, line, timeout, request.netns_fd))
        except CniError as err:
            if err.code != INCOMPATIBLE_PROTOCOL or request.version == 1:
                raise
            # An agent from before version 2 (mid-upgrade): ask it by path, as it expects.
            return decode_response(call(socket_path, request.as_version(1).encode(), timeout))
    except AgentUnreachable as exc:
        if request.op == "DEL":
            # The agent replays this queue at start and while running; DEL is
            # idempotent, so a DEL the agent did receive before going quiet is
            # harmless to repeat.
            _record_pending_delete(request, journal)
            return {}
        code = NOT_AVAILABLE if request.op == "STATUS" else TRY_AGAIN_LATER
        raise CniError(code, "flock-agent is not reachable", f"{socket_path}: {exc}") from None


def _call(socket_path: str, line: bytes, timeout: float, netns_fd: int | None = None) -> bytes:
    """Send *line* (with *netns_fd* as SCM_RIGHTS on its first bytes), return
    the reply line; the whole exchange ends within *timeout* (AgentUnreachable
    otherwise).  The fast path's transport (flock.cni_common), its oversized
    reply worded as a CNI error."""
    try:
        return _transport(socket_path, line, timeout, netns_fd)
    except ReplyTooLarge as exc:
        size, more = exc.args
        raise too_large("response", size, MAX_REQUEST_BYTES, more=more) from None


def pending_deletes_dir(env: Mapping[str, str]) -> str:
    """flock's own journal directory (see the module doc), never taken from a
    request: ``FLOCK_PENDING_DELETES`` in the runtime's environment (an absolute
    path; set by whoever runs the runtime, as for tests and the lab), else
    the installer's setting, else ``/run/flock/pending-deletes``."""
    override = env.get(PENDING_DELETES_ENV, "")
    if override.startswith("/") and "\0" not in override:
        return override
    try:
        from flock._site import PENDING_DELETES_DIR  # type: ignore[import-not-found]
    except ImportError:
        return DEFAULT_PENDING_DELETES_DIR
    return PENDING_DELETES_DIR


def _record_pending_delete(request: Request, directory: str) -> None:
    """Write the DEL as ``<pending-deletes>/<containerID>.json``, atomically and
    durably.  The record is small (no configuration, no fd) and always replayable."""
    # Version 1: no fd to carry, and any agent, older ones included, replays it.
    record = request.without_config().as_version(1)
    final = os.path.join(directory, request.container_id + ".json")
    tmp = os.path.join(directory, f".{request.container_id}.{os.getpid()}.tmp")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with open(fd, "wb") as f:
            f.write(record.encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise CniError(
            IO_ERROR, "flock-agent is not reachable and the DEL could not be recorded", f"{final}: {exc}"
        ) from None


def error_document(cni_version: str, code: int, msg: str, details: str) -> str:
    """The CNI error object as printed, newline included: one JSON document
    under :data:`MAX_ERROR_BYTES` whatever it is given.  CniError bounds
    its fields where the error is built; this is the last line of defence
    (it shortens ``details``, then ``msg``, and never emits an invalid document)."""
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= MAX_ERROR_CODE:
        details = f"code {quote(code, 32)}: {details}"
        code = INTERNAL
    obj = {"cniVersion": cni_version, "code": code, "msg": str(msg), "details": str(details)}  # type: dict[str, Any]
    for field, share in (("details", 2048), ("details", 512), ("msg", 128), ("details", 0), ("msg", 0)):
        text = json.dumps(obj) + "\n"
        if len(text) < MAX_ERROR_BYTES:
            return text
        obj[field] = bounded(str(obj[field]), share)
    return json.dumps({"cniVersion": LATEST_VERSION, "code": INTERNAL, "msg": "error too large"}) + "\n"


def _print(stdout: TextIO, obj: dict[str, Any]) -> None:
    stdout.write(json.dumps(obj) + "\n")
    stdout.flush()


if __name__ == "__main__":
    main()
