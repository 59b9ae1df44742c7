"""Generated stubs live below; see gpuslice.proto."""
