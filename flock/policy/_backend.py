"""Two ways to hand nft a transaction: Debian's ``nft -f -``, or libnftables in-process.

Both take the same script (one batch, atomic in the kernel) and raise
:class:`NftError` when nft refuses it.  The in-process one saves the
fork/exec of ``nft`` on every update — most of the cost of a one-pod change
— and runs in one dedicated thread that never serves other work, so it may
enter another network namespace (tests, benchmarks) without disturbing
anything else.

Memory: libnftables parses a whole-table script into several hundred bytes
per set element (about 350 MiB for the 435,000 elements of 150,000 pods'
sets); freed, that memory stays with the thread's malloc arena, so after a
large script the thread hands it back (``malloc_trim``).  Rule counters are
read with a netlink rule dump (:mod:`._counters`), not ``nft list``, which
would fetch every set's elements first.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import json
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import attrs
import trio

from flock.netns import enter_netns

from ._counters import add_counter, element_counters, finish, rule_counters, table_exists

log = logging.getLogger("flock.policy")

LIBNFTABLES = "libnftables.so.1"
T = TypeVar("T")
_TRIM_AFTER = 1 << 20  # script bytes: after a larger one the nft thread returns its freed memory to the system


class NftError(RuntimeError):
    """nft refused a transaction (nothing of it was applied)."""

    def __init__(self, returncode: int, stderr: str) -> None:
        self.returncode, self.stderr = returncode, stderr
        super().__init__(f"nft exited {returncode}: {stderr.strip()[:2000]}")


class NftBackend(Protocol):
    async def run(self, script: str | bytes) -> str:
        """Run *script* as one nft batch; its output."""
        ...

    async def counters(self, table: str) -> dict[str, tuple[int, int]]:
        """Packets and bytes per chain of ``inet <table>`` (summed over the chain's counted rules; {}: no table)."""
        ...

    async def has_table(self, table: str) -> bool:
        """``inet <table>`` exists (asked for that table alone)."""
        ...

    async def element_counters(
        self, table: str, name: str, decode: Callable[[bytes], str | None]
    ) -> dict[str, tuple[int, int]]:
        """Packets and bytes per element of the counted set or map *name* of ``inet <table>``, by key in nft's
        text (``a . b . c``; *decode* turns the kernel's key bytes into it, None: skip); {}: no such set."""
        ...


@attrs.frozen
class NftCommand:
    """``nft -f -`` as a process; *command* may carry a prefix (``ip netns exec NAME nft``)."""

    command: Sequence[str] = ("nft",)

    async def run(self, script: str | bytes) -> str:
        return await self._nft(["-f", "-"], script.encode() if isinstance(script, str) else script)

    async def counters(self, table: str) -> dict[str, tuple[int, int]]:
        # The fallback's way: a listing (terse, yet nft 1.0.6 still fetches every set's elements for it).
        listing = await self._nft(["-j", "-t", "list", "table", "inet", table], b"")
        totals: dict[str, tuple[int, int]] = {}
        for item in json.loads(listing).get("nftables", []):
            rule = item.get("rule")
            if not rule:
                continue
            counters = [e["counter"] for e in rule.get("expr", []) if isinstance(e, dict) and "counter" in e]
            if counters:
                packets = sum(int(c.get("packets", 0)) for c in counters if isinstance(c, dict))
                nbytes = sum(int(c.get("bytes", 0)) for c in counters if isinstance(c, dict))
                add_counter(totals, rule["chain"], packets, nbytes)
        return finish(totals)

    async def has_table(self, table: str) -> bool:
        # terse: no set elements are read for it
        try:
            await self._nft(["-t", "list", "table", "inet", table], b"")
        except NftError:
            return False
        return True

    async def element_counters(
        self, table: str, name: str, decode: Callable[[bytes], str | None]
    ) -> dict[str, tuple[int, int]]:
        try:
            listing = await self._nft(["-j", "list", "set", "inet", table, name], b"")
        except NftError:
            try:
                listing = await self._nft(["-j", "list", "map", "inet", table, name], b"")
            except NftError:
                return {}
        found: dict[str, tuple[int, int]] = {}
        for item in json.loads(listing).get("nftables", []):
            body = item.get("set") or item.get("map")
            if not isinstance(body, dict):
                continue
            for element in body.get("elem", []):
                # a counted element: {"elem": {"val": key, "counter": {...}}}, or [{"elem": ...}, data] in a map
                elem = element[0] if isinstance(element, list) and element else element
                inner = elem.get("elem") if isinstance(elem, dict) else None
                if not isinstance(inner, dict) or not isinstance(inner.get("counter"), dict):
                    continue
                value = inner.get("val")
                parts = value.get("concat", []) if isinstance(value, dict) else [value]
                counter = inner["counter"]
                found[" . ".join(str(p) for p in parts)] = (
                    int(counter.get("packets", 0)),
                    int(counter.get("bytes", 0)),
                )
        return found

    async def _nft(self, args: list[str], stdin: bytes) -> str:
        argv = [*self.command, *args]
        try:
            proc = await trio.run_process(argv, stdin=stdin, capture_stdout=True, capture_stderr=True, check=False)
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
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        self._trim = _malloc_trim()
        self._netns = netns
        self._requests: queue.SimpleQueue[tuple[Callable[[int], Any], concurrent.futures.Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._serve, args=(started,), name="flock-nft", daemon=True)
        self._thread.start()
        started.result()  # the namespace could be entered and a context made, or this raises

    def _serve(self, started: concurrent.futures.Future[None]) -> None:
        lib = self._lib
        try:
            if self._netns is not None:
                enter_netns(self._netns)  # this thread serves nothing else
            ctx = lib.nft_ctx_new(0)
            if not ctx:
                raise OSError("nft_ctx_new failed")
            lib.nft_ctx_buffer_output(ctx)
            lib.nft_ctx_buffer_error(ctx)
        except BaseException as exc:
            started.set_exception(exc)
            return
        started.set_result(None)
        try:
            while (request := self._requests.get()) is not None:
                work, result = request
                del request  # not kept while waiting for the next: a full table's script is megabytes
                try:
                    result.set_result(work(ctx))
                except Exception as exc:
                    result.set_exception(exc)
                del work
        finally:
            lib.nft_ctx_free(ctx)

    def _script(self, script: bytes, ctx: int) -> str:
        lib = self._lib
        rc = lib.nft_run_cmd_from_buffer(ctx, script)
        out = (lib.nft_ctx_get_output_buffer(ctx) or b"").decode(errors="replace")
        err = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace")
        if len(script) > _TRIM_AFTER and self._trim is not None:
            self._trim(0)  # what parsing it took would stay with this thread's malloc arena otherwise
        if rc != 0:
            raise NftError(rc, err)
        return out

    def _call(self, work: Callable[[int], T]) -> T:
        result: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._requests.put((work, result))
        return result.result()

    async def run(self, script: str | bytes) -> str:
        work = functools.partial(self._script, script.encode() if isinstance(script, str) else script)
        # Not abandoned on cancellation: whether a batch went in must always be known.
        return await trio.to_thread.run_sync(self._call, work)

    async def counters(self, table: str) -> dict[str, tuple[int, int]]:
        # On the nft thread: in its network namespace, and never while a transaction is under way.
        return await trio.to_thread.run_sync(self._call, lambda _ctx: rule_counters(table))

    async def has_table(self, table: str) -> bool:
        return await trio.to_thread.run_sync(self._call, lambda _ctx: table_exists(table))

    async def element_counters(
        self, table: str, name: str, decode: Callable[[bytes], str | None]
    ) -> dict[str, tuple[int, int]]:
        raw = await trio.to_thread.run_sync(self._call, lambda _ctx: element_counters(table, name))
        found = {}
        for key, counts in raw.items():
            text = decode(key)
            if text is not None:
                found[text] = counts
        return found

    def close(self) -> None:
        self._requests.put(None)
        self._thread.join(timeout=10)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim (None without glibc)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except AttributeError:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def default_backend(netns: str | None = None) -> NftBackend:
    """libnftables in *netns* (a path; None: this process's) when it loads, else the ``nft`` command there."""
    try:
        return LibNftables(netns)
    except OSError as exc:
        log.warning("libnftables unusable (%s): running nft for each change", exc, extra={"op": "policy"})
        return NftCommand(("nsenter", f"--net={netns}", "nft") if netns is not None else ("nft",))
