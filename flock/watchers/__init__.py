"""This node's NodeConfig and pods, and the cluster's NetworkPolicies, Namespaces,
Pods, ClusterNetworkPolicies and Nodes, from the API server (list+watch informers).

The only package (with flock.apiserver and flock.testing) that imports asyncio or kubernetes-asyncio.
The agent opens one client and hands the watchers to its supervisor::

    async with open_kube_client(args.kubeconfig) as kube:      # None: in-cluster
        nodeconfig = NodeConfigWatcher(kube.nodeconfig(node), node)
        pods = PodWatcher(kube.pods_on_node(node), node)
        ...supervisor children: nodeconfig.run, pods.run (started() after the first list)

    cfg = await nodeconfig.wait_changed(last_seen)               # NodeConfig changed
    with pods.subscribe() as changes: async for c in changes: …  # pod added/modified/deleted
    pod = await pods.lookup(namespace, name)                     # ADD: ≤3 s in cache, then one GET

With NetworkPolicy (see :mod:`flock.watchers._policy`), one informer watches every pod::

        policy = PolicyWatcher(kube.network_policies(), kube.namespaces(), inputs,
                               cluster_policies=kube.cluster_network_policies(), nodes=kube.nodes())
        pods = PodWatcher(kube.all_pods(), node, listeners=(policy.pod_listener,))
"""

from ._bridge import AsyncioBridge, open_bridge
from ._client import KubeClient, open_kube_client
from ._config import ClientConfigError, in_cluster_configuration
from ._errors import (
    KubeApiError,
    KubeError,
    ResourceExpired,
    ResourceVersionTooLarge,
    TransientKubeError,
    error_for_status,
)
from ._groups import PeerFeed, group_selector
from ._informer import (
    INITIAL_EVENTS_END,
    Change,
    ChangeListener,
    ChangeType,
    Informer,
    InformerSettings,
    ListOptions,
    ListPage,
    ListWatchSource,
)
from ._nodeconfig import NodeConfigSink, NodeConfigWatcher
from ._pods import POD_CACHE_WAIT_SECONDS, PodChange, PodWatcher
from ._policy import CRD_RETRY_SECONDS, PolicyWatcher
from ._pools import PoolWatcher
from ._secrets import SecretWatcher, decode_secret
from ._services import ServiceWatcher
from ._source import KubeSource

__all__ = [
    "CRD_RETRY_SECONDS",
    "INITIAL_EVENTS_END",
    "POD_CACHE_WAIT_SECONDS",
    "AsyncioBridge",
    "Change",
    "ChangeListener",
    "ChangeType",
    "ClientConfigError",
    "Informer",
    "InformerSettings",
    "KubeApiError",
    "KubeClient",
    "KubeError",
    "KubeSource",
    "ListOptions",
    "ListPage",
    "ListWatchSource",
    "NodeConfigSink",
    "NodeConfigWatcher",
    "PeerFeed",
    "PodChange",
    "PodWatcher",
    "PolicyWatcher",
    "PoolWatcher",
    "ResourceExpired",
    "ResourceVersionTooLarge",
    "SecretWatcher",
    "ServiceWatcher",
    "TransientKubeError",
    "decode_secret",
    "error_for_status",
    "group_selector",
    "in_cluster_configuration",
    "open_bridge",
    "open_kube_client",
]
