"""A tiny document model rendered twice: Markdown (plots as PNG files beside it) and one self-contained HTML
file (plots inlined as base64, styles inline, nothing fetched from anywhere).

All text is treated as untrusted (error messages and log lines come from the server): it is escaped in both
renderings; there is no way to pass raw HTML or Markdown through.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field

import pandas as pd


@dataclass
class Doc:
    title: str
    blocks: list[tuple] = field(default_factory=list)

    def h(self, level: int, text: str) -> None:
        anchor, used = _anchor(text), {b[3] for b in self.blocks if b[0] == "h"}
        base, i = anchor, 2
        while anchor in used:  # two sections with one title still get distinct links
            anchor, i = f"{base}-{i}", i + 1
        self.blocks.append(("h", level, text, anchor))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def note(self, text: str) -> None:
        self.blocks.append(("note", text))

    def bullets(self, items: list[str]) -> None:
        if items:
            self.blocks.append(("list", list(items)))

    def table(self, df: pd.DataFrame, caption: str | None = None) -> None:
        self.blocks.append(("table", df.astype(object).where(df.notna(), "").astype(str), caption))

    def image(self, filename: str, png: bytes, alt: str) -> None:
        self.blocks.append(("image", filename, png, alt))

    def code(self, text: str) -> None:
        self.blocks.append(("code", text))

    def cards(self, cards: list[tuple[str, str, list[str]]]) -> None:
        """One card per item: a title, a verdict (coloured as table cells are) and its lines: what a reader
        needs before any table (side by side in HTML)."""
        if cards:
            self.blocks.append(("cards", list(cards)))

    def images(self) -> dict[str, bytes]:
        return {b[1]: b[2] for b in self.blocks if b[0] == "image"}

    # --- Markdown ---------------------------------------------------------------------------------------

    def to_markdown(self) -> str:
        out = [f"# {_md(self.title)}", ""]
        for b in self.blocks:
            kind = b[0]
            if kind == "h":
                out += [f"{'#' * b[1]} {_md(b[2])}", ""]
            elif kind == "p":
                out += [_md(b[1]), ""]
            elif kind == "note":
                out += [f"*{_md(b[1])}*", ""]
            elif kind == "list":
                out += [f"- {_md(x)}" for x in b[1]] + [""]
            elif kind == "table":
                df, caption = b[1], b[2]
                if caption:
                    out += [f"**{_md(caption)}**", ""]
                out.append("| " + " | ".join(_md_cell(c) for c in df.columns) + " |")
                out.append("|" + "|".join("---:" if _numeric(df[c]) else "---" for c in df.columns) + "|")
                out += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
                out.append("")
            elif kind == "image":
                out += [f"![{_md(b[3])}]({b[1]})", ""]
            elif kind == "code":
                fence = "`" * max(3, _longest_backtick_run(b[1]) + 1)
                out += [fence + "text", b[1], fence, ""]
            elif kind == "cards":
                for title, verdict, lines in b[1]:
                    out += [f"**{_md(title)}: {_md(verdict)}**", ""] + [f"- {_md(x)}" for x in lines] + [""]
        return "\n".join(out)

    # --- HTML -------------------------------------------------------------------------------------------

    def to_html(self) -> str:
        e = html.escape
        toc = [b for b in self.blocks if b[0] == "h" and b[1] == 2]
        body: list[str] = []
        nav_at: int | None = None  # the contents come after the first screen (what precedes the first section)
        for b in self.blocks:
            kind = b[0]
            if kind == "h":
                if b[1] == 2 and nav_at is None:
                    nav_at = len(body)
                body.append(f'<h{b[1]} id="{b[3]}">{e(b[2])}</h{b[1]}>')
            elif kind == "p":
                body.append(f"<p>{e(b[1])}</p>")
            elif kind == "note":
                body.append(f'<p class="note">{e(b[1])}</p>')
            elif kind == "list":
                body.append("<ul>" + "".join(f"<li>{e(x)}</li>" for x in b[1]) + "</ul>")
            elif kind == "table":
                df, caption = b[1], b[2]
                num = [_numeric(df[c]) for c in df.columns]
                rows = []
                for row in df.itertuples(index=False):
                    cells = []
                    for v, is_num in zip(row, num):
                        cls = _VERDICT_CLASS.get(v, ' class="num"' if is_num else "")
                        cells.append(f"<td{cls}>{e(v)}</td>")
                    rows.append("<tr>" + "".join(cells) + "</tr>")
                cap = f"<caption>{e(caption)}</caption>" if caption else ""
                head = "".join(f"<th>{e(str(c))}</th>" for c in df.columns)
                body.append(
                    f'<div class="tw"><table>{cap}<thead><tr>{head}</tr></thead>'
                    f"<tbody>{''.join(rows)}</tbody></table></div>"
                )
            elif kind == "image":
                data = base64.b64encode(b[2]).decode("ascii")
                body.append(f'<figure><img alt="{e(b[3])}" src="data:image/png;base64,{data}"></figure>')
            elif kind == "code":
                body.append(f"<pre>{e(b[1])}</pre>")
            elif kind == "cards":
                cards = []
                for title, verdict, lines in b[1]:
                    cls = _VERDICT_CLASS.get(verdict, "").replace(' class="', "").rstrip('"')
                    cards.append(
                        f'<div class="card {cls}"><div class="ct">{e(title)}</div><div class="cv">{e(verdict)}</div>'
                        + "".join(f"<p>{e(x)}</p>" for x in lines)
                        + "</div>"
                    )
                body.append(f'<div class="cards">{"".join(cards)}</div>')
        nav = "".join(f'<li><a href="#{b[3]}">{e(b[2])}</a></li>' for b in toc)
        body.insert(len(body) if nav_at is None else nav_at, f"<nav><ol>{nav}</ol></nav>")
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{e(self.title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>{e(self.title)}</h1>{''.join(body)}</body></html>\n"
        )


# cells that are a verdict get its colour
_VERDICT_CLASS = {
    "yes": ' class="yes"',
    "no": ' class="no"',
    "clean": ' class="yes"',
    "fails": ' class="no"',
    "survives with retryable errors": ' class="warn"',
}
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1180px;margin:2em auto;padding:0 1em;
color:#1d1d1f;line-height:1.45}
h1{border-bottom:2px solid #444}h2{margin-top:2.2em;border-bottom:1px solid #ccc}
nav ol{columns:2;font-size:.92em}
.tw{overflow-x:auto;margin:.8em 0}
table{border-collapse:collapse;font-size:.86em}caption{text-align:left;font-weight:600;padding:.3em 0}
th,td{border:1px solid #ddd;padding:.25em .55em;vertical-align:top}th{background:#f3f3f3;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.yes{background:#e3f6e3;font-weight:600}td.no{background:#fbe3e3;font-weight:600}
td.warn{background:#fff1d6;font-weight:600}
.note{color:#555;font-size:.9em}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(270px,1fr));gap:.8em;margin:1em 0}
.card{border:1px solid #ddd;border-left:6px solid #bbb;border-radius:4px;padding:.5em .7em;font-size:.9em}
.card p{margin:.25em 0;overflow-wrap:anywhere}.card .ct{font-weight:600;overflow-wrap:anywhere}
.card .cv{font-size:1.15em;font-weight:700}
.card.yes{border-left-color:#3a9a3a}.card.no{border-left-color:#c33}.card.warn{border-left-color:#d99a1c}
figure{margin:1em 0}img{max-width:100%}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:.8em}
"""


def _anchor(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


def _md(text: str) -> str:
    return html.escape(str(text), quote=False)


def _md_cell(v) -> str:
    return _md(v).replace("|", "\\|").replace("\n", "<br>")


def _numeric(col: pd.Series) -> bool:
    vals = [v for v in col if v not in ("", "—")]
    return bool(vals) and all(re.fullmatch(r"[-+]?[\d,.]+(\s*[%×x]?)(\s*\[.*\])?", v) for v in vals)


def _longest_backtick_run(text: str) -> int:
    return max((len(m) for m in re.findall(r"`+", text)), default=0)
