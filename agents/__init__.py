"""The in-engine side of the control plane (the vLLM agent); imports only controlplane.api from controlplane."""

__version__ = "0.1.0"
