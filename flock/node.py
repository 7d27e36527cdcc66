"""The node's services under flock-agent's root supervisor (DESIGN: "Supervision tree").

:func:`compose` builds the tree::

    flock-agent
    ├── signals
    ├── store      allocation store open → the RPC server gets the pod handler
    ├── rpc        DEL, CHECK, GC served from here; ADD answers 11 until start-up is done
    ├── health     /healthz /readyz /metrics
    └── node       API client, then a nested supervisor:
        ├── nodeconfig-watcher
        ├── pod-watcher
        ├── pods   start-up (flock.pods.PodService), then NodeConfig changes
        └── bird   debounced render + birdc configure (unless --no-bird)

The node subtree restarts as one: a new API client means new watchers and a
fresh start-up (idempotent).  A missing API configuration (not in a cluster,
no --kubeconfig) is logged and retried with backoff rather than ending the
agent, so DEL keeps working on a node whose API access is broken.

Degraded but serving (``/readyz`` stays 200 and lists them as notes, each
with a gauge): the NodeConfig deleted (the last one stays in force — routes
and BGP announcements are kept; a restarted agent waits for a new one), a
NodeConfig update refused as invalid (the previous one stays), BIRD not
configured yet (pods get addresses and local routes without it; the reloader
retries).  Fatal at start (exit 1 at once, one ``flock-agent: fatal:`` line on
stderr): an unusable state directory or database, another agent on the socket.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import attrs
import trio

from flock import errors
from flock.agent import Agent, AgentSettings
from flock.bird import BgpTimers, BirdInputs, BirdReloader, RenderSettings
from flock.bird.anycast import follow_pod_readiness
from flock.bird.passwords import BgpPasswords
from flock.bird.sessions import SessionMonitor, session_problems
from flock.health import HealthServer, Metrics
from flock.model import Allocation, AllocationState
from flock.netlink import ROUTE_PROTOCOL, NetlinkWorker
from flock.nursery import ChildSpec, Supervisor
from flock.pods import PENDING_DELETES, CrashPoint, PodHandler, PodService
from flock.rpc.server import NotReadyHandler
from flock.store import Store, StoreError, open_store
from flock.watchers import ClientConfigError, KubeClient, NodeConfigWatcher, PodWatcher, open_kube_client

log = logging.getLogger("flock.agent")

# Retrying a missing API configuration (a token file not mounted yet).
CONFIG_RETRY_INITIAL_S = 1.0
CONFIG_RETRY_MAX_S = 30.0
STORE_REMEDY = (
    "Restore the file from a backup, or move it (with its -wal and -shm files) aside to start empty: "
    "the pods running on this node then lose their network and must be recreated"
)


@attrs.define(eq=False)
class StoreSlot:
    """The allocation store while it is open (an AllocationStore that delegates);
    calls while it is closed are code 11."""

    store: Store | None = None

    def _open(self) -> Store:
        if self.store is None:
            raise errors.CniError(errors.TRY_AGAIN_LATER, "agent not ready", "the allocation store is not open")
        return self.store

    async def get(self, container_id: str) -> Allocation | None:
        return await self._open().get(container_id)

    async def put(self, allocation: Allocation) -> None:
        await self._open().put(allocation)

    async def commit(self, container_id: str, *, now: float | None = None) -> Allocation:
        return await self._open().commit(container_id, now=now)

    async def delete(self, container_id: str) -> bool:
        return await self._open().delete(container_id)

    async def list(self, state: AllocationState | None = None) -> list[Allocation]:
        return await self._open().list(state)


@attrs.define(eq=False)
class NodeServices:
    """The node's shared state and the supervised functions that run it."""

    agent: Agent
    settings: AgentSettings
    handler: PodHandler
    worker: NetlinkWorker
    slot: StoreSlot
    metrics: Metrics
    reloader: BirdReloader | None
    nodeconfigs: NodeConfigWatcher | None = None
    pod_watcher: PodWatcher | None = None
    pod_service: PodService | None = None
    kube_problem: str = "not connected to the API server yet"
    health: HealthServer | None = None
    passwords: BgpPasswords | None = None
    sessions: SessionMonitor | None = None

    # -- children ------------------------------------------------------------

    async def run_store(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open the store and hand the RPC server the pod handler.

        A :class:`StoreError` (unreadable or corrupt database) propagates with
        what the operator can do appended; the agent exits on it (fatal)."""
        try:
            async with open_store(self.settings.state_dir) as store:
                log.info("allocation store open", extra={"path": str(store.path), **(await store.settings())})
                self.slot.store = store
                self.agent.server.handler = self.handler
                try:
                    task_status.started()
                    await trio.sleep_forever()
                finally:
                    self.agent.server.handler = NotReadyHandler("the allocation store is closed")
                    self.slot.store = None
        except StoreError as exc:
            exc.details = f"{exc.details}. {STORE_REMEDY}"
            raise

    async def run_node(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect to the API server (retrying a missing configuration), then run the subtree."""
        delay = CONFIG_RETRY_INITIAL_S
        while True:
            try:
                client_cm = open_kube_client(self.settings.kubeconfig)
                async with client_cm as client:
                    self.kube_problem = ""
                    await self._run_subtree(client, task_status)
                return
            except ClientConfigError as exc:
                self.kube_problem = f"no API server configuration: {exc}"
                log.error("cannot configure the API client; retrying", extra={"error": str(exc), "retry_in": delay})
            await trio.sleep(delay)
            delay = min(CONFIG_RETRY_MAX_S, delay * 2)

    async def _run_subtree(self, client: KubeClient, task_status: Any) -> None:
        node = self.settings.node
        self.nodeconfigs = NodeConfigWatcher(client.nodeconfig(node), node)
        self.pod_watcher = PodWatcher(client.pods_on_node(node), node)
        self.pod_service = PodService(
            handler=self.handler,
            store=self.slot,
            dataplane=self.worker,
            nodeconfigs=self.nodeconfigs,
            node_name=node,
            pending_deletes=self.settings.socket.parent / PENDING_DELETES,
            prepare=self._prepare_node,
        )
        self.handler.pods = self.pod_watcher
        children = [
            ChildSpec("nodeconfig-watcher", self.nodeconfigs.run),
            ChildSpec("pod-watcher", self.pod_watcher.run),
            ChildSpec("pods", self.pod_service.run),
        ]
        if self.reloader is not None:
            reloader = self.reloader
            self.passwords = BgpPasswords(self.settings.namespace, client.secret, reloader.poke)
            children += [
                ChildSpec("bgp-passwords", functools.partial(self.passwords.run, self.nodeconfigs.values())),
                ChildSpec(
                    "anycast-readiness", functools.partial(follow_pod_readiness, self.pod_watcher, reloader.poke)
                ),
                ChildSpec("bird", self._run_reloader),
            ]
            if self.sessions is not None:
                children.append(ChildSpec("bgp-sessions", self.sessions.run))
        try:
            await Supervisor("node", children).run(task_status=task_status)
        finally:
            self.handler.pods = None
            self.handler.disable_add("the node's services are restarting")

    async def _run_reloader(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        assert self.reloader is not None
        self.reloader.config_path.parent.mkdir(parents=True, exist_ok=True)
        await self.reloader.run(task_status=task_status)

    async def _prepare_node(self) -> None:
        await self.worker.prepare_node(self.settings.uplink)

    # -- what health and BIRD read -------------------------------------------

    def bird_inputs(self) -> BirdInputs | None:
        node = self.pod_service.node if self.pod_service is not None else None
        if node is None:
            return None
        return BirdInputs.collect(
            node,
            self.handler.allocations.values(),
            pods=self.pod_watcher.pods if self.pod_watcher is not None else None,
            passwords=self.passwords.passwords if self.passwords is not None else None,
        )

    def readiness(self) -> list[str]:
        """What keeps /readyz from 200: NodeConfig loaded, informers synced, ADD served."""
        missing = []
        if self.slot.store is None:
            missing.append("allocation store not open")
        if self.kube_problem:
            missing.append(self.kube_problem)
        if self.nodeconfigs is None or not self.nodeconfigs.informer.ready:
            missing.append("NodeConfig informer not synced")
        if self.nodeconfigs is None or self.nodeconfigs.current is None:
            invalid = self.nodeconfigs.invalid if self.nodeconfigs is not None else None
            missing.append(f"NodeConfig {self.settings.node} not loaded" + (f" ({invalid})" if invalid else ""))
        if self.pod_watcher is None or not self.pod_watcher.ready:
            missing.append("pod informer not synced")
        if not self.handler.add_ready:
            missing.append(f"ADD not served: {self.handler.not_ready_reason}")
        return missing

    def notes(self) -> list[str]:
        """Degraded states that do not stop ADD: shown by /readyz, also as metrics."""
        out = []
        nc = self.nodeconfigs
        if nc is not None and nc.current is not None:
            if nc.deleted:
                out.append(
                    f"NodeConfig {self.settings.node} was deleted; serving with the last one seen "
                    f"(cidr6 {nc.current.cidr6}); recreate it, or drain the node before removing flock"
                )
            if nc.invalid is not None:
                out.append(
                    f"NodeConfig {self.settings.node} update refused ({nc.invalid}); serving with the previous one"
                )
        if self.reloader is not None and self.reloader.last_error is not None:
            # BIRD runs beside the agent: pods get addresses and local routes
            # without it; only announcing them waits, and the reloader retries.
            out.append(f"BIRD not configured yet (retrying): {self.reloader.last_error}")
        if self.passwords is not None:
            for peer, problem in sorted(self.passwords.problems.items()):
                out.append(f"BGP peer {peer} is kept down: no password ({problem})")
        if self.sessions is not None and nc is not None:
            out.extend(session_problems(nc.current, self.sessions.sessions, self.settings.namespace))
        return out

    def _session_gauge(self) -> dict[str, float]:
        node = self.nodeconfigs.current if self.nodeconfigs is not None else None
        sessions = self.sessions.sessions if self.sessions is not None else None
        if node is None or node.bgp is None or sessions is None:
            return {}
        return {
            f'peer="{p.name}"': float((s := sessions.get(f"bgp_{p.name}")) is not None and s.established)
            for p in node.bgp.peers
        }

    def _allocation_counts(self) -> dict[str, float]:
        counts = {f'state="{s.value}"': 0.0 for s in AllocationState}
        for alloc in self.handler.allocations.values():
            counts[f'state="{alloc.state.value}"'] += 1
        return counts

    def register_metrics(self) -> None:
        m = self.metrics
        m.gauge("flock_allocations", "Pod allocations this agent holds, by state.", "gauge", self._allocation_counts)
        m.gauge("flock_ready", "1 when /readyz passes.", "gauge", lambda: {"": 0.0 if self.readiness() else 1.0})
        m.gauge(
            "flock_nodeconfig_deleted",
            "1 while this node's NodeConfig is deleted and the last one is in force.",
            "gauge",
            lambda: {"": float(self.nodeconfigs is not None and self.nodeconfigs.deleted)},
        )
        m.gauge(
            "flock_nodeconfig_refused",
            "1 while the newest NodeConfig is invalid and the previous one is in force.",
            "gauge",
            lambda: {"": float(self.nodeconfigs is not None and self.nodeconfigs.invalid is not None)},
        )
        if self.sessions is not None:
            m.gauge(
                "flock_bgp_session_established",
                "1 while BIRD's session to the peer is Established (peers of the NodeConfig, by name).",
                "gauge",
                self._session_gauge,
            )
            m.gauge(
                "flock_bgp_password_missing",
                "1 while a peer's password Secret cannot be used (the session is kept down).",
                "gauge",
                lambda: {f'peer="{p}"': 1.0 for p in (self.passwords.problems if self.passwords else {})},
            )
            m.gauge(
                "flock_anycast_withheld",
                "Anycast addresses routed to local pods but not announced: none of those pods is Ready.",
                "gauge",
                lambda: {"": float(len(i.withheld)) if (i := self.bird_inputs()) is not None else 0.0},
            )
        if self.reloader is not None:
            r = self.reloader
            m.gauge(
                "flock_bird_reloads_total",
                "Successful birdc configure calls.",
                "counter",
                lambda: {"": float(r.reloads)},
            )
            m.gauge(
                "flock_bird_pending",
                "1 while BIRD has not taken the newest config (reloader retrying).",
                "gauge",
                lambda: {"": float(r.last_error is not None)},
            )
            m.gauge(
                "flock_bird_reload_failures_total",
                "Failed BIRD check/configure attempts.",
                "counter",
                lambda: {"": float(r.failures)},
            )


def compose(settings: AgentSettings, *, crash: CrashPoint = CrashPoint()) -> Agent:
    """The full flock-agent for *settings*: :class:`Agent` plus the node's services."""
    return compose_services(settings, crash=crash).agent


def compose_services(settings: AgentSettings, *, crash: CrashPoint = CrashPoint()) -> NodeServices:
    """Like :func:`compose`, returning the node's services (their ``agent`` is the root)."""
    agent = Agent(settings)
    worker = NetlinkWorker(host_netns=settings.host_netns, fault=crash.setup_fault if crash.name else None)
    slot = StoreSlot()
    metrics = Metrics()
    handler = PodHandler(store=slot, dataplane=worker, settings=worker.settings, observe=metrics.observe, crash=crash)
    services = NodeServices(
        agent=agent, settings=settings, handler=handler, worker=worker, slot=slot, metrics=metrics, reloader=None
    )
    if settings.bird:
        services.sessions = SessionMonitor(settings.bird_socket)
        services.reloader = BirdReloader(
            config_path=settings.bird_config,
            control_socket=settings.bird_socket,
            settings=RenderSettings(
                route_protocol=ROUTE_PROTOCOL, bgp_timers=BgpTimers() if settings.bgp_lab_timers else None
            ),
            inputs=services.bird_inputs,
        )
        handler.on_change = services.reloader.poke
    services.register_metrics()
    host, port = settings.health_address
    services.health = HealthServer(host, port, services.readiness, metrics.render, services.notes)
    # A corrupt or unreadable database stays so across restarts: exit at once, naming it.
    agent.add_child(ChildSpec("store", services.run_store, fatal=(StoreError,)), before="rpc")
    agent.add_child(ChildSpec("health", services.health.run))
    agent.add_child(ChildSpec("node", services.run_node))
    return services
