"""The IPAM's typed errors.  They carry no CNI code: the pod handler's table
(:mod:`flock.pods._cni_codes`) chooses it at the CNI boundary."""

from __future__ import annotations

import ipaddress
from typing import Any

from flock.errors import quote
from flock.faults import Fault


class IpamError(Fault, ValueError):
    """Base of the IPAM's refusals (``msg`` short and stable, ``details`` naming the value)."""


class AnnotationError(IpamError):
    """A pod annotation flock cannot honour.

    ``annotation`` is the full key (``flock.fritzlab.net/cidr6``), ``value``
    the string the pod carries; ``details`` names both and what was expected.
    """

    def __init__(self, annotation: str, value: Any, expected: str) -> None:
        self.annotation = annotation
        self.value = value
        self.expected = expected
        super().__init__(f"invalid pod annotation {annotation}", f"{annotation}={quote(value, 512)}: {expected}")


class PoolExhausted(IpamError):
    """No free address in ``cidr``."""

    def __init__(self, cidr: ipaddress.IPv4Network | ipaddress.IPv6Network, why: str) -> None:
        self.cidr = cidr
        super().__init__(f"no free IPv{cidr.version} address in {cidr}", why)
