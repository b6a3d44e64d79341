"""Generated from proto/controlplane/v1 by tools/gen_proto.py; do not edit."""
