"""gRPC edges of the three workers: they translate wire messages into core events, execute the
cores' commands (RPCs, page copies, model runs) and translate grpc errors at the boundary."""
