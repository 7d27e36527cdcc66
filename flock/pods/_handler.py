"""The pod handler: ADD, DEL, CHECK, STATUS and GC behind the RPC server (DESIGN: "ADD, DEL, startup").

Ordering that makes the agent safe to kill at any instant: an ADD stores
its allocation ``pending`` before the first kernel change and ``committed``
after the last, so a restarted agent knows every address it ever handed out
and which kernel objects are explained (see :mod:`flock.pods._bringup`).

Error handling: every failure reaches the runtime as a CniError naming the
field and the value.  Nothing is retried here: the runtime retries ADD (a
pending allocation is then reused with the same addresses) and DEL.  A
failed ADD gives back what it took (kernel state, row, addresses), except
when it ran out of time: then the allocation stays pending for the retry,
a DEL or GC.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import attrs
import trio

from flock import errors
from flock.faults import Fault, KernelRefused
from flock.ipam import AddressConflict, Addresses, AnnotationError, Ipam, PoolExhausted
from flock.model import DEFAULT_NETWORK, Allocation, AllocationState, NodeConfig, PodInfo, PortMapping
from flock.rpc import Request, check_cni_version, convert_result
from flock.state import Gate, NodeState

from ._args import PodRef, netconf_annotations, pod_ref
from ._cni_codes import cni_error
from ._errors import (
    AddTimedOut,
    CheckFailed,
    ContainerInUse,
    InvalidNetworkConfig,
    NotReady,
    PodLookupFailed,
    PodNotFound,
    Unavailable,
    UnknownContainer,
)
from ._locks import KeyedLocks
from ._ports import HostPortClaims, port_mappings
from ._protocols import (
    AllocationStore,
    Checkpoint,
    CleanupReport,
    Dataplane,
    NoCheckpoint,
    NoPolicy,
    PodLookup,
    PolicyGate,
)
from ._removals import VethRemovals
from ._result import cni_result, prev_result_addresses, prev_result_macs, result_addresses

log = logging.getLogger("flock.pods")

# DESIGN: the whole ADD runs under this deadline (kubelet's CRI timeout is
# longer, so the runtime hears "try again" rather than a dead call).
ADD_DEADLINE_S = 25.0
# Finding the pod (informer wait, then the direct GET): an API server that
# accepts connections but never answers is then named as the cause, instead
# of the whole ADD running into its deadline as "did not finish in time".
POD_LOOKUP_DEADLINE_S = 10.0
# Undoing a failed ADD's kernel changes must not hang the reply either.
ROLLBACK_DEADLINE_S = 5.0
VALID_ATTACHMENTS = "cni.dev/valid-attachments"
# The readiness gate ADD waits behind: opened by the node bring-up once
# start-up is done (declare it in the NodeState the handler is given).
ADD_GATE = Gate("add", "start-up has not finished", label="ADD not served: ")

Observer = Callable[[str, int, float], None]
# (op, stage, seconds): where a request's time went (metrics: flock_cni_stage_duration_seconds).
StageObserver = Callable[[str, str, float], None]


def _no_observer(op: str, code: int, seconds: float) -> None:
    return None


def _no_stage(op: str, stage: str, seconds: float) -> None:
    return None


class _Laps:
    """Reports the time since the previous lap as one *stage* of a request."""

    __slots__ = ("_last", "_observe", "_op")

    def __init__(self, op: str, observe: StageObserver) -> None:
        self._op, self._observe, self._last = op, observe, time.perf_counter()

    def __call__(self, stage: str) -> None:
        now = time.perf_counter()
        self._observe(self._op, stage, now - self._last)
        self._last = now


_NO_LAPS = _Laps("", _no_stage)


@attrs.define(eq=False)
class PodHandler:
    """Serves the RPC server's requests (it is an :class:`flock.rpc.server.Handler`).

    ADD answers code 11 while ``state``'s :data:`ADD_GATE` is closed (the node
    bring-up opens it after :meth:`rebuild`); DEL, CHECK and GC work from the
    start, as they need only the store and the kernel.  Every change to the
    set of allocations goes to ``state`` (its observers, such as the BIRD
    follower, see it); ``observe(op, code, seconds)`` records metrics.
    """

    # Wired once by the composition root; assigning them later raises.
    store: AllocationStore = attrs.field(on_setattr=attrs.setters.frozen)
    dataplane: Dataplane = attrs.field(on_setattr=attrs.setters.frozen)
    pods: PodLookup = attrs.field(on_setattr=attrs.setters.frozen)
    state: NodeState = attrs.field(on_setattr=attrs.setters.frozen)
    observe: Observer = _no_observer
    stage: StageObserver = _no_stage
    checkpoint: Checkpoint = attrs.field(factory=NoCheckpoint)
    policy: PolicyGate = attrs.field(factory=NoPolicy)
    # DEL's veth deletion in the background while it runs (None, or not
    # running: DEL deletes the veth itself before it answers).
    removals: VethRemovals | None = attrs.field(default=None, on_setattr=attrs.setters.frozen)
    add_deadline: float = ADD_DEADLINE_S
    # Further gates ADD (and STATUS) wait behind, after ADD_GATE: with encryption, the WireGuard guard's
    add_gates: tuple[str, ...] = ()
    clock: Callable[[], float] = time.time
    rng: random.Random = attrs.field(factory=random.SystemRandom)
    _ipam: Ipam | None = attrs.field(init=False, default=None)
    _locks: KeyedLocks = attrs.field(init=False, factory=KeyedLocks)
    # Addresses of DEL'd pods whose veth is still being removed (held in the IPAM until it is gone).
    _releasing: dict[str, Addresses] = attrs.field(init=False, factory=dict)
    # Stored rows the node's view leaves out (conflicts at the rebuild): read from the store.
    _unviewed: set[str] = attrs.field(init=False, factory=set)
    # Host ports held by this node's attachments (rebuilt with the IPAM; a DEL'd pod's go with its row).
    _ports: HostPortClaims = attrs.field(init=False, factory=HostPortClaims)

    @property
    def ipam(self) -> Ipam | None:
        """The allocator's index of held addresses (None before :meth:`rebuild`)."""
        return self._ipam

    @property
    def locks_in_use(self) -> int:
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def _exclusive(self, container_id: str) -> AsyncIterator[None]:
        """The container's lock, once no removal of its old veth is pending."""
        async with self._locks.hold(container_id):
            if self.removals is not None:
                await self.removals.wait(container_id)
            yield

    # -- what the node bring-up drives ---------------------------------------

    async def rebuild(self, node: NodeConfig) -> list[Allocation]:
        """Rebuild the IPAM and the allocation view from the store, for *node*
        (call with ADD's gate closed: an ADD already under way is waited for,
        so none allocates from an IPAM being replaced).  Returns the
        allocations kept; two rows claiming one address keep the committed one."""
        await self._locks.wait_idle()
        rows = await self.store.list()
        ipam = Ipam(node, rng=self.rng)
        _report_layout(ipam)
        kept: list[Allocation] = []
        # Committed rows first: if two rows claim one address, the pod that
        # is really running keeps it.
        for alloc in sorted(rows, key=lambda a: a.state is not AllocationState.COMMITTED):
            try:
                ipam.mark_in_use(alloc.container_id, Addresses.of(alloc))
                kept.append(alloc)
            except AddressConflict as exc:
                log.error(
                    "stored allocations conflict; this one is left out",
                    extra={"container_id": alloc.container_id, "error": str(exc)},
                )
        # DEL'd pods whose veth is still there keep their addresses until it goes.
        for cid, held in self._releasing.items():
            try:
                ipam.mark_in_use(cid, held)
            except AddressConflict as exc:
                log.error(
                    "a removed pod's addresses conflict with a stored row",
                    extra={"container_id": cid, "error": str(exc)},
                )
        self._ipam = ipam
        self._ports, clashes = HostPortClaims.of(kept)
        for alloc, why in clashes:
            log.error(
                "stored hostPort mappings conflict; this pod's are not claimed and not mapped",
                extra={"container_id": alloc.container_id, "error": why},
            )
            # the view (what the policy service maps) leaves them out; the row keeps them
            kept[kept.index(alloc)] = attrs.evolve(alloc, port_mappings=())
        self.state.load_allocations(kept)
        # A DEL may have removed rows between the list and here: release those.
        still = {a.container_id for a in await self.store.list()}
        for cid in [c for c in self.state.allocations if c not in still]:
            self.state.drop_allocation(cid)
            ipam.release(cid)
            self._ports.release(cid)
        self._unviewed = still - set(self.state.allocations)
        self._publish_exhaustion()
        return list(self.state.allocations.values())

    def apply_nodeconfig(self, node: NodeConfig) -> None:
        """A NodeConfig change at run time: existing pods keep their addresses."""
        if self._ipam is None:
            raise RuntimeError("apply_nodeconfig before rebuild")
        old = self._ipam.node
        self._ipam.set_node(node)
        if old.ip_algo != node.ip_algo:
            _report_layout(self._ipam)
        self._publish_exhaustion()

    def _publish_exhaustion(self) -> None:
        self.state.set_exhausted(self._ipam.full_blocks() if self._ipam is not None else ())

    # -- dispatch ------------------------------------------------------------

    async def __call__(self, request: Request) -> dict[str, Any]:
        """One request; every failure leaves as a CniError (codes: :mod:`flock.pods._cni_codes`)."""
        began = trio.current_time()
        code = 0
        try:
            op = {"ADD": self.add, "DEL": self.delete, "CHECK": self.check, "STATUS": self.status, "GC": self.gc}[
                request.op
            ]
            # Background veth removals let requests go first.
            with self.removals.request() if self.removals is not None else contextlib.nullcontext():
                return await op(request)
        except Exception as exc:
            err = cni_error(exc)
            if err is None:
                code = errors.INTERNAL
                raise
            code = err.code
            if err is exc:
                raise
            raise err from exc
        finally:
            self.observe(request.op, code, trio.current_time() - began)

    # -- ADD -----------------------------------------------------------------

    def _add_waits(self) -> str:
        """Why ADD is not served yet (the first closed of ADD_GATE and *add_gates*); empty: served."""
        for gate in (ADD_GATE.name, *self.add_gates):
            if waiting := self.state.reason(gate):
                return waiting
        return ""

    async def add(self, request: Request) -> dict[str, Any]:
        """Set up the pod; the result in the request's cniVersion."""
        version = check_cni_version(request.config)
        ref = pod_ref(request.args)
        network = network_name(request.config)
        mappings = port_mappings(request.config)
        waiting = self._add_waits()
        if waiting or self._ipam is None:
            raise NotReady("agent not ready", waiting or ADD_GATE.initial_reason)
        lap = _Laps("ADD", self.stage)
        with trio.move_on_after(self.add_deadline):
            async with self._exclusive(request.container_id):
                lap("lock")
                alloc, macs = await self._add_locked(request, ref, network, mappings, lap)
            result = cni_result(
                alloc,
                host_iface=self.dataplane.host_ifname(alloc.container_id),
                gateway6=self.dataplane.gateway6,
                gateway4=self.dataplane.gateway4,
                macs=macs,
            )
            converted = convert_result(result, version)
            lap("result")
            return converted
        raise AddTimedOut(
            "ADD did not finish in time",
            f"container {request.container_id}: not done within {self.add_deadline:g} s; "
            "its allocation stays pending for a retry, DEL or GC",
        )

    async def _add_locked(
        self,
        request: Request,
        ref: PodRef,
        network: str = DEFAULT_NETWORK,
        mappings: tuple[PortMapping, ...] = (),
        lap: _Laps = _NO_LAPS,
    ) -> tuple[Allocation, tuple[str, str]]:
        """The committed allocation and the (host, pod) MACs of its veth.

        MACs are not stored: the kernel is their one source.  A repeated ADD
        (the runtime's retry, or after an agent restart) reads them back, so it
        returns the same result as the first; if the veth is gone it converges
        the kernel again (new MACs, which are then the truth)."""
        cid = request.container_id
        alloc = await self._stored(cid)
        lap("lookup")
        if alloc is not None:
            _same_attachment(alloc, request, ref)
            _same_ports(alloc, request, mappings)
            if alloc.state is AllocationState.COMMITTED:
                macs = await self.dataplane.macs(alloc, request.netns_fd)
                if all(macs):
                    log.info("ADD repeated: returning the committed allocation")
                    return alloc, macs
                log.warning("ADD repeated but the pod's veth is missing: setting it up again")
                macs = _macs_of(await self.dataplane.setup(alloc, request.netns_fd, mtu=self.state.pod_mtu.value))
                await self.policy.ensure(alloc)  # the new veth's chains are in before the pod runs again
                return alloc, macs
            log.info(
                "ADD retried: reusing the pending allocation",
                extra={"addresses": [str(a) for a in alloc.all_addresses]},
            )
            self._hold(alloc)
        else:
            self.checkpoint.reached("before-pending")
            alloc = await self._reserve(request, ref, network, mappings, lap)
            self.checkpoint.reached("after-pending")
        try:
            # The MTU in force now (NodeConfig spec.mtu, else the uplink's): a
            # later change reaches new pods only, this one keeps what it got.
            macs = _macs_of(await self.dataplane.setup(alloc, request.netns_fd, mtu=self.state.pod_mtu.value))
            lap("netlink")
            # NetworkPolicy before the pod runs: its rules and set memberships are in the kernel first.
            await self.policy.ensure(alloc)
            lap("policy")
            self.checkpoint.reached("before-commit")
            alloc = await self.store.commit(cid, now=self.clock())
            lap("store_commit")
        except Exception:
            await self._undo(alloc)
            raise
        self.state.put_allocation(alloc)
        log.info("pod network ready", extra={"addresses": [str(a) for a in alloc.all_addresses]})
        return alloc, macs

    async def _stored(self, container_id: str) -> Allocation | None:
        """The container's row.  Once rebuilt, the node's view holds every
        stored row (each write goes to the store, then to the view, under the
        container's lock), so a new pod's ADD costs no store round trip; a
        row the rebuild left out, or any row before it, is read from the store."""
        if self._ipam is not None:
            alloc = self.state.allocations.get(container_id)
            if alloc is not None or container_id not in self._unviewed:
                return alloc
        return await self.store.get(container_id)

    async def _reserve(
        self,
        request: Request,
        ref: PodRef,
        network: str = DEFAULT_NETWORK,
        mappings: tuple[PortMapping, ...] = (),
        lap: _Laps = _NO_LAPS,
    ) -> Allocation:
        """Allocate, claim the host ports and store the pending row (nothing in the kernel yet)."""
        assert self._ipam is not None
        if ref.is_pod:
            pod = await self._find_pod(ref)
        else:
            # No Kubernetes pod (podman, nerdctl, CNI used directly): nothing to
            # wait for; options only from the network configuration's args.
            annotations = netconf_annotations(request.config)
            pod = PodInfo(namespace="", name=ref.name, annotations=annotations)
            log.info("container without a pod: NodeConfig defaults", extra={"options": annotations})
        lap("pod_lookup")
        try:
            held = self._ipam.allocate(request.container_id, pod)
        except (PoolExhausted, AnnotationError):
            # Full, or a fixed address taken: perhaps only by DEL'd pods whose
            # veths are still being removed (a StatefulSet pod's new sandbox
            # asks for its old address).  Wait for those, then try once more.
            if not self._releasing or self.removals is None:
                raise
            for cid in list(self._releasing):
                await self.removals.wait(cid)
            held = self._ipam.allocate(request.container_id, pod)
        finally:
            self._publish_exhaustion()
        ipam = self._ipam
        lap("ipam")
        now = self.clock()
        alloc = Allocation(
            container_id=request.container_id,
            namespace=ref.namespace,
            pod=ref.name,
            pod_uid=pod.uid or ref.uid,
            if_name=request.if_name,
            netns=request.netns,
            ip6=held.ip6,
            ip4=held.ip4,
            anycast=held.anycast,
            addresses=held.addresses,
            state=AllocationState.PENDING,
            created=now,
            updated=now,
            network=network,
            port_mappings=mappings,
        )
        try:
            self._ports.claim(alloc)  # no await since the allocation: two ADDs cannot both take a port
        except Exception:
            ipam.release(request.container_id)
            self._publish_exhaustion()
            raise
        try:
            await self.store.put(alloc)
            self._unviewed.discard(request.container_id)
            lap("store_pending")
        except BaseException:
            # Not stored → no row will ever explain these addresses.
            ipam.release(request.container_id)
            self._ports.release(request.container_id)
            self._publish_exhaustion()
            raise
        self.state.put_allocation(alloc)
        return alloc

    async def _find_pod(self, ref: PodRef) -> PodInfo:
        with trio.move_on_after(POD_LOOKUP_DEADLINE_S) as lookup:
            try:
                pod = await self.pods.lookup(ref.namespace, ref.name)
                if pod is not None and ref.uid and pod.uid and pod.uid != ref.uid:
                    # The cache may still hold the previous pod of that name (a StatefulSet replica).
                    pod = await self.pods.fetch_pod(ref.namespace, ref.name)
            except PodLookupFailed as exc:
                raise PodLookupFailed(exc.msg, f"pod {ref.key}: {exc.details}") from None
        if lookup.cancelled_caught:
            raise PodLookupFailed(
                "the API server did not answer",
                f"pod {ref.key}: not in the informer cache and no answer to a direct GET within {POD_LOOKUP_DEADLINE_S:g} s",
            )
        if pod is None:
            raise PodNotFound("pod not found", f"pod {ref.key} does not exist on the API server")
        if ref.uid and pod.uid and pod.uid != ref.uid:
            raise PodNotFound(
                "pod UID differs",
                f"K8S_POD_UID={ref.uid!r} but pod {ref.key} has uid {pod.uid!r}",
            )
        return pod

    def _hold(self, alloc: Allocation) -> None:
        if self._ipam is not None and self._ipam.allocator.held(alloc.container_id) is None:
            self._ipam.mark_in_use(alloc.container_id, Addresses.of(alloc))
        self._ports.claim(alloc)

    async def _undo(self, alloc: Allocation) -> None:
        """Give back everything a failed ADD took.  Not on cancellation (the
        deadline): then the allocation stays pending, as DESIGN says."""
        log.warning("ADD failed: removing its kernel state, row and addresses")
        with trio.move_on_after(ROLLBACK_DEADLINE_S, shield=True) as scope:
            try:
                await self._forget(alloc, alloc.netns, alloc.if_name)
            except Exception as exc:
                # The ADD's own error is what the runtime must hear; this one
                # is logged and the allocation stays pending for a DEL or GC.
                log.error("could not undo a failed ADD; the allocation stays pending", extra={"error": str(exc)})
        if scope.cancelled_caught:
            log.error("could not undo a failed ADD in time; the allocation stays pending")

    async def _forget(
        self,
        alloc: Allocation,
        netns: str | None,
        if_name: str | None,
        lap: _Laps = _NO_LAPS,
        *,
        defer: bool = False,
    ) -> None:
        """Teardown → delete row → release addresses (DEL's order).

        *defer* (DEL, with :attr:`removals` running): only an anycast pod's
        leaving of its multipath routes happens before the row goes; the veth
        is deleted in the background and the addresses are released after
        that (see :mod:`flock.pods._removals`).  A pod without anycast
        addresses leaves no route by hand: the kernel drops its single-path
        routes with the veth."""
        cid = alloc.container_id
        removals = self.removals if defer and self.removals is not None and self.removals.running else None
        if removals is None:
            await self.dataplane.teardown(
                cid, netns or alloc.netns, if_name or alloc.if_name, routes=bool(alloc.anycast)
            )
            lap("netlink")
        elif alloc.anycast:
            await self.dataplane.leave_routes(cid)
            lap("netlink")
        await self.store.delete(cid)
        lap("store_delete")
        self._unviewed.discard(cid)
        self._ports.release(cid)  # the policy service drops its DNAT with the allocation
        self.state.drop_allocation(cid)
        if removals is None:
            self._release(cid)
        else:
            self._releasing[cid] = Addresses.of(alloc)
            removals.submit(cid, functools.partial(self._release, cid))
        if alloc.anycast:
            # A vanished pod namespace takes a whole IPv4 multipath route
            # with it: rebuild the routes of the anycast pods that remain.
            await self.dataplane.ensure_anycast([a for a in self.state.allocations.values() if a.anycast])
            lap("anycast")

    def _release(self, container_id: str) -> None:
        """The pod's veth is gone: its addresses are free."""
        self._releasing.pop(container_id, None)
        if self._ipam is not None:
            self._ipam.release(container_id)
            self._publish_exhaustion()

    # -- DEL -----------------------------------------------------------------

    async def delete(self, request: Request) -> dict[str, Any]:
        """Idempotent: no allocation, a missing netns or interface → success."""
        lap = _Laps("DEL", self.stage)
        async with self._exclusive(request.container_id):
            lap("lock")
            alloc = await self._stored(request.container_id)
            lap("lookup")
            if alloc is None:
                log.info("DEL of an unknown container: nothing to do")
                return {}
            # A Kubernetes pod's namespace is destroyed right after its DEL: the
            # veth may go later.  A container without a pod (podman, nerdctl, CNI
            # used directly) may keep its namespace and attach it to another
            # network under the same interface name: its veth goes before DEL answers.
            await self._forget(alloc, request.netns, request.if_name, lap, defer=bool(alloc.namespace))
        log.info("pod network removed", extra={"addresses": [str(a) for a in alloc.all_addresses]})
        return {}

    # -- operator repairs (flockctl, through the admin socket) -------------------

    async def release(self, container_id: str) -> Allocation | None:
        """Remove *container_id*'s allocation as a DEL would (its kernel state,
        row and addresses, under the container's lock); the allocation removed,
        or None if there was none.  The caller decides whether it may."""
        async with self._exclusive(container_id):
            alloc = await self.store.get(container_id)
            if alloc is None:
                return None
            await self._forget(alloc, None, None)
        log.warning(
            "allocation released by an operator",
            extra={"container_id": container_id, "addresses": [str(a) for a in alloc.all_addresses]},
        )
        return alloc

    async def remove_orphans(self) -> CleanupReport:
        """Remove flock's host veths and routes that no stored allocation
        explains (GC's kernel part; an ADD under way has its row already)."""
        remaining = await self.store.list()
        report = await self.dataplane.cleanup([a.container_id for a in remaining])
        await self.dataplane.ensure_anycast([a for a in remaining if a.anycast])
        return report

    # -- CHECK ---------------------------------------------------------------

    async def check(self, request: Request) -> dict[str, Any]:
        check_cni_version(request.config)
        prev = prev_result_addresses(request.config)
        cid = request.container_id
        async with self._exclusive(cid):
            alloc = await self._stored(cid)
            if alloc is None:
                raise UnknownContainer("unknown container", f"containerID={cid!r}: flock holds no allocation for it")
            if alloc.state is AllocationState.PENDING:
                raise CheckFailed("ADD has not completed", f"containerID={cid!r}: the allocation is still pending")
            if request.if_name != alloc.if_name:
                raise CheckFailed("interface differs", f"ifName={request.if_name!r}; ADD set up {alloc.if_name!r}")
            wanted = {ipaddress.ip_interface(f"{a}/{a.max_prefixlen}") for a in result_addresses(alloc)}
            if prev != wanted:
                parts = []
                if missing := sorted(map(str, wanted - prev)):
                    parts.append("missing from prevResult: " + ", ".join(missing))
                if extra := sorted(map(str, prev - wanted)):
                    parts.append("in prevResult but not allocated: " + ", ".join(extra))
                raise CheckFailed("prevResult differs from the allocation", "; ".join(parts))
            host_name = self.dataplane.host_ifname(cid)
            claimed = prev_result_macs(request.config, host_name, alloc.if_name, alloc.netns)
            diffs = await self.dataplane.check(alloc, request.netns_fd)
            if claimed:
                live = dict(zip(("host", "pod"), await self.dataplane.macs(alloc, request.netns_fd), strict=True))
                for side, name in (("host", host_name), ("pod", alloc.if_name)):
                    if side in claimed and live[side] and claimed[side] != live[side].lower():
                        diffs.append(f"{side} {name}: MAC is {live[side]}, prevResult says {claimed[side]}")
        if diffs:
            raise CheckFailed("pod network differs from its allocation", "; ".join(diffs))
        return {}

    # -- STATUS --------------------------------------------------------------

    async def status(self, request: Request) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        waiting = self._add_waits()
        if waiting or self._ipam is None:
            raise Unavailable("agent not ready", waiting or ADD_GATE.initial_reason)
        if exhausted := self.state.exhausted:
            blocks = ", ".join(sorted(map(str, exhausted)))
            raise Unavailable("address pool exhausted", f"no free address in the node block {blocks}")
        return {}

    # -- GC ------------------------------------------------------------------

    async def gc(self, request: Request) -> dict[str, Any]:
        """Remove every allocation of the request's network that ``cni.dev/valid-attachments``
        does not list, and the veths and flock routes no allocation (of any network) explains.

        Attachments made through another network of this agent (podman's, next to the
        Kubernetes one) are not this GC's: the CNI spec scopes GC to the network it names."""
        valid = _valid_attachments(request.config)
        network = network_name(request.config)
        removed = []
        failed: dict[str, str] = {}
        other_networks = 0
        for alloc in await self.store.list():
            if alloc.network != network:
                other_networks += 1
                continue
            if (alloc.container_id, alloc.if_name) in valid:
                continue
            async with self._exclusive(alloc.container_id):
                current = await self.store.get(alloc.container_id)
                if current is None or current.network != network or (current.container_id, current.if_name) in valid:
                    continue
                try:
                    await self._forget(current, None, None)
                except Fault as exc:
                    # One row that cannot be cleaned must not keep every other leak.
                    log.error(
                        "GC could not remove an allocation; going on with the others",
                        extra={"container_id": current.container_id, "error": str(exc)},
                    )
                    failed[current.container_id] = str(exc)
                    continue
                removed.append(current.container_id)
        remaining = await self.store.list()
        report = await self.dataplane.cleanup([a.container_id for a in remaining])
        await self.dataplane.ensure_anycast([a for a in remaining if a.anycast])
        log.info(
            "GC done",
            extra={
                "network": network,
                "removed": removed,
                "orphan_interfaces": list(report.interfaces),
                "kept": len(remaining),
                "other_networks": other_networks,
            },
        )
        if failed:
            first = sorted(failed)[:8]
            raise KernelRefused(
                "GC could not remove every allocation",
                f"{len(failed)} left (the others were removed): "
                + "; ".join(f"{cid}: {failed[cid][:200]}" for cid in first),
            )
        return {}


