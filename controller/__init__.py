"""The controller: one process, several replicas, one leader that acts (docs/architecture.md).

leader           leader election on a coordination.k8s.io Lease
requeue          recreates converted bare pods that kubelet refused
requeue_journal  the requeuer's write-ahead record, so that no refused pod is lost
main             the `gpuslice-controller` command: the requeuer and, with pacing on, the pacer

The webhook answers admissions from every replica and writes nothing but its answers; whatever
changes the cluster on its own runs here, under the Lease.

May import gpuslice.{backoff,config,contract,kubeclient,listwatch,timeouts} and gpuslice.pacer;
never the webhook or the device plugin.
"""
