"""Debian's podman (4.3, CNI network backend) with its own storage and state
under one directory, run in a node's network namespace.

Global options keep it off the machine's podman: ``--root``/``--runroot``/
``--tmpdir`` under the directory, ``--network-config-dir`` (the CNI config
dir; ``--cni-config-dir`` in older podman) pointing at the node's conf dir,
``--runtime runc`` (crun refuses this host's hybrid cgroup layout) and a
``containers.conf`` (CONTAINERS_CONF) that names the node's CNI plugin dir,
the CNI backend, and lowers the default nofile/nproc rlimits (root here lacks
CAP_SYS_RESOURCE).  Images are imported from a busybox-static root
filesystem (``podman import``): no registry is reachable.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from pathlib import Path

import attrs

from flock.testing.runtimes._containerd import unmount_all
from flock.testing.runtimes._image import IMAGE, write_rootfs


def missing_tools() -> list[str]:
    return [t for t in ("podman", "runc", "conmon", "nsenter") if not shutil.which(t)]


def _limit(kind: int, cap: int) -> str:
    soft, hard = resource.getrlimit(kind)
    hard = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
    soft = hard if soft == resource.RLIM_INFINITY else min(soft, hard)
    return f"{soft}:{hard}"


def containers_conf(cni_bin: Path) -> str:
    # podman's defaults raise nofile and nproc above what root may set here.
    nofile, nproc = _limit(resource.RLIMIT_NOFILE, 1024), _limit(resource.RLIMIT_NPROC, 4096)
    return f"""[containers]
default_ulimits = ["nofile={nofile}", "nproc={nproc}"]

[network]
network_backend = "cni"
cni_plugin_dirs = ["{cni_bin}"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


@attrs.define(eq=False)
class Podman:
    directory: Path
    netns_path: str
    cni_bin: Path
    cni_conf: Path
    image: str = IMAGE

    def setup(self) -> Podman:
        if missing := missing_tools():
            raise RuntimeError(f"podman end-to-end needs {', '.join(missing)}: install Debian's podman and runc")
        for sub in ("root", "runroot", "tmp"):
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        (self.directory / "containers.conf").write_text(containers_conf(self.cni_bin))
        rootfs = write_rootfs(self.directory / "rootfs.tar")
        out = self("import", "--change", "CMD /bin/sh", str(rootfs), self.image)
        if out.returncode != 0:
            raise RuntimeError(f"podman import failed: {out.stderr.strip()}")
        return self

    def argv(self, *args: str) -> list[str]:
        d = self.directory
        return [
            "nsenter",
            f"--net={self.netns_path}",
            "--",
            "podman",
            "--root",
            str(d / "root"),
            "--runroot",
            str(d / "runroot"),
            "--tmpdir",
            str(d / "tmp"),
            "--network-config-dir",
            str(self.cni_conf),
            "--runtime",
            "runc",
            "--cgroup-manager",
            "cgroupfs",
            "--events-backend",
            "file",
            *args,
        ]

    def env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "HOME": str(self.directory),
            "CONTAINERS_CONF": str(self.directory / "containers.conf"),
            "TMPDIR": str(self.directory / "tmp"),
        }

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(*args), env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
        )

    def close(self) -> None:
        """Remove every container (their CNI DEL runs), unmount, delete the directory."""
        self("rm", "--all", "--force", "--time", "0")
        unmount_all(self.directory)
        shutil.rmtree(self.directory, ignore_errors=True)
