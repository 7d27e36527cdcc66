"""Two ways to hand nft a transaction: Debian's ``nft -f -``, or libnftables in-process.

Both take the same script (one batch, atomic in the kernel) and raise
:class:`NftError` when nft refuses it.  The in-process one saves the
fork/exec of ``nft`` on every update — most of the cost of a one-pod change
— and runs in one dedicated thread that never serves other work, so it may
enter another network namespace (tests, benchmarks) without disturbing
anything else.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import logging
import os
import queue
import threading
from collections.abc import Sequence
from typing import Protocol

import attrs
import trio

log = logging.getLogger("flock.policy")

LIBNFTABLES = "libnftables.so.1"
_NFT_CTX_OUTPUT_JSON = 1 << 4


_CLONE_NEWNET = 0x40000000


def _enter_netns(path: str) -> None:
    """setns(2) this thread into the network namespace at *path* (Python 3.11 has no os.setns)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


class NftError(RuntimeError):
    """nft refused a transaction (nothing of it was applied)."""

    def __init__(self, returncode: int, stderr: str) -> None:
        self.returncode, self.stderr = returncode, stderr
        super().__init__(f"nft exited {returncode}: {stderr.strip()[:2000]}")


class NftBackend(Protocol):
    async def run(self, script: str, *, json_output: bool = False) -> str:
        """Run *script* as one nft batch; its output (JSON when asked)."""
        ...


@attrs.frozen
class NftCommand:
    """``nft -f -`` as a process; *command* may carry a prefix (``ip netns exec NAME nft``)."""

    command: Sequence[str] = ("nft",)

    async def run(self, script: str, *, json_output: bool = False) -> str:
        # With -j nft reads JSON too: a listing (flock's own one-line command) goes as arguments.
        argv = [*self.command, "-j", *script.split()] if json_output else [*self.command, "-f", "-"]
        try:
            proc = await trio.run_process(
                argv,
                stdin=b"" if json_output else script.encode(),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        except OSError as exc:
            # No nft binary (an image without nftables): a refusal the service retries and readiness names,
            # not a crash that restarts the service until the agent exits.
            raise NftError(127, f"cannot run {argv[0]}: {exc}") from exc
        if proc.returncode != 0:
            raise NftError(proc.returncode, proc.stderr.decode(errors="replace"))
        return proc.stdout.decode(errors="replace")


class LibNftables:
    """libnftables through ctypes, on a thread of its own (optionally inside *netns*, a path)."""

    def __init__(self, netns: str | None = None) -> None:
        self._lib = ctypes.CDLL(LIBNFTABLES)
        lib = self._lib
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_output_get_flags.restype = ctypes.c_uint
        lib.nft_ctx_output_get_flags.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        self._netns = netns
        self._requests: queue.SimpleQueue[tuple[str, bool, concurrent.futures.Future[str]] | None] = queue.SimpleQueue()
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._serve, args=(started,), name="flock-nft", daemon=True)
        self._thread.start()
        started.result()  # the namespace could be entered and a context made, or this raises

    def _serve(self, started: concurrent.futures.Future[None]) -> None:
        lib = self._lib
        try:
            if self._netns is not None:
                _enter_netns(self._netns)
            ctx = lib.nft_ctx_new(0)
            if not ctx:
                raise OSError("nft_ctx_new failed")
            lib.nft_ctx_buffer_output(ctx)
            lib.nft_ctx_buffer_error(ctx)
        except BaseException as exc:
            started.set_exception(exc)
            return
        started.set_result(None)
        plain = lib.nft_ctx_output_get_flags(ctx)
        try:
            while (request := self._requests.get()) is not None:
                self._run(ctx, plain, *request)
                del request  # not kept while waiting for the next: a full table's script is megabytes
        finally:
            lib.nft_ctx_free(ctx)

    def _run(
        self, ctx: int, plain: int, script: str, json_output: bool, result: concurrent.futures.Future[str]
    ) -> None:
        lib = self._lib
        lib.nft_ctx_output_set_flags(ctx, plain | (_NFT_CTX_OUTPUT_JSON if json_output else 0))
        rc = lib.nft_run_cmd_from_buffer(ctx, script.encode())
        out = (lib.nft_ctx_get_output_buffer(ctx) or b"").decode(errors="replace")
        err = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace")
        if rc != 0:
            result.set_exception(NftError(rc, err))
        else:
            result.set_result(out)

    def _call(self, script: str, json_output: bool) -> str:
        result: concurrent.futures.Future[str] = concurrent.futures.Future()
        self._requests.put((script, json_output, result))
        return result.result()

    async def run(self, script: str, *, json_output: bool = False) -> str:
        # Not abandoned on cancellation: whether a batch went in must always be known.
        return await trio.to_thread.run_sync(self._call, script, json_output)

    def close(self) -> None:
        self._requests.put(None)
        self._thread.join(timeout=10)


def default_backend(netns: str | None = None) -> NftBackend:
    """libnftables in *netns* (a path; None: this process's) when it loads, else the ``nft`` command there."""
    try:
        return LibNftables(netns)
    except OSError as exc:
        log.warning("libnftables unusable (%s): running nft for each change", exc, extra={"op": "policy"})
        return NftCommand(("nsenter", f"--net={netns}", "nft") if netns is not None else ("nft",))
