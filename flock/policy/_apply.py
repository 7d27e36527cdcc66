"""Apply a :class:`Ruleset` to the kernel with ``nft -f -`` (Debian's nftables), one transaction each.

The applier remembers what it applied last.  The first apply (and any apply
after a failure, when the kernel's state is no longer known) replaces the
whole table atomically; later ones send only the difference.  A failed
incremental transaction changed nothing (nft batches are atomic), and is
followed at once by a full replace; if that fails too the error propagates
and the kernel still holds the last good ruleset.

Error handling: :class:`NftError` (nft's exit status and stderr) propagates
to the caller, which retries with backoff.  The applier never touches any
table but ``inet flock``.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from collections.abc import Sequence

import attrs
import trio

from ._nft import FAMILY, TABLE, render_full, render_update, summarize
from ._ruleset import Ruleset

log = logging.getLogger("flock.policy")


class NftError(RuntimeError):
    """nft refused a transaction (nothing of it was applied)."""

    def __init__(self, returncode: int, stderr: str) -> None:
        self.returncode, self.stderr = returncode, stderr
        super().__init__(f"nft exited {returncode}: {stderr.strip()[:2000]}")


@attrs.frozen
class ApplyResult:
    mode: str  # "full", "incremental" or "unchanged"
    seconds: float
    summary: dict[str, int] = attrs.field(factory=dict)


@attrs.define(eq=False)
class NftApplier:
    """Owns ``table inet flock`` in the network namespace *command* runs in.

    *command* is the nft invocation (``("nft",)`` in the agent, which runs in
    the node's namespace; tests prefix ``ip netns exec NAME``).
    """

    command: Sequence[str] = ("nft",)
    _applied: Ruleset | None = attrs.field(init=False, default=None)
    _lock: trio.Lock = attrs.field(init=False, factory=trio.Lock)

    @property
    def applied(self) -> Ruleset | None:
        """The ruleset the kernel holds, as far as this applier knows (None: unknown)."""
        return self._applied

    async def _nft(self, *args: str, script: str | None = None) -> str:
        proc = await trio.run_process(
            [*self.command, *args],
            stdin=script.encode() if script is not None else b"",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        if proc.returncode != 0:
            raise NftError(proc.returncode, proc.stderr.decode(errors="replace"))
        return proc.stdout.decode(errors="replace")

    async def apply(self, ruleset: Ruleset) -> ApplyResult:
        """Make the kernel hold *ruleset*: an incremental transaction when possible, else a full replace."""
        async with self._lock:
            start = time.perf_counter()
            old = self._applied
            if old is not None:
                script = render_update(old, ruleset)
                if not script:
                    return ApplyResult("unchanged", time.perf_counter() - start)
                try:
                    await self._nft("-f", "-", script=script)
                except NftError as exc:
                    log.warning(
                        "incremental nftables update refused, replacing the table",
                        extra={"op": "policy", "error": str(exc)[:500]},
                    )
                else:
                    self._applied = ruleset
                    return ApplyResult("incremental", time.perf_counter() - start, summarize(old, ruleset))
            self._applied = None
            await self._nft("-f", "-", script=render_full(ruleset))
            self._applied = ruleset
            return ApplyResult("full", time.perf_counter() - start, summarize(None, ruleset))

    async def counters(self) -> dict[str, tuple[int, int]]:
        """Packets and bytes per chain of ``inet flock`` (summed over the chain's counted rules)."""
        out = await self._nft("-j", "list", "table", FAMILY, TABLE)
        totals: dict[str, tuple[int, int]] = {}
        for item in json.loads(out).get("nftables", []):
            rule = item.get("rule")
            if not rule:
                continue
            for expr in rule.get("expr", []):
                counter = expr.get("counter") if isinstance(expr, dict) else None
                if isinstance(counter, dict):
                    p, b = totals.get(rule["chain"], (0, 0))
                    totals[rule["chain"]] = (p + int(counter.get("packets", 0)), b + int(counter.get("bytes", 0)))
        return totals

    async def remove(self) -> None:
        """Delete the table (uninstall and tests); absent is fine."""
        async with self._lock:
            await self._nft("-f", "-", script=f"add table {FAMILY} {TABLE}\ndelete table {FAMILY} {TABLE}\n")
            self._applied = None


def nft_available(command: Sequence[str] = ("nft",)) -> str | None:
    """None when *command* runs, else what is wrong (for tests' pytest.fail and the agent's start-up log)."""
    try:
        subprocess.run([*command, "--version"], capture_output=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{' '.join(command)} does not run ({exc}): install Debian's nftables"
    return None
