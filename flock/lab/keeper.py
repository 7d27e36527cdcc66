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
probes in a row terminate it, so it is restarted like a crashed one.  SIGTERM stops the lab: the
``preStop`` hooks run (within ``STOP_GRACE_S``), every process gets SIGTERM
(last started first), those still there when the grace is over get SIGKILL,
and each is reaped before the keeper exits 0.

SIGHUP makes the keeper read the spec file again and reconcile, as a kubelet
does when a pod is replaced (``flock-lab upgrade``): the processes no longer
in it, or whose spec changed, are stopped together (their ``preStop`` hooks,
SIGTERM, SIGKILL after the spec's ``grace``: the pod's
terminationGracePeriodSeconds), then the new ones are started.  The spec's
``generation`` is what the status file says was applied once that is done.

The status file (``procs.json`` next to the spec, replaced atomically after
every change) holds ``{"keeper": {pid, start_time}, "stopping": bool,
"generation": int, "reload_error": str | None,
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
# A kubelet gives a container whose preStop hook used up the grace period this much more after SIGTERM.
MIN_TERM_GRACE_S = 2.0
RESTART_DELAY_S = 0.5
RESTART_DELAY_MAX_S = 5.0


@attrs.frozen
class ProbeSpec:
    """A kubelet probe: an HTTP GET from inside *netns* (2xx/3xx passes) or a
    command (exit 0 passes, run with *env* when given: the image lab's ``podman
    exec`` needs the lab's podman settings), every *period* seconds after *initial_delay*."""

    http: tuple[str, str, int, str] | None = None  # (netns, host, port, path)
    argv: tuple[str, ...] | None = None
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    failure_threshold: int = 3
    success_threshold: int = 1
    env: dict[str, str] | None = attrs.field(default=None, hash=False)

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
                    list(self.argv),
                    stdin=subprocess.DEVNULL,
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                    env=self.env,
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
    pre_stop: tuple[str, ...] | None = None  # run (with env) to completion, bounded by the grace, before SIGTERM
    # When it is stopped on its own (a reload): preStop and SIGTERM within this many seconds, as
    # terminationGracePeriodSeconds; None: the keeper's stop_grace.  Stopping the lab uses stop_grace.
    grace: float | None = None

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
            obj.get("grace"),
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
            "grace": self.grace,
        }


