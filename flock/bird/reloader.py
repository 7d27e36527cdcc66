"""The BIRD reloader: debounced render → check → atomic write → ``birdc configure``.

Anything that may change BIRD's configuration (NodeConfig updates, a pod with
anycast or extra addresses coming or going) calls :meth:`BirdReloader.poke`,
which only records the wish and returns. The service waits until pokes have
been quiet for ``debounce`` seconds (but no longer than ``max_delay`` after the
first of a burst), then reconciles once with the inputs current at that moment.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import attrs
import trio

from flock.bird.inputs import BirdInputs
from flock.bird.render import SECRETS_FILE, RenderError, RenderSettings, render, render_secrets
from flock.nursery import Backoff

log = logging.getLogger("flock.bird")

_TMP_SUFFIX = ".tmp"
_CHECK_DIR = ".check-"
_HIDDEN = "<hidden>"

#: Runs a command given as an argument vector (never through a shell) to
#: completion and returns its exit status and captured output. Tests
#: substitute a recording runner; production uses :func:`run_process`.
ProcessRunner = Callable[[Sequence[str]], Awaitable[subprocess.CompletedProcess]]


async def run_process(argv: Sequence[str]) -> subprocess.CompletedProcess:
    """Run ``argv`` with output captured; a non-zero exit status is returned, not raised."""
    return await trio.run_process(list(argv), capture_stdout=True, capture_stderr=True, check=False)


class Notes(Protocol):
    """Where the reloader says that BIRD lags behind (the agent's NodeState: /readyz notes)."""

    def set_note(self, topic: str, text: str | None) -> None: ...


NOTE_TOPIC = "bird"


class ReloadError(Exception):
    """One reconcile attempt failed at ``step`` ("check" or "configure").

    ``returncode`` is None when the command ran past the reloader's deadline.
    """

    def __init__(self, step: str, argv: Sequence[str], returncode: int | None, output: str) -> None:
        self.step, self.argv, self.returncode, self.output = step, list(argv), returncode, output
        status = "ran too long" if returncode is None else f"exited {returncode}"
        super().__init__(f"{step}: {' '.join(self.argv)} {status}: {output.strip()}")


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def _read(path: pathlib.Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _fsync_dir(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@attrs.define(eq=False)
class BirdReloader:
    """Keeps ``config_path`` and the running BIRD in step with :attr:`inputs`.

    ``inputs`` returns the current :class:`BirdInputs`, or ``None`` while there
    is nothing to render yet (no NodeConfig). ``runner`` executes ``bird`` and
    ``birdc``.

    Error handling: a failed check (``bird -p``) or ``birdc configure`` (BIRD
    down, config rejected) is logged and retried locally with :attr:`backoff`
    until it succeeds, re-rendering each time so the latest inputs win; so is
    a ``bird``/``birdc`` that cannot be run at all. A
    :class:`RenderError` (inputs that cannot be rendered) is logged and not
    retried: the same inputs would fail again, and the next change pokes.
    ``OSError`` writing the config file and anything unexpected propagate to
    the supervisor.
    """

    config_path: pathlib.Path = attrs.field(converter=pathlib.Path)
    control_socket: pathlib.Path = attrs.field(converter=pathlib.Path)
    settings: RenderSettings
    inputs: Callable[[], BirdInputs | None]
    runner: ProcessRunner = run_process
    debounce: float = 0.5
    max_delay: float = 5.0
    #: Retry n (1-based) waits ``backoff.delay(n - 1)``: 1, 2, 4 … 30 s.
    backoff: Backoff = Backoff(initial=1.0, cap=30.0)
    bird: str = "bird"
    birdc: str = "birdc"
    #: A `bird -p` or `birdc` that runs longer than this (a wedged BIRD) is
    #: killed and counts as a failed attempt.
    command_deadline: float = 10.0
    #: Completed ``birdc configure`` calls and failed attempts, for metrics.
    reloads: int = attrs.field(default=0, init=False)
    failures: int = attrs.field(default=0, init=False)
    #: Told "BIRD not configured yet (retrying): …" while :attr:`last_error` is set.
    notes: Notes | None = None
    #: Why the newest inputs are not applied yet (None once BIRD took them).
    last_error: str | None = attrs.field(default=None, init=False)
    _poked: trio.Event = attrs.field(factory=trio.Event, init=False)
    _first_poke: float = attrs.field(default=0.0, init=False)
    _last_poke: float = attrs.field(default=0.0, init=False)
    # What BIRD was last told to load (config, secrets), by this process; None until then.
    _applied: tuple[str, str | None] | None = attrs.field(default=None, init=False)
    # Passwords of the newest inputs: scrubbed from anything logged or kept as an error.
    _secrets: tuple[str, ...] = attrs.field(default=(), init=False, repr=False)

    def poke(self) -> None:
        """Note that the inputs may have changed. Never blocks; call from Trio
        (from a worker thread: ``trio.from_thread.run_sync(reloader.poke)``)."""
        now = trio.current_time()
        if not self._poked.is_set():
            self._first_poke = now
        self._last_poke = now
        self._poked.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # A predecessor killed between writing and renaming leaves its temp file.
        for stale in self.config_path.parent.glob(self._tmp_prefix + "*" + _TMP_SUFFIX):
            stale.unlink(missing_ok=True)
        for stale in self.config_path.parent.glob(self._tmp_prefix + _CHECK_DIR + "*"):
            shutil.rmtree(stale, ignore_errors=True)
        # Reconcile once at start: the file on disk may be older than this
        # process, or written by a predecessor that died before `configure`.
        self.poke()
        task_status.started()
        while True:
            await self._poked.wait()
            await self._settle()
            self._poked = trio.Event()
            await self._reconcile_until_done()

    async def _settle(self) -> None:
        while True:
            deadline = min(self._last_poke + self.debounce, self._first_poke + self.max_delay)
            if trio.current_time() >= deadline:
                return
            await trio.sleep_until(deadline)

    async def _reconcile_until_done(self) -> None:
        attempt = 0
        while True:
            try:
                await self.reconcile()
                self._set_error(None)
                return
            except ReloadError as exc:
                exc = self._scrubbed(exc)
                attempt += 1
                self.failures += 1
                self._set_error(str(exc))
                delay = self.backoff.delay(attempt - 1)
                log.warning(
                    "BIRD reload failed, retrying",
                    extra={
                        "step": exc.step,
                        "returncode": exc.returncode,
                        "output": exc.output.strip(),
                        "attempt": attempt,
                        "retry_in": delay,
                    },
                )
                await trio.sleep(delay)

    def _set_error(self, error: str | None) -> None:
        self.last_error = error
        if self.notes is not None:
            # BIRD runs beside the agent: pods get addresses and local routes
            # without it; only announcing them waits, and the reloader retries.
            note = None if error is None else f"BIRD not configured yet (retrying): {error}"
            self.notes.set_note(NOTE_TOPIC, note)

    async def apply_now(self) -> bool:
        """One reconcile at once, past the debounce (a leaving agent's last config); a failure is
        logged, not raised.  True if BIRD was told to reconfigure."""
        try:
            return await self.reconcile()
        except ReloadError as exc:
            exc = self._scrubbed(exc)
            log.warning("BIRD reload failed", extra={"step": exc.step, "output": exc.output.strip()})
            return False

    async def reconcile(self) -> bool:
        """One attempt; True if BIRD was told to reconfigure. Raises :class:`ReloadError`."""
        inputs = self.inputs()
        if inputs is None:
            log.debug("no BIRD inputs yet (no NodeConfig)")
            return False
        self._secrets = tuple(v for v in inputs.passwords.values() if v)
        try:
            text = render(
                inputs.node,
                anycast=inputs.anycast,
                addresses=inputs.addresses,
                passwords=inputs.passwords.keys(),
                services=inputs.services,
                leaving=inputs.leaving,
                settings=self.settings,
            )
            secrets = render_secrets(inputs.node, inputs.passwords) if inputs.passwords else None
        except RenderError as exc:
            log.error(
                "cannot render BIRD config",
                extra={"field": exc.field, "value": self._scrub(repr(exc.value)), "expected": exc.expected},
            )
            return False
        on_disk = _read(self.config_path)
        secrets_path = self.config_path.parent / SECRETS_FILE
        secrets_on_disk = _read(secrets_path) if secrets is not None else None
        if text == on_disk and secrets == secrets_on_disk and (text, secrets) == self._applied:
            return False
        if text != on_disk or secrets != secrets_on_disk:
            await self._check_and_write(text, secrets)
        result = await self._run("configure", [self.birdc, "-s", str(self.control_socket), "configure"])
        self._applied = (text, secrets)
        self.reloads += 1
        if secrets is None:
            # No peer reads a password any more: none stays on disk.
            secrets_path.unlink(missing_ok=True)
        log.info(
            "BIRD reconfigured",
            extra={"config": str(self.config_path), "output": self._scrub(_text(result.stdout).strip())},
        )
        return True

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, _HIDDEN)
        return text

    def _scrubbed(self, exc: ReloadError) -> ReloadError:
        if not any(secret in str(exc) for secret in self._secrets):
            return exc
        return ReloadError(exc.step, exc.argv, exc.returncode, self._scrub(exc.output))

    async def _run(self, step: str, argv: list[str]) -> subprocess.CompletedProcess:
        with trio.move_on_after(self.command_deadline):
            try:
                result = await self.runner(argv)
            except OSError as exc:
                # No bird/birdc binary (yet): as retryable as a BIRD that is down.
                raise ReloadError(step, argv, 127, f"cannot run {argv[0]}: {exc.strerror or exc}") from None
            if result.returncode != 0:
                raise ReloadError(step, argv, result.returncode, _text(result.stdout) + _text(result.stderr))
            return result
        raise ReloadError(step, argv, None, f"no answer within {self.command_deadline} s")

    @property
    def _tmp_prefix(self) -> str:
        return f".{self.config_path.name}."

    async def _check_and_write(self, text: str, secrets: str | None = None) -> None:
        # The file is a few KB written at most once per debounce, so it is
        # written on the Trio thread: worker threads would let a virtual clock
        # run ahead in tests, for no gain here.
        if secrets is not None:
            await self._check_and_write_with_secrets(text, secrets)
            return
        directory = self.config_path.parent
        fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=self._tmp_prefix, suffix=_TMP_SUFFIX)
        tmp = pathlib.Path(tmp_name)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            await self._run("check", [self.bird, "-p", "-c", str(tmp)])
            os.replace(tmp, self.config_path)
        except BaseException:
            tmp.unlink(missing_ok=True)  # noqa: ASYNC240  on the Trio thread on purpose (see above)
            raise
        _fsync_dir(directory)

    async def _check_and_write_with_secrets(self, text: str, secrets: str) -> None:
        """Check the config together with its secrets file in a private directory
        beside it (BIRD resolves the include against the config's directory),
        then move the secrets file (0600) and the config into place. A config
        BIRD rejects replaces neither file."""
        directory = self.config_path.parent
        check_dir = pathlib.Path(tempfile.mkdtemp(dir=directory, prefix=self._tmp_prefix + _CHECK_DIR))
        try:
            conf = check_dir / self.config_path.name
            _write(check_dir / SECRETS_FILE, secrets, 0o600)
            _write(conf, text, 0o644)
            await self._run("check", [self.bird, "-p", "-c", str(conf)])
            os.replace(check_dir / SECRETS_FILE, directory / SECRETS_FILE)
            os.replace(conf, self.config_path)
        finally:
            shutil.rmtree(check_dir, ignore_errors=True)
        _fsync_dir(directory)


def _write(path: pathlib.Path, text: str, mode: int) -> None:
    # Created with its final mode: a password is never readable by others, not even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(path, mode)  # whatever the umask
