"""The in-engine side of the control plane (the vLLM agent); imports only controlplane.api and
controlplane.protocol from controlplane.

`__version__` is the distribution's (`controlplane.__version__`): the agent and the controller ship in one wheel.
"""

from controlplane import __version__

__all__ = ["__version__"]
