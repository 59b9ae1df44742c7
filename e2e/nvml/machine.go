package main

// The node the library presents: go-nvml's mock DGX, corrected where it disagrees with what real
// NVML reports (the table `corrections` below names the source of each correction), with stable
// UUIDs and NVML-style PCI bus ids, and with the MIG layout of the state file created through the
// mock's own MIG API.

import (
	"crypto/sha256"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

const (
	mib = uint64(1) << 20
	gib = uint64(1) << 30
	// Memory the driver holds on an idle GPU: nvmlDeviceGetMemoryInfo().used of the idle H200 in
	// docs/gpu-check/h200-2026-11-28.json. The state file's baselineMiB replaces it.
	defaultBaselineBytes = uint64(644939776)
	notMigSpecific       = uint32(0xFFFFFFFF)
)

// machineSpec: which go-nvml mock, how its GPUs are wired (for the state file's "nvswitch"), and
// the corrections applied to its GPUs.
type machineSpec struct {
	build    func() *server.Server
	links    int // NVLinks per GPU, all to NVSwitches
	switches int
	correct  func(*server.Device)
}

var machines = map[string]machineSpec{
	"dgxa100": {build: dgxa100.New, links: 12, switches: 6, correct: correctA100},
	"dgxh100": {build: dgxh100.New, links: 18, switches: 4},
	"dgxh200": {build: dgxh200.New, links: 18, switches: 4, correct: correctH200},
}

// NVML's GPU-instance profile ids (what nvmlDeviceGetGpuInstanceProfileInfo returns in .id and
// nvmlGpuInstanceGetInfo in .profileId), by NVML_GPU_INSTANCE_PROFILE_* constant. The mock
// answers with the constant itself; real NVML does not (the H200 answered id 19 for constant 0;
// the rest as `nvidia-smi mig -lgip` lists them in NVIDIA's MIG user guide).
var publicProfileID = map[int]uint32{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE:      19,
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: 20,
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: 15,
	nvml.GPU_INSTANCE_PROFILE_2_SLICE:      14,
	nvml.GPU_INSTANCE_PROFILE_3_SLICE:      9,
	nvml.GPU_INSTANCE_PROFILE_4_SLICE:      5,
	nvml.GPU_INSTANCE_PROFILE_7_SLICE:      0,
}

// Compute-instance profile constant by slice count.
var computeProfileBySlices = map[int]int{
	1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE,
	2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
	4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	6: nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE,
	7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
	8: nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE,
}

// correctA100: the mock names its A100-SXM4-40GB "Mock NVIDIA A100-SXM4-40GB"; the product
// reports "NVIDIA A100-SXM4-40GB" (the mock's own A100-SXM4-80GB config has no prefix).
func correctA100(d *server.Device) {
	d.Config.Name = strings.TrimPrefix(d.Config.Name, "Mock ")
}

// correctH200: the measured H200 (driver 580.159.04) reports name "NVIDIA H200", 150754820096
// bytes (143771 MiB) of memory and, for GPU-instance profile 1_SLICE, memorySizeMB 16384,
// isP2pSupported 0 and jpegCount 1. The mock has "NVIDIA H200 141GB HBM3e", 144384 MiB and
// 18432 MiB per 1-slice instance: its profile sizes, set to nominal GB, exceed the fraction of the
// memory each profile owns (its 7g profile is larger than the GPU), so NVIDIA's naming rule gives
// 1g.35gb for its 1g.18gb. The other profiles are set to their documented fraction of memory
// (1/8, 2/8, 4/8, 8/8 as NVIDIA's MIG user guide lists for H200) times the measured 1/8 size.
func correctH200(d *server.Device) {
	d.Config.Name = "NVIDIA H200"
	d.Config.MemoryMB = 150754820096 / mib
	d.MemoryInfo.Total = 150754820096
	const eighth = 16384
	eighths := map[int]uint64{
		nvml.GPU_INSTANCE_PROFILE_1_SLICE:      1,
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: 1,
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: 2,
		nvml.GPU_INSTANCE_PROFILE_2_SLICE:      2,
		nvml.GPU_INSTANCE_PROFILE_3_SLICE:      4,
		nvml.GPU_INSTANCE_PROFILE_4_SLICE:      4,
		nvml.GPU_INSTANCE_PROFILE_7_SLICE:      8,
	}
	profiles := map[int]nvml.GpuInstanceProfileInfo{}
	for constant, info := range d.Config.MIGProfiles.GpuInstanceProfiles {
		if n, ok := eighths[constant]; ok {
			info.MemorySizeMB = n * eighth
		}
		if constant == nvml.GPU_INSTANCE_PROFILE_1_SLICE {
			info.IsP2pSupported, info.JpegCount = 0, 1
		}
		profiles[constant] = info
	}
	d.Config.MIGProfiles.GpuInstanceProfiles = profiles // a copy: the mock shares its map between GPUs
}

type machine struct {
	name     string
	server   *server.Server
	spec     machineSpec
	gpus     []*gpu
	byUUID   map[string]any // *gpu or *migDevice
	switches []string       // NVSwitch PCI bus ids
}

type gpu struct {
	m       *machine
	index   int
	dev     *server.Device
	uuid    string
	bus     uint32
	handle  unsafe.Pointer
	migMode int
	gis     []*gpuInstance // in creation order
	migs    []*migDevice   // MIG device index order
	used    []uint64       // occupied memory slices (bit per slice), for placements
}

type gpuInstance struct {
	parent   *gpu
	mock     *server.GpuInstance
	constant int // NVML_GPU_INSTANCE_PROFILE_*
	info     nvml.GpuInstanceProfileInfo
	handle   unsafe.Pointer
}

type migDevice struct {
	parent  *gpu
	gi      *gpuInstance
	ci      *server.ComputeInstance
	ciInfo  nvml.ComputeInstanceProfileInfo
	index   int
	uuid    string
	profile string // canonical name, e.g. "1c.2g.10gb"
	handle  unsafe.Pointer
}

func (g *gpu) name() string        { n, _ := g.dev.GetName(); return n }
func (g *gpu) totalBytes() uint64  { mem, _ := g.dev.GetMemoryInfo(); return mem.Total }
func (g *gpu) busID() string       { return fmt.Sprintf("%08X:%02X:%02X.0", 0, g.bus, 0) }
func (g *gpu) legacyBusID() string { return fmt.Sprintf("%04X:%02X:%02X.0", 0, g.bus, 0) }
func (gi *gpuInstance) id() uint32 { return gi.mock.Info.Id }
func (d *migDevice) giID() uint32  { return d.gi.id() }
func (d *migDevice) ciID() uint32  { return d.ci.Info.Id }

// stableUUID formats sha256(seed) as a UUID: the same machine gives the same UUIDs in every process.
func stableUUID(prefix, seed string) string {
	h := sha256.Sum256([]byte("gpuslice-nvml-mock/" + seed))
	x := fmt.Sprintf("%x", h[:16])
	return fmt.Sprintf("%s-%s-%s-%s-%s-%s", prefix, x[0:8], x[8:12], x[12:16], x[16:20], x[20:32])
}

// profileName is NVIDIA's canonical MIG profile name (go-nvlib's rule, which `nvidia-smi mig
// -lgip` also prints): memory in eighths of the GPU rounded up, times the GPU's GiB rounded up,
// rounded half away from zero.
func profileName(giSlices, ciSlices int, memoryMiB, totalBytes uint64, suffix string) string {
	eighths := math.Ceil(float64(memoryMiB*mib) / float64(totalBytes) * 8)
	gb := math.Round(eighths / 8 * float64((totalBytes+gib-1)/gib))
	if ciSlices == giSlices {
		return fmt.Sprintf("%dg.%dgb%s", giSlices, int(gb), suffix)
	}
	return fmt.Sprintf("%dc.%dg.%dgb%s", ciSlices, giSlices, int(gb), suffix)
}

func profileSuffix(constant int) string {
	switch constant {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		return "+me"
	}
	return ""
}

// gpuInstanceProfile: the corrected profile info of `constant`, as real NVML reports it (its id
// the public profile id), and the name NVML gives it ("MIG 1g.18gb").
func (g *gpu) gpuInstanceProfile(constant int) (nvml.GpuInstanceProfileInfo, string, nvml.Return) {
	info, ret := g.dev.GetGpuInstanceProfileInfo(constant)
	if ret != nvml.SUCCESS {
		return info, "", ret
	}
	slices := int(info.SliceCount)
	name := "MIG " + profileName(slices, slices, info.MemorySizeMB, g.totalBytes(), profileSuffix(constant))
	if id, ok := publicProfileID[constant]; ok {
		info.Id = id
	}
	return info, name, nvml.SUCCESS
}

func newMachine(name string, layout map[string][]string) (*machine, error) {
	spec, ok := machines[name]
	if !ok {
		known := make([]string, 0, len(machines))
		for k := range machines {
			known = append(known, k)
		}
		sort.Strings(known)
		return nil, fmt.Errorf("unknown machine %q (known: %s, none)", name, strings.Join(known, ", "))
	}
	m := &machine{name: name, server: spec.build(), spec: spec, byUUID: map[string]any{}}
	for s := 0; s < spec.switches; s++ {
		m.switches = append(m.switches, fmt.Sprintf("%08X:%02X:00.0", 0, 0xC0+s))
	}
	for i, d := range m.server.Devices {
		dev := d.(*server.Device)
		if spec.correct != nil {
			spec.correct(dev)
		}
		// The mock draws random UUIDs (uuid.New) in every process; real UUIDs are stable.
		dev.UUID = stableUUID("GPU", fmt.Sprintf("%s/%d", name, i))
		g := &gpu{m: m, index: i, dev: dev, uuid: dev.UUID, bus: uint32(i)}
		m.gpus = append(m.gpus, g)
		m.byUUID[g.uuid] = g
	}
	for key, profiles := range layout {
		index, err := strconv.Atoi(key)
		if err != nil || index < 0 || index >= len(m.gpus) {
			return nil, fmt.Errorf("mig: %q is not a GPU index of %s (0-%d)", key, name, len(m.gpus)-1)
		}
		if err := m.gpus[index].createMig(profiles); err != nil {
			return nil, fmt.Errorf("mig: GPU %d: %w", index, err)
		}
	}
	return m, nil
}

// createMig turns MIG mode on and creates one GPU instance with one compute instance per entry
// ("3g.20gb", "1c.2g.10gb", "1g.5gb+me"), through the mock's MIG API, at the first free placement
// the mock lists for the profile.
func (g *gpu) createMig(profiles []string) error {
	if ret, _ := g.dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		return fmt.Errorf("SetMigMode: %v", ret)
	}
	g.migMode = nvml.DEVICE_MIG_ENABLE
	for _, want := range profiles {
		giName, ciSlices := want, 0
		if c, rest, ok := strings.Cut(want, "c."); ok && !strings.Contains(c, ".") {
			n, err := strconv.Atoi(c)
			if err != nil {
				return fmt.Errorf("bad profile %q", want)
			}
			giName, ciSlices = rest, n
		}
		constant, info, err := g.findProfile(giName)
		if err != nil {
			return err
		}
		if ciSlices == 0 {
			ciSlices = int(info.SliceCount)
		}
		placement, err := g.place(&info)
		if err != nil {
			return fmt.Errorf("%s: %w", want, err)
		}
		created, ret := g.dev.CreateGpuInstanceWithPlacement(&info, &placement)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("CreateGpuInstanceWithPlacement(%s): %v", want, ret)
		}
		gi := &gpuInstance{parent: g, mock: created.(*server.GpuInstance), constant: constant, info: info}
		ciConstant, ok := computeProfileBySlices[ciSlices]
		if !ok {
			return fmt.Errorf("%s: no compute-instance profile of %d slices", want, ciSlices)
		}
		ciInfo, ret := gi.mock.GetComputeInstanceProfileInfo(ciConstant, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("%s: the mock has no %d-slice compute instance in a %s: %v", want, ciSlices, giName, ret)
		}
		ci, ret := gi.mock.CreateComputeInstance(&ciInfo)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("CreateComputeInstance(%s): %v", want, ret)
		}
		g.gis = append(g.gis, gi)
		d := &migDevice{parent: g, gi: gi, ci: ci.(*server.ComputeInstance), ciInfo: ciInfo, index: len(g.migs)}
		d.profile = profileName(int(info.SliceCount), ciSlices, info.MemorySizeMB, g.totalBytes(), profileSuffix(constant))
		d.uuid = stableUUID("MIG", fmt.Sprintf("%s/%d/%d", g.uuid, d.giID(), d.ciID()))
		g.migs = append(g.migs, d)
		g.m.byUUID[d.uuid] = d
	}
	return nil
}

