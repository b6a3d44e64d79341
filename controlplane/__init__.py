"""vllm-controlplane: the controller, its decision core and its command line.

`__version__` is the distribution's version, written here only: pyproject.toml reads it
(`[tool.setuptools.dynamic]`), the agent reports it in its Hello and `controlplane --version` prints it.
"""

__version__ = "0.1.0"
