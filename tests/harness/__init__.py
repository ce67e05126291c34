"""Test harness: the podman cluster the cluster tests and playbook runs use (podcluster)."""
