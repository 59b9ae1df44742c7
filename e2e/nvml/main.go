// Command nvml is built (`go build -buildmode=c-shared`, by build.sh) into libnvidia-ml.so.1: a
// loadable NVML for gpuslice's tests, so that nvidia-ml-py's real ctypes path (pynvml) runs
// against answers our Python code did not write.
//
// # What answers
//
// The GPUs are go-nvml's mock DGX servers (module github.com/NVIDIA/go-nvml v0.13.4-1, package
// pkg/nvml/mock), chosen by $GPUSLICE_NVML_MOCK_MACHINE:
//
//	dgxa100  8 x A100-SXM4-40GB (the default)
//	dgxh100  8 x H100 80GB HBM3
//	dgxh200  8 x H200 (141 GB)
//	none     no driver: nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED
//
// (v0.13.4-1 also has dgxb200; it is left out because its 1-slice profile, 23552 MiB, is more
// than an eighth of the GPU, so NVIDIA's naming rule calls its "1g.23gb" 1g.45gb, and there is no
// measurement to correct it with.)
//
// Where the mock and real NVML differ, the library answers as real NVML does; the sources rank
// real measurement (docs/gpu-check/h200-2026-11-28.json, an H200 on driver 580.159.04) above
// NVIDIA's header and documentation (nvml.h) above the mock. Corrections: stable UUIDs (the mock
// draws random ones per process); PCI bus ids as NVML formats them ("00000000:03:00.0"; the mock
// has "0000:03:00.0" and fills no busId at all); unknown UUID -> NVML_ERROR_NOT_FOUND (mock:
// INVALID_ARGUMENT); GPU-instance profile ids as NVML numbers them (1g = 19, ...; the mock uses
// the NVML_GPU_INSTANCE_PROFILE_* constant) and profile names ("MIG 1g.18gb"; the mock has none);
// the A100's and the H200's names and the H200's memory and MIG profile sizes (machine.go,
// correctA100, correctH200). What the mock lacks (processes, utilisation, events, NVLink, MIG
// device handles, NUMA) follows the measurement or, where none was made, nvml.h's documentation:
//
//   - NUMA node: NVML_ERROR_NOT_SUPPORTED (as in the measured VM).
//   - NVLink: NOT_SUPPORTED on every link (as measured) unless the state file says "nvswitch":
//     then each GPU has 12 (A100) or 18 (H100, H200) active links to NVSwitches, and a link number
//     past them is INVALID_ARGUMENT.
//   - Memory: used = a baseline the driver holds (default 644939776 bytes, the idle H200's) + the
//     listed processes' memory; free = total - used. nvmlDeviceGetMemoryInfo_v2 reports the
//     baseline as `reserved` and only the processes as `used`. A MIG-enabled GPU counts the
//     processes of its MIG devices too; a MIG device's total is its profile's memory, baseline 0.
//   - Process lists: empty when idle. A MIG-enabled GPU lists its MIG devices' processes with
//     their GPU/compute instance ids; a GPU not in MIG mode gives 0xFFFFFFFF for both.
//   - Utilisation (nvmlDeviceGetUtilizationRates, nvmlDeviceGetProcessUtilization):
//     NOT_SUPPORTED on MIG devices and on MIG-enabled GPUs (nvml.h). Process samples carry the
//     state file's modification time (µs) and are returned only when newer than the caller's
//     lastSeenTimeStamp; none -> NVML_ERROR_NOT_FOUND (as measured).
//   - MIG mode off: nvmlDeviceGetMigMode -> [0, 0], nvmlDeviceGetMaxMigDeviceCount -> 0,
//     nvmlDeviceGetMigDeviceHandleByIndex -> NOT_FOUND, profile info still answered (all as
//     measured; nvml.h says NOT_SUPPORTED for the last).
//   - Events: nvmlDeviceGetSupportedEventTypes -> 0xFF9F (measured); nvmlEventSetWait_v2 delivers
//     the state file's XIDs written after the event set was created, else waits out its timeout
//     and returns NVML_ERROR_TIMEOUT.
//   - A lost GPU (state "lost"): every query on it or its MIG devices, nvmlDeviceGetHandleByIndex
//     of it, and nvmlDeviceGetHandleByUUID of ANY device return NVML_ERROR_GPU_IS_LOST, as nvml.h
//     words it ("if any GPU has fallen off the bus"); nvmlEventSetWait_v2 on an event set with a
//     lost GPU registered returns GPU_IS_LOST once no event is pending. Not measured.
//
// # The state file
//
// $GPUSLICE_NVML_MOCK_STATE names a JSON file, read again on every query that depends on it (so
// a test rewrites it, atomically: write a temporary file and rename it). Absent file: all idle.
// Unknown keys are an error (the query returns NVML_ERROR_UNKNOWN and says why on stderr).
//
//	{
//	  "mig": {"0": ["3g.20gb", "2g.10gb", "1c.2g.10gb", "1g.5gb+me"], "1": []},
//	  "baselineMiB": 615,
//	  "processes": {"<GPU or MIG UUID>": [{"pid": 123, "usedMiB": 1024, "kind": "compute", "smUtil": 40}]},
//	  "utilization": {"<GPU UUID>": {"gpu": 50, "memory": 10}},
//	  "lost": ["<GPU UUID>"],
//	  "xids": [{"uuid": "<GPU or MIG UUID>", "xid": 79}],
//	  "nvswitch": true
//	}
//
// "mig" (GPU index -> profiles, read once, at the first nvmlInit) turns MIG mode on and creates
// one GPU instance with one compute instance per profile through the mock's MIG API, at the first
// free placement the mock lists; names are NVIDIA's ("<C>c." picks a smaller compute instance).
// "usedMiB" null or absent: NVML_VALUE_NOT_AVAILABLE. "kind": compute (default), graphics, mps,
// or several joined by "+". "xids" is append-only: each event set delivers the entries added after
// it was created, to the GPU registered for XID events (a MIG UUID sets the event's instance ids).
//
// UUIDs are sha256-derived from the machine and GPU index (and GPU/compute instance ids), the
// same in every process: GPU-<...> and MIG-<...>.
//
// # Exported NVML functions
//
// Defined in nvml_abi.c against NVIDIA's nvml.h (nvidia-nvml-dev, which build.sh fetches into
// include/ of a temporary copy of this module), so the compiler checks every signature; a version
// script exports exactly these:
//
//	nvmlInit_v2 nvmlInitWithFlags nvmlShutdown nvmlErrorString
//	nvmlSystemGetDriverVersion nvmlSystemGetNVMLVersion nvmlSystemGetCudaDriverVersion(_v2)
//	nvmlDeviceGetCount_v2 nvmlDeviceGetHandleByIndex_v2 nvmlDeviceGetHandleByUUID
//	nvmlDeviceGetHandleByPciBusId_v2 nvmlDeviceGetUUID nvmlDeviceGetName nvmlDeviceGetIndex
//	nvmlDeviceGetMinorNumber nvmlDeviceGetPciInfo_v3 nvmlDeviceGetMemoryInfo(_v2)
//	nvmlDeviceGetUtilizationRates nvmlDeviceGetNumaNodeId nvmlDeviceGetComputeMode
//	nvmlDeviceGetMigMode nvmlDeviceGetMaxMigDeviceCount nvmlDeviceGetMigDeviceHandleByIndex
//	nvmlDeviceIsMigDeviceHandle nvmlDeviceGetDeviceHandleFromMigDeviceHandle
//	nvmlDeviceGetGpuInstanceId nvmlDeviceGetComputeInstanceId nvmlDeviceGetAttributes_v2
//	nvmlDeviceGetGpuInstanceById nvmlGpuInstanceGetInfo nvmlDeviceGetGpuInstanceProfileInfo(V)
//	nvmlDeviceGetNvLinkState nvmlDeviceGetNvLinkRemotePciInfo_v2
//	nvmlEventSetCreate nvmlDeviceGetSupportedEventTypes nvmlDeviceRegisterEvents
//	nvmlEventSetWait_v2 nvmlEventSetFree
//	nvmlDeviceGet{Compute,Graphics,MPSCompute}RunningProcesses_v3 nvmlDeviceGetProcessUtilization
//
// Any other symbol is absent, so pynvml raises NVMLError_FunctionNotFound. (go-nvml's own cgo
// bindings, linked in with the mock, reference every NVML function; build.sh binds those
// references to a local stub that is never exported.)
package main

