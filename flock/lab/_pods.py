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

from flock.apiserver import NAMESPACES, PODS, namespace_object, pod_object
from flock.lab._api import ApiError
from flock.lab._kubelet import LAB_GRACE_S, pod_status, terminating, with_readiness
from flock.lab._lifecycle import api_client
from flock.lab._nsio import netns_path
from flock.lab._plan import LabPlan, NodePlan
from flock.lab._podserver import start_server, stop_server
from flock.lab._ports import PortSpec
from flock.lab._procs import ProcRef
from flock.lab._runtime import CniParams, PluginOutcome, exec_conflist, load_conflist
from flock.lab._state import LabError
from flock.model import ANNOTATION_PREFIX

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_POD_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")
# How long `pod del` waits, beyond the grace, for another's teardown of the pod (the kubelet stand-in's).
FINISH_WAIT_S = 30.0


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
    labels: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    ports: tuple[PortSpec, ...] = ()  # declared containerPorts; TCP and UDP ones are served
    server: ProcRef | None = None  # the pod's port server (flock.lab._serve)

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

    @property
    def port_specs(self) -> tuple[PortSpec, ...]:
        return self.ports

    def to_json(self) -> dict[str, Any]:
        return {
            **attrs.asdict(self, recurse=False),
            "annotations": dict(self.annotations),
            "result": dict(self.result),
            "labels": dict(self.labels),
            "ports": [p.to_json() for p in self.ports],
            "server": None if self.server is None else attrs.asdict(self.server),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> LabPod:
        server = obj.get("server")
        return cls(
            **{
                **obj,
                "ports": tuple(PortSpec.from_json(p) for p in obj.get("ports", ())),
                "server": None if server is None else ProcRef(**server),
            }
        )


def parse_pod_key(key: str) -> tuple[str, str]:
    namespace, sep, name = key.partition("/")
    if not sep or not _DNS_LABEL.match(namespace) or not _POD_NAME.match(name):
        raise LabError(
            f"pod {key!r}: expected NAMESPACE/NAME in lowercase letters, digits and '-' (e.g. default/web-1)"
        )
    return namespace, name


def parse_labels(pairs: Sequence[str], option: str = "--label") -> dict[str, str]:
    """``KEY=VALUE`` pairs, as they are (the API server checks the syntax)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise LabError(f"{option} {pair!r}: expected KEY=VALUE")
        out[key] = value
    return out


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
    """The lab's pods, from their cache files (written whole by rename; one deleted while this reads —
    ``pod del`` beside a probe — is a pod that is gone, not an error)."""
    if not plan.pods_dir.exists():
        return []
    pods = []
    for path in plan.pods_dir.glob("*.json"):
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        pods.append(LabPod.from_json(json.loads(text)))
    return sorted(pods, key=lambda p: (p.node, p.namespace, p.name))


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


async def ensure_namespace(plan: LabPlan, namespace: str) -> None:
    """Create the Namespace (no labels of its own) unless it exists: ``pod add`` into a new namespace works."""
    api = api_client(plan)
    try:
        await api.get(NAMESPACES, namespace)
    except ApiError as exc:
        if exc.status != 404:
            raise
        try:
            await api.create(NAMESPACES, namespace_object(namespace))
        except ApiError as again:
            if again.status != 409:
                raise


async def pod_add(
    plan: LabPlan,
    node_name: str,
    key: str,
    annotations: Mapping[str, str] | None = None,
    image: str = "registry.example/app:1",
    owner: str | None = None,
    labels: Mapping[str, str] | None = None,
    ports: Sequence[PortSpec] = (),
) -> LabPod:
    """Create the Pod (and its Namespace if need be), its network namespace, ADD it
    through the node's installed shim, write its status, and start its port server.

    *labels* default to ``app=<name>``.  A pod that declares ports is dual-stack
    unless an ``ipv4`` annotation says otherwise, and serves each TCP and UDP port.
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
    if ports:
        annotations.setdefault(ANNOTATION_PREFIX + "ipv4", "true")
    labels = dict(labels) if labels else {"app": name}
    names = [p.name for p in ports if p.name]
    if len(set(names)) != len(names):
        raise LabError(f"pod {key}: port names must be unique, got {', '.join(names)}")
    obj = pod_object(
        namespace,
        name,
        node.name,
        annotations=annotations,
        image=image,
        labels=labels,
        ports=[p.container_port() for p in ports],
    )
    obj["spec"]["terminationGracePeriodSeconds"] = LAB_GRACE_S  # kubectl delete: gone in seconds
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
    await ensure_namespace(plan, namespace)
    created = await api.create(PODS, obj)
    netns = _pod_netns(plan, namespace, name)
    pod = LabPod(
        namespace,
        name,
        node.name,
        created["metadata"]["uid"],
        secrets.token_hex(32),
        netns,
        annotations,
        {},
        labels=created["metadata"].get("labels") or {},
        ports=tuple(ports),
    )
    try:
        await trio.to_thread.run_sync(_make_netns, netns)
        outcome = await _call(plan, node, "ADD", pod.cni_params, None)
        if not outcome.ok:
            raise CniFailure("ADD", key, outcome)
        pod = attrs.evolve(pod, result=outcome.json)
        _save(plan, pod)
        served = [p for p in ports if p.protocol in ("TCP", "UDP")]
        if served:
            ref = await start_server(netns, key, served, plan.pods_dir / f"{namespace}_{name}.serve")
            pod = attrs.evolve(pod, server=ref)
            _save(plan, pod)
        # Running and ready once it serves, as a kubelet reports a container whose readiness probe passed.
        status = pod_status(pod.addresses(6) + pod.addresses(4), node, pod.container_id, image, ready=True)
        await api.patch(PODS, name, {"status": status}, namespace, subresource="status")
    except BaseException:
        with trio.move_on_after(10, shield=True):
            if pod.server is not None:
                await stop_server(pod.server)
            await _call(plan, node, "DEL", pod.cni_params, None)
            await trio.to_thread.run_sync(_delete_netns, netns)
            try:
                await api.delete(PODS, name, namespace, grace_period_seconds=0)
            except (ApiError, OSError):
                pass
            _cache_path(plan, namespace, name).unlink(missing_ok=True)
        raise
    return pod


