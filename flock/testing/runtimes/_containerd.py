"""Debian's containerd (1.6, CRI plugin built in) with everything of its own
under one directory: root, state, sockets, config, log.

It runs in a node's network namespace (``nsenter --net``, the mount namespace
stays the host's), so the CNI plugin it execs configures that node, and the
pod network namespaces it mounts under its state dir
(``netns_mounts_under_state_dir``) are visible to the flock agent.  Its CNI
dirs are the node's: the installed ``flock`` plugin and conflist, with
Debian's ``loopback`` copied next to the plugin (containerd 1.6 runs
loopback from its single ``bin_dir``).

Settings this machine needs (see docs/runtimes.md): ``restrict_oom_score_adj``
(root here lacks CAP_SYS_RESOURCE), ``ip_pref = "ipv6"`` (containerd reports
IPv4 as the primary pod IP otherwise), the stream server on port 0.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import attrs

from flock.testing.runtimes._cri import CriClient
from flock.testing.runtimes._image import IMAGE, write_docker_archive

DEBIAN_LOOPBACK = Path("/usr/lib/cni/loopback")
NAMESPACE = "k8s.io"


def missing_tools() -> list[str]:
    return [t for t in ("containerd", "ctr", "runc", "containerd-shim-runc-v2", "nsenter") if not shutil.which(t)]


def config_toml(directory: Path, cni_bin: Path, cni_conf: Path, sandbox_image: str, ip_pref: str) -> str:
    d = directory
    return f"""version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
    max_conf_num = 1
    ip_pref = "{ip_pref}"
"""


def _mounts_under(directory: Path) -> list[str]:
    prefix = str(directory) + "/"
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            target = line.split()[4].replace("\\040", " ")
            if target.startswith(prefix):
                out.append(target)
    return out


def unmount_all(directory: Path) -> None:
    """Unmount whatever a runtime left mounted under *directory* (deepest first)."""
    for target in sorted(_mounts_under(directory), key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)


@attrs.define(eq=False)
class Containerd:
    """One containerd; :meth:`start` returns when its CRI answers ``Version``."""

    directory: Path
    netns_path: str
    cni_bin: Path
    cni_conf: Path
    ip_pref: str = "ipv6"
    image: str = IMAGE
    proc: subprocess.Popen | None = attrs.field(init=False, default=None)
    cri: CriClient | None = attrs.field(init=False, default=None)

    @property
    def socket(self) -> Path:
        return self.directory / "containerd.sock"

    @property
    def log(self) -> Path:
        return self.directory / "containerd.log"

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""

    def start(self, deadline_s: float = 60.0) -> Containerd:
        if missing := missing_tools():
            raise RuntimeError(
                f"containerd end-to-end needs {', '.join(missing)}: install Debian's containerd and runc"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        if DEBIAN_LOOPBACK.exists() and not (self.cni_bin / "loopback").exists():
            shutil.copy2(DEBIAN_LOOPBACK, self.cni_bin / "loopback")
        config = self.directory / "config.toml"
        config.write_text(config_toml(self.directory, self.cni_bin, self.cni_conf, self.image, self.ip_pref))
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                ["nsenter", f"--net={self.netns_path}", "--", "containerd", "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.cri = CriClient(self.socket, timeout=60)
        deadline = time.monotonic() + deadline_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"containerd exited with {self.proc.returncode}: {self.log_tail()}")
            if self.socket.exists():
                try:
                    self.cri.version()
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
            if time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not answer within {deadline_s:g} s: {self.log_tail()}")
            time.sleep(0.1)
        self.import_image()
        return self

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", NAMESPACE, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def import_image(self) -> None:
        archive = write_docker_archive(self.directory / "busybox.tar", self.image)
        out = self.ctr("images", "import", "--snapshotter", "overlayfs", str(archive))
        if out.returncode != 0:
            raise RuntimeError(f"ctr images import failed: {out.stderr.strip()}")

    def remove_sandboxes(self) -> list[str]:
        """Stop and remove every sandbox still there (a failed test's: their pause processes and shims
        would outlive containerd); the IDs of those that would not go."""
        assert self.cri is not None
        stuck = []
        for sid in self.cri.list_pod_sandboxes():
            try:
                self.cri.stop_pod_sandbox(sid)
                self.cri.remove_pod_sandbox(sid)
            except Exception:
                stuck.append(sid)
        return stuck

    def stop(self) -> None:
        """Remove the sandboxes left, stop containerd, unmount what it left, remove its directory."""
        if self.cri is not None:
            if self.proc is not None and self.proc.poll() is None:
                with contextlib.suppress(Exception):
                    self.remove_sandboxes()
            self.cri.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        unmount_all(self.directory)
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def running_containerd(
    directory: Path, netns_path: str, cni_bin: Path, cni_conf: Path, **kw: str
) -> Iterator[Containerd]:
    c = Containerd(directory, netns_path, cni_bin, cni_conf, **kw)
    try:
        yield c.start()
    finally:
        c.stop()
