"""gpuslice: fractional GPUs for the stock kube-scheduler.

This package holds what both halves share: `contract` (resource names, units, labels,
annotations) and `config` (the one configuration schema). The halves install beside it:
`gpuslice.deviceplugin` (node, from deviceplugin/), `gpuslice.webhook` (admission, from
webhook/), `gpuslice.proto` (wire contracts, from proto/), `gpuslice.sim` (packing simulator,
from sim/) and `gpuslice.demo` (from demo/).
"""

__version__ = "0.1.0"
