"""The composition root: every service of flock-agent, built with its dependencies.

:func:`compose` is the only place that chooses concrete classes (the SQLite
store, the pyroute2 netlink worker, the Kubernetes watchers, BIRD) and the
only place that wires services together, by passing each one what it needs
to its constructor.  The tree it returns (DESIGN: "Supervision tree")::

    flock-agent                 (flock.agent.Agent; the store is opened before it)
    ├── signals                 SIGTERM/SIGINT → drain the RPC server (and leave, below), cancel the tree
    ├── startup                 logs "ready" once (with when each gate opened); hands back the GC
    ├── removals                flock.pods.VethRemovals: DEL's veth deletions, in the background
    ├── rpc                     flock.rpc.server.RpcServer → flock.pods.PodHandler
    ├── health                  /healthz /readyz /metrics (flock.health)
    ├── pods                    flock.pods.NodeBringUp: start-up (ADD behind its gate), then NodeConfig changes
    ├── admin                   flock.ctl.AdminServer: flockctl's unix socket (0600, local only)
    ├── api                     flock.agent.ApiLink: connect (retried), then supervisor "api":
    │   ├── nodeconfig-watcher  → NodeState.nodeconfig
    │   ├── pod-watcher         every pod, watched once: this node's → pod lookups for ADD, all → PolicyInputs
    │   │                       (--policy-peers=groups: this node's pods only, → PeerFeed)
    │   ├── group-watchers      (--policy-peers=groups) this node's NodeAddressGroups and its groups' AddressGroups
    │   │                       → PeerFeed → PolicyInputs (flock.watchers._groups)
    │   ├── policy-watchers     NetworkPolicy, Namespace, ClusterNetworkPolicy, Node while needed (cluster-wide) → PolicyInputs
    │   ├── service-watchers    Service, EndpointSlice (cluster-wide) → ServiceInputs (--service-proxy only)
    │   ├── pool-watcher        LoadBalancerPool, Namespace labels → the allow-list in ServiceInputs (same)
    │   ├── bgp-passwords       the BGP password Secrets NodeConfig names → NodeState
    │   └── node-watcher        this node's Node: cordoned / excluded → NodeState.leaving (proxy and BIRD)
    ├── policy                  flock.policy.PolicyService: compile → one nftables transaction; ADD's policy gate
    ├── policy-log              the kernel's log of policy drops (nflog) → a line per denied flow, counters
    ├── wireguard               flock.agent._wireguard: key, device, peers, routes, guard (--encryption wireguard;
    │                           its watchers and key publisher run under "api"); off: the guard table removed
    ├── services                flock.services.ServiceProxy: Services → table inet flock-services (--service-proxy;
    │                           off: the table removed; refused beside kube-proxy)
    ├── health-checks           healthCheckNodePorts of eTP Local Services, as kube-proxy answers them (proxy on)
    ├── bird                    flock.agent.BirdFollower: NodeState → debounced render + birdc configure
    ├── bgp-sessions            BIRD's session states → /readyz notes and metrics (with BIRD only)
    └── bgp-leave               leaving: Service routes with GRACEFUL_SHUTDOWN, then withdrawn (proxy and BIRD)

State: :class:`flock.state.NodeState` (NodeConfig in force, allocation view,
readiness gates, notes) is built here and handed to every service that
reads or changes it; services observe it with ``wait_changed``.

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

from flock import __version__
from flock.bird import BgpTimers, BirdReloader, RenderSettings
from flock.bird.sessions import SessionMonitor
from flock.ctl import AdminOps, AdminServer
from flock.errors import NOT_AVAILABLE, TRY_AGAIN_LATER, CniError
from flock.health import HealthServer, Metrics
from flock.model import AllocationState
from flock.netlink import ROUTE_PROTOCOL, NetlinkWorker
from flock.nursery import ChildSpec, Restart
from flock.pods import ADD_GATE, PENDING_DELETES, AllocationStore, NodeBringUp, PodHandler, VethRemovals
from flock.policy import NftApplier, PolicyInputs, PolicyMetrics, PolicyService, default_backend
from flock.policy._denylog import DENY_LOG_GROUP, DenyLogService, nflog_socket
from flock.rpc import Request
from flock.rpc.server import RpcServer, SocketInUse
from flock.state import WIREGUARD_OVERHEAD, Gate, NodeState
from flock.store import FILENAME, MIGRATIONS, StoreError, StoreTooNew, backup_path, open_store
from flock.watchers import PeerFeed

from ._api import API_GATE, NODECONFIG_INFORMER_GATE, POD_INFORMER_GATE, ApiLink, WatcherFactory, nodeconfig_gate
from ._bird import BirdFollower, bgp_passwords, bird_inputs, session_monitor
from ._cli import AgentSettings
from ._crash import CrashPoint
from ._leave import ServiceLeave, node_watcher
from ._policy import POLICY_READY_GATE, PolicyLink
from ._root import SHUTDOWN_DEADLINE_S, Agent, FatalStartError, check_state_dir
from ._services import services_part
from ._startup import StartupWatch
from ._wireguard import GUARD_GATE, wireguard_part

log = logging.getLogger("flock.agent")

NO_CRASH = CrashPoint()

STORE_REMEDY = (
    "Restore the file from a backup, or move it (with its -wal and -shm files) aside to start empty: "
    "the pods running on this node then lose their network and must be recreated"
)


def node_state(node: str, tunnel_overhead: int = 0) -> NodeState:
    """The node's state with every readiness gate, in the order /readyz lists them; *tunnel_overhead*:
    what encryption takes from the pods' MTU (encryption on: the WireGuard guard's gate too)."""
    gates = [API_GATE, NODECONFIG_INFORMER_GATE, nodeconfig_gate(node), POD_INFORMER_GATE, ADD_GATE, POLICY_READY_GATE]
    return NodeState(node, [*gates, GUARD_GATE] if tunnel_overhead else gates, tunnel_overhead=tunnel_overhead)


def compose(
    settings: AgentSettings,
    *,
    store: AllocationStore,
    crash: CrashPoint = NO_CRASH,
    watchers: tuple[WatcherFactory, ...] = (),
) -> Agent:
    """flock-agent for *settings* over the open allocation *store* (see the module doc)."""
    encrypting = settings.encryption == "wireguard"
    state = node_state(settings.node, WIREGUARD_OVERHEAD[settings.wireguard_fabric] if encrypting else 0)
    metrics = Metrics()
    netlink = NetlinkWorker(host_netns=settings.host_netns, fault=crash.setup_fault if crash.name else None)
    if settings.bird:
        watchers = (*watchers, bgp_passwords(settings.namespace, state))
    policy_inputs = PolicyInputs()
    peers = PeerFeed(policy_inputs, settings.node) if settings.policy_peers == "groups" else None
    policy_link = PolicyLink(policy_inputs, peers)
    service_proxy = services_part(settings, state, netlink, default_backend(settings.host_netns), metrics.registry)
    if settings.service_proxy:
        watchers = (*watchers, service_proxy.watchers)
    announcing = settings.bird and settings.service_proxy  # Service routes over BGP
    if announcing:
        watchers = (*watchers, node_watcher(settings.node, state))
    wireguard = wireguard_part(
        settings.node,
        encryption=settings.encryption,
        state_dir=settings.state_dir,
        host_netns=settings.host_netns,
        device=settings.wireguard_device,
        kind=settings.wireguard_kind,
        port=settings.wireguard_port,
        fabric=settings.wireguard_fabric,
        table=settings.wireguard_table,
        rule_priority=settings.wireguard_rule_priority,
        allow_plaintext_to=settings.allow_plaintext_to,
        nft=default_backend(settings.host_netns),
        mtu=lambda: state.pod_mtu,
        note=state.set_note,
        guarded=lambda: state.open_gate(GUARD_GATE.name),
    )
    if wireguard.watchers is not None:
        watchers = (*watchers, wireguard.watchers)
    api = ApiLink(settings.node, settings.kubeconfig, state, watchers=watchers, cluster_pods=policy_link.cluster_pods)
    policy_metrics = PolicyMetrics(metrics.registry)
    policy = PolicyService(
        inputs=policy_inputs,
        local=state,
        # in-process libnftables on a thread of its own, in the node's namespace (the kernel side of --host-netns)
        applier=NftApplier(default_backend(settings.host_netns)),
        node=settings.node,
        host_ifname=netlink.host_ifname,
        readiness=state,
        watermark=policy_link,
        metrics=policy_metrics,
        nodeconfig=lambda: state.nodeconfig,
        forget_flows=netlink.forget_flows,
    )
    # Off until a Namespace asks for it (annotation flock.fritzlab.net/log-denied): then the kernel logs
    # that namespace's pods' drops to the group, and this reads them, in the node's namespace.
    denied_log = DenyLogService(
        rules=policy,
        local=state,
        inputs=policy_inputs,
        counters=policy_metrics.denied,
        open_socket=functools.partial(nflog_socket, DENY_LOG_GROUP, settings.host_netns),
    )
    removals = VethRemovals(netlink, checkpoint=crash)
    handler = PodHandler(
        store=store,
        dataplane=netlink,
        pods=api,
        state=state,
        observe=metrics.observe,
        stage=metrics.stage,
        checkpoint=crash,
        policy=policy,
        removals=removals,
        add_gates=(GUARD_GATE.name,) if encrypting else (),
    )
    pending_deletes = settings.socket.parent / PENDING_DELETES
    bringup = NodeBringUp(
        handler=handler,
        dataplane=netlink,
        state=state,
        pending_deletes=pending_deletes,
        prepare=functools.partial(netlink.prepare_node, settings.uplink),
        uplink_mtu=netlink.uplink_mtu,
    )
    rpc = RpcServer(settings.socket, handler=handler)
    host, port = settings.health_address
    health = HealthServer(host, port, readiness=state, metrics=metrics)
    _node_metrics(metrics, state)
    metrics.gauge(
        "flock_veth_removals_pending",
        "DEL'd pods whose host veth is still being deleted (their addresses stay held until it is gone).",
        lambda: float(removals.pending),
    )
    metrics.counter(
        "flock_veth_removal_failures",
        "Failed background veth deletions (each logged with its container_id and retried).",
        lambda: float(removals.failures),
    )
    admin = AdminServer(
        settings.admin_path,
        AdminOps(
            state=state,
            handler=handler,
            netlink=netlink,
            pending_deletes=pending_deletes,
            bird_socket=settings.bird_socket if settings.bird else None,
            policy=policy,
            policy_watch=policy_link,
            services=service_proxy.proxy,
            fetch_pod=api.fetch_policy_pod if peers is not None else None,
            encryption=wireguard.service,
        ),
    )
    services = [
        # Logs when the node is first ready; hands the garbage collector back.
        ChildSpec("startup", StartupWatch(state).run, restart=Restart.TRANSIENT),
        # Before the RPC server, so DEL defers from the first request (without it DEL deletes synchronously).
        ChildSpec("removals", removals.run),
        # Another agent on the socket does not go away by restarting: exit at once.
        ChildSpec("rpc", rpc.run, fatal=(SocketInUse,)),
        ChildSpec("health", health.run),
        # Before the API link: what start-up does with the store and the kernel
        # alone runs while the informers list (ADD waits behind its gate).
        ChildSpec("pods", bringup.run),
        # flockctl's socket: read-mostly ops; releases go through the handler.
        ChildSpec("admin", admin.run, fatal=(SocketInUse,)),
        ChildSpec("api", api.run),
        ChildSpec("policy", policy.run),
        ChildSpec("policy-log", denied_log.run),
        # Services (--service-proxy): table inet flock-services; off, it only removes that table.
        *service_proxy.children(),
        # --encryption wireguard: key, published key, device, peers, routes, the fail-closed guard table
        # (inet flock-wireguard); off: that table removed.
        wireguard.child,
    ]
    if settings.bird:
        reloader = BirdReloader(
            config_path=settings.bird_config,
            control_socket=settings.bird_socket,
            settings=RenderSettings(
                route_protocol=ROUTE_PROTOCOL, bgp_timers=BgpTimers() if settings.bgp_lab_timers else None
            ),
            inputs=functools.partial(bird_inputs, state),
            notes=state,
        )
        _bird_metrics(metrics, reloader)
        sessions = session_monitor(state, settings.bird_socket, settings.namespace)
        _bgp_metrics(metrics, state, sessions)
        services.append(ChildSpec("bird", BirdFollower(state, reloader).run))
        services.append(ChildSpec("bgp-sessions", sessions.run))
    if announcing:
        leave = ServiceLeave(state, settings.bgp_leave_seconds, apply=reloader.apply_now)
        services.append(ChildSpec("bgp-leave", leave.run))
        # SIGTERM: Service routes with GRACEFUL_SHUTDOWN, then withdrawn, beside the drains below.
        return Agent(
            services,
            drains=[rpc.drain, removals.drain],
            leaves=[leave.leave],
            deadline=SHUTDOWN_DEADLINE_S + settings.bgp_leave_seconds + 2.0,
        )
    # SIGTERM: no new requests, then a bounded wait for the veths DEL handed off.
    return Agent(services, drains=[rpc.drain, removals.drain])


STORE_GATE = Gate("store", "the allocation database is from a newer flock", label="store: ")


def store_too_new_reason(settings: AgentSettings, exc: StoreTooNew) -> str:
    """What /readyz, the log and every CNI answer say: both versions and what to do."""
    path = settings.state_dir / FILENAME
    backups = sorted(settings.state_dir.glob(f"{FILENAME}.schema-*.backup"))
    mine = backup_path(path, len(MIGRATIONS))
    restore = (
        f"or roll back the database too: stop this agent and replace {path} (and its -wal and -shm files) with "
        f"{mine}, which that release's upgrade left"
        if mine in backups
        else "no backup for this release's schema is in the state directory"
    )
    return (
        f"{exc.details} (this is flock-agent {__version__}). This agent touches nothing until that is resolved: "
        f'roll forward to the release that wrote the database ("Upgrading", docs/upgrading.md), {restore}'
    )


@attrs.define(eq=False)
class StoreTooNewHandler:
    """Every CNI request while the database is unusable: retry later (STATUS: not available).

    Not even DEL succeeds: the allocation it would remove is in the database this agent may not
    write; the runtime retries it once a release that can is running."""

    reason: str

    async def __call__(self, request: Request) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        code = NOT_AVAILABLE if request.op == "STATUS" else TRY_AGAIN_LATER
        raise CniError(code, "the allocation database is from a newer flock", self.reason[:1500])


def compose_store_too_new(settings: AgentSettings, exc: StoreTooNew) -> Agent:
    """flock-agent without its database: the socket (refusing every request) and /readyz (not ready,
    saying why) only — no netlink, nftables or BIRD change, no API watch."""
    reason = store_too_new_reason(settings, exc)
    log.error("the allocation database is from a newer flock: not serving", extra={"error": reason})
    state = NodeState(settings.node, [STORE_GATE])
    state.close_gate(STORE_GATE.name, reason)
    metrics = Metrics()
    metrics.gauge("flock_ready", "1 when /readyz passes.", lambda: 0.0)
    metrics.gauge("flock_store_too_new", "1 while the allocation database is from a newer flock.", lambda: 1.0)
    rpc = RpcServer(settings.socket, handler=StoreTooNewHandler(reason))
    host, port = settings.health_address
    health = HealthServer(host, port, readiness=state, metrics=metrics)
    services = [ChildSpec("rpc", rpc.run, fatal=(SocketInUse,)), ChildSpec("health", health.run)]
    return Agent(services, drains=[rpc.drain])


def _node_metrics(metrics: Metrics, state: NodeState) -> None:
    metrics.labelled_gauge(
        "flock_allocations",
        "Pod allocations this agent holds, by state.",
        "state",
        [s.value for s in AllocationState],
        lambda: {s.value: float(n) for s, n in state.allocation_counts().items()},
    )
    metrics.gauge("flock_ready", "1 when /readyz passes.", lambda: float(state.ready))
    metrics.gauge(
        "flock_nodeconfig_deleted",
        "1 while this node's NodeConfig is deleted and the last one is in force.",
        lambda: float(state.nodeconfig_deleted),
    )
    metrics.gauge(
        "flock_nodeconfig_refused",
        "1 while the newest NodeConfig is invalid and the previous one is in force.",
        lambda: float(state.nodeconfig_refused is not None),
    )


def _bgp_metrics(metrics: Metrics, state: NodeState, sessions: SessionMonitor) -> None:
    def established() -> dict[str, float]:
        node, seen = state.nodeconfig, sessions.sessions
        if node is None or node.bgp is None or seen is None:
            return {}
        return {p.name: float((s := seen.get(f"bgp_{p.name}")) is not None and s.established) for p in node.bgp.peers}

    def password_missing() -> dict[str, float]:
        node = state.nodeconfig
        peers = [p for p in (node.bgp.peers if node is not None and node.bgp is not None else ()) if p.password]
        return {p.name: float(p.name not in state.bgp_passwords) for p in peers}

    def withheld() -> float:
        inputs = bird_inputs(state)
        return float(len(inputs.withheld)) if inputs is not None else 0.0

    metrics.dynamic_gauge(
        "flock_bgp_session_established",
        "1 while BIRD's session to the peer is Established (the NodeConfig's peers, by name).",
        "peer",
        established,
    )
    metrics.dynamic_gauge(
        "flock_bgp_password_missing",
        "1 while a peer's password Secret cannot be used (the session is kept down).",
        "peer",
        password_missing,
    )
    metrics.gauge(
        "flock_anycast_withheld",
        "Anycast addresses routed to local pods but not announced: none of those pods is Ready.",
        withheld,
    )


def _bird_metrics(metrics: Metrics, reloader: BirdReloader) -> None:
    metrics.counter("flock_bird_reloads", "Successful birdc configure calls.", lambda: float(reloader.reloads))
    metrics.gauge(
        "flock_bird_pending",
        "1 while BIRD has not taken the newest config (reloader retrying).",
        lambda: float(reloader.last_error is not None),
    )
    metrics.counter(
        "flock_bird_reload_failures", "Failed BIRD check/configure attempts.", lambda: float(reloader.failures)
    )


async def run_agent(
    settings: AgentSettings,
    *,
    crash: CrashPoint = NO_CRASH,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Check the state directory, open the store (DEL and CHECK need nothing
    more), then run the composed tree until a signal.  An unusable state
    directory or database raises :class:`FatalStartError`."""
    check_state_dir(settings.state_dir)
    log.info("starting", extra={"node": settings.node, "socket": str(settings.socket)})
    try:
        async with open_store(settings.state_dir, legacy_network=settings.network_name) as store:
            log.info("allocation store open", extra={"path": str(store.path), **(await store.settings())})
            await compose(settings, store=store, crash=crash).run(task_status=task_status)
    except StoreTooNew as exc:
        # Restarting cannot help and exiting would only crash-loop: stay up, not ready, saying why.
        await compose_store_too_new(settings, exc).run(task_status=task_status)
    except StoreError as exc:
        # Only opening (or closing) can raise it here: the tree's failures
        # reach this far as SupervisorEscalation.  A corrupt or unreadable
        # database stays so across restarts: exit at once, naming it.
        raise FatalStartError(f"{exc}. {STORE_REMEDY}") from exc
    log.info("stopped")