def _macs_of(attachment: object) -> tuple[str, str]:
    """(host, pod) MACs of what ``Dataplane.setup`` returned (flock.netlink's AppliedPlan)."""
    return str(getattr(attachment, "host_mac", "") or ""), str(getattr(attachment, "pod_mac", "") or "")


def _same_attachment(alloc: Allocation, request: Request, ref: PodRef) -> None:
    if (alloc.namespace, alloc.pod) != (ref.namespace, ref.name):
        owner = PodRef(alloc.namespace, alloc.pod).key
        raise ContainerInUse(
            "container ID already in use",
            f"containerID={request.container_id!r} belongs to {'pod ' if alloc.namespace else ''}{owner}, not {ref.key}",
        )
    if alloc.if_name != request.if_name:
        raise ContainerInUse(
            "container ID already in use",
            f"ifName={request.if_name!r}: container {request.container_id} already has {alloc.if_name!r}",
        )
    if alloc.netns != request.netns:
        # Answering with the stored result would report a network the pod's
        # namespace does not have; the runtime must DEL the old attachment first.
        raise ContainerInUse(
            "container ID already in use",
            f"netns={errors.quote(request.netns)}: container {request.container_id} is attached in {alloc.netns!r}",
        )


# libcni's rule for a network name (it refuses others before a plugin runs).
_NETWORK_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def network_name(config: Mapping[str, Any]) -> str:
    """The configuration's network ``name`` (what an attachment belongs to; GC is scoped to it).
    A configuration without one (CNI used by hand) is the installer's default network."""
    name = config.get("name")
    if name is None:
        return DEFAULT_NETWORK
    if (
        not isinstance(name, str)
        or not 0 < len(name) <= 253
        or not _NETWORK_NAME_CHARS.issuperset(name)
        or not name[0].isalnum()
    ):
        raise InvalidNetworkConfig(
            "invalid network name",
            f"name={errors.quote(name, 64)}: expected letters, digits, '_', '.', '-' (at most 253, a letter or digit first)",
        )
    return name


