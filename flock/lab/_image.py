"""The image lab: every node runs the DaemonSet's pod from the image under podman.

``flock-lab up --image REF`` reads ``deploy/`` (the resources of its
kustomization: the DaemonSet and its ConfigMaps), turns the pod into
container runs for each node (:mod:`flock.lab._daemonset`), and runs them as
a kubelet would, with Debian's podman and runc:

* the init containers in order, each to completion (a failure stops ``up``
  with the container's output, as ``Init:Error`` would);
* the containers under the lab's keeper, in the node's network namespace
  (``--network ns:/run/netns/<node>``: hostNetwork), restarted when they exit
  or fail their liveness probe, their readiness polled.

The hostPath volumes are the node's lab directories (see :func:`node_mapping`)
and the ConfigMaps are written to files.  The lab changes the pod in two ways
only, both visible in ``spec.json``: the image reference (``--image``, as
kustomize's ``images:`` would), and the agent's API server: the lab's API
server speaks plain HTTP, which in-cluster configuration (HTTPS with the
service account's CA) cannot reach, so the node's kubeconfig is mounted
read-only at ``/var/run/secrets/flock-lab/kubeconfig`` — where the service
account would be — and ``--kubeconfig`` (and ``--bgp-lab-timers``, as for the
process lab) are appended to the agent's args.

The manifests are ``deploy/`` of this source tree unless ``--manifest DIR``
names others, or ``--manifest-ref GITREF`` an earlier commit's (taken out of
git history: :mod:`flock.lab._releases`), so an earlier release runs as it was
deployed.  ``flock-lab upgrade`` (:mod:`flock.lab._upgrade`) later replaces
each node's pod with another image's and manifest's, as a rolling update does.

Podman runs with the lab's own storage (``<lab>/podman``) and the image
build's storage as a read-only additional image store, so the lab never
touches the host's global store and ``down`` removes everything it made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio
import yaml

from flock.lab._daemonset import (
    ContainerRun,
    Exec,
    Mount,
    NodeMapping,
    Probe,
    find_daemonset,
    pod_runs,
    podman_argv,
    termination_grace,
)
from flock.lab._nsio import NETNS_DIR, netns_path
from flock.lab._plan import AGENT_NAMESPACE, LabPlan, NodePlan
from flock.lab._releases import deploy_from_git
from flock.lab._state import LabError
from flock.lab.keeper import ProbeSpec, ProcessSpec

DEFAULT_IMAGE_DIR = Path(os.environ.get("FLOCK_IMAGE_DIR", "/var/cache/flock-image"))
PODMAN_DIR = "podman"
CONFIGMAP_DIR = "configmaps"
LAB_KUBECONFIG = "/var/run/secrets/flock-lab/kubeconfig"
AGENT = "flock-agent"
INIT_DEADLINE_S = 120.0
# The keeper's process names the rest of the lab (status, readiness) knows.
PROCESS_NAMES = {"flock-agent": "agent", "bird": "bird"}


def default_deploy_dir() -> Path:
    """deploy/ of the source tree this flock runs from (an editable install)."""
    return Path(__file__).resolve().parents[2] / "deploy"


@attrs.frozen
class ImageSettings:
    image: str
    image_dir: Path = DEFAULT_IMAGE_DIR
    deploy_dir: Path = attrs.field(factory=default_deploy_dir)

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "image_dir": str(self.image_dir), "deploy_dir": str(self.deploy_dir)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ImageSettings:
        return cls(obj["image"], Path(obj["image_dir"]), Path(obj["deploy_dir"]))


def load_manifests(deploy_dir: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl apply -k deploy_dir`` would apply."""
    try:
        (kustomization,) = [d for d in yaml.safe_load_all((deploy_dir / "kustomization.yaml").read_text()) if d]
        docs = []
        for name in kustomization["resources"]:
            docs += [d for d in yaml.safe_load_all((deploy_dir / name).read_text()) if d]
    except (OSError, ValueError, KeyError) as exc:
        raise LabError(f"cannot read the manifests in {deploy_dir}: {exc} (pass --manifest)") from None
    return docs


