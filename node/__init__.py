"""The node library both node plugins run on: the device plugin (gpuslice.deviceplugin) and the
DRA plugin (gpuslice.dra) find the same GPUs, keep the same health, hand out the same shares and
publish the same labels, each over its own kubelet API.

Modules, from pure to I/O:
  inventory     a node's GPUs and MIG devices as units (pure); nodefile and nvml_source find them
  migstrategy   how MIG devices are advertised (none, single, mixed)
  allocation    which units a pod gets, kept on one GPU (pure; the simulator runs it too)
  response      what a container is given for its units: devices, CDI names, environment
  health        NVML events (Xid) to unhealthy GPUs
  labels        the node labels the webhook and the pacer steer by, from what is free (pure)
  labeller      writes those labels, from kubelet's PodResources and the node's pods (nodepods)
  podresources  kubelet's PodResources API client
  startup       the checks a plugin runs before it advertises anything
  nodeconfig    per-node configuration files
  metrics       the plugins' Prometheus metrics
  runnables     the start-up and shutdown steps both plugins' mains share (gpuslice.runtime)

May import the shared core (gpuslice.{backoff,config,contract,kubeclient,labelcodec,listwatch,
podrequests,quantity,runtime,timeouts}) and gpuslice.proto; never a process's folder (the device
plugin, the DRA plugin, the webhook, the pacer, the controller): pyproject.toml's import-linter
contracts.
"""
