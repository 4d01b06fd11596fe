"""The engine: the scheduler that steps every stream together, the stream handle, chunking, requests."""
