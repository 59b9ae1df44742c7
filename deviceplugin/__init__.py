"""The node half of gpuslice: a kubelet device plugin.

Advertises each GPU's memory as `<prefix>/gpu-memory` units and MIG devices as
`<prefix>/mig-<profile>`, over kubelet's device plugin API v1beta1 (gpuslice.proto).
Discovery (`inventory`, `nodefile`, `nvml_source`) and allocation (`allocation`) are plain
code with no I/O the simulator reuses; gRPC, sockets and NVML live in their own modules.

May import the shared core (gpuslice.{backoff,config,contract,kubeclient,listwatch,podrequests,
timeouts}) and gpuslice.proto; never the webhook, the DRA plugin, the pacer or the controller
(pyproject.toml's import-linter contracts).
"""
