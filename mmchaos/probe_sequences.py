"""The deterministic probes, defined once: each a never-seen image, a first step that may leave the API server's cache
holding it, then a valid request with that same image. Locust sends them (locustfiles/probes.py), plain HTTP sends
them for `repro` and `versions` (harness/minimize/repro.py), and the versions table explains them, all from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeSequence:
    name: str
    first_step: str  # the step before the reuse: a row's ``case`` and a reproducer's step name
    trigger_status: int | None  # the first step's status when it applied (None: hung up before any answer)
    about: str  # what it sends, in a few words


SEQUENCES: dict[str, ProbeSequence] = {
    s.name: s
    for s in (
        ProbeSequence("poison_reuse", "poison", 400, "a post-render 400, then the same image"),
        ProbeSequence("tokenize_reuse", "tokenize", 200, "/tokenize of the image, then the same image"),
        ProbeSequence("abort_reuse", "abort", None, "a request the client hangs up on, then the same image"),
        ProbeSequence("route_poison_reuse", "route_poison", 400, "a post-render 400 on /v2/embed, then the same image"),
    )
}
NAMES = tuple(SEQUENCES)


def parse(text: str | None) -> list[str]:
    """Comma-separated sequence names (empty or None: all, in the table's order); ValueError names the unknown."""
    names = [s.strip() for s in (text or "").split(",") if s.strip()] or list(NAMES)
    unknown = [n for n in names if n not in SEQUENCES]
    if unknown:
        raise ValueError(f"unknown probe(s) {', '.join(unknown)}; known: {', '.join(NAMES)}")
    return names


def explained() -> str:
    """One sentence's worth: each sequence and what it sends."""
    return "; ".join(f"{s.name}: {s.about}" for s in SEQUENCES.values())
