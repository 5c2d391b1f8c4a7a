"""The hunt's findings report (Markdown + one HTML file), in the campaign report's style: what was searched, and
each distinct finding with its oracle, fingerprint, count, first case and reproducer."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mmchaos.analysis.document import Doc
from mmchaos.files import write_files_atomic

ORDER = ("crash", "hang", "unknown_signature", "server_error", "wrong_answer", "bad_response", "drift")


def write(hunt) -> dict[str, Path]:
    s, found = hunt.state, sorted(hunt.findings.values(), key=lambda f: (ORDER.index(f.oracle), f.first_case))
    doc = Doc("mmchaos hunt: findings")
    target = hunt.target.engine or hunt.target.command or hunt.target.url
    flags = " ".join(hunt.redactor.argv(hunt.target.flags)) or "(defaults)"
    doc.p(
        f"Target: {hunt.target.mode} {target}, flags {flags}. Searched: {s['cases']} case(s), {s['requests']} "
        f"request(s), {s['starts']} server start(s), {s['seconds'] / 60:.1f} min, seed {s['seed']}."
    )
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
