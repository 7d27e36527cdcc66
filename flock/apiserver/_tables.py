"""Server-side printing: the ``meta.k8s.io/v1`` ``Table`` that ``kubectl get`` asks for.

kubectl sends ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` and
prints the columns the server chose; the columns here are kube-apiserver's
printers' (``pkg/printers/internalversion``) for the kinds and fields this
server holds (priority 1: ``-o wide`` only), and a custom resource's are its
CRD's ``additionalPrinterColumns`` (from the stored CRD object when there is
one), after NAME, with AGE last when the CRD names none.  Each row carries the
object as ``includeObject`` says (default: its metadata only).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ._resources import (
    ADDRESSGROUPS,
    CLUSTERNETWORKPOLICIES,
    CLUSTERROLEBINDINGS,
    CLUSTERROLES,
    CONFIGMAPS,
    CUSTOMRESOURCEDEFINITIONS,
    DAEMONSETS,
    ENDPOINTSLICES,
    LEASES,
    LOADBALANCERPOOLS,
    NAMESPACES,
    NETWORKPOLICIES,
    NODEADDRESSGROUPS,
    NODECONFIGS,
    NODES,
    PODS,
    ROLEBINDINGS,
    ROLES,
    SECRETS,
    SERVICEACCOUNTS,
    SERVICES,
    Column,
    Resource,
)
from ._status import StatusError

Obj = Mapping[str, Any]
_NONE = "<none>"


def wants_table(accept: str) -> bool:
    """Whether *accept* prefers a meta.k8s.io Table (v1 or v1beta1) to the object itself."""
    for media in accept.split(","):
        params = {k.strip(): v.strip() for k, _, v in (p.partition("=") for p in media.split(";")[1:])}
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io" and params.get("v") in ("v1", "v1beta1"):
            return True
        if media.split(";")[0].strip() in ("application/json", "*/*", "application/*"):
            return False
    return False


def human_duration(seconds: float) -> str:
    """apimachinery's ``duration.HumanDuration`` (what AGE shows)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _age(timestamp: Any) -> str:
    if not isinstance(timestamp, str) or not timestamp:
        return "<unknown>"
    try:
        then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    return human_duration((datetime.datetime.now(datetime.UTC) - then).total_seconds())


# A printer column's JSONPath, as CRDs write them: fields, [index] and [?(@.field=="value")] filters
# (``.status.conditions[?(@.type=="Ready")].status``); a filter takes its first match.
_STEP = re.compile(r"""\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_-]+)\s*==\s*["']([^"']*)["']\)\]""")


def _path(obj: Any, json_path: str) -> Any:
    text = json_path if json_path.startswith((".", "[")) else f".{json_path}"
    position = 0
    while position < len(text):
        step = _STEP.match(text, position)
        if step is None:
            return None
        position = step.end()
        field, index, key, value = step.groups()
        if field is not None:
            obj = obj.get(field) if isinstance(obj, Mapping) else None
        elif index is not None:
            obj = obj[int(index)] if isinstance(obj, list) and int(index) < len(obj) else None
        else:
            matches = (
                [o for o in obj if isinstance(o, Mapping) and str(o.get(key)) == value] if isinstance(obj, list) else []
            )
            obj = matches[0] if matches else None
    return obj


@attrs.frozen
class _Printed:
    """A built-in column: its definition and how a cell is made."""

    column: Column
    cell: Callable[[Obj], Any]


def _col(name: str, type: str, cell: Callable[[Obj], Any], priority: int = 0, description: str = "") -> _Printed:
    return _Printed(Column(name, type, "", priority, description), cell)


def _name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


_NAME_COLUMN = _col("Name", "string", _name, description="Name must be unique within a namespace.")
_AGE_COLUMN = _col(
    "Age", "string", lambda o: _age(o["metadata"].get("creationTimestamp")), description="When it was created."
)
_CREATED_AT = _col("Created At", "date", lambda o: o["metadata"].get("creationTimestamp") or "")


def _pod_ready(pod: Obj) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or [])
    return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"


def _pod_status(pod: Obj) -> str:
    """As upstream's printer: the status's reason, else its phase; Terminating once a delete marked it."""
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    status = pod.get("status") or {}
    return status.get("reason") or status.get("phase") or "Pending"


