"""Kubelet's plugin registration API; stubs generated below."""
