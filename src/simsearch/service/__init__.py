"""The gRPC search service and its client (docs/service.md)."""