def _pod_restarts(pod: Obj) -> int:
    return sum(int(s.get("restartCount") or 0) for s in (pod.get("status") or {}).get("containerStatuses") or [])


def _node_status(node: Obj) -> str:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return {"True": "Ready", "False": "NotReady"}.get(cond.get("status"), "Unknown")
    return "Unknown"


def _node_roles(node: Obj) -> str:
    prefix = "node-role.kubernetes.io/"
    roles = sorted(k[len(prefix) :] for k in (node["metadata"].get("labels") or {}) if k.startswith(prefix))
    return ",".join(r for r in roles if r) or _NONE


def _node_address(kind: str) -> Callable[[Obj], str]:
    def cell(node: Obj) -> str:
        found = [a["address"] for a in (node.get("status") or {}).get("addresses") or [] if a.get("type") == kind]
        return ",".join(found) or _NONE

    return cell


def _selector_text(selector: Any) -> str:
    """A label selector as ``kubectl get`` shows it (``metav1.FormatLabelSelector``)."""
    if not isinstance(selector, Mapping):
        return _NONE
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        op, key, values = expr.get("operator"), expr.get("key"), expr.get("values") or []
        if op in ("In", "NotIn"):
            terms.append(f"{key} {op.lower()} ({','.join(values)})")
        elif op == "Exists":
            terms.append(str(key))
        elif op == "DoesNotExist":
            terms.append(f"!{key}")
    return ",".join(terms) or _NONE


def _status_int(field: str) -> Callable[[Obj], int]:
    return lambda o: int((o.get("status") or {}).get(field) or 0)


def _service_cluster_ip(service: Obj) -> str:
    ips = (service.get("spec") or {}).get("clusterIPs") or []
    return str(ips[0]) if ips else _NONE


def _service_external_ip(service: Obj) -> str:
    """``getServiceExternalIP`` (the server prints wide: no ``...`` truncation)."""
    spec = service.get("spec") or {}
    external = [str(ip) for ip in spec.get("externalIPs") or []]
    kind = spec.get("type")
    if kind in ("ClusterIP", "NodePort"):
        return ",".join(external) or _NONE
    if kind == "LoadBalancer":
        ingress = ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
        balancer = sorted({str(i.get("ip") or i.get("hostname")) for i in ingress if i.get("ip") or i.get("hostname")})
        return ",".join([*balancer, *external]) or "<pending>"
    if kind == "ExternalName":
        return str(spec.get("externalName") or "")
    return "<unknown>"


def _service_ports(service: Obj) -> str:
    """``makePortString``: ``80/TCP``, ``80:31234/TCP`` with a NodePort."""
    pieces = []
    for port in (service.get("spec") or {}).get("ports") or []:
        node = port.get("nodePort") or 0
        middle = f":{node}" if node > 0 else ""
        pieces.append(f"{port.get('port')}{middle}/{port.get('protocol', '')}")
    return ",".join(pieces) or _NONE


def _service_selector(service: Obj) -> str:
    """``labels.FormatLabels``."""
    selector = (service.get("spec") or {}).get("selector") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or _NONE


def _first_three(items: Sequence[str]) -> str:
    """``listWithMoreString`` of at most three items."""
    shown = ",".join(items[:3])
    if len(items) > 3:
        return f"{shown} + {len(items) - 3} more..."
    return shown or "<unset>"


def _slice_ports(endpoint_slice: Obj) -> str:
    listed = []
    for port in endpoint_slice.get("ports") or []:
        if port.get("port") is not None:
            listed.append(str(port["port"]))
        elif port.get("name") is not None:
            listed.append(str(port["name"]))
        else:
            listed.append("*")
    return _first_three(listed)


def _slice_endpoints(endpoint_slice: Obj) -> str:
    return _first_three([str(a) for e in endpoint_slice.get("endpoints") or [] for a in e.get("addresses") or []])


def _role_ref(binding: Obj) -> str:
    ref = binding.get("roleRef") or {}
    return f"{ref.get('kind', '')}/{ref.get('name', '')}"


