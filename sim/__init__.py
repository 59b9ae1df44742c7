"""gpuslice-sim: replays a GPU trace through the real webhook conversion and the real
device-plugin allocation code, with a model of kube-scheduler and kubelet's device manager.
"""
