"""The lab's process keeper: the parent of every long-running lab process.

``flock-lab up`` starts it detached (``python -m flock.lab.keeper SPEC``); it
forks once so that it is nobody's child but init's, then starts every process
of the spec, each in its node's namespace (``ip netns exec`` runs the program
in place, so the PID it records is the program's own).

Error handling: a process that exits while the lab is up is restarted after a
backoff (0.5 s doubling to 5 s), as a kubelet restarts a container, and its
restart count goes up; nothing else is retried.  A process with probes (the
image lab's containers, see :class:`ProbeSpec`) is polled as a kubelet polls
a container: readiness is recorded, and ``failure_threshold`` failed liveness
probes in a row terminate it, so it is restarted like a crashed one.  SIGTERM stops the lab: every
process gets SIGTERM (last started first), those still there after
``STOP_GRACE_S`` get SIGKILL, and each is reaped before the keeper exits 0.

The status file (``procs.json`` next to the spec, replaced atomically after
every change) holds ``{"keeper": {pid, start_time}, "stopping": bool,
"processes": {name: {pid, start_time, restarts, running, ready, argv, log}}}``
(``ready``: the readiness probe's verdict, None without one).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import trio

from flock.lab._nsio import http_in
from flock.lab._procs import proc_ref

STOP_GRACE_S = 8.0
RESTART_DELAY_S = 0.5
RESTART_DELAY_MAX_S = 5.0


@attrs.frozen
class ProbeSpec:
    """A kubelet probe: an HTTP GET from inside *netns* (2xx/3xx passes) or a
    command (exit 0 passes), every *period* seconds after *initial_delay*."""

    http: tuple[str, str, int, str] | None = None  # (netns, host, port, path)
    argv: tuple[str, ...] | None = None
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    failure_threshold: int = 3
    success_threshold: int = 1

    @classmethod
    def from_json(cls, obj: dict[str, Any] | None) -> ProbeSpec | None:
        if obj is None:
            return None
        http, argv = obj.get("http"), obj.get("argv")
        return cls(
            **{**obj, "http": None if http is None else tuple(http), "argv": None if argv is None else tuple(argv)}
        )

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    async def passes(self) -> bool:
        with trio.move_on_after(self.timeout):
            if self.http is not None:
                netns, host, port, path = self.http
                try:
                    status, _ = await trio.to_thread.run_sync(
                        http_in, netns, host, port, "GET", path, None, self.timeout, abandon_on_cancel=True
                    )
                except OSError:
                    return False
                return 200 <= status < 400
            if self.argv is not None:
                proc = await trio.run_process(
                    list(self.argv), stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, check=False
                )
                return proc.returncode == 0
        return False


@attrs.frozen
class ProcessSpec:
    name: str
    argv: tuple[str, ...]
    log: Path
    env: dict[str, str] | None = attrs.field(default=None, hash=False)
    liveness: ProbeSpec | None = None
    readiness: ProbeSpec | None = None
    pre_stop: tuple[str, ...] | None = None  # run to completion (bounded by the grace) before SIGTERM

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ProcessSpec:
        return cls(
            obj["name"],
            tuple(obj["argv"]),
            Path(obj["log"]),
            obj.get("env"),
            ProbeSpec.from_json(obj.get("liveness")),
            ProbeSpec.from_json(obj.get("readiness")),
            None if obj.get("pre_stop") is None else tuple(obj["pre_stop"]),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "argv": list(self.argv),
            "log": str(self.log),
            "env": self.env,
            "liveness": None if self.liveness is None else self.liveness.to_json(),
            "readiness": None if self.readiness is None else self.readiness.to_json(),
            "pre_stop": None if self.pre_stop is None else list(self.pre_stop),
        }


@attrs.define(eq=False)
class Keeper:
    specs: tuple[ProcessSpec, ...]
    status_file: Path
    stop_grace: float = STOP_GRACE_S
    _stop_requested: trio.Event = attrs.field(init=False, factory=trio.Event)
    _procs: dict[str, trio.Process] = attrs.field(init=False, factory=dict)
    _restarts: dict[str, int] = attrs.field(init=False, factory=dict)
    _ready: dict[str, bool] = attrs.field(init=False, factory=dict)
    _stopping: bool = attrs.field(init=False, default=False)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every process, keep them running until SIGTERM/SIGINT or :meth:`request_stop`,
        then stop and reap them all."""
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                for spec in self.specs:
                    await nursery.start(self._keep, spec)
                self._write_status()
                nursery.start_soon(self._stop_on_signal, signals)
                task_status.started()
                await self._stop_requested.wait()
                await self._stop_all()
                nursery.cancel_scope.cancel()  # the signal watcher

    def request_stop(self) -> None:
        self._stop_requested.set()

    @property
    def restarts(self) -> dict[str, int]:
        return dict(self._restarts)

    async def _stop_on_signal(self, signals: AsyncIterator[int]) -> None:
        async for _ in signals:
            self.request_stop()
            return

    async def _keep(self, spec: ProcessSpec, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        delay = RESTART_DELAY_S
        self._restarts[spec.name] = 0
        while True:
            async with await trio.open_file(spec.log, "ab") as log:
                proc = await trio.lowlevel.open_process(
                    list(spec.argv), stdin=subprocess.DEVNULL, stdout=log.wrapped, stderr=log.wrapped, env=spec.env
                )
            self._procs[spec.name] = proc
            self._ready.pop(spec.name, None)
            self._write_status()
            task_status.started()
            task_status = trio.TASK_STATUS_IGNORED
            async with trio.open_nursery() as probes:
                if spec.readiness is not None:
                    probes.start_soon(self._poll_readiness, spec.name, spec.readiness)
                if spec.liveness is not None:
                    probes.start_soon(self._poll_liveness, spec.name, spec.liveness, proc)
                status = await proc.wait()
                probes.cancel_scope.cancel()
            self._ready.pop(spec.name, None)
            self._write_status()
            if self._stopping:
                return
            print(json.dumps({"event": "exited", "name": spec.name, "pid": proc.pid, "status": status}), flush=True)
            await trio.sleep(delay)
            delay = min(delay * 2, RESTART_DELAY_MAX_S)
            if self._stopping:
                return
            self._restarts[spec.name] += 1

    async def _poll_readiness(self, name: str, probe: ProbeSpec) -> None:
        """Not ready until *success_threshold* passes in a row; not ready again after
        *failure_threshold* failures in a row (the kubelet's readiness rule)."""
        self._ready[name] = False
        self._write_status()
        await trio.sleep(probe.initial_delay)
        passed = failed = 0
        while True:
            if await probe.passes():
                passed, failed = passed + 1, 0
                if passed >= probe.success_threshold and not self._ready[name]:
                    self._ready[name] = True
                    self._write_status()
            else:
                passed, failed = 0, failed + 1
                if failed >= probe.failure_threshold and self._ready[name]:
                    self._ready[name] = False
                    self._write_status()
            await trio.sleep(probe.period)

    async def _poll_liveness(self, name: str, probe: ProbeSpec, proc: trio.Process) -> None:
        """*failure_threshold* failures in a row: terminate *proc*; :meth:`_keep` restarts it."""
        await trio.sleep(probe.initial_delay)
        failed = 0
        while True:
            failed = 0 if await probe.passes() else failed + 1
            if failed >= probe.failure_threshold:
                print(json.dumps({"event": "liveness-failed", "name": name, "pid": proc.pid}), flush=True)
                proc.terminate()
                return
            await trio.sleep(probe.period)

    async def _run_hook(self, argv: tuple[str, ...]) -> None:
        proc = await trio.run_process(
            list(argv), stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, check=False
        )
        print(json.dumps({"event": "pre-stop", "argv": list(argv), "status": proc.returncode}), flush=True)

    async def _stop_all(self) -> None:
        self._stopping = True
        self._write_status()
        procs = [p for p in reversed(list(self._procs.values())) if p.returncode is None]
        hooks = [s.pre_stop for s in self.specs if s.pre_stop is not None and s.name in self._procs]
        with trio.move_on_after(self.stop_grace):
            # As a kubelet runs preStop hooks: before the signal, within the grace period.
            async with trio.open_nursery() as nursery:
                for argv in hooks:
                    nursery.start_soon(self._run_hook, argv)
        for proc in procs:
            proc.terminate()
        with trio.move_on_after(self.stop_grace):
            for proc in procs:
                await proc.wait()
        for proc in procs:
            if proc.returncode is None:
                print(json.dumps({"event": "killed", "pid": proc.pid}), flush=True)
                proc.kill()
                await proc.wait()
        self._write_status()

    def _write_status(self) -> None:
        me = proc_ref(os.getpid())
        doc = {
            "keeper": {"pid": os.getpid(), "start_time": me.start_time if me else 0},
            "stopping": self._stopping,
            "processes": {
                spec.name: {
                    "pid": self._procs[spec.name].pid,
                    "start_time": (ref.start_time if (ref := proc_ref(self._procs[spec.name].pid)) else 0),
                    "restarts": self._restarts.get(spec.name, 0),
                    "running": self._procs[spec.name].returncode is None,
                    "ready": self._ready.get(spec.name),
                    "argv": list(spec.argv),
                    "log": str(spec.log),
                }
                for spec in self.specs
                if spec.name in self._procs
            },
        }
        tmp = self.status_file.with_name(self.status_file.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, self.status_file)


def load_specs(spec_file: Path) -> tuple[ProcessSpec, ...]:
    return tuple(ProcessSpec.from_json(p) for p in json.loads(spec_file.read_text())["processes"])


def main(argv: list[str] | None = None) -> int:
    """``python -m flock.lab.keeper SPEC STATUS LOG``: fork, print the keeper's PID, return."""
    spec_file, status_file, log_file = (Path(a) for a in (argv if argv is not None else sys.argv[1:]))
    specs = load_specs(spec_file)
    pid = os.fork()
    if pid:
        print(pid, flush=True)
        return 0
    os.setsid()
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(null)
    trio.run(Keeper(specs, status_file).run)
    sys.stdout.flush()
    os._exit(0)  # the forked child must not run the parent's exit handlers


if __name__ == "__main__":
    sys.exit(main())
