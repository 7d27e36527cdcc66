"""IPAM: pod annotations, ip-algo and address allocation (pure, root-free)."""

from flock.fnv import fnv1a_32, fnv1a_64
from flock.ipam._allocator import AddressConflict, Addresses, Allocator
from flock.ipam._claims import MAX_CLAIMS_PER_POD, allowed_ranges, claim_refusal
from flock.ipam._errors import AnnotationError, IpamError, PoolExhausted
from flock.ipam._identity import PodIdentity, app_name, image_name, pod_identity
from flock.ipam._ipam import Ipam, node_layout
from flock.ipam._layout import Layout, LayoutError, LayoutField, parse_layout
from flock.ipam._request import (
    ADDRESSES,
    ANYCAST,
    CIDR4,
    CIDR6,
    IP_ALGO,
    IPV4,
    IPV6,
    PodRequest,
    effective_cidr,
    parse_request,
)

__all__ = [
    "ADDRESSES",
    "ANYCAST",
    "CIDR4",
    "CIDR6",
    "IPV4",
    "IPV6",
    "IP_ALGO",
    "MAX_CLAIMS_PER_POD",
    "AddressConflict",
    "Addresses",
    "Allocator",
    "AnnotationError",
    "Ipam",
    "IpamError",
    "Layout",
    "LayoutError",
    "LayoutField",
    "PodIdentity",
    "PodRequest",
    "PoolExhausted",
    "allowed_ranges",
    "app_name",
    "claim_refusal",
    "effective_cidr",
    "fnv1a_32",
    "fnv1a_64",
    "image_name",
    "node_layout",
    "parse_layout",
    "parse_request",
    "pod_identity",
]
