"""Field checks kube-apiserver's validation shares between kinds (``apimachinery/pkg/util/validation``,
``pkg/apis/core/validation``): label keys and values, port numbers and names, DNS names and IP
addresses, with upstream's messages (the ``why`` of an :class:`~._status.Invalid`)."""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable
from typing import Any

from ._status import Invalid

_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?\Z")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?\Z")
_PORT_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?\Z")

REQUIRED = "Required value"
PORT_RANGE = "must be between 1 and 65535, inclusive"
IP_ADDRESS = "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
DNS_LABEL = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
DNS_SUBDOMAIN = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
DNS1035_LABEL = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    "character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for "
    "validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def unsupported(value: Any, supported: Iterable[str]) -> str:
    """``field.NotSupported``'s message (the supported values sorted, as ``sets.List`` gives them)."""
    listed = ", ".join(f'"{v}"' for v in sorted(supported))
    return f"Unsupported value: {json.dumps(value)}: supported values: {listed}"


def too_many(limit: int) -> str:
    return f"Too many: must have at most {limit} items"


def label(key: Any, value: Any, where: str) -> None:
    """One label (or selector term) ``key: value`` at *where*."""
    if not is_label_key(key):
        raise Invalid(where, key, "a label key is an optional DNS-subdomain prefix and '/', then 1-63 characters")
    if not isinstance(value, str) or not _LABEL_VALUE.match(value):
        raise Invalid(f"{where}[{key}]", value, "a label value is at most 63 letters, digits, '-', '_', '.'")


def labels(value: Any, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise Invalid(where, value, "must be a map of strings")
    for key, item in value.items():
        label(key, item, where)


def is_label_key(key: Any) -> bool:
    if not isinstance(key, str):
        return False
    prefix, sep, name = key.rpartition("/")
    if sep and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.match(prefix)):
        return False
    return bool(_LABEL_NAME.match(name))


def is_port(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535


def is_port_name(value: Any) -> bool:
    """An IANA_SVC_NAME (a container port's or a named targetPort's name)."""
    return (
        isinstance(value, str)
        and bool(_PORT_NAME.match(value))
        and "--" not in value
        and any(c.isalpha() for c in value)
    )


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def dns_label(value: Any, where: str) -> None:
    if not isinstance(value, str) or len(value) > 63:
        raise Invalid(where, value, "must be no more than 63 characters")
    if not _DNS_LABEL.match(value):
        raise Invalid(where, value, DNS_LABEL)


def dns1035_label(value: Any, where: str) -> None:
    if not isinstance(value, str) or len(value) > 63:
        raise Invalid(where, value, "must be no more than 63 characters")
    if not _DNS1035_LABEL.match(value):
        raise Invalid(where, value, DNS1035_LABEL)


def dns_subdomain(value: Any, where: str) -> None:
    if not isinstance(value, str) or len(value) > 253:
        raise Invalid(where, value, "must be no more than 253 characters")
    if not _DNS_SUBDOMAIN.match(value):
        raise Invalid(where, value, DNS_SUBDOMAIN)


def parse_ip(value: Any) -> IPAddress | None:
    """*value* as Go's ``netutils.ParseIPSloppy`` reads it (no zone), or None."""
    if not isinstance(value, str) or "%" in value:
        return None
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def ip_address(value: Any, where: str) -> IPAddress:
    """``validation.IsValidIP``."""
    ip = parse_ip(value)
    if ip is None:
        raise Invalid(where, value, IP_ADDRESS)
    return ip


def non_special_ip(value: Any, where: str) -> None:
    """``ValidateNonSpecialIP`` / ``ValidateEndpointIP``: no unspecified, loopback or link-local address."""
    ip = parse_ip(value)
    if ip is None:
        raise Invalid(where, value, "must be a valid IP address")
    if ip.is_unspecified:
        raise Invalid(where, value, f"may not be unspecified ({value})")
    if ip.is_loopback:
        raise Invalid(where, value, "may not be in the loopback range (127.0.0.0/8, ::1/128)")
    link_local_multicast = ip in ipaddress.ip_network("224.0.0.0/24") or (
        ip.version == 6 and int(ip) >> 112 & 0xFF0F == 0xFF02
    )
    if ip.is_link_local and not ip.is_multicast:
        raise Invalid(where, value, "may not be in the link-local range (169.254.0.0/16, fe80::/10)")
    if link_local_multicast:
        raise Invalid(where, value, "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)")


def cidr(value: Any, where: str) -> None:
    """``validation.IsValidCIDR``."""
    try:
        if not isinstance(value, str) or "/" not in value:
            raise ValueError(value)
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise Invalid(where, value, "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)") from None


def qualified_name(value: Any, where: str) -> None:
    """``ValidateQualifiedName`` (a label key's shape: an optional DNS-subdomain prefix and a name)."""
    if not is_label_key(value):
        raise Invalid(
            where,
            value,
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
            "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
            "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
        )
