"""The admission half of gpuslice: a mutating webhook.

Turns KAI-style `gpu-fraction` / `gpu-memory` annotations into gpuslice extended resources
so the stock kube-scheduler counts GPU memory. The mutation is a pure function
(`mutation.mutate`, one module per step of a pod's flow); the aiohttp server only decodes, calls
it and encodes.

May import the shared core: gpuslice.{config,contract,kubeclient,listwatch,podrequests}; never the
device plugin, the DRA plugin, the pacer or the controller (pyproject.toml's import-linter contracts).
"""
