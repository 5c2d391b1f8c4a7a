"""The three-level verdict of a configuration, from counts: one rule for the report (counts from the rows) and
the web UI (counts from the live run).

The checks are the bug report's verification step, judged as a retrying client sees the server:

- the bad request fails alone: every malformed request got the status it was built to get (after retries);
- the server stays up: no crash, /health stays 200;
- normal requests keep succeeding: every valid request succeeded, at the latest after the client's retries;
- no cache drift: no drift line in the server log and no cache-miss answer;
- no retryable errors: every request got what it was built to get at its first attempt;
- repeated inputs get the same answer: every answer checked by the wrong-answer oracle agreed with its input's
  first answer (mmchaos.sameness).

Levels: ``fails`` (a crash, a failed health poll, a failure no retry cured, or a wrong answer), ``retryable`` (it
survives with retryable errors: drift or failed first attempts, all cured), ``clean``. A check the run could not
exercise (no malformed request was sent, nothing could poison the cache, ...) is "not exercised", never a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import NamedTuple

from mmchaos import schema
from mmchaos.outcomes import cause_of

FAILS, RETRYABLE, CLEAN = "fails", "retryable", "clean"
LEVELS = (FAILS, RETRYABLE, CLEAN)
TITLES = {FAILS: "fails", RETRYABLE: "survives with retryable errors", CLEAN: "clean"}
OK, FAILED, NOT_EXERCISED = "ok", "failed", "not exercised"
NOT_OBSERVED = "not observed"  # what the check needs was not watched (the server's log): it cannot say ok


class Check(NamedTuple):
    title: str  # what was hoped for
    level: str  # the level a failure of it means
    failed: str  # what a failure of it means, in the report's plain words


CHECKS = {
    "fails_alone": Check("the bad request fails alone", FAILS, "a bad request did not get its expected status"),
    "stays_up": Check("the server stays up (/health 200, no crash)", FAILS, "the server crashed"),
    "normal_ok": Check(
        "normal requests keep succeeding (after retries)", FAILS, "normal requests failed even after retries"
    ),
    "no_drift": Check("no cache drift (logged or answered)", RETRYABLE, "the caches drifted"),
    "first_try": Check(
        "no retryable errors (all at the first attempt)", RETRYABLE, "some requests failed at their first attempt"
    ),
    "same_answer": Check("repeated inputs get the same answer", FAILS, "a repeated input got a different answer"),
}


@dataclass
class Counts:
    """What a run (or a configuration's trials) showed. Requests cut by the end of a run are not counted."""

    crashes: int = 0
    health_polls: int = 0
    health_failed: int = 0
    attempts: int = 0  # requests sent, retries included
    server_attempts: int = 0  # of them, failed because of the server (cause "server")
    valid_groups: int = 0  # valid requests (a request and its retries are one group)
    valid_uncured: int = 0  # of them, still failed (by the server) after the last retry
    bad_groups: int = 0  # malformed requests
    bad_uncured: int = 0  # of them, not answered with their expected status after the last retry
    poison_sent: int = 0  # requests that can poison the cache: post-render failures, aborts
    drift_lines: int = 0  # drift lines in the server log
    drift_answers: int = 0  # cache-miss answers (vLLM's retryable 503)
    answers_checked: int = 0  # answers to a repeated input compared with its first answer (the oracle)
    wrong_answers: int = 0  # of them, a different answer
    logs_unread: int = 0  # runs whose server log nobody read (drift lines unseen: a run without --server-log)

    def __add__(self, other: Counts) -> Counts:
        return Counts(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


def is_poison(kind: str | None, case: str | None) -> bool:
    """A request that can leave P0's cache ahead of P1's (schema.POISON_KINDS and probe steps)."""
    return kind in schema.POISON_KINDS or (kind == "probe" and case in schema.POISON_PROBE_STEPS)


def attempt_counts(
    kind: str | None,
    case: str | None,
    status: int | None,
    outcome: str,
    expected_status: int | None,
    final: bool,
    drift_answer: bool,
    n: int = 1,
    consistent: bool | None = None,
) -> Counts:
    """What ``n`` alike attempts add to the counts. ``final``: the client's last attempt of its request (the one
    that says whether it was cured); ``drift_answer``: the server answered it with a cache miss; ``consistent``:
    the oracle's comparison with the input's first answer (None: not compared)."""
    if outcome == schema.CUT:
        return Counts()
    server = cause_of(status, outcome, expected_status) == schema.SERVER
    c = Counts(
        attempts=n,
        server_attempts=n * server,
        drift_answers=n * drift_answer,
        poison_sent=n * is_poison(kind, case),
        answers_checked=n * (consistent is not None),
        wrong_answers=n * (consistent is False),
    )
    if final and expected_status is not None:
        c.bad_groups, c.bad_uncured = n, n * server
    elif final and (kind in schema.VALID_KINDS or (kind == "probe" and case != "abort")):
        c.valid_groups, c.valid_uncured = n, n * server
    return c


POISON_ATTEMPTS = (
    "attempts that could poison the cache (post-render failures, aborts; those cut by the run's end aside)"
)


@dataclass
class Verdict:
    level: str
    checks: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (state, evidence sentence)

    @property
    def title(self) -> str:
        return TITLES[self.level]

    def failed(self) -> list[str]:
        return [CHECKS[n].title for n, (state, _) in self.checks.items() if state == FAILED]

    def not_exercised(self) -> list[str]:
        return [CHECKS[n].title for n, (state, _) in self.checks.items() if state == NOT_EXERCISED]


def _n(k: int, what: str) -> str:
    return f"{k:,} {what}"


def judge(c: Counts) -> Verdict:
    checks: dict[str, tuple[str, str]] = {}
    if c.bad_groups:
        checks["fails_alone"] = (
            FAILED if c.bad_uncured else OK,
            f"{c.bad_groups - c.bad_uncured:,} of {_n(c.bad_groups, 'malformed requests')} got their expected status",
        )
    else:
        checks["fails_alone"] = (NOT_EXERCISED, "no malformed request was sent")
    if c.health_polls or c.crashes:
        checks["stays_up"] = (
            FAILED if c.crashes or c.health_failed else OK,
            f"{_n(c.crashes, 'crash(es)')}, {c.health_failed:,} of {_n(c.health_polls, '/health polls')} failed",
        )
    else:
        checks["stays_up"] = (NOT_EXERCISED, "/health was not watched")
    if c.valid_groups:
        checks["normal_ok"] = (
            FAILED if c.valid_uncured else OK,
            f"{c.valid_groups - c.valid_uncured:,} of {_n(c.valid_groups, 'valid requests')} succeeded",
        )
    else:
        checks["normal_ok"] = (NOT_EXERCISED, "no valid request was sent")
    drift = c.drift_lines + c.drift_answers
    if drift:
        checks["no_drift"] = (
            FAILED,
            f"{_n(c.drift_lines, 'drift line(s)')} logged, {_n(c.drift_answers, 'cache-miss answer(s)')}",
        )
    elif c.poison_sent and c.logs_unread:
        checks["no_drift"] = (
            NOT_OBSERVED,
            f"no cache-miss answer after {_n(c.poison_sent, POISON_ATTEMPTS)}; drift lines are "
            "in the server's log, which this run does not read (give it with --server-log)",
        )
    elif c.poison_sent:
        checks["no_drift"] = (OK, f"none after {_n(c.poison_sent, POISON_ATTEMPTS)}")
    else:
        checks["no_drift"] = (NOT_EXERCISED, "no post-render failure or abort was sent: nothing could poison the cache")
    if c.attempts:
        checks["first_try"] = (
            FAILED if c.server_attempts else OK,
            f"{_n(c.server_attempts, 'attempt(s)')} of {c.attempts:,} failed because of the server",
        )
    else:
        checks["first_try"] = (NOT_EXERCISED, "no request was sent")
    if c.answers_checked:
        checks["same_answer"] = (
            FAILED if c.wrong_answers else OK,
            f"{_n(c.wrong_answers, 'wrong answer(s)')} of {_n(c.answers_checked, 'answers')} to a repeated input",
        )
    else:
        checks["same_answer"] = (NOT_EXERCISED, "no answer to a repeated input was compared with its first")
    failed_levels = {CHECKS[n].level for n, (state, _) in checks.items() if state == FAILED}
    level = FAILS if FAILS in failed_levels else RETRYABLE if failed_levels else CLEAN
    return Verdict(level, checks)
