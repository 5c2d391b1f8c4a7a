"""Kubernetes: the manifests of a campaign on a cluster, and Chaos Mesh faults."""
