"""Starting and stopping a lab pod's port server (:mod:`flock.lab._serve`) in its namespace.

The server is spawned directly (``posix_spawn``, its own session, no Popen
object left behind) and identified afterwards by PID and start time, so a
later ``flock-lab pod del`` — another process — stops exactly it; ``down``
stops whatever still runs in the lab's namespaces anyway.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from flock.lab._nsio import netns_path
from flock.lab._ports import PortSpec
from flock.lab._procs import ProcRef, is_running, proc_ref, reap_if_child, signal_if_running
from flock.lab._state import LabError

READY_WAIT_S = 10.0
STOP_WAIT_S = 5.0


def _spawn(argv: list[str], log: Path) -> int:
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
    }
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    return os.posix_spawn(argv[0], argv, env, file_actions=actions, setsid=True)


async def start_server(netns: str, name: str, ports: Sequence[PortSpec], base: Path) -> ProcRef:
    """Run the server for *ports* in *netns*; returns once every port is bound."""
    ip = shutil.which("ip")
    if ip is None:
        raise LabError("ip not found: run scripts/bootstrap (iproute2)")
    if not await trio.Path(netns_path(netns)).exists():
        raise LabError(f"network namespace {netns} does not exist")
    ready, log = base.with_name(base.name + ".ready"), base.with_name(base.name + ".log")
    ready.unlink(missing_ok=True)
    argv = [ip, "netns", "exec", netns, sys.executable, "-m", "flock.lab._serve", "--name", name, "--ready", str(ready)]
    for port in ports:
        argv += [f"--{port.protocol.lower()}", str(port.port)]
    pid = _spawn(argv, log)
    ref = proc_ref(pid)
    with trio.move_on_after(READY_WAIT_S):
        # `ip netns exec` execs the server in place: the PID stays the server's.
        while not ready.exists():
            if ref is None or not is_running(ref):
                reap_if_child(pid)
                raise LabError(f"the port server of {name} exited: {log.read_text(errors='replace').strip()[-500:]}")
            await trio.sleep(0.01)
        ref = proc_ref(pid)
        if ref is None:
            raise LabError(f"the port server of {name} exited right after binding; see {log}")
        return ref
    if ref is not None:
        await stop_server(ref)
    raise LabError(f"the port server of {name} did not bind its ports within {READY_WAIT_S:g} s; see {log}")


async def stop_server(ref: ProcRef) -> None:
    """SIGTERM, then SIGKILL after a grace period; reaped if it is our child."""
    if not signal_if_running(ref, signal.SIGTERM):
        reap_if_child(ref.pid)
        return
    with trio.move_on_after(STOP_WAIT_S):
        while is_running(ref):
            reap_if_child(ref.pid)
            await trio.sleep(0.01)
    if signal_if_running(ref, signal.SIGKILL):
        await trio.sleep(0.05)
    reap_if_child(ref.pid)
