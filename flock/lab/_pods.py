"""Pods in the lab: the Pod object, a network namespace, and the installed shim
executed as a runtime executes it.  The result is cached (``pods/<ns>_<name>.json``)
for CHECK and DEL, as libcni caches it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from flock.lab._api import ApiError
from flock.lab._lifecycle import api_client
from flock.lab._nsio import netns_path
from flock.lab._plan import LabPlan, NodePlan
from flock.lab._runtime import CniParams, PluginOutcome, exec_conflist, load_conflist
from flock.lab._state import LabError
from flock.model import ANNOTATION_PREFIX
from flock.testing import PODS, pod_object

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")


@attrs.frozen
class LabPod:
    namespace: str
    name: str
    node: str
    uid: str
    container_id: str
    netns: str  # namespace name under /run/netns
    annotations: Mapping[str, str] = attrs.field(hash=False)
    result: Mapping[str, Any] = attrs.field(hash=False)  # the CNI result of ADD
    if_name: str = "eth0"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def cni_params(self) -> CniParams:
        return CniParams.for_pod(
            self.container_id, netns_path(self.netns), self.namespace, self.name, self.uid, self.if_name
        )

    def addresses(self, version: int) -> list[str]:
        """The pod's own addresses of one IP version, from the CNI result, in order."""
        out = []
        for ip in self.result.get("ips", []):
            addr = ip["address"].split("/")[0]
            if (":" in addr) == (version == 6):
                out.append(addr)
        return out

    @property
    def anycast(self) -> list[str]:
        raw = self.annotations.get(ANNOTATION_PREFIX + "anycast", "")
        return [a.strip() for a in raw.split(",") if a.strip()]

    def to_json(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "annotations": dict(self.annotations), "result": dict(self.result)}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> LabPod:
        return cls(**obj)


def parse_pod_key(key: str) -> tuple[str, str]:
    namespace, sep, name = key.partition("/")
    if not sep or not _DNS_LABEL.match(namespace) or not _POD_NAME.match(name):
        raise LabError(
            f"pod {key!r}: expected NAMESPACE/NAME in lowercase letters, digits and '-' (e.g. default/web-1)"
        )
    return namespace, name


