"""A Service as kube-apiserver 1.32 defaults, prepares and validates it: pure functions over the dict.

``default_service`` is the v1 defaulter (``SetDefaults_Service``: type ClusterIP, sessionAffinity
None and ClientIP's 10800 s, port protocol TCP and targetPort = port, externalTrafficPolicy Cluster
for externally reachable Services, internalTrafficPolicy Cluster, allocateLoadBalancerNodePorts,
ingress ipMode VIP); ``normalize_cluster_ips``, ``patch_allocated_values`` and
``drop_type_dependent_fields`` are the strategy's (``pkg/registry/core/service/strategy.go``);
``validate_service``, ``validate_service_update`` and ``validate_load_balancer_status`` follow
``ValidateService`` and its helpers (``pkg/apis/core/validation``), raising the first error
(upstream lists them all) with upstream's message.  What needs the configured ranges and the other
Services (ipFamilies, allocation) is :mod:`._service_alloc`'s.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from ._status import Invalid
from ._validation import (
    PORT_RANGE,
    REQUIRED,
    cidr,
    dns1035_label,
    dns_label,
    dns_subdomain,
    ip_address,
    is_int,
    is_port,
    labels,
    non_special_ip,
    parse_ip,
    qualified_name,
    unsupported,
)

CLUSTER_IP, NODE_PORT, LOAD_BALANCER, EXTERNAL_NAME = "ClusterIP", "NodePort", "LoadBalancer", "ExternalName"
TYPES = (CLUSTER_IP, EXTERNAL_NAME, LOAD_BALANCER, NODE_PORT)
NONE = "None"  # a headless Service's clusterIP
SINGLE_STACK, PREFER_DUAL_STACK, REQUIRE_DUAL_STACK = "SingleStack", "PreferDualStack", "RequireDualStack"
POLICIES = (PREFER_DUAL_STACK, REQUIRE_DUAL_STACK, SINGLE_STACK)
IPV4, IPV6 = "IPv4", "IPv6"
PROTOCOLS = ("SCTP", "TCP", "UDP")
TRAFFIC_POLICIES = ("Cluster", "Local")
IP_MODES = ("Proxy", "VIP")
DEFAULT_AFFINITY_SECONDS = 10800
MAX_AFFINITY_SECONDS = 86400

Spec = dict[str, Any]


# ---- what a Service needs --------------------------------------------------------------


def needs_cluster_ip(spec: Mapping[str, Any]) -> bool:
    return spec.get("type") != EXTERNAL_NAME


def needs_node_port(spec: Mapping[str, Any]) -> bool:
    return spec.get("type") in (NODE_PORT, LOAD_BALANCER)


def needs_health_check(spec: Mapping[str, Any]) -> bool:
    """``apiservice.NeedsHealthCheck``: a LoadBalancer with externalTrafficPolicy Local."""
    return spec.get("type") == LOAD_BALANCER and spec.get("externalTrafficPolicy") == "Local"


def externally_accessible(spec: Mapping[str, Any]) -> bool:
    kind = spec.get("type")
    return kind in (LOAD_BALANCER, NODE_PORT) or (kind == CLUSTER_IP and bool(spec.get("externalIPs")))


def is_headless(spec: Mapping[str, Any]) -> bool:
    return spec.get("clusterIP") == NONE


def should_allocate_node_ports(spec: Mapping[str, Any]) -> bool:
    if spec.get("type") == NODE_PORT:
        return True
    return spec.get("type") == LOAD_BALANCER and spec.get("allocateLoadBalancerNodePorts", True) is not False


def ports(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    found = spec.get("ports")
    return [p for p in found if isinstance(p, dict)] if isinstance(found, list) else []


def node_ports(spec: Mapping[str, Any]) -> list[int]:
    return [p["nodePort"] for p in ports(spec) if is_int(p.get("nodePort")) and p["nodePort"]]


def family_of(ip: str) -> str:
    parsed = parse_ip(ip)
    return IPV6 if parsed is not None and parsed.version == 6 else IPV4


# ---- defaulting (at decode, v1) ---------------------------------------------------------


def default_service(obj: dict[str, Any]) -> None:
    """``SetDefaults_Service``; *obj* changed in place (a spec that is not an object is left for validation)."""
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    if not spec.get("sessionAffinity"):
        spec["sessionAffinity"] = "None"
    if spec["sessionAffinity"] == "None":
        spec.pop("sessionAffinityConfig", None)
    elif spec["sessionAffinity"] == "ClientIP":
        config = spec.get("sessionAffinityConfig")
        client = config.get("clientIP") if isinstance(config, dict) else None
        if not isinstance(client, dict) or client.get("timeoutSeconds") is None:
            spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": DEFAULT_AFFINITY_SECONDS}}
    if not spec.get("type"):
        spec["type"] = CLUSTER_IP
    for port in ports(spec):
        port.setdefault("protocol", "TCP")
        if port.get("targetPort") in (None, 0, ""):
            port["targetPort"] = port.get("port")
    if externally_accessible(spec) and not spec.get("externalTrafficPolicy"):
        spec["externalTrafficPolicy"] = "Cluster"
    if spec.get("internalTrafficPolicy") is None and spec["type"] in (NODE_PORT, LOAD_BALANCER, CLUSTER_IP):
        spec["internalTrafficPolicy"] = "Cluster"
    if spec["type"] == LOAD_BALANCER:
        spec.setdefault("allocateLoadBalancerNodePorts", True)
        default_ip_modes(obj)


def default_ip_modes(obj: dict[str, Any]) -> None:
    """A LoadBalancer's ingress with an ``ip`` and no ``ipMode`` gets VIP (the LoadBalancerIPMode gate, on in 1.32)."""
    if (obj.get("spec") or {}).get("type") != LOAD_BALANCER:
        return
    status = obj.get("status")
    balancer = status.get("loadBalancer") if isinstance(status, dict) else None
    ingress = balancer.get("ingress") if isinstance(balancer, dict) else None
    for entry in ingress if isinstance(ingress, list) else []:
        if isinstance(entry, dict) and entry.get("ip") and entry.get("ipMode") is None:
            entry["ipMode"] = "VIP"


