"""The service proxy: a supervised loop keeping ``table inet flock-services`` equal to what the
cluster's Services and EndpointSlices say.

- Off (the agent's default): the table is removed if an earlier run left it, and nothing else
  is done.
- On, beside kube-proxy: kube-proxy's tables, chains or IPVS interface on the node
  (:func:`flock.services.find_kube_proxy`) keep the proxy off — it says why in the log and in a
  note (``/readyz``, ``flockctl status``), changes nothing, and looks again every
  :data:`RECHECK_S` (an operator switching over removes kube-proxy and its rules, and the proxy
  turns on by itself).
- On: nothing is applied until both kinds are listed (a half view would refuse connections to
  Services whose slices are on their way); then each change of the inputs is compiled
  (:func:`compile_table`) and applied as the difference from what the kernel holds
  (:func:`render_update`: an endpoint flip is a handful of lines) in one transaction; a refused
  transaction is retried with backoff as a whole replacement, noted while it lasts.  The node's
  addresses (NodePorts answer on them) are read again every :data:`RECHECK_S`.  The table stays
  when the agent stops: connections keep working across a restart, and the next agent replaces
  it in one transaction.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable

import attrs
import trio

from flock.nursery import Backoff
from flock.policy import NftBackend, NftError

from ._compile import NodeView, ServicesConfig, compile_table
from ._inputs import ServiceInputs
from ._nft import render_full, render_update
from ._table import TABLE, ServicesTable

log = logging.getLogger("flock.services")

RECHECK_S = 30.0
APPLY_BACKOFF = Backoff(initial=0.2, factor=2.0, cap=10.0, jitter=0.2)
NOTE = "service-proxy"  # the NodeState note's topic
DROP_TABLE = f"add table inet {TABLE}\ndelete table inet {TABLE}\n"


@attrs.define(eq=False)
class ServiceProxy:
    """*node*: this node's name and addresses (read again every :data:`RECHECK_S`); *config*: the
    pod CIDRs and the address pools (read at each compile); *note*: sets or clears (None) the
    proxy's note; *kube_proxy*: what of kube-proxy is on the node (empty: nothing)."""

    inputs: ServiceInputs
    backend: NftBackend
    node: Callable[[], Awaitable[NodeView]]
    config: Callable[[], ServicesConfig]
    kube_proxy: Callable[[], Awaitable[list[str]]]
    note: Callable[[str | None], None]
    enabled: bool = True
    recheck_s: float = RECHECK_S
    backoff: Backoff = APPLY_BACKOFF
    rand: Callable[[], float] = random.random
    on_applied: Callable[[ServicesTable], None] | None = None  # each table once in the kernel (health checks)
    applied: ServicesTable | None = attrs.field(init=False, default=None)  # what the kernel holds
    applied_generation: int = attrs.field(init=False, default=-1)
    conflicts: tuple[str, ...] = attrs.field(init=False, default=())

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if not self.enabled:
            await self._drop_table()
            task_status.started()
            await trio.sleep_forever()
        traces = await self.kube_proxy()
        while traces:
            self.note(f"service proxy off: kube-proxy is on this node ({'; '.join(traces)})")
            log.warning(
                "service proxy not turned on: kube-proxy is on this node; changing nothing",
                extra={"op": "services", "kube_proxy": traces},
            )
            task_status.started()
            task_status = trio.TASK_STATUS_IGNORED
            await trio.sleep(self.recheck_s)
            traces = await self.kube_proxy()
        self.note(None)
        task_status.started()
        generation = self.inputs.generation
        while not self.inputs.complete:
            generation = await self.inputs.wait_generation(generation)
        await self._follow()

    async def _follow(self) -> None:
        attempt = 0
        node = await self.node()
        node_read = trio.current_time()
        while True:
            generation = self.inputs.generation
            if trio.current_time() - node_read >= self.recheck_s:
                node, node_read = await self.node(), trio.current_time()
            table = compile_table(self.inputs.services.values(), self.inputs.slices.values(), node, self.config())
            try:
                await self._apply(table)
            except NftError as exc:
                self.applied = None  # what the kernel holds is not known: replace it whole next time
                delay = self.backoff.delay(attempt, self.rand())
                attempt += 1
                self.note(f"service proxy: nft refused the table, retrying in {delay:.1f} s: {str(exc)[:200]}")
                log.error("services table refused", extra={"op": "services", "error": str(exc)[:500]})
                await trio.sleep(delay)
                continue
            if attempt:
                self.note(None)
                attempt = 0
            self.applied_generation = generation
            with trio.move_on_after(max(0.0, node_read + self.recheck_s - trio.current_time())):
                await self.inputs.wait_generation(generation)

    async def _apply(self, table: ServicesTable) -> None:
        script = render_full(table) if self.applied is None else render_update(self.applied, table)
        if script is None:
            script = render_full(table)  # the skeleton changed
        if script:
            await self.backend.run(script)
            log.debug("services table applied", extra={"op": "services", "lines": script.count("\n")})
        self.applied = table
        if self.on_applied is not None:
            self.on_applied(table)
        conflicts = tuple(table.conflicts)
        if conflicts != self.conflicts:
            self.conflicts = conflicts
            for conflict in conflicts:
                log.warning("service address conflict: %s", conflict, extra={"op": "services"})

    async def _drop_table(self) -> None:
        try:
            await self.backend.run(DROP_TABLE)
        except NftError as exc:
            log.warning("could not remove table inet %s: %s", TABLE, exc, extra={"op": "services"})
