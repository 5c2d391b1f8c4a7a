"""Build the tiny random-weight Qwen3-VL embedding model with an engine's own transformers (offline)."""

from __future__ import annotations

from pathlib import Path

from mmchaos import paths

from . import engines, long_step

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
    log = out.parent / f"{out.name}.build.log"
    log.unlink(missing_ok=True)
    code = long_step.run([str(e.python), str(BUILDER), str(out)], log, "building the model", say, timeout=600,
                         env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    if code != 0:
        raise ModelError(f"model build failed: {lines[-1] if lines else '(no output)'} (log: {log})")
    say(lines[-1] if lines else f"model built at {out}")
    return out
