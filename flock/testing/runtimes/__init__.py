"""Real container runtimes for end-to-end tests and benchmarks: images built
from Debian's busybox-static, containerd (CRI) and podman with their own
directories, and a minimal CRI v1 client."""

from flock.testing.runtimes._containerd import Containerd, missing_tools, running_containerd, unmount_all
from flock.testing.runtimes._cri import CriClient, CriPortMapping, SandboxStatus, cri_modules
from flock.testing.runtimes._image import IMAGE, rootfs_tar, write_docker_archive, write_rootfs
from flock.testing.runtimes._podman import Podman

__all__ = [
    "IMAGE",
    "Containerd",
    "CriClient",
    "CriPortMapping",
    "Podman",
    "SandboxStatus",
    "cri_modules",
    "missing_tools",
    "rootfs_tar",
    "running_containerd",
    "unmount_all",
    "write_docker_archive",
    "write_rootfs",
]
