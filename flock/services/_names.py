"""Names of the per-service nftables objects: stable, short, nft-identifier safe.

A name is a kind prefix with the family (``svc6``, ``loc4``, ``ext6``,
``ep4``, ``aff6``), a hash of everything that identifies the object, and a
readable tail (``ns/name/tcp/80``) cut to a few dozen characters.  The hash
(13 base32 characters, 65 bits of SHA-256) makes names unique; the tail is for
people reading ``nft list``.  The tail is built only from validated API names
and is sanitised again here: anything but ``a-z0-9.-`` is dropped, so even a
value that escaped validation cannot end an identifier or start a statement.
"""

from __future__ import annotations

import base64
import hashlib
import re

from flock.policy import Protocol

from ._model import Family

_UNSAFE = re.compile(r"[^a-z0-9.-]")
TAIL_MAX = 40
PORT_CHAIN_KINDS = ("svc", "loc", "ext")


def _hash(*parts: object) -> str:
    digest = hashlib.sha256("\x00".join(str(p) for p in parts).encode()).digest()
    return base64.b32encode(digest).decode()[:13].lower()


def _safe(text: str) -> str:
    return _UNSAFE.sub("", text.lower())


def service_tail(namespace: str, name: str, protocol: Protocol, port: int) -> str:
    tail = f"{_safe(namespace)}/{_safe(name)}/{protocol.value.lower()}/{int(port)}"
    return tail[-TAIL_MAX:].lstrip("/")


def _prefix(kind: str, family: Family) -> str:
    return f"{kind}{family.version}"


def port_chain(kind: str, family: Family, namespace: str, name: str, protocol: Protocol, port: int) -> str:
    """A chain of one Service port and family: ``svc`` / ``loc`` (ClientIP affinity's choice among the
    cluster's / this node's endpoints) or ``ext`` (external addresses and NodePorts, under affinity or
    externalTrafficPolicy Local)."""
    assert kind in PORT_CHAIN_KINDS
    h = _hash(kind, family.value, namespace, name, protocol.value, port)
    return f"{_prefix(kind, family)}-{h}-{service_tail(namespace, name, protocol, port)}"


def endpoint_chain(
    family: Family, namespace: str, name: str, protocol: Protocol, port: int, address: object, target: int
) -> str:
    h = _hash("ep", family.value, namespace, name, protocol.value, port, address, target)
    return f"{_prefix('ep', family)}-{h}-{service_tail(namespace, name, protocol, port)}"


def affinity_set(endpoint_chain_name: str, timeout: int) -> str:
    """The affinity set of one endpoint chain (one per endpoint of a ClientIP Service port).

    The timeout is part of the name: a set's timeout cannot be changed in place, so a
    new timeout is a new set (the chains that use it are rewritten, the old set deleted)."""
    kind = endpoint_chain_name.split("-", 1)[0]
    return f"aff{kind[-1]}-{_hash('aff', endpoint_chain_name, int(timeout))}"
