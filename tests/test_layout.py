"""The house stays as drawn (README, Layout): one installed name, rooms that import only downwards, no import loop."""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# folder -> the package it installs as
ROOMS = {
    "mmchaos": "mmchaos",
    "payloads": "mmchaos.payloads",
    "locustfiles": "mmchaos.locustfiles",
    "harness": "mmchaos.harness",
    "analysis": "mmchaos.analysis",
}
# what each room may import of the project (the ground floor, mmchaos itself, imports none of the rooms)
MAY_IMPORT = {
    "mmchaos": set(),
    "payloads": {"mmchaos"},
    "analysis": {"mmchaos"},
    "locustfiles": {"mmchaos", "mmchaos.payloads"},
    "harness": {"mmchaos", "mmchaos.payloads", "mmchaos.analysis"},
}
GENERIC = ("analysis", "payloads", "harness", "locustfiles")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    package = ROOMS[rel.parts[0]]
    inner = [p for p in rel.with_suffix("").parts[1:] if p != "__init__"]
    return ".".join([package, *inner])


def _imports(path: Path) -> set[str]:
    """Project modules ``path`` imports, wherever in the file (functions included), relative ones resolved."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    return {m for m in found if m.split(".")[0] in ("mmchaos", *GENERIC)}


def _sources() -> dict[str, tuple[Path, set[str]]]:
    out = {}
    for folder in ROOMS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "in_engine" in path.parts:  # run by the engine's python, by path: imports nothing of ours
                continue
            out[_module_name(path)] = (path, _imports(path))
    return out


def _room(module: str) -> str:
    for package in sorted(ROOMS.values(), key=lambda p: -len(p)):
        if module == package or module.startswith(package + "."):
            return package
    return module


@pytest.mark.integration
def test_one_installed_top_level_name():
    dist = metadata.distribution("mmchaos")
    assert dist.read_text("top_level.txt").split() == ["mmchaos"]
    # outside the checkout, the rooms' folder names are nobody's business but their own
    probe = f"import importlib.util as u; print([n for n in {GENERIC!r} if u.find_spec(n)])"
    out = subprocess.run([sys.executable, "-c", probe], cwd="/", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_rooms_import_only_what_they_may():
    wrong = []
    for path, imports in _sources().values():
        folder = path.relative_to(ROOT).parts[0]
        own = ROOMS[folder]
        for imp in imports:
            if imp.split(".")[0] in GENERIC:
                wrong.append(f"{path.relative_to(ROOT)} imports {imp}: use mmchaos.{imp}")
                continue
            room = _room(imp)
            if room != own and room not in MAY_IMPORT[folder]:
                wrong.append(f"{path.relative_to(ROOT)} imports {imp} ({room} is not below {own})")
    assert not wrong, "\n".join(wrong)


def test_no_locust_file_imports_the_harness():
    for module, (path, imports) in _sources().items():
        if module.startswith("mmchaos.locustfiles"):
            assert not [i for i in imports if _room(i) == "mmchaos.harness"], path


def test_no_import_loop():
    sources = _sources()
    graph = {m: {i for i in imports if i in sources and i != m} for m, (_, imports) in sources.items()}
    # a package's __init__ imports nothing here, so `from pkg import module` arrows point at real modules
    graphlib.TopologicalSorter(graph).prepare()  # raises CycleError naming the loop


# the harness's subsystems, each a subpackage, and which others each may import (the command line, cli.py and
# commands/, sits above them all): servers at the bottom, then what runs on them
HARNESS_MAY_IMPORT = {
    "servers": set(),
    "injection": {"servers"},
    "campaign": {"servers", "injection"},
    "minimize": {"servers"},
    "hunt": {"servers", "minimize"},
    "versions": {"servers", "campaign", "minimize"},
    "k8s": {"servers", "campaign"},
    "commands": {"servers", "injection", "campaign", "minimize", "hunt", "versions", "k8s", "arg_types"},
}
HARNESS_TOP = {"cli", "arg_types"}  # the only modules at the harness's top: the command line's parser and types


def _subsystem(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if module.startswith("mmchaos.harness.") else None


def test_the_harness_is_subsystems_that_import_only_what_they_may():
    top = {p.stem for p in (ROOT / "harness").glob("*.py")} - {"__init__"}
    assert top == HARNESS_TOP, f"a module of a subsystem at the harness's top: {sorted(top - HARNESS_TOP)}"
    wrong = []
    for module, (path, imports) in _sources().items():
        own = _subsystem(module)
        if own is None or own in HARNESS_TOP:
            continue
        for imp in imports:
            other = _subsystem(imp)
            if other and other != own and other not in HARNESS_MAY_IMPORT[own]:
                wrong.append(f"{path.relative_to(ROOT)} imports {imp} ({other} is not below {own})")
    assert not wrong, "\n".join(wrong)
