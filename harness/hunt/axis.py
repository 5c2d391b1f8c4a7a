"""Server flags as an axis of the hunt: ``--flags-axis FLAGS`` (repeatable) hunts each flag set on servers of its
own, one after the other, each with an even share of the budget, each in a folder of its own; its findings say the
flags they were found under. ``--flags-axis default`` stands for what a user might set: processor caches from tiny
to off, the shared-memory cache, two API servers, TP 2 (where the machine has the cores); ``--flags-axis auto[:N]``
for N sets (3) drawn from the version's own help (:mod:`.flag_draw`). A flag set vLLM refuses at start-up is one
line of the summary and the others go on."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ..servers.server import ServerError
from . import flag_draw

DEFAULT = "default"
DEFAULT_AXIS = [
    "",
    "--mm-processor-cache-gb 0.001",
    "--mm-processor-cache-gb 0",
    "--mm-processor-cache-type shm",
    "--api-server-count 2",
    *(["--tensor-parallel-size 2"] if (os.cpu_count() or 1) >= 2 else []),
]


def expand(specs: list[str], drawn: Callable[[int], list[list[str]]] = lambda n: []) -> list[list[str]]:
    """The flag sets the specs give, in order, each once (``default`` expands to DEFAULT_AXIS, ``auto[:N]`` to
    ``drawn(N)``: sets drawn from the version's help)."""
    out: list[list[str]] = []
    for spec in specs:
        n = flag_draw.count(spec)
        given = DEFAULT_AXIS if spec.strip() == DEFAULT else [spec]
        sets = drawn(n) if n is not None else [shlex.split(f) for f in given]
        for words in sets:
            if words not in out:
                out.append(words)
    return out


def folder_name(flags: list[str]) -> str:
    return "flags-" + ("-".join(f.lstrip("-") for f in flags)[:60] or "none")


@dataclass
class AxisResult:
    flags: list[str]
    folder: Path
    code: int | None  # the hunt's exit code; None: the server would not start with these flags
    findings: int = 0
    why: str = ""

    def line(self, shown) -> str:
        flags = shown(self.flags) or "(no extra flags)"
        if self.code is None:
            return f"{flags}: vLLM refused it at start-up: {self.why}"
        return f"{flags}: {self.findings} distinct finding(s) ({self.folder})"


def run(make_hunt, base, flag_sets: list[list[str]], out: Path, budget, say) -> list[AxisResult]:
    """One hunt per flag set (``make_hunt(target, folder, budget)``), the budget shared evenly."""
    from .search import Budget, HuntError

    n = len(flag_sets)
    share = Budget(
        budget.max_minutes / n,
        max(1, budget.max_starts // n),
        max(1, budget.max_requests // n),
        max(1, budget.max_cases // n),
    )
    results = []
    for flags in flag_sets:
        folder = out / folder_name(flags)
        target = replace(base, flags=[*base.flags, *flags])
        say(f"hunt: flag set {shlex.join(flags) or '(none)'} -> {folder}")
        hunt = make_hunt(target, folder, share)
        hunt.axis_flags = list(flags)
        try:
            code = hunt.run()
        except (ServerError, HuntError) as e:
            if hunt.state["cases"]:
                raise  # the search ran and failed on its own: not a refused flag set
            results.append(AxisResult(flags, folder, None, why=str(e).splitlines()[0][:300]))
            continue
        results.append(AxisResult(flags, folder, code, len(hunt.findings)))
    return results
