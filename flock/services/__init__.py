"""Services: flock's service proxy (issue 33), in nftables, off unless configured.

So far: :func:`find_kube_proxy` — the proxy never turns on while kube-proxy's
own tables, chains or IPVS interface are on the node (:mod:`._kubeproxy`).
"""

from ._kubeproxy import find_kube_proxy, kube_proxy_traces

__all__ = ["find_kube_proxy", "kube_proxy_traces"]
