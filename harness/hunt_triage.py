"""Triage of the hunt's findings: each distinct crash shrunk on fresh servers to a confirmed reproducer, every
finding given its repro.py, minimal.jsonl and issue.md, and the findings report (Markdown + one HTML file).

The shrink, for a crash: first the cut (the steps up to the one the server died at that touch its image, and the
operator actions), then one step at a time dropped while the crash stays; a candidate counts only when it kills
``repeats`` fresh servers of ``repeats`` with the same signature chain. Each candidate is one server start, taken
from --max-starts."""

from __future__ import annotations

import html
from pathlib import Path

from mmchaos.signatures import Signatures

from . import candidate_run, hunt_repro, hunt_steps
from .server import Target

SETTLE_S = 10.0


def cut(finding: dict) -> list[dict]:
    steps = finding["steps"][: finding["at_step"] + 1]
    image = hunt_steps.image_of(steps[-1])
    return [s for s in steps if s["op"] == "operator" or hunt_steps.image_of(s) == image]


class Shrinker:
    def __init__(self, target: Target, routes, model: str, sigs: Signatures, folder: Path, starts_left,
                 repeats: int = 1, start_timeout: float = 300.0, say=print):
        self.target, self.routes, self.model, self.sigs = target, routes, model, sigs
        self.folder, self.starts_left, self.repeats = folder, starts_left, repeats
        self.start_timeout, self.say, self.runs = start_timeout, say, 0

    def crashes(self, steps: list[dict], salt: int, chain: str) -> bool:
        for _ in range(self.repeats):
            if not self.starts_left():
                raise BudgetOut
            self.runs += 1
            script = hunt_repro.render("candidate", steps, self.routes, self.model, salt)
            out = candidate_run.run_candidate(script, self.target, self.folder / f"candidate-{self.runs}", self.sigs,
                                              SETTLE_S, self.start_timeout)
            self.say(f"  candidate {self.runs}: {len(steps)} steps -> "
                     f"{'crashed: ' + str(out.signature) if out.crashed else 'survived'}")
            if not (out.crashed and out.signature == chain):
                return False
        return True

    def shrink(self, finding: dict) -> tuple[list[dict], bool]:
        """The smallest step list found that still crashes as the finding did, and whether it was confirmed."""
        salt, chain = finding["salt"], finding["signature"]
        best, confirmed = finding["steps"][: finding["at_step"] + 1], False
        try:
            small = cut(finding)
            if self.crashes(small, salt, chain):
                best, confirmed = small, True
            elif self.crashes(best, salt, chain):
                confirmed = True
            else:
                return best, False
            i = 0
            while i < len(best) and len(best) > 1:
                trial = best[:i] + best[i + 1:]
                if self.crashes(trial, salt, chain):
                    best = trial
                else:
                    i += 1
        except BudgetOut:
            self.say("  shrink stopped: max-starts")
        return best, confirmed


class BudgetOut(Exception):
    pass


def write_finding(folder: Path, finding: dict, steps: list[dict], routes, model: str, versions_line: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    title = f"vLLM {finding['oracle']}: {finding['signature']}"
    (folder / "repro.py").write_text(hunt_repro.render(title, steps, routes, model, finding["salt"]))
    (folder / "minimal.jsonl").write_text(hunt_repro.minimal_jsonl(steps, routes, model, finding["salt"]))
    lines = [f"# {title}", "", f"Found by `mmchaos hunt` ({versions_line}).", "",
             f"- oracle: {finding['oracle']} ({finding['severity']})", f"- signature: `{finding['signature']}`",
             f"- process: {finding['process'] or '-'}", f"- detail: `{finding['detail'][:300]}`",
             f"- seen {finding['count']} times; first in case {finding['first_case']}",
             f"- reproducer: {len(steps)} steps, "
             f"{'confirmed on a fresh server' if finding.get('confirmed') else 'not confirmed on a fresh server'}",
             "", "## Steps", ""]
    lines += [f"{i + 1}. {hunt_steps.describe(s)}" for i, s in enumerate(steps)]
    lines += ["", "## Reproduce", "", "```bash", "python3 repro.py --url http://127.0.0.1:8000", "```", ""]
    (folder / "issue.md").write_text("\n".join(lines))


def report(out: Path, state: dict, versions_line: str) -> None:
    findings = sorted(state["findings"].values(), key=lambda f: (f["severity"] != "finding", f["first_request"]))
    md = [f"# Hunt findings — {versions_line}", "",
          f"Searched {state['cases']} cases, {state['requests']} requests, {state['starts']} server starts.", ""]
    if not findings:
        md.append(f"Nothing found in {state['cases']} cases.")
    else:
        md += ["| fingerprint | class | oracle | signature | process | count | first case | reproducer |",
               "|---|---|---|---|---|---:|---:|---|"]
        for f in findings:
            md.append(f"| {f['fingerprint']} | {f['severity']} | {f['oracle']} | `{f['signature']}` | "
                      f"{f['process'] or '-'} | {f['count']} | {f['first_case']} | "
                      f"findings/{f['fingerprint']}/repro.py ({f.get('repro_steps', '?')} steps"
                      f"{', confirmed' if f.get('confirmed') else ''}) |")
        news = [f for f in findings if f["oracle"] == "unknown_signature"]
        if news:
            md += ["", "## New signatures (add them to signatures.toml)", ""]
            for f in news:
                md += [f"- `{f['signature']}` ({f['process']}): `{f['detail'][:200]}`"]
    text = "\n".join(md) + "\n"
    (out / "findings.md").write_text(text)
    body = "".join(f"<p>{html.escape(line)}</p>" if not line.startswith("|") else
                   "<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>" for c in line.strip("|").split("|"))
                   + "</tr>" for line in md if line.strip() and not line.startswith("|---"))
    (out / "findings.html").write_text(f"<!doctype html><meta charset=utf-8><title>Hunt findings</title>"
                                       f"<table>{body}</table>\n")
