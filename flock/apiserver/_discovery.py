"""Discovery: what ``/api``, ``/apis`` and their group versions say the server serves.

Both forms kube-apiserver 1.32 answers: the aggregated documents
(``apidiscovery.k8s.io/v2`` ``APIGroupDiscoveryList``, one request for the core
group and one for every other group, what kubectl 1.32 asks for first) and the
legacy ones (``APIVersions``, ``APIGroupList``, one ``APIResourceList`` per
group version), chosen by the request's ``Accept`` header as the real server
does.  Verbs, short names and singular names are upstream's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ._resources import VERBS, Resource

AGGREGATED_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
_STATUS_VERBS = ("get", "patch", "update")


def wants_aggregated(accept: str) -> bool:
    """Whether *accept* asks for ``APIGroupDiscoveryList`` v2 (the first acceptable type wins,
    so a client that prefers plain JSON gets the legacy document)."""
    for media in accept.split(","):
        params = {k.strip(): v.strip() for k, _, v in (p.partition("=") for p in media.split(";")[1:])}
        if params.get("as") == "APIGroupDiscoveryList":
            if params.get("g") == "apidiscovery.k8s.io" and params.get("v") == "v2":
                return True
            continue  # v2beta1 (removed in 1.33): not served
        if media.split(";")[0].strip() in ("application/json", "*/*", "application/*"):
            return False
    return False


def _group_versions(resources: Iterable[Resource]) -> dict[str, list[str]]:
    """Group → its versions, in the order of *resources*."""
    out: dict[str, list[str]] = {}
    for res in resources:
        versions = out.setdefault(res.group, [])
        if res.version not in versions:
            versions.append(res.version)
    return out


def api_versions() -> dict[str, Any]:
    """``GET /api`` (legacy): the core group's versions."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
    }


def _group(name: str, versions: Sequence[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": entries, "preferredVersion": entries[0]}


def api_group_list(resources: Iterable[Resource]) -> dict[str, Any]:
    """``GET /apis`` (legacy): every named group."""
    groups = [_group(g, vs) for g, vs in _group_versions(resources).items() if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(resources: Iterable[Resource], group: str) -> dict[str, Any] | None:
    """``GET /apis/<group>``, or None for a group not served."""
    versions = _group_versions(resources).get(group)
    if not group or versions is None:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(group, versions)}


def resource_list(resources: Iterable[Resource], group: str, version: str) -> dict[str, Any] | None:
    """``GET /api/v1`` or ``/apis/<group>/<version>`` (legacy), or None for one not served."""
    mine = [r for r in resources if r.group == group and r.version == version]
    if not mine:
        return None
    listed: list[dict[str, Any]] = []
    for res in mine:
        entry: dict[str, Any] = {
            "name": res.plural,
            "singularName": res.singular,
            "namespaced": res.namespaced,
            "kind": res.kind,
            "verbs": list(VERBS),
        }
        if res.short_names:
            entry["shortNames"] = list(res.short_names)
        listed.append(entry)
        if res.status_subresource:
            listed.append(
                {
                    "name": f"{res.plural}/status",
                    "singularName": "",
                    "namespaced": res.namespaced,
                    "kind": res.kind,
                    "verbs": list(_STATUS_VERBS),
                }
            )
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": listed}


def aggregated(resources: Iterable[Resource], *, core: bool) -> dict[str, Any]:
    """``GET /api`` (*core*) or ``/apis`` as an ``APIGroupDiscoveryList`` v2."""
    mine = [r for r in resources if (r.group == "") == core]
    items = []
    for group, versions in _group_versions(mine).items():
        items.append(
            {
                "metadata": {"name": group} if group else {},
                "versions": [
                    {
                        "version": v,
                        "resources": [_aggregated_resource(r) for r in mine if r.group == group and r.version == v],
                        "freshness": "Current",
                    }
                    for v in versions
                ],
            }
        )
    return {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items}


def _aggregated_resource(res: Resource) -> dict[str, Any]:
    kind = {"group": res.group, "version": res.version, "kind": res.kind}
    entry: dict[str, Any] = {
        "resource": res.plural,
        "responseKind": kind,
        "scope": "Namespaced" if res.namespaced else "Cluster",
        "singularResource": res.singular,
        "verbs": list(VERBS),
    }
    if res.short_names:
        entry["shortNames"] = list(res.short_names)
    if res.status_subresource:
        entry["subresources"] = [{"subresource": "status", "responseKind": kind, "verbs": list(_STATUS_VERBS)}]
    return entry


# ---- OpenAPI v2 ---------------------------------------------------------------------

_TITLE, _VERSION = "Kubernetes", "v1.32.0-flock-testing"


def openapi_v2_document() -> dict[str, Any]:
    """``GET /openapi/v2`` as JSON: a Swagger 2.0 document with no paths and no definitions."""
    return {"swagger": "2.0", "info": {"title": _TITLE, "version": _VERSION}, "paths": {}, "definitions": {}}


def _proto_string(field: int, text: str) -> bytes:
    data = text.encode()
    return bytes([field << 3 | 2, len(data)]) + data


# The same document as client-go asks for it (gnostic's openapi_v2.Document in protobuf:
# swagger = 1, info = 2 {title = 1, version = 2}).
_INFO = _proto_string(1, _TITLE) + _proto_string(2, _VERSION)
OPENAPI_V2_PROTOBUF = _proto_string(1, "2.0") + bytes([2 << 3 | 2, len(_INFO)]) + _INFO
OPENAPI_V2_PROTOBUF_TYPE = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"


# ---- OpenAPI v3 ---------------------------------------------------------------------

# kubectl asks the OpenAPI v3 document of a kind's group version whether its PATCH takes
# ``fieldValidation``; if it does, kubectl validates nothing itself and sends
# ``fieldValidation=Strict`` (its default, ``--validate=strict``) for the server to check.
_QUERY_PARAMS = ("fieldValidation", "fieldManager", "dryRun")


def openapi_v3_paths(resources: Iterable[Resource]) -> dict[str, Any]:
    """``GET /openapi/v3``: where each group version's document is."""
    paths = {}
    for group, versions in _group_versions(resources).items():
        for version in versions:
            key = f"apis/{group}/{version}" if group else f"api/{version}"
            paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash=flock-testing-1"}
    return {"paths": paths}


def openapi_v3_document(resources: Iterable[Resource], group: str, version: str) -> dict[str, Any] | None:
    """``GET /openapi/v3/api/v1`` or ``/openapi/v3/apis/<group>/<version>``: the group version's
    paths and operations (with their query parameters and kinds), without object schemas
    (``kubectl explain`` has nothing to show)."""
    mine = [r for r in resources if r.group == group and r.version == version]
    if not mine:
        return None
    params = [{"name": p, "in": "query", "schema": {"type": "string", "uniqueItems": True}} for p in _QUERY_PARAMS]
    ok = {"200": {"description": "OK"}}
    paths: dict[str, Any] = {}
    for res in mine:
        gvk = {"group": res.group, "version": res.version, "kind": res.kind}
        base = f"{res.prefix}/namespaces/{{namespace}}/{res.plural}" if res.namespaced else f"{res.prefix}/{res.plural}"
        operation = {"x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": ok}
        paths[base] = {"get": operation, "post": operation}
        paths[base + "/{name}"] = {"get": operation, "put": operation, "patch": operation, "delete": operation}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0-flock-testing"},
        "paths": paths,
        "components": {"schemas": {}},
    }
