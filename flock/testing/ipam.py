"""Builders shared by the IPAM tests: a NodeConfig and pods without an API server."""

from __future__ import annotations

from flock.model import NodeConfig, PodInfo

P = "flock.fritzlab.net/"


# What test NodeConfigs let pods claim for anycast/addresses besides their blocks
# (documentation ranges; the lab's BGP peer 2001:db8:ffff::1 lies inside, and stays refused).
ANNOUNCE_RANGES = ("2001:db8:8000::/33", "203.0.113.0/24")


def node(
    cidr6="2001:db8:0:1::/64",
    cidr4="198.51.100.0/24",
    ipv4=True,
    ip_algo=None,
    name="host001",
    announce_ranges=ANNOUNCE_RANGES,
    bgp=None,
):
    meta = {"name": name}
    if ip_algo is not None:
        meta["annotations"] = {P + "ip-algo": ip_algo}
    spec = {"cidr6": cidr6, "families": {"ipv6": True, "ipv4": ipv4}, "announceRanges": list(announce_ranges)}
    if bgp is not None:
        spec["bgp"] = bgp
    if cidr4 is not None:
        spec["cidr4"] = cidr4
    return NodeConfig.from_object({"metadata": meta, "spec": spec})


def pod(name="web-0", namespace="prod", annotations=None, owner=None, labels=None, image="nginx:1"):
    meta = {"name": name, "namespace": namespace, "annotations": {P + k: v for k, v in (annotations or {}).items()}}
    if owner is not None:
        kind, oname = owner
        meta["ownerReferences"] = [{"kind": kind, "name": oname, "controller": True}]
    if labels:
        meta["labels"] = labels
    spec = {"containers": [{"name": "c", "image": image}]} if image else {"containers": []}
    return PodInfo.from_object({"metadata": meta, "spec": spec})


def replica(name, namespace="prod", rs="web-7d9c5b8f6d", template_hash="7d9c5b8f6d", annotations=None):
    """A pod of the Deployment ``web`` (ReplicaSet ``rs``)."""
    return pod(name, namespace, annotations, owner=("ReplicaSet", rs), labels={"pod-template-hash": template_hash})
