"""flock.lab._daemonset: deploy/daemonset.yaml → the container runs of one node (pure)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from flock.lab import _image
from flock.lab._daemonset import (
    Exec,
    HttpGet,
    ManifestError,
    Mount,
    NodeMapping,
    cpu_cores,
    expand,
    find_daemonset,
    memory_bytes,
    pod_runs,
    podman_argv,
)
from flock.lab._plan import LabPlan

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def manifests() -> list[dict[str, Any]]:
    return _image.load_manifests(DEPLOY)


def mapping(**changes: Any) -> NodeMapping:
    host = {
        p: Path("/lab/n1") / p.strip("/").replace("/", "_")
        for p in ("/opt/cni/bin", "/etc/cni/net.d", "/", "/run/flock", "/var/lib/flock", "/var/run/netns")
    }
    host |= {"/etc/flock/bird": Path("/lab/n1/bird"), "/proc/sys/net": Path("/proc/sys/net")}
    args: dict[str, Any] = {
        "node_name": "node1",
        "host_paths": host,
        "config_maps": {"flock-bird-bootstrap": Path("/lab/cm/flock-bird-bootstrap")},
        "host_ip": "2001:db8:ffff::101",
    }
    return NodeMapping(**(args | changes))


def runs_by_name(ds: dict[str, Any] | None = None, node: NodeMapping | None = None):
    return {r.name: r for r in pod_runs(ds or find_daemonset(manifests()), node or mapping())}


def test_the_manifest_gives_two_init_containers_then_agent_and_bird_in_order():
    runs = pod_runs(find_daemonset(manifests()), mapping())
    assert [(r.name, r.init) for r in runs] == [
        ("install-cni", True),
        ("bird-config", True),
        ("flock-agent", False),
        ("bird", False),
    ]


def test_agent_args_expand_node_name_from_the_downward_api():
    agent = runs_by_name()["flock-agent"]
    assert ("NODE_NAME", "node1") in agent.env
    assert agent.argv[0] == "flock-agent"
    assert "--node=node1" in agent.argv
    assert "--socket=/run/flock/flock.sock" in agent.argv


def test_mounts_land_on_the_nodes_directories():
    agent = runs_by_name()["flock-agent"]
    mounts = {m.target: m for m in agent.mounts}
    assert mounts["/run/flock"].source == Path("/lab/n1/run_flock")
    assert mounts["/var/run/netns"].propagation == "rslave"  # HostToContainer
    assert mounts["/host/proc/sys/net"].source == Path("/proc/sys/net")
    assert mounts["/run/flock"].create  # DirectoryOrCreate
    installer = runs_by_name()["install-cni"]
    host = {m.target: m for m in installer.mounts}["/host"]
    assert host.read_only and host.source == Path("/lab/n1")  # hostPath "/" → its stand-in
    seed = runs_by_name()["bird-config"]
    assert {m.target: m.source for m in seed.mounts}["/etc/flock/bird-bootstrap"] == Path(
        "/lab/cm/flock-bird-bootstrap"
    )


def test_security_context_and_probes_are_taken_from_the_manifest():
    runs = runs_by_name()
    agent, bird = runs["flock-agent"], runs["bird"]
    assert not agent.privileged and agent.read_only_root and agent.no_new_privileges
    assert agent.cap_drop == ("ALL",) and set(agent.cap_add) == {"NET_ADMIN", "SYS_ADMIN"}
    assert agent.readiness is not None and agent.readiness.action == HttpGet("127.0.0.1", 9464, "/readyz")
    assert agent.liveness is not None and agent.liveness.failure_threshold == 6
    assert bird.liveness is not None and bird.liveness.action == Exec(
        ("birdc", "-s", "/run/flock/bird.ctl", "show", "status")
    )
    assert agent.memory_limit == 512 * 2**20 and agent.cpu_limit == 1.0
    assert bird.pre_stop is not None and bird.pre_stop.command[:2] == ("sh", "-c")
    assert bird.pre_stop.command[2].endswith("exec birdc -s /run/flock/bird.ctl graceful restart")


def test_a_manifest_change_is_what_the_lab_runs():
    ds = copy.deepcopy(find_daemonset(manifests()))
    agent = ds["spec"]["template"]["spec"]["containers"][0]
    agent["args"].append("--log-level=debug")
    agent["securityContext"]["capabilities"]["add"] = ["NET_ADMIN"]
    run = runs_by_name(ds)["flock-agent"]
    assert run.argv[-1] == "--log-level=debug"
    assert run.cap_add == ("NET_ADMIN",)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda pod: pod["volumes"].append({"name": "x", "hostPath": {"path": "/etc/secret"}}), "hostPath.path"),
        (lambda pod: pod["volumes"].append({"name": "x", "emptyDir": {}}), "only hostPath and configMap"),
        (lambda pod: pod.update(hostNetwork=False), "hostNetwork"),
        (
            lambda pod: pod["containers"][0]["env"].append(
                {"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}
            ),
            "fieldRef.fieldPath",
        ),
        (lambda pod: pod["containers"][0].pop("command"), "command"),
        (lambda pod: pod["containers"][0].update(lifecycle={"postStart": {"exec": {"command": ["x"]}}}), "postStart"),
        (lambda pod: pod["containers"][0]["volumeMounts"].append({"name": "nope", "mountPath": "/x"}), "no volume"),
    ],
)
def test_what_the_lab_cannot_reproduce_is_refused_naming_the_field(change, field):
    ds = copy.deepcopy(find_daemonset(manifests()))
    change(ds["spec"]["template"]["spec"])
    with pytest.raises(ManifestError, match=field.replace(".", r"\.")):
        pod_runs(ds, mapping())


def test_expand_is_the_kubelets():
    env = {"A": "1", "NODE_NAME": "n1"}
    assert expand("--node=$(NODE_NAME)", env) == "--node=n1"
    assert expand("$$(A) $(A) $(MISSING)", env) == "$(A) 1 $(MISSING)"


def test_quantities():
    assert memory_bytes("128Mi") == 128 * 2**20 and memory_bytes("1G") == 10**9 and memory_bytes("100") == 100
    assert cpu_cores("200m") == 0.2 and cpu_cores("1") == 1.0 and cpu_cores(2) == 2.0


def test_podman_argv_carries_the_security_context_mounts_and_network():
    agent = runs_by_name()["flock-agent"]
    argv = podman_argv(agent, name="c1", image="flock:test", netns="/run/netns/n1")
    joined = " ".join(argv)
    assert argv[:2] == ["run", "--rm"]
    assert "--network ns:/run/netns/n1" in joined and "--pull never" in joined
    assert "--privileged" not in argv
    assert "--cap-drop ALL" in joined and "--cap-add NET_ADMIN" in joined and "--cap-add SYS_ADMIN" in joined
    assert "--read-only --read-only-tmpfs=false" in joined
    assert "--security-opt no-new-privileges" in joined and "--user 0" in joined
    assert "--env NODE_NAME=node1" in joined
    assert "--volume /run/netns:/var/run/netns:rw,rslave" not in joined  # the mapping's own source
    assert "--volume /lab/n1/var_run_netns:/var/run/netns:rw,rslave" in joined
    i = argv.index("--entrypoint")
    assert argv[i + 1 : i + 3] == ["flock-agent", "flock:test"] and argv[i + 3] == "--node=node1"


def test_image_lab_moves_the_installers_host_socket_and_points_the_agent_at_its_kubeconfig(tmp_path):
    plan = LabPlan.make(tmp_path, 2)
    node = plan.nodes[1]
    runs = {r.name: r for r in _image.lab_runs(plan, node, manifests(), {"flock-bird-bootstrap": tmp_path / "cm"})}
    assert f"--socket={node.socket}" in runs["install-cni"].argv
    assert "--cni-bin-dir=/opt/cni/bin" in runs["install-cni"].argv  # a container path stays
    agent = runs["flock-agent"]
    assert agent.argv[-2:] == (f"--kubeconfig={_image.LAB_KUBECONFIG}", "--bgp-lab-timers")
    assert Mount(node.kubeconfig, _image.LAB_KUBECONFIG, read_only=True) in agent.mounts
    assert {m.target: m.source for m in agent.mounts}["/run/flock"] == node.socket.parent
    assert "--node=node2" in agent.argv
