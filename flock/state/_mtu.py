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


def pod_mtu(node: NodeConfig | None, uplink: UplinkMtu | None) -> PodMtu:
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
