"""``flock``, the CNI plugin: environment + stdin → one RPC to flock-agent → stdout.

Runs on the host, where flock is not installed: standard library only, Python
3.8 syntax, and it may import only :mod:`flock.errors` and the stdlib modules
of :mod:`flock.rpc` (``flock.shim_bundle`` packs exactly those into one file).
It is on every pod's start-up path, so it imports little and late.

Error handling: nothing is retried here; the container runtime retries.
Every failure becomes the CNI error object on stdout and exit status 1:

- bad configuration JSON → 6; unsupported ``cniVersion`` → 1; a missing or
  invalid ``CNI_*`` variable → 4 (all checked before dialling);
- agent unreachable or silent past the call's deadline: ADD, CHECK and GC → 11
  (try again later), STATUS → 50, DEL → the request is recorded under
  ``<socket dir>/pending-deletes/`` for the agent to replay, and succeeds;
- an error the agent answers is passed through unchanged.
"""

from __future__ import annotations

import json
import os
import sys
from types import MappingProxyType

from flock.errors import (
    DECODE_ERROR,
    INTERNAL,
    INVALID_CONFIG,
    INVALID_ENV,
    IO_ERROR,
    NOT_AVAILABLE,
    TRY_AGAIN_LATER,
    CniError,
)
from flock.rpc.cniresult import LATEST_VERSION, check_cni_version, convert_result, version_reply
from flock.rpc.wire import (
    OPS,
    PENDING_DELETES,
    REQUIRED_FIELDS,
    LineReader,
    Request,
    decode_response,
    field_error,
    load_json,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Mapping, TextIO

DEFAULT_SOCKET = "/run/flock/flock.sock"

# Bound on one whole call (connect + send + reply).  Longer than the agent's
# own 25 s ADD deadline, so the agent's answer (code 11) normally wins; the
# configuration key ``rpcTimeout`` (seconds) overrides it.
RPC_TIMEOUT_S = 30.0
# Upper bound on ``rpcTimeout``: anything longer is a typo (and inf overflows settimeout).
RPC_TIMEOUT_MAX_S = 3600.0
# sun_path is 108 bytes on Linux, the terminating NUL included.
_MAX_SOCKET_PATH_BYTES = 107

# The variable behind each request field the wire requires per op.
_ENV_OF_FIELD = MappingProxyType({"containerID": "CNI_CONTAINERID", "netns": "CNI_NETNS", "ifName": "CNI_IFNAME"})


class AgentUnreachable(Exception):
    """No answer from flock-agent: connect failed, or the call ran out of time."""


def run(env: Mapping[str, str], stdin: bytes, stdout: TextIO) -> int:
    """One plugin invocation; returns the exit status (0 or 1)."""
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
                "CNI_COMMAND={!r}; expected one of VERSION, {}".format(command, ", ".join(OPS)),
            )
        config = _parse_config(stdin, lenient=False)
        cni_version = check_cni_version(config)
        request = _build_request(command, env, config)
        socket_path, timeout = _settings(config)
        result = _exchange(request, socket_path, timeout)
        if command == "ADD":
            _print(stdout, convert_result(result, cni_version))
        return 0
    except Exception as exc:  # a bug here must still reach the runtime as a CNI error
        err = exc if isinstance(exc, CniError) else CniError(INTERNAL, "flock shim failed", repr(exc))
        requested = config.get("cniVersion")
        _print(
            stdout,
            {
                "cniVersion": requested if isinstance(requested, str) else LATEST_VERSION,
                "code": err.code,
                "msg": err.msg,
                "details": err.details,
            },
        )
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
        name = _ENV_OF_FIELD[field]
        if not env.get(name):
            raise CniError(INVALID_ENV, "missing environment variable", f"{name} is required for {command}")
    for field, name in _ENV_OF_FIELD.items():
        invalid = field_error(field, env.get(name, ""))
        if invalid is not None:
            msg, expected = invalid
            raise CniError(INVALID_ENV, msg, f"{name}={env[name]!r}: {expected}")
    return Request(
        op=command,
        container_id=env.get("CNI_CONTAINERID", ""),
        netns=env.get("CNI_NETNS", ""),
        if_name=env.get("CNI_IFNAME", ""),
        args=env.get("CNI_ARGS", ""),
        path=env.get("CNI_PATH", ""),
        config=config,
    )


def _settings(config: dict[str, Any]) -> tuple[str, float]:
    socket_path = config.get("socket", DEFAULT_SOCKET)
    if not _is_socket_path(socket_path):
        raise CniError(
            INVALID_CONFIG,
            "invalid network configuration",
            f"socket={socket_path!r}: expected an absolute path of at most {_MAX_SOCKET_PATH_BYTES} bytes without NUL",
        )
    timeout = config.get("rpcTimeout", RPC_TIMEOUT_S)
    # Compared before float(): an integer too large for a float must not escape as OverflowError,
    # and inf / 1e300 overflow socket.settimeout.
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= RPC_TIMEOUT_MAX_S:
        raise CniError(
            INVALID_CONFIG,
            "invalid network configuration",
            f"rpcTimeout={timeout!r}: expected a number of seconds in (0, {RPC_TIMEOUT_MAX_S:g}]",
        )
    return socket_path, float(timeout)


def _is_socket_path(value: object) -> bool:
    """An absolute path the kernel can take as an AF_UNIX address.  A NUL would
    silently cut the path short (the kernel reads up to the first NUL) and
    misplace the pending-deletes directory beside it."""
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        return False
    try:
        return len(os.fsencode(value)) <= _MAX_SOCKET_PATH_BYTES
    except UnicodeError:
        return False


def _exchange(request: Request, socket_path: str, timeout: float) -> dict[str, Any]:
    try:
        return decode_response(_call(socket_path, request.encode(), timeout))
    except AgentUnreachable as exc:
        if request.op == "DEL":
            # The agent replays this queue at start; DEL is idempotent, so a
            # DEL the agent did receive before going quiet is harmless to repeat.
            _record_pending_delete(socket_path, request)
            return {}
        code = NOT_AVAILABLE if request.op == "STATUS" else TRY_AGAIN_LATER
        raise CniError(code, "flock-agent is not reachable", f"{socket_path}: {exc}") from None


def _call(socket_path: str, line: bytes, timeout: float) -> bytes:
    """Send *line*, return the reply line; the whole exchange ends within *timeout*."""
    import socket
    import time

    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(socket_path)
        except OSError as exc:
            raise AgentUnreachable(f"connect: {exc}") from None
        reader = LineReader()
        try:
            sock.sendall(line)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise socket.timeout(f"no reply within {timeout:g} s")
                sock.settimeout(remaining)
                chunk = sock.recv(65536)
                if not chunk:
                    raise AgentUnreachable(f"connection closed after {reader.pending} bytes of reply")
                reply = reader.feed(chunk)
                if reply is not None:
                    return reply
        except OSError as exc:  # socket.timeout is an OSError
            raise AgentUnreachable("no reply: {}".format(exc or "timed out")) from None
    finally:
        sock.close()


def _record_pending_delete(socket_path: str, request: Request) -> None:
    """Write the request as ``pending-deletes/<containerID>.json``, atomically and durably."""
    directory = os.path.join(os.path.dirname(socket_path), PENDING_DELETES)
    final = os.path.join(directory, request.container_id + ".json")
    tmp = os.path.join(directory, f".{request.container_id}.{os.getpid()}.tmp")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(request.encode())
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


def _print(stdout: TextIO, obj: dict[str, Any]) -> None:
    stdout.write(json.dumps(obj) + "\n")
    stdout.flush()


if __name__ == "__main__":
    main()
