"""Run the CNI plugin the way a container runtime does: env + stdin, read stdout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import attrs

from flock.shim_bundle import build_shim


@attrs.frozen
class Outcome:
    status: int
    stdout: str
    stderr: str

    @property
    def json(self) -> dict:
        return json.loads(self.stdout)

    @property
    def code(self) -> int | None:
        return self.json.get("code") if self.status else None


def build(tmp: Path, pending_deletes: str | None = None) -> list[str]:
    """Build the bundled shim into *tmp*; the argv that runs it with no flock on sys.path.
    *pending_deletes*: its journal directory, as the installer bakes it in."""
    dest = tmp / "flock"
    build_shim(dest, python=f"{sys.executable} -IS", pending_deletes=pending_deletes)
    return [str(dest)]


def run_plugin(argv: list[str], command: str, config: dict | bytes, cwd: Path, **env: str) -> Outcome:
    stdin = config if isinstance(config, bytes) else json.dumps(config).encode()
    full_env = {"CNI_COMMAND": command, "PATH": "/usr/bin:/bin", **env}
    proc = subprocess.run(argv, input=stdin, env=full_env, cwd=cwd, capture_output=True, timeout=30)
    return Outcome(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def pod_env(container_id: str = "c0ffee01", **extra: str) -> dict[str, str]:
    return {
        "CNI_CONTAINERID": container_id,
        "CNI_NETNS": "/var/run/netns/test",
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": "K8S_POD_NAMESPACE=prod;K8S_POD_NAME=web-0",
        "CNI_PATH": "/opt/cni/bin",
        **extra,
    }
