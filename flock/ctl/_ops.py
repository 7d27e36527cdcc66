"""What the admin socket answers, from the agent's own objects (DESIGN: "what flockctl asks").

Read-mostly: every op but ``ipam-release`` only reads NodeState, the store,
the kernel (through the netlink worker's read-only inventory and CHECK),
BIRD (``birdc -r``, restricted to show commands) and the policy service
(``policy-explain``: its inputs, this node's attached pods and its ruleset;
with ``verify``, one real packet from the source pod, traced by the kernel
under a table of flock's own that is gone again afterwards).  ``ipam-release`` goes
through the pod handler (its lock, the store, the IPAM, the kernel), exactly
as a DEL would, and refuses an allocation whose network namespace is still
there (a live pod or runtime attachment) unless ``force``.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

import flock
from flock.model import Allocation, AllocationState, NodeConfig
from flock.netlink import NetlinkWorker, host_ifname, is_host_ifname
from flock.pods import PodHandler
from flock.policy import (
    AgentView,
    ClusterNetworkPolicy,
    Explanation,
    NftCommand,
    NftError,
    PolicyPod,
    PolicyService,
    Query,
    Ruleset,
    Tier,
    TraceError,
    Tracer,
    Verification,
    explain,
    verification_of,
    verify_plan,
)
from flock.rpc.wire import SPOKEN_VERSIONS
from flock.services import ServiceProxy
from flock.services._view import bgp_view, services_view
from flock.state import NodeState

from ._pools import cidr_usage, pool_report
from ._protocol import ADMIN_PROTOCOL_VERSION

log = logging.getLogger("flock.ctl")

BIRDC_DEADLINE_S = 5.0
# A pending row older than this is an ADD that died (the runtime's retry or DEL would have come).
STUCK_PENDING_S = 120.0
# CHECK of every committed pod at once: bounded, so a wedged kernel read cannot hang the op.
KERNEL_CHECK_DEADLINE_S = 20.0


# Refused objects and fail-closed rules listed by ``status`` at most (then "and N more").
STATUS_LIST_MAX = 10
# Shortest container ID prefix taken where flockctl takes a container ID
# (``flockctl pods`` shows 16 characters; a full ID is always taken).
MIN_CONTAINER_PREFIX = 4
# Most candidates an ambiguous prefix's refusal names.
AMBIGUOUS_LIST_MAX = 10


class PolicyWatch(Protocol):
    """What the policy watchers know that ``status`` shows (the agent's :class:`flock.agent.PolicyLink`)."""

    @property
    def cluster_policies(self) -> Mapping[str, ClusterNetworkPolicy]: ...

    @property
    def refused(self) -> Mapping[str, str]:
        """Objects left out because the policy model refused them: "Kind key" → why."""
        ...


def policy_watch_view(watch: PolicyWatch, limit: int = STATUS_LIST_MAX) -> dict[str, Any]:
    """ClusterNetworkPolicies per tier, refused objects and the rules that fail closed, each list
    at most *limit* long with its full count beside it."""
    policies = watch.cluster_policies
    tiers = {tier.value: 0 for tier in Tier}
    fail_closed: list[dict[str, str]] = []
    fail_closed_total = 0
    for name in sorted(policies):
        policy = policies[name]
        tiers[policy.tier.value] += 1
        rules = policy.unreadable_rules()
        fail_closed_total += len(rules)
        fail_closed.extend({"policy": name, "rule": rule} for rule in rules[: max(0, limit - len(fail_closed))])
    refused = watch.refused
    return {
        "cluster_policies": tiers,
        "refused": [{"object": key, "why": refused[key]} for key in sorted(refused)[:limit]],
        "refused_total": len(refused),
        "fail_closed": fail_closed,
        "fail_closed_total": fail_closed_total,
    }


class EncryptionAdmin(Protocol):
    """The agent's WireGuard service as flockctl sees it (flock.agent._wireguard.WireGuardService)."""

    async def admin_status(self) -> dict[str, Any]: ...

    async def rotate(self) -> Any:
        """A new key; its ``public_key`` and ``previous`` (a NodeKey).  FileExistsError (RotationPending)
        while the previous rotation's key is still kept."""
        ...


class OpRefused(Exception):
    """The op cannot be done as asked (unknown target, a live holder without force)."""

    def __init__(self, error: str, details: str = "") -> None:
        super().__init__(error)
        self.error, self.details = error, details


@attrs.frozen
class Peer:
    """Who is asking (SO_PEERCRED)."""

    pid: int
    uid: int
    gid: int


def netns_alive(path: str) -> bool:
    """Whether the attachment's network namespace still exists (a live pod or runtime attachment)."""
    return bool(path) and os.path.exists(path)


def allocation_view(
    alloc: Allocation, now: float, host_prefix_name: str, host_links: set[str] | None
) -> dict[str, Any]:
    return {
        "container_id": alloc.container_id,
        "namespace": alloc.namespace,
        "pod": alloc.pod,
        "pod_uid": alloc.pod_uid,
        "if_name": alloc.if_name,
        "netns": alloc.netns,
        "netns_alive": netns_alive(alloc.netns),
        "addresses": [str(a) for a in (alloc.ip6, alloc.ip4, *alloc.addresses) if a is not None],
        "anycast": [str(a) for a in alloc.anycast],
        "network": alloc.network,
        "ports": [m.describe() for m in alloc.port_mappings],
        "host_veth": host_prefix_name,
        "host_veth_present": None if host_links is None else host_prefix_name in host_links,
        "state": alloc.state.value,
        "age_s": round(max(0.0, now - alloc.created), 1),
    }


def nodeconfig_view(node: NodeConfig | None) -> dict[str, Any] | None:
    if node is None:
        return None
    return {
        "name": node.name,
        "cidr6": str(node.cidr6),
        "cidr4": str(node.cidr4) if node.cidr4 else None,
        "families": [f for f, on in (("ipv6", node.families.ipv6), ("ipv4", node.families.ipv4)) if on],
        "asn": node.bgp.asn if node.bgp else None,
        "router_id": str(node.bgp.router_id) if node.bgp else None,
        "peers": [{"name": p.name, "address": str(p.address), "asn": p.asn} for p in node.bgp.peers]
        if node.bgp
        else [],
        "ip_algo": node.ip_algo,
        "resource_version": node.resource_version,
    }


def _who(a: Allocation) -> str:
    return f"pod {a.namespace}/{a.pod}" if a.namespace else f"no pod {a.pod}".rstrip()


def container_by_prefix(rows: list[Allocation], prefix: str) -> Allocation | None:
    """The allocation whose container ID is *prefix* or starts with it (as
    crictl and docker take IDs); None when none does.  :class:`OpRefused`
    for a prefix under :data:`MIN_CONTAINER_PREFIX` characters that is no
    full ID, and for one several IDs start with (naming at most
    :data:`AMBIGUOUS_LIST_MAX` of them)."""
    exact = next((a for a in rows if a.container_id == prefix), None)
    if exact is not None:
        return exact
    if len(prefix) < MIN_CONTAINER_PREFIX:
        raise OpRefused(
            "container ID prefix too short",
            f"{prefix[:64]!r}: give at least {MIN_CONTAINER_PREFIX} characters of the container ID "
            "(flockctl pods shows 16), an address or a flock veth",
        )
    matches = sorted((a for a in rows if a.container_id.startswith(prefix)), key=lambda a: a.container_id)
    if len(matches) > 1:
        raise OpRefused(
            "ambiguous container ID prefix",
            f"{prefix[:64]!r} matches {len(matches)} containers: "
            f"{_listed([f'{a.container_id} ({_who(a)})' for a in matches])}; give more of the ID",
        )
    return matches[0] if matches else None


def _listed(names: list[str], limit: int = AMBIGUOUS_LIST_MAX) -> str:
    """*names* joined, at most *limit* of them and how many more."""
    more = len(names) - limit
    return ", ".join(names[:limit]) + (f" and {more} more" if more > 0 else "")


def problem(kind: str, subject: str, detail: str, remedy: str) -> dict[str, str]:
    return {"kind": kind, "subject": subject, "detail": detail, "remedy": remedy}


@attrs.define(eq=False)
class AdminOps:
    """The admin ops over the agent's own services (wired by the composition root)."""

    state: NodeState
    handler: PodHandler
    netlink: NetlinkWorker
    pending_deletes: Path
    bird_socket: Path | None = None  # None: no BIRD on this node
    policy: PolicyService | None = None
    policy_watch: PolicyWatch | None = None
    services: ServiceProxy | None = None  # the service proxy (on or off); None: an agent without one
    # With address groups (--policy-peers=groups) the agent knows only its own pods and its peers: an end
    # of an explain query it does not know is read from the API server (one GET).  None: every pod is known.
    fetch_pod: Callable[[str, str], Awaitable[PolicyPod | None]] | None = None
    encryption: EncryptionAdmin | None = None  # the WireGuard service (None: encryption off)
    started: float = attrs.field(factory=time.time)
    clock: Any = time.time
    # --verify's: nft and the trace read in the node's namespace (the netlink worker's)
    tracer: Tracer = attrs.field()
    _verify_lock: trio.Lock = attrs.field(init=False, factory=trio.Lock)  # one trace table: one at a time

    @tracer.default
    def _node_tracer(self) -> Tracer:
        netns = self.netlink.host_netns
        return Tracer(NftCommand(("nsenter", f"--net={netns}", "nft") if netns else ("nft",)), netns)

    def policy_status(self) -> dict[str, Any] | None:
        """What ``table inet flock`` holds now and whether the last apply failed; with the
        watchers, also the ClusterNetworkPolicies, refused objects and fail-closed rules."""
        if self.policy is None:
            return None
        applied = self.policy.applied
        watched = policy_watch_view(self.policy_watch) if self.policy_watch is not None else {}
        return {
            **watched,
            "applied": applied is not None,
            "error": self.policy.last_error,
            "applied_resource_version": self.policy.applied_resource_version,
            "isolated_pods": 0 if applied is None else len({*applied.ingress_map, *applied.egress_map}),
            "chains": 0 if applied is None else len(applied.chains),
            "sets": 0
            if applied is None
            else len(applied.address_sets) + len(applied.port_sets) + len(applied.service_sets),
        }

    async def dispatch(self, op: str, request: dict[str, Any], peer: Peer) -> dict[str, Any]:
        if op == "status":
            return await self.status()
        if op == "pods":
            return await self.pods()
        if op == "ipam-show":
            return self.ipam_show()
        if op == "ipam-check":
            return await self.ipam_check()
        if op == "ipam-release":
            target = request.get("target")
            if not isinstance(target, str) or not target or len(target) > 256:
                raise OpRefused(
                    "invalid target",
                    f"target={str(target)[:64]!r}: expected an address, a container ID "
                    f"(or at least {MIN_CONTAINER_PREFIX} characters of one) or a flock veth",
                )
            return await self.ipam_release(target, force=request.get("force") is True, peer=peer)
        if op == "bgp":
            return await self.bgp()
        if op == "wireguard-rotate":
            return await self.wireguard_rotate()
        if op == "services":
            only = request.get("service")
            if only is not None and (not isinstance(only, str) or only.count("/") != 1 or len(only) > 320):
                raise OpRefused("invalid service", f"service={str(only)[:64]!r}: expected NAMESPACE/NAME")
            return await self.services_view(only)
        if op == "policy-explain":
            try:
                query = Query.parse(
                    request.get("from"),
                    request.get("to"),
                    request.get("port"),
                    request.get("protocol"),
                    request.get("family"),
                )
            except ValueError as exc:
                raise OpRefused("invalid query", str(exc)) from None
            return await self.policy_explain(query, verify=request.get("verify") is True)
        raise OpRefused("unknown op", f"op={op[:32]!r}")

    # -- status ----------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        state = self.state
        counts = state.allocation_counts()
        pools = pool_report(state.nodeconfig, state.allocations.values())
        bgp = await self.bgp() if self.bird_socket is not None else None
        return {
            "node": state.node_name,
            "ready": state.ready,
            "not_ready": state.not_ready(),
            "gates": [
                {"name": g.name, "open": not state.reason(g.name), "reason": state.reason(g.name)} for g in state.gates
            ],
            "notes": state.notes(),
            "nodeconfig": nodeconfig_view(state.nodeconfig),
            "nodeconfig_deleted": state.nodeconfig_deleted,
            "nodeconfig_refused": state.nodeconfig_refused,
            # What new pods get (existing pods keep what they were set up with).
            "mtu": {"value": state.pod_mtu.value, "source": state.pod_mtu.source},
            "allocations": {s.value: counts.get(s, 0) for s in AllocationState},
            "pools": pools["blocks"],
            "exhausted": [str(b) for b in state.exhausted],
            "queued_deletes": self.queued_deletes(),
            "veth_removals": self.veth_removals(),
            "bgp": None
            if bgp is None
            else {
                "reachable": bgp["reachable"],
                "error": bgp["error"],
                "sessions": [{k: s[k] for k in ("name", "neighbor", "state", "info")} for s in bgp["sessions"]],
            },
            "policy": self.policy_status(),
            "service_proxy": self.service_proxy_status(),
            "encryption": await self.encryption.admin_status() if self.encryption is not None else {"mode": "off"},
            "agent": {
                "version": flock.__version__,
                "pid": os.getpid(),
                "uptime_s": round(self.clock() - self.started, 1),
                "cni_wire_versions": list(SPOKEN_VERSIONS),
                "admin_protocol_version": ADMIN_PROTOCOL_VERSION,
            },
        }

    async def wireguard_rotate(self) -> dict[str, Any]:
        """A new WireGuard key for this node, published; the previous one is forgotten once every peer
        has shaken hands with the new one.  Public keys only in the answer."""
        if self.encryption is None:
            raise OpRefused("encryption is off", "flock-agent runs without --encryption wireguard: no key to rotate")
        try:
            keys = await self.encryption.rotate()
        except FileExistsError as exc:
            raise OpRefused("rotation pending", str(exc)) from None
        return {
            "public_key": keys.public_key.base64,
            "previous_public_key": keys.previous.public_key.base64 if keys.previous is not None else None,
        }

    def service_proxy_status(self) -> dict[str, Any] | None:
        """Whether the service proxy is on, and where it stands (``status`` and ``services``)."""
        proxy = self.services
        if proxy is None:
            return None
        inputs = proxy.inputs
        notes = [n for n in self.state.notes() if n.startswith("service proxy")]
        if not proxy.enabled:
            state = "off (flock-agent --service-proxy turns it on)"
        elif notes:
            state = notes[0]
        elif not inputs.complete:
            state = "waiting for the Service and EndpointSlice lists"
        elif proxy.applied_generation == inputs.generation:
            state = "in sync"
        else:
            state = "applying"
        return {
            "enabled": proxy.enabled,
            "state": state,
            "services": len(inputs.services),
            "endpoint_slices": len(inputs.slices),
            "conflicts": list(proxy.conflicts),
        }

    async def services_view(self, only: str | None) -> dict[str, Any]:
        proxy = self.services
        if proxy is None or not proxy.enabled:
            return {"proxy": self.service_proxy_status(), "services": []}
        node = await proxy.node()
        found = services_view(proxy.inputs.services, proxy.inputs.slices, node, proxy.config(), only)
        if only is not None and not found:
            raise OpRefused(
                "no such Service", f"{only[:128]} is not among the {len(proxy.inputs.services)} this node knows"
            )
        bgp: dict[str, Any] | None = None
        if proxy.on_announce is not None:  # this node announces Service addresses over BGP
            for view in found:
                view["bgp"] = bgp_view(f"{view['namespace']}/{view['name']}", proxy.announcements)
            bgp = {
                "routes": sum(len(r.nets) for r in proxy.announced),
                "leaving": sorted(self.state.leaving),
                "withdrawn": self.state.leave_withdrawn,
            }
        return {
            "proxy": self.service_proxy_status(),
            "node_addresses": [str(a) for a in node.addresses],
            "bgp": bgp,
            "services": found,
        }

    def veth_removals(self) -> dict[str, int]:
        """DEL'd pods whose veth the agent is still deleting (their addresses held meanwhile)."""
        removals = self.handler.removals
        return {"pending": removals.pending, "failures": removals.failures} if removals is not None else {}

    def queued_deletes(self) -> list[str]:
        """Container IDs whose DEL the shim queued while the agent was away."""
        try:
            return sorted(p.name.removesuffix(".json") for p in self.pending_deletes.iterdir() if p.suffix == ".json")
        except OSError:
            return []

    # -- policy explain --------------------------------------------------------

    def explain_view(self, policy: PolicyService, own_addresses: frozenset = frozenset()) -> AgentView:
        """What the policy service knows now: its inputs (a snapshot), this node's attached pods as it
        compiles them, the ruleset it last handed to the kernel, and this node's own addresses."""
        local, _ = policy.local_pods(policy.local.allocations) if policy.local.allocations_loaded else ([], {})
        return AgentView(
            own_addresses=own_addresses,
            node=policy.node,
            inputs=policy.inputs.snapshot(),
            local_pods={p.key: p for p in local},
            ruleset=policy.ruleset(),
            resource_version=policy.watermark.watermark if policy.watermark is not None else 0,
            applied_resource_version=policy.applied_resource_version,
            apply_error=policy.last_error,
        )

    async def policy_explain(self, query: Query, *, verify: bool = False) -> dict[str, Any]:
        """``flockctl policy explain`` (:func:`flock.policy.explain`): the view is taken at one instant
        here; the compile (O(the cluster's pods), as a full compile's peers) runs on a worker thread.
        With *verify*, the kernel is asked too (:meth:`policy_verify`): the reply's ``verify``."""
        if self.policy is None:
            raise OpRefused("no policy service", "this agent enforces no NetworkPolicy: there is nothing to explain")
        own = await self._own_addresses()
        structure = self.policy.applied
        view = self.explain_view(self.policy, own)
        view = await self._with_ends(view, query)
        explanation = await trio.to_thread.run_sync(explain, view, query)
        doc = explanation.to_json()
        if verify:
            doc["verify"] = (await self.policy_verify(explanation, view, structure)).to_json()
        return doc

    async def _with_ends(self, view: AgentView, query: Query) -> AgentView:
        """*view* with the query's pod ends it does not know, read from the API server (address groups: the
        agent knows its pods and its peers only).  Both ends known is what a pair's verdict needs: each
        side's policies select by the other end's labels, and its named ports are its own."""
        if self.fetch_pod is None:
            return view
        known = {**view.inputs.pods, **view.local_pods}
        fetched: dict[str, PolicyPod] = {}
        for end in (query.source, query.destination):
            namespace, slash, name = end.partition("/")
            if not slash or end in known or not namespace or not name or "/" in name:
                continue
            try:
                pod = await self.fetch_pod(namespace, name)
            except Exception as exc:  # the API unreachable: explain says the pod is unknown, as before
                log.warning("explain: cannot read pod %s", end[:300], extra={"pod": end[:300], "error": str(exc)[:300]})
                continue
            if pod is not None:
                fetched[end] = pod
        if not fetched:
            return view
        return attrs.evolve(view, inputs=attrs.evolve(view.inputs, pods={**view.inputs.pods, **fetched}))

    async def forget_leftovers(self) -> None:
        """At start: what a previous agent killed during ``--verify`` left in the kernel (the trace table) goes."""
        if self.policy is None:
            return
        try:
            await self.tracer.forget_leftovers()
        except (NftError, TraceError, OSError) as exc:  # a table left tracing one flow: worth a warning, no more
            log.warning("could not delete a trace table left behind", extra={"error": str(exc)[:300]})

    async def _own_addresses(self) -> frozenset:
        """This node's addresses (a pod reaching one meets its node's input hook, not the forward hook);
        empty when netlink cannot say (explain then knows the node only from Node objects)."""
        try:
            return frozenset(await self.netlink.node_addresses())
        except Exception as exc:  # KernelRefused and the like: explain without them, as before
            log.warning("explain: cannot read this node's addresses", extra={"error": str(exc)[:200]})
            return frozenset()

    async def policy_verify(self, explanation: Explanation, view: AgentView, structure: Ruleset | None) -> Verification:
        """``--verify``: the query's first packet, sent from inside the source pod (one of this node's) with
        nftables tracing on for it alone (:class:`flock.policy.Tracer`), and the kernel's way held to
        *explanation* (made from *view*, while the kernel held *structure*).  One at a time.

        Error handling: what keeps the packet from being sent or traced is the answer ("not-verified",
        why); the trace table's removal failing (nft's error) propagates: the op fails, and says so."""
        assert self.policy is not None
        node = view.node
        plan = verify_plan(explanation, node)
        if isinstance(plan, str):
            return Verification("not-verified", plan, node)
        netns = self._pod_netns(plan.iif)
        if netns is None:
            return Verification("not-verified", f"cannot verify: the network namespace of {plan.pod} is gone", node)
        async with self._verify_lock:
            try:
                captured = await self.tracer.trace(plan, netns)
            except TraceError as exc:
                return Verification("not-verified", f"cannot verify: {exc.strerror or exc}", node)
            if self.policy.applied is not structure:
                why = "cannot verify: flock's ruleset changed while the packet was traced: run it again"
                return Verification("not-verified", why, node, captured.flow)
        result = verification_of(explanation, node, captured, view.ruleset)
        log.info(
            "policy explain --verify: a packet sent from a pod, traced",
            extra={"op": "policy-verify", "pod": plan.pod, "flow": captured.flow.text(), "status": result.status},
        )
        return result

    def _pod_netns(self, veth: str) -> str | None:
        """The network namespace of this node's attachment behind host veth *veth* (None: none, or gone)."""
        assert self.policy is not None
        local = self.policy.local
        if not local.allocations_loaded:
            return None
        for cid, alloc in local.allocations.items():
            if self.policy.host_ifname(cid) == veth and netns_alive(alloc.netns):
                return alloc.netns
        return None

    # -- pods ------------------------------------------------------------------

    async def _links(self) -> set[str] | None:
        try:
            return set((await self.netlink.inventory()).interfaces)
        except Exception as exc:
            log.warning("cannot list flock's interfaces", extra={"error": str(exc)})
            return None

    async def pods(self) -> dict[str, Any]:
        rows = await self.handler.store.list()
        links = await self._links()
        now = self.clock()
        return {
            "pods": [
                allocation_view(a, now, self.netlink.host_ifname(a.container_id), links)
                for a in sorted(rows, key=lambda a: (a.namespace, a.pod, a.container_id))
            ],
            "kernel_read": links is not None,
        }

    # -- ipam show -------------------------------------------------------------

    def ipam_show(self) -> dict[str, Any]:
        report = pool_report(self.state.nodeconfig, self.state.allocations.values())
        return {"node": self.state.node_name, **report, "annotation_cidrs": self.annotation_cidrs()}

    def annotation_cidrs(self) -> list[dict[str, Any]]:
        """Usage of the CIDRs pods' ``cidr6``/``cidr4`` annotations narrow their node block to
        (from the pod informer's cache: pods it does not hold are not counted)."""
        node, ipam, pods = self.state.nodeconfig, self.handler.ipam, self.state.pods
        if node is None or ipam is None or pods is None:
            return []
        allocations = list(self.state.allocations.values())
        counts: dict[ipaddress.IPv4Network | ipaddress.IPv6Network, int] = {}
        for a in allocations:
            info = pods.get(f"{a.namespace}/{a.pod}")
            if info is None:
                continue
            try:
                request = ipam.request(info)
            except Exception:  # an annotation changed since ADD and is now invalid: not this view's to report
                continue
            for cidr in (request.cidr6, request.cidr4):
                if cidr is not None and cidr not in (node.cidr6, node.cidr4):
                    counts[cidr] = counts.get(cidr, 0) + 1
        return [
            cidr_usage(cidr, allocations, n)
            for cidr, n in sorted(counts.items(), key=lambda kv: (kv[0].version, kv[0]))
        ]

    # -- ipam check (local part) -----------------------------------------------

    async def ipam_check(self) -> dict[str, Any]:
        """Store vs the allocation view and the IPAM, vs the kernel; problems with what to do."""
        problems: list[dict[str, str]] = []
        unreached: list[dict[str, str]] = []
        rows = await self.handler.store.list()
        now = self.clock()
        by_id = {a.container_id: a for a in rows}
        view = self.state.allocations
        ipam = self.handler.ipam
        for a in rows:
            release = f"flockctl ipam release {a.container_id}"
            if a.container_id not in view:
                problems.append(
                    problem(
                        "row-not-in-use",
                        a.container_id,
                        "stored, but the agent left it out at start-up (its address is held by another row)",
                        f"find the other holder with `flockctl pods --address {a.all_addresses[0] if a.all_addresses else '?'}`; "
                        f"then {release}",
                    )
                )
            elif ipam is not None and ipam.allocator.held(a.container_id) is None:
                problems.append(
                    problem(
                        "ipam-mismatch",
                        a.container_id,
                        "stored, but the IPAM does not hold its addresses",
                        "restart the agent (it rebuilds the IPAM from the store)",
                    )
                )
            if not netns_alive(a.netns):
                problems.append(
                    problem(
                        "leaked-allocation",
                        a.container_id,
                        f"{_who(a)}: its network namespace {a.netns} is gone but the allocation "
                        f"({', '.join(map(str, a.all_addresses))}) is still held",
                        release,
                    )
                )
            elif a.state is AllocationState.PENDING and now - a.updated > STUCK_PENDING_S:
                problems.append(
                    problem(
                        "stuck-pending",
                        a.container_id,
                        f"ADD began {now - a.updated:.0f} s ago and never finished",
                        f"the runtime should retry ADD or DEL; if the pod is gone: {release}",
                    )
                )
        for cid in view:
            if cid not in by_id:
                problems.append(
                    problem("view-not-stored", cid, "held in memory but not in the store", "restart the agent")
                )
        owners: dict[str, list[str]] = {}
        for a in rows:
            for addr in (a.ip6, a.ip4, *a.addresses):
                if addr is not None:
                    owners.setdefault(str(addr), []).append(a.container_id)
        for text, holders in sorted(owners.items()):
            if len(holders) > 1:
                problems.append(
                    problem(
                        "duplicate-address",
                        text,
                        f"claimed by {len(holders)} stored allocations: {', '.join(holders)}",
                        "release the one whose pod is gone: flockctl ipam release CONTAINER",
                    )
                )
        kernel: dict[str, Any] = {"interfaces": 0, "routes": 0, "pods_checked": 0}
        try:
            inv = await self.netlink.inventory()
        except Exception as exc:
            unreached.append({"part": "kernel", "error": str(exc)})
        else:
            explained = {self.netlink.host_ifname(c): c for c in by_id}
            kernel["interfaces"], kernel["routes"] = len(inv.interfaces), len(inv.routes)
            removals = self.handler.removals
            for name in inv.interfaces:
                # A DEL'd pod's veth being deleted in the background is not an orphan.
                being_removed = removals is not None and any(
                    self.netlink.host_ifname(cid) == name for cid in removals.container_ids()
                )
                if name not in explained and not being_removed:
                    problems.append(
                        problem(
                            "orphan-interface",
                            name,
                            "a flock host veth that no allocation explains",
                            f"flockctl ipam release {name}",
                        )
                    )
            for dst, hops, blackhole in inv.routes:
                if not blackhole and hops and not any(h in explained for h in hops):
                    problems.append(
                        problem(
                            "orphan-route",
                            dst,
                            f"a flock route (protocol {self.netlink.settings.protocol}) via {', '.join(hops)}, which no allocation explains",
                            f"flockctl ipam release {hops[0]}",
                        )
                    )
            with trio.move_on_after(KERNEL_CHECK_DEADLINE_S) as scope:
                for a in rows:
                    if a.state is not AllocationState.COMMITTED or not netns_alive(a.netns):
                        continue
                    try:
                        diffs = await self.handler.dataplane.check(a)
                    except Exception as exc:
                        diffs = [f"cannot check: {exc}"]
                    kernel["pods_checked"] += 1
                    if diffs:
                        problems.append(
                            problem(
                                "kernel-differs",
                                a.container_id,
                                "; ".join(diffs),
                                "the runtime's CHECK fails for this pod; recreate the pod (or DEL and ADD it)",
                            )
                        )
            if scope.cancelled_caught:
                unreached.append({"part": "kernel-check", "error": f"not done within {KERNEL_CHECK_DEADLINE_S:g} s"})
        return {
            "node": self.state.node_name,
            "nodeconfig": nodeconfig_view(self.state.nodeconfig),
            "allocations": [allocation_view(a, now, self.netlink.host_ifname(a.container_id), None) for a in rows],
            "checked": {"store_rows": len(rows), **kernel},
            "problems": problems,
            "unreached": unreached,
        }

    # -- ipam release ----------------------------------------------------------

    async def ipam_release(self, target: str, *, force: bool, peer: Peer) -> dict[str, Any]:
        """Release one allocation (by container ID, a unique prefix of one, or
        address) or remove orphan kernel objects (by veth name) through the
        pod handler.  A full ID wins over a prefix, an address or veth name
        over a prefix."""
        who = {"peer_uid": peer.uid, "peer_pid": peer.pid, "target": target[:128], "force": force}
        rows = await self.handler.store.list()
        alloc = next((a for a in rows if a.container_id == target), None)
        if alloc is None:
            try:
                addr = ipaddress.ip_address(target.split("/")[0])
            except ValueError:
                addr = None
            if addr is not None:
                holders = [a for a in rows if addr in (a.ip6, a.ip4, *a.addresses, *a.anycast)]
                if len(holders) > 1:
                    raise OpRefused(
                        "address held by several allocations",
                        f"{addr}: {_listed([a.container_id for a in holders])}; release one by container ID",
                    )
                alloc = holders[0] if holders else None
                if alloc is None:
                    raise OpRefused("nothing holds that address", f"{addr}: no allocation on this node")
        if alloc is None:
            if is_host_ifname(target, self.netlink.settings.host_prefix):
                owner = next(
                    (a for a in rows if host_ifname(a.container_id, self.netlink.settings.host_prefix) == target), None
                )
                if owner is not None:
                    raise OpRefused(
                        "the veth belongs to an allocation",
                        f"{target} is container {owner.container_id}'s; release that",
                    )
                report = await self.handler.remove_orphans()
                log.warning(
                    "orphan kernel objects removed by an operator",
                    extra={**who, "interfaces": list(report.interfaces), "routes": list(report.routes)},
                )
                return {
                    "released": [],
                    "removed_interfaces": list(report.interfaces),
                    "removed_routes": list(report.routes),
                }
            alloc = container_by_prefix(rows, target)
        if alloc is None:
            raise OpRefused(
                "unknown target",
                f"{target[:64]!r}: not a container ID (or a prefix of one), address or flock veth on this node",
            )
        if netns_alive(alloc.netns) and not force:
            log.warning("release refused: the attachment is live", extra={**who, "container_id": alloc.container_id})
            raise OpRefused(
                "the attachment is live",
                f"container {alloc.container_id} ({_who(alloc)}) still has its network "
                f"namespace {alloc.netns}; delete the pod, or pass --force to take its addresses away",
            )
        released = await self.handler.release(alloc.container_id)
        log.warning(
            "allocation released through the admin socket",
            extra={
                **who,
                "container_id": alloc.container_id,
                "pod": f"{alloc.namespace}/{alloc.pod}" if alloc.namespace else "",
                "addresses": [str(a) for a in alloc.all_addresses],
            },
        )
        return {
            "released": []
            if released is None
            else [allocation_view(released, self.clock(), self.netlink.host_ifname(released.container_id), None)],
            "removed_interfaces": [],
            "removed_routes": [],
        }

    # -- bgp -------------------------------------------------------------------

    async def _birdc(self, *command: str) -> str:
        assert self.bird_socket is not None
        with trio.fail_after(BIRDC_DEADLINE_S):
            done = await trio.run_process(
                ["birdc", "-r", "-s", str(self.bird_socket), *command],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        out = done.stdout.decode(errors="replace")
        if done.returncode != 0 or "Unable to connect" in out:
            raise OSError(
                out.strip() or done.stderr.decode(errors="replace").strip() or f"birdc exited {done.returncode}"
            )
        return out

    async def bgp(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reachable": False, "error": None, "sessions": [], "exported": [], "learned": []}
        if self.bird_socket is None:
            out["error"] = "no BIRD on this node (--no-bird)"
            return out
        try:
            protocols = await self._birdc("show", "protocols", "all")
            sessions = parse_bgp_sessions(protocols)
            exported: set[str] = set()
            learned: set[str] = set()
            for s in sessions:
                for channel in s.pop("channels"):
                    exported |= set(
                        parse_prefixes(await self._birdc("show", "route", "export", f"{s['name']}.{channel}"))
                    )
                learned |= set(parse_prefixes(await self._birdc("show", "route", "protocol", s["name"])))
        except (OSError, trio.TooSlowError, subprocess.SubprocessError) as exc:
            out["error"] = f"BIRD's control socket {self.bird_socket}: {str(exc) or 'no answer'}"[:500]
            return out
        out.update(reachable=True, sessions=sessions, exported=sorted(exported), learned=sorted(learned))
        return out


def parse_bgp_sessions(text: str) -> list[dict[str, Any]]:
    """BGP protocols from ``birdc show protocols all``: name, state, neighbor, info."""
    sessions: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    for line in text.splitlines():
        fields = line.split()
        if line and not line[0].isspace() and len(fields) >= 4:
            cur = None
            if fields[1] == "BGP":
                cur = {
                    "name": fields[0],
                    "state": fields[3],
                    "since": fields[4] if len(fields) > 4 else "",
                    "info": " ".join(fields[5:]),
                    "neighbor": "",
                    "neighbor_as": None,
                    "bgp_state": "",
                    "imported": 0,
                    "exported": 0,
                    "last_error": "",
                    "channels": [],
                }
                sessions.append(cur)
            continue
        if cur is None:
            continue
        if line.strip().startswith("Channel ") and len(fields) == 2:
            cur["channels"].append(fields[1])
            continue
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if key == "Neighbor address":
            cur["neighbor"] = value
        elif key == "Neighbor AS" and value.isdigit():
            cur["neighbor_as"] = int(value)
        elif key == "BGP state":
            cur["bgp_state"] = value
        elif key == "Last error":
            cur["last_error"] = value
        elif key == "Routes":
            # "1 imported, 2 exported, 0 preferred"
            for part in value.split(","):
                n, _, what = part.strip().partition(" ")
                if n.isdigit() and what in ("imported", "exported"):
                    cur[what] += int(n)  # summed over the session's channels
    return sessions


def parse_prefixes(text: str) -> list[str]:
    """The prefixes of ``birdc show route`` output."""
    out = []
    for line in text.splitlines():
        first = line.split(maxsplit=1)[0] if line.strip() and not line[0].isspace() else ""
        if "/" in first:
            try:
                out.append(str(ipaddress.ip_network(first, strict=False)))
            except ValueError:
                continue
    return out
