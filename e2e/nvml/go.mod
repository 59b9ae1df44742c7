module gpuslice.local/e2e/nvml

go 1.22

require github.com/NVIDIA/go-nvml v0.13.4-1

require github.com/google/uuid v1.6.0 // indirect