/*
#cgo CFLAGS: -I${SRCDIR}/include -Wno-deprecated-declarations
#include <stdlib.h>
#include <nvml.h>
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

const (
	success          = C.NVML_SUCCESS
	errUninitialized = C.NVML_ERROR_UNINITIALIZED
	errInvalid       = C.NVML_ERROR_INVALID_ARGUMENT
	errNotSupported  = C.NVML_ERROR_NOT_SUPPORTED
	errNotFound      = C.NVML_ERROR_NOT_FOUND
	errSize          = C.NVML_ERROR_INSUFFICIENT_SIZE
	errNoDriver      = C.NVML_ERROR_DRIVER_NOT_LOADED
	errTimeout       = C.NVML_ERROR_TIMEOUT
	errLost          = C.NVML_ERROR_GPU_IS_LOST
	errVersion       = C.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
	errUnknown       = C.NVML_ERROR_UNKNOWN

	// nvmlDeviceGetSupportedEventTypes of the measured H200.
	supportedEvents = uint64(0xFF9F)
	xidEvent        = uint64(C.nvmlEventTypeXidCriticalError)
	notAvailable    = ^C.ulonglong(0) // NVML_VALUE_NOT_AVAILABLE as an unsigned long long
)

var (
	mu      sync.Mutex // guards everything below; NVML is thread-safe, so is this
	refs    int        // nvmlInit count minus nvmlShutdown count
	node    *machine
	objects = map[unsafe.Pointer]any{} // handle (C memory) -> *gpu, *migDevice, *gpuInstance, *eventSet
)

type eventSet struct {
	handle     unsafe.Pointer
	registered map[*gpu]uint64 // event mask per GPU
	next       int             // index of the next state-file XID to look at
}

func main() {}

func complain(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "gpuslice-nvml-mock: "+format+"\n", args...)
}

// newHandle: a C allocation stands for each object, so pynvml gets a real, stable pointer
// (gpuslice keys devices by the handle's address).
func newHandle(object any) unsafe.Pointer {
	p := C.calloc(1, 16)
	objects[p] = object
	return p
}

func devicePtr(h unsafe.Pointer) C.nvmlDevice_t { return C.nvmlDevice_t(h) }

func ready() C.nvmlReturn_t {
	if refs == 0 {
		return errUninitialized
	}
	return success
}

func currentState() (*state, C.nvmlReturn_t) {
	s, err := readState()
	if err != nil {
		complain("state file: %v", err)
		return nil, errUnknown
	}
	return s, success
}

// device resolves a device handle to its GPU (and MIG device), with the state file read and a
// lost GPU answered as NVML does.
func device(h C.nvmlDevice_t) (*gpu, *migDevice, *state, C.nvmlReturn_t) {
	if ret := ready(); ret != success {
		return nil, nil, nil, ret
	}
	var g *gpu
	var d *migDevice
	switch o := objects[unsafe.Pointer(h)].(type) {
	case *gpu:
		g = o
	case *migDevice:
		g, d = o.parent, o
	default:
		return nil, nil, nil, errInvalid
	}
	s, ret := currentState()
	if ret != success {
		return nil, nil, nil, ret
	}
	if s.lost(g.uuid) {
		return nil, nil, nil, errLost
	}
	return g, d, s, success
}

func fullGPU(h C.nvmlDevice_t) (*gpu, *state, C.nvmlReturn_t) {
	g, d, s, ret := device(h)
	if ret == success && d != nil {
		return nil, nil, errInvalid
	}
	return g, s, ret
}

func putString(buf *C.char, length C.uint, s string) C.nvmlReturn_t {
	if buf == nil {
		return errInvalid
	}
	if uint(len(s))+1 > uint(length) {
		return errSize
	}
	out := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(length))
	copy(out, s)
	out[len(s)] = 0
	return success
}

func setChars(dst []C.char, s string) {
	for i := range dst {
		dst[i] = 0
	}
	for i := 0; i < len(s) && i < len(dst)-1; i++ {
		dst[i] = C.char(s[i])
	}
}

// --- lifecycle and system ---------------------------------------------------------------------

//export mockInit
func mockInit(flags C.uint) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if node == nil {
		name := os.Getenv("GPUSLICE_NVML_MOCK_MACHINE")
		if name == "" {
			name = "dgxa100"
		}
		if name == "none" {
			return errNoDriver
		}
		s, ret := currentState()
		if ret != success {
			return ret
		}
		m, err := newMachine(name, s.MIG)
		if err != nil {
			complain("%v", err)
			return errUnknown
		}
		for _, g := range m.gpus {
			g.handle = newHandle(g)
			for _, gi := range g.gis {
				gi.handle = newHandle(gi)
			}
			for _, d := range g.migs {
				d.handle = newHandle(d)
			}
		}
		node = m
	}
	refs++
	return success
}

//export mockShutdown
func mockShutdown() C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if refs == 0 {
		return errUninitialized
	}
	refs--
	return success
}

//export mockSystemGetDriverVersion
func mockSystemGetDriverVersion(buf *C.char, length C.uint) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if ret := ready(); ret != success {
		return ret
	}
	version, _ := node.server.SystemGetDriverVersion()
	return putString(buf, length, version)
}

//export mockSystemGetNVMLVersion
func mockSystemGetNVMLVersion(buf *C.char, length C.uint) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if ret := ready(); ret != success {
		return ret
	}
	version, _ := node.server.SystemGetNVMLVersion()
	return putString(buf, length, version)
}

//export mockSystemGetCudaDriverVersion
func mockSystemGetCudaDriverVersion(version *C.int) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if ret := ready(); ret != success {
		return ret
	}
	if version == nil {
		return errInvalid
	}
	v, _ := node.server.SystemGetCudaDriverVersion()
	*version = C.int(v)
	return success
}

// --- enumeration ------------------------------------------------------------------------------

//export mockDeviceGetCount
func mockDeviceGetCount(count *C.uint) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if ret := ready(); ret != success {
		return ret
	}
	if count == nil {
		return errInvalid
	}
	n, _ := node.server.DeviceGetCount()
	*count = C.uint(n)
	return success
}

//export mockDeviceGetHandleByIndex
func mockDeviceGetHandleByIndex(index C.uint, out *C.nvmlDevice_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if ret := ready(); ret != success {
		return ret
	}
	if out == nil || int(index) >= len(node.gpus) {
		return errInvalid
	}
	s, ret := currentState()
	if ret != success {
		return ret
	}
	g := node.gpus[index]
	if s.lost(g.uuid) {
		return errLost
	}
	*out = devicePtr(g.handle)
	return success
}

//export mockDeviceGetHandleByUUID
func mockDeviceGetHandleByUUID(uuid *C.char, out *C.nvmlDevice_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if ret := ready(); ret != success {
		return ret
	}
	if uuid == nil || out == nil {
		return errInvalid
	}
	s, ret := currentState()
	if ret != success {
		return ret
	}
	if len(s.Lost) > 0 { // nvml.h: GPU_IS_LOST "if any GPU has fallen off the bus"
		for _, g := range node.gpus {
			if s.lost(g.uuid) {
				return errLost
			}
		}
	}
	switch o := node.byUUID[C.GoString(uuid)].(type) {
	case *gpu:
		*out = devicePtr(o.handle)
	case *migDevice:
		*out = devicePtr(o.handle)
	default:
		return errNotFound
	}
	return success
}

//export mockDeviceGetHandleByPciBusId
func mockDeviceGetHandleByPciBusId(busID *C.char, out *C.nvmlDevice_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if ret := ready(); ret != success {
		return ret
	}
	if busID == nil || out == nil {
		return errInvalid
	}
	want := C.GoString(busID)
	for _, g := range node.gpus {
		var domain, bus, dev, fn uint32
		if _, err := fmt.Sscanf(want, "%x:%x:%x.%x", &domain, &bus, &dev, &fn); err == nil &&
			domain == 0 && bus == g.bus && dev == 0 && fn == 0 {
			*out = devicePtr(g.handle)
			return success
		}
	}
	return errNotFound
}

// --- identity ---------------------------------------------------------------------------------

//export mockDeviceGetUUID
func mockDeviceGetUUID(h C.nvmlDevice_t, buf *C.char, length C.uint) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	g, d, _, ret := device(h)
	if ret != success {
		return ret
	}
	if d != nil {
		return putString(buf, length, d.uuid)
	}
	uuid, _ := g.dev.GetUUID()
	return putString(buf, length, uuid)
}

//export mockDeviceGetName
func mockDeviceGetName(h C.nvmlDevice_t, buf *C.char, length C.uint) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	g, d, _, ret := device(h)
	if ret != success {
		return ret
	}
	if d != nil {
		return putString(buf, length, g.name()+" MIG "+d.profile)
	}
	return putString(buf, length, g.name())
}

//export mockDeviceGetIndex
func mockDeviceGetIndex(h C.nvmlDevice_t, index *C.uint) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	g, d, _, ret := device(h)
	if ret != success {
		return ret
	}
	if index == nil {
		return errInvalid
	}
	if d != nil { // nvml.h: a MIG device's index is its index for nvmlDeviceGetMigDeviceHandleByIndex
		*index = C.uint(d.index)
		return success
	}
	i, _ := g.dev.GetIndex()
	*index = C.uint(i)
	return success
}

//export mockDeviceGetMinorNumber
func mockDeviceGetMinorNumber(h C.nvmlDevice_t, minor *C.uint) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	g, d, _, ret := device(h)
	if ret != success {
		return ret
	}
	if minor == nil {
		return errInvalid
	}
	if d != nil {
		return errNotSupported
	}
	n, _ := g.dev.GetMinorNumber()
	*minor = C.uint(n)
	return success
}

func fillPci(pci *C.nvmlPciInfo_t, bus uint32, legacy, busID string, deviceID uint32) {
	setChars(pci.busIdLegacy[:], legacy)
	pci.domain, pci.bus, pci.device = 0, C.uint(bus), 0
	pci.pciDeviceId, pci.pciSubSystemId = C.uint(deviceID), 0
	setChars(pci.busId[:], busID)
}

//export mockDeviceGetPciInfo
func mockDeviceGetPciInfo(h C.nvmlDevice_t, pci *C.nvmlPciInfo_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	g, _, _, ret := device(h)
	if ret != success {
		return ret
	}
	if pci == nil {
		return errInvalid
	}
	info, _ := g.dev.GetPciInfo() // the mock fills only pciDeviceId
	fillPci(pci, g.bus, g.legacyBusID(), g.busID(), info.PciDeviceId)
	return success
}

//export mockDeviceGetNumaNodeId
func mockDeviceGetNumaNodeId(h C.nvmlDevice_t, numa *C.uint) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if _, _, _, ret := device(h); ret != success {
		return ret
	}
	return errNotSupported // as the measured H200 (a VM) answered
}

//export mockDeviceGetComputeMode
func mockDeviceGetComputeMode(h C.nvmlDevice_t, mode *C.nvmlComputeMode_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if _, _, _, ret := device(h); ret != success {
		return ret
	}
	if mode == nil {
		return errInvalid
	}
	*mode = C.NVML_COMPUTEMODE_DEFAULT
	return success
}

// --- memory, utilisation, processes -----------------------------------------------------------

// processes on a device: its own, and for a MIG-enabled GPU those of its MIG devices.
type listed struct {
	spec   processSpec
	gi, ci uint32
}

func processesOf(g *gpu, d *migDevice, s *state) []listed {
	var out []listed
	if d != nil {
		for _, p := range s.Processes[d.uuid] {
			out = append(out, listed{p, d.giID(), d.ciID()})
		}
		return out
	}
	for _, p := range s.Processes[g.uuid] {
		out = append(out, listed{p, notMigSpecific, notMigSpecific})
	}
	if g.migMode == nvml.DEVICE_MIG_ENABLE {
		for _, m := range g.migs {
			for _, p := range s.Processes[m.uuid] {
				out = append(out, listed{p, m.giID(), m.ciID()})
			}
		}
	}
	return out
}

// memory: (total, reserved, allocated) bytes.
func memory(g *gpu, d *migDevice, s *state) (uint64, uint64, uint64) {
	var allocated uint64
	for _, p := range processesOf(g, d, s) {
		if p.spec.UsedMiB != nil {
			allocated += *p.spec.UsedMiB * mib
		}
	}
	if d != nil {
		return d.gi.info.MemorySizeMB * mib, 0, allocated
	}
	mem, _ := g.dev.GetMemoryInfo() // the mock's total (corrected); it keeps used = free = 0
	return mem.Total, s.baselineBytes(), allocated
}

func minus(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

//export mockDeviceGetMemoryInfo
func mockDeviceGetMemoryInfo(h C.nvmlDevice_t, out *C.nvmlMemory_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	g, d, s, ret := device(h)
	if ret != success {
		return ret
	}
	if out == nil {
		return errInvalid
	}
	total, reserved, allocated := memory(g, d, s)
	out.total, out.used = C.ulonglong(total), C.ulonglong(reserved+allocated)
	out.free = C.ulonglong(minus(total, reserved+allocated))
	return success
}

//export mockDeviceGetMemoryInfoV2
func mockDeviceGetMemoryInfoV2(h C.nvmlDevice_t, out *C.nvmlMemory_v2_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	g, d, s, ret := device(h)
	if ret != success {
		return ret
	}
	if out == nil {
		return errInvalid
	}
	if out.version != C.nvmlMemory_v2 {
		return errVersion
	}
	total, reserved, allocated := memory(g, d, s)
	out.total, out.reserved, out.used = C.ulonglong(total), C.ulonglong(reserved), C.ulonglong(allocated)
	out.free = C.ulonglong(minus(total, reserved+allocated))
	return success
}

//export mockDeviceGetUtilizationRates
func mockDeviceGetUtilizationRates(h C.nvmlDevice_t, out *C.nvmlUtilization_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	g, d, s, ret := device(h)
	if ret != success {
		return ret
	}
	if out == nil {
		return errInvalid
	}
	if d != nil || g.migMode == nvml.DEVICE_MIG_ENABLE { // nvml.h: not on MIG-enabled GPUs
		return errNotSupported
	}
	u := s.Utilization[g.uuid]
	out.gpu, out.memory = C.uint(u.GPU), C.uint(u.Memory)
	return success
}

// kind: 0 compute, 1 graphics, 2 MPS compute.
//
//export mockDeviceGetRunningProcesses
func mockDeviceGetRunningProcesses(h C.nvmlDevice_t, kind C.int, count *C.uint, infos *C.nvmlProcessInfo_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	g, d, s, ret := device(h)
	if ret != success {
		return ret
	}
	if count == nil {
		return errInvalid
	}
	name := [...]string{"compute", "graphics", "mps"}[kind]
	var chosen []listed
	for _, p := range processesOf(g, d, s) {
		if p.spec.is(name) {
			chosen = append(chosen, p)
		}
	}
	if len(chosen) == 0 {
		*count = 0
		return success
	}
	if infos == nil || int(*count) < len(chosen) {
		*count = C.uint(len(chosen))
		return errSize
	}
	out := unsafe.Slice(infos, len(chosen))
	for i, p := range chosen {
		out[i].pid = C.uint(p.spec.PID)
		out[i].usedGpuMemory = notAvailable
		if p.spec.UsedMiB != nil {
			out[i].usedGpuMemory = C.ulonglong(*p.spec.UsedMiB * mib)
		}
		out[i].gpuInstanceId, out[i].computeInstanceId = C.uint(p.gi), C.uint(p.ci)
	}
	*count = C.uint(len(chosen))
	return success
}

//export mockDeviceGetProcessUtilization
func mockDeviceGetProcessUtilization(h C.nvmlDevice_t, samples *C.nvmlProcessUtilizationSample_t, count *C.uint, lastSeen C.ulonglong) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	g, d, s, ret := device(h)
	if ret != success {
		return ret
	}
	if count == nil {
		return errInvalid
	}
	if d != nil || g.migMode == nvml.DEVICE_MIG_ENABLE { // nvml.h: not on MIG-enabled GPUs
		return errNotSupported
	}
	var chosen []processSpec
	seen := map[uint32]bool{}
	if s.stampUs > uint64(lastSeen) {
		for _, p := range s.Processes[g.uuid] {
			if p.SMUtil != nil && !seen[p.PID] {
				seen[p.PID] = true
				chosen = append(chosen, p)
			}
		}
	}
	if len(chosen) == 0 {
		return errNotFound
	}
	if samples == nil || int(*count) < len(chosen) {
		*count = C.uint(len(chosen))
		return errSize
	}
	out := unsafe.Slice(samples, len(chosen))
	for i, p := range chosen {
		out[i] = C.nvmlProcessUtilizationSample_t{pid: C.uint(p.PID), timeStamp: C.ulonglong(s.stampUs), smUtil: C.uint(*p.SMUtil)}
	}
	*count = C.uint(len(chosen))
	return success
}

// --- MIG --------------------------------------------------------------------------------------

//export mockDeviceGetMigMode
func mockDeviceGetMigMode(h C.nvmlDevice_t, current, pending *C.uint) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	g, _, ret := fullGPU(h)
	if ret != success {
		return ret
	}
	if current == nil || pending == nil {
		return errInvalid
	}
	c, p, r := g.dev.GetMigMode()
	if r != nvml.SUCCESS {
		return C.nvmlReturn_t(r)
	}
	*current, *pending = C.uint(c), C.uint(p)
	return success
}

func maxMigDevices(g *gpu) int {
	if g.migMode != nvml.DEVICE_MIG_ENABLE {
		return 0 // as measured with MIG off
	}
	info, ret := g.dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if ret != nvml.SUCCESS {
		return 0
	}
	return int(info.InstanceCount)
}

//export mockDeviceGetMaxMigDeviceCount
func mockDeviceGetMaxMigDeviceCount(h C.nvmlDevice_t, count *C.uint) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	g, _, ret := fullGPU(h)
	if ret != success {
		return ret
	}
	if count == nil {
		return errInvalid
	}
	*count = C.uint(maxMigDevices(g))
	return success
}

//export mockDeviceGetMigDeviceHandleByIndex
func mockDeviceGetMigDeviceHandleByIndex(h C.nvmlDevice_t, index C.uint, out *C.nvmlDevice_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	g, _, ret := fullGPU(h)
	if ret != success {
		return ret
	}
	if out == nil {
		return errInvalid
	}
	if g.migMode != nvml.DEVICE_MIG_ENABLE {
		return errNotFound // as measured with MIG off
	}
	if int(index) >= maxMigDevices(g) {
		return errInvalid
	}
	if int(index) >= len(g.migs) {
		return errNotFound
	}
	*out = devicePtr(g.migs[index].handle)
	return success
}

//export mockDeviceIsMigDeviceHandle
func mockDeviceIsMigDeviceHandle(h C.nvmlDevice_t, isMig *C.uint) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	_, d, _, ret := device(h)
	if ret != success {
		return ret
	}
	if isMig == nil {
		return errInvalid
	}
	*isMig = 0
	if d != nil {
		*isMig = 1
	}
	return success
}

//export mockDeviceGetDeviceHandleFromMigDeviceHandle
func mockDeviceGetDeviceHandleFromMigDeviceHandle(h C.nvmlDevice_t, out *C.nvmlDevice_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	g, d, _, ret := device(h)
	if ret != success {
		return ret
	}
	if d == nil || out == nil {
		return errInvalid
	}
	*out = devicePtr(g.handle)
	return success
}

//export mockDeviceGetInstanceId
func mockDeviceGetInstanceId(h C.nvmlDevice_t, compute C.int, id *C.uint) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	_, d, _, ret := device(h)
	if ret != success {
		return ret
	}
	if id == nil {
		return errInvalid
	}
	if d == nil {
		return errNotSupported
	}
	*id = C.uint(d.giID())
	if compute != 0 {
		*id = C.uint(d.ciID())
	}
	return success
}

//export mockDeviceGetAttributes
func mockDeviceGetAttributes(h C.nvmlDevice_t, out *C.nvmlDeviceAttributes_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	_, d, _, ret := device(h)
	if ret != success {
		return ret
	}
	if out == nil {
		return errInvalid
	}
	if d == nil {
		return errNotSupported // nvml.h: MIG device handles only
	}
	ci := d.ciInfo
	*out = C.nvmlDeviceAttributes_t{
		multiprocessorCount:       C.uint(ci.MultiprocessorCount),
		sharedCopyEngineCount:     C.uint(ci.SharedCopyEngineCount),
		sharedDecoderCount:        C.uint(ci.SharedDecoderCount),
		sharedEncoderCount:        C.uint(ci.SharedEncoderCount),
		sharedJpegCount:           C.uint(ci.SharedJpegCount),
		sharedOfaCount:            C.uint(ci.SharedOfaCount),
		gpuInstanceSliceCount:     C.uint(d.gi.info.SliceCount),
		computeInstanceSliceCount: C.uint(ci.SliceCount),
		memorySizeMB:              C.ulonglong(d.gi.info.MemorySizeMB),
	}
	return success
}

//export mockDeviceGetGpuInstanceById
func mockDeviceGetGpuInstanceById(h C.nvmlDevice_t, id C.uint, out *C.nvmlGpuInstance_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	g, _, ret := fullGPU(h)
	if ret != success {
		return ret
	}
	if out == nil {
		return errInvalid
	}
	if g.migMode != nvml.DEVICE_MIG_ENABLE {
		return errNotSupported
	}
	for _, gi := range g.gis {
		if gi.id() == uint32(id) {
			*out = C.nvmlGpuInstance_t(gi.handle)
			return success
		}
	}
	return errNotFound
}

//export mockGpuInstanceGetInfo
func mockGpuInstanceGetInfo(h C.nvmlGpuInstance_t, out *C.nvmlGpuInstanceInfo_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if ret := ready(); ret != success {
		return ret
	}
	gi, ok := objects[unsafe.Pointer(h)].(*gpuInstance)
	if !ok || out == nil {
		return errInvalid
	}
	s, ret := currentState()
	if ret != success {
		return ret
	}
	if s.lost(gi.parent.uuid) {
		return errLost
	}
	info, _ := gi.mock.GetInfo()
	profileID := info.ProfileId
	if id, ok := publicProfileID[gi.constant]; ok {
		profileID = id
	}
	out.device = devicePtr(gi.parent.handle)
	out.id, out.profileId = C.uint(info.Id), C.uint(profileID)
	out.placement.start, out.placement.size = C.uint(info.Placement.Start), C.uint(info.Placement.Size)
	return success
}

// gpuInstanceProfileInfo: profile `profile` of a GPU, corrected, and its NVML name.
func gpuInstanceProfileInfo(h C.nvmlDevice_t, profile C.uint) (nvml.GpuInstanceProfileInfo, string, C.nvmlReturn_t) {
	g, _, ret := fullGPU(h)
	if ret != success {
		return nvml.GpuInstanceProfileInfo{}, "", ret
	}
	info, name, r := g.gpuInstanceProfile(int(profile))
	return info, name, C.nvmlReturn_t(r)
}

//export mockDeviceGetGpuInstanceProfileInfo
func mockDeviceGetGpuInstanceProfileInfo(h C.nvmlDevice_t, profile C.uint, out *C.nvmlGpuInstanceProfileInfo_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	info, _, ret := gpuInstanceProfileInfo(h, profile)
	if ret != success {
		return ret
	}
	if out == nil {
		return errInvalid
	}
	*out = C.nvmlGpuInstanceProfileInfo_t{
		id: C.uint(info.Id), isP2pSupported: C.uint(info.IsP2pSupported), sliceCount: C.uint(info.SliceCount),
		instanceCount: C.uint(info.InstanceCount), multiprocessorCount: C.uint(info.MultiprocessorCount),
		copyEngineCount: C.uint(info.CopyEngineCount), decoderCount: C.uint(info.DecoderCount),
		encoderCount: C.uint(info.EncoderCount), jpegCount: C.uint(info.JpegCount), ofaCount: C.uint(info.OfaCount),
		memorySizeMB: C.ulonglong(info.MemorySizeMB),
	}
	return success
}

//export mockDeviceGetGpuInstanceProfileInfoV
func mockDeviceGetGpuInstanceProfileInfoV(h C.nvmlDevice_t, profile C.uint, out *C.nvmlGpuInstanceProfileInfo_v2_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	info, name, ret := gpuInstanceProfileInfo(h, profile)
	if ret != success {
		return ret
	}
	if out == nil {
		return errInvalid
	}
	// Older nvidia-ml-py leaves version 0 (the measured H200's did) and the driver answered anyway.
	if out.version != 0 && out.version != C.nvmlGpuInstanceProfileInfo_v2 {
		return errVersion
	}
	out.id, out.isP2pSupported, out.sliceCount = C.uint(info.Id), C.uint(info.IsP2pSupported), C.uint(info.SliceCount)
	out.instanceCount, out.multiprocessorCount = C.uint(info.InstanceCount), C.uint(info.MultiprocessorCount)
	out.copyEngineCount, out.decoderCount = C.uint(info.CopyEngineCount), C.uint(info.DecoderCount)
	out.encoderCount, out.jpegCount, out.ofaCount = C.uint(info.EncoderCount), C.uint(info.JpegCount), C.uint(info.OfaCount)
	out.memorySizeMB = C.ulonglong(info.MemorySizeMB)
	setChars(out.name[:], name)
	return success
}

// --- NVLink -----------------------------------------------------------------------------------

func nvlink(h C.nvmlDevice_t, link C.uint) (*gpu, C.nvmlReturn_t) {
	g, d, s, ret := device(h)
	if ret != success {
		return nil, ret
	}
	if d != nil || !s.NVSwitch {
		return nil, errNotSupported // as measured on a GPU without NVLink
	}
	if int(link) >= node.spec.links {
		return nil, errInvalid
	}
	return g, success
}

//export mockDeviceGetNvLinkState
func mockDeviceGetNvLinkState(h C.nvmlDevice_t, link C.uint, active *C.nvmlEnableState_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if _, ret := nvlink(h, link); ret != success {
		return ret
	}
	if active == nil {
		return errInvalid
	}
	*active = C.NVML_FEATURE_ENABLED
	return success
}

//export mockDeviceGetNvLinkRemotePciInfo
func mockDeviceGetNvLinkRemotePciInfo(h C.nvmlDevice_t, link C.uint, pci *C.nvmlPciInfo_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if _, ret := nvlink(h, link); ret != success {
		return ret
	}
	if pci == nil {
		return errInvalid
	}
	s := int(link) % len(node.switches)
	bus := uint32(0xC0 + s)
	fillPci(pci, bus, fmt.Sprintf("%04X:%02X:00.0", 0, bus), node.switches[s], 0)
	return success
}

// --- events -----------------------------------------------------------------------------------

//export mockEventSetCreate
func mockEventSetCreate(out *C.nvmlEventSet_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if ret := ready(); ret != success {
		return ret
	}
	if out == nil {
		return errInvalid
	}
	s, ret := currentState()
	if ret != success {
		return ret
	}
	set := &eventSet{registered: map[*gpu]uint64{}, next: len(s.XIDs)}
	set.handle = newHandle(set)
	*out = C.nvmlEventSet_t(set.handle)
	return success
}

//export mockDeviceGetSupportedEventTypes
func mockDeviceGetSupportedEventTypes(h C.nvmlDevice_t, types *C.ulonglong) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if _, _, ret := fullGPU(h); ret != success {
		return ret
	}
	if types == nil {
		return errInvalid
	}
	*types = C.ulonglong(supportedEvents)
	return success
}

func eventSetOf(h C.nvmlEventSet_t) (*eventSet, bool) {
	set, ok := objects[unsafe.Pointer(h)].(*eventSet)
	return set, ok
}

//export mockDeviceRegisterEvents
func mockDeviceRegisterEvents(h C.nvmlDevice_t, types C.ulonglong, hs C.nvmlEventSet_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	g, d, _, ret := device(h)
	if ret != success {
		return ret
	}
	set, ok := eventSetOf(hs)
	if !ok {
		return errInvalid
	}
	if d != nil || uint64(types)&^supportedEvents != 0 {
		return errNotSupported
	}
	set.registered[g] |= uint64(types)
	return success
}

// nextEvent: the next XID for a GPU of the set, or (for a set with a lost GPU) GPU_IS_LOST.
func nextEvent(set *eventSet, data *C.nvmlEventData_t) (C.nvmlReturn_t, bool) {
	s, ret := currentState()
	if ret != success {
		return ret, true
	}
	for set.next < len(s.XIDs) {
		x := s.XIDs[set.next]
		set.next++
		var g *gpu
		gi, ci := notMigSpecific, notMigSpecific
		switch o := node.byUUID[x.UUID].(type) {
		case *gpu:
			g = o
		case *migDevice:
			g, gi, ci = o.parent, o.giID(), o.ciID()
		default:
			complain("xids: %q is no GPU or MIG device of this machine", x.UUID)
			continue
		}
		if set.registered[g]&xidEvent == 0 {
			continue
		}
		*data = C.nvmlEventData_t{
			device: devicePtr(g.handle), eventType: C.ulonglong(xidEvent), eventData: C.ulonglong(x.XID),
			gpuInstanceId: C.uint(gi), computeInstanceId: C.uint(ci),
		}
		return success, true
	}
	for g := range set.registered {
		if s.lost(g.uuid) {
			return errLost, true
		}
	}
	return success, false
}

//export mockEventSetWait
func mockEventSetWait(hs C.nvmlEventSet_t, data *C.nvmlEventData_t, timeoutMs C.uint) C.nvmlReturn_t {
	deadline := time.Now().Add(time.Duration(timeoutMs) * time.Millisecond)
	for {
		mu.Lock()
		ret := ready()
		set, ok := eventSetOf(hs)
		done := true
		switch {
		case ret != success:
		case !ok || data == nil:
			ret = errInvalid
		default:
			ret, done = nextEvent(set, data)
		}
		mu.Unlock()
		if done {
			return ret
		}
		left := time.Until(deadline)
		if left <= 0 {
			return errTimeout
		}
		time.Sleep(min(left, 10*time.Millisecond))
	}
}

//export mockEventSetFree
func mockEventSetFree(hs C.nvmlEventSet_t) C.nvmlReturn_t {
	mu.Lock()
	defer mu.Unlock()
	if ret := ready(); ret != success {
		return ret
	}
	set, ok := eventSetOf(hs)
	if !ok {
		return errInvalid
	}
	delete(objects, set.handle)
	C.free(set.handle)
	return success
}
