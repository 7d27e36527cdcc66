"""The lab's Kubernetes API server: a stand-in for kube-apiserver (1.32) over real HTTP.

No kube-apiserver can run on the machines flock is built and tested on, so flock
holds its own, faithful where flock, kubectl and kubernetes-asyncio look.  The
lab runs it as a process (``python -m flock.apiserver``, see :mod:`.__main__`),
kubectl reaches it through ``flock-lab kubeconfig``; tests run it on a thread
(:class:`ApiServer`) or use its storage directly (:class:`ObjectStore`).  It
imports nothing of flock's agent, lab or test harnesses.

What it implements of the real kube-apiserver, and what it does not:

=============================  ===============================================================
implemented                    how faithfully
=============================  ===============================================================
kinds                          Pod, Namespace, Node, Secret, NetworkPolicy, Service,
                               EndpointSlice, NodeConfig, ClusterNetworkPolicy (upstream's
                               CRD), LoadBalancerPool, AddressGroup, NodeAddressGroups, Lease (coordination.k8s.io: leader
                               election, stored and written like any object), and deploy/'s other kinds (CRDs, ServiceAccounts,
                               ConfigMaps, DaemonSets, RBAC objects, ValidatingAdmissionPolicies: stored and listed, not
                               acted on) (:mod:`._resources`)
Service allocation             ClusterIPs from ``--service-cluster-ip-range`` (one CIDR or two:
                               dual-stack, ipFamilyPolicy and ipFamilies as upstream), NodePorts
                               from 30000-32767 and healthCheckNodePort, random free or the
                               requested one checked, under the store's lock; kept on update,
                               released on delete; upstream's defaults, validation and messages
                               (:mod:`._services`, :mod:`._service_alloc`, :mod:`._endpointslices`)
verbs                          get, list, watch, create, update, patch, delete, and the
                               ``status`` subresource where upstream has one
graceful deletion              Pods as upstream: a bound pod deleted with a grace (the request's
                               ``gracePeriodSeconds``, else its terminationGracePeriodSeconds,
                               else 30) is marked (``deletionTimestamp``,
                               ``deletionGracePeriodSeconds``: MODIFIED) until a DELETE with
                               grace 0 removes it; only a shorter grace replaces a running one
                               (:mod:`._deletion`); other kinds go at once
resourceVersion                one counter for every kind (etcd's revision); 409 on a stale
                               update; ``generation`` counts spec changes; uid and
                               creationTimestamp set on create; ``generateName``
                               (:mod:`._store`)
lists                          paged (``limit``/``continue``, etcd's continue token and 410
                               "inconsistent continue"), ``resourceVersion`` with
                               ``resourceVersionMatch`` (Exact, NotOlderThan) validated and
                               defaulted as 1.32, answered from the watch cache or "etcd"
                               as 1.32 decides; reads at an older version are the state then
                               (MVCC) (:mod:`._selectors`, :mod:`._lists`)
watches                        from a version (history replayed; 410 when compacted), from
                               now, WatchList (``sendInitialEvents``, the initial-events-end
                               bookmark), BOOKMARKs, ``timeoutSeconds``, objects entering or
                               leaving a field selector as ADDED/DELETED
field selectors                the fields upstream supports for the kinds held
                               (``spec.nodeName`` indexed, as the watch cache indexes pods)
label selectors                apimachinery's syntax, checks, messages and matching, on lists
                               and watches (entering and leaving as ADDED/DELETED) (:mod:`._labels`)
PATCH                          merge, JSON, strategic merge (built-in kinds) and server-side
                               apply with ``managedFields`` (:mod:`._patch`)
validation and defaulting      upstream's rules for the fields flock reads, 422 ``Invalid``
                               naming the field (:mod:`._admission`); custom resources
                               pruned and checked against their CRD's schema and CEL rules
                               (:mod:`._crds`, :mod:`._cnp`, :mod:`.k8s_schema`)
Secrets                        ``stringData`` folded into base64 ``data``; values never echoed
kubectl                        aggregated and legacy discovery, OpenAPI v3 documents (v2: empty),
                               server-side printing (``Table``, ``-o wide``) (:mod:`._discovery`,
                               :mod:`._tables`)
traffic (not upstream)         each watch's events and bytes (``GET /debug/flock/watches``); virtual
                               watches, counted for thousands of agents without a connection
                               (:mod:`._virtual`, :mod:`._debug`)
faults (not upstream)          dropped connections, injected errors, compaction, pause
                               (``POST /flock-testing/...``) for the client's tests
=============================  ===============================================================

Not implemented: authentication and authorization (any bearer token is
accepted, or those of ``tokens``; RBAC objects are stored, never enforced;
one admission policy is: tokens bound to a node, ``token_nodes``, write the
status of that node's NodeConfig only, as deploy/admission-nodeconfig-status.yaml
says), ``dryRun`` (400; ``kubectl --dry-run=client``
works), graceful deletion of kinds other than Pod, finalizers and garbage
collection, admission webhooks, API aggregation, pod subresources (exec, logs,
port-forward, binding, eviction), Events, protobuf and CBOR (JSON only), and
any controller (the lab plays the controllers it needs, as processes of its
own: see :mod:`flock.lab.controllers`; no LoadBalancer controller, no ServiceCIDR/IPAddress objects, no
``--service-node-port-range`` flag, and a Service's errors come one at a time
where upstream lists them all).
"""

from ._admission import NAME_LABEL
from ._deletion import DeleteOptions
from ._objects import (
    cluster_network_policy_object,
    namespace_object,
    network_policy_object,
    node_object,
    nodeconfig_object,
    pod_object,
    secret_object,
)
from ._resources import (
    ADDRESSGROUPS,
    CLUSTERNETWORKPOLICIES,
    ENDPOINTSLICES,
    EVENTS,
    LEASES,
    LOADBALANCERPOOLS,
    NAMESPACES,
    NETWORKPOLICIES,
    NODEADDRESSGROUPS,
    NODECONFIGS,
    NODES,
    PODS,
    RESOURCES,
    SECRETS,
    SERVICES,
    Resource,
)
from ._server import ApiServer, kubeconfig, load_objects, write_kubeconfig
from ._status import StatusError
from ._store import ObjectStore
from ._virtual import VirtualWatch, VirtualWatches

__all__ = [
    "ADDRESSGROUPS",
    "CLUSTERNETWORKPOLICIES",
    "ENDPOINTSLICES",
    "EVENTS",
    "LEASES",
    "LOADBALANCERPOOLS",
    "NAMESPACES",
    "NAME_LABEL",
    "NETWORKPOLICIES",
    "NODEADDRESSGROUPS",
    "NODECONFIGS",
    "NODES",
    "PODS",
    "RESOURCES",
    "SECRETS",
    "SERVICES",
    "ApiServer",
    "DeleteOptions",
    "ObjectStore",
    "Resource",
    "StatusError",
    "VirtualWatch",
    "VirtualWatches",
    "cluster_network_policy_object",
    "kubeconfig",
    "load_objects",
    "namespace_object",
    "network_policy_object",
    "node_object",
    "nodeconfig_object",
    "pod_object",
    "secret_object",
    "write_kubeconfig",
]