def parse_annotations(pairs: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` pairs; a KEY without a '/' gets flock's prefix (``ipv4=true``)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise LabError(f"--annotation {pair!r}: expected KEY=VALUE")
        out[key if "/" in key else ANNOTATION_PREFIX + key] = value
    return out


def _cache_path(plan: LabPlan, namespace: str, name: str) -> Path:
    return plan.pods_dir / f"{namespace}_{name}.json"


def load_pods(plan: LabPlan) -> list[LabPod]:
    if not plan.pods_dir.exists():
        return []
    return sorted(
        (LabPod.from_json(json.loads(p.read_text())) for p in plan.pods_dir.glob("*.json")),
        key=lambda p: (p.node, p.namespace, p.name),
    )


def load_pod(plan: LabPlan, key: str) -> LabPod:
    namespace, name = parse_pod_key(key)
    try:
        return LabPod.from_json(json.loads(_cache_path(plan, namespace, name).read_text()))
    except FileNotFoundError:
        raise LabError(f"no pod {key} in this lab (see `flock-lab status`)") from None


def _save(plan: LabPlan, pod: LabPod) -> None:
    path = _cache_path(plan, pod.namespace, pod.name)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(pod.to_json(), indent=1) + "\n")
    os.replace(tmp, path)


def _pod_netns(plan: LabPlan, namespace: str, name: str) -> str:
    return plan.pod_netns_prefix + hashlib.sha1(f"{namespace}/{name}".encode()).hexdigest()[:8]


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise LabError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def _make_netns(name: str) -> None:
    _ip("netns", "add", name)
    _ip("-n", name, "link", "set", "lo", "up")


def _delete_netns(name: str) -> None:
    if os.path.exists(netns_path(name)):
        _ip("netns", "del", name)


class CniFailure(LabError):
    """The plugin answered a CNI error; ``error`` is its error object."""

    def __init__(self, op: str, key: str, outcome: PluginOutcome) -> None:
        try:
            self.error = outcome.json
        except ValueError:
            self.error = {"code": None, "msg": "plugin printed no JSON", "details": outcome.stdout + outcome.stderr}
        super().__init__(
            f"{op} {key}: CNI error {self.error.get('code')}: {self.error.get('msg')} ({self.error.get('details', '')})"
        )


async def _call(
    plan: LabPlan, node: NodePlan, command: str, att: CniParams, prev: Mapping[str, Any] | None
) -> PluginOutcome:
    conflist = load_conflist(node.cni_conf)
    return await exec_conflist(node.netns, str(node.cni_bin), conflist, command, att, prev)


async def pod_add(
    plan: LabPlan,
    node_name: str,
    key: str,
    annotations: Mapping[str, str] | None = None,
    image: str = "registry.example/app:1",
    owner: str | None = None,
) -> LabPod:
    """Create the Pod, its namespace, and ADD it through the node's installed shim.

    A failed ADD is undone as a runtime undoes it (DEL, namespace and Pod
    removed) and raises :class:`CniFailure` with the plugin's error."""
    namespace, name = parse_pod_key(key)
    try:
        node = plan.node(node_name)
    except KeyError:
        raise LabError(f"no node {node_name!r} in this lab: {', '.join(n.name for n in plan.nodes)}") from None
    if _cache_path(plan, namespace, name).exists():
        raise LabError(f"pod {key} exists already (flock-lab pod del {key} first)")
    annotations = dict(annotations or {})
    obj = pod_object(namespace, name, node.name, annotations=annotations, image=image, labels={"app": name})
    if owner is not None:
        kind, sep, owner_name = owner.partition("/")
        if not sep or not kind or not owner_name:
            raise LabError(f"--owner {owner!r}: expected KIND/NAME, e.g. ReplicaSet/web-7d9f8c6b5")
        obj["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": kind,
                "name": owner_name,
                "uid": secrets.token_hex(16),
                "controller": True,
            }
        ]
    api = api_client(plan)
    created = await api.create(PODS, obj)
    netns = _pod_netns(plan, namespace, name)
    pod = LabPod(namespace, name, node.name, created["metadata"]["uid"], secrets.token_hex(32), netns, annotations, {})
    try:
        await trio.to_thread.run_sync(_make_netns, netns)
        outcome = await _call(plan, node, "ADD", pod.cni_params, None)
        if not outcome.ok:
            raise CniFailure("ADD", key, outcome)
        pod = attrs.evolve(pod, result=outcome.json)
        _save(plan, pod)
    except BaseException:
        with trio.move_on_after(10, shield=True):
            await _call(plan, node, "DEL", pod.cni_params, None)
            await trio.to_thread.run_sync(_delete_netns, netns)
            try:
                await api.delete(PODS, name, namespace)
            except (ApiError, OSError):
                pass
        raise
    return pod


async def pod_check(plan: LabPlan, key: str) -> LabPod:
    """CHECK with the cached result as prevResult; CniFailure when the plugin disagrees."""
    pod = load_pod(plan, key)
    outcome = await _call(plan, plan.node(pod.node), "CHECK", pod.cni_params, pod.result)
    if not outcome.ok:
        raise CniFailure("CHECK", key, outcome)
    return pod


async def pod_del(plan: LabPlan, key: str) -> LabPod:
    """DEL with the cached result, then the namespace, the Pod object and the cache entry.
    A failed DEL raises CniFailure and keeps everything, so it can be retried."""
    pod = load_pod(plan, key)
    outcome = await _call(plan, plan.node(pod.node), "DEL", pod.cni_params, pod.result)
    if not outcome.ok:
        raise CniFailure("DEL", key, outcome)
    await trio.to_thread.run_sync(_delete_netns, pod.netns)
    try:
        await api_client(plan).delete(PODS, pod.name, pod.namespace)
    except ApiError as exc:
        if exc.status != 404:
            raise
    _cache_path(plan, pod.namespace, pod.name).unlink()
    return pod
