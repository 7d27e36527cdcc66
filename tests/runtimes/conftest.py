"""One node (flock.testing.agentlab: fake API server, node netns, real agent,
the shim and default conflist installed by flock-install-cni) shared by the
module's runtime tests, which are slow to set up."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from flock import installer
from flock.apiserver import NODECONFIGS
from flock.testing.agentlab import NODE, AgentProcess, Lab, open_lab


@attrs.define(eq=False)
class RuntimeNode:
    lab: Lab
    agent: AgentProcess
    cni_bin: Path
    cni_conf: Path

    def restart_agent(self) -> AgentProcess:
        self.agent = self.lab.agent()
        self.agent.wait_ready()
        return self.agent


def require(*tools: str) -> None:
    if os.geteuid() != 0:
        pytest.fail("the runtime end-to-end tests need root; CI runs as root")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: scripts/bootstrap installs Debian's containerd, runc, podman")


@pytest.fixture(scope="module")
def runtime_node(request: pytest.FixtureRequest) -> Iterator[RuntimeNode]:
    """A node with flock installed as a runtime finds it (plugin + default conflist).

    A test module's ``NODE_FAMILIES`` (e.g. ``{"ipv6": True, "ipv4": True}``) becomes the NodeConfig's
    ``spec.families`` before the agent starts: the address families of containers that have no
    Kubernetes pod to annotate (podman's)."""
    require("nsenter", "ip")
    families = getattr(request.module, "NODE_FAMILIES", None)
    tmp = Path(tempfile.mkdtemp(prefix="fl-rt-"))  # short: unix socket paths
    try:
        with open_lab(tmp, "fl-rt-", bird=False) as lab:
            if families is not None:
                lab.api.patch(NODECONFIGS, NODE, {"spec": {"families": families}})
            cni_bin, cni_conf = tmp / "cni" / "bin", tmp / "cni" / "net.d"
            installer.install(installer.InstallConfig(bin_dir=cni_bin, conf_dir=cni_conf, socket=str(lab.socket)))
            agent = lab.agent()
            agent.wait_ready()
            yield RuntimeNode(lab, agent, cni_bin, cni_conf)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
