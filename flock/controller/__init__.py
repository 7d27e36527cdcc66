"""flock's own controller (``flock-controller``): one elected writer for cluster-wide work.

Today it allocates LoadBalancer addresses from LoadBalancerPools: :mod:`._ipam`
(pure: pools + Services → addresses and conditions), :mod:`._reconcile` (one
pass: read, plan, write the differences through /status, each write guarded by
resourceVersion and preceded by a Lease renewal), :mod:`._lease` (leader
election with a coordination.k8s.io Lease), :mod:`._loop` (the pass repeated).
"""

from ._api import HttpApi, Kind, KubeApi, ObjectApi
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
from ._lease import Elector, LeaseSettings, Take, WaitUntil, decide
from ._loop import LoadBalancerController
from ._reconcile import Fenced, Stale, reconcile

__all__ = [
    "ANNOTATION_IPS",
    "ANNOTATION_SHARING",
    "CONDITION_TYPE",
    "LOAD_BALANCER_CLASS",
    "METALLB_ANNOTATION_IPS",
    "METALLB_ANNOTATION_SHARING",
    "Allocation",
    "Elector",
    "FamilyCount",
    "Fenced",
    "HttpApi",
    "Kind",
    "KubeApi",
    "LbService",
    "LeaseSettings",
    "LoadBalancerController",
    "ObjectApi",
    "Plan",
    "Pool",
    "PoolStatus",
    "Reason",
    "ServiceCondition",
    "Stale",
    "Take",
    "WaitUntil",
    "decide",
    "plan",
    "reconcile",
]
