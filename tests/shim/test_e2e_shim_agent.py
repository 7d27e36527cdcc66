"""End to end: the real `flock` plugin executable against a real `flock-agent` process."""

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flock.testing.shimrun import build, pod_env, run_plugin

BIN = Path(sys.executable).parent


class AgentProcess:
    def __init__(self, tmp: Path):
        self.socket = tmp / "run" / "flock.sock"
        self.log = tmp / "agent.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    str(BIN / "flock-agent"),
                    "--node",
                    "host001",
                    "--socket",
                    str(self.socket),
                    "--state-dir",
                    str(tmp / "state"),
                    "--health-address",
                    "127.0.0.1:0",
                    "--no-bird",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait_serving()

    def _wait_serving(self):
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(self.socket))
                    return
            except OSError:
                time.sleep(0.02)  # start-up poll of a separate process, not a timing assertion
        pytest.fail("flock-agent did not start serving:\n" + self.log.read_text())

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    a = AgentProcess(tmp_path_factory.mktemp("agent"))
    yield a
    assert a.stop() == 0


@pytest.fixture(scope="module", params=["console-script", "bundle"])
def plugin(request, tmp_path_factory):
    if request.param == "console-script":
        return [str(BIN / "flock")]
    return build(tmp_path_factory.mktemp("bundle"))


def cfg(sock, version="1.1.0"):
    return {"cniVersion": version, "name": "flock-net", "type": "flock", "socket": str(sock)}


def test_every_op_against_a_running_agent(agent, plugin, tmp_path, pod_netns_path):
    def run(command, version="1.1.0", **env):
        if "CNI_NETNS" in env:
            env["CNI_NETNS"] = pod_netns_path
        return run_plugin(plugin, command, cfg(agent.socket, version), tmp_path, **env)

    add = run("ADD", **pod_env())
    assert (add.status, add.code, add.json["msg"]) == (1, 11, "agent not ready")
    assert add.json["cniVersion"] == "1.1.0"
    out = run("DEL", version="1.0.0", **pod_env())
    assert (out.status, out.stdout) == (0, ""), out
    # CHECK needs prevResult and GC its valid-attachments (flock.pods); without them: code 7 naming the field.
    for command, field in (("CHECK", "prevResult"), ("GC", "cni.dev/valid-attachments")):
        out = run(command, version="1.0.0" if command != "GC" else "1.1.0", **pod_env())
        assert (out.status, out.code) == (1, 7) and field in out.json["details"], (command, out)
    status = run("STATUS")
    assert (status.status, status.code, status.json["msg"]) == (1, 50, "agent not ready")
    version = run("VERSION", version="0.3.1")
    assert version.status == 0 and version.json["cniVersion"] == "0.3.1"
    bad_version = run("ADD", version="0.2.0", **pod_env())
    assert bad_version.code == 1
    no_id = run("ADD", **{k: v for k, v in pod_env().items() if k != "CNI_CONTAINERID"})
    assert no_id.code == 4 and "CNI_CONTAINERID" in no_id.json["details"]
    assert agent.proc.poll() is None
    assert not (agent.socket.parent / "pending-deletes").exists()


