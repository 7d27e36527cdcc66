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

from ._backend import NftBackend, NftCommand, NftError
from ._nft import FAMILY, TABLE, render_full, render_update, summarize
from ._ruleset import Ruleset

log = logging.getLogger("flock.policy")


_DROP_TABLE = f"add table {FAMILY} {TABLE}\ndelete table {FAMILY} {TABLE}\n"


def _empty(ruleset: Ruleset) -> bool:
    return not ruleset.chains and not ruleset.egress_map and not ruleset.ingress_map


@attrs.frozen
class ApplyResult:
    mode: str  # "full", "incremental", "removed" (nothing isolated: no table) or "unchanged"
    seconds: float
    summary: dict[str, int] = attrs.field(factory=dict)


@attrs.define(eq=False)
class NftApplier:
    """Owns ``table inet flock`` in the network namespace *backend* works in.

    *backend*: :class:`LibNftables` in the agent (in-process, the node's
    namespace), or :class:`NftCommand` (``nft -f -``; tests prefix
    ``ip netns exec NAME``).
    """

    backend: NftBackend = attrs.field(factory=lambda: NftCommand())
    _applied: Ruleset | None = attrs.field(init=False, default=None)
    _present: bool = attrs.field(init=False, default=False)  # the table exists (when _applied is known)
    _lock: trio.Lock = attrs.field(init=False, factory=trio.Lock)

    @property
    def applied(self) -> Ruleset | None:
        """The ruleset the kernel holds, as far as this applier knows (None: unknown)."""
        return self._applied

    async def apply(self, ruleset: Ruleset) -> ApplyResult:
        """Make the kernel hold *ruleset*: an incremental transaction when possible, else a full replace."""
        async with self._lock:
            start = time.perf_counter()
            old = self._applied
            if _empty(ruleset):
                # Nothing isolated: no table at all (a node without policies never loads nftables rules).
                if old is not None and not self._present:
                    return ApplyResult("unchanged", time.perf_counter() - start)
                self._applied = None
                await self.backend.run(_DROP_TABLE)
                self._applied, self._present = ruleset, False
                return ApplyResult("removed", time.perf_counter() - start)
            if old is not None and self._present:
                script = render_update(old, ruleset)
                if not script:
                    return ApplyResult("unchanged", time.perf_counter() - start)
                try:
                    await self.backend.run(script)
                except NftError as exc:
                    log.warning(
                        "incremental nftables update refused, replacing the table",
                        extra={"op": "policy", "error": str(exc)[:500]},
                    )
                else:
                    self._applied = ruleset
                    return ApplyResult("incremental", time.perf_counter() - start, summarize(old, ruleset))
            self._applied = None
            await self.backend.run(render_full(ruleset))
            self._applied, self._present = ruleset, True
            return ApplyResult("full", time.perf_counter() - start, summarize(None, ruleset))

    async def counters(self) -> dict[str, tuple[int, int]]:
        """Packets and bytes per chain of ``inet flock`` (summed over the chain's counted rules)."""
        if self._applied is not None and not self._present:
            return {}
        out = await self.backend.run(f"list table {FAMILY} {TABLE}", json_output=True)
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
            await self.backend.run(_DROP_TABLE)
            self._applied, self._present = None, False


def nft_available(command: Sequence[str] = ("nft",)) -> str | None:
    """None when *command* runs, else what is wrong (for tests' pytest.fail)."""
    try:
        subprocess.run([*command, "--version"], capture_output=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{' '.join(command)} does not run ({exc}): install Debian's nftables"
    return None