_BUILT_IN: dict[Resource, tuple[_Printed, ...]] = {
    PODS: (
        _NAME_COLUMN,
        _col("Ready", "string", _pod_ready, description="The number of ready containers out of all."),
        _col("Status", "string", _pod_status),
        _col("Restarts", "string", _pod_restarts),
        _AGE_COLUMN,
        _col("IP", "string", lambda p: (p.get("status") or {}).get("podIP") or _NONE, priority=1),
        _col("Node", "string", lambda p: (p.get("spec") or {}).get("nodeName") or _NONE, priority=1),
        _col("Nominated Node", "string", lambda p: _NONE, priority=1),
        _col("Readiness Gates", "string", lambda p: _NONE, priority=1),
    ),
    NAMESPACES: (
        _NAME_COLUMN,
        _col("Status", "string", lambda n: (n.get("status") or {}).get("phase") or ""),
        _AGE_COLUMN,
    ),
    NODES: (
        _NAME_COLUMN,
        _col("Status", "string", _node_status),
        _col("Roles", "string", _node_roles),
        _AGE_COLUMN,
        _col("Version", "string", lambda n: ((n.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", "")),
        _col("Internal-IP", "string", _node_address("InternalIP"), priority=1),
        _col("External-IP", "string", _node_address("ExternalIP"), priority=1),
    ),
    NETWORKPOLICIES: (
        _NAME_COLUMN,
        _col("Pod-Selector", "string", lambda p: _selector_text((p.get("spec") or {}).get("podSelector"))),
        _AGE_COLUMN,
    ),
    SERVICES: (
        _NAME_COLUMN,
        _col("Type", "string", lambda s: (s.get("spec") or {}).get("type") or ""),
        _col("Cluster-IP", "string", _service_cluster_ip),
        _col("External-IP", "string", _service_external_ip),
        _col("Port(s)", "string", _service_ports),
        _AGE_COLUMN,
        _col("Selector", "string", _service_selector, priority=1),
    ),
    ENDPOINTSLICES: (
        _NAME_COLUMN,
        _col("AddressType", "string", lambda e: e.get("addressType") or ""),
        _col("Ports", "string", _slice_ports),
        _col("Endpoints", "string", _slice_endpoints),
        _AGE_COLUMN,
    ),
    SECRETS: (
        _NAME_COLUMN,
        _col("Type", "string", lambda s: s.get("type") or ""),
        _col("Data", "string", lambda s: len(s.get("data") or {})),
        _AGE_COLUMN,
    ),
    CONFIGMAPS: (
        _NAME_COLUMN,
        _col("Data", "string", lambda c: len(c.get("data") or {}) + len(c.get("binaryData") or {})),
        _AGE_COLUMN,
    ),
    SERVICEACCOUNTS: (_NAME_COLUMN, _col("Secrets", "string", lambda s: len(s.get("secrets") or [])), _AGE_COLUMN),
    DAEMONSETS: (
        _NAME_COLUMN,
        _col("Desired", "integer", _status_int("desiredNumberScheduled")),
        _col("Current", "integer", _status_int("currentNumberScheduled")),
        _col("Ready", "integer", _status_int("numberReady")),
        _col("Up-to-date", "integer", _status_int("updatedNumberScheduled")),
        _col("Available", "integer", _status_int("numberAvailable")),
        _col(
            "Node Selector",
            "string",
            lambda d: (
                ",".join(
                    f"{k}={v}"
                    for k, v in sorted(
                        (
                            (((d.get("spec") or {}).get("template") or {}).get("spec") or {}).get("nodeSelector") or {}
                        ).items()
                    )
                )
                or _NONE
            ),
        ),
        _AGE_COLUMN,
    ),
    CUSTOMRESOURCEDEFINITIONS: (_NAME_COLUMN, _CREATED_AT),
    LEASES: (
        _NAME_COLUMN,
        _col("Holder", "string", lambda lease: (lease.get("spec") or {}).get("holderIdentity") or ""),
        _AGE_COLUMN,
    ),
    CLUSTERROLES: (_NAME_COLUMN, _CREATED_AT),
    ROLES: (_NAME_COLUMN, _CREATED_AT),
    CLUSTERROLEBINDINGS: (_NAME_COLUMN, _col("Role", "string", _role_ref), _AGE_COLUMN),
    ROLEBINDINGS: (_NAME_COLUMN, _col("Role", "string", _role_ref), _AGE_COLUMN),
}

# deploy/'s CRDs' additionalPrinterColumns, used until a CRD object says otherwise.
_CUSTOM_DEFAULTS: dict[Resource, tuple[Column, ...]] = {
    NODECONFIGS: (
        Column("CIDR6", "string", ".spec.cidr6"),
        Column("CIDR4", "string", ".spec.cidr4"),
        Column("ASN", "integer", ".spec.bgp.asn"),
        Column("Age", "date", ".metadata.creationTimestamp"),
    ),
    LOADBALANCERPOOLS: (
        Column("Disabled", "boolean", ".spec.disabled"),
        Column("IPv6 Free", "string", ".status.ipv6.free"),
        Column("IPv4 Free", "string", ".status.ipv4.free"),
        Column("Used", "integer", ".status.used"),
        Column("Conflict", "string", '.status.conditions[?(@.type=="Conflict")].status'),
        Column("Age", "date", ".metadata.creationTimestamp"),
    ),
    ADDRESSGROUPS: (Column("Group", "string", ".group"), Column("Age", "date", ".metadata.creationTimestamp")),
    NODEADDRESSGROUPS: (
        Column("Revision", "integer", ".revision"),
        Column("Age", "date", ".metadata.creationTimestamp"),
    ),
    CLUSTERNETWORKPOLICIES: (
        Column("Tier", "string", ".spec.tier"),
        Column("Priority", "string", ".spec.priority"),
        Column("Age", "date", ".metadata.creationTimestamp"),
    ),
}


def crd_columns(crd: Obj | None, resource: Resource) -> tuple[Column, ...]:
    """The printer columns of *resource*'s version in *crd* (None: deploy/'s defaults)."""
    if crd is None:
        return _CUSTOM_DEFAULTS.get(resource, ())
    for version in (crd.get("spec") or {}).get("versions") or []:
        if version.get("name") == resource.version:
            return tuple(
                Column(
                    c["name"], c.get("type", "string"), c["jsonPath"], c.get("priority", 0), c.get("description", "")
                )
                for c in version.get("additionalPrinterColumns") or []
            )
    return ()


def _custom_printed(columns: Sequence[Column]) -> tuple[_Printed, ...]:
    def cell(column: Column) -> Callable[[Obj], Any]:
        def value(obj: Obj) -> Any:
            found = _path(obj, column.json_path)
            if column.type == "date":
                return _age(found) if found is not None else _NONE
            if found is None:
                return _NONE
            if column.type in ("integer", "number", "boolean"):
                return found
            return found if isinstance(found, str) else str(found)

        return value

    shown = [_Printed(attrs.evolve(c, type="string" if c.type == "date" else c.type), cell(c)) for c in columns]
    if not any(c.json_path == ".metadata.creationTimestamp" for c in columns):
        shown.append(_AGE_COLUMN)
    return (_NAME_COLUMN, *shown)


def table(
    resource: Resource,
    objects: Sequence[Obj],
    *,
    include_object: str = "",
    list_meta: Mapping[str, Any] | None = None,
    crd: Obj | None = None,
) -> dict[str, Any]:
    """The ``Table`` of *objects*; *include_object*: ``None``, ``Metadata`` (default) or ``Object``;
    *crd*: a custom resource's stored CustomResourceDefinition (its printer columns)."""
    include = include_object or "Metadata"
    if include not in ("None", "Metadata", "Object"):
        raise StatusError(
            400, f'includeObject: Unsupported value: "{include}": supported values: None, Metadata, Object'
        )
    printed = _BUILT_IN.get(resource) or _custom_printed(crd_columns(crd, resource))
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": [p.cell(obj) for p in printed]}
        if include == "Object":
            row["object"] = obj
        elif include == "Metadata":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata") or {},
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": dict(list_meta or {}),
        "columnDefinitions": [
            {
                "name": p.column.name,
                "type": p.column.type,
                "format": "name" if p is _NAME_COLUMN else "",
                "description": p.column.description,
                "priority": p.column.priority,
            }
            for p in printed
        ],
        "rows": rows,
    }
