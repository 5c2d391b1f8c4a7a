"""Outcomes by request kind for the web UI panel, counted where the request events are: in the process that sends
(standalone), or on each worker and merged on the master from the workers' stats reports.

No Locust import here: the panel's logic is tested in the test process, which must not monkey-patch.
"""

from __future__ import annotations

import re
from collections import deque

from mmchaos import outcomes, schema
from mmchaos.signatures import Signatures

# Outcome columns of the panel: a recorded row's outcome, with HTTP errors split by status class.
CATEGORIES = ("ok", "4xx", "503", "5xx", "refused", "timeout", "aborted", "other")
_BY_OUTCOME = {schema.OK: "ok", schema.CONNECTION_ERROR: "refused", schema.TIMEOUT: "timeout",
               schema.ABORTED: "aborted"}
DRIFT_TEXT = "Multi-modal processor cache miss"  # what a 503 says when vLLM answers P0/P1 drift as retryable
WORKER_DRIFT_PER_REPORT = 20  # drift samples a worker sends per report (all are counted)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def category(status: int | None, outcome: str) -> str:
    if outcome != schema.HTTP_ERROR:
        return _BY_OUTCOME.get(outcome, "other")
    if status == 503:
        return "503"
    if status is not None and 400 <= status < 500:
        return "4xx"
    if status is not None and 500 <= status < 600:
        return "5xx"
    return "other"


def clean(text: str | None, limit: int = outcomes.ERROR_CHARS) -> str:
    """Server text for display: no terminal colour codes, one line, bounded. (Escaping is the UI's job: React
    renders it as text.)"""
    return _ANSI.sub("", text or "").replace("\r", " ").replace("\n", " ").strip()[:limit]


class Outcomes:
    """Counts of outcome categories per kind, the last error per kind, and drift 503 responses."""

    def __init__(self):
        self.counts: dict[str, dict[str, int]] = {}
        self.last_error: dict[str, str] = {}
        self.drift: deque[dict] = deque(maxlen=WORKER_DRIFT_PER_REPORT)  # latest samples: {"t", "kind", ...}
        self.drift_total = 0

    def add(self, kind: str, cat: str, t: float | None, error: str | None, drift_signature: str | None) -> None:
        row = self.counts.setdefault(kind, dict.fromkeys(CATEGORIES, 0))
        row[cat] += 1
        if error and cat != "ok":
            self.last_error[kind] = clean(error)
        if drift_signature:
            self.drift_total += 1
            self.drift.append({"t": t, "kind": kind, "error": clean(error), "signature": drift_signature})

    def merge(self, other: dict) -> list[dict]:
        """Add a worker's report (``to_report()``); returns the drift samples it carried."""
        for kind, cats in other.get("counts", {}).items():
            row = self.counts.setdefault(kind, dict.fromkeys(CATEGORIES, 0))
            for cat, n in cats.items():
                row[cat if cat in row else "other"] += int(n)
        self.last_error.update(other.get("last_error", {}))
        self.drift_total += int(other.get("drift_total", 0))
        return list(other.get("drift", []))

    def to_report(self) -> dict:
        return {"counts": self.counts, "last_error": self.last_error, "drift_total": self.drift_total,
                "drift": list(self.drift)}

    def __bool__(self) -> bool:
        return bool(self.counts)


def classify_request(sigs: Signatures, response, context, exception) -> tuple[str, str, str | None, str | None]:
    """(kind, category, error text, drift signature) of one request event, as the recorder sees it."""
    ctx = context or {}
    status = outcomes.status_of(response)
    exception = exception or getattr(response, "error", None)  # as in Recorder.on_request
    outcome = outcomes.outcome_of(status, exception, bool(ctx.get("abort")))
    error = None if outcome == schema.OK else outcomes.error_text(response, exception, status)
    drift = None
    if status == 503 and error and DRIFT_TEXT in error:
        m = sigs.match(error)
        drift = m.signature.name if m else "cache_miss_503"
    return ctx.get("kind") or "other", category(status, outcome), error, drift
