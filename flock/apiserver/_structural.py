"""A custom resource admitted as kube-apiserver admits it: pruned, then checked against its CRD's schema.

What ``apiextensions-apiserver`` does with an object of a structural schema,
for the schema keywords flock's CRDs use:

1. *pruning*: fields the schema does not name are dropped (at every level,
   unless ``additionalProperties`` says what they are), and so are ``null``
   values (no field here is ``nullable``); ``metadata`` is the API server's
   own and is left alone;
2. *validation*: ``type``, ``enum``, ``minimum``/``maximum``,
   ``minLength``/``maxLength`` (in characters), ``pattern``,
   ``minItems``/``maxItems``, ``minProperties``/``maxProperties``,
   ``required``, ``x-kubernetes-list-type: set`` (no duplicates) and
   ``x-kubernetes-list-map-keys`` (no two items with the same keys);
3. the ``x-kubernetes-validations`` CEL rules, each run in Python: a rule is
   known by its exact text (:data:`CelRules`), so a schema with a rule this
   module has no function for fails when it is loaded, not when an object
   happens to reach it.

The first refusal raises :class:`flock.apiserver._status.Invalid` with the
field path and the API server's wording ("Required value", "Unsupported
value", "Too many", …); the real server lists every error at once, this one
names the first.  ``format`` is not checked.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from ._status import Invalid

Schema = Mapping[str, Any]
# A CEL rule's text → a Python function of ``self`` (true: the value passes).
CelRules = Mapping[str, Callable[[Any], bool]]

_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
}
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "integer", float: "number", bool: "boolean"}


def check_rules(schema: Schema, rules: CelRules, where: str = "") -> None:
    """Every CEL rule in *schema* has a function in *rules* (raises ValueError naming the first that has none)."""
    for rule in schema.get("x-kubernetes-validations", ()):
        if rule["rule"] not in rules:
            raise ValueError(f"{where or '<root>'}: no Python function for the CEL rule {rule['rule']!r}")
    for name, sub in (schema.get("properties") or {}).items():
        check_rules(sub, rules, f"{where}.{name}" if where else name)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), Mapping):
            check_rules(schema[key], rules, f"{where}[]")


def admit_object(schema: Schema, rules: CelRules, obj: dict[str, Any]) -> dict[str, Any]:
    """*obj* (a whole custom resource) pruned in place and validated; raises :class:`Invalid`."""
    properties = schema.get("properties") or {}
    for key in [k for k in obj if k not in properties or obj[k] is None]:
        del obj[key]
    for key in schema.get("required", ()):
        if key not in obj:
            raise Invalid(key, None, "Required value")
    for key, sub in properties.items():
        if key in obj and key != "metadata":  # ObjectMeta: the API server's own
            obj[key] = admit_value(sub, rules, obj[key], key)
    return obj


def admit_value(schema: Schema, rules: CelRules, value: Any, where: str) -> Any:
    """*value* at *where* pruned (objects changed in place) and validated against *schema*; returns it."""
    kind = schema.get("type")
    if kind is not None and not _TYPES[kind](value):
        got = _JSON_TYPES.get(type(value), type(value).__name__)
        raise Invalid(where, value, f"Invalid value: {where} in body must be of type {kind}: {got!r}")
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(f'"{v}"' for v in schema["enum"])
        raise Invalid(where, value, f"Unsupported value: supported values: {supported}")
    if kind == "string":
        _string(schema, value, where)
    elif kind in ("integer", "number"):
        _number(schema, value, where)
    elif kind == "array":
        _array(schema, rules, value, where)
    elif kind == "object":
        _object(schema, rules, value, where)
    for rule in schema.get("x-kubernetes-validations", ()):
        if not rules[rule["rule"]](value):
            raise Invalid(where, value, f"Invalid value: {rule['message']}")
    return value


def _string(schema: Schema, value: str, where: str) -> None:
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        raise Invalid(where, value, f"Too long: may not be more than {schema['maxLength']} bytes")
    if "minLength" in schema and len(value) < schema["minLength"]:
        raise Invalid(
            where, value, f"Invalid value: {where} in body should be at least {schema['minLength']} chars long"
        )
    if "pattern" in schema and not re.search(schema["pattern"], value):
        raise Invalid(where, value, f"Invalid value: {where} in body should match '{schema['pattern']}'")


def _number(schema: Schema, value: float, where: str) -> None:
    if "minimum" in schema and value < schema["minimum"]:
        raise Invalid(
            where, value, f"Invalid value: {where} in body should be greater than or equal to {schema['minimum']}"
        )
    if "maximum" in schema and value > schema["maximum"]:
        raise Invalid(
            where, value, f"Invalid value: {where} in body should be less than or equal to {schema['maximum']}"
        )


def _array(schema: Schema, rules: CelRules, value: list[Any], where: str) -> None:
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        raise Invalid(where, len(value), f"Too many: {len(value)}: must have at most {schema['maxItems']} items")
    if "minItems" in schema and len(value) < schema["minItems"]:
        raise Invalid(
            where, len(value), f"Invalid value: {where} in body should have at least {schema['minItems']} items"
        )
    items = schema.get("items")
    if items is not None:
        for i, item in enumerate(value):
            value[i] = admit_value(items, rules, item, f"{where}[{i}]")
    if schema.get("x-kubernetes-list-type") == "set":
        seen: list[Any] = []
        for i, item in enumerate(value):
            if item in seen:
                raise Invalid(f"{where}[{i}]", item, "Duplicate value")
            seen.append(item)
    keys = schema.get("x-kubernetes-list-map-keys")
    if keys:
        seen_keys: set[tuple[Any, ...]] = set()
        for i, item in enumerate(value):
            key = tuple(repr(item.get(k)) for k in keys)
            if key in seen_keys:
                raise Invalid(f"{where}[{i}]", {k: item.get(k) for k in keys}, "Duplicate value")
            seen_keys.add(key)


def _object(schema: Schema, rules: CelRules, value: dict[str, Any], where: str) -> None:
    properties = schema.get("properties")
    extra = schema.get("additionalProperties")
    for key in [k for k, v in value.items() if v is None or (properties is not None and k not in properties)]:
        if value[key] is None or not isinstance(extra, Mapping):
            del value[key]  # pruned: a null, or a field the schema does not know
    if properties is None and not isinstance(extra, Mapping):
        value.clear()  # an object the schema says nothing of keeps nothing
    for key in schema.get("required", ()):
        if key not in value:
            raise Invalid(f"{where}.{key}", None, "Required value")
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        raise Invalid(
            where, sorted(value), f"Too many: {len(value)}: must have at most {schema['maxProperties']} items"
        )
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        raise Invalid(
            where,
            sorted(value),
            f"Invalid value: {where} in body should have at least {schema['minProperties']} properties",
        )
    for key in list(value):
        sub = (properties or {}).get(key, extra)
        if isinstance(sub, Mapping):
            value[key] = admit_value(sub, rules, value[key], f"{where}.{key}")