# ---- the strategy's preparation ----------------------------------------------------------


def normalize_cluster_ips(spec: Spec, old: Spec | None) -> None:
    """Keep ``clusterIP`` and ``clusterIPs`` in step (``NormalizeClusterIPs``): an old client sets the singular only."""
    ip, ips = spec.get("clusterIP") or "", spec.get("clusterIPs") or []
    if old is None:
        if ip and not ips:
            spec["clusterIPs"] = [ip]
        return
    old_ip, old_ips = old.get("clusterIP") or "", old.get("clusterIPs") or []
    if ip != old_ip and ips == old_ips:
        if not ip:
            spec.pop("clusterIPs", None)
        else:
            spec["clusterIPs"] = [ip, *ips[1:]]
    elif ip == old_ip and ips != old_ips and not ips:
        spec.pop("clusterIP", None)


def patch_allocated_values(spec: Spec, old: Spec) -> None:
    """``patchAllocatedValues``: what the server allocated and a client's update omits (kubectl's
    apply, a PUT of a trimmed object) is kept: clusterIP(s), nodePorts by port name, healthCheckNodePort."""
    if needs_cluster_ip(old) and needs_cluster_ip(spec):
        if not spec.get("clusterIP") and old.get("clusterIP"):
            spec["clusterIP"] = old["clusterIP"]
        if not spec.get("clusterIPs") and old.get("clusterIPs"):
            spec["clusterIPs"] = list(old["clusterIPs"])
    if needs_node_port(old) and needs_node_port(spec):
        used = set(node_ports(old)) & set(node_ports(spec))
        by_name = {p.get("name") or "": p.get("nodePort") or 0 for p in ports(old)}
        for port in ports(spec):
            if not port.get("nodePort"):
                kept = by_name.get(port.get("name") or "", 0)
                if kept and kept not in used:
                    port["nodePort"] = kept
    both = needs_health_check(old) and needs_health_check(spec)
    if both and not spec.get("healthCheckNodePort") and old.get("healthCheckNodePort"):
        spec["healthCheckNodePort"] = old["healthCheckNodePort"]


