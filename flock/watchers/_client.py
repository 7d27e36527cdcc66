"""The agent's one connection to the API server: bridge, configuration, ApiClient."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import attrs
import trio
from kubernetes_asyncio.client import (
    ApiClient,
    Configuration,
    CoreV1Api,
    CustomObjectsApi,
    DiscoveryV1Api,
    NetworkingV1Api,
)

from ._bridge import AsyncioBridge, open_bridge
from ._config import in_cluster_configuration, kubeconfig_configuration
from ._informer import ListOptions
from ._source import CLOSE_SECONDS, KubeSource, translated_errors

NODECONFIG_GROUP, NODECONFIG_VERSION, NODECONFIG_PLURAL = "flock.fritzlab.net", "v1alpha1", "nodeconfigs"
# kubernetes-sigs/network-policy-api's ClusterNetworkPolicy (deploy/crd-clusternetworkpolicy.yaml).
CNP_GROUP, CNP_VERSION, CNP_PLURAL = "policy.networking.k8s.io", "v1alpha2", "clusternetworkpolicies"
# deploy/crd-loadbalancerpool.yaml: the allow-list of Service addresses (and flock-controller's pools).
POOL_GROUP, POOL_VERSION, POOL_PLURAL = "flock.fritzlab.net", "v1alpha1", "loadbalancerpools"


async def _new_api_client(conf: Configuration) -> ApiClient:
    # (asyncio) aiohttp wants its session created on a running loop.
    return ApiClient(conf)


@attrs.define(eq=False)
class KubeClient:
    """One shared ApiClient (one aiohttp session) and the bridge it runs on.

    Open with :func:`open_kube_client`; hand its sources to the watchers.
    """

    bridge: AsyncioBridge
    api_client: ApiClient

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        io_seconds: float = 10.0,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One request for a JSON object (*path*: ``/api/v1/namespaces/x/services/y/status``), with the
        client's credentials; raises :class:`KubeApiError` (its HTTP status) or :class:`TransientKubeError`.
        *content_type*: ``application/merge-patch+json`` for a merge patch."""
        api_client = self.api_client

        async def call() -> Any:
            return await api_client.call_api(
                path,
                method,
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                response_types_map={200: "object", 201: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _request_timeout=io_seconds,
            )

        with translated_errors(f"{method} {path}"):
            answer: dict[str, Any] = await self.bridge.call(call)
        return answer

    def pods_on_node(self, node: str) -> KubeSource:
        """Pods in every namespace with ``spec.nodeName=<node>``."""
        core = CoreV1Api(self.api_client)

        async def get_pod(namespace: str | None, name: str, **kw: Any) -> Any:
            return await core.read_namespaced_pod(name, namespace or "default", **kw)

        return KubeSource(
            self.bridge, f"pods on {node}", core.list_pod_for_all_namespaces, get_pod, f"spec.nodeName={node}"
        )

    def all_pods(self) -> KubeSource:
        """Every pod in the cluster (NetworkPolicy peers live on every node)."""
        core = CoreV1Api(self.api_client)

        async def get_pod(namespace: str | None, name: str, **kw: Any) -> Any:
            return await core.read_namespaced_pod(name, namespace or "default", **kw)

        return KubeSource(self.bridge, "pods (cluster-wide)", core.list_pod_for_all_namespaces, get_pod)

    def network_policies(self) -> KubeSource:
        """networking.k8s.io/v1 NetworkPolicies in every namespace."""
        net = NetworkingV1Api(self.api_client)

        async def get_policy(namespace: str | None, name: str, **kw: Any) -> Any:
            return await net.read_namespaced_network_policy(name, namespace or "default", **kw)

        return KubeSource(self.bridge, "networkpolicies", net.list_network_policy_for_all_namespaces, get_policy)

    def namespaces(self) -> KubeSource:
        """Every Namespace (their labels are what namespaceSelectors match)."""
        core = CoreV1Api(self.api_client)

        async def get_namespace(namespace: str | None, name: str, **kw: Any) -> Any:
            return await core.read_namespace(name, **kw)

        return KubeSource(self.bridge, "namespaces", core.list_namespace, get_namespace)

    def cluster_network_policies(self) -> KubeSource:
        """Every ClusterNetworkPolicy (cluster-scoped custom objects; 404 while the CRD is not installed)."""
        custom = CustomObjectsApi(self.api_client)

        async def list_policies(**kw: Any) -> Any:
            return await custom.list_cluster_custom_object(CNP_GROUP, CNP_VERSION, CNP_PLURAL, **kw)

        async def get_policy(namespace: str | None, name: str, **kw: Any) -> Any:
            return await custom.get_cluster_custom_object(CNP_GROUP, CNP_VERSION, CNP_PLURAL, name, **kw)

        return KubeSource(self.bridge, "clusternetworkpolicies", list_policies, get_policy)

    def load_balancer_pools(self) -> KubeSource:
        """Every LoadBalancerPool (cluster-scoped custom objects; 404 while the CRD is not installed)."""
        custom = CustomObjectsApi(self.api_client)

        async def list_pools(**kw: Any) -> Any:
            return await custom.list_cluster_custom_object(POOL_GROUP, POOL_VERSION, POOL_PLURAL, **kw)

        async def get_pool(namespace: str | None, name: str, **kw: Any) -> Any:
            return await custom.get_cluster_custom_object(POOL_GROUP, POOL_VERSION, POOL_PLURAL, name, **kw)

        return KubeSource(self.bridge, "loadbalancerpools", list_pools, get_pool)

    def _cluster_custom(self, plural: str, what: str, field_selector: str = "", label_selector: str = "") -> KubeSource:
        """Cluster-scoped custom objects of flock's API group (``flock.fritzlab.net/v1alpha1``)."""
        custom = CustomObjectsApi(self.api_client)

        async def list_objects(**kw: Any) -> Any:
            return await custom.list_cluster_custom_object(POOL_GROUP, POOL_VERSION, plural, **kw)

        async def get_object(namespace: str | None, name: str, **kw: Any) -> Any:
            return await custom.get_cluster_custom_object(POOL_GROUP, POOL_VERSION, plural, name, **kw)

        return KubeSource(self.bridge, what, list_objects, get_object, field_selector, label_selector)

    def address_groups(self, label_selector: str = "") -> KubeSource:
        """AddressGroups (flock-controller's slices), those *label_selector* picks (empty: every one)."""
        return self._cluster_custom("addressgroups", "addressgroups", label_selector=label_selector)

    def node_address_groups(self, node: str | None = None) -> KubeSource:
        """NodeAddressGroups: *node*'s alone (``metadata.name``), or every node's (None)."""
        selector = f"metadata.name={node}" if node is not None else ""
        return self._cluster_custom("nodeaddressgroups", f"nodeaddressgroups {node or ''}".strip(), selector)

    def nodes(self) -> KubeSource:
        """Every Node (their labels and addresses: ClusterNetworkPolicy ``nodes`` peers)."""
        core = CoreV1Api(self.api_client)

        async def get_node(namespace: str | None, name: str, **kw: Any) -> Any:
            return await core.read_node(name, **kw)

        return KubeSource(self.bridge, "nodes", core.list_node, get_node)

    def this_node(self, name: str) -> KubeSource:
        """This node's Node alone (``metadata.name``: cordoned, labels, taints)."""
        core = CoreV1Api(self.api_client)

        async def get_node(namespace: str | None, node: str, **kw: Any) -> Any:
            return await core.read_node(node, **kw)

        return KubeSource(self.bridge, f"node {name}", core.list_node, get_node, f"metadata.name={name}")

    def services(self) -> KubeSource:
        """Every Service (the service proxy translates them all: a client may be anywhere)."""
        core = CoreV1Api(self.api_client)

        async def get_service(namespace: str | None, name: str, **kw: Any) -> Any:
            return await core.read_namespaced_service(name, namespace or "default", **kw)

        return KubeSource(self.bridge, "services", core.list_service_for_all_namespaces, get_service)

    def endpoint_slices(self) -> KubeSource:
        """discovery.k8s.io/v1 EndpointSlices in every namespace (a Service's endpoints, anywhere)."""
        discovery = DiscoveryV1Api(self.api_client)

        async def get_slice(namespace: str | None, name: str, **kw: Any) -> Any:
            return await discovery.read_namespaced_endpoint_slice(name, namespace or "default", **kw)

        return KubeSource(self.bridge, "endpointslices", discovery.list_endpoint_slice_for_all_namespaces, get_slice)

    async def list_plain(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Every Pod and every NodeConfig in the cluster, once, as plain dicts (flockctl's ipam check).

        Pods are read in pages from the watch cache and trimmed to what the check reads
        (identity, node, hostNetwork, phase, IPs) as they arrive: a 150,000-pod cluster is
        never held whole."""
        pods: list[dict[str, Any]] = []

        def keep(obj: Any) -> None:
            meta, spec, status = (obj.get(k) or {} for k in ("metadata", "spec", "status"))
            pods.append(
                {
                    "metadata": {k: meta[k] for k in ("namespace", "name", "uid") if k in meta},
                    "spec": {k: spec[k] for k in ("nodeName", "hostNetwork") if k in spec},
                    "status": {k: status[k] for k in ("phase", "podIP", "podIPs") if k in status},
                }
            )

        source, options = self.all_pods(), ListOptions("0", limit=500)
        while (page := await source.list(options, keep)).continue_:
            options = ListOptions(limit=500, continue_=page.continue_)
        custom = CustomObjectsApi(self.api_client)
        configs = await self.bridge.call(
            custom.list_cluster_custom_object, NODECONFIG_GROUP, NODECONFIG_VERSION, NODECONFIG_PLURAL
        )
        return pods, list(configs.get("items") or [])

    def nodeconfigs(self) -> KubeSource:
        """Every NodeConfig (cluster-scoped): every node's pod blocks and WireGuard key."""
        custom = CustomObjectsApi(self.api_client)

        async def list_nodeconfigs(**kw: Any) -> Any:
            return await custom.list_cluster_custom_object(
                NODECONFIG_GROUP, NODECONFIG_VERSION, NODECONFIG_PLURAL, **kw
            )

        async def get_nodeconfig(namespace: str | None, name: str, **kw: Any) -> Any:
            return await custom.get_cluster_custom_object(
                NODECONFIG_GROUP, NODECONFIG_VERSION, NODECONFIG_PLURAL, name, **kw
            )

        return KubeSource(self.bridge, "nodeconfigs", list_nodeconfigs, get_nodeconfig)

    def nodeconfig(self, name: str) -> KubeSource:
        """The NodeConfig named *name* (cluster-scoped)."""
        custom = CustomObjectsApi(self.api_client)

        async def list_nodeconfigs(**kw: Any) -> Any:
            return await custom.list_cluster_custom_object(
                NODECONFIG_GROUP, NODECONFIG_VERSION, NODECONFIG_PLURAL, **kw
            )

        async def get_nodeconfig(namespace: str | None, name: str, **kw: Any) -> Any:
            return await custom.get_cluster_custom_object(
                NODECONFIG_GROUP, NODECONFIG_VERSION, NODECONFIG_PLURAL, name, **kw
            )

        return KubeSource(self.bridge, f"nodeconfig {name}", list_nodeconfigs, get_nodeconfig, f"metadata.name={name}")

    def secret(self, namespace: str, name: str) -> KubeSource:
        """The Secret *namespace*/*name* alone: listed and watched with a
        ``metadata.name`` field selector, which RBAC ``resourceNames`` allow."""
        core = CoreV1Api(self.api_client)

        async def list_secrets(**kw: Any) -> Any:
            return await core.list_namespaced_secret(namespace, **kw)

        async def get_secret(ns: str | None, secret: str, **kw: Any) -> Any:
            return await core.read_namespaced_secret(secret, ns or namespace, **kw)

        return KubeSource(self.bridge, f"secret {namespace}/{name}", list_secrets, get_secret, f"metadata.name={name}")


@contextlib.asynccontextmanager
async def open_kube_client(kubeconfig: str | os.PathLike[str] | None = None) -> AsyncIterator[KubeClient]:
    """Run the asyncio bridge and one ApiClient for the block.

    *kubeconfig* None → the pod's service account (in-cluster).  Configuration
    errors (:class:`ClientConfigError`) propagate: nothing to retry.  The
    ApiClient is closed in a shielded scope, so cancellation leaves no session open.
    """
    async with open_bridge() as bridge:
        if kubeconfig is None:
            conf = in_cluster_configuration()
        else:
            conf = await bridge.call(kubeconfig_configuration, kubeconfig)
        api_client = await bridge.call(_new_api_client, conf)
        try:
            yield KubeClient(bridge, api_client)
        finally:
            with trio.move_on_after(CLOSE_SECONDS, shield=True):
                await bridge.call(api_client.close)
