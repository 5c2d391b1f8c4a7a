"""Where mmchaos keeps things on disk. Everything lives under the project unless MMCHAOS_HOME says otherwise."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def home() -> Path:
    """The cache folder: engines, the tiny model, vLLM's compile cache. Git-ignored."""
    return Path(os.environ.get("MMCHAOS_HOME") or PROJECT_ROOT / ".mmchaos").resolve()


def engines_dir() -> Path:
    return home() / "engines"


def default_model_dir() -> Path:
    return model_dir("qwen3vl-embed")


def model_dir(name: str) -> Path:
    """Where the tiny model of recipe ``name`` is built (harness/servers/model.py has the recipes)."""
    return home() / "models" / f"{name}-tiny"


def vllm_cache_root(engine: str) -> Path:
    # vLLM's caches, kept between server starts. One folder per engine version: vLLM keys some entries by file name
    # only (the model registry's `modelinfos`), so two versions sharing a folder overwrite each other's, and every
    # start after one of the other version paid ~14 s more (45 s instead of 31 s here)
    return home() / "vllm-cache" / engine


def results_dir() -> Path:
    return Path(os.environ.get("MMCHAOS_RESULTS") or PROJECT_ROOT / "results").resolve()


def locustfile(name: str = "embeddings.py") -> Path:
    """One of mmchaos's own locustfiles, wherever the package is installed (found, not imported: importing a
    locustfile imports Locust, which monkey-patches the process)."""
    spec = importlib.util.find_spec("mmchaos.locustfiles")
    assert spec is not None and spec.submodule_search_locations, "mmchaos is installed without its locustfiles"
    return Path(spec.submodule_search_locations[0]) / name
