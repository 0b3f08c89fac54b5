"""fairgate server: grpc.aio servicers, engine adapters, wiring."""
