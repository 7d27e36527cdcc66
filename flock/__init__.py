"""flock: routed, IPv6-first Kubernetes CNI on Trio."""

__version__ = "0.2.0"
