"""flock's own controller (``flock-controller``): one elected writer for cluster-wide work.

Today it allocates LoadBalancer addresses from LoadBalancerPools (:mod:`._ipam`, pure).
"""

from ._ipam import (
    ANNOTATION_IPS,
    ANNOTATION_SHARING,
    CONDITION_TYPE,
    LOAD_BALANCER_CLASS,
    METALLB_ANNOTATION_IPS,
    METALLB_ANNOTATION_SHARING,
    Allocation,
    FamilyCount,
    LbService,
    Plan,
    Pool,
    PoolStatus,
    Reason,
    ServiceCondition,
    plan,
)

__all__ = [
    "ANNOTATION_IPS",
    "ANNOTATION_SHARING",
    "CONDITION_TYPE",
    "LOAD_BALANCER_CLASS",
    "METALLB_ANNOTATION_IPS",
    "METALLB_ANNOTATION_SHARING",
    "Allocation",
    "FamilyCount",
    "LbService",
    "Plan",
    "Pool",
    "PoolStatus",
    "Reason",
    "ServiceCondition",
    "plan",
]
