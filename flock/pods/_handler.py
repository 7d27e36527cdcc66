"""The pod handler: ADD, DEL, CHECK, STATUS and GC behind the RPC server (DESIGN: "ADD, DEL, startup").

Ordering that makes the agent safe to kill at any instant: an ADD stores
its allocation ``pending`` before the first kernel change and ``committed``
after the last, so a restarted agent knows every address it ever handed out
and which kernel objects are explained (see :mod:`flock.pods._startup`).

Error handling: every failure reaches the runtime as a CniError naming the
field and the value.  Nothing is retried here: the runtime retries ADD (a
pending allocation is then reused with the same addresses) and DEL.  A
failed ADD gives back what it took (kernel state, row, addresses), except
when it ran out of time: then the allocation stays pending for the retry,
a DEL or GC.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import trio

from flock import errors
from flock.ipam import Addresses, AddressExhausted, Ipam
from flock.model import Allocation, AllocationState, PodInfo
from flock.netlink import DataplaneSettings
from flock.rpc import Request, check_cni_version, convert_result
from flock.watchers import KubeError

from ._args import PodRef, pod_ref
from ._crash import CrashPoint
from ._locks import KeyedLocks
from ._ports import AllocationStore, Dataplane, PodLookup
from ._result import cni_result, prev_result_addresses, result_addresses

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
# flock's own code: CHECK found the pod's network differs from what ADD made.
CHECK_FAILED = 120
VALID_ATTACHMENTS = "cni.dev/valid-attachments"

Observer = Callable[[str, int, float], None]


def _no_observer(op: str, code: int, seconds: float) -> None:
    return None


@attrs.define(eq=False)
class PodHandler:
    """Serves the RPC server's requests (it is an :class:`flock.rpc.server.Handler`).

    ADD answers code 11 until :meth:`enable_add` (start-up done); DEL, CHECK
    and GC work from the start, as they need only the store and the kernel.
    ``on_change`` is called after any change to the set of allocations (the
    BIRD reloader's ``poke``); ``observe(op, code, seconds)`` records metrics.
    """

    store: AllocationStore
    dataplane: Dataplane
    settings: DataplaneSettings = DataplaneSettings()
    pods: PodLookup | None = None
    on_change: Callable[[], None] = lambda: None
    observe: Observer = _no_observer
    crash: CrashPoint = CrashPoint()
    add_deadline: float = ADD_DEADLINE_S
    clock: Callable[[], float] = time.time
    _ipam: Ipam | None = attrs.field(init=False, default=None)
    _not_ready: str = attrs.field(init=False, default="waiting for this node's NodeConfig")
    _allocations: dict[str, Allocation] = attrs.field(init=False, factory=dict)
    _locks: KeyedLocks = attrs.field(init=False, factory=KeyedLocks)
    _exhausted: set[ipaddress.IPv4Network | ipaddress.IPv6Network] = attrs.field(init=False, factory=set)

    # -- state the agent reads and sets --------------------------------------

    @property
    def ipam(self) -> Ipam | None:
        return self._ipam

    @property
    def add_ready(self) -> bool:
        return self._ipam is not None and not self._not_ready

    @property
    def not_ready_reason(self) -> str:
        if self.add_ready:
            return ""
        return self._not_ready or "start-up has not finished"

    @property
    def allocations(self) -> Mapping[str, Allocation]:
        """Every allocation this agent knows of (read-only view), pending ones included."""
        return self._allocations

    @property
    def locks_in_use(self) -> int:
        return len(self._locks)

    async def quiesce(self) -> None:
        """Wait until no operation holds a container (call with ADD disabled,
        so an ADD already under way cannot allocate from an IPAM being replaced)."""
        await self._locks.wait_idle()

    def adopt(self, ipam: Ipam, rows: Iterable[Allocation]) -> None:
        """Take the IPAM rebuilt at start-up and the rows it was built from."""
        self._ipam = ipam
        self._allocations = {a.container_id: a for a in rows}

    def drop_missing(self, container_ids: set[str]) -> None:
        """Release what rows no longer in the store held (DELs during a rebuild)."""
        for cid in [c for c in self._allocations if c not in container_ids]:
            del self._allocations[cid]
            if self._ipam is not None:
                self._ipam.release(cid)

    def enable_add(self) -> None:
        if self._ipam is None:
            raise RuntimeError("enable_add before adopt")
        self._not_ready = ""

    def disable_add(self, reason: str) -> None:
        self._not_ready = reason

    # -- dispatch ------------------------------------------------------------

    async def __call__(self, request: Request) -> dict[str, Any]:
        began = trio.current_time()
        code = 0
        try:
            op = {"ADD": self.add, "DEL": self.delete, "CHECK": self.check, "STATUS": self.status, "GC": self.gc}[
                request.op
            ]
            return await op(request)
        except errors.CniError as err:
            code = err.code
            raise
        except Exception:
            code = errors.INTERNAL
            raise
        finally:
            self.observe(request.op, code, trio.current_time() - began)

    # -- ADD -----------------------------------------------------------------

    async def add(self, request: Request) -> dict[str, Any]:
        """Set up the pod; the result in the request's cniVersion."""
        version = check_cni_version(request.config)
        ref = pod_ref(request.args)
        if not self.add_ready:
            raise errors.CniError(errors.TRY_AGAIN_LATER, "agent not ready", self.not_ready_reason)
        with trio.move_on_after(self.add_deadline):
            async with self._locks.hold(request.container_id):
                alloc = await self._add_locked(request, ref)
            return convert_result(cni_result(alloc, self.settings), version)
        raise errors.CniError(
            errors.TRY_AGAIN_LATER,
            "ADD did not finish in time",
            f"container {request.container_id}: not done within {self.add_deadline:g} s; "
            "its allocation stays pending for a retry, DEL or GC",
        )

    async def _add_locked(self, request: Request, ref: PodRef) -> Allocation:
        cid = request.container_id
        alloc = await self.store.get(cid)
        if alloc is not None:
            _same_attachment(alloc, request, ref)
            if alloc.state is AllocationState.COMMITTED:
                log.info("ADD repeated: returning the committed allocation")
                return alloc
            log.info(
                "ADD retried: reusing the pending allocation",
                extra={"addresses": [str(a) for a in alloc.all_addresses]},
            )
            self._hold(alloc)
        else:
            self.crash.reached("before-pending")
            alloc = await self._reserve(request, ref)
            self.crash.reached("after-pending")
        try:
            await self.dataplane.setup(alloc, request.netns_fd)
            self.crash.reached("before-commit")
            alloc = await self.store.commit(cid, now=self.clock())
        except Exception:
            await self._undo(alloc)
            raise
        self._allocations[cid] = alloc
        self.on_change()
        log.info("pod network ready", extra={"addresses": [str(a) for a in alloc.all_addresses]})
        return alloc

    async def _reserve(self, request: Request, ref: PodRef) -> Allocation:
        """Allocate and store the pending row (nothing in the kernel yet)."""
        assert self._ipam is not None
        pod = await self._find_pod(ref)
        ipam = self._ipam
        try:
            held = ipam.allocate(request.container_id, pod)
        except AddressExhausted as exc:
            if exc.cidr in (ipam.node.cidr6, ipam.node.cidr4):
                self._exhausted.add(exc.cidr)
            raise
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
        )
        try:
            await self.store.put(alloc)
        except BaseException:
            # Not stored → no row will ever explain these addresses.
            ipam.release(request.container_id)
            raise
        self._allocations[alloc.container_id] = alloc
        return alloc

    async def _find_pod(self, ref: PodRef) -> PodInfo:
        if self.pods is None:
            raise errors.CniError(errors.TRY_AGAIN_LATER, "agent not ready", "the pod watcher is not running")
        with trio.move_on_after(POD_LOOKUP_DEADLINE_S) as lookup:
            try:
                pod = await self.pods.lookup(ref.namespace, ref.name)
                if pod is not None and ref.uid and pod.uid and pod.uid != ref.uid:
                    # The cache may still hold the previous pod of that name (a StatefulSet replica).
                    pod = await self.pods.fetch_pod(ref.namespace, ref.name)
            except KubeError as exc:
                raise errors.CniError(
                    errors.TRY_AGAIN_LATER, "cannot read the pod from the API server", f"pod {ref.key}: {exc}"
                ) from None
        if lookup.cancelled_caught:
            raise errors.CniError(
                errors.TRY_AGAIN_LATER,
                "the API server did not answer",
                f"pod {ref.key}: not in the informer cache and no answer to a direct GET within {POD_LOOKUP_DEADLINE_S:g} s",
            )
        if pod is None:
            raise errors.CniError(
                errors.TRY_AGAIN_LATER, "pod not found", f"pod {ref.key} does not exist on the API server"
            )
        if ref.uid and pod.uid and pod.uid != ref.uid:
            raise errors.CniError(
                errors.TRY_AGAIN_LATER,
                "pod UID differs",
                f"K8S_POD_UID={ref.uid!r} but pod {ref.key} has uid {pod.uid!r}",
            )
        return pod

    def _hold(self, alloc: Allocation) -> None:
        if self._ipam is not None and self._ipam.allocator.held(alloc.container_id) is None:
            self._ipam.mark_in_use(alloc.container_id, Addresses.of(alloc))

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

    async def _forget(self, alloc: Allocation, netns: str | None, if_name: str | None) -> None:
        """Teardown → delete row → release addresses (DEL's order)."""
        await self.dataplane.teardown(alloc.container_id, netns or alloc.netns, if_name or alloc.if_name)
        await self.store.delete(alloc.container_id)
        self._allocations.pop(alloc.container_id, None)
        if self._ipam is not None:
            self._ipam.release(alloc.container_id)
        self._exhausted.clear()
        if alloc.anycast:
            # A vanished pod namespace takes a whole IPv4 multipath route
            # with it: rebuild the routes of the anycast pods that remain.
            await self.dataplane.ensure_anycast([a for a in self._allocations.values() if a.anycast])
        self.on_change()

    # -- DEL -----------------------------------------------------------------

    async def delete(self, request: Request) -> dict[str, Any]:
        """Idempotent: no allocation, a missing netns or interface → success."""
        async with self._locks.hold(request.container_id):
            alloc = await self.store.get(request.container_id)
            if alloc is None:
                log.info("DEL of an unknown container: nothing to do")
                return {}
            await self._forget(alloc, request.netns, request.if_name)
        log.info("pod network removed", extra={"addresses": [str(a) for a in alloc.all_addresses]})
        return {}

    # -- CHECK ---------------------------------------------------------------

    async def check(self, request: Request) -> dict[str, Any]:
        check_cni_version(request.config)
        prev = prev_result_addresses(request.config)
        cid = request.container_id
        async with self._locks.hold(cid):
            alloc = await self.store.get(cid)
            if alloc is None:
                raise errors.CniError(
                    errors.UNKNOWN_CONTAINER,
                    "unknown container",
                    f"containerID={cid!r}: flock holds no allocation for it",
                )
            if alloc.state is AllocationState.PENDING:
                raise errors.CniError(
                    CHECK_FAILED, "ADD has not completed", f"containerID={cid!r}: the allocation is still pending"
                )
            if request.if_name != alloc.if_name:
                raise errors.CniError(
                    CHECK_FAILED, "interface differs", f"ifName={request.if_name!r}; ADD set up {alloc.if_name!r}"
                )
            wanted = {ipaddress.ip_interface(f"{a}/{a.max_prefixlen}") for a in result_addresses(alloc)}
            if prev != wanted:
                parts = []
                if missing := sorted(map(str, wanted - prev)):
                    parts.append("missing from prevResult: " + ", ".join(missing))
                if extra := sorted(map(str, prev - wanted)):
                    parts.append("in prevResult but not allocated: " + ", ".join(extra))
                raise errors.CniError(CHECK_FAILED, "prevResult differs from the allocation", "; ".join(parts))
            diffs = await self.dataplane.check(alloc, request.netns_fd)
        if diffs:
            raise errors.CniError(CHECK_FAILED, "pod network differs from its allocation", "; ".join(diffs))
        return {}

    # -- STATUS --------------------------------------------------------------

    async def status(self, request: Request) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        if not self.add_ready:
            raise errors.CniError(errors.NOT_AVAILABLE, "agent not ready", self.not_ready_reason)
        if self._exhausted:
            blocks = ", ".join(sorted(map(str, self._exhausted)))
            raise errors.CniError(
                errors.NOT_AVAILABLE, "address pool exhausted", f"no free address in the node block {blocks}"
            )
        return {}

    # -- GC ------------------------------------------------------------------

    async def gc(self, request: Request) -> dict[str, Any]:
        """Remove every allocation, veth and flock route that
        ``cni.dev/valid-attachments`` does not list."""
        valid = _valid_attachments(request.config)
        removed = []
        failed: dict[str, str] = {}
        for alloc in await self.store.list():
            if (alloc.container_id, alloc.if_name) in valid:
                continue
            async with self._locks.hold(alloc.container_id):
                current = await self.store.get(alloc.container_id)
                if current is None or (current.container_id, current.if_name) in valid:
                    continue
                try:
                    await self._forget(current, None, None)
                except errors.CniError as exc:
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
            "GC done", extra={"removed": removed, "orphan_interfaces": list(report.interfaces), "kept": len(remaining)}
        )
        if failed:
            first = sorted(failed)[:8]
            raise errors.CniError(
                errors.IO_ERROR,
                "GC could not remove every allocation",
                f"{len(failed)} left (the others were removed): "
                + "; ".join(f"{cid}: {failed[cid][:200]}" for cid in first),
            )
        return {}