@attrs.define(eq=False)
class Keeper:
    specs: tuple[ProcessSpec, ...]
    status_file: Path
    stop_grace: float = STOP_GRACE_S
    spec_file: Path | None = None  # what SIGHUP reads again (None: SIGHUP does nothing)
    generation: int = 0  # the spec's generation, as applied
    _stop_requested: trio.Event = attrs.field(init=False, factory=trio.Event)
    _procs: dict[str, trio.Process] = attrs.field(init=False, factory=dict)
    _restarts: dict[str, int] = attrs.field(init=False, factory=dict)
    _ready: dict[str, bool] = attrs.field(init=False, factory=dict)
    _stopping: bool = attrs.field(init=False, default=False)
    _retiring: set[str] = attrs.field(init=False, factory=set)  # being stopped on their own: not restarted
    _done: dict[str, trio.Event] = attrs.field(init=False, factory=dict)  # set when a process's task has ended
    _scopes: dict[str, trio.CancelScope] = attrs.field(init=False, factory=dict)  # each process's task
    _lock: trio.Lock = attrs.field(init=False, factory=trio.Lock)  # one reconcile or stop at a time
    _nursery: trio.Nursery | None = attrs.field(init=False, default=None)
    _reload_error: str | None = attrs.field(init=False, default=None)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every process, keep them running until SIGTERM/SIGINT or :meth:`request_stop`,
        then stop and reap them all.  SIGHUP: :meth:`reload`."""
        with (
            trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals,
            trio.open_signal_receiver(signal.SIGHUP) as hangups,
        ):
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for spec in self.specs:
                    await nursery.start(self._keep, spec)
                self._write_status()
                nursery.start_soon(self._stop_on_signal, signals)
                nursery.start_soon(self._reload_on_signal, hangups)
                task_status.started()
                await self._stop_requested.wait()
                await self._stop_all()
                nursery.cancel_scope.cancel()  # the signal watchers

    def request_stop(self) -> None:
        self._stop_requested.set()

    @property
    def restarts(self) -> dict[str, int]:
        return dict(self._restarts)

    async def _stop_on_signal(self, signals: AsyncIterator[int]) -> None:
        async for _ in signals:
            self.request_stop()
            return

    async def _reload_on_signal(self, hangups: AsyncIterator[int]) -> None:
        async for _ in hangups:
            if self.spec_file is None:
                continue
            try:
                generation, specs = load_spec_file(self.spec_file)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self._reload_error = f"cannot read {self.spec_file}: {exc}"
                print(json.dumps({"event": "reload-failed", "error": self._reload_error}), flush=True)
                self._write_status()
                continue
            await self.reconcile(specs, generation)

    async def reconcile(self, specs: tuple[ProcessSpec, ...], generation: int) -> None:
        """Stop what is gone or changed (together, as a pod is deleted), then start what is new or
        changed (in the spec's order); the status file then says *generation*."""
        async with self._lock:
            if self._stopping or self._nursery is None:
                return
            old = {s.name: s for s in self.specs}
            new = {s.name: s for s in specs}
            going = [name for name, spec in old.items() if new.get(name) != spec]
            print(
                json.dumps({"event": "reload", "generation": generation, "stop": going, "start": sorted(new)}),
                flush=True,
            )
            if going:
                graces = [old[n].grace for n in going]
                grace = max((g for g in graces if g is not None), default=self.stop_grace)
                await self._stop_names(going, grace)
            self.specs = tuple(specs)
            for spec in specs:
                if spec.name not in old or spec.name in going:
                    await self._nursery.start(self._keep, spec)
            self.generation = generation
            self._reload_error = None
            self._write_status()

    async def _keep(self, spec: ProcessSpec, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        done = self._done[spec.name] = trio.Event()
        try:
            with trio.CancelScope() as self._scopes[spec.name]:
                await self._keep_running(spec, task_status)
        finally:
            done.set()

    def _ending(self, name: str) -> bool:
        return self._stopping or name in self._retiring

    async def _keep_running(self, spec: ProcessSpec, task_status: trio.TaskStatus[None]) -> None:
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
            if self._ending(spec.name):
                return
            print(json.dumps({"event": "exited", "name": spec.name, "pid": proc.pid, "status": status}), flush=True)
            await trio.sleep(delay)
            delay = min(delay * 2, RESTART_DELAY_MAX_S)
            if self._ending(spec.name):
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

    async def _run_hook(self, argv: tuple[str, ...], env: dict[str, str] | None) -> None:
        proc = await trio.run_process(
            list(argv), stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, check=False, env=env
        )
        # A hook that stops its own container (BIRD's `graceful restart`) often ends with the exec's
        # "container has already been removed" rather than 0: the output says what it did.
        output = (proc.stdout + proc.stderr).decode(errors="replace")[-500:]
        print(
            json.dumps({"event": "pre-stop", "argv": list(argv), "status": proc.returncode, "output": output}),
            flush=True,
        )

    async def _stop_names(self, names: list[str], grace: float) -> None:
        """As a kubelet stops a pod's containers: every preStop hook (concurrently), then
        SIGTERM (last started first), SIGKILL for what is left when *grace* is over (at
        least ``MIN_TERM_GRACE_S`` after the signal); each is reaped and forgotten."""
        self._retiring.update(names)
        deadline = trio.current_time() + grace
        running = [n for n in names if n in self._procs and self._procs[n].returncode is None]
        hooks = [(s.pre_stop, s.env) for s in self.specs if s.name in running and s.pre_stop is not None]
        with trio.move_on_at(deadline):
            async with trio.open_nursery() as nursery:
                for argv, env in hooks:
                    nursery.start_soon(self._run_hook, argv, env)
        procs = [self._procs[n] for n in reversed(list(self._procs)) if n in names]
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        with trio.move_on_at(max(deadline, trio.current_time() + MIN_TERM_GRACE_S)):
            for proc in procs:
                await proc.wait()
        for proc in procs:
            if proc.returncode is None:
                print(json.dumps({"event": "killed", "pid": proc.pid}), flush=True)
                proc.kill()
                await proc.wait()
        if not self._stopping:
            # Their tasks may be waiting to restart a process that had exited: end them, and
            # anything one started meanwhile.
            for name in names:
                if name in self._scopes:
                    self._scopes[name].cancel()
                if name in self._done:
                    await self._done[name].wait()
                late = self._procs.get(name)
                if late is not None and late.returncode is None:
                    late.kill()
                    await late.wait()
            for name in names:
                for table in (self._procs, self._restarts, self._ready, self._done, self._scopes):
                    table.pop(name, None)
                self._retiring.discard(name)
        self._write_status()

    async def _stop_all(self) -> None:
        async with self._lock:
            self._stopping = True
            self._write_status()
            await self._stop_names(list(self._procs), self.stop_grace)

    def _write_status(self) -> None:
        me = proc_ref(os.getpid())
        doc = {
            "keeper": {"pid": os.getpid(), "start_time": me.start_time if me else 0},
            "stopping": self._stopping,
            "generation": self.generation,
            "reload_error": self._reload_error,
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


def load_spec_file(spec_file: Path) -> tuple[int, tuple[ProcessSpec, ...]]:
    """The spec file's generation (0 when it has none) and processes."""
    doc = json.loads(spec_file.read_text())
    return int(doc.get("generation", 0)), tuple(ProcessSpec.from_json(p) for p in doc["processes"])


def load_specs(spec_file: Path) -> tuple[ProcessSpec, ...]:
    return load_spec_file(spec_file)[1]


def main(argv: list[str] | None = None) -> int:
    """``python -m flock.lab.keeper SPEC STATUS LOG``: fork, print the keeper's PID, return."""
    spec_file, status_file, log_file = (Path(a) for a in (argv if argv is not None else sys.argv[1:]))
    generation, specs = load_spec_file(spec_file)
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
    trio.run(Keeper(specs, status_file, spec_file=spec_file, generation=generation).run)
    sys.stdout.flush()
    os._exit(0)  # the forked child must not run the parent's exit handlers


if __name__ == "__main__":
    sys.exit(main())
