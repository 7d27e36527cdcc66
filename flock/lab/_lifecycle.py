"""``up`` and ``down``: make the lab's namespaces, files and processes, and remove them all.

Error handling: ``up`` raises :class:`LabError` when something cannot be made
or does not become ready within ``READY_DEADLINE_S`` (naming what is not
ready and where its log is); it leaves the lab as it is for inspection, and
``down`` (or the next ``up``) removes it.  ``down`` retries nothing and
tolerates anything already gone, so it is safe to run twice.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from flock.apiserver import LOADBALANCERPOOLS, NODECONFIGS, NODES, SECRETS, write_kubeconfig
from flock.lab._api import ApiClient, ApiError
from flock.lab._bird import all_established, bgp_sessions, fabric_config, internet_config, node_bootstrap_config
from flock.lab._image import (
    ImageSettings,
    check_image,
    container_specs,
    load_manifests,
    remove_containers,
    run_init_containers,
    write_podman_config,
)
from flock.lab._nsio import NETNS_DIR, http_in
from flock.lab._plan import (
    AGENT_NAMESPACE,
    APISERVER_PORT,
    BRIDGE,
    DEFAULT_MTU,
    FABRIC4,
    FABRIC6,
    FABRIC_NET4,
    FABRIC_NET6,
    FABRIC_PREFIX4,
    FABRIC_PREFIX6,
    HEALTH_ADDRESS,
    INTERNET,
    INTERNET4,
    INTERNET6,
    INTERNET_GATEWAY4,
    INTERNET_GATEWAY6,
    INTERNET_LINK,
    INTERNET_PREFIX4,
    INTERNET_PREFIX6,
    NODE_PORTS,
    SERVICE_CLUSTER_RANGES,
    SERVICE_EXTERNAL_RANGES,
    UPLINK,
    LabPlan,
    NodePlan,
    lab_id,
)
from flock.lab._ports import PortSpec
from flock.lab._procs import ProcRef, is_running, proc_ref, reap_if_child, signal_if_running
from flock.lab._state import PROCS_FILE, LabError, LabState, keeper_running, load_procs, load_state, process_refs
from flock.lab.keeper import STOP_GRACE_S, ProcessSpec
from flock.netns import call_in_netns

READY_DEADLINE_S = 60.0
# BOOKMARKs move every agent's watches on while nothing changes: `policy wait` needs no more than this.
APISERVER_BOOKMARK_S = 0.2
KILL_WAIT_S = 5.0
SPEC_FILE = "spec.json"
KEEPER_LOG = "keeper.log"
CONTROLLERS_LOG = "controllers.log"
LB_CONTROLLER_LOG = "lb-controller.log"
LB_POOL_NAME = "lab-default"  # the lab's LoadBalancerPool: its external ranges, which the agents translate
# The API server writes it once it serves (again after a restart: its loopback port is any free one).
HOST_KUBECONFIG = "kubeconfig"
HOST_APISERVER_ADDRESS = "127.0.0.1"
# What the lab writes at the top of its directory; down removes exactly these.
LAB_FILES = (
    PROCS_FILE,
    PROCS_FILE + ".tmp",
    SPEC_FILE,
    KEEPER_LOG,
    "apiserver.log",
    CONTROLLERS_LOG,
    LB_CONTROLLER_LOG,
    HOST_KUBECONFIG,
    HOST_KUBECONFIG + ".tmp",
    "lab.json.tmp",
    "lab.json",
)
LAB_DIRS = ("nodes", "fabric", "pods", "configmaps", "podman")

Report = Callable[[str], None]


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise LabError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def build_network(plan: LabPlan) -> None:
    """The fabric namespace with its bridge, every node joined to it, and (``plan.internet``)
    the internet behind it; every link at ``plan.uplink_mtu`` (blocking)."""
    fab, mtu = plan.fabric_netns, str(plan.uplink_mtu)
    _ip("netns", "add", fab)
    _ip("-n", fab, "link", "set", "lo", "up")
    _ip("-n", fab, "link", "add", BRIDGE, "mtu", mtu, "type", "bridge", "mcast_snooping", "0")
    _ip("-n", fab, "addr", "add", f"{FABRIC6}/{FABRIC_PREFIX6}", "dev", BRIDGE, "nodad")
    _ip("-n", fab, "addr", "add", f"{FABRIC4}/{FABRIC_PREFIX4}", "dev", BRIDGE)
    _ip("-n", fab, "link", "set", BRIDGE, "up")
    for node in plan.nodes:
        _ip("netns", "add", node.netns)
        _ip("-n", node.netns, "link", "set", "lo", "up")
        _ip(
            "-n",
            fab,
            "link",
            "add",
            node.fabric_port,
            "mtu",
            mtu,
            "type",
            "veth",
            "peer",
            "name",
            UPLINK,
            "mtu",
            mtu,
            "netns",
            node.netns,
        )
        _ip("-n", fab, "link", "set", node.fabric_port, "master", BRIDGE, "up")
        _ip("-n", node.netns, "addr", "add", f"{node.addr6}/{FABRIC_PREFIX6}", "dev", UPLINK, "nodad")
        _ip("-n", node.netns, "addr", "add", f"{node.addr4}/{FABRIC_PREFIX4}", "dev", UPLINK)
        _ip("-n", node.netns, "link", "set", UPLINK, "up")
        # A node's default route points at its ToR, as on a real node.
        _ip("-n", node.netns, "route", "add", "default", "via", str(FABRIC6), "dev", UPLINK)
        _ip("-n", node.netns, "route", "add", "default", "via", str(FABRIC4), "dev", UPLINK)
    # The bridge's MTU follows its ports unless set: set, so it is what the plan says whatever they are.
    _ip("-n", fab, "link", "set", BRIDGE, "mtu", mtu)
    if plan.internet_netns is not None:
        build_internet(plan, plan.internet_netns)


def _sysctls(netns: str, values: dict[str, str]) -> None:
    """Write /proc/sys/net/… keys (``ipv4/ip_forward``) of *netns* (blocking)."""

    def write() -> None:
        for key, value in values.items():
            with open(f"/proc/sys/net/{key}", "w") as f:
                f.write(value)

    try:
        call_in_netns(netns, write)
    except OSError as exc:
        raise LabError(f"sysctl in {netns}: {exc}") from None


def build_internet(plan: LabPlan, inet: str) -> None:
    """The internet behind the fabric: the fabric forwards to it, and it routes back only to
    the fabric segment (the nodes' uplink addresses), never to a pod block (blocking).
    Reverse-path filtering is off on both, so a pod's own source address reaches the
    internet, which cannot answer it."""
    fab, mtu = plan.fabric_netns, str(plan.uplink_mtu)
    _ip("netns", "add", inet)
    _ip("-n", inet, "link", "set", "lo", "up")
    _ip(
        "-n",
        fab,
        "link",
        "add",
        INTERNET_LINK,
        "mtu",
        mtu,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "mtu",
        mtu,
        "netns",
        inet,
    )
    _ip("-n", fab, "addr", "add", f"{INTERNET_GATEWAY6}/{INTERNET_PREFIX6}", "dev", INTERNET_LINK, "nodad")
    _ip("-n", fab, "addr", "add", f"{INTERNET_GATEWAY4}/{INTERNET_PREFIX4}", "dev", INTERNET_LINK)
    _ip("-n", fab, "link", "set", INTERNET_LINK, "up")
    _ip("-n", inet, "addr", "add", f"{INTERNET6}/{INTERNET_PREFIX6}", "dev", "eth0", "nodad")
    _ip("-n", inet, "addr", "add", f"{INTERNET4}/{INTERNET_PREFIX4}", "dev", "eth0")
    _ip("-n", inet, "link", "set", "eth0", "up")
    _ip("-n", inet, "route", "add", str(FABRIC_NET6), "via", str(INTERNET_GATEWAY6), "dev", "eth0")
    _ip("-n", inet, "route", "add", str(FABRIC_NET4), "via", str(INTERNET_GATEWAY4), "dev", "eth0")
    no_rp = {f"ipv4/conf/{dev}/rp_filter": "0" for dev in ("all", "default")}
    _sysctls(
        fab,
        {
            "ipv4/ip_forward": "1",
            "ipv6/conf/all/forwarding": "1",
            **no_rp,
            **{f"ipv4/conf/{dev}/rp_filter": "0" for dev in (BRIDGE, INTERNET_LINK)},
        },
    )
    _sysctls(inet, {**no_rp, "ipv4/conf/eth0/rp_filter": "0"})
    # Services' external addresses reach the nodes by what BGP says: the fabric's BIRD puts the routes
    # the nodes announce in the fabric's kernel (ECMP over the announcing nodes, spread by the L4
    # hash so that connections from one client go to several nodes), and passes them on to the
    # internet's BIRD (lab/_bird.py); no static route.
    _sysctls(fab, {"ipv4/fib_multipath_hash_policy": "1", "ipv6/fib_multipath_hash_policy": "1"})


INTERNET_BIRD_CONF = "internet-bird.conf"


def internet_bird_ctl(plan: LabPlan) -> Path:
    """The control socket of the internet's BIRD (``flock-lab up --internet``)."""
    return plan.fabric_dir / "internet-bird.ctl"


def _bin(name: str) -> str:
    """A console script of this installation (the venv's bin next to the interpreter)."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise LabError(f"{name} not found next to {sys.executable} or on PATH: install flock (scripts/bootstrap)")
    return found


def _env() -> dict[str, str]:
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
    }


def lab_policy_peers() -> str:
    """The lab agents' ``--policy-peers``: ``$FLOCK_LAB_POLICY_PEERS`` (pods or groups), else groups."""
    value = os.environ.get("FLOCK_LAB_POLICY_PEERS", "groups")
    if value not in ("pods", "groups"):
        raise LabError(f"FLOCK_LAB_POLICY_PEERS={value[:32]!r}: expected pods or groups")
    return value


def agent_argv(node: NodePlan, program: Sequence[str] | None = None) -> list[str]:
    """The agent's command line: *program* (default: this installation's
    ``flock-agent``) with the node's flags."""
    return [
        *(program if program is not None else [_bin("flock-agent")]),
        f"--node={node.name}",
        f"--socket={node.socket}",
        f"--state-dir={node.state_dir}",
        f"--kubeconfig={node.kubeconfig}",
        f"--health-address={HEALTH_ADDRESS}",
        f"--bird-config={node.bird_conf}",
        f"--bird-socket={node.bird_ctl}",
        f"--namespace={AGENT_NAMESPACE}",
        "--bgp-lab-timers",
        "--log-format=json",
        # Services: flock's proxy instead of kube-proxy; the external addresses it translates and
        # announces are the LoadBalancerPools' (lab-default: the lab's external ranges).  A leaving node
        # (cordoned, stopping) withdraws its Service routes 2 s after the graceful-shutdown community.
        "--service-proxy",
        "--bgp-leave-seconds=2",
        # NetworkPolicy peers from flock-controller's address groups: each agent watches its own pods,
        # its NodeAddressGroups and the AddressGroups it names, not every Pod (issue 35).  $FLOCK_LAB_POLICY_PEERS
        # =pods: every agent watches every Pod (what docs/scale.md compares).
        f"--policy-peers={lab_policy_peers()}",
        # --encrypt: WireGuard between the nodes over wireguard-go (no module here), a device name per node
        *(
            ["--encryption=wireguard", f"--wireguard-device={node.wireguard_device}", "--wireguard-kind=userspace"]
            if node.wireguard_device is not None
            else []
        ),
    ]


def _server_argv(netns: str, name: str) -> list[str]:
    argv = ["ip", "netns", "exec", netns, sys.executable, "-m", "flock.lab._serve", "--name", name]
    for text in NODE_PORTS:
        port = PortSpec.parse(text, named=False)
        argv += [f"--{port.protocol.lower()}", str(port.port)]
    return argv


def node_server_argv(node: NodePlan) -> list[str]:
    """The port server of *node* itself (``NODE_PORTS`` on its own addresses, run in its namespace)."""
    return _server_argv(node.netns, node.name)


def process_specs(plan: LabPlan, nodes: bool = True, agent_program: Sequence[str] | None = None) -> list[ProcessSpec]:
    """The API server, the route server, every node's port server (``serve-<node>``, what a
    probe to a node reaches), the internet's (``serve-internet``, with ``plan.internet``)
    and (*nodes*) every node's bird and flock-agent
    (*agent_program*: see :func:`agent_argv`)."""
    env, fab = _env(), plan.fabric_netns
    specs = [
        ProcessSpec(
            "apiserver",
            # In the host's namespace, serving the fabric's address (bound in the fabric namespace,
            # what nodes reach) and the host's loopback (what `flock-lab kubeconfig` points kubectl at).
            (
                sys.executable,
                "-m",
                "flock.apiserver",
                "--netns",
                fab,
                "--host",
                str(FABRIC6),
                "--port",
                str(APISERVER_PORT),
                "--also-listen",
                f"{HOST_APISERVER_ADDRESS}:0",
                "--kubeconfig-out",
                str(plan.dir / HOST_KUBECONFIG),
                "--bookmark-interval",
                str(APISERVER_BOOKMARK_S),
                "--service-cluster-ip-range",
                ",".join(str(net) for net in SERVICE_CLUSTER_RANGES),
            ),
            plan.dir / "apiserver.log",
            env,
        ),
        ProcessSpec(
            "controllers",
            # kube-controller-manager's EndpointSlice controller and the kubelets' pod termination, in the
            # fabric namespace (where the API server's address is fixed; its loopback port is not).
            (
                "ip",
                "netns",
                "exec",
                fab,
                sys.executable,
                "-m",
                "flock.lab.controllers",
                "--lab-dir",
                str(plan.dir),
                "--kubeconfig",
                str(plan.fabric_dir / "kubeconfig"),
            ),
            plan.dir / CONTROLLERS_LOG,
            env,
        ),
        ProcessSpec(
            "lb-controller",
            # flock-controller (LoadBalancer addresses from LoadBalancerPools, and the address groups the
            # agents' NetworkPolicy reads; elected by a Lease), in the fabric namespace beside the lab's
            # controllers; one replica, as a lab needs (deploy/'s Deployment has two).
            (
                "ip",
                "netns",
                "exec",
                fab,
                sys.executable,
                "-m",
                "flock.controller",
                "--kubeconfig",  # as in a cluster: kubernetes-asyncio's client, a pass per change (watches)
                str(plan.fabric_dir / "kubeconfig"),
                "--identity",
                "lab-controller-0",
            ),
            plan.dir / LB_CONTROLLER_LOG,
            env,
        ),
        ProcessSpec(
            "bird-fabric",
            (
                "ip",
                "netns",
                "exec",
                fab,
                "bird",
                "-f",
                "-c",
                str(plan.fabric_dir / "bird.conf"),
                "-s",
                str(plan.fabric_dir / "bird.ctl"),
            ),
            plan.fabric_dir / "bird.log",
            env,
        ),
    ]
    for node in plan.nodes:
        specs.append(ProcessSpec(f"serve-{node.name}", tuple(node_server_argv(node)), node.dir / "serve.log", env))
    if plan.internet_netns is not None:
        # The internet's host: NODE_PORTS too, each TCP answer naming the address it came from.
        argv = _server_argv(plan.internet_netns, INTERNET)
        specs.append(ProcessSpec(f"serve-{INTERNET}", tuple(argv), plan.fabric_dir / "internet.log", env))
        # Its router: learns the Service routes the fabric holds.
        bird = ("bird", "-f", "-c", str(plan.fabric_dir / INTERNET_BIRD_CONF), "-s", str(internet_bird_ctl(plan)))
        specs.append(
            ProcessSpec(
                f"bird-{INTERNET}",
                ("ip", "netns", "exec", plan.internet_netns, *bird),
                plan.fabric_dir / "internet-bird.log",
                env,
            )
        )
    for node in plan.nodes if nodes else ():
        specs.append(
            ProcessSpec(
                f"bird-{node.name}",
                # -R: a restarted BIRD recovers gracefully (deploy/daemonset.yaml runs it so too).
                (
                    "ip",
                    "netns",
                    "exec",
                    node.netns,
                    "bird",
                    "-f",
                    "-R",
                    "-c",
                    str(node.bird_conf),
                    "-s",
                    str(node.bird_ctl),
                ),
                node.dir / "bird.log",
                env,
            )
        )
        specs.append(
            ProcessSpec(
                f"agent-{node.name}",
                ("ip", "netns", "exec", node.netns, *agent_argv(node, agent_program)),
                node.dir / "agent.log",
                env,
            )
        )
    return specs


def write_files(plan: LabPlan, install_cni: bool = True) -> None:
    """Configs, kubeconfigs and (*install_cni*) the CNI install of every node (blocking)."""
    plan.fabric_dir.mkdir(parents=True, exist_ok=True)
    plan.pods_dir.mkdir(parents=True, exist_ok=True)
    (plan.fabric_dir / "bird.conf").write_text(fabric_config(plan))
    if plan.internet:
        (plan.fabric_dir / INTERNET_BIRD_CONF).write_text(internet_config())
    write_kubeconfig(plan.fabric_dir / "kubeconfig", plan.apiserver_url)  # the controllers'
    for node in plan.nodes:
        for d in (node.dir, node.socket.parent, node.state_dir):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        node.bird_conf.write_text(node_bootstrap_config(node))
        write_kubeconfig(node.kubeconfig, plan.apiserver_url)
        if not install_cni:
            continue  # the image lab's install-cni init container does it
        proc = subprocess.run(
            [
                _bin("flock-install-cni"),
                f"--cni-bin-dir={node.cni_bin}",
                f"--cni-conf-dir={node.cni_conf}",
                f"--socket={node.socket}",
                "--log-format=text",
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise LabError(f"flock-install-cni for {node.name} failed: {proc.stderr.strip()}")


def start_keeper(plan: LabPlan, specs: list[ProcessSpec]) -> ProcRef:
    (plan.dir / SPEC_FILE).write_text(json.dumps({"processes": [s.to_json() for s in specs]}, indent=1) + "\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "flock.lab.keeper",
            str(plan.dir / SPEC_FILE),
            str(plan.dir / PROCS_FILE),
            str(plan.dir / KEEPER_LOG),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **_env()},
        start_new_session=True,
    )
    if proc.returncode != 0:
        raise LabError(f"the process keeper did not start: {proc.stderr.strip()}")
    ref = proc_ref(int(proc.stdout.strip()))
    if ref is None:
        raise LabError(f"the process keeper exited at once; see {plan.dir / KEEPER_LOG}")
    return ref


def default_pool() -> dict[str, Any]:
    """The lab's LoadBalancerPool: the external ranges the fabric routes and the agents translate."""
    return {
        "apiVersion": "flock.fritzlab.net/v1alpha1",
        "kind": "LoadBalancerPool",
        "metadata": {"name": LB_POOL_NAME},
        "spec": {"blocks": [{"cidr": str(net)} for net in SERVICE_EXTERNAL_RANGES]},
    }


def api_client(plan: LabPlan) -> ApiClient:
    return ApiClient(plan.fabric_netns, str(FABRIC6), APISERVER_PORT)


async def ensure_node(api: ApiClient, node: NodePlan) -> dict[str, Any]:
    """Create *node*'s Node object, or give the one of that name the node's labels
    (others stay) and addresses: what ``up`` does, as often as it is done."""
    wanted = node.node_object()
    try:
        try:
            obj = await api.create(NODES, wanted)
        except ApiError as exc:
            if exc.status != 409:
                raise
            obj = await api.patch(NODES, node.name, {"metadata": {"labels": node.node_labels()}})
        if (obj.get("status") or {}).get("addresses") != wanted["status"]["addresses"]:
            obj = await api.patch(NODES, node.name, {"status": wanted["status"]}, subresource="status")
    except ApiError as exc:
        raise LabError(f"the Node object of {node.name}: {exc}") from None
    return obj


async def agent_ready(node: NodePlan) -> bool:
    host, port = HEALTH_ADDRESS.rsplit(":", 1)
    try:
        status, _ = await trio.to_thread.run_sync(http_in, node.netns, host, int(port), "GET", "/readyz", None, 2.0)
    except OSError:
        return False
    return status == 200


async def readiness(plan: LabPlan) -> dict[str, Any]:
    """What is ready: every agent's /readyz, every node's session and the fabric's sessions."""
    out: dict[str, Any] = {}

    procs = load_procs(plan.dir).get("processes", {})

    async def one(node: NodePlan) -> None:
        # The image lab's keeper polls the DaemonSet's readiness probe: ready means it said so too.
        probed = procs.get(f"agent-{node.name}", {}).get("ready")
        out[node.name] = {
            "agent_ready": await agent_ready(node) and probed is not False,
            "bgp": all_established(await bgp_sessions(node.bird_ctl), 1),
        }

    async with trio.open_nursery() as nursery:
        for node in plan.nodes:
            nursery.start_soon(one, node)
    # the fabric's sessions: one per node, and two to the internet's router (IPv6, IPv4)
    sessions = len(plan.nodes) + (2 if plan.internet else 0)
    out["fabric"] = {"bgp": all_established(await bgp_sessions(plan.fabric_dir / "bird.ctl"), sessions)}
    if plan.internet:
        out[INTERNET] = {"bgp": all_established(await bgp_sessions(internet_bird_ctl(plan)), 2)}
    return out


def _not_ready(ready: dict[str, Any]) -> list[str]:
    missing = []
    for name, flags in ready.items():
        missing += [f"{name}: {flag}" for flag, ok in flags.items() if not ok]
    return missing


async def up(
    plan: LabPlan,
    report: Report = lambda line: None,
    image: ImageSettings | None = None,
    agent_program: Sequence[str] | None = None,
) -> LabState:
    """Make the lab and return when every agent is ready and every BGP session Established.
    With *image*, every node runs the DaemonSet's pod from that image (:mod:`flock.lab._image`).
    *agent_program* replaces ``flock-agent`` on every node (a benchmark's
    other checkout); the node's flags follow it."""
    if os.geteuid() != 0:
        raise LabError("flock-lab needs root (network namespaces, veths, routes)")
    for tool in ("bird", "birdc", "ip", "nsenter", "ping", *(("podman", "runc") if image else ())):
        if shutil.which(tool, path=_env()["PATH"]) is None:
            raise LabError(
                f"{tool} not found: run scripts/bootstrap (it installs bird2, iproute2, util-linux, iputils-ping)"
            )
    previous = load_state(plan.dir)
    if previous is not None and previous.keeper is not None and keeper_running(previous):
        raise LabError(
            f"a lab is running in {plan.dir} (keeper pid {previous.keeper.pid}): `flock-lab down` first, or use another --dir"
        )
    if previous is not None or lab_namespaces(plan.id):
        report(f"cleaning up what a previous lab left in {plan.dir}")
        await down(plan.dir)
    dir_created = not plan.dir.exists()
    plan.dir.mkdir(parents=True, exist_ok=True)
    image_json = None if image is None else image.to_json()
    state = LabState(plan, dir_created, image=image_json)
    state.save()  # first, so a crash from here on is cleaned by down or the next up
    report(
        f"network: fabric {plan.fabric_netns} (route server, API server at {plan.apiserver_url}) + {len(plan.nodes)} nodes"
        + (f" + internet {plan.internet_netns} ({INTERNET6}, {INTERNET4})" if plan.internet_netns is not None else "")
        + (f", links at MTU {plan.uplink_mtu}" if plan.uplink_mtu != DEFAULT_MTU else "")
    )
    await trio.to_thread.run_sync(build_network, plan)
    if image is None:
        report(f"files: BIRD configs, kubeconfigs, flock-install-cni into {plan.dir}/nodes/*/cni")
        await trio.to_thread.run_sync(write_files, plan)
        specs = process_specs(plan, agent_program=agent_program)
    else:
        report(f"files: kubeconfigs, podman storage in {plan.dir}/podman (images from {image.image_dir})")
        await trio.to_thread.run_sync(write_files, plan, False)
        docs = load_manifests(image.deploy_dir)
        await trio.to_thread.run_sync(write_podman_config, plan, image)
        await check_image(plan, image)
        node_specs, inits = container_specs(plan, image, docs)
        report(f"init containers from {image.image}: {', '.join(sorted({r.name for _, r in inits}))} on every node")
        await run_init_containers(plan, image, inits)
        specs = [*process_specs(plan, nodes=False), *node_specs]
    keeper = await trio.to_thread.run_sync(start_keeper, plan, specs)
    state = LabState(plan, dir_created, keeper, image=image_json)
    state.save()
    report(f"processes: {', '.join(s.name for s in specs)} (keeper pid {keeper.pid})")
    api = api_client(plan)
    ready: dict[str, Any] = {}
    with trio.move_on_after(READY_DEADLINE_S) as deadline:
        while True:
            try:
                await api.version()
                break
            except OSError:
                await trio.sleep(0.05)
        await api.create(SECRETS, plan.bgp_secret())
        for node in plan.nodes:
            await api.create(NODECONFIGS, node.nodeconfig())
            await ensure_node(api, node)
        await api.create(LOADBALANCERPOOLS, default_pool())
        report("NodeConfigs and Nodes created; waiting for agents (/readyz) and BGP sessions (Established)")
        while True:
            ready = await readiness(plan)
            if not _not_ready(ready):
                break
            if not is_running(keeper):
                raise LabError(f"the process keeper died; see {plan.dir / KEEPER_LOG}")
            await trio.sleep(0.1)
    if deadline.cancelled_caught:
        what = ", ".join(_not_ready(ready)) or "the API server"
        raise LabError(
            f"not ready after {READY_DEADLINE_S:g} s: {what}. Logs: {plan.dir}/apiserver.log, {plan.dir}/nodes/*/agent.log, */bird.log; `flock-lab down` removes the lab"
        )
    state = LabState(plan, dir_created, keeper, "up", image=image_json)
    state.save()
    return state


def host_kubeconfig(state: LabState) -> Path:
    """The kubeconfig that reaches the lab's API server from the host's network namespace
    (its loopback); raises :class:`LabError` while the API server has not written it."""
    path = state.plan.dir / HOST_KUBECONFIG
    if not path.exists():
        raise LabError(f"no {path}: the lab's API server has not started; see {state.plan.dir / 'apiserver.log'}")
    return path


def lab_namespaces(ident: str) -> list[str]:
    prefix = f"flab-{ident}-"
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


async def _wait_gone(refs: list[ProcRef], limit: float) -> list[ProcRef]:
    with trio.move_on_after(limit):
        while any(is_running(r) for r in refs):
            for r in refs:
                reap_if_child(r.pid)
            await trio.sleep(0.05)
    for r in refs:
        reap_if_child(r.pid)
    return [r for r in refs if is_running(r)]


async def _stop(refs: list[ProcRef], grace: float) -> None:
    """SIGTERM, wait *grace*, SIGKILL what is left, wait again."""
    live = [r for r in refs if signal_if_running(r, signal.SIGTERM)]
    left = await _wait_gone(live, grace)
    for r in left:
        signal_if_running(r, signal.SIGKILL)
    left = await _wait_gone(left, KILL_WAIT_S)
    if left:
        raise LabError(f"processes would not die: {[r.pid for r in left]}")


def _netns_pids(name: str) -> list[ProcRef]:
    proc = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    refs = (proc_ref(int(p)) for p in proc.stdout.split())
    return [r for r in refs if r is not None]


async def down(directory: Path, report: Report = lambda line: None) -> dict[str, Any]:
    """Stop the lab's processes, delete its namespaces and files.  Safe to repeat."""
    directory = Path(await trio.to_thread.run_sync(os.path.abspath, directory))
    state = load_state(directory)
    ident = state.plan.id if state is not None else lab_id(directory)
    summary: dict[str, Any] = {"dir": str(directory), "processes": 0, "namespaces": [], "files_removed": False}
    if state is not None and state.keeper is not None and is_running(state.keeper):
        report(f"stopping the keeper (pid {state.keeper.pid}) and its processes")
        await _stop([state.keeper], STOP_GRACE_S + KILL_WAIT_S)
        summary["processes"] += 1
    # A keeper that crashed leaves its children running; so may a killed command.
    leftovers = [r for r in process_refs(directory).values() if is_running(r)]
    namespaces = lab_namespaces(ident)
    for name in namespaces:
        leftovers += await trio.to_thread.run_sync(_netns_pids, name)
    if leftovers:
        report(f"stopping {len(leftovers)} leftover processes")
        await _stop(list(set(leftovers)), STOP_GRACE_S)
        summary["processes"] += len(set(leftovers))
    containers = await trio.to_thread.run_sync(remove_containers, directory)
    if containers:
        report(f"removed {containers} leftover containers")
    for name in namespaces:
        await trio.to_thread.run_sync(_ip, "netns", "del", name)
    summary["namespaces"] = namespaces
    if namespaces:
        report(f"deleted {len(namespaces)} namespaces")
    removed = False
    for name in LAB_DIRS:
        if (directory / name).exists():
            shutil.rmtree(directory / name)
            removed = True
    for name in LAB_FILES:
        if (directory / name).exists():
            (directory / name).unlink()
            removed = True
    if directory.exists() and (state is None or state.dir_created) and not any(directory.iterdir()):
        directory.rmdir()
        removed = True
    summary["files_removed"] = removed
    return summary
