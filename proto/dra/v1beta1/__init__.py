"""DRA plugin API v1beta1 (generated stubs: api_pb2, api_pb2_grpc)."""
