"""A node in namespaces for end-to-end pod tests: the fake API server, a "node"
netns (with an uplink) that the real flock-agent process targets with
--host-netns, real bird2 inside it, and the real bundled `flock` plugin.

Nothing touches the host's own interfaces or routes: the agent runs in the
test's namespace context but every kernel change goes to the node netns.
Wall-clock waits poll a condition under one bounded deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from flock.apiserver import NODECONFIGS, ApiServer, nodeconfig_object
from flock.store import SyncStore
from flock.testing.netns import Netns, NetnsPool, netns_pool
from flock.testing.shimrun import Outcome, build, run_plugin

BIN = Path(sys.executable).parent
NODE = "host001"
CIDR6, CIDR4 = "2001:db8:0:1::/64", "198.51.100.0/29"
# Named as in the rendered config, so `configure` keeps the device protocol
# running: a new one would start beside the new kernel protocols, whose first
# scan would then drop routes already in the kernel ("unknown ifindex") until
# the next periodic scan.
BOOTSTRAP_BIRD = "router id 192.0.2.11;\nprotocol device flock_device {}\n"


def wait_for(what: str, condition: Callable[[], Any], seconds: float = 15.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)  # polling a separate process, not a timing assertion
    pytest.fail(f"timed out waiting for {what}")


@attrs.define(eq=False)
class AgentProcess:
    argv: list[str]
    log: Path
    env: dict[str, str]
    proc: subprocess.Popen | None = None

    def start(self) -> AgentProcess:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        return self

    def records(self) -> list[dict]:
        out = []
        for line in self.log.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def health_port(self) -> int | None:
        found = [r["address"] for r in self.records() if r.get("msg") == "health server listening"]
        return int(found[-1].rsplit(":", 1)[1]) if found else None

    def get(self, path: str) -> tuple[int, str]:
        port = wait_for("the health server", self.health_port)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def wait_ready(self) -> None:
        def ready() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
            return self.health_port() is not None and self.get("/readyz")[0] == 200

        wait_for("/readyz", ready, 30)

    def removals_pending(self) -> int:
        """``flock_veth_removals_pending`` from /metrics: DEL'd veths still being deleted."""
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith("flock_veth_removals_pending "):
                return int(float(line.split()[1]))
        raise AssertionError("no flock_veth_removals_pending on /metrics")

    def settle(self) -> None:
        """Wait until the agent (if running) has no veth removal pending: DEL
        answers before the kernel has deleted the veth (flock.pods.VethRemovals)."""
        if self.proc is not None and self.proc.poll() is None and self.health_port() is not None:
            wait_for("the agent's pending veth removals", lambda: self.removals_pending() == 0, 30)

    def kill(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(timeout=10)

    def wait_exit(self) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=30)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=10)