def _same_ports(alloc: Allocation, request: Request, mappings: tuple[PortMapping, ...]) -> None:
    """A repeated ADD must ask for the ports the first one got: answering with the stored result would
    claim ports the attachment does not have.  (Not the network name: a row from before flock
    recorded one holds a name given at start-up, which may not be the conflist's.)"""
    if set(alloc.port_mappings) != set(mappings):
        held = ", ".join(m.describe() for m in alloc.port_mappings) or "none"
        raise ContainerInUse(
            "container ID already in use",
            f"runtimeConfig.portMappings: container {request.container_id} was set up with {held[:300]}; "
            "DEL it before asking for others",
        )


def _valid_attachments(config: Mapping[str, Any]) -> set[tuple[str, str]]:
    if VALID_ATTACHMENTS not in config:
        raise InvalidNetworkConfig(
            "GC needs valid attachments",
            f"the network configuration has no field {VALID_ATTACHMENTS!r}",
        )
    raw = config[VALID_ATTACHMENTS]
    if not isinstance(raw, list):
        raise InvalidNetworkConfig(
            "invalid valid-attachments", f"{VALID_ATTACHMENTS}={errors.quote(raw)}: expected a list"
        )
    out = set()
    for i, item in enumerate(raw):
        cid = item.get("containerID") if isinstance(item, Mapping) else None
        ifname = item.get("ifname") if isinstance(item, Mapping) else None
        if not isinstance(cid, str) or not cid or not isinstance(ifname, str) or not ifname:
            raise InvalidNetworkConfig(
                "invalid valid-attachments",
                f'{VALID_ATTACHMENTS}[{i}]={errors.quote(item)}: expected {{"containerID": …, "ifname": …}}',
            )
        out.add((cid, ifname))
    return out


def _report_layout(ipam: Ipam) -> None:
    problem = ipam.layout_problem
    if problem is not None:
        log.warning(
            "ignoring invalid node-level ip-algo",
            extra={
                "node": ipam.node.name,
                "annotation": "flock.fritzlab.net/ip-algo",
                "value": problem.value,
                "reason": problem.reason,
            },
        )
