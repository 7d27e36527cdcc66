"""One writer's pass: read pools, namespaces and Services, :func:`plan`, write what differs.

The allocation state is the Services' own ``status.loadBalancer.ingress``: a
pass reads it back every time, so a restarted or newly elected writer carries
on from it. Every write is a PUT of the object as read (its resourceVersion
with it), to the ``status`` subresource, and comes after ``fence()`` renewed
the writer's Lease: a writer that lost the lease writes nothing, and a write
over a Service changed since the read is refused (409) — the pass then ends
with :class:`Stale` and the caller reads again. Releases are written before
gifts, so an address moves only once its old holder let go of it.
"""

from __future__ import annotations

import copy
import datetime
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from ._api import NAMESPACES, POOLS, SERVICES, ApiRefused, Conflict, NotFound, ObjectApi
from ._events import EVENT_COMPONENT, record
from ._ipam import (
    CONDITION_TYPE,
    EXTERNAL_IPS_CONDITION,
    Allocation,
    ExternalIps,
    LbService,
    Plan,
    Pool,
    PoolStatus,
    ServiceCondition,
    plan,
)

log = logging.getLogger("flock.controller.ipam")

Fence = Callable[[], Awaitable[bool]]
OUR_CONDITIONS = (CONDITION_TYPE, EXTERNAL_IPS_CONDITION)


class Stale(Exception):
    """A write met a newer object (409): read again."""


class Fenced(Exception):
    """The writer no longer holds the lease: write nothing more."""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(kind: str, c: ServiceCondition, old: Mapping[str, Any] | None) -> dict[str, Any]:
    same = old is not None and old.get("status") == c.status
    return {
        "type": kind,
        "status": c.status,
        "reason": c.reason.value,
        "message": c.message,
        "lastTransitionTime": old.get("lastTransitionTime") if same and old else _now(),
    }


def service_status(
    current: Mapping[str, Any] | None, allocation: Allocation | None, external: ServiceCondition | None = None
) -> dict[str, Any]:
    """*current* status with flock's ingress and conditions (*allocation* None: the load-balancer ones
    removed; *external* None: the externalIPs condition removed)."""
    status = copy.deepcopy(dict(current or {}))
    before = {c.get("type"): c for c in status.get("conditions") or []}
    conditions = [c for c in status.get("conditions") or [] if c.get("type") not in OUR_CONDITIONS]
    if allocation is None:
        if CONDITION_TYPE in before:  # ours until now: released (another writer's ingress is left alone)
            status["loadBalancer"] = {}
    else:
        status["loadBalancer"] = (
            {"ingress": [{"ip": str(a), "ipMode": "VIP"} for a in allocation.addresses]} if allocation.addresses else {}
        )
        conditions.append(_condition(CONDITION_TYPE, allocation.condition, before.get(CONDITION_TYPE)))
    if external is not None:
        conditions.append(_condition(EXTERNAL_IPS_CONDITION, external, before.get(EXTERNAL_IPS_CONDITION)))
    if conditions:
        status["conditions"] = conditions
    else:
        status.pop("conditions", None)
    return status


def _ours(status: Mapping[str, Any]) -> bool:
    return any(c.get("type") in OUR_CONDITIONS for c in status.get("conditions") or [])


