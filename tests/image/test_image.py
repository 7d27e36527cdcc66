"""The image and the image lab (pytest mark ``image``: .ci/run runs it after the main suite).

scripts/build-image builds deploy/Dockerfile into a fixed cache directory
(``$FLOCK_IMAGE_TEST_DIR`` or /var/cache/flock-image-build, so a re-run reuses
the base rootfs, the wheels and every unchanged layer; the ``image`` fixture of
conftest.py, shared with the upgrade drill); the labs run the
DaemonSet's pod from it under podman, as ``flock-lab up --image`` does, and
must leave nothing behind.  Removing any one capability the DaemonSet grants
must break the lab: that is the proof the set is minimal.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from flock.lab import LabError, LabPlan, _lifecycle, down, load_pods, pod_add, pod_del, reachability, summary, up
from flock.lab._image import ImageSettings
from flock.lab._lifecycle import lab_namespaces
from flock.lab._pods import parse_annotations
from flock.lab._state import load_procs
from flock.lab.keeper import load_specs

pytestmark = pytest.mark.image

REPO = Path(__file__).resolve().parents[2]
# The image's whole content, budgeted: bookworm-slim (78 MiB) + python3, bird2, iproute2 + flock's venv.
MAX_SIZE_MIB = 260


def podman(image: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    """podman with the image build's storage."""
    env = {
        "CONTAINERS_CONF": image["containers_conf"],
        "CONTAINERS_STORAGE_CONF": image["storage_conf"],
        "PATH": os.environ["PATH"],
    }
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=120)


def in_image(image: dict[str, Any], script: str) -> subprocess.CompletedProcess[str]:
    return podman(image, "run", "--rm", "--network", "none", "--entrypoint", "sh", image["image"], "-c", script)


def test_the_image_is_small_and_holds_flock_bird_and_nothing_to_build_with(image):
    assert image["image"] == "flock:image-test"
    assert image["size"] < MAX_SIZE_MIB * 2**20, f"image is {image['size'] / 2**20:.1f} MiB"
    scripts = ["flock-agent", "flock-install-cni", "flock"]
    if "flockctl" in (REPO / "pyproject.toml").read_text():
        scripts.append("flockctl")
    probe = in_image(
        image, " && ".join(f"command -v {s}" for s in scripts) + " && bird --version && python3 -c 'import flock.agent'"
    )
    assert probe.returncode == 0, probe.stderr
    absent = in_image(
        image,
        "for x in gcc cc make /opt/flock/bin/pip /root/.cache/pip /src/tests; do"
        " if command -v $x >/dev/null || [ -e $x ]; then echo $x; fi; done;"
        " find /opt/flock/lib -type d \\( -name tests -o -name _tests \\) | head -3",
    )
    assert absent.returncode == 0 and absent.stdout.strip() == "", absent.stdout


def test_a_second_build_reuses_the_cache_and_gives_the_same_image(image, build_image):
    out = build_image("--tag", image["image"])
    assert out.returncode == 0, out.stderr[-4000:]
    again = json.loads(out.stdout)
    assert again["id"] == image["id"]  # same sources, same wheels: every layer reused
    assert "fetching" not in out.stderr and "mmdebstrap" not in out.stderr


def _lab_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


def _leaves_nothing(plan: LabPlan) -> None:
    assert list(plan.dir.iterdir()) == []  # mkdtemp made the directory; down empties it
    plan.dir.rmdir()
    assert lab_namespaces(plan.id) == []
    with open("/proc/self/mounts") as f:
        assert not [line for line in f if str(plan.dir) in line]


PODS = (
    ("node1", "default/web-1", []),
    ("node1", "default/dual-1", ["ipv4=true"]),
    ("node2", "default/dual-2", ["ipv4=true"]),
    ("node2", "shop/cart-1", []),
)


