"""`mmchaos model`: build the tiny random-weight models, and list them."""

from __future__ import annotations

from pathlib import Path

from mmchaos import paths

from ..servers import model as model_build
from .common import CommandError, console, listing


def add_parser(sub) -> None:
    m = sub.add_parser("model", help="the tiny random-weight models (Qwen3-VL embedder, Qwen2-VL, CLIP, a reranker)")
    msub = m.add_subparsers(dest="action", required=True)
    mb = msub.add_parser("build", help="build models by name (deterministic, offline; a no-op when built)")
    mb.add_argument(
        "names", nargs="*", metavar="NAME", help=f"{', '.join(model_build.RECIPES)} (default: {model_build.DEFAULT})"
    )
    mb.add_argument("--dir", help=f"build into this folder instead (default: {paths.home() / 'models'}/NAME-tiny)")
    mb.add_argument("--engine", help="engine whose transformers builds it (default: the oldest installed)")
    msub.add_parser("list", help="the models mmchaos can build, what each accepts and serves, and where built")
    m.set_defaults(func=run)


def run(a) -> int:
    if a.action == "list":
        columns = [
            ("model", "model"),
            ("architecture", "architecture"),
            ("accepts", "accepts"),
            ("serves", "serves"),
            ("built_at", "built at"),
        ]
        rows = [(r.name, r.architecture, r.accepts, r.routes, _built(r)) for r in model_build.RECIPES.values()]
        listing(columns, rows)
        return 0
    names = a.names or [model_build.DEFAULT]
    for name in names:
        model_build.recipe(name)  # every name checked before the first build
    if a.dir and len(names) > 1:
        raise CommandError("--dir takes one model name")
    for name in names:
        model_build.build(Path(a.dir) if a.dir else None, engine_version=a.engine, say=console.print, name=name)
    return 0


def _built(r) -> str:
    return str(r.folder) if model_build.is_built(r.folder, r.version) else "-"
