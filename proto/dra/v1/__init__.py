"""DRA plugin API v1 (generated stubs: api_pb2, api_pb2_grpc)."""
