"""The gRPC search service and its client (design §5)."""
