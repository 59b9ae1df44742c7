// Command kube-controller-manager is the upstream controller manager, built from k8s.io/kubernetes for
// gpuslice's e2e tests (Deployments, Jobs, StatefulSets, CronJobs, DaemonSets, ResourceQuota status,
// namespace deletion and garbage collection).
package main

import (
	"os"
	_ "time/tzdata" // CronJob time zones, as upstream does

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() { os.Exit(cli.Run(app.NewControllerManagerCommand())) }
