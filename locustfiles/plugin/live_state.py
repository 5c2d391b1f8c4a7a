"""The live state of a run, in the process that owns the test (master or standalone): events (crash, drift,
recovery, classified log lines), outcomes by kind, server health over time, mm-cache hit rate, the three-level
verdict and the gates. The web UI's mmchaos tabs and timeline page show it; the gates set the run's exit code from
it, with or without the web UI.

No Locust import here: the live state's logic is tested in the test process, which must not monkey-patch.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import asdict

from mmchaos import arrivals, cause_rule, schema
from mmchaos.health_rule import HANG, NO_ANSWER, OK, HealthRule, health_state
from mmchaos.logtail import LogTail
from mmchaos.signatures import Signatures
from mmchaos.verdict_rule import CHECKS, Counts, judge

from . import gates
from .outcomes import CATEGORIES, Attempt, Outcomes, clean

MM_CACHE_METRIC = re.compile(r"^vllm:\w*mm\w*cache_(hits|queries)(?:_total)?$")
RECENT_S = 10.0  # window of the "last 10 s" hit rate
MAX_EVENTS = 500  # kept; the tab shows the newest first
USES_PER_IMAGE = 32  # an image's latest requests kept to find an incident's cause (cause_rule)
REQUESTS_KEPT = 20000  # request id -> its images, for the drift lines that name a request
SHOWN_EVENTS = 200
SHOWN_SEGMENTS = 30
LOG_POLL_S = 0.25
TIMELINE_POINTS = 600  # mm-cache hit-rate points kept for the timeline (one per /metrics scrape)


def clock(t: float | None) -> str:
    if t is None:
        return ""
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"


class LiveState:
    def __init__(self, sigs: Signatures, counts_source: str, redact=lambda text: text):
        self.sigs = sigs
        self.counts_source = counts_source
        self.redact = redact  # what the state shows of server text: never a secret
        # set by the wiring: the p95 latency of valid requests, from Locust's stats; open loop: the requests due so
        # far, from the pacers
        self.p95_ms: Callable[[], float | None] = lambda: None
        self.due: Callable[[], int] = lambda: 0
        self.fault_relay = None  # fault_form.FaultRelay: the faults of a server mmchaos started (--fault-control)
        self.reset(None)

    def reset(self, run_id: str | None) -> None:
        self.run_id = run_id
        self.t_start: float | None = time.time() if run_id is not None else None
        self.outcomes = Outcomes()
        self.worker_dues: dict[str, int] = {}  # master, open loop: each worker's requests due, as last reported
        self.workers: set[str] = set()
        self.events: deque[dict] = deque(maxlen=MAX_EVENTS)
        self.event_counts: dict[tuple[str, str], int] = {}
        self.options: dict = {}  # the run's mmchaos options, as the run started (form changes included)
        self.crashes = 0
        self.drift_lines = 0
        # standalone: every attempt's images, so an incident names its cause (a master sees counts only)
        self.uses: dict[str, deque[cause_rule.Use]] = {}
        self.images_of: OrderedDict[str, list[str]] = OrderedDict()
        self.image_of_mm: dict[str, str] = {}  # vLLM's mm_hash -> our image, learned from one-image requests
        self.last_cause: str | None = None  # of the last drift line of this server's life: its crash's
        self.pending: dict[str, tuple[dict, object]] = {}  # a drift line's request not answered yet: its event, match
        # health
        self.watchers = None
        self.watching = False
        self.rule = HealthRule()
        self.health_state: str | None = None
        self.health_since: float | None = None
        self.polls = self.polls_ok = 0
        self.segments: deque[dict] = deque(maxlen=500)
        self.open_crash: dict | None = None
        # metrics
        self.scrapes: deque[dict] = deque(maxlen=TIMELINE_POINTS)  # {"t", "hits", "queries"} of scrapes
        self.last_scrape_t: float | None = None
        self.mm_names: set[str] = set()
        self.first_scrape: dict | None = None
        # server log
        self.server_log: str | None = None
        self.log_error: str | None = None
        self.log_lines = self.classified = 0
        self.epoch_fatal: list = []  # fatal lines since the run started or the server last recovered

    @property
    def last_ok(self) -> float | None:
        return self.rule.last_ok

    # events
    def _event(self, t: float, event: str, signature: str, source: str, detail: str, cause: str | None = None) -> dict:
        e = {
            "t": t,
            "event": event,
            "signature": signature,
            "source": source,
            "detail": clean(self.redact(detail), 500),
            "cause": cause,
        }
        self.events.append(e)
        key = (event, signature)
        self.event_counts[key] = self.event_counts.get(key, 0) + 1
        return e

    # outcomes (standalone: from the request event; master: from the workers' reports)
    def on_attempt(self, a: Attempt) -> None:
        self.outcomes.add(a)
        images = a.image_hashes.split(",") if a.image_hashes else []
        me = None
        if a.t:
            me = cause_rule.Use(a.t, a.kind, a.case, a.status, a.outcome, a.request_id, time.time(), a.endpoint)
        if a.drift:
            cause = self._cause(images, a.t or time.time(), a.request_id, me)
            self._drift_event({"t": a.t, "kind": a.kind, "error": a.error, "signature": a.drift}, cause)
        if a.request_id and images:
            self.images_of[a.request_id] = images
            while len(self.images_of) > REQUESTS_KEPT:
                self.images_of.popitem(last=False)
        if a.request_id in self.pending:  # the drift line came before its request's answer
            event, m = self.pending.pop(a.request_id)
            event["cause"] = self._cause(self._named_images(m), event["t"], a.request_id, me)
            if self.open_crash is not None and self.open_crash["cause"] is None:
                self.open_crash["cause"] = self.last_cause
        if me is not None:
            for h in images:
                self.uses.setdefault(h, deque(maxlen=USES_PER_IMAGE)).append(me)

    def _cause(
        self, images: list[str], t: float, request_id: str | None, named: cause_rule.Use | None = None
    ) -> str | None:
        """The incident's cause (mmchaos/cause_rule.py) among the uses of each image the server named (the earliest
        of its images'); without one, a race of the image's first uses beside the missed request ``named`` (as
        recorded when it was answered, if it was)."""
        if named is None and request_id:
            named = next((u for h in images for u in self.uses.get(h, ()) if u.request_id == request_id), None)
        found, race = None, None
        for h in images:
            uses = [u for u in self.uses.get(h, ()) if u.request_id != request_id or u.request_id is None]
            c = cause_rule.cause(uses, t)
            if c is not None and (found is None or c.t < found.t):
                found = c
            r = cause_rule.first_use_at_once(uses, named) if named is not None else None
            if r is not None and (race is None or r.t < race.t):
                race = r
        if found is not None:
            self.last_cause = cause_rule.describe(found, t)
        else:
            self.last_cause = cause_rule.describe(race, t, at_once=True) if race is not None else None
        return self.last_cause

    def _named_images(self, m) -> list[str]:
        """The images a drift line names: the one its mm_hash is known to be, else all of its request's."""
        images = self.images_of.get(m.request_id or "", [])
        if m.mm_hash and len(images) == 1:
            self.image_of_mm.setdefault(m.mm_hash, images[0])
        known = self.image_of_mm.get(m.mm_hash or "")
        return [known] if known else images

    def on_worker_report(self, client_id: str, report: dict) -> None:
        self.workers.add(client_id)
        for d in self.outcomes.merge(report):
            self._drift_event(d)

    def _drift_event(self, d: dict, cause: str | None = None) -> None:
        self._event(
            d.get("t") or time.time(),
            "drift",
            d.get("signature") or "cache_miss_503",
            "response",
            f"{d.get('kind')}: HTTP 503 {d.get('error') or ''}",
            cause,
        )

    # health (the watchers' on_health callback)
    def on_health(self, row: dict) -> None:
        t, ok, err = row["t"], bool(row.get("ok")), row.get("error") or ""
        state = health_state(ok, row.get("status"), err)
        was_down, last_ok, silent_since = self.rule.down, self.rule.last_ok, self.rule.silent_since
        crash = self.rule.observe(t, state)
        self.polls += 1
        self.polls_ok += ok
        if self.segments and self.segments[-1]["state"] == state:
            self.segments[-1]["to"] = t
            self.segments[-1]["polls"] += 1
        else:
            self.segments.append({"from": t, "to": t, "state": state, "polls": 1})
            self.health_state, self.health_since = state, t
        if state == OK:
            if was_down:
                assert self.open_crash is not None  # down only after a crash, which opened one
                self._event(t, "recovered", "", "health", f"/health ok again after {t - self.open_crash['t']:.1f} s")
                self.open_crash = None
                self.epoch_fatal = []
                self.uses, self.last_cause = {}, None  # a new server's life: its caches start empty
            return
        detail = f"/health: {state}" + (f" ({err})" if err else "")
        if crash == HANG:
            self.crashes += 1
            self.open_crash = self._event(
                t,
                "crash",
                HANG,
                "health",
                f"{detail} for {t - silent_since:.0f} s after ok" if silent_since else detail,
                self.last_cause,
            )
        elif crash:
            self.crashes += 1
            self.open_crash = self._event(
                t,
                "crash",
                self._crash_signature(),
                "health",
                f"{detail}, after ok at {clock(last_ok)}",
                self.last_cause,
            )
        elif state != NO_ANSWER and last_ok is None and self.polls == 1:
            self._event(t, "down", self._crash_signature(), "health", f"{detail} when the run started")

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
            sig = m.signature
            event = "fatal log" if sig.fatal else ("drift" if sig.drift else "log")
            self.drift_lines += sig.drift
            detail = clean(m.line, 500)
            if m.mm_hash and m.mm_hash not in detail:
                detail = f"[mm_hash {m.mm_hash}] {detail}"
            named = self._named_images(m) if sig.drift else []
            cause = self._cause(named, now, m.request_id) if named else None
            e = self._event(now, event, sig.name, "server log", detail, cause)
            if sig.drift and not named and m.request_id:
                self.pending[m.request_id] = (e, m)
                while len(self.pending) > MAX_EVENTS:
                    self.pending.pop(next(iter(self.pending)))
            if sig.fatal:
                self.epoch_fatal.append(m)
                if self.open_crash is not None and self.open_crash["signature"] != HANG:
                    self.open_crash["signature"] = self.sigs.classify_crash(self.epoch_fatal)

    # judgement
    def counts(self) -> Counts:
        return self.outcomes.verdict + Counts(
            crashes=self.crashes,
            health_polls=self.polls,
            health_failed=self.polls - self.polls_ok,
            drift_lines=self.drift_lines,
            logs_unread=0 if self.server_log else 1,
        )

    def verdict(self) -> dict:
        v = judge(self.counts())
        return {
            "level": v.level,
            "title": v.title,
            "checks": [
                {"check": n, "title": CHECKS[n].title, "state": st, "evidence": why}
                for n, (st, why) in v.checks.items()
            ],
        }

    def open_loop(self) -> dict | None:
        """Open loop: the asked rate against what was sent, and how late (None in closed loop)."""
        rate = self.options.get("rate") or 0
        if not rate:
            return None
        lags, due = self.outcomes.lags, self.due()
        return {
            "rate": rate,
            "arrival": self.options.get("arrival"),
            "due": due,
            "sent": lags.total,
            "held": arrivals.held(lags.total, due),
            "lag_p50_ms": lags.percentile(0.5),
            "lag_p99_ms": lags.percentile(0.99),
        }

    def gates(self, options) -> list[gates.Gate]:
        ol = self.open_loop()
        return gates.evaluate(
            options, self.counts(), self.crashes if self.watching else None, self.p95_ms(), ol["held"] if ol else None
        )

    # views
    def hit_rate_series(self) -> list[dict]:
        """mm-cache hit rate between consecutive scrapes: {"t", "rate"} (rate None when nothing was queried)."""
        out = []
        for a, b in zip(self.scrapes, list(self.scrapes)[1:]):
            dq = b["queries"] - a["queries"]
            out.append({"t": b["t"], "rate": (b["hits"] - a["hits"]) / dq if dq > 0 else None})
        return out

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
        out = {
            "available": True,
            "t": last["t"],
            "hits": last["hits"],
            "queries": last["queries"],
            "names": sorted(self.mm_names),
        }
        out["cumulative"] = last["hits"] / last["queries"] if last["queries"] else None
        first = self.first_scrape
        assert first is not None  # kept with the first of the scrapes
        dq = last["queries"] - first["queries"]
        out["run"] = (last["hits"] - first["hits"]) / dq if dq > 0 else None
        older = [s for s in self.scrapes if s["t"] <= last["t"] - RECENT_S]
        base = older[-1] if older else first
        dq = last["queries"] - base["queries"]
        out["recent"] = (last["hits"] - base["hits"]) / dq if dq > 0 else None
        return out

    def state(self, runner_state: str | None = None, options=None) -> dict:
        """Everything the web UI shows (``options``: the run's parsed options, for the gates)."""
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
            "outcomes": {
                "categories": list(CATEGORIES),
                "kinds": kinds,
                "total": total,
                "last_error": {k: self.redact(v) for k, v in self.outcomes.last_error.items()},
                "drift_503": self.outcomes.drift_total,
            },
            "health": {
                "watching": self.watching,
                "state": self.health_state,
                "since": self.health_since,
                "last_ok": self.last_ok,
                "polls": self.polls,
                "polls_ok": self.polls_ok,
                "segments": list(self.segments)[-SHOWN_SEGMENTS:],
            },
            "events": list(self.events)[::-1][:SHOWN_EVENTS],
            "event_counts": [
                {"event": e, "signature": s, "count": n} for (e, s), n in sorted(self.event_counts.items())
            ],
            "mm_cache": self.hit_rate(),
            "server_log": {
                "path": self.server_log,
                "lines_read": self.log_lines,
                "error": self.log_error,
                "classified": self.classified,
            },
            "verdict": self.verdict(),
            "faults": list(self.fault_relay.rows) if self.fault_relay is not None else [],
            "open_loop": self.open_loop(),
            "gates": [asdict(g) for g in self.gates(options)] if options is not None else [],
            "timeline": {
                "segments": list(self.segments),
                "hit_rate": self.hit_rate_series(),
                "events": [e for e in self.events if e["event"] in ("crash", "drift", "recovered", "down")],
            },
        }