async def test_two_node_image_lab_serves_pods_through_the_installed_shim_and_leaves_nothing(image):
    plan = LabPlan.make(_lab_dir("flab-i-"), 2)
    settings = ImageSettings(image["image"], Path(image["dir"]), REPO / "deploy")
    try:
        with trio.fail_after(240):
            await up(plan, image=settings)
            procs = load_procs(plan.dir)["processes"]
            # The keeper polled the DaemonSet's readiness probe: both agents ready.
            assert procs["agent-node1"]["ready"] is True and procs["agent-node2"]["ready"] is True
            assert procs["agent-node1"]["argv"][:2] == ["podman", "run"]
            # Every probe the keeper polls passes as it runs them (an exec probe is a `podman exec`,
            # which finds the container only with the lab's podman settings).
            for spec in load_specs(plan.dir / "spec.json"):
                for probe in (spec.liveness, spec.readiness):
                    if probe is not None:
                        assert await probe.passes(), (spec.name, probe)
            # The installer ran in its init container: shim and conflist on each node.
            for node in plan.nodes:
                assert (node.cni_bin / "flock").is_file()
                assert json.loads((node.cni_conf / "01-flock.conflist").read_text())["plugins"][0]["socket"] == str(
                    node.socket
                )
            for node, key, notes in PODS:
                await pod_add(plan, node, key, parse_annotations(notes))
            result = summary(await reachability(plan, load_pods(plan)))
            assert result["ok"], result
            assert result["passed"] >= 4 * 3
            await pod_del(plan, "shop/cart-1")
    finally:
        with trio.move_on_after(60, shield=True):
            await down(plan.dir)
    _leaves_nothing(plan)


def _without(container: str, capability: str, target: Path) -> Path:
    """A copy of deploy/ whose *container* lacks *capability*."""
    shutil.copytree(REPO / "deploy", target)
    path = target / "daemonset.yaml"
    docs = list(yaml.safe_load_all(path.read_text()))
    for doc in docs:
        if doc and doc.get("kind") == "DaemonSet":
            pod = doc["spec"]["template"]["spec"]
            (c,) = [c for c in pod["containers"] if c["name"] == container]
            caps = c["securityContext"]["capabilities"]
            assert capability in caps["add"]
            caps["add"] = [cap for cap in caps["add"] if cap != capability]
    path.write_text(yaml.safe_dump_all(copy.deepcopy(docs)))
    return target


@pytest.mark.parametrize(
    ("container", "capability"),
    [("flock-agent", "NET_ADMIN"), ("flock-agent", "SYS_ADMIN"), ("bird", "NET_ADMIN"), ("bird", "NET_BIND_SERVICE")],
)
async def test_every_granted_capability_is_needed(image, monkeypatch, tmp_path, container, capability):
    # Short of any one, the lab does not serve: the agent never gets ready, an
    # ADD fails, or routes never reach the other node.
    monkeypatch.setattr(_lifecycle, "READY_DEADLINE_S", 25.0)
    deploy = _without(container, capability, tmp_path / "deploy")
    plan = LabPlan.make(_lab_dir("flab-c-"), 2)
    failed_at = None
    try:
        with trio.fail_after(180):
            try:
                await up(plan, image=ImageSettings(image["image"], Path(image["dir"]), deploy))
                await pod_add(plan, "node1", "default/a", {})
                await pod_add(plan, "node2", "default/b", {})
                failed_at = "reachability"
                for _ in range(10):  # routes may take a moment; the full lab passes at once
                    if summary(await reachability(plan, load_pods(plan)))["ok"]:
                        failed_at = "nowhere: the lab passed"
                        break
                    await trio.sleep(1)
            except LabError as exc:
                failed_at = f"{type(exc).__name__}: {exc}"
    finally:
        with trio.move_on_after(60, shield=True):
            await down(plan.dir)
    _leaves_nothing(plan)
    assert failed_at is not None and not failed_at.startswith("nowhere"), f"{container} without {capability}"
