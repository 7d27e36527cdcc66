"""Kernel state for pods: desired values (pure) and the pyroute2 worker."""

from flock.netlink._apply import STEPS
from flock.netlink._inspect import CleanupReport
from flock.netlink.desired import (
    GATEWAY4,
    GATEWAY6,
    HOST_IFACE_PREFIX,
    ROUTE_PROTOCOL,
    Address,
    AnycastMember,
    Attachment,
    DataplaneSettings,
    Nexthop,
    PodPlan,
    Route,
    Scope,
    Side,
    Sysctl,
    VethPair,
    anycast_routes,
    blackhole_routes,
    fnv1a_32,
    host_ifname,
    is_host_ifname,
    pod_plan,
)
from flock.netlink.worker import NetlinkWorker

__all__ = [
    "STEPS", "CleanupReport", "GATEWAY4", "GATEWAY6", "HOST_IFACE_PREFIX", "ROUTE_PROTOCOL", "Address",
    "AnycastMember", "Attachment", "DataplaneSettings", "Nexthop", "PodPlan", "Route", "Scope", "Side", "Sysctl", "VethPair",
    "anycast_routes", "blackhole_routes", "fnv1a_32", "host_ifname", "is_host_ifname", "pod_plan", "NetlinkWorker",
]
