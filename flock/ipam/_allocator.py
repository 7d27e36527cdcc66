"""The allocator: who holds which address, and how new ones are chosen.

Pure and synchronous: no I/O, no clock, randomness from the injected
``random.Random``.  Not thread-safe: the agent calls it from the Trio
thread only, where each call runs to completion without a checkpoint.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Iterable
from typing import Any

import attrs

from flock.fnv import fnv1a_64
from flock.ipam._errors import AnnotationError, IpamError, PoolExhausted
from flock.ipam._identity import PodIdentity
from flock.ipam._layout import COUNTER, RANDOM, Layout
from flock.ipam._request import ADDRESSES, ANYCAST, PodRequest
from flock.ipam._v4pool import LowestFreePool
from flock.model import Allocation, IPAddress

TRIES = 16  # DESIGN: ip-algo redraws or counts up this many times on collision
# Random identifiers in a space this small fall back to a scan, so a nearly
# full small sub-range still finds its last free address.
_SCAN_BITS = 16

# Keys are (version, int): hashing ipaddress objects costs a hex() per lookup.
_Key = tuple[int, int]


def _key(addr: IPAddress) -> _Key:
    return (addr.version, int(addr))


class AddressConflict(IpamError):
    """Two stored allocations claim one address (seen while seeding)."""

    def __init__(self, addr: IPAddress, holder: str, claimant: str) -> None:
        self.addr, self.holder, self.claimant = addr, holder, claimant
        super().__init__("stored allocations conflict", f"{addr} is held by {holder} and claimed by {claimant}")


@attrs.frozen
class Addresses:
    """What one container holds: its own /128 and /32, plus fixed and anycast addresses."""

    ip6: ipaddress.IPv6Address | None = None
    ip4: ipaddress.IPv4Address | None = None
    anycast: tuple[IPAddress, ...] = ()
    addresses: tuple[IPAddress, ...] = ()

    @classmethod
    def of(cls, allocation: Allocation) -> Addresses:
        return cls(allocation.ip6, allocation.ip4, tuple(allocation.anycast), tuple(allocation.addresses))


@attrs.define(eq=False)
class Allocator:
    """Hands out addresses in the effective CIDRs of pod requests.

    ``allocate`` takes all of a pod's addresses or none (a failure releases
    what the call took before raising).  Fixed ``addresses`` are exclusive to
    one container; ``anycast`` addresses may be shared by several.  Errors
    propagate as :class:`AnnotationError` (a fixed or anycast address someone
    else holds) or :class:`PoolExhausted`; nothing is retried beyond the
    layout's collision tries.
    """

    rng: random.Random = attrs.field(factory=random.Random)
    _owner: dict[_Key, str] = attrs.field(init=False, factory=dict)
    _shared: dict[_Key, set[str]] = attrs.field(init=False, factory=dict)
    _held: dict[str, Addresses] = attrs.field(init=False, factory=dict)
    _pools4: dict[ipaddress.IPv4Network, LowestFreePool] = attrs.field(init=False, factory=dict)

    # -- queries -----------------------------------------------------------

    def holder(self, addr: IPAddress) -> str | None:
        """The container holding *addr* exclusively, if any."""
        return self._owner.get(_key(addr))

    def held(self, container_id: str) -> Addresses | None:
        return self._held.get(container_id)

    def containers(self) -> Iterable[str]:
        return self._held.keys()

    def in_use(self) -> int:
        """How many addresses are held exclusively."""
        return len(self._owner)

    def has_free(self, cidr: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
        """Whether :meth:`allocate` could still find an address in *cidr*
        (for STATUS).  IPv6 counts holders in the range: O(addresses held)."""
        if cidr.version == 4:
            pool = self._pool4(cidr)
            value = pool.take(self._taken4)
            if value is None:
                return False
            pool.give_back(value)
            return True
        base, size = int(cidr.network_address), cidr.num_addresses
        held = sum(1 for k in (*self._owner, *self._shared) if k[0] == 6 and base < k[1] < base + size)
        return held < size - 1  # the all-zero identifier is never handed out

    # -- changes -----------------------------------------------------------

    def allocate(self, container_id: str, request: PodRequest, identity: PodIdentity) -> Addresses:
        """All of *request*'s addresses for *container_id*, or none.

        A container that already holds addresses gets them back unchanged
        (a retried ADD must not leak a second set).
        """
        existing = self._held.get(container_id)
        if existing is not None:
            return existing
        self._held[container_id] = Addresses()
        try:
            for addr in request.addresses:
                other = self._claim(container_id, addr)
                if other is not None:
                    raise AnnotationError(ADDRESSES, str(addr), f"{addr} is already held by container {other}")
                self._record(container_id, addresses=addr)
            for addr in request.anycast:
                other = self._claim_anycast(container_id, addr)
                if other is not None:
                    raise AnnotationError(ANYCAST, str(addr), f"{addr} is held exclusively by container {other}")
                self._record(container_id, anycast=addr)
            if request.cidr6 is not None:
                ip6 = self._pick6(request.cidr6, request.layout, identity)
                self._owner[_key(ip6)] = container_id
                self._held[container_id] = attrs.evolve(self._held[container_id], ip6=ip6)
            if request.cidr4 is not None:
                ip4 = self._pick4(request.cidr4)
                self._owner[_key(ip4)] = container_id
                self._held[container_id] = attrs.evolve(self._held[container_id], ip4=ip4)
        except BaseException:
            self.release(container_id)
            raise
        return self._held[container_id]

    def mark_in_use(self, container_id: str, held: Addresses) -> None:
        """Seed from a stored allocation (agent start-up), replacing whatever
        *container_id* held.  An address another container already holds
        raises :class:`AddressConflict` and seeds nothing of this row; the
        caller decides what to do with it."""
        self.release(container_id)
        self._held[container_id] = Addresses()
        try:
            for addr in (held.ip6, held.ip4, *held.addresses):
                if addr is not None and (other := self._claim(container_id, addr)) is not None:
                    raise AddressConflict(addr, other, container_id)
            for addr in held.anycast:
                if (other := self._claim_anycast(container_id, addr)) is not None:
                    raise AddressConflict(addr, other, container_id)
        except BaseException:
            self._held[container_id] = held  # so release() finds every claim made
            self.release(container_id)
            raise
        self._held[container_id] = held

    def release(self, container_id: str) -> Addresses | None:
        """Free everything *container_id* holds; unknown container → None."""
        held = self._held.pop(container_id, None)
        if held is None:
            return None
        for addr in (held.ip6, held.ip4, *held.addresses):
            if addr is not None and self._owner.get(_key(addr)) == container_id:
                del self._owner[_key(addr)]
                self._freed(addr)
        for addr in held.anycast:
            users = self._shared.get(_key(addr))
            if users is not None:
                users.discard(container_id)
                if not users:
                    del self._shared[_key(addr)]
                    self._freed(addr)
        return held

    # -- internals ---------------------------------------------------------

    def _record(self, container_id: str, **one: IPAddress) -> None:
        held = self._held[container_id]
        ((field, addr),) = one.items()
        grown: dict[str, Any] = {field: (*getattr(held, field), addr)}
        self._held[container_id] = attrs.evolve(held, **grown)

    def _claim(self, container_id: str, addr: IPAddress) -> str | None:
        """Hold *addr* exclusively; return the other holder instead if there is one."""
        k = _key(addr)
        other = self._owner.get(k)
        if other is None and self._shared.get(k):
            other = min(self._shared[k])
        if other is not None and other != container_id:
            return other
        self._owner[k] = container_id
        return None

    def _claim_anycast(self, container_id: str, addr: IPAddress) -> str | None:
        """Share *addr*; return its exclusive holder instead if there is one."""
        k = _key(addr)
        other = self._owner.get(k)
        if other is not None:
            return other
        self._shared.setdefault(k, set()).add(container_id)
        return None

    def _taken(self, k: _Key) -> bool:
        return k in self._owner or k in self._shared

    def _freed(self, addr: IPAddress) -> None:
        if addr.version == 4:
            for pool in self._pools4.values():
                if addr in pool.cidr:
                    pool.give_back(int(addr))

    def _pool4(self, cidr: ipaddress.IPv4Network) -> LowestFreePool:
        pool = self._pools4.get(cidr)
        if pool is None:
            pool = self._pools4[cidr] = LowestFreePool(cidr)
        return pool

    def _taken4(self, value: int) -> bool:
        return (4, value) in self._owner or (4, value) in self._shared

    def _pick4(self, cidr: ipaddress.IPv4Network) -> ipaddress.IPv4Address:
        value = self._pool4(cidr).take(self._taken4)
        if value is None:
            raise PoolExhausted(cidr, f"all {cidr.num_addresses - 3} usable addresses of {cidr} are in use")
        return ipaddress.IPv4Address(value)

    def _pick6(
        self, cidr: ipaddress.IPv6Network, layout: Layout | None, identity: PodIdentity
    ) -> ipaddress.IPv6Address:
        host_bits = 128 - cidr.prefixlen
        base = int(cidr.network_address)
        if layout is None:
            for _ in range(TRIES):
                ident = self.rng.getrandbits(host_bits)
                if ident and not self._taken((6, base + ident)):
                    return ipaddress.IPv6Address(base + ident)
            if host_bits <= _SCAN_BITS:
                size = 1 << host_bits
                start = self.rng.randrange(size)
                for step in range(size):
                    ident = (start + step) % size
                    if ident and not self._taken((6, base + ident)):
                        return ipaddress.IPv6Address(base + ident)
            raise PoolExhausted(cidr, f"no free random identifier in {cidr} after {TRIES} tries")
        for n in range(TRIES):
            ident = self._layout_identifier(layout, host_bits, identity, n)
            if ident and not self._taken((6, base + ident)):
                return ipaddress.IPv6Address(base + ident)
        raise PoolExhausted(cidr, f"ip-algo {layout.text!r} collided {TRIES} times in {cidr}")

    def _layout_identifier(self, layout: Layout, host_bits: int, identity: PodIdentity, n: int) -> int:
        ident = 0
        shift = host_bits
        for field in layout.fields:
            shift -= field.bits
            mask = (1 << field.bits) - 1
            if field.name == RANDOM:
                value = self.rng.getrandbits(field.bits)
            elif field.name == COUNTER:
                value = n & mask
            else:
                value = fnv1a_64(identity.field(field.name)) & mask
            ident |= value << shift
        if shift:
            ident |= self.rng.getrandbits(shift)  # host bits the layout leaves out are random
        return ident
