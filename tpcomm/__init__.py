"""tpcomm: find the communication bottleneck in tensor-parallel LLM inference.

The library is usable without click; `tpcomm.cli` only parses and hands off.
Importing this package must stay cheap (no torch, no vLLM): the vLLM plugin
entry points import it in every serving process.
"""

__version__ = "0.1.0"
