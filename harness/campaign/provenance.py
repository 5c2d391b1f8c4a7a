"""What a trial's manifest says about where it ran: git revision, machine, package versions."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata

import psutil

from mmchaos import paths


def git_revision() -> str | None:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=paths.PROJECT_ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=paths.PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (rev + ("-dirty" if dirty else "")) or None


def machine() -> dict:
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
    }


def tool_versions() -> dict:
    out: dict[str, str | None] = {}
    for dist in ("mmchaos", "locust", "pandas", "pyarrow"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out
