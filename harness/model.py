"""Build the tiny random-weight Qwen3-VL embedding model with an engine's own transformers (offline)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from mmchaos import paths

from . import engines

BUILDER = Path(__file__).parent / "in_engine" / "tiny_model.py"
STAMP = "mmchaos-model.json"


class ModelError(Exception):
    pass


def _pick_engine(version: str | None) -> engines.Engine:
    if version:
        return engines.require(version)
    found = engines.installed()
    if not found:
        raise ModelError("no engine installed to build the model with: run `mmchaos engine install 0.30.0`")
    return found[0]


def build(out: Path | None = None, engine_version: str | None = None, say=print) -> Path:
    """Build into ``out`` (default: the project's model folder); a no-op if a current build is there."""
    out = Path(out or paths.default_model_dir()).resolve()
    e = _pick_engine(engine_version)
    if (out / STAMP).is_file() and (out / "config.json").is_file():
        say(f"model already built at {out}")
        return out
    if out.exists() and any(out.iterdir()):
        raise ModelError(f"{out} exists and is not an mmchaos model: give an empty or new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    say(f"building the tiny Qwen3-VL embedding model with vLLM {e.version}'s transformers")
    r = subprocess.run(
        [str(e.python), str(BUILDER), str(out)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        timeout=600,
    )
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ModelError(f"model build failed: {last}")
    say(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else f"model built at {out}")
    return out
