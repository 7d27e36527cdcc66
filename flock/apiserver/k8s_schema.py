"""Check objects against a CRD's openAPIV3Schema as the apiserver would, offline.

- The schema dialect is OpenAPI v3's (draft-4-like): jsonschema's Draft4Validator.
- ``pattern`` uses RE2 (google-re2), the engine family of the apiserver's Go
  regexp, so ``$`` means end of text, not "before a final newline".
- ``x-kubernetes-list-map-keys``: no two items share their key fields.
- ``x-kubernetes-list-type: set``: no item twice (upstream's "Duplicate value").
- ``x-kubernetes-validations``: CEL rules run with cel-python, plus the
  subset of the Kubernetes IP/CIDR CEL library the flock CRD uses (isCIDR,
  cidr, .ip, .family, .masked), with Kubernetes' parsing rules: no IPv4-mapped
  IPv6, no zones, no leading zeros.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from typing import Any

import celpy
import jsonschema
import re2
from celpy import celtypes

IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


def _parse_cidr(text: str) -> IPInterface | None:
    # Python already refuses leading zeros in IPv4 octets; add Kubernetes' other refusals.
    if "/" not in text or "%" in text:
        return None
    try:
        value = ipaddress.ip_interface(text)
    except ValueError:
        return None
    if isinstance(value, ipaddress.IPv6Interface) and value.ip.ipv4_mapped is not None:
        return None
    return value


def _is_cidr(text: celtypes.StringType) -> celtypes.BoolType:
    return celtypes.BoolType(_parse_cidr(str(text)) is not None)


def _cidr(text: celtypes.StringType) -> IPInterface:
    value = _parse_cidr(str(text))
    if value is None:
        raise ValueError(f"cidr: invalid CIDR {text!r}")
    return value


CEL_FUNCTIONS = {
    "isCIDR": _is_cidr,
    "cidr": _cidr,
    "ip": lambda c: c.ip,
    "family": lambda a: celtypes.IntType(a.version),
    "masked": lambda c: ipaddress.ip_interface(c.network),
    "prefixLength": lambda c: celtypes.IntType(c.network.prefixlen),
    # Go's net.IP.IsGlobalUnicast, which the Kubernetes IP library calls.
    "isGlobalUnicast": lambda a: celtypes.BoolType(
        not (a.is_unspecified or a.is_loopback or a.is_link_local or a.is_multicast)
        and a != ipaddress.IPv4Address("255.255.255.255")
    ),
}


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not re2.search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _list_map_keys(validator, keys, instance, schema):
    if not validator.is_type(instance, "array"):
        return
    seen = set()
    for item in instance:
        key = tuple(item.get(k) for k in keys)
        if key in seen:
            yield jsonschema.ValidationError(f"duplicate entry for key {dict(zip(keys, key, strict=True))}")
        seen.add(key)


def _list_type(validator, list_type, instance, schema):
    if list_type != "set" or not validator.is_type(instance, "array"):
        return
    seen = []
    for item in instance:
        if item in seen:
            yield jsonschema.ValidationError(f"Duplicate value: {item!r}")
        else:
            seen.append(item)


_StructuralValidator = jsonschema.validators.extend(
    jsonschema.Draft4Validator,
    {"pattern": _pattern, "x-kubernetes-list-map-keys": _list_map_keys, "x-kubernetes-list-type": _list_type},
)


def cel_errors(schema: dict[str, Any], value: Any, path: str = "$") -> Iterator[str]:
    """The messages of the CEL rules that *value* breaks, in *schema* and below."""
    env = celpy.Environment()
    for rule in schema.get("x-kubernetes-validations", ()):
        program = env.program(env.compile(rule["rule"]), functions=CEL_FUNCTIONS)
        result = program.evaluate({"self": celpy.json_to_cel(value)})
        if not (isinstance(result, celtypes.BoolType) and bool(result)):
            yield f"{path}: {rule['message']}"
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                yield from cel_errors(sub, value[name], f"{path}.{name}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from cel_errors(schema["items"], item, f"{path}[{i}]")


def errors(schema: dict[str, Any], obj: Any) -> list[str]:
    """Why the apiserver would refuse *obj*; empty when it would admit it."""
    found = [
        f"{'.'.join(map(str, e.absolute_path)) or '$'}: {e.message}"
        for e in _StructuralValidator(schema).iter_errors(obj)
    ]
    # CEL only on objects that pass the structural checks, so no rule meets a
    # value of the wrong type (the apiserver reports such values by type alone).
    return found or list(cel_errors(schema, obj, "$"))
