"""The IPAM's errors: both are CniErrors, so they reach the runtime as they are."""

from __future__ import annotations

import ipaddress
from typing import Any

from flock import errors

# flock's own code for "no free address": not 11 (retrying the same ADD
# cannot help until some pod goes away), not 50 (that claims the plugin as a
# whole cannot serve ADD, which STATUS reports for the node block; a full
# annotation sub-range leaves other pods unaffected), and not 7 (nothing in
# the pod's configuration is wrong).  A code of its own lets operators and
# metrics tell a full pool from a bad annotation.
ADDRESS_EXHAUSTED = 110


class AnnotationError(errors.CniError):
    """A pod annotation flock cannot honour (CNI code 7).

    ``annotation`` is the full key (``flock.fritzlab.net/cidr6``), ``value``
    the string the pod carries; ``details`` names both and what was expected.
    """

    def __init__(self, annotation: str, value: Any, expected: str) -> None:
        self.annotation = annotation
        self.value = value
        self.expected = expected
        super().__init__(
            errors.INVALID_CONFIG,
            f"invalid pod annotation {annotation}",
            f"{annotation}={errors.quote(value, 512)}: {expected}",
        )


class AddressExhausted(errors.CniError):
    """No free address in ``cidr`` (code :data:`ADDRESS_EXHAUSTED`)."""

    def __init__(self, cidr: ipaddress.IPv4Network | ipaddress.IPv6Network, why: str) -> None:
        self.cidr = cidr
        super().__init__(ADDRESS_EXHAUSTED, f"no free IPv{cidr.version} address in {cidr}", why)
