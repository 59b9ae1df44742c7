package main

// Kubelet's own PodResources v1 server (k8s.io/kubernetes/pkg/kubelet/apis/podresources), fed by the harness's
// pods and the real device manager, so gpuslice's labeller reads what a kubelet would tell it.

import (
	"context"
	"net"
	"os"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

// providers adapts the harness to the interfaces kubelet's PodResources server reads. CPUs, memory and DRA
// resources are not managed here: they report nothing, as on a node without those managers' static policies.
type providers struct{ h *harness }

func (p providers) GetActivePods() []*v1.Pod { return p.h.activePods() }
func (p providers) GetPods() []*v1.Pod       { return p.h.activePods() }
func (p providers) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	for _, pod := range p.h.activePods() {
		if pod.Namespace == namespace && pod.Name == name {
			return pod, true
		}
	}
	return nil, false
}

func (p providers) UpdateAllocatedDevices(logger klog.Logger) { p.h.dm.UpdateAllocatedDevices(logger) }
func (p providers) GetDevices(podUID, containerName string) []*podresourcesapi.ContainerDevices {
	return containerDevices(p.h.dm.GetDevices(podUID, containerName))
}
func (p providers) GetAllocatableDevices(logger klog.Logger) []*podresourcesapi.ContainerDevices {
	return containerDevices(p.h.dm.GetAllocatableDevices(logger))
}

func (providers) GetCPUs(*v1.Pod, *v1.Container) []int64 { return nil }
func (providers) GetPodCPUs(string) []int64              { return nil }
func (providers) GetAllocatableCPUs() []int64            { return nil }
func (providers) GetMemory(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.ContainerMemory {
	return nil
}
func (providers) GetPodMemory(klog.Logger, string) []*podresourcesapi.ContainerMemory { return nil }
func (providers) GetAllocatableMemory(klog.Logger) []*podresourcesapi.ContainerMemory { return nil }
func (providers) GetDynamicResources(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesapi.DynamicResource {
	return nil
}

// containerDevices lists each device on its own, with its NUMA nodes when the plugin reported them: the
// form in which a kubelet answers PodResources.
func containerDevices(instances devicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	var out []*podresourcesapi.ContainerDevices
	for resource, devices := range instances {
		for id, device := range devices {
			numaNodes := device.GetTopology().GetNodes()
			if len(numaNodes) == 0 {
				out = append(out, &podresourcesapi.ContainerDevices{ResourceName: resource, DeviceIds: []string{id}})
			}
			for _, numa := range numaNodes {
				out = append(out, &podresourcesapi.ContainerDevices{
					ResourceName: resource,
					DeviceIds:    []string{id},
					Topology:     &podresourcesapi.TopologyInfo{Nodes: []*podresourcesapi.NUMANode{{ID: numa.GetID()}}},
				})
			}
		}
	}
	return out
}

// servePodResources serves kubelet's PodResources v1 API on a unix socket until ctx ends.
func servePodResources(ctx context.Context, h *harness, socket string) error {
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	p := providers{h}
	server := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(server, podresources.NewV1PodResourcesServer(ctx,
		podresources.PodResourcesProviders{Pods: p, Devices: p, Cpus: p, Memory: p, DynamicResources: p}))
	go func() { <-ctx.Done(); server.Stop() }()
	go func() { _ = server.Serve(listener) }()
	return nil
}
