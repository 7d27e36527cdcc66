"""The PATCH content types kube-apiserver accepts, applied to an object as a dict.

- ``application/merge-patch+json``: RFC 7386 (:func:`merge_patch`).
- ``application/json-patch+json``: RFC 6902 (:func:`json_patch`).
- ``application/strategic-merge-patch+json``: built-in kinds only (a custom
  resource answers 415, as upstream). Maps merge as in a merge patch; the lists
  upstream's Go types mark ``patchStrategy:"merge"`` (:data:`MERGE_KEYS`:
  containers by name, container ports by containerPort, …) merge by their key,
  other lists are replaced; the directives kubectl's three-way patches carry
  are honoured: ``$patch: replace|delete|merge``, ``$setElementOrder/<list>``,
  ``$retainKeys``, ``$deleteFromPrimitiveList/<list>``.
- ``application/apply-patch+yaml`` (server-side apply, :func:`apply_patch`):
  the applied configuration is merged into the live object as a strategic
  merge patch, and the fields it set are recorded per field manager in
  ``metadata.managedFields`` (``FieldsV1``, lists as whole values); a field
  that manager applied before and no longer applies is removed.  Simplified:
  no conflicts between managers (every apply behaves as ``--force-conflicts``)
  and no ownership of fields written by other operations.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from ._status import StatusError

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH)

# Path suffix (list items as "*") → merge key, from upstream's patchMergeKey tags.
MERGE_KEYS: dict[tuple[str, ...], str] = {
    ("spec", "containers"): "name",
    ("spec", "initContainers"): "name",
    ("spec", "ephemeralContainers"): "name",
    ("spec", "volumes"): "name",
    ("spec", "imagePullSecrets"): "name",
    ("spec", "hostAliases"): "ip",
    ("spec", "ports"): "port",  # a Service's
    ("containers", "*", "ports"): "containerPort",
    ("containers", "*", "env"): "name",
    ("containers", "*", "volumeMounts"): "mountPath",
    ("containers", "*", "volumeDevices"): "devicePath",
    ("initContainers", "*", "ports"): "containerPort",
    ("initContainers", "*", "env"): "name",
    ("initContainers", "*", "volumeMounts"): "mountPath",
    ("metadata", "ownerReferences"): "uid",
    ("status", "addresses"): "type",
    ("status", "conditions"): "type",
}
# Lists of scalars merged as sets (patchStrategy "merge" without a key).
MERGED_SETS = (("metadata", "finalizers"),)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge, ``null`` deletes, everything else (lists too) replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ---- RFC 6902 -----------------------------------------------------------------


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise StatusError(422, f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def _parent(doc: Any, parts: Sequence[str], path: str) -> tuple[Any, str]:
    cur = doc
    for part in parts[:-1]:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise StatusError(
                422, f"the server rejected our request due to an error in our request: path {path!r} not found"
            )
    return cur, parts[-1]


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise StatusError(422, f"the server rejected our request due to an error in our request: path {path!r} not found")


def _remove(doc: Any, path: str) -> Any:
    parent, last = _parent(doc, _pointer(path), path)
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise StatusError(422, f"the server rejected our request due to an error in our request: path {path!r} not found")


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return copy.deepcopy(value)
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict):
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list) and (last == "-" or (last.isdigit() and int(last) <= len(parent))):
        parent.insert(len(parent) if last == "-" else int(last), copy.deepcopy(value))
    else:
        raise StatusError(
            422, f"the server rejected our request due to an error in our request: cannot add at {path!r}"
        )
    return doc


def json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902 on a private copy of *doc*; a bad operation or a failed ``test`` → 422."""
    if not isinstance(operations, list):
        raise StatusError(400, "a JSON patch must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in operations:
        if not isinstance(op, Mapping):
            raise StatusError(400, f"a JSON patch operation must be an object, got {op!r}")
        kind, path, source = op.get("op"), str(op.get("path")), str(op.get("from"))
        if kind == "add":
            doc = _add(doc, path, op.get("value"))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            if _pointer(path):
                _remove(doc, path)
            doc = _add(doc, path, op.get("value"))
        elif kind in ("move", "copy"):
            value = copy.deepcopy(_get(doc, source))
            if kind == "move":
                _remove(doc, source)
            doc = _add(doc, path, value)
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise StatusError(
                    422, f"the server rejected our request due to an error in our request: test failed at {path!r}"
                )
        else:
            raise StatusError(400, f"unknown JSON patch operation {kind!r}: add, remove, replace, move, copy, test")
    return doc


# ---- strategic merge patch -----------------------------------------------------


def _merge_key(path: tuple[str, ...]) -> str | None:
    for suffix, key in MERGE_KEYS.items():
        if path[-len(suffix) :] == suffix:
            return key
    return None


def strategic_merge_patch(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """*patch* applied to *target* as ``apimachinery/pkg/util/strategicpatch`` does for the
    lists and directives named in the module doc; returns a new value (None: deleted)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    body = {k: v for k, v in patch.items() if k != "$patch"}
    if directive == "replace":
        return strategic_merge_patch({}, body, path)
    result = dict(target) if isinstance(target, Mapping) else {}
    orders: dict[str, list[Any]] = {}
    for key, value in body.items():
        if key == "$retainKeys":
            continue
        if key.startswith("$setElementOrder/"):
            orders[key.split("/", 1)[1]] = value
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list):
                result[field] = [v for v in result[field] if v not in value]
            continue
        if value is None:
            result.pop(key, None)
            continue
        sub = (*path, key)
        merge_key = _merge_key(sub)
        if isinstance(value, list) and merge_key is not None:
            result[key] = _merge_keyed(result.get(key), value, merge_key, sub)
        elif isinstance(value, list) and sub[-2:] in MERGED_SETS:
            result[key] = [*(result.get(key) or []), *(v for v in value if v not in (result.get(key) or []))]
        else:
            merged = strategic_merge_patch(result.get(key), value, sub)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    if isinstance(body.get("$retainKeys"), list):
        for key in [k for k in result if k not in body["$retainKeys"]]:
            del result[key]
    for field, order in orders.items():
        if isinstance(result.get(field), list):
            result[field] = _ordered(result[field], order, _merge_key((*path, field)))
    return result


def _merge_keyed(target: Any, patch: list[Any], key: str, path: tuple[str, ...]) -> list[Any]:
    if any(isinstance(i, Mapping) and i.get("$patch") == "replace" for i in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, Mapping) and "$patch" in i)]
    result = list(target) if isinstance(target, list) else []
    for item in patch:
        if not isinstance(item, Mapping):
            raise StatusError(400, f"{'.'.join(path)}: expected objects merged by {key!r}, got {item!r}")
        at = next(
            (i for i, old in enumerate(result) if isinstance(old, Mapping) and old.get(key) == item.get(key)), None
        )
        if item.get("$patch") == "delete":
            if at is not None:
                del result[at]
            continue
        merged = strategic_merge_patch(result[at] if at is not None else {}, item, (*path, "*"))
        if at is None:
            result.append(merged)
        else:
            result[at] = merged
    return result


def _ordered(items: list[Any], order: list[Any], key: str | None) -> list[Any]:
    def ident(item: Any) -> Any:
        return item.get(key) if key is not None and isinstance(item, Mapping) else item

    wanted = [ident(o) for o in order]
    ranked = sorted(
        range(len(items)),
        key=lambda i: (wanted.index(ident(items[i])) if ident(items[i]) in wanted else len(wanted), i),
    )
    return [items[i] for i in ranked]


# ---- server-side apply ----------------------------------------------------------


def fields_v1(applied: Mapping[str, Any]) -> dict[str, Any]:
    """The ``FieldsV1`` set of the fields *applied* sets (lists as whole values; metadata's
    name and namespace, apiVersion and kind are identity, not fields)."""
    out: dict[str, Any] = {}
    for key, value in applied.items():
        if key in ("apiVersion", "kind"):
            continue
        if isinstance(value, Mapping) and value:
            sub = fields_v1({k: v for k, v in value.items() if not (key == "metadata" and k in ("name", "namespace"))})
            if sub or key != "metadata":
                out[f"f:{key}"] = sub
        else:
            out[f"f:{key}"] = {}
    return out


def _drop_fields(obj: dict[str, Any], gone: Mapping[str, Any], still: Mapping[str, Any]) -> None:
    """Remove from *obj* the fields in *gone* (FieldsV1) that *still* does not hold."""
    for fkey, sub in gone.items():
        key = fkey[2:]
        if fkey not in still and key != "metadata":  # metadata itself is never the applier's
            obj.pop(key, None)
        elif sub and isinstance(obj.get(key), dict):
            _drop_fields(obj[key], sub, still.get(fkey) or {})


def apply_patch(live: dict[str, Any] | None, applied: Mapping[str, Any], manager: str) -> dict[str, Any]:
    """The object after *manager* applies *applied* (server-side apply, simplified as the module
    doc says); *live* None: the object is created from *applied*."""
    fields = fields_v1(applied)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    entry = {
        "manager": manager,
        "operation": "Apply",
        "apiVersion": applied.get("apiVersion", ""),
        "time": now,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }
    if live is None:
        new = copy.deepcopy(dict(applied))
        new.setdefault("metadata", {})["managedFields"] = [entry]
        return new
    managed = [m for m in live["metadata"].get("managedFields") or [] if isinstance(m, Mapping)]
    before = next((m for m in managed if m.get("manager") == manager and m.get("operation") == "Apply"), None)
    new = strategic_merge_patch(live, {k: v for k, v in applied.items() if k != "status"})
    if before is not None:
        _drop_fields(new, before.get("fieldsV1") or {}, fields)
    others = [m for m in managed if m is not before]
    new.setdefault("metadata", {})["managedFields"] = [*others, entry]
    return new
