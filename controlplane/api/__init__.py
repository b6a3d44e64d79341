"""Generated protobuf and gRPC code of the contract in proto/ (regenerate with `make proto`)."""
