// The NVML C ABI of the mock: every exported function is defined here against NVIDIA's own
// nvml.h (build.sh fetches it from the nvidia-nvml-dev wheel and puts it on the include path), so
// a signature that does not match the header does not compile. Each one forwards to its Go
// implementation in main.go (the mock* functions, declared in the generated _cgo_export.h).
// build.sh's version script exports the nvml* functions defined here and nothing else.

#include <nvml.h>
#include "_cgo_export.h"

nvmlReturn_t DECLDIR nvmlInit_v2(void) { return mockInit(0); }
nvmlReturn_t DECLDIR nvmlInitWithFlags(unsigned int flags) { return mockInit(flags); }
nvmlReturn_t DECLDIR nvmlShutdown(void) { return mockShutdown(); }

// Our wording of each return code (pynvml shows it as the exception's text).
const DECLDIR char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t DECLDIR nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return mockSystemGetDriverVersion(version, length);
}
nvmlReturn_t DECLDIR nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    return mockSystemGetNVMLVersion(version, length);
}
nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    return mockSystemGetCudaDriverVersion(cudaDriverVersion);
}
nvmlReturn_t DECLDIR nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return mockSystemGetCudaDriverVersion(cudaDriverVersion);
}

nvmlReturn_t DECLDIR nvmlDeviceGetCount_v2(unsigned int *deviceCount) { return mockDeviceGetCount(deviceCount); }
nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return mockDeviceGetHandleByIndex(index, device);
}
nvmlReturn_t DECLDIR nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    return mockDeviceGetHandleByUUID((char *)uuid, device);
}
nvmlReturn_t DECLDIR nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    return mockDeviceGetHandleByPciBusId((char *)pciBusId, device);
}

nvmlReturn_t DECLDIR nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    return mockDeviceGetUUID(device, uuid, length);
}
nvmlReturn_t DECLDIR nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    return mockDeviceGetName(device, name, length);
}
nvmlReturn_t DECLDIR nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    return mockDeviceGetIndex(device, index);
}
nvmlReturn_t DECLDIR nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    return mockDeviceGetMinorNumber(device, minorNumber);
}
nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return mockDeviceGetPciInfo(device, pci);
}
nvmlReturn_t DECLDIR nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    return mockDeviceGetNumaNodeId(device, node);
}
nvmlReturn_t DECLDIR nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode) {
    return mockDeviceGetComputeMode(device, mode);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    return mockDeviceGetMemoryInfo(device, memory);
}
nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    return mockDeviceGetMemoryInfoV2(device, memory);
}
nvmlReturn_t DECLDIR nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    return mockDeviceGetUtilizationRates(device, utilization);
}
nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_t *infos) {
    return mockDeviceGetRunningProcesses(device, 0, infoCount, infos);
}
nvmlReturn_t DECLDIR nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                              nvmlProcessInfo_t *infos) {
    return mockDeviceGetRunningProcesses(device, 1, infoCount, infos);
}
nvmlReturn_t DECLDIR nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                                nvmlProcessInfo_t *infos) {
    return mockDeviceGetRunningProcesses(device, 2, infoCount, infos);
}
nvmlReturn_t DECLDIR nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                     unsigned int *processSamplesCount,
                                                     unsigned long long lastSeenTimeStamp) {
    return mockDeviceGetProcessUtilization(device, utilization, processSamplesCount, lastSeenTimeStamp);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    return mockDeviceGetMigMode(device, currentMode, pendingMode);
}
nvmlReturn_t DECLDIR nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    return mockDeviceGetMaxMigDeviceCount(device, count);
}
nvmlReturn_t DECLDIR nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                         nvmlDevice_t *migDevice) {
    return mockDeviceGetMigDeviceHandleByIndex(device, index, migDevice);
}
nvmlReturn_t DECLDIR nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    return mockDeviceIsMigDeviceHandle(device, isMigDevice);
}
nvmlReturn_t DECLDIR nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    return mockDeviceGetDeviceHandleFromMigDeviceHandle(migDevice, device);
}
nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    return mockDeviceGetInstanceId(device, 0, id);
}
nvmlReturn_t DECLDIR nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    return mockDeviceGetInstanceId(device, 1, id);
}
nvmlReturn_t DECLDIR nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    return mockDeviceGetAttributes(device, attributes);
}
nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                  nvmlGpuInstance_t *gpuInstance) {
    return mockDeviceGetGpuInstanceById(device, id, gpuInstance);
}
nvmlReturn_t DECLDIR nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    return mockGpuInstanceGetInfo(gpuInstance, info);
}
nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                         nvmlGpuInstanceProfileInfo_t *info) {
    return mockDeviceGetGpuInstanceProfileInfo(device, profile, info);
}
nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                          nvmlGpuInstanceProfileInfo_v2_t *info) {
    return mockDeviceGetGpuInstanceProfileInfoV(device, profile, info);
}

nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive) {
    return mockDeviceGetNvLinkState(device, link, isActive);
}
nvmlReturn_t DECLDIR nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    return mockDeviceGetNvLinkRemotePciInfo(device, link, pci);
}

nvmlReturn_t DECLDIR nvmlEventSetCreate(nvmlEventSet_t *set) { return mockEventSetCreate(set); }
nvmlReturn_t DECLDIR nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    return mockDeviceGetSupportedEventTypes(device, eventTypes);
}
nvmlReturn_t DECLDIR nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
    return mockDeviceRegisterEvents(device, eventTypes, set);
}
nvmlReturn_t DECLDIR nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return mockEventSetWait(set, data, timeoutms);
}
nvmlReturn_t DECLDIR nvmlEventSetFree(nvmlEventSet_t set) { return mockEventSetFree(set); }

// What go-nvml's own bindings (linked in with its mock) call for every NVML function this file
// does not define: build.sh's linker script binds those references here. Never exported.
int gpusliceNvmlMockNotFound(void) { return NVML_ERROR_FUNCTION_NOT_FOUND; }