def drop_type_dependent_fields(obj: dict[str, Any], old: Spec) -> None:
    """``dropTypeDependentFields`` on update: what the old type needed, the new one does not and the
    client left as it was goes (so it is released); a non-LoadBalancer loses its load-balancer status."""
    spec = obj["spec"]
    if needs_cluster_ip(old) and not needs_cluster_ip(spec):
        if (spec.get("clusterIPs") or []) == (old.get("clusterIPs") or []):
            spec.pop("clusterIP", None)
            spec.pop("clusterIPs", None)
        if spec.get("ipFamilies") == old.get("ipFamilies"):
            spec.pop("ipFamilies", None)
        if spec.get("ipFamilyPolicy") == old.get("ipFamilyPolicy"):
            spec.pop("ipFamilyPolicy", None)
    if needs_node_port(old) and not needs_node_port(spec) and node_ports(spec) == node_ports(old):
        for port in ports(spec):
            port.pop("nodePort", None)
    kept_check = spec.get("healthCheckNodePort") == old.get("healthCheckNodePort")
    if needs_health_check(old) and not needs_health_check(spec) and kept_check:
        spec.pop("healthCheckNodePort", None)
    if old.get("type") == LOAD_BALANCER and spec.get("type") != LOAD_BALANCER:
        for key in ("allocateLoadBalancerNodePorts", "loadBalancerClass"):
            if key in spec and spec.get(key) == old.get(key):
                del spec[key]
    kept_etp = spec.get("externalTrafficPolicy") == old.get("externalTrafficPolicy")
    if externally_accessible(old) and not externally_accessible(spec) and kept_etp:
        spec.pop("externalTrafficPolicy", None)
    if spec.get("type") != LOAD_BALANCER:
        obj["status"] = {"loadBalancer": {}}


# ---- validation --------------------------------------------------------------------------


def validate_service(obj: Mapping[str, Any]) -> None:
    """``ValidateService``: the first error, as :class:`Invalid`."""
    dns1035_label(obj["metadata"]["name"], "metadata.name")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise Invalid("spec", spec, REQUIRED)
    kind = spec.get("type")
    headless = is_headless(spec)
    if not ports(spec) and not headless and kind != EXTERNAL_NAME:
        raise Invalid("spec.ports", spec.get("ports"), REQUIRED)
    if kind in (LOAD_BALANCER, NODE_PORT) and headless:
        raise Invalid("spec.clusterIPs[0]", NONE, f"may not be set to 'None' for {kind} services")
    if kind == EXTERNAL_NAME:
        for key in ("clusterIPs", "ipFamilies", "ipFamilyPolicy"):
            if spec.get(key):
                raise Invalid(f"spec.{key}", spec[key], "Forbidden: may not be set for ExternalName services")
        name = spec.get("externalName")
        cname = name.removesuffix(".") if isinstance(name, str) else ""
        if not cname:
            raise Invalid("spec.externalName", name, REQUIRED)
        dns_subdomain(cname, "spec.externalName")
    _validate_ports(spec, headless)
    labels(spec.get("selector"), "spec.selector")
    affinity = spec.get("sessionAffinity")
    if not affinity:
        raise Invalid("spec.sessionAffinity", affinity, REQUIRED)
    if affinity not in ("ClientIP", "None"):
        raise Invalid("spec.sessionAffinity", affinity, unsupported(affinity, ("ClientIP", "None")))
    if affinity == "ClientIP":
        timeout = ((spec.get("sessionAffinityConfig") or {}).get("clientIP") or {}).get("timeoutSeconds")
        if not (isinstance(timeout, int) and not isinstance(timeout, bool) and 0 < timeout <= MAX_AFFINITY_SECONDS):
            raise Invalid(
                "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                timeout,
                f"must be greater than 0 and less than {MAX_AFFINITY_SECONDS}",
            )
    validate_cluster_ips_related_fields(spec)
    external = spec.get("externalIPs") or []
    if not isinstance(external, list):
        raise Invalid("spec.externalIPs", external, "must be a list of IP addresses")
    for i, ip in enumerate(external):
        ip_address(ip, f"spec.externalIPs[{i}]")
        non_special_ip(ip, f"spec.externalIPs[{i}]")
    if not kind:
        raise Invalid("spec.type", kind, REQUIRED)
    if kind not in TYPES:
        raise Invalid("spec.type", kind, unsupported(kind, TYPES))
    _validate_node_ports(spec)
    ranges = spec.get("loadBalancerSourceRanges")
    if ranges:
        if kind != LOAD_BALANCER:
            raise Invalid(
                "spec.LoadBalancerSourceRanges", ranges, "Forbidden: may only be used when `type` is 'LoadBalancer'"
            )
        for i, text in enumerate(ranges):
            cidr(text.strip() if isinstance(text, str) else text, f"spec.LoadBalancerSourceRanges[{i}]")
    if spec.get("allocateLoadBalancerNodePorts") is not None and kind != LOAD_BALANCER:
        raise Invalid(
            "spec.allocateLoadBalancerNodePorts",
            spec["allocateLoadBalancerNodePorts"],
            "Forbidden: may only be used when `type` is 'LoadBalancer'",
        )
    if kind == LOAD_BALANCER and spec.get("allocateLoadBalancerNodePorts") is None:
        raise Invalid("allocateLoadBalancerNodePorts", None, REQUIRED)
    lb_class = spec.get("loadBalancerClass")
    if lb_class is not None:
        if kind != LOAD_BALANCER:
            raise Invalid(
                "spec.loadBalancerClass", lb_class, "Forbidden: may only be used when service type is 'LoadBalancer'"
            )
        qualified_name(lb_class, "spec.loadBalancerClass")
    _validate_traffic_policies(spec)


