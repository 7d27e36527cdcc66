"""flock-lab: a routed multi-node flock cluster in network namespaces on one machine."""
