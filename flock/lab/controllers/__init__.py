"""The lab's stand-ins for the controllers a cluster runs besides flock, as one process
(``python -m flock.lab.controllers``, kept by the lab's keeper in the fabric namespace):

- kube-controller-manager's EndpointSlice controller (:mod:`._slices`, the pure part; :mod:`._endpointslices`,
  the loop): every Service with a selector gets its EndpointSlices, within well under a second of a
  change of its pods;
- the kubelets' last part of a pod's life (:mod:`._kubelet`): a pod deleted by kubectl is served for
  its grace, then torn down (CNI DEL) and removed.

Both follow the API server with flock's own informers (:mod:`flock.watchers`) and write with the
lab's API client.
"""

from ._endpointslices import EndpointSliceController, SliceWriter, node_zone
from ._kubelet import KubeletStandIn
from ._run import run_controllers
from ._slices import (
    CONTROLLER_NAME,
    MANAGED_BY_LABEL,
    MAX_ENDPOINTS_PER_SLICE,
    SERVICE_NAME_LABEL,
    Endpoint,
    EndpointPort,
    PodValue,
    ServiceValue,
    SlicePlan,
    SliceValue,
    desired_endpoints,
    plan_service,
)

__all__ = [
    "CONTROLLER_NAME",
    "MANAGED_BY_LABEL",
    "MAX_ENDPOINTS_PER_SLICE",
    "SERVICE_NAME_LABEL",
    "Endpoint",
    "EndpointPort",
    "EndpointSliceController",
    "KubeletStandIn",
    "PodValue",
    "ServiceValue",
    "SlicePlan",
    "SliceValue",
    "SliceWriter",
    "desired_endpoints",
    "node_zone",
    "plan_service",
    "run_controllers",
]