def flood(path: Path, nbytes: int) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(path))
        try:
            s.sendall(b"\x00garbage" * (nbytes // 8))
            s.recv(4096)
        except OSError:
            pass  # the agent hangs up on a flood; that is the point


def test_garbage_and_a_silent_client_do_not_stop_the_agent(agent, plugin, tmp_path):
    silent = socket.socket(socket.AF_UNIX)
    silent.connect(str(agent.socket))
    try:
        flood(agent.socket, 2 << 20)
        with socket.socket(socket.AF_UNIX) as half:
            half.connect(str(agent.socket))
            half.sendall(b'{"version": 1, "op": "A')
        for _ in range(3):
            out = run_plugin(plugin, "STATUS", cfg(agent.socket), tmp_path)
            assert (out.code, out.json["msg"]) == (50, "agent not ready")
        out = run_plugin(plugin, "DEL", cfg(agent.socket), tmp_path, **pod_env())
        assert out.status == 0
    finally:
        silent.close()
    assert agent.proc.poll() is None


def test_agent_down(plugin, tmp_path, pod_netns_path):
    a = AgentProcess(tmp_path)
    assert a.stop() == 0
    assert not a.socket.exists()
    add = run_plugin(plugin, "ADD", cfg(a.socket), tmp_path, **pod_env(CNI_NETNS=pod_netns_path))
    assert (add.code, add.json["msg"]) == (11, "flock-agent is not reachable")
    status = run_plugin(plugin, "STATUS", cfg(a.socket), tmp_path)
    assert status.code == 50
    journal = str(a.socket.parent / "pending-deletes")
    dele = run_plugin(plugin, "DEL", cfg(a.socket), tmp_path, **pod_env("feedface", FLOCK_PENDING_DELETES=journal))
    assert (dele.status, dele.stdout) == (0, "")
    recorded = json.loads((a.socket.parent / "pending-deletes" / "feedface.json").read_bytes())
    assert (recorded["op"], recorded["containerID"], recorded["ifName"]) == ("DEL", "feedface", "eth0")


def test_sigterm_under_load_exits_0_and_removes_the_socket(tmp_path):
    a = AgentProcess(tmp_path)
    stop = threading.Event()
    answered = []
    request = json.dumps({"version": 1, "op": "STATUS", "config": {"cniVersion": "1.1.0"}}).encode() + b"\n"

    def load():
        while not stop.is_set():
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.settimeout(5)
                    s.connect(str(a.socket))
                    s.sendall(request)
                    if s.recv(4096):
                        answered.append(1)
            except OSError:
                pass

    silent = []
    for _ in range(5):
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(a.socket))
        silent.append(s)
    workers = [threading.Thread(target=load) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        while len(answered) < 50:
            assert a.proc.poll() is None
            time.sleep(0.01)
        a.proc.send_signal(signal.SIGTERM)
        # Bounds a hang, not speed (the drain itself is bounded in virtual-time tests): a loaded
        # 2-core machine has taken over 3 s here.
        status = a.proc.wait(timeout=20)
    finally:
        if a.proc.poll() is None:
            a.proc.kill()
            a.proc.wait()
        stop.set()
        for w in workers:
            w.join()
        for s in silent:
            s.close()
    assert status == 0, a.log.read_text()
    assert not a.socket.exists()
    assert "drained" in a.log.read_text()


def host_pythons() -> list[str]:
    """Every CPython 3.8+ on this machine (at least the one running the tests)."""
    found = {os.path.realpath(sys.executable)}
    for pattern in ("/usr/bin/python3.*", "/usr/local/bin/python3.*", "/root/.pyenv/versions/3.*/bin/python3"):
        for path in glob.glob(pattern):
            if os.access(path, os.X_OK) and not path.endswith("-config"):
                found.add(os.path.realpath(path))
    usable = []
    for path in sorted(found):
        probe = subprocess.run(
            [path, "-I", "-S", "-c", "import sys; print(sys.version_info >= (3, 8))"], capture_output=True, text=True
        )
        if probe.stdout.strip() == "True":
            usable.append(path)
    return usable


def test_bundle_talks_to_the_agent_under_every_host_python(agent, tmp_path):
    bundle = build(tmp_path)[0]
    pythons = host_pythons()
    assert pythons
    for python in pythons:
        status = run_plugin([python, "-I", "-S", bundle], "STATUS", cfg(agent.socket), tmp_path)
        assert (status.code, status.json["msg"]) == (50, "agent not ready"), (python, status)
        dele = run_plugin([python, "-I", "-S", bundle], "DEL", cfg(agent.socket, "0.3.0"), tmp_path, **pod_env())
        assert (dele.status, dele.stdout, dele.stderr) == (0, "", ""), (python, dele)
