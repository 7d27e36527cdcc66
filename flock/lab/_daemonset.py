"""deploy/daemonset.yaml as container runs: what a kubelet would start on one node.

:func:`pod_runs` is a pure function of the DaemonSet object and a
:class:`NodeMapping` (the node's name and where each of the manifest's
``hostPath`` and ``configMap`` volumes lives on this machine).  It returns the
init containers and then the containers, each a :class:`ContainerRun` with the
command and args (``$(VAR)`` expanded as the kubelet does), the environment
(downward-API ``fieldRef`` resolved for the node), the mounts, the
securityContext and the probes.  :func:`podman_argv` turns one into a
``podman run`` command line.

Error handling: anything in the manifest the lab cannot reproduce faithfully
(a volume type it does not know, a ``hostPath`` it has no place for, a
``fieldRef`` it cannot resolve, a pod without host networking) raises
:class:`ManifestError` naming the field, so a manifest change is never
silently ignored by the lab that tests it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

# Kubernetes resource quantities the lab maps onto podman's limits.
_MEMORY_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9}
_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class ManifestError(ValueError):
    """The DaemonSet asks for something the lab cannot run as a kubelet would; names the field."""


@attrs.frozen
class NodeMapping:
    """Where one node's DaemonSet volumes are on this machine."""

    node_name: str
    host_paths: Mapping[str, Path]  # hostPath.path in the manifest → directory here
    config_maps: Mapping[str, Path]  # ConfigMap name → directory holding its keys as files
    namespace: str = "kube-system"
    host_ip: str = ""


@attrs.frozen
class Mount:
    source: Path
    target: str
    read_only: bool = False
    propagation: str | None = None  # podman's name: rslave for HostToContainer, rshared for Bidirectional
    create: bool = False  # hostPath type DirectoryOrCreate: the kubelet makes the directory


@attrs.frozen
class HttpGet:
    host: str
    port: int
    path: str


@attrs.frozen
class Exec:
    command: tuple[str, ...]


@attrs.frozen
class Probe:
    action: HttpGet | Exec
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    failure_threshold: int = 3
    success_threshold: int = 1

    @classmethod
    def from_object(cls, obj: Mapping[str, Any], where: str) -> Probe:
        action: HttpGet | Exec
        if "httpGet" in obj:
            get = obj["httpGet"]
            if not isinstance(get.get("port"), int):
                raise ManifestError(f"{where}.httpGet.port: the lab needs a port number, got {get.get('port')!r}")
            if get.get("scheme", "HTTP") != "HTTP":
                raise ManifestError(f"{where}.httpGet.scheme: only HTTP, got {get.get('scheme')!r}")
            action = HttpGet(get.get("host", "127.0.0.1"), get["port"], get.get("path", "/"))
        elif "exec" in obj:
            action = Exec(tuple(obj["exec"]["command"]))
        else:
            raise ManifestError(f"{where}: only httpGet and exec probes, got {sorted(obj)}")
        return cls(
            action,
            float(obj.get("initialDelaySeconds", 0)),
            float(obj.get("periodSeconds", 10)),
            float(obj.get("timeoutSeconds", 1)),
            int(obj.get("failureThreshold", 3)),
            int(obj.get("successThreshold", 1)),
        )


@attrs.frozen
class ContainerRun:
    """One container of the pod as the kubelet would start it on the node."""

    name: str
    image: str
    init: bool
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    mounts: tuple[Mount, ...]
    privileged: bool = False
    cap_add: tuple[str, ...] = ()
    cap_drop: tuple[str, ...] = ()
    read_only_root: bool = False
    run_as_user: int | None = None
    no_new_privileges: bool = False
    liveness: Probe | None = None
    readiness: Probe | None = None
    memory_limit: int | None = None  # bytes
    cpu_limit: float | None = None  # cores
    pre_stop: Exec | None = None  # lifecycle.preStop: run in the container before it is stopped


