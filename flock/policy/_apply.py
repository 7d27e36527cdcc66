"""Apply a :class:`Ruleset` to the kernel with nft (libnftables or ``nft -f -``), one transaction each.

The applier remembers what it applied last: the ruleset's structure (chains,
maps, set declarations) and the token of the :class:`RulesetChange` it came
in.  The first apply (and any apply after a failure, when the kernel's state
is no longer known, or of a change that does not continue the applied one)
replaces the whole table atomically; later ones send only the difference:
the structure's, and the set elements the change says moved.  A failed
incremental transaction changed nothing (nft batches are atomic), and is
followed at once by a full replace; if that fails too the error propagates
and the kernel still holds the last good ruleset.

Error handling: :class:`NftError` (nft's exit status and stderr) propagates
to the caller, which retries with backoff.  The applier never touches any
table but ``inet flock``.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Sequence

import attrs
import trio

from ._backend import NftBackend, NftCommand, NftError
from ._nft import FAMILY, TABLE, render_change, render_full, summarize
from ._ruleset import Ruleset, RulesetChange

log = logging.getLogger("flock.policy")


_DROP_TABLE = f"add table {FAMILY} {TABLE}\ndelete table {FAMILY} {TABLE}\n"


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
    ``ip netns exec NAME``).  The policy service hands it changes
    (:meth:`apply_change`); tools and tests may hand it whole rulesets
    (:meth:`apply`), diffed against the last one it applied whole.
    """

    backend: NftBackend = attrs.field(factory=lambda: NftCommand())
    _structure: Ruleset | None = attrs.field(init=False, default=None)
    _token: object | None = attrs.field(init=False, default=None)  # the change applied last (with _structure)
    _whole: Ruleset | None = attrs.field(init=False, default=None)  # the last one applied by apply(), elements too
    _present: bool = attrs.field(init=False, default=False)  # the table exists (when _structure is known)
    _lock: trio.Lock = attrs.field(init=False, factory=trio.Lock)

    @property
    def applied(self) -> Ruleset | None:
        """What the kernel holds, as far as this applier knows (None: unknown).

        After :meth:`apply`, that ruleset; after :meth:`apply_change`, its
        structure (the elements of pod sets are the service's to keep)."""
        return self._structure

    async def apply(self, ruleset: Ruleset) -> ApplyResult:
        """Make the kernel hold *ruleset*: an incremental transaction when possible, else a full replace."""
        async with self._lock:
            previous, self._whole = self._whole, None
            result = await self._apply(
                RulesetChange.of(ruleset, previous, self._token if previous is not None else None)
            )
            self._whole = ruleset
            return result

    async def apply_change(self, change: RulesetChange) -> ApplyResult:
        """Make the kernel hold ``change.whole()``: incrementally when it continues the last change applied."""
        async with self._lock:
            self._whole = None
            return await self._apply(change)

    async def _apply(self, change: RulesetChange) -> ApplyResult:
        start = time.perf_counter()
        new, old = change.structure, self._structure
        if new.empty:
            # Nothing isolated: no table at all (a node without policies never loads nftables rules).
            if old is not None and not self._present:
                self._structure, self._token = new, change.token
                return ApplyResult("unchanged", time.perf_counter() - start)
            self._structure = self._token = None
            await self.backend.run(_DROP_TABLE)
            self._structure, self._token, self._present = new, change.token, False
            return ApplyResult("removed", time.perf_counter() - start)
        if (
            old is not None
            and self._present
            and change.base is not None
            and change.base is self._token
            and old.nat == new.nat  # natOutgoing changed (a NodeConfig edit, rare): the whole table anew
        ):
            script = render_change(old, change)
            if not script:
                self._structure, self._token = new, change.token
                return ApplyResult("unchanged", time.perf_counter() - start)
            try:
                await self.backend.run(script)
            except NftError as exc:
                log.warning(
                    "incremental nftables update refused, replacing the table",
                    extra={"op": "policy", "error": str(exc)[:500]},
                )
            else:
                self._structure, self._token = new, change.token
                return ApplyResult("incremental", time.perf_counter() - start, summarize(old, change))
        self._structure = self._token = None
        # bytes, so that the text is not held twice while libnftables parses it (at 150,000 pods 12 MiB each)
        await self.backend.run(render_full(change.whole()).encode())
        self._structure, self._token, self._present = new, change.token, True
        return ApplyResult("full", time.perf_counter() - start, summarize(None, change))

    async def counters(self) -> dict[str, tuple[int, int]]:
        """Packets and bytes per chain of ``inet flock`` (summed over the chain's counted rules)."""
        if self._structure is not None and not self._present:
            return {}
        return await self.backend.counters(TABLE)

    async def remove(self) -> None:
        """Delete the table (uninstall and tests); absent is fine."""
        async with self._lock:
            await self.backend.run(_DROP_TABLE)
            self._structure = self._token = self._whole = None
            self._present = False


def nft_available(command: Sequence[str] = ("nft",)) -> str | None:
    """None when *command* runs, else what is wrong (for tests' pytest.fail)."""
    try:
        subprocess.run([*command, "--version"], capture_output=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{' '.join(command)} does not run ({exc}): install Debian's nftables"
    return None