def _validate_ports(spec: Spec, headless: bool) -> None:
    found = spec.get("ports")
    if found is not None and not isinstance(found, list):
        raise Invalid("spec.ports", found, "must be a list")
    listed = found or []
    names: set[str] = set()
    seen: set[tuple[Any, Any]] = set()
    for i, port in enumerate(listed):
        where = f"spec.ports[{i}]"
        if not isinstance(port, dict):
            raise Invalid(where, port, "must be an object")
        name = port.get("name") or ""
        if len(listed) > 1 and not name:
            raise Invalid(f"{where}.name", name, REQUIRED)
        if name:
            dns_label(name, f"{where}.name")
            if name in names:
                raise Invalid(f"{where}.name", name, "Duplicate value")
            names.add(name)
        if not is_port(port.get("port")):
            raise Invalid(f"{where}.port", port.get("port"), PORT_RANGE)
        protocol = port.get("protocol")
        if not protocol:
            raise Invalid(f"{where}.protocol", protocol, REQUIRED)
        if protocol not in PROTOCOLS:
            raise Invalid(f"{where}.protocol", protocol, unsupported(protocol, PROTOCOLS))
        _port_num_or_name(port.get("targetPort"), f"{where}.targetPort")
        if port.get("appProtocol") is not None:
            qualified_name(port["appProtocol"], f"{where}.appProtocol")
        node_port = port.get("nodePort")
        if node_port is not None and (not is_int(node_port) or not 0 <= node_port <= 65535):
            raise Invalid(f"{where}.nodePort", node_port, PORT_RANGE)
    for i, port in enumerate(listed):
        key = (port.get("port"), port.get("protocol"))
        if key in seen:
            raise Invalid(f"spec.ports[{i}]", {"port": key[0], "protocol": key[1]}, "Duplicate value")
        seen.add(key)


