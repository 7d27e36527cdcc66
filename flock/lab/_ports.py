"""A pod's declared port, as ``flock-lab pod add --port [NAME=]PORT/PROTO`` takes it."""

from __future__ import annotations

import re
from typing import Any

import attrs

from flock.lab._state import LabError

PROTOCOLS = ("TCP", "UDP", "SCTP")
_PORT_SPEC = re.compile(r"(?:(?P<name>[a-z0-9][a-z0-9-]{0,14})=)?(?P<port>\d{1,5})(?:/(?P<proto>[A-Za-z]+))?\Z")


@attrs.frozen
class PortSpec:
    """``[NAME=]PORT/PROTO`` (PROTO defaults to TCP)."""

    port: int
    protocol: str = "TCP"
    name: str | None = None

    @classmethod
    def parse(cls, text: str, *, named: bool = True) -> PortSpec:
        m = _PORT_SPEC.match(text.strip())
        if m is None or (m["name"] and not named):
            shape = "[NAME=]PORT/PROTO" if named else "PORT/PROTO"
            raise LabError(f"port {text!r}: expected {shape}, e.g. 80/TCP or 81/UDP")
        port, proto = int(m["port"]), (m["proto"] or "TCP").upper()
        if not 1 <= port <= 65535:
            raise LabError(f"port {text!r}: {port} is not a port number (1-65535)")
        if proto not in PROTOCOLS:
            raise LabError(f"port {text!r}: protocol {proto!r} is not one of {', '.join(PROTOCOLS)}")
        name = m["name"]
        if name is not None and (not any(c.isalpha() for c in name) or name.endswith("-") or "--" in name):
            raise LabError(f"port name {name!r}: expected an IANA service name (a-z, 0-9, '-', a letter, ≤15)")
        return cls(port, proto, name)

    @property
    def label(self) -> str:
        return f"{self.port}/{self.protocol}"

    def to_json(self) -> dict[str, Any]:
        return {"port": self.port, "protocol": self.protocol, "name": self.name}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> PortSpec:
        return cls(int(obj["port"]), str(obj["protocol"]), obj.get("name"))

    def container_port(self) -> dict[str, Any]:
        """The Pod's ``containerPorts`` entry."""
        out: dict[str, Any] = {"containerPort": self.port, "protocol": self.protocol}
        if self.name:
            out["name"] = self.name
        return out