def expand(text: str, env: Mapping[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion: defined variables are replaced, ``$$`` is a
    literal ``$``, and a reference to an undefined variable stays as written."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(one, text)


def memory_bytes(quantity: str) -> int:
    for suffix, factor in _MEMORY_UNITS.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(quantity)


def cpu_cores(quantity: str | int | float) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _field(obj: Mapping[str, Any], path: str, where: str) -> Any:
    value: Any = obj
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            raise ManifestError(f"{where}: missing {key!r}")
        value = value[key]
    return value


def _env(container: Mapping[str, Any], node: NodeMapping, pod_name: str, where: str) -> dict[str, str]:
    fields = {
        "spec.nodeName": node.node_name,
        "metadata.name": pod_name,
        "metadata.namespace": node.namespace,
        "spec.serviceAccountName": "",
        "status.hostIP": node.host_ip,
        "status.podIP": node.host_ip,  # hostNetwork: the pod's IP is the node's
    }
    env: dict[str, str] = {}
    for i, var in enumerate(container.get("env", [])):
        here = f"{where}.env[{i}]"
        if "value" in var:
            env[var["name"]] = expand(str(var["value"]), env)
        elif "valueFrom" in var and "fieldRef" in var["valueFrom"]:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            if path not in fields or (path == "status.hostIP" and not node.host_ip):
                raise ManifestError(f"{here}.valueFrom.fieldRef.fieldPath: the lab cannot resolve {path!r}")
            env[var["name"]] = fields[path]
        else:
            raise ManifestError(f"{here}: only value and valueFrom.fieldRef, got {sorted(var)}")
    return env


_HOST_PATH_TYPES = {"": False, "Directory": False, "DirectoryOrCreate": True}


def _volume_sources(pod: Mapping[str, Any], node: NodeMapping) -> dict[str, tuple[Path, bool]]:
    """Volume name → (directory here, whether the kubelet would create it)."""
    sources: dict[str, tuple[Path, bool]] = {}
    for i, vol in enumerate(pod.get("volumes", [])):
        where = f"spec.template.spec.volumes[{i}] ({vol.get('name')})"
        if "hostPath" in vol:
            path, kind = vol["hostPath"]["path"], vol["hostPath"].get("type", "")
            if path not in node.host_paths:
                raise ManifestError(f"{where}.hostPath.path: the lab has no place for {path!r}")
            if kind not in _HOST_PATH_TYPES:
                raise ManifestError(f"{where}.hostPath.type: the lab knows directories only, got {kind!r}")
            sources[vol["name"]] = (node.host_paths[path], _HOST_PATH_TYPES[kind])
        elif "configMap" in vol:
            name = vol["configMap"]["name"]
            if name not in node.config_maps:
                raise ManifestError(f"{where}.configMap.name: the lab has no ConfigMap {name!r}")
            sources[vol["name"]] = (node.config_maps[name], False)
        else:
            raise ManifestError(f"{where}: only hostPath and configMap volumes, got {sorted(vol)}")
    return sources


_PROPAGATION = {None: None, "None": None, "HostToContainer": "rslave", "Bidirectional": "rshared"}


def _container(
    c: Mapping[str, Any],
    init: bool,
    sources: Mapping[str, tuple[Path, bool]],
    node: NodeMapping,
    pod_name: str,
    where: str,
) -> ContainerRun:
    env = _env(c, node, pod_name, where)
    if "command" not in c:
        raise ManifestError(f"{where}.command: the lab needs the command (the image's entrypoint is not used)")
    argv = tuple(expand(str(a), env) for a in [*c["command"], *c.get("args", [])])
    mounts = []
    for i, m in enumerate(c.get("volumeMounts", [])):
        if m["name"] not in sources:
            raise ManifestError(f"{where}.volumeMounts[{i}].name: no volume {m['name']!r}")
        if m.get("mountPropagation") not in _PROPAGATION:
            raise ManifestError(f"{where}.volumeMounts[{i}].mountPropagation: {m.get('mountPropagation')!r}")
        mounts.append(
            Mount(
                sources[m["name"]][0],
                m["mountPath"],
                bool(m.get("readOnly", False)),
                _PROPAGATION[m.get("mountPropagation")],
                sources[m["name"]][1],
            )
        )
    pre_stop = None
    for hook, handler in c.get("lifecycle", {}).items():
        if hook != "preStop" or "exec" not in handler:
            raise ManifestError(f"{where}.lifecycle.{hook}: the lab runs exec preStop hooks only")
        pre_stop = Exec(tuple(handler["exec"]["command"]))
    sc = c.get("securityContext", {})
    caps = sc.get("capabilities", {})
    limits = c.get("resources", {}).get("limits", {})
    return ContainerRun(
        name=c["name"],
        image=c["image"],
        init=init,
        argv=argv,
        env=tuple(env.items()),
        mounts=tuple(mounts),
        privileged=bool(sc.get("privileged", False)),
        cap_add=tuple(caps.get("add", ())),
        cap_drop=tuple(caps.get("drop", ())),
        read_only_root=bool(sc.get("readOnlyRootFilesystem", False)),
        run_as_user=sc.get("runAsUser"),
        no_new_privileges=sc.get("allowPrivilegeEscalation") is False,
        liveness=Probe.from_object(c["livenessProbe"], f"{where}.livenessProbe") if "livenessProbe" in c else None,
        readiness=Probe.from_object(c["readinessProbe"], f"{where}.readinessProbe") if "readinessProbe" in c else None,
        memory_limit=memory_bytes(str(limits["memory"])) if "memory" in limits else None,
        cpu_limit=cpu_cores(limits["cpu"]) if "cpu" in limits else None,
        pre_stop=pre_stop,
    )


def find_daemonset(documents: Sequence[Mapping[str, Any] | None]) -> Mapping[str, Any]:
    found = [d for d in documents if d and d.get("kind") == "DaemonSet"]
    if len(found) != 1:
        raise ManifestError(f"expected one DaemonSet, found {len(found)}")
    return found[0]


def termination_grace(daemonset: Mapping[str, Any]) -> float:
    """The pod's terminationGracePeriodSeconds (the kubelet's default, 30, when unset): how long its
    preStop hooks and SIGTERM have before SIGKILL when the pod is deleted (a rolling update)."""
    value = _field(daemonset, "spec.template.spec", "DaemonSet").get("terminationGracePeriodSeconds", 30)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ManifestError(f"spec.template.spec.terminationGracePeriodSeconds: a number of seconds, got {value!r}")
    return float(value)


def pod_runs(daemonset: Mapping[str, Any], node: NodeMapping) -> list[ContainerRun]:
    """The DaemonSet's init containers, then its containers, as started on *node*."""
    pod = _field(daemonset, "spec.template.spec", "DaemonSet")
    if pod.get("hostNetwork") is not True:
        raise ManifestError(
            "spec.template.spec.hostNetwork: the lab runs the pod in the node's namespace; expected true"
        )
    pod_name = f"{daemonset['metadata']['name']}-{node.node_name}"
    sources = _volume_sources(pod, node)
    runs = []
    for kind, init in (("initContainers", True), ("containers", False)):
        for i, c in enumerate(pod.get(kind, [])):
            runs.append(
                _container(c, init, sources, node, pod_name, f"spec.template.spec.{kind}[{i}] ({c.get('name')})")
            )
    return runs


def podman_argv(run: ContainerRun, *, name: str, image: str, netns: str) -> list[str]:
    """``podman run`` arguments (after ``podman [global options]``) for *run*, in the
    network namespace file *netns*; in the foreground, removed when it exits."""
    argv = ["run", "--rm", "--replace", "--name", name, "--network", f"ns:{netns}", "--pull", "never"]
    argv += ["--log-driver", "none", "--init=false", "--stop-timeout", "10"]
    if run.privileged:
        argv.append("--privileged")
    for cap in run.cap_drop:
        argv += ["--cap-drop", cap]
    for cap in run.cap_add:
        argv += ["--cap-add", cap]
    if run.read_only_root:
        # A kubelet adds no tmpfs: what the container writes goes to its volumes.
        argv += ["--read-only", "--read-only-tmpfs=false"]
    if run.run_as_user is not None:
        argv += ["--user", str(run.run_as_user)]
    if run.no_new_privileges:
        argv += ["--security-opt", "no-new-privileges"]
    if run.memory_limit is not None:
        argv += ["--memory", str(run.memory_limit)]
    if run.cpu_limit is not None:
        argv += ["--cpus", f"{run.cpu_limit:g}"]
    for key, value in run.env:
        argv += ["--env", f"{key}={value}"]
    for m in run.mounts:
        opts = ["ro" if m.read_only else "rw"]
        if m.propagation:
            opts.append(m.propagation)
        argv += ["--volume", f"{m.source}:{m.target}:{','.join(opts)}"]
    argv += ["--entrypoint", run.argv[0], image, *run.argv[1:]]
    return argv