def refusals(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(reason, message) of each of flock's conditions that turned False, or changed while False, from
    *before* to *after*: what an Event says (once per change, not once per pass)."""
    old = {c.get("type"): c for c in before.get("conditions") or []}
    found = []
    for c in after.get("conditions") or []:
        if c.get("type") not in OUR_CONDITIONS or c.get("status") != "False":
            continue
        prior = old.get(c["type"])
        if prior is None or (prior.get("status"), prior.get("reason"), prior.get("message")) != (
            "False",
            c.get("reason"),
            c.get("message"),
        ):
            found.append((str(c.get("reason")), str(c.get("message"))))
    return found


MESSAGE_LIMIT = 1024


def bounded(lines: Sequence[str], limit: int = MESSAGE_LIMIT) -> str:
    """*lines* joined by "; " within *limit* characters, then how many more (whole lines only)."""
    reserve = len("; and 9999999 more")
    text = ""
    for i, line in enumerate(lines):
        joined = f"{text}; {line}" if text else line
        if len(joined) > limit - (reserve if i < len(lines) - 1 else 0):
            more = len(lines) - i
            return f"{text}; and {more} more" if text else f"{line[: limit - 2 * reserve]}...; and {more - 1} more"
        text = joined
    return text


def _pool_condition(
    kind: str, state: bool, reason: str, message: str, current: Mapping[str, Any] | None
) -> dict[str, Any]:
    status = "True" if state else "False"
    old = next((c for c in (current or {}).get("conditions") or [] if c.get("type") == kind), None)
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == status else _now(),
    }


def pool_status(current: Mapping[str, Any] | None, value: PoolStatus) -> dict[str, Any]:
    status: dict[str, Any] = {}
    for family, count in value.counts.items():
        status[f"ipv{family}"] = {"total": str(count.total), "used": count.used, "free": str(count.free)}
    status["used"] = sum(c.used for c in value.counts.values())
    conflict = bool(value.conflicts)
    status["conditions"] = [
        _pool_condition(
            "Conflict", conflict, "Conflict" if conflict else "NoConflict", bounded(value.conflicts), current
        ),
        _pool_condition("Valid", True, "Valid", "", current),
    ]
    return status


def invalid_pool_status(current: Mapping[str, Any] | None, error: str) -> dict[str, Any]:
    """A pool whose spec does not parse: it gives nothing; its Valid condition says why."""
    return {"conditions": [_pool_condition("Valid", False, "InvalidSpec", error[:MESSAGE_LIMIT], current)]}


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    def strip(s: Mapping[str, Any]) -> Any:
        return {
            **s,
            "conditions": [
                {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in s.get("conditions") or []
            ],
        }

    return bool(strip(a) == strip(b))


async def reconcile(api: ObjectApi, fence: Fence, identity: str = EVENT_COMPONENT) -> Plan:
    """One pass; raises :class:`Stale` (read again) or :class:`Fenced` (stop writing).  A condition of
    flock's turning False (or changing while False) is also told as a Warning Event on the Service."""
    try:
        pool_objects = await api.list(POOLS)
    except NotFound:
        pool_objects = []  # the CRD is not installed: no pool
    pools: list[Pool] = []
    invalid: dict[str, str] = {}
    for obj in pool_objects:
        try:
            pools.append(Pool.from_object(obj))
        except (ValueError, KeyError, TypeError) as e:
            invalid[obj["metadata"]["name"]] = str(e)
            log.warning("pool ignored", extra={"pool": obj["metadata"].get("name"), "error": str(e)})
    namespace_labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in await api.list(NAMESPACES)}
    service_objects = await api.list(SERVICES)
    values: dict[str, LbService] = {}
    externals: list[ExternalIps] = []
    for obj in service_objects:
        meta = obj["metadata"]
        labels = namespace_labels.get(meta.get("namespace", ""), {})
        value = LbService.from_object(obj, labels)
        if value is not None:
            values[value.key] = value
        external = ExternalIps.from_object(obj, labels)
        if external is not None:
            externals.append(external)
    result = plan(pools, values.values(), externals)
    external_conditions = result.external

    writes: list[tuple[int, dict[str, Any]]] = []
    for obj in service_objects:
        meta = obj["metadata"]
        key = f"{meta.get('namespace')}/{meta['name']}"
        current = obj.get("status") or {}
        allocation = result.services.get(key)
        outside = external_conditions.get(key)
        if allocation is None and outside is None and not _ours(current):
            continue  # not ours, never was
        wanted = service_status(current, allocation, outside)
        if _same(wanted, current):
            continue
        held = values[key].current if key in values else ()
        releases = allocation is None or not set(held) <= set(allocation.addresses)
        writes.append((0 if releases else 1, {**obj, "status": wanted}))
    for _, obj in sorted(writes, key=lambda w: w[0]):
        await _write(api, fence, SERVICES, obj)
        key = f"{obj['metadata'].get('namespace')}/{obj['metadata']['name']}"
        log.info(
            "service status written",
            extra={
                "service": key,
                "ingress": [i["ip"] for i in obj["status"].get("loadBalancer", {}).get("ingress", [])],
            },
        )
        before = next((o.get("status") or {} for o in service_objects if o["metadata"] is obj["metadata"]), {})
        for reason, message in refusals(before, obj["status"]):
            try:
                await record(api, obj, reason, message, identity)
            except (ApiRefused, OSError) as e:  # an Event is best effort: the condition holds the truth
                log.warning("event not written", extra={"service": key, "reason": reason, "error": str(e)[:200]})
    for obj in pool_objects:
        name = obj["metadata"]["name"]
        if name in invalid:
            wanted = invalid_pool_status(obj.get("status"), invalid[name])
        elif name in result.pools:
            wanted = pool_status(obj.get("status"), result.pools[name])
        else:
            continue
        if not _same(wanted, obj.get("status") or {}):
            await _write(api, fence, POOLS, {**obj, "status": wanted})
    return result


async def _write(api: ObjectApi, fence: Fence, kind: Any, obj: dict[str, Any]) -> None:
    if not await fence():
        raise Fenced
    try:
        await api.replace(kind, obj, status=True)
    except (Conflict, NotFound):
        raise Stale from None
