"""CustomResourceDefinition objects: what the server checks in one, and the schema it then enforces.

The fake server serves its custom resources (NodeConfig, ClusterNetworkPolicy)
whether or not a CRD object exists for them.  Once one is stored (``kubectl
apply -k deploy``), objects of that resource are also checked against the
stored CRD's ``openAPIV3Schema`` for their version, CEL rules included, by
:mod:`flock.apiserver.k8s_schema` (jsonschema and cel-python, imported only
then: the test extra), and a refusal is the API server's 422.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._resources import Resource
from ._status import Invalid, StatusError

_SCOPES = ("Namespaced", "Cluster")


def admit_crd(obj: dict[str, Any]) -> None:
    """A CustomResourceDefinition's own checks (``apiextensions/validation``, the parts
    a mistake in deploy/ would hit); raises :class:`Invalid`."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise Invalid("spec", spec, "Required value")
    group, names = spec.get("group"), spec.get("names")
    if not isinstance(group, str) or "." not in group:
        raise Invalid("spec.group", group, "should be a domain with at least one dot")
    if not isinstance(names, dict):
        raise Invalid("spec.names", names, "Required value")
    for key in ("plural", "kind"):
        if not isinstance(names.get(key), str) or not names[key]:
            raise Invalid(f"spec.names.{key}", names.get(key), "Required value")
    if obj["metadata"]["name"] != f"{names['plural']}.{group}":
        raise Invalid("metadata.name", obj["metadata"]["name"], 'must be spec.names.plural+"."+spec.group')
    if spec.get("scope") not in _SCOPES:
        raise Invalid("spec.scope", spec.get("scope"), 'Unsupported value: supported values: "Cluster", "Namespaced"')
    versions = spec.get("versions")
    if not isinstance(versions, list) or not versions:
        raise Invalid("spec.versions", versions, "must have exactly one version marked as storage version")
    if sum(1 for v in versions if isinstance(v, dict) and v.get("storage")) != 1:
        raise Invalid("spec.versions", versions, "must have exactly one version marked as storage version")
    for i, version in enumerate(versions):
        schema = ((version.get("schema") or {}) if isinstance(version, dict) else {}).get("openAPIV3Schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise Invalid(
                f"spec.versions[{i}].schema.openAPIV3Schema", schema, "must be a structural schema of type object"
            )


def crd_schema(crd: Mapping[str, Any], version: str) -> dict[str, Any] | None:
    for entry in (crd.get("spec") or {}).get("versions") or []:
        if entry.get("name") == version:
            schema: dict[str, Any] | None = (entry.get("schema") or {}).get("openAPIV3Schema")
            return schema
    return None


def check_custom(resource: Resource, crd: Mapping[str, Any], obj: Mapping[str, Any]) -> None:
    """*obj* against *crd*'s schema for *resource*'s version; a refusal → 422 naming every error."""
    schema = crd_schema(crd, resource.version)
    if schema is None:
        raise StatusError(404, "the server could not find the requested resource")
    from . import k8s_schema  # jsonschema, cel-python, google-re2: the test extra

    _prune(schema, obj, top=True)
    body = {k: v for k, v in obj.items() if k != "metadata"}  # ObjectMeta: the API server's own
    errors = k8s_schema.errors(schema, body)
    if errors:
        name = str(obj["metadata"].get("name"))
        listed = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
        raise StatusError(
            422,
            f'{resource.kind}.{resource.group} "{name}" is invalid: {listed}',
            details={
                "name": name,
                "group": resource.group,
                "kind": resource.kind,
                "causes": [
                    {"reason": "FieldValueInvalid", "field": field, "message": message}
                    for field, _, message in (e.partition(": ") for e in errors)
                ],
            },
        )


def _prune(schema: Mapping[str, Any], value: Any, *, top: bool = False) -> None:
    """Drop (in place) the fields *schema* does not name, as the API server prunes a custom
    resource (``fieldValidation=Strict`` would refuse them instead: not done here)."""
    if isinstance(value, dict) and not schema.get("x-kubernetes-preserve-unknown-fields"):
        properties, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        for key in list(value):
            if key in properties:
                if not (top and key == "metadata"):
                    _prune(properties[key], value[key])
            elif isinstance(extra, Mapping):
                _prune(extra, value[key])
            elif not (top and key in ("apiVersion", "kind")):
                del value[key]
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            _prune(schema["items"], item)