async def pod_label(plan: LabPlan, key: str, set_labels: Mapping[str, str], remove: Sequence[str]) -> LabPod:
    """Set and remove labels of the Pod (one merge patch); the lab's record follows."""
    pod = load_pod(plan, key)
    if not set_labels and not remove:
        raise LabError(f"pod label {key}: nothing to change (give KEY=VALUE pairs or --remove KEY)")
    patch: dict[str, Any] = {**{k: None for k in remove}, **dict(set_labels)}
    updated = await api_client(plan).patch(PODS, pod.name, {"metadata": {"labels": patch}}, pod.namespace)
    pod = attrs.evolve(pod, labels=updated["metadata"].get("labels") or {})
    _save(plan, pod)
    return pod


async def pod_check(plan: LabPlan, key: str) -> LabPod:
    """CHECK with the cached result as prevResult; CniFailure when the plugin disagrees."""
    pod = load_pod(plan, key)
    outcome = await _call(plan, plan.node(pod.node), "CHECK", pod.cni_params, pod.result)
    if not outcome.ok:
        raise CniFailure("CHECK", key, outcome)
    return pod


async def pod_ready(plan: LabPlan, key: str, ready: bool) -> dict[str, Any]:
    """Set the pod's readiness (its Ready and ContainersReady conditions, its container's
    ``ready``), as a readiness probe's verdict; returns the status written."""
    pod = load_pod(plan, key)
    api = api_client(plan)
    current = (await api.get(PODS, pod.name, pod.namespace)).get("status") or {}
    status = with_readiness(current, ready)
    await api.patch(PODS, pod.name, {"status": status}, pod.namespace, subresource="status")
    return status


async def pod_del(plan: LabPlan, key: str, grace: int = LAB_GRACE_S) -> LabPod:
    """Delete the pod as a kubelet sees it deleted: a graceful DELETE marks it (terminating), its
    server keeps answering for *grace* seconds, then :func:`finish_pod` tears it down and
    removes the Pod.  A failed DEL raises CniFailure and keeps the sandbox, so it can be retried.

    If the lab's kubelet stand-in is tearing it down already, waits for that to end."""
    pod = load_pod(plan, key)
    api = api_client(plan)
    with terminating(plan, pod.namespace, pod.name) as mine:
        marked: dict[str, Any] | None = None
        try:
            marked = await api.delete(PODS, pod.name, pod.namespace, grace_period_seconds=grace)
        except ApiError as exc:
            if exc.status != 404:
                raise
        if mine:
            if marked is not None and "deletionTimestamp" in marked["metadata"]:
                await trio.sleep(marked["metadata"].get("deletionGracePeriodSeconds") or 0)
            return await finish_pod(plan, pod)
    with trio.move_on_after(grace + FINISH_WAIT_S):
        # Another process's teardown: its files are all there is to watch.
        while _cache_path(plan, pod.namespace, pod.name).exists():  # noqa: ASYNC110
            await trio.sleep(0.05)
        return pod
    raise LabError(
        f"pod {key} is still being torn down after {grace + FINISH_WAIT_S:g} s; see the lab's controllers.log"
    )


async def finish_pod(plan: LabPlan, pod: LabPod) -> LabPod:
    """The end of a terminating pod: its server stopped, CNI DEL with the cached result, its network
    namespace gone, the lab's records removed, then the Pod deleted with grace 0 (a kubelet's last DELETE).
    A failed DEL raises CniFailure and keeps everything but the server, so it can be retried."""
    if pod.server is not None:
        await stop_server(pod.server)
    outcome = await _call(plan, plan.node(pod.node), "DEL", pod.cni_params, pod.result)
    if not outcome.ok:
        raise CniFailure("DEL", pod.key, outcome)
    await trio.to_thread.run_sync(_delete_netns, pod.netns)
    # The lab's records go before the Pod does, as a kubelet removes its containers first: whoever
    # waits for the Pod to be gone (kubectl delete) then finds nothing of it left.  A DELETE that fails
    # leaves a Pod the lab no longer holds, which the kubelet stand-in deletes with grace 0.
    _cache_path(plan, pod.namespace, pod.name).unlink(missing_ok=True)
    for leftover in plan.pods_dir.glob(f"{pod.namespace}_{pod.name}.serve*"):
        leftover.unlink()
    try:
        await api_client(plan).delete(PODS, pod.name, pod.namespace, grace_period_seconds=0)
    except ApiError as exc:
        if exc.status != 404:
            raise
    return pod