// findProfile: the mock's GPU-instance profile (mock-internal id) whose NVIDIA name is `name`.
func (g *gpu) findProfile(name string) (int, nvml.GpuInstanceProfileInfo, error) {
	var names []string
	for constant := 0; constant < nvml.GPU_INSTANCE_PROFILE_COUNT; constant++ {
		info, ret := g.dev.GetGpuInstanceProfileInfo(constant)
		if ret != nvml.SUCCESS {
			continue
		}
		slices := int(info.SliceCount)
		candidate := profileName(slices, slices, info.MemorySizeMB, g.totalBytes(), profileSuffix(constant))
		if candidate == name {
			return constant, info, nil
		}
		names = append(names, candidate)
	}
	return 0, nvml.GpuInstanceProfileInfo{}, fmt.Errorf("no GPU-instance profile %q on %s (it has %s)", name, g.name(), strings.Join(names, ", "))
}

// place picks the first placement the mock lists for the profile that overlaps no instance yet.
func (g *gpu) place(info *nvml.GpuInstanceProfileInfo) (nvml.GpuInstancePlacement, error) {
	placements, _ := g.dev.GetGpuInstancePossiblePlacements(info)
	var taken uint64
	for _, bits := range g.used {
		taken |= bits
	}
	for _, p := range placements {
		bits := (uint64(1)<<p.Size - 1) << p.Start
		if taken&bits == 0 {
			g.used = append(g.used, bits)
			return p, nil
		}
	}
	return nvml.GpuInstancePlacement{}, fmt.Errorf("no free placement (NVML_ERROR_INSUFFICIENT_RESOURCES)")
}
