"""The Kubernetes resources the fake API server knows, their URL shapes and what discovery says of them."""

from __future__ import annotations

import attrs

# Every resource answers these (kube-apiserver also has deletecollection, which this server does not route).
VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")


@attrs.frozen
class Column:
    """One column of ``kubectl get``'s table (a CRD's ``additionalPrinterColumns`` entry);
    *priority* 1: shown with ``-o wide`` only."""

    name: str
    type: str  # string, integer, number, boolean, date
    json_path: str  # .spec.cidr6 (a plain dotted path: no filters)
    priority: int = 0
    description: str = ""


@attrs.frozen
class Resource:
    group: str  # "" for the core API
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()  # upstream's (kubectl get po)
    # A /status subresource, as upstream serves it (the server routes /status for every kind).
    status_subresource: bool = False
    requires_spec: bool = True  # the object has a required ``spec`` (admission checks it)
    custom: bool = False  # a custom resource (its CRD object, once stored, validates it)

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

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def crd_name(self) -> str:
        """The name of the CustomResourceDefinition that defines it (``<plural>.<group>``)."""
        return f"{self.plural}.{self.group}"


PODS = Resource(
    group="", version="v1", plural="pods", kind="Pod", namespaced=True, short_names=("po",), status_subresource=True
)
NODECONFIGS = Resource(
    group="flock.fritzlab.net",
    version="v1alpha1",
    plural="nodeconfigs",
    kind="NodeConfig",
    namespaced=False,
    short_names=("nc",),
    status_subresource=True,  # status.wireguard.publicKey, written by each node's agent
    custom=True,
)
NAMESPACES = Resource(
    group="",
    version="v1",
    plural="namespaces",
    kind="Namespace",
    namespaced=False,
    short_names=("ns",),
    status_subresource=True,
)
NETWORKPOLICIES = Resource(
    group="networking.k8s.io",
    version="v1",
    plural="networkpolicies",
    kind="NetworkPolicy",
    namespaced=True,
    short_names=("netpol",),
)
SECRETS = Resource(group="", version="v1", plural="secrets", kind="Secret", namespaced=True, requires_spec=False)
# kubernetes-sigs/network-policy-api v0.2.0's CRD (deploy/crd-clusternetworkpolicy.yaml).
CLUSTERNETWORKPOLICIES = Resource(
    group="policy.networking.k8s.io",
    version="v1alpha2",
    plural="clusternetworkpolicies",
    kind="ClusterNetworkPolicy",
    namespaced=False,
    short_names=("cnp",),
    status_subresource=True,
    custom=True,
)
NODES = Resource(
    group="", version="v1", plural="nodes", kind="Node", namespaced=False, short_names=("no",), status_subresource=True
)
SERVICES = Resource(
    group="",
    version="v1",
    plural="services",
    kind="Service",
    namespaced=True,
    short_names=("svc",),
    status_subresource=True,
)
ENDPOINTSLICES = Resource(
    group="discovery.k8s.io",
    version="v1",
    plural="endpointslices",
    kind="EndpointSlice",
    namespaced=True,
    requires_spec=False,  # addressType, endpoints and ports are top-level
)
# flock's LoadBalancer address pools (issue 34; deploy/crd-loadbalancerpool.yaml), their status the
# controller's counts.
LOADBALANCERPOOLS = Resource(
    group="flock.fritzlab.net",
    version="v1alpha1",
    plural="loadbalancerpools",
    kind="LoadBalancerPool",
    namespaced=False,
    short_names=("lbpool",),
    status_subresource=True,
    custom=True,
)
# Issue 35's address groups (deploy/crd-addressgroups.yaml), written by flock-controller: one slice of
# one group's members (top-level fields, as an EndpointSlice), and the groups one node needs.
ADDRESSGROUPS = Resource(
    group="flock.fritzlab.net",
    version="v1alpha1",
    plural="addressgroups",
    kind="AddressGroup",
    namespaced=False,
    short_names=("ag",),
    requires_spec=False,
    custom=True,
)
NODEADDRESSGROUPS = Resource(
    group="flock.fritzlab.net",
    version="v1alpha1",
    plural="nodeaddressgroups",
    kind="NodeAddressGroups",
    namespaced=False,
    short_names=("nag",),
    requires_spec=False,
    custom=True,
)
# Leader election (flock-controller's, as client-go's leaderelection uses them): stored, read and
# written with resourceVersion like any object; spec is optional upstream.
LEASES = Resource(
    group="coordination.k8s.io",
    version="v1",
    plural="leases",
    kind="Lease",
    namespaced=True,
    requires_spec=False,
)
# core/v1 Events (flock-controller's reasons, shown by `kubectl describe`): stored and listed.
EVENTS = Resource(
    group="", version="v1", plural="events", kind="Event", namespaced=True, short_names=("ev",), requires_spec=False
)
# What deploy/'s kustomization holds besides flock's own kinds: stored and listed, checked only
# for what every object needs (name, labels, annotations; a CRD's names, a DaemonSet's spec).
CUSTOMRESOURCEDEFINITIONS = Resource(
    group="apiextensions.k8s.io",
    version="v1",
    plural="customresourcedefinitions",
    kind="CustomResourceDefinition",
    namespaced=False,
    short_names=("crd", "crds"),
    status_subresource=True,
)
SERVICEACCOUNTS = Resource(
    group="",
    version="v1",
    plural="serviceaccounts",
    kind="ServiceAccount",
    namespaced=True,
    short_names=("sa",),
    requires_spec=False,
)
CONFIGMAPS = Resource(
    group="",
    version="v1",
    plural="configmaps",
    kind="ConfigMap",
    namespaced=True,
    short_names=("cm",),
    requires_spec=False,
)
DAEMONSETS = Resource(
    group="apps",
    version="v1",
    plural="daemonsets",
    kind="DaemonSet",
    namespaced=True,
    short_names=("ds",),
    status_subresource=True,
)
DEPLOYMENTS = Resource(
    group="apps",
    version="v1",
    plural="deployments",
    kind="Deployment",
    namespaced=True,
    short_names=("deploy",),
    status_subresource=True,
)
_RBAC = "rbac.authorization.k8s.io"
CLUSTERROLES = Resource(
    group=_RBAC, version="v1", plural="clusterroles", kind="ClusterRole", namespaced=False, requires_spec=False
)
CLUSTERROLEBINDINGS = Resource(
    group=_RBAC,
    version="v1",
    plural="clusterrolebindings",
    kind="ClusterRoleBinding",
    namespaced=False,
    requires_spec=False,
)
ROLES = Resource(group=_RBAC, version="v1", plural="roles", kind="Role", namespaced=True, requires_spec=False)
ROLEBINDINGS = Resource(
    group=_RBAC, version="v1", plural="rolebindings", kind="RoleBinding", namespaced=True, requires_spec=False
)
_ADMISSION = "admissionregistration.k8s.io"
# deploy/admission-nodeconfig-status.yaml's (issue 36): stored and listed, not acted on — the lab's server
# enforces that policy itself (ApiServer(token_nodes=…)).
VALIDATINGADMISSIONPOLICIES = Resource(
    group=_ADMISSION,
    version="v1",
    plural="validatingadmissionpolicies",
    kind="ValidatingAdmissionPolicy",
    namespaced=False,
)
VALIDATINGADMISSIONPOLICYBINDINGS = Resource(
    group=_ADMISSION,
    version="v1",
    plural="validatingadmissionpolicybindings",
    kind="ValidatingAdmissionPolicyBinding",
    namespaced=False,
)
RESOURCES = (
    PODS,
    NODECONFIGS,
    SECRETS,
    NAMESPACES,
    NETWORKPOLICIES,
    CLUSTERNETWORKPOLICIES,
    NODES,
    SERVICES,
    ENDPOINTSLICES,
    LOADBALANCERPOOLS,
    ADDRESSGROUPS,
    NODEADDRESSGROUPS,
    LEASES,
    EVENTS,
    CUSTOMRESOURCEDEFINITIONS,
    SERVICEACCOUNTS,
    CONFIGMAPS,
    DAEMONSETS,
    DEPLOYMENTS,
    CLUSTERROLES,
    CLUSTERROLEBINDINGS,
    ROLES,
    ROLEBINDINGS,
    VALIDATINGADMISSIONPOLICIES,
    VALIDATINGADMISSIONPOLICYBINDINGS,
)
