"""The Kubernetes API server's protobuf encoding, the part gpuslice reads; see gpuslice.podwire."""
