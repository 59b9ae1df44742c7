"""The kubelet DRA plugin (DRA mode, docs/dra.md): gpuslice as a Dynamic Resource Allocation driver.

The node's GPUs (found by the node library, gpuslice.node, as the device plugin finds them: NVML
or a node file) are published as ResourceSlices of resource.k8s.io/v1: one device per GPU whose
memory is a consumable capacity, so the stock kube-scheduler's DRA allocator gives claims shares
of one GPU and never more than it holds; MIG devices whole. Kubelet then asks the plugin to
prepare each claim it schedules here; the plugin writes a CDI spec with the GPU and the share's
environment (MPS limits, GPUSLICE_MEMORY_LIMIT_MIB, GPU_PORTION) and records what it prepared in a
checkpoint.

Modules, from pure to I/O:
  slices      inventory + health -> ResourceSlice objects, and the API's limits checked
  shares      a claim's allocation -> what each container gets (pure)
  cdi         CDI spec files (one per prepared claim), written atomically
  checkpoint  the record of prepared claims, written atomically
  preparer    NodePrepareResources / NodeUnprepareResources logic, idempotent and crash-safe
  kube        the API server: ResourceClaims read, ResourceSlices written (kubernetes client)
  publisher   keeps the node's ResourceSlices current, rate-limited
  server      the gRPC services: kubelet plugin registration, DRAPlugin v1 and v1beta1
  main        `gpuslice-dra-plugin`

May import the shared core (gpuslice.{backoff,config,contract,kubeclient,listwatch,timeouts}),
the node library gpuslice.node (discovery, allocation, health, labels and the labeller, metrics,
start-up, the container response) and the generated stubs; never the device plugin, the webhook,
the pacer or the controller.
Nothing in the product imports gpuslice.dra; the simulator does (its slices and labeller, for the
DRA-mode replay).
"""
