"""The Kubernetes resources the fake API server knows, and their URL shapes."""

from __future__ import annotations

import attrs


@attrs.frozen
class Resource:
    group: str  # "" for the core API
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        """URL prefix of the API group: ``/api/v1`` or ``/apis/<group>/<version>``."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    @property
    def list_kind(self) -> str:
        return self.kind + "List"


PODS = Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
NODECONFIGS = Resource(
    group="flock.fritzlab.net", version="v1alpha1", plural="nodeconfigs", kind="NodeConfig", namespaced=False
)
NAMESPACES = Resource(group="", version="v1", plural="namespaces", kind="Namespace", namespaced=False)
NETWORKPOLICIES = Resource(
    group="networking.k8s.io", version="v1", plural="networkpolicies", kind="NetworkPolicy", namespaced=True
)
SECRETS = Resource(group="", version="v1", plural="secrets", kind="Secret", namespaced=True)
# kubernetes-sigs/network-policy-api v0.2.0's CRD (deploy/crd-clusternetworkpolicy.yaml).
CLUSTERNETWORKPOLICIES = Resource(
    group="policy.networking.k8s.io",
    version="v1alpha2",
    plural="clusternetworkpolicies",
    kind="ClusterNetworkPolicy",
    namespaced=False,
)
NODES = Resource(group="", version="v1", plural="nodes", kind="Node", namespaced=False)
RESOURCES = (PODS, NODECONFIGS, SECRETS, NAMESPACES, NETWORKPOLICIES, CLUSTERNETWORKPOLICIES, NODES)
