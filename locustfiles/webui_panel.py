"""The state of the mmchaos panel of the web UI (see locustfiles/webui.py for how it is wired into Locust).

No Locust import here: the panel's logic is tested in the test process, which must not monkey-patch.
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque

from harness.crash_watch import LogTail
from harness.signatures import Signatures
from locustfiles.recorder import _error_text, _status, outcome_of
from mmchaos import schema

log = logging.getLogger("mmchaos")

# Outcome columns of the panel: a recorded row's outcome, with HTTP errors split by status class.
CATEGORIES = ("ok", "4xx", "503", "5xx", "refused", "timeout", "aborted", "other")
_BY_OUTCOME = {schema.OK: "ok", schema.CONNECTION_ERROR: "refused", schema.TIMEOUT: "timeout",
               schema.ABORTED: "aborted"}
DRIFT_TEXT = "Multi-modal processor cache miss"  # what a 503 says when vLLM answers P0/P1 drift as retryable
DRIFT_SIGNATURES = ("cache_drift", "cache_miss_503")  # log signatures shown as drift events
MM_CACHE_METRIC = re.compile(r"^vllm:\w*mm\w*cache_(hits|queries)(?:_total)?$")
HANG_AFTER = 10.0  # seconds of /health not answering at all, after ok, that count as a crash (hang)
RECENT_S = 10.0  # window of the "last 10 s" hit rate
STRIP_S = 60  # seconds shown in the health strip (one character per second)
MAX_EVENTS = 500  # kept; the tab shows the newest first
SHOWN_EVENTS = 200
SHOWN_SEGMENTS = 30
WORKER_DRIFT_PER_REPORT = 20  # drift samples a worker sends per report (all are counted)
ERROR_CHARS = 200
LOG_POLL_S = 0.25
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

TAB_EVENTS, TAB_OUTCOMES, TAB_SERVER = "mmchaos-events", "mmchaos-outcomes", "mmchaos-server"
TABS = [
    {"title": "mmchaos: events", "key": TAB_EVENTS},
    {"title": "mmchaos: outcomes", "key": TAB_OUTCOMES},
    {"title": "mmchaos: server", "key": TAB_SERVER},
]
TABLES = [
    {"key": TAB_EVENTS, "structure": [
        {"key": "time", "title": "Time (since start)"}, {"key": "event", "title": "Event"},
        {"key": "signature", "title": "Signature"}, {"key": "source", "title": "Source"},
        {"key": "detail", "title": "Detail"}]},
    {"key": TAB_OUTCOMES, "structure": [
        {"key": "kind", "title": "Kind"}, {"key": "total", "title": "Total"}, {"key": "ok", "title": "ok"},
        {"key": "c4xx", "title": "4xx"}, {"key": "c503", "title": "503"}, {"key": "c5xx", "title": "other 5xx"},
        {"key": "refused", "title": "refused"}, {"key": "timeout", "title": "timeout"},
        {"key": "aborted", "title": "aborted"}, {"key": "other", "title": "other"},
        {"key": "last_error", "title": "Last error"}]},
    {"key": TAB_SERVER, "structure": [{"key": "item", "title": "Item"}, {"key": "value", "title": "Value"}]},
]
_COLUMN = {"ok": "ok", "4xx": "c4xx", "503": "c503", "5xx": "c5xx", "refused": "refused", "timeout": "timeout",
           "aborted": "aborted", "other": "other"}


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


def clean(text: str | None, limit: int = ERROR_CHARS) -> str:
    """Server text for display: no terminal colour codes, one line, bounded. (Escaping is the UI's job: React
    renders it as text.)"""
    return _ANSI.sub("", text or "").replace("\r", " ").replace("\n", " ").strip()[:limit]


def clock(t: float | None) -> str:
    if t is None:
        return ""
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"


# -- outcomes: counted where the request events are ------------------------------------------------------------
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
    status = _status(response)
    exception = exception or getattr(response, "error", None)  # as in Recorder.on_request
    outcome = outcome_of(status, exception, bool(ctx.get("abort")))
    error = None if outcome == schema.OK else _error_text(response, exception, status)
    drift = None
    if status == 503 and error and DRIFT_TEXT in error:
        m = sigs.match(error)
        drift = m.signature.name if m else "cache_miss_503"
    return ctx.get("kind") or "other", category(status, outcome), error, drift


# -- the panel: the owner process's state ---------------------------------------------------------------------
class Panel:
    def __init__(self, sigs: Signatures, counts_source: str):
        self.sigs = sigs
        self.counts_source = counts_source
        self.reset(None)

    def reset(self, run_id: str | None) -> None:
        self.run_id = run_id
        self.t_start: float | None = time.time() if run_id is not None else None
        self.outcomes = Outcomes()
        self.workers: set[str] = set()
        self.events: deque[dict] = deque(maxlen=MAX_EVENTS)
        self.event_counts: dict[tuple[str, str], int] = {}
        self.options: dict = {}  # the run's mmchaos options, as the run started (form changes included)
        # health
        self.watchers = None
        self.watching = False
        self.health_state: str | None = None
        self.health_since: float | None = None
        self.last_ok: float | None = None
        self.no_answer_since: float | None = None
        self.polls = self.polls_ok = 0
        self.segments: deque[dict] = deque(maxlen=500)
        self.recent_polls: deque[tuple[float, bool]] = deque()
        self.open_crash: dict | None = None
        # metrics
        self.scrapes: deque[dict] = deque(maxlen=600)  # {"t", "hits", "queries"} of scrapes with mm counters
        self.last_scrape_t: float | None = None
        self.mm_names: set[str] = set()
        self.first_scrape: dict | None = None
        # server log
        self.server_log: str | None = None
        self.log_error: str | None = None
        self.log_lines = self.classified = 0
        self.epoch_fatal: list = []  # fatal lines since the run started or the server last recovered

    # events
    def _event(self, t: float, event: str, signature: str, source: str, detail: str) -> dict:
        e = {"t": t, "event": event, "signature": signature, "source": source, "detail": clean(detail, 500)}
        self.events.append(e)
        key = (event, signature)
        self.event_counts[key] = self.event_counts.get(key, 0) + 1
        return e

    # outcomes (standalone: from the request event; master: from the workers' reports)
    def on_request(self, response=None, context=None, exception=None, start_time=None, **_) -> None:
        kind, cat, error, drift = classify_request(self.sigs, response, context, exception)
        self.outcomes.add(kind, cat, start_time, error, drift)
        if drift:
            self._drift_event({"t": start_time, "kind": kind, "error": error, "signature": drift})

    def on_worker_report(self, client_id: str, report: dict) -> None:
        self.workers.add(client_id)
        for d in self.outcomes.merge(report):
            self._drift_event(d)

    def _drift_event(self, d: dict) -> None:
        self._event(d.get("t") or time.time(), "drift", d.get("signature") or "cache_miss_503", "response",
                    f"{d.get('kind')}: HTTP 503 {d.get('error') or ''}")

    # health (the watchers' on_health callback)
    def on_health(self, row: dict) -> None:
        t, ok = row["t"], bool(row.get("ok"))
        status, err = row.get("status"), row.get("error") or ""
        if ok:
            state = "ok"
        elif status is not None:
            state = f"HTTP {status}"
        elif "timeout" in err.lower() or "timed out" in err.lower():
            state = "no answer"
        else:
            state = "refused"  # nobody listening, or the connection reset
        self.polls += 1
        self.polls_ok += ok
        self.recent_polls.append((t, ok))
        while self.recent_polls and self.recent_polls[0][0] < t - STRIP_S - 1:
            self.recent_polls.popleft()
        if self.segments and self.segments[-1]["state"] == state:
            self.segments[-1]["to"] = t
            self.segments[-1]["polls"] += 1
        else:
            self.segments.append({"from": t, "to": t, "state": state, "polls": 1})
            self.health_state, self.health_since = state, t
        if ok:
            if self.open_crash is not None:
                self._event(t, "recovered", "", "health", f"/health ok again after {t - self.open_crash['t']:.1f} s")
                self.open_crash = None
                self.epoch_fatal = []
            self.last_ok, self.no_answer_since = t, None
            return
        detail = f"/health: {state}" + (f" ({err})" if err else "")
        if state == "no answer":
            self.no_answer_since = self.no_answer_since or t
            if self.last_ok is not None and self.open_crash is None and t - self.no_answer_since >= HANG_AFTER:
                self._crash(t, f"{detail} for {t - self.no_answer_since:.0f} s after ok", hang=True)
            return
        self.no_answer_since = None
        if self.open_crash is None:
            if self.last_ok is not None:
                self._crash(t, f"{detail}, after ok at {clock(self.last_ok)}")
            elif self.polls == 1:
                self._event(t, "down", self._crash_signature(), "health", f"{detail} when the run started")

    def _crash(self, t: float, detail: str, hang: bool = False) -> None:
        self.open_crash = self._event(t, "crash", "hang" if hang else self._crash_signature(), "health", detail)

    def _crash_signature(self) -> str:
        if not self.server_log:
            return "unclassified (no --server-log)"
        return self.sigs.classify_crash(self.epoch_fatal)

    # metrics (rows as the watchers write them)
    def on_metric(self, row: dict) -> None:
        t = row["t"]
        self.last_scrape_t = t
        m = MM_CACHE_METRIC.match(row["name"])
        if not m:
            return
        self.mm_names.add(row["name"])
        if not self.scrapes or self.scrapes[-1]["t"] != t:
            self.scrapes.append({"t": t, "hits": 0.0, "queries": 0.0})
            self.first_scrape = self.first_scrape or self.scrapes[-1]
        self.scrapes[-1][m.group(1)] += row["value"]

    # server log
    def read_log(self, tail: LogTail) -> None:
        now = time.time()
        for line in tail.new_lines():
            self.log_lines += 1
            m = self.sigs.match(line)
            if not m:
                continue
            self.classified += 1
            name = m.signature.name
            event = "drift" if name in DRIFT_SIGNATURES else ("fatal log" if m.signature.fatal else "log")
            detail = clean(m.line, 500)
            if m.mm_hash and m.mm_hash not in detail:
                detail = f"[mm_hash {m.mm_hash}] {detail}"
            self._event(now, event, name, "server log", detail)
            if m.signature.fatal:
                self.epoch_fatal.append(m)
                if self.open_crash is not None and self.open_crash["signature"] != "hang":
                    self.open_crash["signature"] = self.sigs.classify_crash(self.epoch_fatal)

    # views
    def hit_rate(self) -> dict:
        if self.last_scrape_t is None:
            available = getattr(self.watchers, "metrics_available", None)
            if not self.watching:
                text = "n/a (/metrics not watched)"
            elif available is None:
                text = "n/a (no /metrics scrape yet)"
            elif available:
                text = "n/a (this server's /metrics has no vLLM samples)"
            else:
                text = "n/a (this server has no /metrics)"
            return {"available": False, "text": text}
        if not self.scrapes:
            return {"available": False, "text": "n/a (this server's /metrics has no mm-cache counters)"}
        last = self.scrapes[-1]
        out = {"available": True, "t": last["t"], "hits": last["hits"], "queries": last["queries"],
               "names": sorted(self.mm_names)}
        out["cumulative"] = last["hits"] / last["queries"] if last["queries"] else None
        first = self.first_scrape
        dq = last["queries"] - first["queries"]
        out["run"] = (last["hits"] - first["hits"]) / dq if dq > 0 else None
        older = [s for s in self.scrapes if s["t"] <= last["t"] - RECENT_S]
        base = older[-1] if older else first
        dq = last["queries"] - base["queries"]
        out["recent"] = (last["hits"] - base["hits"]) / dq if dq > 0 else None
        return out

    def strip(self, now: float) -> str:
        """One character per second of the run's last STRIP_S s, oldest first: █ all polls ok, ░ some failed,
        · no poll answered or sent."""
        worst: dict[int, bool] = {}
        for t, ok in self.recent_polls:
            s = int(now - t)
            if 0 <= s < STRIP_S:
                worst[s] = worst.get(s, True) and ok
        width = min(STRIP_S, int(now - self.t_start) + 1) if self.t_start else STRIP_S
        return "".join("·" if s not in worst else ("█" if worst[s] else "░") for s in reversed(range(width)))

    def state(self, runner_state: str | None = None) -> dict:
        now = time.time()
        kinds = {}
        total = dict.fromkeys(CATEGORIES, 0)
        order = [k for k in schema.KINDS if k in self.outcomes.counts]
        order += sorted(k for k in self.outcomes.counts if k not in schema.KINDS)
        for k in order:
            c = self.outcomes.counts[k]
            kinds[k] = {**c, "total": sum(c.values())}
            for cat in CATEGORIES:
                total[cat] += c[cat]
        total["total"] = sum(total[c] for c in CATEGORIES)
        return {
            "run_id": self.run_id,
            "runner_state": runner_state,
            "options": self.options,
            "t_start": self.t_start,
            "now": now,
            "counts_source": self.counts_source,
            "workers_reporting": len(self.workers),
            "outcomes": {"categories": list(CATEGORIES), "kinds": kinds, "total": total,
                         "last_error": dict(self.outcomes.last_error), "drift_503": self.outcomes.drift_total},
            "health": {"watching": self.watching, "state": self.health_state, "since": self.health_since,
                       "last_ok": self.last_ok, "polls": self.polls, "polls_ok": self.polls_ok,
                       "strip": self.strip(now), "segments": list(self.segments)[-SHOWN_SEGMENTS:]},
            "events": list(self.events)[::-1][:SHOWN_EVENTS],
            "event_counts": [{"event": e, "signature": s, "count": n}
                             for (e, s), n in sorted(self.event_counts.items())],
            "mm_cache": self.hit_rate(),
            "server_log": {"path": self.server_log, "lines_read": self.log_lines, "error": self.log_error,
                           "classified": self.classified},
        }

    def tables(self, runner_state: str | None = None) -> list[dict]:
        """The rows of the three tabs (``extended_stats`` of /stats/requests)."""
        st = self.state(runner_state)
        t0 = self.t_start or 0.0
        ev = [{"time": clock(e["t"]) + (f" (+{e['t'] - t0:.1f} s)" if self.t_start else ""), "event": e["event"],
               "signature": e["signature"], "source": e["source"], "detail": e["detail"]} for e in st["events"]]
        if not ev:
            ev = [{"time": clock(st["now"]), "event": "(none yet)", "detail": "no crash, drift or classified log "
                   "line so far" + ("" if self.server_log else "; pass --server-log to classify the server's log")}]
        out = []
        rows = list(st["outcomes"]["kinds"].items()) + [("all", st["outcomes"]["total"])]
        for kind, c in rows:
            r = {"kind": kind, "total": c["total"], **{_COLUMN[cat]: c[cat] for cat in CATEGORIES}}
            r["last_error"] = st["outcomes"]["last_error"].get(kind, "")
            out.append(r)
        return [{"key": TAB_EVENTS, "data": ev}, {"key": TAB_OUTCOMES, "data": out},
                {"key": TAB_SERVER, "data": self._server_rows(st)}]

    def _server_rows(self, st: dict) -> list[dict]:
        h, now = st["health"], st["now"]
        rows = []

        def add(item, value):
            rows.append({"item": item, "value": value})

        if not h["watching"]:
            add("health", "not watched (--no-watch, or no host)")
        elif h["state"] is None:
            add("health", "no poll yet")
        else:
            add("health now", f"{h['state']} since {clock(h['since'])} ({now - h['since']:.1f} s)")
            add(f"health, last {STRIP_S} s (█ ok, ░ failing, 1 char/s)", h["strip"])
            add("health polls", f"{h['polls']} ({h['polls'] - h['polls_ok']} failed)")
        mm = st["mm_cache"]
        if mm["available"]:
            def pct(x):
                return "n/a (no queries)" if x is None else f"{100 * x:.1f}%"
            add("mm-cache hit rate, this run", pct(mm["run"]))
            add(f"mm-cache hit rate, last {RECENT_S:.0f} s", pct(mm["recent"]))
            add("mm-cache hit rate, since server start",
                f"{pct(mm['cumulative'])} ({mm['hits']:.0f} hits / {mm['queries']:.0f} queries at {clock(mm['t'])})")
            add("mm-cache metrics", ", ".join(mm["names"]))
        else:
            add("mm-cache hit rate", mm["text"])
        weights = {k[len("weight_"):]: v for k, v in st["options"].items() if k.startswith("weight_")}
        if weights:
            add("mix weights, this run", ", ".join(f"{k} {v}" for k, v in weights.items()))
        o = st["outcomes"]
        add("requests", f"{o['total']['total']} ({o['total']['ok']} ok), drift 503s: {o['drift_503']}")
        add("outcome counts from", st["counts_source"] + (f" ({st['workers_reporting']} reporting)"
                                                          if "worker" in st["counts_source"] else ""))
        sl = st["server_log"]
        if sl["path"]:
            add("server log", f"{sl['path']}: {sl['lines_read']} lines read, {sl['classified']} classified"
                + (f"; {sl['error']}" if sl["error"] else ""))
        else:
            add("server log", "not given (--server-log PATH classifies crashes and drift from it)")
        for c in st["event_counts"]:
            add(f"events: {c['event']}" + (f" / {c['signature']}" if c["signature"] else ""), str(c["count"]))
        for s in reversed(h["segments"]):
            add(f"health {clock(s['from'])} → {clock(s['to'])}", f"{s['state']} ({s['polls']} polls, "
                f"{s['to'] - s['from']:.1f} s)")
        return rows


def _norm(name: str) -> str:
    return name.replace("_", "").lower()


def apply_mangled_form_fields(parsed_options, form) -> list[str]:
    """The web UI's form renames fields snake -> camel -> snake on the way, which is not a round trip for names
    with digits (``base64_fraction`` comes back as ``base_64_fraction``), and Locust's /swarm drops fields it
    does not know. Apply those to the option they came from, converted as /swarm converts. Returns the names."""
    known = vars(parsed_options)
    by_norm = {_norm(k): k for k in known}
    applied = []
    for key, value in form.items():
        name = by_norm.get(_norm(key))
        if key in known or name is None:
            continue
        current = known[name]
        try:
            if isinstance(current, bool):
                known[name] = value == "true"
            elif current is None or isinstance(current, list):
                known[name] = value
            else:
                known[name] = type(current)(value)
        except ValueError:
            log.error("mmchaos: form field %s: %r is not a valid %s", name, value, type(current).__name__)
            continue
        applied.append(name)
    return applied


class MetricsTee:
    """Stands in for the watchers' metrics writer: writes as before and shows each row to the panel."""

    def __init__(self, writer, observe):
        self._writer, self._observe = writer, observe

    def add(self, row: dict) -> None:
        self._writer.add(row)
        try:
            self._observe(row)
        except Exception:  # the panel must never cost the watchers a row
            log.exception("mmchaos panel: metrics row")

    def __getattr__(self, name):
        return getattr(self._writer, name)
