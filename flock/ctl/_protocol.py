"""The admin wire (DESIGN: "what flockctl asks"): one JSON line each way per connection.

Request ``{"version": 1, "op": "status", ...}``; reply ``{"ok": true, "result": {...}}``
or ``{"ok": false, "error": "...", "details": "..."}``.  Standard library only:
flockctl's client side imports nothing else.

``policy-explain`` takes ``from``, ``to``, ``port``, ``protocol``, ``family`` and, for
``--verify``, ``"verify": true`` (the reply then has ``verify``; an agent from before
it ignores the field, which flockctl reports as not verified).

``wireguard-rotate`` takes nothing and answers the new and the previous public key; an agent
without encryption refuses it ("encryption is off").

``services`` takes an optional ``service`` (``NAMESPACE/NAME``); an agent from before it
answers "unknown op".
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

ADMIN_PROTOCOL_VERSION = 1
DEFAULT_ADMIN_SOCKET = Path("/run/flock/admin.sock")
# Replies carry every allocation of a node: generous, but bounded.
MAX_REQUEST_BYTES = 64 << 10
MAX_REPLY_BYTES = 64 << 20
OPS = (
    "status",
    "pods",
    "ipam-show",
    "ipam-check",
    "ipam-release",
    "bgp",
    "policy-explain",
    "services",
    "wireguard-rotate",
)


class AdminUnreachable(Exception):
    """No agent answers on the admin socket (or it answered garbage)."""


class AdminRefused(Exception):
    """The agent answered with an error."""

    def __init__(self, error: str, details: str = "") -> None:
        super().__init__(f"{error}: {details}" if details else error)
        self.error, self.details = error, details


def encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode() + b"\n"


def ask(path: os.PathLike[str] | str, op: str, timeout: float = 30.0, **fields: Any) -> dict[str, Any]:
    """One request to the agent's admin socket; the result object.  Raises
    :class:`AdminUnreachable` or :class:`AdminRefused`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(str(path))
            sock.sendall(encode({"version": ADMIN_PROTOCOL_VERSION, "op": op, **fields}))
            chunks, size = [], 0
            while True:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_REPLY_BYTES:
                    raise AdminUnreachable(f"{path}: reply larger than {MAX_REPLY_BYTES} bytes")
                if chunk.endswith(b"\n"):
                    break
        except OSError as exc:
            raise AdminUnreachable(f"{path}: {exc.strerror or exc}") from None
    finally:
        sock.close()
    try:
        reply = json.loads(b"".join(chunks))
    except ValueError:
        raise AdminUnreachable(f"{path}: the agent's reply is not JSON (is this flock-agent's admin socket?)") from None
    if not isinstance(reply, dict) or "ok" not in reply:
        raise AdminUnreachable(f"{path}: unexpected reply {str(reply)[:200]!r}")
    if not reply["ok"]:
        raise AdminRefused(str(reply.get("error", "error")), str(reply.get("details", "")))
    result = reply.get("result")
    return result if isinstance(result, dict) else {}
