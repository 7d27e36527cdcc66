"""ipam check's API server part, run by flockctl itself (the agent is never asked to reach out).

Lists every Pod and every NodeConfig once and compares them with this
node's allocations (from the agent): allocations whose pod is gone, podIPs
on this node that flock does not hold, addresses claimed on two nodes and
NodeConfigs whose blocks overlap this node's.  When the API server cannot be
reached the caller reports the part as not checked; local parts stand.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import trio

from flock.model import InvalidObject, NodeConfig

from ._ops import problem

API_DEADLINE_S = 15.0


class ApiUnreachable(Exception):
    pass


async def read_cluster(kubeconfig: Path | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pods, nodeconfig objects) as plain dicts; raises :class:`ApiUnreachable`."""
    from flock.watchers import ClientConfigError
    from flock.watchers._client import open_kube_client

    try:
        with trio.fail_after(API_DEADLINE_S):
            async with open_kube_client(kubeconfig) as client:
                return await client.list_plain()
    except trio.TooSlowError:
        raise ApiUnreachable(f"no answer within {API_DEADLINE_S:g} s") from None
    except ClientConfigError as exc:
        raise ApiUnreachable(str(exc)) from None
    except Exception as exc:  # aiohttp, ApiException, kubeconfig parsing: all mean "not reached"
        raise ApiUnreachable(f"{type(exc).__name__}: {str(exc)[:300]}") from None


def _pod_ips(pod: dict[str, Any]) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    out: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    status = pod.get("status") or {}
    raw = [p.get("ip") for p in status.get("podIPs") or [] if isinstance(p, dict)] or [status.get("podIP")]
    for ip in raw:
        try:
            out.append(ipaddress.ip_address(str(ip)))
        except (TypeError, ValueError):
            continue
    return out


def cross_check(
    node: str,
    nodeconfig: dict[str, Any] | None,
    allocations: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    configs: list[dict[str, Any]],
) -> tuple[list[dict[str, str]], dict[str, int]]:
    """Problems between this node's allocations and the cluster's objects (pure)."""
    problems: list[dict[str, str]] = []
    blocks = []
    if nodeconfig is not None:
        blocks = [ipaddress.ip_network(c) for c in (nodeconfig.get("cidr6"), nodeconfig.get("cidr4")) if c]
    held: dict[str, dict[str, Any]] = {}
    for a in allocations:
        for addr in a["addresses"]:
            held[addr] = a
    by_key: dict[tuple[str, str], dict[str, Any]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        by_key[(meta.get("namespace", ""), meta.get("name", ""))] = pod
    for a in allocations:
        if not a["namespace"] or not a["pod"]:
            continue  # a runtime attachment without a Kubernetes pod (its name, if any, is only a label)
        found = by_key.get((a["namespace"], a["pod"]))
        pod = found or {}
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        if found is None:
            why = "does not exist on the API server"
        elif spec.get("nodeName") != node:
            why = f"is on node {spec.get('nodeName')!r} now"
        elif a["pod_uid"] and meta.get("uid") and meta.get("uid") != a["pod_uid"]:
            why = f"is a newer pod (uid {meta.get('uid')}, the allocation's is {a['pod_uid']})"
        else:
            continue
        live = " (its network namespace still exists: the runtime still has the sandbox)" if a["netns_alive"] else ""
        problems.append(
            problem(
                "allocation-without-pod",
                a["container_id"],
                f"pod {a['namespace']}/{a['pod']} {why}{live}; it holds {', '.join(a['addresses'])}",
                f"flockctl ipam release {a['container_id']}" + (" --force" if live else ""),
            )
        )
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if spec.get("hostNetwork") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        for ip in _pod_ips(pod):
            holder = held.get(str(ip))
            if spec.get("nodeName") == node:
                if holder is None and any(ip.version == b.version and ip in b for b in blocks):
                    problems.append(
                        problem(
                            "pod-ip-not-allocated",
                            str(ip),
                            f"pod {name} on this node reports {ip}, which flock does not hold here",
                            "the address may be handed to another pod: recreate the pod",
                        )
                    )
            elif holder is not None:
                problems.append(
                    problem(
                        "address-on-two-nodes",
                        str(ip),
                        f"held here by {holder['container_id']} (pod {holder['namespace']}/{holder['pod'] or '-'}) "
                        f"and reported by pod {name} on node {spec.get('nodeName')!r}",
                        f"release the copy whose pod is gone: flockctl ipam release {holder['container_id']} "
                        "(--force if its pod is live here), or fix the other node",
                    )
                )
    for obj in configs:
        try:
            other = NodeConfig.from_object(obj)
        except InvalidObject:
            continue
        if other.name == node:
            continue
        for block in blocks:
            for theirs in (other.cidr6, other.cidr4):
                if theirs is not None and theirs.version == block.version and theirs.overlaps(block):
                    problems.append(
                        problem(
                            "overlapping-block",
                            str(block),
                            f"NodeConfig {other.name} has {theirs}, which overlaps this node's {block}",
                            "give every node a disjoint block (kubectl edit nodeconfig)",
                        )
                    )
    return problems, {"api_pods": len(pods), "api_nodeconfigs": len(configs)}
