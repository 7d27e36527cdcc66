"""Conformance through libcni, the library containerd and CRI-O use.

A small Go driver (tests/conformance/libcni/driver.go) is built here with Debian's Go in
GOPATH mode against Debian's golang-github-appc-cni-dev (libcni 1.1.2), no
downloads.  It drives a one-node flock-lab: the shim and conflist written by
flock-install-cni, a real agent, bird2 and API server.  libcni caches the ADD
result (in a temporary directory here, not /var/lib/cni) and hands it to CHECK
and DEL as prevResult, exactly as a runtime does.

libcni 1.1.2 speaks CNI up to 1.0.0 and refuses to parse a 1.1.0 result; it
ignores the default conflist's ``cniVersions`` list and runs at its
``cniVersion`` (1.0.0).  The test uses the default conflist unedited, then one
pinned with `flock-install-cni --cni-version 0.4.0`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from flock import installer
from flock.apiserver import PODS, pod_object
from flock.lab import LabPlan, down, up
from flock.lab._lifecycle import api_client
from flock.lab._nsio import in_netns, netns_path

DRIVER_SOURCE = Path(__file__).parent / "libcni" / "driver.go"
DEBIAN_GOPATH = "/usr/share/gocode"


@pytest.fixture
def driver(tmp_path: Path) -> Path:
    """The driver, built offline into tmp_path."""
    if shutil.which("go") is None or not os.path.isdir(
        f"{DEBIAN_GOPATH}/src/github.com/containernetworking/cni/libcni"
    ):
        pytest.fail("needs Debian's golang-go and golang-github-appc-cni-dev (scripts/bootstrap installs them)")
    out = tmp_path / "driver"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "GO111MODULE": "off",
        "GOPATH": f"{tmp_path / 'gopath'}:{DEBIAN_GOPATH}",
        "GOCACHE": str(tmp_path / "gocache"),
        "GOPROXY": "off",
        "GOFLAGS": "",
        "CGO_ENABLED": "0",
    }
    proc = subprocess.run(
        ["go", "build", "-o", str(out), str(DRIVER_SOURCE)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture
def lab_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="flab-c-"))  # short: unix socket paths
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


async def test_add_check_del_del_through_libcni(
    driver: Path, lab_dir: Path, tmp_path: Path, require_root: None, require_bird: None
) -> None:
    plan = LabPlan.make(lab_dir, 1)
    node = plan.nodes[0]
    pod_ns = f"{plan.pod_netns_prefix}libcni"
    try:
        with trio.fail_after(50):
            await up(plan)
            installed = json.loads((node.cni_conf / "01-flock.conflist").read_text())
            assert installed["plugins"][0]["type"] == "flock"
            await trio.run_process(["ip", "netns", "add", pod_ns])
            # The lab installed the default conflist: what every runtime must accept unedited.
            assert installed["cniVersion"] == "1.0.0" and installed["cniVersions"] == ["0.4.0", "1.0.0", "1.1.0"]
            for version in ("1.0.0", "0.4.0"):
                conf_dir = node.cni_conf
                if version != "1.0.0":
                    conf_dir = tmp_path / f"net.d-{version}"
                    conf_dir.mkdir()
                    # An operator pinning the version: the installer, told it.
                    argv = [
                        f"--cni-bin-dir={node.cni_bin}",
                        f"--cni-conf-dir={conf_dir}",
                        f"--socket={installed['plugins'][0]['socket']}",
                        f"--cni-version={version}",
                        "--log-format=text",
                    ]
                    assert installer.main(argv) == 0
                    pinned = {k: v for k, v in installed.items() if k != "cniVersions"}
                    assert json.loads((conf_dir / "01-flock.conflist").read_text()) == {**pinned, "cniVersion": version}
                name = f"libcni-{version.replace('.', '')}"
                await api_client(plan).create(
                    PODS, pod_object("conformance", name, node.name, annotations={"flock.fritzlab.net/ipv4": "true"})
                )
                cache = tmp_path / f"cache-{version}"
                container_id = f"libcni{version.replace('.', '')}c0ffee"

                async def libcni(
                    op: str,
                    *,
                    conf_dir: Path = conf_dir,
                    cache: Path = cache,
                    container_id: str = container_id,
                    name: str = name,
                ) -> dict:
                    argv = [
                        str(driver),
                        "-op",
                        op,
                        "-confdir",
                        str(conf_dir),
                        "-bindir",
                        str(node.cni_bin),
                        "-cachedir",
                        str(cache),
                        "-netns",
                        netns_path(pod_ns),
                        "-id",
                        container_id,
                        "-arg",
                        "IgnoreUnknown=1",
                        "-arg",
                        "K8S_POD_NAMESPACE=conformance",
                        "-arg",
                        f"K8S_POD_NAME={name}",
                    ]
                    proc = await trio.run_process(
                        in_netns(node.netns, argv), capture_stdout=True, capture_stderr=True, check=False
                    )
                    out = json.loads(proc.stdout)
                    assert (proc.returncode == 0) == out["ok"], proc.stderr
                    return out

                added = await libcni("ADD")
                assert added["ok"], added
                result = added["result"]
                assert result["cniVersion"] == "1.0.0"  # libcni parsed the plugin's result and converted it
                ips = {ip["address"]: ip["gateway"] for ip in result["ips"]}
                (ip6,) = [a for a in ips if ":" in a]
                (ip4,) = [a for a in ips if ":" not in a]
                assert ip6.startswith("2001:db8:0:1:") and ip6.endswith("/128") and ips[ip6] == "fe80::1"
                assert ip4.startswith("198.51.100.") and ip4.endswith("/32") and ips[ip4] == "169.254.1.1"
                host_if, pod_if = result["interfaces"]
                assert (pod_if["name"], pod_if["sandbox"]) == ("eth0", netns_path(pod_ns)) and "sandbox" not in host_if
                assert all(len(i["mac"].split(":")) == 6 for i in result["interfaces"])  # libcni parsed them
                assert {ip["interface"] for ip in result["ips"]} == {1}
                in_pod = (
                    await trio.run_process(
                        ["ip", "-n", pod_ns, "-j", "addr", "show", "dev", "eth0"], capture_stdout=True
                    )
                ).stdout
                assert ip6.split("/")[0] in in_pod.decode() and ip4.split("/")[0] in in_pod.decode()

                checked = await libcni("CHECK")
                assert checked["ok"], checked
                # prevResult came from libcni's cache (in the list's version: 0.4.0 adds "version")
                assert [ip["address"] for ip in checked["cachedResult"]["ips"]] == [
                    ip["address"] for ip in result["ips"]
                ]

                deleted = await libcni("DEL")
                assert deleted["ok"] and deleted["cachedResult"] is not None, deleted
                # The pod's interface goes with DEL: for a pod, just after the
                # answer (flock.pods.VethRemovals deletes the veth in the background).
                with trio.fail_after(10):
                    while True:
                        shown = await trio.run_process(
                            ["ip", "-n", pod_ns, "link", "show", "dev", "eth0"],
                            capture_stdout=True,
                            capture_stderr=True,
                            check=False,
                        )
                        if shown.returncode != 0:
                            break
                        await trio.sleep(0.05)  # polling another process (the kernel): no event to wait on
                again = await libcni("DEL")
                assert again["ok"] and "cachedResult" not in again, again  # idempotent, now without prevResult

                # libcni's cache entry went with DEL, so a CHECK now carries no
                # prevResult, which flock refuses precisely.
                orphan = await libcni("CHECK")
                assert not orphan["ok"] and orphan["error"]["code"] == 7 and "prevResult" in orphan["error"]["msg"], (
                    orphan
                )
    finally:
        with trio.move_on_after(30, shield=True):
            await trio.run_process(["ip", "netns", "del", pod_ns], check=False, capture_stderr=True)
            await down(lab_dir)
