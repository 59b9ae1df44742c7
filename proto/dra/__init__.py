"""Kubelet's DRA plugin API (services v1.DRAPlugin and v1beta1.DRAPlugin); stubs generated below."""