def podman_env(plan: LabPlan) -> dict[str, str]:
    d = plan.dir / PODMAN_DIR
    return {
        "CONTAINERS_CONF": str(d / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(d / "storage.conf"),
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }


def write_podman_config(plan: LabPlan, settings: ImageSettings) -> None:
    """The lab's own storage; the build's as a read-only image store (see scripts/build-image)."""
    d = plan.dir / PODMAN_DIR
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = settings.image_dir / "storage"
    if not store.is_dir():
        raise LabError(f"no image storage at {store}: run scripts/build-image (or pass --image-dir)")
    (d / "storage.conf").write_text(
        "[storage]\n"
        'driver = "overlay"\n'
        f'graphroot = "{d / "storage"}"\n'
        f'runroot = "{d / "run"}"\n'
        "[storage.options]\n"
        f'additionalimagestores = ["{store}"]\n'
    )
    # runc (crun refuses hybrid cgroups), cgroupfs (no systemd), rlimits this root may set.
    (d / "containers.conf").write_text(
        "[containers]\n"
        'default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        f'tmp_dir = "{d / "tmp"}"\n'
    )


def node_mapping(plan: LabPlan, node: NodePlan) -> NodeMapping:
    """The DaemonSet's hostPaths on this node: its lab directories.  The host's
    root (the installer looks for python3 there), /var/run/netns and
    /proc/sys/net (which shows whichever namespace the opener is in) are the
    machine's own, as they are for every node of the lab."""
    return NodeMapping(
        node_name=node.name,
        host_paths={
            "/opt/cni/bin": node.cni_bin,
            "/etc/cni/net.d": node.cni_conf,
            "/": Path("/"),
            "/run/flock": node.socket.parent,
            "/var/lib/flock": node.state_dir,
            "/var/run/netns": Path(NETNS_DIR),
            "/etc/flock/bird": bird_dir(node),
            "/proc/sys/net": Path("/proc/sys/net"),
        },
        config_maps={},  # filled by lab_runs from the manifests
        namespace=AGENT_NAMESPACE,  # where the lab's BGP password Secret is
        host_ip=str(node.addr6),
    )


def bird_dir(node: NodePlan) -> Path:
    return node.dir / "bird"


def write_config_maps(plan: LabPlan, docs: Sequence[Mapping[str, Any]]) -> dict[str, Path]:
    out = {}
    for doc in docs:
        if doc.get("kind") == "ConfigMap":
            name = doc["metadata"]["name"]
            d = plan.dir / CONFIGMAP_DIR / name
            d.mkdir(parents=True, exist_ok=True)
            for key, value in doc.get("data", {}).items():
                (d / key).write_text(value)
            out[name] = d
    return out


def host_path_args(run: ContainerRun, mapping: NodeMapping) -> ContainerRun:
    """The installer's ``--socket`` is where the shim finds the agent *on the host*
    (it goes into the conflist): a host path, moved like the hostPaths."""
    if run.argv[0] != "flock-install-cni":
        return run
    argv = []
    for arg in run.argv:
        if arg.startswith("--socket="):
            value = arg.partition("=")[2]
            for host, here in sorted(mapping.host_paths.items(), key=lambda kv: -len(kv[0])):
                if host != "/" and (value == host or value.startswith(host + "/")):
                    value = str(here) + value[len(host) :]
                    break
            arg = f"--socket={value}"
        argv.append(arg)
    return attrs.evolve(run, argv=tuple(argv))


def lab_overrides(run: ContainerRun, node: NodePlan) -> ContainerRun:
    """The agent reaches the lab's API server through the node's kubeconfig (see the module doc)."""
    if run.argv[0] != AGENT:
        return run
    return attrs.evolve(
        run,
        argv=(*run.argv, f"--kubeconfig={LAB_KUBECONFIG}", "--bgp-lab-timers"),
        mounts=(*run.mounts, Mount(node.kubeconfig, LAB_KUBECONFIG, read_only=True)),
    )


def lab_runs(
    plan: LabPlan, node: NodePlan, docs: Sequence[Mapping[str, Any]], config_maps: Mapping[str, Path]
) -> list[ContainerRun]:
    mapping = attrs.evolve(node_mapping(plan, node), config_maps=dict(config_maps))
    try:
        runs = pod_runs(find_daemonset(docs), mapping)
    except ValueError as exc:
        raise LabError(f"deploy/daemonset.yaml: {exc}") from None
    return [lab_overrides(host_path_args(r, mapping), node) for r in runs]


def container_name(plan: LabPlan, node: NodePlan, run: ContainerRun) -> str:
    return f"flab-{plan.id}-{node.name}-{run.name}"


def podman_command(plan: LabPlan, node: NodePlan, run: ContainerRun, image: str) -> list[str]:
    for m in run.mounts:
        if m.create:
            m.source.mkdir(parents=True, exist_ok=True)
    return [
        "podman",
        *podman_argv(run, name=container_name(plan, node, run), image=image, netns=netns_path(node.netns)),
    ]


def probe_spec(probe: Probe | None, plan: LabPlan, node: NodePlan, run: ContainerRun) -> ProbeSpec | None:
    if probe is None:
        return None
    action = probe.action
    if isinstance(action, Exec):
        argv: tuple[str, ...] | None = ("podman", "exec", container_name(plan, node, run), *action.command)
        http = None
    else:
        argv, http = None, (node.netns, action.host, action.port, action.path)
    return ProbeSpec(
        http=http,
        argv=argv,
        initial_delay=probe.initial_delay,
        period=probe.period,
        timeout=probe.timeout,
        failure_threshold=probe.failure_threshold,
        success_threshold=probe.success_threshold,
        # `podman exec` finds the container only in the lab's own storage.
        env=None if argv is None else podman_env(plan),
    )


def process_name(node: NodePlan, run: ContainerRun) -> str:
    return f"{PROCESS_NAMES.get(run.name, run.name)}-{node.name}"


def container_specs(
    plan: LabPlan,
    settings: ImageSettings,
    docs: Sequence[Mapping[str, Any]],
    nodes: Sequence[NodePlan] | None = None,
) -> tuple[list[ProcessSpec], list[tuple[NodePlan, ContainerRun]]]:
    """The keeper's specs for the containers of every node's pod (or of *nodes*'), and the init
    containers to run first.  The manifests' ConfigMaps are written (again) first."""
    config_maps = write_config_maps(plan, docs)
    try:
        grace = termination_grace(find_daemonset(docs))
    except ValueError as exc:
        raise LabError(f"deploy/daemonset.yaml: {exc}") from None
    env = podman_env(plan)
    specs, inits = [], []
    for node in plan.nodes if nodes is None else nodes:
        bird_dir(node).mkdir(parents=True, exist_ok=True)
        for run in lab_runs(plan, node, docs, config_maps):
            if run.init:
                inits.append((node, run))
                continue
            specs.append(
                ProcessSpec(
                    process_name(node, run),
                    tuple(podman_command(plan, node, run, settings.image)),
                    node.dir / f"{PROCESS_NAMES.get(run.name, run.name)}.log",
                    env,
                    probe_spec(run.liveness, plan, node, run),
                    probe_spec(run.readiness, plan, node, run),
                    None
                    if run.pre_stop is None
                    else ("podman", "exec", container_name(plan, node, run), *run.pre_stop.command),
                    grace,
                )
            )
    return specs, inits


def pod_container_prefix(plan: LabPlan, node: NodePlan) -> str:
    """What the name of every container of *node*'s pod starts with (see :func:`container_name`)."""
    return f"flab-{plan.id}-{node.name}-"


def is_pod_container(spec: ProcessSpec, plan: LabPlan, node: NodePlan) -> bool:
    """Whether the keeper's *spec* runs a container of *node*'s pod."""
    argv = list(spec.argv)
    if argv[:2] != ["podman", "run"] or "--name" not in argv:
        return False
    return argv[argv.index("--name") + 1].startswith(pod_container_prefix(plan, node))


async def check_image(plan: LabPlan, settings: ImageSettings) -> None:
    proc = await trio.run_process(
        ["podman", "image", "exists", settings.image], env=podman_env(plan), capture_stderr=True, check=False
    )
    if proc.returncode != 0:
        raise LabError(
            f"image {settings.image} is not in {settings.image_dir}/storage: build it with "
            f"scripts/build-image --tag {settings.image} --dir {settings.image_dir}"
        )


async def run_init_containers(
    plan: LabPlan, settings: ImageSettings, inits: Sequence[tuple[NodePlan, ContainerRun]]
) -> None:
    """Each init container to completion, in order, node after node."""

    async def one_node(node: NodePlan, runs: list[ContainerRun]) -> None:
        for run in runs:
            log = node.dir / f"init-{run.name}.log"
            with trio.move_on_after(INIT_DEADLINE_S):
                with open(log, "ab") as out:  # noqa: ASYNC230 (a local file, before the container starts)
                    proc = await trio.run_process(
                        podman_command(plan, node, run, settings.image),
                        env=podman_env(plan),
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=out,
                        check=False,
                    )
                if proc.returncode == 0:
                    continue
                tail = log.read_text(errors="replace")[-2000:]
                raise LabError(
                    f"init container {run.name} on {node.name} exited {proc.returncode} (Init:Error): {tail}"
                )
            raise LabError(
                f"init container {run.name} on {node.name} did not finish in {INIT_DEADLINE_S:g} s; see {log}"
            )

    for node in plan.nodes:
        await one_node(node, [run for n, run in inits if n is node])


def remove_containers(directory: Path) -> int:
    """Remove every container of the lab's podman storage, then the storage (blocking)."""
    d = directory / PODMAN_DIR
    if not d.exists():
        return 0
    removed = 0
    env = {
        "CONTAINERS_CONF": str(d / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(d / "storage.conf"),
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    }
    if (d / "storage.conf").exists() and shutil.which("podman"):
        listed = subprocess.run(["podman", "ps", "-aq"], env=env, capture_output=True, text=True)
        removed = len(listed.stdout.split())
        if removed:
            subprocess.run(["podman", "rm", "--force", "--time", "5", "--all"], env=env, capture_output=True)
    # Whatever podman left mounted in its storage would keep the files busy.
    prefix = str(d) + "/"
    with open("/proc/self/mounts") as f:
        mounts = [line.split()[1] for line in f]
    for target in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", target], capture_output=True)
    shutil.rmtree(d, ignore_errors=True)
    return removed


def spec_summary(specs: Sequence[ProcessSpec]) -> str:
    return json.dumps([s.name for s in specs])


def add_image_arguments(parser: Any) -> None:
    parser.add_argument(
        "--image",
        metavar="REF",
        help="run every node's flock as the DaemonSet's pod from this image under podman (see scripts/build-image)",
    )
    parser.add_argument(
        "--image-dir",
        type=Path,
        default=DEFAULT_IMAGE_DIR,
        help="scripts/build-image's directory holding the image (default $FLOCK_IMAGE_DIR or %(default)s)",
    )
    add_manifest_arguments(parser)


def add_manifest_arguments(parser: Any) -> None:
    parser.add_argument(
        "--manifest",
        "--deploy-dir",
        dest="deploy_dir",
        metavar="DIR",
        type=Path,
        default=None,
        help="the manifests (a deploy/ directory) whose DaemonSet the image lab runs (default: deploy/ of this source tree)",
    )
    parser.add_argument(
        "--manifest-ref",
        metavar="GITREF",
        default=None,
        help="the manifests of an earlier commit: its deploy/, taken out of this checkout's git history "
        "(into the image directory, manifests/<commit>/deploy); instead of --manifest",
    )


def image_settings(args: Any) -> ImageSettings | None:
    if getattr(args, "image", None) is None:
        if getattr(args, "deploy_dir", None) is not None or getattr(args, "manifest_ref", None) is not None:
            raise LabError("--manifest and --manifest-ref choose the manifests of an image lab: give --image too")
        return None
    image_dir = Path(os.path.abspath(args.image_dir))
    return ImageSettings(args.image, image_dir, manifest_dir(args, image_dir))


def manifest_dir(args: Any, image_dir: Path) -> Path:
    """--manifest DIR, --manifest-ref GITREF (see :func:`flock.lab._releases.deploy_from_git`), or deploy/ here."""
    ref = getattr(args, "manifest_ref", None)
    if ref is not None:
        if args.deploy_dir is not None:
            raise LabError("--manifest and --manifest-ref: give one")
        return deploy_from_git(ref, image_dir / "manifests")
    return Path(os.path.abspath(args.deploy_dir or default_deploy_dir()))
