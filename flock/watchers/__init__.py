"""This node's NodeConfig and pods from the API server (list+watch informers).

The only package (with flock.testing) that imports asyncio or kubernetes-asyncio.
"""

from ._bridge import AsyncioBridge, open_bridge
from ._client import KubeClient, open_kube_client
from ._config import ClientConfigError, in_cluster_configuration
from ._errors import KubeApiError, KubeError, ResourceExpired, TransientKubeError
from ._informer import Backoff, Change, ChangeType, Informer, InformerSettings, ListWatchSource
from ._nodeconfig import NodeConfigWatcher
from ._pods import POD_CACHE_WAIT_SECONDS, PodChange, PodWatcher
from ._source import KubeSource

__all__ = [
    "AsyncioBridge",
    "Backoff",
    "Change",
    "ChangeType",
    "ClientConfigError",
    "Informer",
    "InformerSettings",
    "KubeApiError",
    "KubeClient",
    "KubeError",
    "KubeSource",
    "ListWatchSource",
    "NodeConfigWatcher",
    "POD_CACHE_WAIT_SECONDS",
    "PodChange",
    "PodWatcher",
    "ResourceExpired",
    "TransientKubeError",
    "in_cluster_configuration",
    "open_bridge",
    "open_kube_client",
]
