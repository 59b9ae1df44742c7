"""gpuslice: fractional GPUs for the stock kube-scheduler.

This package holds the shared core every component imports: `contract` (resource names, units,
labels, annotations), `config` (the one configuration schema), `podrequests` (what a pod asks, as
the scheduler counts it), `quantity` (the one Kubernetes quantity parser), `labelcodec` (the node
labels' values, written and read), `affinity` (the one NodeAffinity matcher), `listwatch`,
`backoff`, `timeouts` and `kubeclient`. The rest installs
beside it, each from its top-level folder: the processes `gpuslice.webhook` (admission),
`gpuslice.deviceplugin` (node), `gpuslice.dra` (node, DRA mode), `gpuslice.pacer` and
`gpuslice.controller`; `gpuslice.proto` (wire contracts); the tools `gpuslice.sim` (packing
simulator) and `gpuslice.demo`, which the container image leaves out. What may import what:
docs/architecture.md, checked by import-linter (pyproject.toml) in `make check`; the core imports no
process or tool.
"""

__version__ = "0.1.0"
