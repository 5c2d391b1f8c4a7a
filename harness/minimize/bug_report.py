"""What `mmchaos minimize` hands out: the reproducer script, a Markdown snippet for an upstream issue (vLLM version,
flags, model, the server-log lines, what each request got, the script), and the sequence as a request log."""

from __future__ import annotations

from pathlib import Path

from mmchaos import paths
from mmchaos.files import write_files_atomic
from mmchaos.payloads import request_log

from .minimizer import Minimizer, Result

MAX_LOG_LINES = 12


def write(m: Minimizer, result: Result) -> dict[str, Path]:
    """repro.py, issue.md and minimal.jsonl (+ its images) in the minimizer's output folder."""
    script = m.script(result.trace)
    issue = issue_markdown(m, result, script)
    write_files_atomic(m.out, {"repro.py": script.encode(), "issue.md": issue.encode()})
    request_log.write(result.trace, m.out / "minimal.jsonl")
    return {name: m.out / name for name in ("repro.py", "issue.md", "minimal.jsonl")}


def issue_markdown(m: Minimizer, result: Result, script: str) -> str:
    version = m.target.engine or "(a server started by a command)"
    dist = next((f"{k} {v}" for k, v in m.packages.items() if k.startswith("vllm") and v), f"vLLM {version}")
    model = m.target.model or str(paths.default_model_dir())
    tiny = Path(model).resolve() == paths.default_model_dir().resolve()
    model_text = (
        "a tiny random-weight Qwen3-VL embedding model (Qwen3VLForConditionalGeneration, 64-dim output, "
        "built by `mmchaos model build`); the report's model is Qwen3-VL-Embedding"
        if tiny
        else f"`{model}`"
    )
    outcome = result.outcome
    n = len(result.trace)
    rows = []
    statuses = outcome.statuses if outcome else []
    t0 = float(result.trace.requests["t_start"].min())
    for i, r in result.trace.requests.iterrows():
        got = statuses[i] if i < len(statuses) else None
        what = str(r["kind"]) + (f" ({r['case']})" if isinstance(r.get("case"), str) else "")
        if r["abort_after_ms"] == r["abort_after_ms"] and r["abort_after_ms"] is not None:
            what += f", client hangs up after {float(r['abort_after_ms']):g} ms"
        rows.append(
            f"| {i + 1} | {float(r['t_start']) - t0:.3f} s | `{r['endpoint']}` {what} | "
            f"{got if got is not None else 'no answer'} |"
        )
    lines = (outcome.log_lines if outcome else [])[-MAX_LOG_LINES:]
    confirmed = (
        f"crashed {m.repeats} of {m.repeats} fresh servers" if result.confirmed else f"not confirmed: {result.note}"
    )
    return f"""### vLLM {version} `/v1/embeddings` (`--runner pooling`): the server dies after {n} request(s) \
({m.signature})

**Environment**: {dist}; server: `{m.server_command()}`; model: {model_text}.

**Reproduce**: start the server, then run the script below (Python standard library only):

```bash
python3 repro.py --url http://127.0.0.1:8000 --model MODEL
```

It sends (one row per request; the answer as seen in the run that crashed):

| # | sent at | request | answer |
|---|---|---|---|
{chr(10).join(rows)}

and prints `crashed` when `/health` stops answering within 10 s of the last request, `survived` otherwise.
Result: {confirmed}.

**Server log** (the lines that matter):

```text
{chr(10).join(lines) or "(no classified line)"}
```

<details><summary>repro.py</summary>

```python
{script.rstrip()}
```

</details>

Found by `mmchaos minimize` ({m.budget.starts} server starts this session).
"""
