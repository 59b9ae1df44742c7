// Package dracost measures what the scheduler's DRA allocator pays for one device selector, per
// device and per evaluation, with the CEL library the scheduler itself runs
// (k8s.io/dynamic-resource-allocation/cel, as the allocator calls it from selectorsMatch). Each
// evaluation first copies every attribute of the device into maps (DeviceMatches), so the cost
// grows with the attributes a device carries, whatever the expression reads.
//
//	go test -C e2e/k8s ./dracost -bench . -benchmem
package dracost

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"
)

const driver = "gpu.gpuslice.io"

// The DeviceClass selector of charts/gpuslice (gpu.gpuslice.io) and a share's class selector.
const (
	classSelector  = `device.driver == "gpu.gpuslice.io" && device.attributes["gpu.gpuslice.io"].type == "gpu"`
	memorySelector = `device.attributes["gpu.gpuslice.io"].memoryMiB in [81559]`
)

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
func num(i int64) resourceapi.DeviceAttribute  { return resourceapi.DeviceAttribute{IntValue: &i} }

// gpuDevice is a GPU as dra/slices.py publishes it (the attributes a trace node's GPU gets), or
// with only the attributes gpuslice's own claims read (type, uuid, memoryMiB) when lean.
func gpuDevice(lean bool) cel.Device {
	attributes := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"type":      str("gpu"),
		"uuid":      str("GPU-6c1b3e0e-8a57-4b5c-9b0e-5a1f0e2d9c11"),
		"memoryMiB": num(81559),
	}
	if !lean {
		attributes["product"] = str("NVIDIA-H100-80GB-HBM3")
		attributes["productName"] = str("NVIDIA H100 80GB HBM3")
		attributes["index"] = num(3)
		attributes["nvlinkPeers"] = num(7)
		attributes["nvlinkDomain"] = str("GPU-0f3c2a41-1d2e-4f5a-8b6c-7d8e9fa0b1c2")
		attributes["minor"] = num(3)
		attributes["pciBusID"] = str("00000000:1B:00.0")
		attributes["numaNode"] = num(0)
	}
	return cel.Device{
		Driver:                   driver,
		AllowMultipleAllocations: ptr.To(true),
		Attributes:               attributes,
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory": {Value: resource.MustParse("81559Mi")},
		},
	}
}

func benchmark(b *testing.B, expression string, lean bool) {
	cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})
	program := cache.GetOrCompile(expression)
	if program.Error != nil {
		b.Fatal(program.Error)
	}
	device := gpuDevice(lean)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		matches, _, err := program.DeviceMatches(ctx, device)
		if err != nil || !matches {
			b.Fatalf("matches=%v err=%v", matches, err)
		}
	}
}

func BenchmarkClassSelectorPublishedDevice(b *testing.B)  { benchmark(b, classSelector, false) }
func BenchmarkClassSelectorLeanDevice(b *testing.B)       { benchmark(b, classSelector, true) }
func BenchmarkMemorySelectorPublishedDevice(b *testing.B) { benchmark(b, memorySelector, false) }
func BenchmarkMemorySelectorLeanDevice(b *testing.B)      { benchmark(b, memorySelector, true) }
