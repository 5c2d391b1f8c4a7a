"""The hunt's findings report (Markdown + one HTML file), in the campaign report's style: what was searched, and
each distinct finding with its oracle, fingerprint, count, first case and reproducer."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from mmchaos.analysis.document import Doc
from mmchaos.files import write_files_atomic

ORDER = ("crash", "hang", "unknown_signature", "server_error", "wrong_answer", "bad_response", "drift")


def _searched(doc: Doc, hunt) -> None:
    """How much was searched: distinct shapes, mutants, media sources, and vLLM's lines the cases reached."""
    s = hunt.state
    shapes, sent = hunt.corpus.distinct()
    drawn = s.get("media_drawn") or {}
    total = sum(drawn.values()) or 1
    media = ", ".join(f"{k} {100 * v / total:.0f} %" for k, v in sorted(drawn.items())) or "none drawn"
    doc.p(
        f"Distinct case shapes: {shapes} of {sent} case(s) sent ({shapes / max(sent, 1):.2f}); cases sent again: "
        f"{sent - len(s.get('sent_hashes', []))}; mutants of the corpus: {s.get('mutants', 0)} "
        f"(share asked {hunt.mutate_share:g}); corpus: {len(s.get('corpus', []))} case(s). Media drawn: {media} "
        "(suspects: images of requests that did not get their answer)."
    )
    if swept := s.get("surface"):
        doc.p(
            f"The API's surface: {swept['swept']} of its {swept['points']} points swept (each value the schema names "
            "for each field, each pair of two enumerated fields' values, each message and part kind; one text-only "
            "request each)."
        )
    if avoided := s.get("suspects_avoided_from"):
        doc.note(
            f"From case {avoided['case']} on, no suspect was sent: {avoided['crash']} had been met twice, and each "
            "meeting costs a server restart; images the server answered were still sent again."
            + (
                f" No mutant was made from the {len(s['retired'])} case(s) that crashed or made a mutant that crashed."
                if s.get("retired")
                else ""
            )
        )
    if spared := s.get("spared"):
        said = ", ".join(f"{k}={json.dumps(v)}" for k, v in spared["fields"].items())
        doc.note(
            f"From case {spared['case']} on, no request carried {said}: the {spared['of']} requests the server had "
            "left unanswered all did (each costs the client's whole timeout while the server goes on computing it)."
        )
    if points := s.get("spared_points"):
        said = ", ".join(f"{k}={json.dumps(v)}" for k, v in points["fields"].items())
        doc.note(
            f"From case {points['case']} on, no request carried {said}: a point of the API's surface that set only "
            "that on the simplest body went unanswered."
        )
    cov = s.get("coverage")
    if hunt.blind or not cov:
        doc.note(
            f"Searched blind: {hunt.blind or 'no coverage was read'}. Cases were drawn without knowing which of "
            "vLLM's lines they reached."
        )
        return
    doc.table(
        pd.DataFrame(
            [
                {"part of vLLM": k, "lines the cases ran": v["by_cases"], "with start-up": v["in_all"]}
                for k, v in cov["areas"].items()
            ]
        ),
        "vLLM's own lines run in the server's processes (coverage.py in each; start-up: imports and the start)",
    )
    curve = cov.get("curve") or []
    if len(curve) >= 2:
        from mmchaos.analysis.plots import line_png

        doc.image(
            "coverage_curve.png",
            line_png([c for c, _ in curve], [n for _, n in curve], "case", "vLLM lines run by the cases"),
            "vLLM lines reached over the cases",
        )


def write(hunt) -> dict[str, Path]:
    s, found = hunt.state, sorted(hunt.findings.values(), key=lambda f: (ORDER.index(f.oracle), f.first_case))
    doc = Doc("mmchaos hunt: findings")
    target = hunt.target.engine or hunt.target.command or hunt.target.url
    flags = " ".join(hunt.redactor.argv(hunt.target.flags)) or "(defaults)"
    doc.p(
        f"Target: {hunt.target.mode} {target}, flags {flags}. Searched: {s['cases']} case(s), {s['requests']} "
        f"request(s), {s['starts']} server start(s), {s['seconds'] / 60:.1f} min, seed {s['seed']}."
    )
    _searched(doc, hunt)
    if s.get("skipped_fields"):
        doc.note("Fields left out (the schema library cannot draw from them): " + ", ".join(s["skipped_fields"]))
    if not found:
        doc.p(f"Nothing found in {s['cases']} case(s).")
    else:
        doc.table(
            pd.DataFrame(
                [
                    {
                        "oracle": f.oracle,
                        "finding": f.title,
                        "count": f.count,
                        "first case": f.first_case,
                        "fingerprint": f.fingerprint,
                        # a crash of a flags axis: the fewest of its set's flags it needs (shrunk on fresh servers)
                        **(
                            {"needs flags": " ".join(f.needs_flags) if f.needs_flags is not None else "–"}
                            if any(x.needs_flags is not None for x in found)
                            else {}
                        ),
                    }
                    for f in found
                ]
            ),
            "Distinct findings",
        )
    for f in found:
        folder = hunt.out / "findings" / str(f.first_case)
        doc.h(2, f"{f.oracle}: {f.title}")
        doc.p(
            f"Fingerprint `{f.fingerprint}`; seen {f.count} time(s), first in case {f.first_case}; its case: "
            f"`{folder / 'case.json'}`."
        )
        if f.detail:
            doc.code(f.detail)
        repro = folder / "minimized" / "repro.py"
        if repro.exists():
            doc.p(f"Reproducer: `{repro}` (and `issue.md`, `minimal.jsonl` beside it).")
    md, html = hunt.out / "findings.md", hunt.out / "findings.html"
    write_files_atomic(
        hunt.out,
        {
            "findings.md": doc.to_markdown().encode(),
            "findings.html": doc.to_html().encode(),
            **{name: png for name, png in doc.images().items()},
        },
    )
    return {"md": md, "html": html}
