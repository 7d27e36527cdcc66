"""Container images built here from Debian's busybox-static (no registry is reachable).

One static binary, ``/bin/busybox``, with its applets as symlinks: enough for
a sandbox ("pause") process and for a podman container that pings.  Two
forms: a root filesystem tarball (``podman import``) and a docker-archive
(``ctr images import``), both written byte-stable.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "sleep", "ping", "ip", "cat", "true", "hostname")
IMAGE = "flock.test/busybox:1"
# The sandbox process: sleeps until killed (containerd stops a sandbox with SIGKILL).
PAUSE_CMD = ("/bin/sleep", "2147483647")


def _dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    tar.addfile(info)


def rootfs_tar() -> bytes:
    """The root filesystem as an uncompressed tar (one layer)."""
    if not BUSYBOX.is_file():
        raise FileNotFoundError(f"{BUSYBOX} missing: install Debian's busybox-static (scripts/bootstrap does)")
    data = BUSYBOX.read_bytes()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "dev", "etc", "proc", "sys", "tmp", "run"):
            _dir(tar, d)
        info = tarfile.TarInfo("bin/busybox")
        info.mode, info.size = 0o755, len(data)
        tar.addfile(info, io.BytesIO(data))
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname, link.mode = tarfile.SYMTYPE, "busybox", 0o777
            tar.addfile(link)
        for name, text in (("etc/passwd", "root:x:0:0:root:/:/bin/sh\n"), ("etc/group", "root:x:0:\n")):
            body = text.encode()
            info = tarfile.TarInfo(name)
            info.mode, info.size = 0o644, len(body)
            tar.addfile(info, io.BytesIO(body))
    return out.getvalue()


def write_rootfs(dest: Path) -> Path:
    dest.write_bytes(rootfs_tar())
    return dest


def write_docker_archive(dest: Path, name: str = IMAGE, cmd: Sequence[str] = PAUSE_CMD) -> Path:
    """A docker-archive (``docker save`` layout) of the busybox image tagged *name*."""
    layer = rootfs_tar()
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Cmd": list(cmd), "Env": ["PATH=/bin"], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        },
        sort_keys=True,
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_dir = diff_id.split(":")[1]
    manifest = json.dumps([{"Config": config_name, "RepoTags": [name], "Layers": [f"{layer_dir}/layer.tar"]}]).encode()
    with tarfile.open(dest, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _dir(tar, layer_dir)
        for member, body in ((f"{layer_dir}/layer.tar", layer), (config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(member)
            info.mode, info.size = 0o644, len(body)
            tar.addfile(info, io.BytesIO(body))
    return dest
