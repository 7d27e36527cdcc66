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
  Services whose slices are on their way); then the table is loaded whole, and each change of the
  inputs (the keys the inputs' journal names) is followed by a :class:`ServicesEngine`, which
  compiles again only the Services those keys touch and applies the difference (an endpoint flip
  is a handful of lines) in one transaction; a refused transaction is retried with backoff as a
  whole replacement, noted while it lasts.  The node's addresses (NodePorts answer on them) are read
  again every :data:`RECHECK_S`, the config at each change; a change of either compiles every
  Service again and applies the difference.  The table stays when the agent stops: connections keep
  working across a restart, and the next agent replaces it in one transaction.

Error handling: nft refusals are retried here (backoff, noted); anything else propagates to the
supervisor, which restarts the proxy — its first transaction then replaces the table whole.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Mapping

import attrs
import trio
import trio.lowlevel

from flock.model import ServiceRoutes
from flock.nursery import Backoff
from flock.policy import NftBackend, NftError

from ._announce import Announcements, IPNetwork, announcements, routes_by_pool
from ._compile import NodeView, ServicesConfig, slice_owner
from ._conntrack import StaleFlows
from ._counters import COUNTED_MAPS, ServiceMetrics, ServicePortCounts, ServicePortKey, decode_key, service_connections
from ._engine import ServicesEngine
from ._inputs import ServiceInputs
from ._model import EndpointSlice, Service
from ._nft import render_full, render_update
from ._table import TABLE, HealthCheck, ServicesTable

log = logging.getLogger("flock.services")

RECHECK_S = 30.0
COUNTERS_EVERY_S = 15.0
LOAD_STEP = 500  # Services per transaction of a first load on a node without the table
APPLY_BACKOFF = Backoff(initial=0.2, factor=2.0, cap=10.0, jitter=0.2)
NOTE = "service-proxy"  # the NodeState note's topic
DROP_TABLE = f"add table inet {TABLE}\ndelete table inet {TABLE}\n"


async def _hand_over() -> None:
    """Let a task just started reach its thread: ``trio.to_thread.run_sync`` passes a checkpoint before it
    hands the work over, so one is not enough (measured: after two, nft's thread parses one step while
    this thread compiles the next; after one, they take turns)."""
    for _ in range(3):
        await trio.lowlevel.checkpoint()


@attrs.define(eq=False)
class ServiceProxy:
    """*node*: this node's name and addresses (read again every :data:`RECHECK_S`); *config*: the
    pod CIDRs and the address pools (read at each change); *note*: sets or clears (None) the
    proxy's note; *kube_proxy*: what of kube-proxy is on the node (empty: nothing).

    *on_health*: the health checks, each time they change once in the kernel (cheap: prefer it).
    *on_applied*: each whole table once in the kernel — built for the call, in time proportional to
    the table, on every change: for tests and tools, not for a large cluster's hot path."""

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
    on_applied: Callable[[ServicesTable], None] | None = None
    on_health: Callable[[Mapping[int, HealthCheck]], None] | None = None
    metrics: ServiceMetrics | None = None
    # where the routes this node announces go (the node's BIRD); the allow-list is the config's
    on_announce: Callable[[tuple[ServiceRoutes, ...]], None] | None = None
    cluster_ip_ranges: tuple[IPNetwork, ...] = ()  # announced as they are (aggregates)
    # eTP Cluster without an endpoint anywhere: withdrawn on every node (True), or kept announced
    withdraw_without_endpoints: bool = True
    # deletes stale UDP conntrack entries in the node's namespace (flock.services.forget_stale on a thread)
    forget: Callable[[list[StaleFlows]], Awaitable[int]] | None = None
    counters_every: float = COUNTERS_EVERY_S
    engine: ServicesEngine | None = attrs.field(init=False, default=None)  # the table the kernel holds (or will)
    in_kernel: bool = attrs.field(init=False, default=False)  # the kernel holds exactly the engine's table
    applied_generation: int = attrs.field(init=False, default=-1)
    conflicts: tuple[str, ...] = attrs.field(init=False, default=())
    announced: tuple[ServiceRoutes, ...] = attrs.field(init=False, default=())
    announcements: Announcements = attrs.field(init=False, factory=Announcements)  # and why not (flockctl)

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
        async with trio.open_nursery() as nursery:
            if self.metrics is not None:
                nursery.start_soon(self._read_counters, self.metrics)
            await self._follow()

    async def counts(self) -> dict[ServicePortKey, ServicePortCounts] | None:
        """New connections per Service port, as the kernel's counted elements say (None: no table in the kernel)."""
        engine = self.engine
        if engine is None or not self.in_kernel:
            return None
        counted = dict(engine.counted)  # as it is now: the elements below are read after it
        per_element = {}
        for name in COUNTED_MAPS:
            for key, figures in (await self.backend.element_counters(TABLE, name, decode_key)).items():
                per_element[(name, key)] = figures
        return service_connections(per_element, counted)

    async def _read_counters(self, metrics: ServiceMetrics) -> None:
        while True:
            await trio.sleep(self.counters_every)
            try:
                counts = await self.counts()
            except (NftError, OSError, ValueError) as exc:  # OSError: the netlink dump
                log.warning("could not read the service counters", extra={"op": "services", "error": str(exc)[:300]})
                continue
            if counts is not None:
                metrics.counts(counts)

    async def _follow(self) -> None:
        attempt = 0
        node = await self.node()
        node_read = trio.current_time()
        journal = self.inputs.journal()  # with the whole read below, in the same step
        engine = self.engine = ServicesEngine(node, self.config())
        services, slices = self.inputs.services, self.inputs.slices
        self.in_kernel = False
        if await self._fresh():
            await self._load_in_steps(engine, dict(services), dict(slices))
        else:
            engine.load(services, slices)  # the table there serves until one transaction replaces it whole
        health_changed = True
        while True:
            generation = self.inputs.generation
            if trio.current_time() - node_read >= self.recheck_s:
                node, node_read = await self.node(), trio.current_time()
            config = self.config()
            changes = journal.drain()
            script: str | None = ""
            if (
                node == engine.node
                and config != engine.config
                and attrs.evolve(config, allow=engine.config.allow) == engine.config
            ):
                # the allow-list alone (pools changed): the Services with external addresses again
                delta = engine.update(
                    self.inputs.services, self.inputs.slices, changes.services, changes.slices, allow=config.allow
                )
                health_changed |= delta.health_changed
                script = delta.script()
            elif node != engine.node or config != engine.config:
                # every Service compiled again; the difference found by comparing whole tables (rare)
                before = engine.table() if self.in_kernel else None
                engine.update(self.inputs.services, self.inputs.slices, changes.services, changes.slices)
                engine.rebuild(node, config)
                health_changed = True
                script = render_update(before, engine.table()) if before is not None else None
            elif changes:
                delta = engine.update(self.inputs.services, self.inputs.slices, changes.services, changes.slices)
                health_changed |= delta.health_changed
                script = delta.script()
            if script is None:
                self.in_kernel = False  # the skeleton changed: replace the table whole
            try:
                await self._apply(engine, script, health_changed)
            except NftError as exc:
                self.in_kernel = False  # what the kernel holds is not known: replace it whole next time
                delay = self.backoff.delay(attempt, self.rand())
                attempt += 1
                self.note(f"service proxy: nft refused the table, retrying in {delay:.1f} s: {str(exc)[:200]}")
                log.error("services table refused", extra={"op": "services", "error": str(exc)[:500]})
                await trio.sleep(delay)
                continue
            health_changed = False
            await self._forget(engine.take_stale())
            if attempt:
                self.note(None)
                attempt = 0
            self.applied_generation = generation
            with trio.move_on_after(max(0.0, node_read + self.recheck_s - trio.current_time())):
                await self.inputs.wait_generation(generation)

    def _announce(self, engine: ServicesEngine) -> None:
        """The Service routes this node announces now (issue 34), handed on when they change.  Only the
        Services with external addresses are looked at: a handful, whatever the number of Services."""
        allow = engine.config.allow
        external = [s for s in self.inputs.services.values() if s.load_balancer_ips or s.external_ips]
        slices = [eps for s in external for eps in engine.slices_of(s)]
        result = self.announcements = announcements(
            external,
            slices,
            engine.node.name,
            allow,
            withdraw_without_endpoints=self.withdraw_without_endpoints,
            cluster_ip_ranges=[(net, None) for net in self.cluster_ip_ranges],
        )
        alone = {r.prefix for r in result.routes if r.alone}
        routes = tuple(
            ServiceRoutes(
                pool.name,
                prefixes,
                pool.communities,
                pool.local_preference,
                last_resort=tuple(p for p in prefixes if p in alone),
            )
            for pool, prefixes in routes_by_pool(result, allow.pools)
        )
        if routes != self.announced:
            self.announced = routes
            log.info(
                "service routes changed",
                extra={"op": "services", "routes": [str(n) for r in routes for n in r.nets][:50]},
            )
            assert self.on_announce is not None
            self.on_announce(routes)

    async def _fresh(self) -> bool:
        """The node has no services table yet (a first start, not a restart)."""
        try:
            return not await self.backend.has_table(TABLE)
        except (NftError, OSError):  # not known: as a restart (one transaction, whatever is there)
            return False

    async def _load_in_steps(
        self, engine: ServicesEngine, services: Mapping[str, Service], slices: Mapping[str, EndpointSlice]
    ) -> None:
        """A node without the table: the skeleton, then the Services :data:`LOAD_STEP` at a time, each step
        compiled while nft takes the one before it (nft runs on its own thread), so the first Services
        translate at once and all of them sooner than in one transaction.  Only where nothing is there to
        keep serving meanwhile: a restart replaces the table in one transaction.  A refused step leaves
        the kernel unknown: the loop then replaces the table whole, with backoff."""
        by_service: dict[str, list[str]] = {}
        for key, eps in slices.items():
            owner = slice_owner(eps)
            service = f"{owner[0]}/{owner[1]}" if owner is not None else ""
            by_service.setdefault(service if service in services else "", []).append(key)
        keys = sorted(services)
        refused: list[NftError] = []

        async def run(script: str, done: trio.Event) -> None:
            try:
                await self.backend.run(script)
            except NftError as exc:
                refused.append(exc)
            finally:
                done.set()

        async with trio.open_nursery() as nursery:
            done = trio.Event()
            nursery.start_soon(run, render_full(engine.table()), done)  # the skeleton and the node's addresses
            await _hand_over()
            engine.update(services, slices, (), ())  # (what that took in: not again in the first step)
            for i in range(0, len(keys), LOAD_STEP):
                step = keys[i : i + LOAD_STEP]
                step_slices = [k for service in step for k in by_service.get(service, ())]
                if i == 0:
                    step_slices += by_service.get("", [])  # slices of no Service (yet): kept, nothing to compile
                script = engine.update(services, slices, step, step_slices).script()
                await done.wait()
                if refused:
                    break
                done = trio.Event()
                nursery.start_soon(run, script, done)
                await _hand_over()
            await done.wait()
        if refused:
            log.error("services table refused", extra={"op": "services", "error": str(refused[0])[:500]})
            engine.load(services, slices)  # the engine holds every Service; the kernel, some: replaced whole next
            return
        self.in_kernel = True
        log.info("services table loaded", extra={"op": "services", "services": engine.services})

    async def _apply(self, engine: ServicesEngine, script: str | None, health_changed: bool) -> None:
        """Bring the kernel to the engine's table: *script* when the kernel held the table before this
        change, else the whole table."""
        table = None
        if not self.in_kernel:
            table = engine.table()
            script = render_full(table)
        if script:
            await self.backend.run(script)
            log.debug("services table applied", extra={"op": "services", "lines": script.count("\n")})
        self.in_kernel = True
        if self.metrics is not None:
            self.metrics.services.set(engine.services)
            self.metrics.chains.set(engine.chains)
            self.metrics.elements.set(engine.elements)
        if self.on_applied is not None:
            self.on_applied(table if table is not None else engine.table())
        if self.on_announce is not None:
            self._announce(engine)
        if health_changed and self.on_health is not None:
            self.on_health(engine.health_checks)
        conflicts = engine.conflicts
        if conflicts != self.conflicts:
            self.conflicts = conflicts
            for conflict in conflicts:
                log.warning("service address conflict: %s", conflict, extra={"op": "services"})

    async def _forget(self, stale: list[StaleFlows]) -> None:
        if not stale or self.forget is None:
            return
        try:
            deleted = await self.forget(stale)
        except OSError as exc:  # conntrack unreadable: the flows keep their endpoint until they pause
            log.warning(
                "could not delete stale UDP conntrack entries", extra={"op": "services", "error": str(exc)[:300]}
            )
            return
        if deleted:
            log.info("stale UDP conntrack entries deleted", extra={"op": "services", "deleted": deleted})

    async def _drop_table(self) -> None:
        try:
            await self.backend.run(DROP_TABLE)
        except NftError as exc:
            log.warning("could not remove table inet %s: %s", TABLE, exc, extra={"op": "services"})
