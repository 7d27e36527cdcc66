"""The MTU new pods get: NodeConfig ``spec.mtu``, else what the uplink carries (pure)."""

from __future__ import annotations

import attrs

from flock.model import MTU_DEFAULT, MTU_MAX, MTU_MIN, NodeConfig, UplinkMtu


@attrs.frozen
class PodMtu:
    """The MTU in force for new pods' veth ends and where it came from:
    ``"nodeconfig"``, ``"detected from eth0's IPv6 default route"``, …"""

    value: int
    source: str
    # Encryption on and the fabric too small for IPv6 inside the tunnel: why (the tunnel is not brought up)
    refused: str | None = None


# What WireGuard adds to each packet (outer IP header, UDP, WireGuard's header and tag): 80 bytes over an
# IPv6 fabric (40 + 8 + 32), 60 over IPv4 (20 + 8 + 32).
WIREGUARD_OVERHEAD = {6: 80, 4: 60}


def pod_mtu(node: NodeConfig | None, uplink: UplinkMtu | None, overhead: int = 0) -> PodMtu:
    """The fabric's MTU (:func:`fabric_mtu`) less *overhead* (a tunnel's, :data:`WIREGUARD_OVERHEAD`).

    Never below :data:`~flock.model.MTU_MIN` (IPv6's 1280): a fabric too small for that keeps 1280 for
    the pods' veths and says in *refused* why the tunnel may not carry them."""
    fabric = fabric_mtu(node, uplink)
    if not overhead:
        return fabric
    value = fabric.value - overhead
    source = f"{fabric.source}, less {overhead} for WireGuard"
    if value < MTU_MIN:
        why = (
            f"the fabric's MTU {fabric.value} less WireGuard's {overhead} bytes is {value}, below IPv6's minimum "
            f"{MTU_MIN}: encryption refused (raise the fabric's MTU, or spec.mtu, to at least {MTU_MIN + overhead})"
        )
        return PodMtu(MTU_MIN, source, why)
    return PodMtu(value, source)


def fabric_mtu(node: NodeConfig | None, uplink: UplinkMtu | None) -> PodMtu:
    """``spec.mtu`` when set; else the uplink's MTU, kept within
    :data:`~flock.model.MTU_MIN`..:data:`~flock.model.MTU_MAX` (below 1280 the
    kernel turns IPv6 off on a link; a loopback-like 65536 is no fabric's);
    else (not read yet) :data:`~flock.model.MTU_DEFAULT`.

    flock routes pods natively (no encapsulation), so a pod may use exactly
    what the uplink carries."""
    if node is not None and node.mtu is not None:
        return PodMtu(node.mtu, "nodeconfig")
    if uplink is None:
        return PodMtu(MTU_DEFAULT, "default (the uplink has not been read)")
    value = min(max(uplink.mtu, MTU_MIN), MTU_MAX)
    source = uplink.describe()
    if value != uplink.mtu:
        source += f" ({uplink.mtu}, kept within {MTU_MIN}..{MTU_MAX})"
    return PodMtu(value, source)
