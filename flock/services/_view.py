"""What this node programs for a Service, and why: ``flockctl services`` (pure, over the inputs).

For each Service port and family: the addresses that reach it (ClusterIP, NodePort on the node's
addresses, externalIPs and load-balancer addresses — with the ones left untranslated because no
pool holds them), and every endpoint of it with what the proxy does with it and why, in
kube-proxy's words (:mod:`._select`): chosen because ready; chosen because none is ready and it
is serving while terminating; left out because not ready, or on another node under a Local
policy.  A port whose traffic is refused or dropped says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ._announce import Announcements
from ._compile import NodeView, ServicesConfig
from ._model import EndpointSlice, Family, IPAddress, Service, ServiceType, TrafficPolicy
from ._select import Backend, Categorized, PortPolicy, backends, categorize, port_policy


def _in(service: Service, ip: IPAddress, config: ServicesConfig) -> bool:
    return config.allow.admits(service, ip)


def _why(ep: Backend, picked: Categorized, policy: PortPolicy) -> tuple[bool, str]:
    chosen = ep in picked.cluster or ep in picked.local
    if chosen and ep.ready:
        return True, "ready"
    if chosen:
        return True, "serving and terminating (no endpoint is ready)"
    if not (ep.ready or ep.serving_terminating):
        return False, "terminating" if ep.terminating else "not ready"
    if policy.uses_local and not policy.uses_cluster and not ep.local:
        return False, "on another node (internalTrafficPolicy: Local)"
    return False, "a ready endpoint is preferred"


def _outcome(picked: Categorized, policy: PortPolicy) -> str:
    if not picked.has_any:
        return "refused: no endpoint is ready or serving (clients get a reset or port unreachable)"

    def reach(local: bool, what: str, field: str) -> str:
        to = picked.local if local else picked.cluster
        if to:
            return f"{what} forwarded to {len(to)}"
        return f"{what} dropped here ({field}: Local, no endpoint on this node)"

    parts = [reach(policy.internal_local, "ClusterIP", "internalTrafficPolicy")]
    if policy.externally_accessible:
        parts.append(reach(policy.external_local, "external", "externalTrafficPolicy"))
    return "; ".join(parts)


def service_view(
    service: Service, slices: Iterable[EndpointSlice], node: NodeView, config: ServicesConfig
) -> dict[str, Any]:
    """One Service as this node translates it (JSON-ready)."""
    mine = [s for s in slices if s.namespace == service.namespace and s.service == service.name]
    external = sorted({*service.external_ips, *service.load_balancer_ips}, key=lambda a: (a.version, a))
    view: dict[str, Any] = {
        "namespace": service.namespace,
        "name": service.name,
        "type": service.type.value,
        "cluster_ips": [str(ip) for ip in service.cluster_ips],
        "external_addresses": [str(ip) for ip in external if _in(service, ip, config)],
        "untranslated": [str(ip) for ip in external if not _in(service, ip, config)],
        "external_traffic_policy": service.external_traffic_policy.value,
        "internal_traffic_policy": service.internal_traffic_policy.value,
        "session_affinity": f"ClientIP ({service.affinity_timeout} s)" if service.client_ip_affinity else "None",
        "proxied": service.proxied,
        "ports": [],
    }
    if service.health_check_node_port is not None and service.external_traffic_policy is TrafficPolicy.LOCAL:
        view["health_check_node_port"] = service.health_check_node_port
    if not service.proxied:
        view["why_not"] = (
            "ExternalName: DNS only" if service.type is ServiceType.EXTERNAL_NAME else "headless: DNS only"
        )
        return view
    for port in service.ports:
        entry: dict[str, Any] = {
            "name": port.name,
            "protocol": port.protocol.value,
            "port": port.port,
            "node_port": port.node_port,
            "families": {},
        }
        for family in service.ip_families:
            if service.cluster_ip(family) is None:
                continue
            translated = [ip for ip in external if _in(service, ip, config) and ip.version == family.version]
            policy = port_policy(service, port, external_addresses=bool(translated))
            found = backends(service, port, family, mine, node.name)
            picked = categorize(found, policy)
            endpoints = []
            for ep in found:
                chosen, why = _why(ep, picked, policy)
                endpoints.append(
                    {
                        "address": str(ep.address),
                        "port": ep.port,
                        "local": ep.local,
                        "ready": ep.ready,
                        "serving": ep.serving,
                        "terminating": ep.terminating,
                        "chosen": chosen,
                        "why": why,
                    }
                )
            entry["families"][family.value] = {
                "outcome": _outcome(picked, policy),
                "endpoints": endpoints,
                "local_endpoints": len(picked.local),
            }
        view["ports"].append(entry)
    return view


def services_view(
    services: Mapping[str, Service],
    slices: Mapping[str, EndpointSlice],
    node: NodeView,
    config: ServicesConfig,
    only: str | None = None,
) -> list[dict[str, Any]]:
    """Every Service (or the one keyed *only*, ``namespace/name``), sorted by key."""
    keys = sorted(services) if only is None else [only] if only in services else []
    return [service_view(services[key], slices.values(), node, config) for key in keys]


def bgp_view(key: str, result: Announcements) -> dict[str, Any]:
    """What this node announces of the Service *key* over BGP, and why not (JSON-ready)."""
    return {
        "announced": [
            {
                "prefix": str(r.prefix),
                "pool": r.pool,
                "why": r.why,
                "communities": [f"{a}:{b}" for a, b in r.communities.standard]
                + [f"{a}:{b}:{c}" for a, b, c in r.communities.large],
                "local_preference": r.local_preference,
                "last_resort": r.alone,
            }
            for r in result.routes
            if key in r.services
        ],
        "not_announced": [{"address": str(n.address), "why": n.why} for n in result.not_announced if n.service == key],
    }


def view_text(view: Mapping[str, Any]) -> str:
    """A Service as ``flockctl services NS/NAME`` prints it."""
    lines = [
        f"{view['namespace']}/{view['name']}  {view['type']}  cluster IPs: {', '.join(view['cluster_ips']) or '-'}"
    ]
    if view.get("why_not"):
        return lines[0] + f"\n  not translated: {view['why_not']}"
    if view["external_addresses"]:
        lines.append(f"  external: {', '.join(view['external_addresses'])}")
    if view["untranslated"]:
        lines.append(f"  not translated (in no pool, CVE-2020-8554): {', '.join(view['untranslated'])}")
    lines.append(
        f"  externalTrafficPolicy {view['external_traffic_policy']}, internalTrafficPolicy "
        f"{view['internal_traffic_policy']}, affinity {view['session_affinity']}"
        + (f", health check :{view['health_check_node_port']}" if "health_check_node_port" in view else "")
    )
    bgp = view.get("bgp")
    for route in bgp["announced"] if bgp else ():
        extra = f", communities {' '.join(route['communities'])}" if route["communities"] else ""
        extra += f", local preference {route['local_preference']}" if route["local_preference"] is not None else ""
        lines.append(f"  BGP: announces {route['prefix']} (pool {route['pool']}{extra}): {route['why']}")
    for miss in bgp["not_announced"] if bgp else ():
        lines.append(f"  BGP: does not announce {miss['address']}: {miss['why']}")
    for port in view["ports"]:
        node_port = f" nodePort {port['node_port']}" if port["node_port"] else ""
        lines.append(f"  port {port['name'] or '-'} {port['port']}/{port['protocol']}{node_port}")
        for family, fam in port["families"].items():
            lines.append(f"    {family}: {fam['outcome']}")
            for ep in fam["endpoints"]:
                where = "local" if ep["local"] else "remote"
                mark = "→" if ep["chosen"] else "✗"
                address = f"[{ep['address']}]" if ":" in ep["address"] else ep["address"]
                lines.append(f"      {mark} {address}:{ep['port']} ({where}) {ep['why']}")
    return "\n".join(lines)


__all__ = ["Family", "bgp_view", "service_view", "services_view", "view_text"]
