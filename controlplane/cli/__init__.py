"""The `controlplane` command line."""