def _same_attachment(alloc: Allocation, request: Request, ref: PodRef) -> None:
    if (alloc.namespace, alloc.pod) != (ref.namespace, ref.name):
        raise errors.CniError(
            errors.INVALID_ENV,
            "container ID already in use",
            f"containerID={request.container_id!r} belongs to pod {alloc.namespace}/{alloc.pod}, not {ref.key}",
        )
    if alloc.if_name != request.if_name:
        raise errors.CniError(
            errors.INVALID_ENV,
            "container ID already in use",
            f"ifName={request.if_name!r}: container {request.container_id} already has {alloc.if_name!r}",
        )
    if alloc.netns != request.netns:
        # Answering with the stored result would report a network the pod's
        # namespace does not have; the runtime must DEL the old attachment first.
        raise errors.CniError(
            errors.INVALID_ENV,
            "container ID already in use",
            f"netns={request.netns!r}: container {request.container_id} is attached in {alloc.netns!r}",
        )


def _valid_attachments(config: Mapping[str, Any]) -> set[tuple[str, str]]:
    if VALID_ATTACHMENTS not in config:
        raise errors.CniError(
            errors.INVALID_CONFIG,
            "GC needs valid attachments",
            f"the network configuration has no field {VALID_ATTACHMENTS!r}",
        )
    raw = config[VALID_ATTACHMENTS]
    if not isinstance(raw, list):
        raise errors.CniError(
            errors.INVALID_CONFIG, "invalid valid-attachments", f"{VALID_ATTACHMENTS}={raw!r}: expected a list"
        )
    out = set()
    for i, item in enumerate(raw):
        cid = item.get("containerID") if isinstance(item, Mapping) else None
        ifname = item.get("ifname") if isinstance(item, Mapping) else None
        if not isinstance(cid, str) or not cid or not isinstance(ifname, str) or not ifname:
            raise errors.CniError(
                errors.INVALID_CONFIG,
                "invalid valid-attachments",
                f'{VALID_ATTACHMENTS}[{i}]={item!r}: expected {{"containerID": …, "ifname": …}}',
            )
        out.add((cid, ifname))
    return out
