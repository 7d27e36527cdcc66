"""The operator's allow-list of Service addresses: LoadBalancerPools (pure).

An ``externalIPs`` address or a load-balancer address (``status.loadBalancer.ingress``, whoever wrote
it) is translated by the proxy and announced over BGP only when it lies inside a pool the Service may
use: the pool is enabled and its ``serviceSelector`` matches the Service's labels and its
``namespaceSelector`` its namespace's (CVE-2020-8554: whoever may create a Service may write any
address there; translated, it captures the node's traffic to that address, and announced, the whole
fabric's).  An address outside gets nothing (``flockctl services`` and flock-controller's condition
say why).

The allow-list is a value (:class:`AllowList`), equal when what it admits is equal, so the proxy sees
a change of pools as a change of its config.  ``--service-external-cidr`` adds one more pool,
``service-external-cidrs``, without selectors: clusters without the CRD keep working.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from flock.model import Communities, InvalidObject, community_list
from flock.policy import Labels, LabelSelector

from ._model import IPAddress, Service

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

POOL_KIND = "LoadBalancerPool"
FLAG_POOL = "service-external-cidrs"  # the pool --service-external-cidr makes
MAX_BLOCKS = 64
MAX_LOCAL_PREFERENCE = 2**32 - 1


@attrs.frozen
class AnnouncePool:
    """A pool as the proxy and the announcer need it: its blocks, what its routes carry, and which
    Services may use it."""

    name: str
    cidrs: tuple[IPNetwork, ...]
    communities: Communities = attrs.field(factory=Communities)
    local_preference: int | None = None
    service_selector: LabelSelector = attrs.field(factory=LabelSelector)
    namespace_selector: LabelSelector = attrs.field(factory=LabelSelector)
    disabled: bool = False

    @classmethod
    def from_object(cls, raw: Any) -> AnnouncePool:
        """A ``flock.fritzlab.net/v1alpha1`` LoadBalancerPool (the CRD checks its shape; this checks it
        again: an object that does not parse is refused whole, never half-trusted)."""
        if not isinstance(raw, Mapping) or not isinstance(raw.get("metadata"), Mapping):
            raise InvalidObject(POOL_KIND, "", "metadata", type(raw).__name__, "an object with metadata")
        name = raw["metadata"].get("name")
        if not isinstance(name, str) or not 0 < len(name) <= 253:
            raise InvalidObject(POOL_KIND, "", "metadata.name", name, "a name")
        spec = raw.get("spec") or {}
        if not isinstance(spec, Mapping):
            raise InvalidObject(POOL_KIND, name, "spec", spec, "an object")
        blocks = spec.get("blocks") or []
        if not isinstance(blocks, list) or len(blocks) > MAX_BLOCKS:
            raise InvalidObject(POOL_KIND, name, "spec.blocks", blocks, f"a list of at most {MAX_BLOCKS} blocks")
        cidrs: list[IPNetwork] = []
        for i, block in enumerate(blocks):
            text = block.get("cidr") if isinstance(block, Mapping) else None
            try:
                if not isinstance(text, str):
                    raise ValueError(text)
                cidrs.append(ipaddress.ip_network(text, strict=True))
            except ValueError:
                raise InvalidObject(
                    POOL_KIND, name, f"spec.blocks[{i}].cidr", text, "a CIDR without host bits"
                ) from None
        preference = spec.get("localPreference")
        if preference is not None and (
            isinstance(preference, bool)
            or not isinstance(preference, int)
            or not 0 <= preference <= MAX_LOCAL_PREFERENCE
        ):
            raise InvalidObject(POOL_KIND, name, "spec.localPreference", preference, "an integer 0..4294967295")
        disabled = spec.get("disabled", False)
        if not isinstance(disabled, bool):
            raise InvalidObject(POOL_KIND, name, "spec.disabled", disabled, "true or false")
        return cls(
            name,
            tuple(cidrs),
            community_list(POOL_KIND, name, "spec.communities", spec.get("communities")),
            preference,
            LabelSelector.from_object(
                spec.get("serviceSelector"), kind=POOL_KIND, name=name, field="spec.serviceSelector"
            ),
            LabelSelector.from_object(
                spec.get("namespaceSelector"), kind=POOL_KIND, name=name, field="spec.namespaceSelector"
            ),
            disabled,
        )

    def holds(self, address: IPAddress) -> bool:
        return any(address.version == net.version and address in net for net in self.cidrs)

    def serves(self, service: Service, namespace_labels: Mapping[str, str]) -> bool:
        return (
            not self.disabled
            and self.service_selector.matches(dict(service.labels))
            and self.namespace_selector.matches(namespace_labels)
        )


@attrs.frozen
class AllowList:
    """The pools (by name) and, when a pool selects namespaces, the namespaces' labels."""

    pools: tuple[AnnouncePool, ...] = ()
    namespaces: tuple[tuple[str, Labels], ...] = ()
    _labels: dict[str, dict[str, str]] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_labels", {ns: dict(labels) for ns, labels in self.namespaces})

    @classmethod
    def build(cls, pools: Iterable[AnnouncePool], namespaces: Mapping[str, Labels] | None = None) -> AllowList:
        """The allow-list of *pools*; *namespaces* (name → labels) are kept only when some pool has a
        namespaceSelector, so a namespace's labels changing does not change the list otherwise."""
        ordered = tuple(sorted(pools, key=lambda p: p.name))
        selecting = any(not p.namespace_selector.is_empty for p in ordered)
        kept = tuple(sorted((namespaces or {}).items())) if selecting else ()
        return cls(ordered, kept)

    @classmethod
    def of_cidrs(cls, cidrs: Iterable[IPNetwork], name: str = FLAG_POOL) -> AllowList:
        """Every Service may use *cidrs* (``--service-external-cidr``; tests)."""
        cidrs = tuple(cidrs)
        return cls((AnnouncePool(name, cidrs),) if cidrs else ())

    def with_cidrs(self, cidrs: Iterable[IPNetwork]) -> AllowList:
        """This list and one more pool, :data:`FLAG_POOL`, of *cidrs* for every Service."""
        cidrs = tuple(cidrs)
        if not cidrs:
            return self
        extra = AnnouncePool(FLAG_POOL, cidrs)
        return AllowList(tuple(sorted((*self.pools, extra), key=lambda p: p.name)), self.namespaces)

    def pool_for(self, service: Service, address: IPAddress) -> AnnouncePool | None:
        """The first pool (by name) holding *address* that *service* may use; None: not allowed."""
        labels = self._labels.get(service.namespace, {})
        for pool in self.pools:
            if pool.holds(address) and pool.serves(service, labels):
                return pool
        return None

    def admits(self, service: Service, address: IPAddress) -> bool:
        return self.pool_for(service, address) is not None

    def by_name(self) -> dict[str, AnnouncePool]:
        return {p.name: p for p in self.pools}
