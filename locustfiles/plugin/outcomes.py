"""Outcomes by request kind for the live state of a run, counted where the request events are: in the process that
sends (standalone), or on each worker and merged on the master from the workers' stats reports. Beside the counts
by kind, the counts the verdict is judged on (mmchaos.verdict_rule).

No Locust import here: the panel's logic is tested in the test process, which must not monkey-patch.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import asdict, dataclass

from mmchaos import arrivals, outcomes, schema
from mmchaos.signatures import Signatures
from mmchaos.verdict_rule import Counts, attempt_counts

# Outcome columns of the panel: a recorded row's outcome, with HTTP errors split by status class.
CATEGORIES = ("ok", "4xx", "503", "5xx", "refused", "timeout", "aborted", "cut", "other")
_BY_OUTCOME = {
    schema.OK: "ok",
    schema.CONNECTION_ERROR: "refused",
    schema.TIMEOUT: "timeout",
    schema.ABORTED: "aborted",
    schema.CUT: "cut",
}
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


@dataclass(frozen=True)
class Attempt:
    """One request attempt as the recorder writes its row."""

    kind: str
    case: str | None
    status: int | None
    outcome: str
    expected_status: int | None
    final: bool
    error: str | None
    t: float | None
    drift: str | None  # the drift signature of a cache-miss answer
    lag_ms: float | None = None  # open loop: how late the arrival was sent (first attempts only)
    image_hashes: str | None = None  # comma-joined content hashes of its images (the cause of a drift is one's)
    request_id: str | None = None
    consistent: bool | None = None  # the wrong-answer oracle's comparison (None: not compared)
    endpoint: str | None = None  # the route it went to (a drift's cause may be a poison on another route)

    @property
    def category(self) -> str:
        return category(self.status, self.outcome)


def classify_request(sigs: Signatures, response, context, exception, start_time=None) -> Attempt:
    """A request event as the recorder sees it."""
    ctx = context or {}
    status = outcomes.status_of(response)
    exception = exception or getattr(response, "error", None)  # as in Recorder.on_request
    outcome = outcomes.outcome_of(status, exception, bool(ctx.get("abort")))
    error = None if outcome == schema.OK else outcomes.error_text(response, exception, status)
    return Attempt(
        ctx.get("kind") or "other",
        ctx.get("case"),
        status,
        outcome,
        ctx.get("expected_status"),
        bool(ctx.get("final", True)),
        error,
        start_time,
        sigs.drift_answer(status, error),
        ctx.get("sched_lag_ms"),
        ctx.get("image_hashes"),
        ctx.get("request_id"),
        ctx.get("consistent"),
        ctx.get("endpoint"),
    )


def cut_attempt(context, start_time=None) -> Attempt:
    ctx = context or {}
    return Attempt(
        ctx.get("kind") or "other",
        ctx.get("case"),
        None,
        schema.CUT,
        ctx.get("expected_status"),
        True,
        None,
        start_time,
        None,
        ctx.get("sched_lag_ms"),
        ctx.get("image_hashes"),
        ctx.get("request_id"),
        endpoint=ctx.get("endpoint"),
    )


class Outcomes:
    """Counts of outcome categories per kind, the last error per kind, drift answers, and the verdict's counts."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}
        self.last_error: dict[str, str] = {}
        self.drift: deque[dict] = deque(maxlen=WORKER_DRIFT_PER_REPORT)  # latest samples: {"t", "kind", ...}
        self.drift_total = 0
        self.verdict = Counts()
        self.lags = arrivals.LagCounts()  # open loop: the arrivals sent, by how late

    def add(self, a: Attempt) -> None:
        if a.lag_ms is not None:
            self.lags.add(a.lag_ms)
        row = self.counts.setdefault(a.kind, dict.fromkeys(CATEGORIES, 0))
        cat = a.category
        row[cat] += 1
        if a.error and cat != "ok":
            self.last_error[a.kind] = clean(a.error)
        if a.drift:
            self.drift_total += 1
            self.drift.append({"t": a.t, "kind": a.kind, "error": clean(a.error), "signature": a.drift})
        self.verdict += attempt_counts(
            a.kind,
            a.case,
            a.status,
            a.outcome,
            a.expected_status,
            a.final,
            a.drift is not None,
            consistent=a.consistent,
        )

    def merge(self, other: dict) -> list[dict]:
        """Add a worker's report (``to_report()``); returns the drift samples it carried."""
        for kind, cats in other.get("counts", {}).items():
            row = self.counts.setdefault(kind, dict.fromkeys(CATEGORIES, 0))
            for cat, n in cats.items():
                row[cat if cat in row else "other"] += int(n)
        self.last_error.update(other.get("last_error", {}))
        self.drift_total += int(other.get("drift_total", 0))
        known = set(Counts.__dataclass_fields__)
        self.verdict += Counts(**{k: int(v) for k, v in other.get("verdict", {}).items() if k in known})
        self.lags.merge(other.get("lags") or [])
        return list(other.get("drift", []))

    def to_report(self) -> dict:
        return {
            "counts": self.counts,
            "last_error": self.last_error,
            "drift_total": self.drift_total,
            "drift": list(self.drift),
            "verdict": asdict(self.verdict),
            "lags": self.lags.counts,
        }

    def __bool__(self) -> bool:
        return bool(self.counts)
