"""The EndpointSlice controller's pure part: Services, Pods and Nodes → the slices each Service needs.

As kube-controller-manager's endpointslice controller (1.32) decides them:

- Only a Service with a selector (a non-empty ``spec.selector``) that is not
  ExternalName is managed; the others' slices are their owners' (users write
  their own), except slices this controller made, which go.
- One set of slices per address family of the Service (``spec.ipFamilies``;
  without them, the families of its ClusterIPs, else both), each holding the
  pods the selector matches in the Service's namespace that have an address
  of that family and have not ended (phase Succeeded or Failed).
- An endpoint: the pod's address, ``ready`` (the pod's Ready condition and no
  ``deletionTimestamp``), ``serving`` (Ready, even while terminating),
  ``terminating`` (``deletionTimestamp`` set); with ``publishNotReadyAddresses``
  every endpoint is ready and serving; ``nodeName``, ``targetRef`` (the Pod),
  ``zone`` (the Node's ``topology.kubernetes.io/zone``), ``hostname`` (when the
  pod's subdomain is the Service's name).
- Ports per pod: each Service port's ``targetPort``, a number as it is, a name
  looked up in the pod's containerPorts of that protocol (a pod without it
  leaves that port out); pods whose ports resolve alike share slices, at most
  ``MAX_ENDPOINTS_PER_SLICE`` endpoints each.
- Churn kept low as the reconciler keeps it: an endpoint stays in the slice it
  is in; slices are rewritten only when what they hold changes; new
  endpoints fill slices being rewritten anyway before any other, then slices
  with room, then new ones; a slice left empty goes; a Service with no
  endpoints of a family keeps one empty slice ("placeholder") of it.
- Each slice: ``generateName`` ``<service>-``, the Service's labels plus
  ``kubernetes.io/service-name`` and ``endpointslice.kubernetes.io/managed-by:
  endpointslice-controller.k8s.io`` (and ``service.kubernetes.io/headless``
  for a headless Service), a controller ownerReference to the Service.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

MAX_ENDPOINTS_PER_SLICE = 100  # kube-controller-manager's --max-endpoints-per-slice default
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
CONTROLLER_NAME = "endpointslice-controller.k8s.io"
HEADLESS_LABEL = "service.kubernetes.io/headless"
ZONE_LABEL = "topology.kubernetes.io/zone"
FAMILIES = ("IPv4", "IPv6")


@attrs.frozen
class PortRef:
    """One Service port: where its traffic goes in a pod (a number, or a containerPort's name)."""

    name: str
    protocol: str
    target: int | str
    app_protocol: str | None = None


@attrs.frozen
class ServiceValue:
    namespace: str
    name: str
    uid: str
    labels: tuple[tuple[str, str], ...]
    selector: tuple[tuple[str, str], ...]  # empty: not managed here
    ports: tuple[PortRef, ...]
    families: tuple[str, ...]  # address types of its slices
    external_name: bool = False
    headless: bool = False
    publish_not_ready: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def managed(self) -> bool:
        return bool(self.selector) and not self.external_name

    def selects(self, pod: PodValue) -> bool:
        return pod.namespace == self.namespace and all(dict(pod.labels).get(k) == v for k, v in self.selector)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ServiceValue:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        ports = []
        for raw in spec.get("ports") or []:
            port = raw.get("port")
            target = raw.get("targetPort")
            if target in (None, 0, ""):
                target = port
            elif isinstance(target, str) and target.isdigit():
                target = int(target)
            ports.append(
                PortRef(str(raw.get("name") or ""), str(raw.get("protocol") or "TCP"), target, raw.get("appProtocol"))
            )
        cluster_ips = [ip for ip in spec.get("clusterIPs") or [spec.get("clusterIP")] if ip and ip != "None"]
        families = tuple(f for f in spec.get("ipFamilies") or () if f in FAMILIES)
        if not families:
            seen = {f"IPv{ipaddress.ip_address(ip).version}" for ip in cluster_ips}
            families = tuple(f for f in FAMILIES if f in seen) or FAMILIES
        return cls(
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            labels=tuple(sorted((meta.get("labels") or {}).items())),
            selector=tuple(sorted((spec.get("selector") or {}).items())),
            ports=tuple(ports),
            families=families,
            external_name=spec.get("type") == "ExternalName",
            headless=spec.get("clusterIP") == "None",
            publish_not_ready=bool(spec.get("publishNotReadyAddresses")),
        )


@attrs.frozen
class ContainerPort:
    name: str
    port: int
    protocol: str


@attrs.frozen
class PodValue:
    namespace: str
    name: str
    uid: str
    labels: tuple[tuple[str, str], ...]
    node: str
    addresses: tuple[str, ...]  # status.podIPs (else podIP)
    ready: bool  # its Ready condition
    terminating: bool  # metadata.deletionTimestamp set
    ended: bool  # phase Succeeded or Failed
    ports: tuple[ContainerPort, ...] = ()
    hostname: str = ""
    subdomain: str = ""
    deletion_grace: int = 0  # metadata.deletionGracePeriodSeconds (what the kubelet stand-in waits)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def address(self, family: str) -> str | None:
        for ip in self.addresses:
            if f"IPv{ipaddress.ip_address(ip).version}" == family:
                return ip
        return None

    def find_port(self, ref: PortRef) -> int | None:
        """podutil.FindPort: a number as it is; a name, the containerPort of that name and protocol."""
        if isinstance(ref.target, int):
            return ref.target
        for port in self.ports:
            if port.name == ref.target and port.protocol == ref.protocol:
                return port.port
        return None

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> PodValue:
        meta, spec, status = (obj.get(k) or {} for k in ("metadata", "spec", "status"))
        ips = tuple(str(p.get("ip")) for p in status.get("podIPs") or [] if p.get("ip"))
        if not ips and status.get("podIP"):
            ips = (str(status["podIP"]),)
        ports = tuple(
            ContainerPort(str(p.get("name") or ""), int(p["containerPort"]), str(p.get("protocol") or "TCP"))
            for c in spec.get("containers") or []
            for p in c.get("ports") or []
            if isinstance(p.get("containerPort"), int)
        )
        conditions = status.get("conditions") or []
        return cls(
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            labels=tuple(sorted((meta.get("labels") or {}).items())),
            node=str(spec.get("nodeName") or ""),
            addresses=ips,
            ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
            terminating=bool(meta.get("deletionTimestamp")),
            ended=status.get("phase") in ("Succeeded", "Failed"),
            ports=ports,
            hostname=str(spec.get("hostname") or ""),
            subdomain=str(spec.get("subdomain") or ""),
            deletion_grace=int(meta.get("deletionGracePeriodSeconds") or 0),
        )


@attrs.frozen
class EndpointPort:
    name: str
    port: int
    protocol: str
    app_protocol: str | None = None

    def to_object(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "port": self.port, "protocol": self.protocol}
        if self.app_protocol is not None:
            out["appProtocol"] = self.app_protocol
        return out

    @classmethod
    def from_object(cls, raw: Mapping[str, Any]) -> EndpointPort:
        return cls(
            str(raw.get("name") or ""),
            int(raw.get("port") or 0),
            str(raw.get("protocol") or "TCP"),
            raw.get("appProtocol"),
        )


@attrs.frozen
class Endpoint:
    address: str
    ready: bool
    serving: bool
    terminating: bool
    node: str | None = None
    pod: tuple[str, str, str] | None = None  # targetRef: namespace, name, uid
    zone: str | None = None
    hostname: str | None = None

    def to_object(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "addresses": [self.address],
            "conditions": {"ready": self.ready, "serving": self.serving, "terminating": self.terminating},
        }
        if self.hostname is not None:
            out["hostname"] = self.hostname
        if self.pod is not None:
            namespace, name, uid = self.pod
            out["targetRef"] = {"kind": "Pod", "namespace": namespace, "name": name, "uid": uid}
        if self.node is not None:
            out["nodeName"] = self.node
        if self.zone is not None:
            out["zone"] = self.zone
        return out

    @classmethod
    def from_object(cls, raw: Mapping[str, Any]) -> Endpoint:
        cond = raw.get("conditions") or {}
        ready = cond.get("ready")
        ready = True if ready is None else bool(ready)
        serving = cond.get("serving")
        ref = raw.get("targetRef")
        return cls(
            address=str((raw.get("addresses") or [""])[0]),
            ready=ready,
            serving=ready if serving is None else bool(serving),
            terminating=bool(cond.get("terminating")),
            node=raw.get("nodeName"),
            pod=None if not ref else (str(ref.get("namespace", "")), str(ref.get("name", "")), str(ref.get("uid", ""))),
            zone=raw.get("zone"),
            hostname=raw.get("hostname"),
        )


@attrs.frozen
class SliceValue:
    """An EndpointSlice as this controller reads and writes it."""

    namespace: str
    name: str  # "" for one still to create (the API server names it from generateName)
    address_type: str
    ports: tuple[EndpointPort, ...]
    endpoints: tuple[Endpoint, ...]
    labels: tuple[tuple[str, str], ...] = ()
    owner_uid: str = ""
    resource_version: str = ""

    @property
    def service(self) -> str | None:
        return dict(self.labels).get(SERVICE_NAME_LABEL)

    @property
    def managed(self) -> bool:
        return dict(self.labels).get(MANAGED_BY_LABEL) == CONTROLLER_NAME

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> SliceValue:
        meta = obj.get("metadata") or {}
        owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
        return cls(
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name") or ""),
            address_type=str(obj.get("addressType") or ""),
            ports=tuple(EndpointPort.from_object(p) for p in obj.get("ports") or []),
            endpoints=tuple(Endpoint.from_object(e) for e in obj.get("endpoints") or []),
            labels=tuple(sorted((meta.get("labels") or {}).items())),
            owner_uid=str(owners[0].get("uid") or "") if owners else "",
            resource_version=str(meta.get("resourceVersion") or ""),
        )

    def to_object(self, service: ServiceValue) -> dict[str, Any]:
        """The object to POST (no name: ``generateName``) or PUT (with its resourceVersion)."""
        meta: dict[str, Any] = {
            "namespace": self.namespace,
            "labels": dict(self.labels),
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "name": service.name,
                    "uid": service.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        }
        if self.name:
            meta["name"] = self.name
        else:
            meta["generateName"] = f"{service.name[:57]}-"
        if self.resource_version:
            meta["resourceVersion"] = self.resource_version
        return {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": meta,
            "addressType": self.address_type,
            "endpoints": [e.to_object() for e in self.endpoints],
            "ports": [p.to_object() for p in self.ports],
        }


@attrs.frozen
class SlicePlan:
    """What one Service's slices need: create these (no names yet), replace these, delete these names."""

    create: tuple[SliceValue, ...] = ()
    update: tuple[SliceValue, ...] = ()
    delete: tuple[SliceValue, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.delete)


def slice_labels(service: ServiceValue) -> tuple[tuple[str, str], ...]:
    """The Service's labels, then the controller's own (which win)."""
    labels = dict(service.labels)
    for reserved in (SERVICE_NAME_LABEL, MANAGED_BY_LABEL, HEADLESS_LABEL):
        labels.pop(reserved, None)
    labels[SERVICE_NAME_LABEL] = service.name
    labels[MANAGED_BY_LABEL] = CONTROLLER_NAME
    if service.headless:
        labels[HEADLESS_LABEL] = ""
    return tuple(sorted(labels.items()))


def endpoint_for(service: ServiceValue, pod: PodValue, address: str, zones: Mapping[str, str]) -> Endpoint:
    serving = service.publish_not_ready or pod.ready
    # Never ready while terminating, unless publishNotReadyAddresses says every address is.
    ready = service.publish_not_ready or (serving and not pod.terminating)
    hostname = pod.hostname if pod.hostname and pod.subdomain == service.name else None
    return Endpoint(
        address=address,
        ready=ready,
        serving=serving,
        terminating=pod.terminating,
        node=pod.node or None,
        pod=(pod.namespace, pod.name, pod.uid),
        zone=zones.get(pod.node) or None,
        hostname=hostname,
    )


GroupKey = tuple[str, tuple[EndpointPort, ...]]  # (address type, ports)


def desired_endpoints(
    service: ServiceValue, pods: Iterable[PodValue], zones: Mapping[str, str]
) -> dict[GroupKey, dict[str, Endpoint]]:
    """Every endpoint the Service should have, by address type and resolved ports, keyed by address."""
    groups: dict[GroupKey, dict[str, Endpoint]] = {}
    for pod in sorted(pods, key=lambda p: p.key):
        if not service.selects(pod) or pod.ended or not pod.addresses:
            continue
        ports = []
        for ref in service.ports:
            number = pod.find_port(ref)
            if number is not None:
                ports.append(EndpointPort(ref.name, number, ref.protocol, ref.app_protocol))
        for family in service.families:
            address = pod.address(family)
            if address is None:
                continue
            groups.setdefault((family, tuple(ports)), {})[address] = endpoint_for(service, pod, address, zones)
    return groups


def _fill(slices: list[list[Endpoint]], changed: list[bool], new: list[Endpoint], limit: int) -> None:
    """Put *new* endpoints into the slices being rewritten first, then those with room (fullest first)."""
    order = sorted(range(len(slices)), key=lambda i: (not changed[i], -len(slices[i])))
    for i in order:
        while new and len(slices[i]) < limit:
            slices[i].append(new.pop(0))
            changed[i] = True


def plan_service(
    service: ServiceValue,
    pods: Iterable[PodValue],
    existing: Sequence[SliceValue],
    zones: Mapping[str, str] | None = None,
    limit: int = MAX_ENDPOINTS_PER_SLICE,
) -> SlicePlan:
    """The writes that take *existing* (the Service's managed slices) to what the Service needs now."""
    mine = [s for s in existing if s.managed and s.namespace == service.namespace and s.service == service.name]
    if not service.managed:
        return SlicePlan(delete=tuple(mine))
    labels = slice_labels(service)
    wanted = desired_endpoints(service, pods, zones or {})
    create: list[SliceValue] = []
    update: list[SliceValue] = []
    delete: list[SliceValue] = []
    for family in service.families:
        family_slices = [s for s in mine if s.address_type == family]
        groups = {key: eps for key, eps in wanted.items() if key[0] == family}
        kept_any = False
        for key, endpoints in groups.items():
            _, ports = key
            left = dict(endpoints)  # not placed yet
            slices: list[list[Endpoint]] = []
            changed: list[bool] = []
            olds: list[SliceValue] = []
            for old in (s for s in family_slices if s.ports == ports):
                keep = [left.pop(e.address) for e in old.endpoints if e.address in left]
                slices.append(keep)
                changed.append(tuple(keep) != old.endpoints or old.labels != labels or old.owner_uid != service.uid)
                olds.append(old)
            new = list(left.values())
            _fill(slices, changed, new, limit)
            for i, old in enumerate(olds):
                if not slices[i]:
                    delete.append(old)
                elif changed[i]:
                    update.append(attrs.evolve(old, endpoints=tuple(slices[i]), labels=labels, owner_uid=service.uid))
                    kept_any = True
                else:
                    kept_any = True
            while new:
                chunk, new = new[:limit], new[limit:]
                create.append(SliceValue(service.namespace, "", family, ports, tuple(chunk), labels, service.uid))
                kept_any = True
        delete += [s for s in family_slices if (family, s.ports) not in groups]
        if not kept_any:
            # No endpoints of this family: one empty slice stands for them (reused if there is one).
            placeholder = SliceValue(service.namespace, "", family, (), (), labels, service.uid)
            reusable = next((s for s in delete if s.address_type == family and not s.endpoints and not s.ports), None)
            if reusable is not None:
                delete.remove(reusable)
                if reusable.labels != labels or reusable.owner_uid != service.uid:
                    update.append(attrs.evolve(reusable, labels=labels, owner_uid=service.uid))
            else:
                create.append(placeholder)
    delete += [s for s in mine if s.address_type not in service.families]
    return SlicePlan(tuple(create), tuple(update), tuple(delete))


__all__ = [
    "CONTROLLER_NAME",
    "MANAGED_BY_LABEL",
    "MAX_ENDPOINTS_PER_SLICE",
    "SERVICE_NAME_LABEL",
    "Endpoint",
    "EndpointPort",
    "PodValue",
    "ServiceValue",
    "SlicePlan",
    "SliceValue",
    "desired_endpoints",
    "plan_service",
]
