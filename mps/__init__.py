"""`gpuslice-mps-control-daemon` (main.py): NVIDIA's MPS control daemon as the chart's MPS DaemonSet
runs it beside the device plugin, so that shares of one GPU run side by side with their memory
limits (docs/isolation.md). Its own process, so its own folder.

May import the shared core (gpuslice.runtime) only.
"""
