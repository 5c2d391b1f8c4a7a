"""The tiny random-weight models, built with an engine's own transformers (offline, byte-identical every time), and
the names serve, repro, versions and campaigns take them by (``model = "clip-embed"``)."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from mmchaos import paths
from mmchaos.errors import MmchaosError

from . import engines, long_step

IN_ENGINE = Path(__file__).parent / "in_engine"
STAMP = "mmchaos-model.json"


@dataclass(frozen=True)
class Recipe:
    name: str
    script: str  # in in_engine/, run by the engine's python with the output folder
    architecture: str
    accepts: str  # what a request may carry, read in vLLM's model code
    routes: str  # what it serves with --runner pooling (measured on 0.32.0)

    @property
    def builder(self) -> Path:
        return IN_ENGINE / self.script

    @property
    def folder(self) -> Path:
        return paths.model_dir(self.name)

    @property
    def version(self) -> str:
        """The builder's RECIPE_VERSION (a model built by another version of the recipe is stale)."""
        found = re.search(r'^RECIPE_VERSION = "([^"]+)"', self.builder.read_text(), re.M)
        if not found:
            raise ModelError(f"{self.builder} names no RECIPE_VERSION")
        return found.group(1)


RECIPES = {
    r.name: r
    for r in (
        Recipe(
            "qwen3vl-embed",
            "tiny_model.py",
            "Qwen3VLForConditionalGeneration",
            "images, videos and text together (Qwen3-VL-Embedding)",
            "/v1/embeddings, /v2/embed, /pooling, /score, /rerank",
        ),
        Recipe(
            "qwen2vl-embed",
            "tiny_qwen2vl.py",
            "Qwen2VLForConditionalGeneration",
            "images, videos and text together (GME, DSE)",
            "/v1/embeddings, /v2/embed, /pooling, /score, /rerank",
        ),
        Recipe(
            "clip-embed",
            "tiny_clip.py",
            "CLIPModel",
            "an image or a text, not both (vLLM's clip.py)",
            "/v1/embeddings, /v2/embed, /pooling, /score, /rerank (an image alone or a text alone)",
        ),
        Recipe(
            "qwen3vl-rerank",
            "tiny_rerank.py",
            "Qwen3VLForSequenceClassification",
            "a text query against image and text documents (Qwen3-VL-Reranker)",
            "/score, /rerank, /classify, /pooling",
        ),
    )
}
DEFAULT = "qwen3vl-embed"


class ModelError(MmchaosError):
    pass


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ModelError(f"unknown model '{name}'; known: {', '.join(RECIPES)} (or give a model folder)")
    return RECIPES[name]


def resolve(model: str | None) -> str | None:
    """A model as serve, repro, versions and campaigns take it: a recipe's name (its folder, which must be built),
    else a folder or a hub name, as given."""
    if model is None or model not in RECIPES:
        return model
    folder = RECIPES[model].folder
    if not (folder / "config.json").is_file():
        raise ModelError(f"model '{model}' is not built: run `mmchaos model build {model}`")
    return str(folder)


# vLLM's clip.py and siglip.py: an input is an image or a text, not both ("CLIP accepts text-only or image-only
# inputs, not both!", a 400 before the multimodal cache, measured on 0.30.0 and 0.32.0)
IMAGE_ALONE = frozenset({"CLIPModel", "SiglipModel"})


def takes_text_with_image(model: str | None) -> bool:
    """Whether the model (a recipe's name, a folder, or None for the default) takes a text beside an image in one
    input, read from its config.json's architectures (a hub name: assumed so)."""
    folder = RECIPES[model].folder if model in RECIPES else Path(model or paths.default_model_dir())
    try:
        archs = json.loads((folder / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError):
        return True
    return not IMAGE_ALONE & set(archs)


def is_built(folder: Path, version: str | None = None) -> bool:
    """Whether ``folder`` holds a model we built (by recipe ``version``, when given)."""
    if not ((folder / STAMP).is_file() and (folder / "config.json").is_file()):
        return False
    try:
        built = json.loads((folder / STAMP).read_text()).get("recipe_version")
    except (OSError, ValueError):
        return False
    return version is None or built == version


def _pick_engine(version: str | None) -> engines.Engine:
    if version:
        return engines.require(version)
    found = engines.installed()
    if not found:
        raise ModelError("no engine installed to build the model with: run `mmchaos engine install 0.30.0`")
    return found[0]


def build(out: Path | None = None, engine_version: str | None = None, say=print, name: str = DEFAULT) -> Path:
    """Build recipe ``name`` into ``out`` (default: its folder under the project's models); a no-op if a current
    build is there."""
    r = recipe(name)
    out = Path(out or r.folder).resolve()
    e = _pick_engine(engine_version)
    if is_built(out, r.version):
        say(f"model {name} already built at {out}")
        return out
    if is_built(out):  # ours, by an older recipe: made again (a fix of the recipe must reach every machine)
        say(f"model {name} at {out} was built by an older recipe: building it again ({r.version})")
        shutil.rmtree(out)
    if out.exists() and any(out.iterdir()):
        raise ModelError(f"{out} exists and is not an mmchaos model: give an empty or new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    say(f"building the tiny {r.architecture} ({name}) with vLLM {e.version}'s transformers")
    log = out.parent / f"{out.name}.build.log"
    log.unlink(missing_ok=True)
    code = long_step.run(
        [str(e.python), str(r.builder), str(out)],
        log,
        f"building {name}",
        say,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    if code != 0:
        raise ModelError(f"model build failed: {lines[-1] if lines else '(no output)'} (log: {log})")
    say(lines[-1] if lines else f"model built at {out}")
    return out
