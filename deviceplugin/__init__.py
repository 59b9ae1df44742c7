"""The node half of gpuslice: a kubelet device plugin.

Advertises each GPU's memory as `<prefix>/gpu-memory` units and MIG devices as
`<prefix>/mig-<profile>`, over kubelet's device plugin API v1beta1 (gpuslice.proto).
Discovery, allocation, health and the labeller are the node library's (gpuslice.node), which the
DRA plugin shares; here are what only the device plugin does: kubelet's device plugin API
(`server`, `manager`), keeping a pod on one GPU (`placement`), the runtime usage monitor
(`monitor` and its parts); the MPS control daemon is its own process (gpuslice.mps).

May import the shared core, gpuslice.node and gpuslice.proto; never the webhook, the DRA plugin,
the pacer or the controller (pyproject.toml's import-linter contracts).
"""
