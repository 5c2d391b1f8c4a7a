"""`make typecheck` (and a static check of `make test`): mypy over the package as it installs, without moving its
folders.

The rooms stay at the top of the repository (payloads/, locustfiles/, harness/, analysis/) and install under
mmchaos through pyproject.toml's package-dir, by setuptools' editable finder: an import hook that no static checker
runs, so mypy on the checkout finds ``mmchaos`` but none of ``mmchaos.payloads`` etc. Here the installed layout is
drawn as a tree of symbolic links in build/typecheck/ from that same package-dir (the mapping is defined once, in
pyproject.toml; a new module needs nothing): build/typecheck/mmchaos/payloads -> payloads/, and each entry of
mmchaos/ linked beside them. mypy checks that tree with the [tool.mypy] settings of pyproject.toml, and its report
names the files of the checkout, so an editor's jump-to-line works.

Exit code: mypy's (0 clean, 1 errors found, 2 it could not run).
"""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"


def package_dirs() -> dict[str, str]:
    """Package -> folder, as pyproject.toml installs them; only the top of each room (its subpackages follow)."""
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {
        pkg: folder
        for pkg, folder in dirs.items()
        if not any(pkg.startswith(other + ".") and folder.startswith(dirs[other] + "/") for other in dirs)
    }


def draw_tree() -> dict[Path, Path]:
    """The tree of links, made anew; returns each linked folder of the tree -> the checkout's folder."""
    shutil.rmtree(TREE, ignore_errors=True)
    links: dict[Path, Path] = {}
    dirs = package_dirs()
    for pkg, folder in sorted(dirs.items(), key=lambda kv: kv[0].count(".")):
        where = TREE.joinpath(*pkg.split("."))
        if "." not in pkg:  # the ground floor: a real folder, each of its entries linked into it (the rooms too)
            where.mkdir(parents=True)
            for entry in (ROOT / folder).iterdir():
                if entry.name != "__pycache__":
                    (where / entry.name).symlink_to(entry)
        else:
            where.symlink_to(ROOT / folder, target_is_directory=True)
        links[where] = ROOT / folder
    return links


def in_checkout(report: str, links: dict[Path, Path]) -> str:
    """mypy's report with the tree's paths put back as the checkout's (the longest link first)."""
    for tree_dir, real in sorted(links.items(), key=lambda kv: -len(str(kv[0]))):
        report = report.replace(str(tree_dir.relative_to(ROOT)) + "/", str(real.relative_to(ROOT)) + "/")
    return report


def main() -> int:
    os.chdir(ROOT)
    links = draw_tree()
    out, err, code = api.run(["--config-file", str(ROOT / "pyproject.toml"), str((TREE / "mmchaos").relative_to(ROOT))])
    sys.stdout.write(in_checkout(out, links))
    sys.stderr.write(in_checkout(err, links))
    return code


if __name__ == "__main__":
    sys.exit(main())