@attrs.define(eq=False)
class Lab:
    tmp: Path
    pool: NetnsPool
    api: ApiServer
    bird: bool = True
    node: Netns = attrs.field(init=False)
    up: Netns = attrs.field(init=False)  # the node's uplink neighbour ("uplink" ↔ its eth0; no address of its own)
    plugin: list[str] = attrs.field(init=False)
    _bird_proc: subprocess.Popen | None = attrs.field(init=False, default=None)
    _agents: list[AgentProcess] = attrs.field(init=False, factory=list)

    def __attrs_post_init__(self) -> None:
        self.node = self.pool.create("node")
        self.up = up = self.pool.create("up")
        self.pool.veth(self.node, "uplink", up, "eth0")
        self.node.ip("addr", "add", "192.0.2.1/24", "dev", "uplink")
        self.plugin = build(self.tmp, pending_deletes=str(self.socket.parent / "pending-deletes"))
        self.api.create(
            NODECONFIGS,
            nodeconfig_object(
                NODE,
                CIDR6,
                cidr4=CIDR4,
                announceRanges=["2001:db8:8000::/33", "203.0.113.0/24"],
                bgp={
                    "asn": 64512,
                    "routerID": "192.0.2.11",
                    "peers": [{"name": "tor1", "address": "2001:db8:ffff::1", "asn": 64500}],
                },
            ),
        )
        self.api.write_kubeconfig(self.tmp / "kubeconfig")
        if self.bird:
            self.bird_config.parent.mkdir(parents=True, exist_ok=True)
            self.bird_config.write_text(BOOTSTRAP_BIRD)
            self.start_bird()

    def start_bird(self) -> None:
        """Run bird2 in the node netns on whatever config is on disk."""
        with open(self.tmp / "bird.log", "ab") as log:
            # `ip netns exec` execs bird in place, so the pid we kill is bird's.
            self._bird_proc = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    self.node.name,
                    "bird",
                    "-f",
                    "-c",
                    str(self.bird_config),
                    "-s",
                    str(self.bird_socket),
                ],
                stdout=log,
                stderr=log,
            )
        wait_for("bird's control socket", self.bird_socket.exists)

    def stop_bird(self) -> None:
        assert self._bird_proc is not None
        self._bird_proc.kill()
        self._bird_proc.wait(timeout=10)
        self._bird_proc = None
        self.bird_socket.unlink(missing_ok=True)

    @property
    def socket(self) -> Path:
        return self.tmp / "run" / "flock.sock"

    @property
    def state_dir(self) -> Path:
        return self.tmp / "state"

    @property
    def bird_config(self) -> Path:
        return self.tmp / "bird" / "bird.conf"

    @property
    def bird_socket(self) -> Path:
        return self.tmp / "bird.ctl"

    def agent(self, *, prefix: Sequence[str] = (), **env: str) -> AgentProcess:
        """Start flock-agent (run by *prefix*, e.g. ``unshare -m sh -c '…; exec "$@"' sh``)."""
        argv = [
            *prefix,
            str(BIN / "flock-agent"),
            "--node",
            NODE,
            "--socket",
            str(self.socket),
            "--state-dir",
            str(self.state_dir),
            "--kubeconfig",
            str(self.tmp / "kubeconfig"),
            "--health-address",
            "127.0.0.1:0",
            "--host-netns",
            self.node.path,
            "--uplink",
            "uplink",
            "--bgp-lab-timers",
            *(
                ["--bird-config", str(self.bird_config), "--bird-socket", str(self.bird_socket)]
                if self.bird
                else ["--no-bird"]
            ),
        ]
        log = self.tmp / f"agent-{len(self._agents)}.log"
        agent = AgentProcess(argv, log, {**os.environ, **env}).start()
        self._agents.append(agent)
        return agent

    def cni(
        self,
        command: str,
        container_id: str = "",
        netns: Netns | None = None,
        pod: str = "",
        namespace: str = "default",
        if_name: str = "eth0",
        netns_path: str | None = None,
        **config: Any,
    ) -> Outcome:
        """Run the plugin; *netns_path* names CNI_NETNS directly (any path, for bad-input tests)."""
        env = {"CNI_CONTAINERID": container_id, "CNI_IFNAME": if_name, "CNI_PATH": "/opt/cni/bin"}
        if netns is not None:
            env["CNI_NETNS"] = netns.path
        if netns_path is not None:
            env["CNI_NETNS"] = netns_path
        if pod:
            env["CNI_ARGS"] = f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod}"
        conf = {"cniVersion": "1.1.0", "name": "flock-net", "type": "flock", "socket": str(self.socket), **config}
        return run_plugin(self.plugin, command, conf, self.tmp, **{k: v for k, v in env.items() if v})

    def flockctl(self, *args: str, timeout: float = 60) -> tuple[int, str, dict]:
        """The installed ``flockctl *args*`` on this lab's agent, as an operator runs it, and again with
        ``--json``: (exit code, text, the JSON document; {} when it printed none)."""
        run = [str(BIN / "flockctl"), *args, "--socket", str(self.socket.parent / "admin.sock")]
        env = {k: v for k, v in os.environ.items() if k != "FLOCK_ADMIN_SOCKET"}
        text = subprocess.run(run, capture_output=True, text=True, timeout=timeout, env=env)
        as_json = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=timeout, env=env)
        assert as_json.returncode == text.returncode, (text, as_json)
        return text.returncode, text.stdout + text.stderr, json.loads(as_json.stdout) if as_json.stdout else {}

    def rows(self) -> dict[str, Any]:
        store = SyncStore.open(self.state_dir)
        try:
            return {a.container_id: a for a in store.list()}
        finally:
            store.close()

    def settle(self) -> None:
        """Wait for the running agents' background veth removals (see :meth:`AgentProcess.settle`)."""
        for agent in self._agents:
            agent.settle()

    def flock_links(self) -> set[str]:
        """flock's host veths on the node, once the agent's pending removals are done."""
        self.settle()
        return {
            line.split(":")[1].strip().split("@")[0]
            for line in self.node.ip("-o", "link", "show").splitlines()
            if line.split(":")[1].strip().startswith("flock")
        }

    def flock_routes(self) -> list[str]:
        """flock's own routes on the node, blackholes for the node blocks excepted
        (once the agent's pending veth removals are done)."""
        self.settle()
        out = self.node.ip("-6", "route", "show", "proto", "70") + self.node.ip("-4", "route", "show", "proto", "70")
        return sorted(line.strip() for line in out.splitlines() if line.strip() and not line.startswith("blackhole"))

    def birdc(self, *args: str) -> str:
        return subprocess.run(
            ["birdc", "-s", str(self.bird_socket), *args], capture_output=True, text=True, timeout=10
        ).stdout

    def close(self) -> None:
        for agent in self._agents:
            if agent.proc is not None and agent.proc.poll() is None:
                agent.kill()
        if self._bird_proc is not None:
            self.stop_bird()


@contextlib.contextmanager
def open_lab(tmp_path: Path, prefix: str, *, bird: bool = True) -> Iterator[Lab]:
    """A node namespace pool, a fake API server and a :class:`Lab` on them, all closed after."""
    with netns_pool(prefix) as pool, ApiServer() as api:
        lab = Lab(tmp_path, pool, api, bird=bird)
        try:
            yield lab
        finally:
            lab.close()