def _port_num_or_name(value: Any, where: str) -> None:
    """``ValidatePortNumOrName``."""
    if is_int(value):
        if not is_port(value):
            raise Invalid(where, value, PORT_RANGE)
        return
    if not isinstance(value, str) or not value:
        raise Invalid(where, value, "must contain at least one letter or number (a-z, 0-9)")
    if len(value) > 15:
        raise Invalid(where, value, "must be no more than 15 characters")
    if not all(c.islower() or c.isdigit() or c == "-" for c in value) or not value.isascii():
        raise Invalid(where, value, "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if "--" in value:
        raise Invalid(where, value, "must not contain consecutive hyphens")
    if value.startswith("-") or value.endswith("-"):
        raise Invalid(where, value, "must not begin or end with a hyphen")
    if not any(c.isalpha() for c in value):
        raise Invalid(where, value, "must contain at least one letter (a-z)")


def _validate_node_ports(spec: Spec) -> None:
    seen: set[tuple[Any, int]] = set()
    for i, port in enumerate(ports(spec)):
        node_port = port.get("nodePort")
        if not node_port:
            continue
        if spec.get("type") == CLUSTER_IP:
            raise Invalid(
                f"spec.ports[{i}].nodePort", node_port, "Forbidden: may not be used when `type` is 'ClusterIP'"
            )
        key = (port.get("protocol"), node_port)
        if key in seen:
            raise Invalid(f"spec.ports[{i}].nodePort", node_port, "Duplicate value")
        seen.add(key)


def _validate_traffic_policies(spec: Spec) -> None:
    etp = spec.get("externalTrafficPolicy")
    if not externally_accessible(spec):
        if etp:
            raise Invalid("spec.externalTrafficPolicy", etp, "may only be set for externally-accessible services")
    elif not etp:
        raise Invalid("spec.externalTrafficPolicy", etp, REQUIRED)
    elif etp not in TRAFFIC_POLICIES:
        raise Invalid("spec.externalTrafficPolicy", etp, unsupported(etp, TRAFFIC_POLICIES))
    check = spec.get("healthCheckNodePort")
    if not needs_health_check(spec):
        if check:
            raise Invalid(
                "spec.healthCheckNodePort",
                check,
                "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'",
            )
    elif check is not None and not is_port(check):
        raise Invalid("spec.healthCheckNodePort", check, PORT_RANGE)
    itp = spec.get("internalTrafficPolicy")
    if itp is None and spec.get("type") in (NODE_PORT, LOAD_BALANCER, CLUSTER_IP):
        raise Invalid("spec.internalTrafficPolicy", itp, REQUIRED)
    if itp is not None and itp not in TRAFFIC_POLICIES:
        raise Invalid("spec.internalTrafficPolicy", itp, unsupported(itp, TRAFFIC_POLICIES))
    distribution = spec.get("trafficDistribution")
    if distribution is not None and distribution != "PreferClose":
        raise Invalid("spec.trafficDistribution", distribution, unsupported(distribution, ("PreferClose",)))


def validate_cluster_ips_related_fields(spec: Spec) -> None:
    """``ValidateServiceClusterIPsRelatedFields``: clusterIP(s), ipFamilies and ipFamilyPolicy agree."""
    if spec.get("type") == EXTERNAL_NAME:
        return
    ip, ips = spec.get("clusterIP") or "", spec.get("clusterIPs") or []
    if not isinstance(ips, list):
        raise Invalid("spec.clusterIPs", ips, "must be a list")
    if ip:
        if not ips:
            raise Invalid("spec.clusterIPs", ips, REQUIRED)
        if ips[0] != ip:
            raise Invalid("spec.clusterIPs", ips, "first value must match `clusterIP`")
    elif ips:
        raise Invalid("spec.clusterIPs", ips, "must be empty when `clusterIP` is not specified")
    families = spec.get("ipFamilies") or []
    for i, family in enumerate(families):
        if family not in (IPV4, IPV6):
            raise Invalid(f"spec.ipFamilies[{i}]", family, unsupported(family, (IPV4, IPV6)))
        if family in families[:i]:
            raise Invalid(f"spec.ipFamilies[{i}]", family, "Duplicate value")
    policy = spec.get("ipFamilyPolicy")
    if policy is not None and policy not in POLICIES:
        raise Invalid("spec.ipFamilyPolicy", policy, unsupported(policy, POLICIES))
    for i, address in enumerate(ips):
        if i == 0 and address == NONE:
            if len(ips) > 1:
                raise Invalid("spec.clusterIPs", ips, "'None' must be the first and only value")
            continue
        ip_address(address, f"spec.clusterIPs[{i}]")
    if len(ips) > 2:
        raise Invalid("spec.clusterIPs", ips, "may only hold up to 2 values")
    if len(ips) == 2 and family_of(ips[0]) == family_of(ips[1]):
        raise Invalid("spec.clusterIPs", ips, "may specify no more than one IP for each IP family")
    if ips and ips[0] != NONE:
        for i, (address, family) in enumerate(zip(ips, families, strict=False)):
            if family_of(address) != family:
                raise Invalid(
                    f"spec.clusterIPs[{i}]", address, f"expected an {family} value as indicated by `ipFamilies[{i}]`"
                )


def validate_service_update(obj: Mapping[str, Any], old: Mapping[str, Any]) -> None:
    """``ValidateServiceUpdate``: clusterIPs and ipFamilies may grow or shrink by the secondary only,
    the loadBalancerClass of a LoadBalancer stays, then :func:`validate_service`."""
    spec, before = obj["spec"], old["spec"]
    if EXTERNAL_NAME not in (spec.get("type"), before.get("type")):
        _upgrade_downgrade(spec, before, "clusterIPs", "clusterIP")
        _upgrade_downgrade(spec, before, "ipFamilies", "ipFamily")
    changed_class = spec.get("loadBalancerClass") != before.get("loadBalancerClass")
    if spec.get("type") == LOAD_BALANCER == before.get("type") and changed_class:
        raise Invalid("spec.loadBalancerClass", spec.get("loadBalancerClass"), "may not change once set")
    validate_service(obj)


def _upgrade_downgrade(spec: Spec, before: Spec, key: str, singular: str) -> None:
    """``validateUpgradeDowngradeClusterIPs`` / ``...IPFamilies`` (their quirks included: both look
    at clusterIPs to tell whether the primary was unset, and name ``clusterIPs[0]`` for the policy)."""
    new, old = spec.get(key) or [], before.get(key) or []
    if key == "clusterIPs" and is_headless(spec) and is_headless(before):
        return
    ips = spec.get("clusterIPs") or []
    if len(new) == len(old):
        for i, value in enumerate(old):
            if value != new[i]:
                raise Invalid(f"spec.{key}[{i if key == 'clusterIPs' else 0}]", new, "may not change once set")
    elif len(new) < len(old):
        if not ips:
            raise Invalid(f"spec.{key}[0]", new, f"primary {singular} can not be unset")
        if new and new[0] != old[0]:
            raise Invalid(f"spec.{key}[0]", ips, "may not change once set")
        if len(new) == 1 and spec.get("ipFamilyPolicy") != SINGLE_STACK:
            raise Invalid(
                "spec.clusterIPs[0]",
                ips,
                f"`ipFamilyPolicy` must be set to 'SingleStack' when releasing the secondary {singular}",
            )
    elif old and new[0] != old[0]:
        raise Invalid(f"spec.{key}[0]", ips, "may not change once set")


def validate_load_balancer_status(obj: Mapping[str, Any]) -> None:
    """``ValidateLoadBalancerStatus`` (``status.loadBalancer``), as a status update checks it."""
    status = obj.get("status")
    if status is None:
        return
    if not isinstance(status, dict):
        raise Invalid("status", status, "must be an object")
    balancer = status.get("loadBalancer") or {}
    if not isinstance(balancer, dict):
        raise Invalid("status.loadBalancer", balancer, "must be an object")
    ingress = balancer.get("ingress") or []
    if not isinstance(ingress, list):
        raise Invalid("status.loadBalancer.ingress", ingress, "must be a list")
    if ingress and (obj.get("spec") or {}).get("type") != LOAD_BALANCER:
        raise Invalid(
            "status.loadBalancer.ingress", ingress, "Forbidden: may only be used when `spec.type` is 'LoadBalancer'"
        )
    for i, entry in enumerate(ingress):
        where = f"status.loadBalancer.ingress[{i}]"
        if not isinstance(entry, dict):
            raise Invalid(where, entry, "must be an object")
        if entry.get("ip"):
            ip_address(entry["ip"], f"{where}.ip")
        mode = entry.get("ipMode")
        if mode is None and entry.get("ip"):
            raise Invalid(f"{where}.ipMode", mode, "Required value: must be specified when `ip` is set")
        if mode is not None and not entry.get("ip"):
            raise Invalid(f"{where}.ipMode", mode, "Forbidden: may not be specified when `ip` is not set")
        if mode is not None and mode not in IP_MODES:
            raise Invalid(f"{where}.ipMode", mode, unsupported(mode, IP_MODES))
        hostname = entry.get("hostname")
        if hostname:
            dns_subdomain(hostname, f"{where}.hostname")
            if parse_ip(hostname) is not None:
                raise Invalid(f"{where}.hostname", hostname, "must be a DNS name, not an IP address")


def status_copy(old: Mapping[str, Any]) -> dict[str, Any]:
    """What a Service's main resource keeps of its status on update (all of it: only /status writes it)."""
    kept = old.get("status")
    return copy.deepcopy(kept) if isinstance(kept, dict) else {"loadBalancer": {}}
