"""Pods, lists and watch events in the API server's protobuf encoding (generated stubs: api_pb2)."""
