"""The run's gates, Locust-style: limits on crashes, on the share of valid requests the server failed (after the
client's retries), on wrong answers to repeated inputs (the wrong-answer oracle), on the p95 latency of valid
requests and, open loop, on the share of the requests due that the generator sent (achieved / asked rate). The
run's exit code follows them: 0 when every gate holds, 1 when one fails (one line each says which), 2 when the
run could not run.

No Locust import here: tested in the test process, which must not monkey-patch.
"""

from __future__ import annotations

from dataclasses import dataclass

from mmchaos.verdict_rule import Counts

PASSED, FAILED, NOT_CHECKED = "passed", "failed", "not checked"


@dataclass(frozen=True)
class Gate:
    option: str  # the custom argument that sets it
    limit: float
    value: float | None
    state: str
    text: str

    @property
    def flag(self) -> str:
        return "--" + self.option.replace("_", "-")


def _gate(option: str, limit: float, value: float | None, fmt, what: str, missing: str) -> Gate:
    if value is None:
        return Gate(option, limit, None, NOT_CHECKED, f"{what}: not checked ({missing})")
    state = PASSED if value <= limit else FAILED
    sign = "<=" if state == PASSED else ">"
    return Gate(option, limit, value, state, f"{what} {fmt(value)} {sign} --{option.replace('_', '-')} {fmt(limit)}")


def _at_least(option: str, limit: float, value: float | None, fmt, what: str, missing: str) -> Gate:
    if value is None:
        return Gate(option, limit, None, NOT_CHECKED, f"{what}: not checked ({missing})")
    state = PASSED if value >= limit else FAILED
    sign = ">=" if state == PASSED else "<"
    return Gate(option, limit, value, state, f"{what} {fmt(value)} {sign} --{option.replace('_', '-')} {fmt(limit)}")


def evaluate(
    options, counts: Counts, crashes: int | None, p95_ms: float | None, rate_held: float | None = None
) -> list[Gate]:
    """``crashes``: None when /health was not watched; ``p95_ms``: None when no valid request succeeded;
    ``rate_held``: open loop, the requests sent over those due (None when none was due)."""
    gates = [_gate("max_crashes", options.max_crashes, crashes, lambda v: f"{v:.0f}", "crashes", "/health not watched")]
    if options.max_server_error_ratio < 1:
        ratio = counts.valid_uncured / counts.valid_groups if counts.valid_groups else None
        gates.append(
            _gate(
                "max_server_error_ratio",
                options.max_server_error_ratio,
                ratio,
                lambda v: f"{v:.2%}",
                "valid requests failed by the server after retries",
                "no valid request was sent",
            )
        )
    if getattr(options, "consistency_sample", 0) > 0:  # the wrong-answer oracle is on
        gates.append(
            _gate(
                "max_wrong_answers",
                getattr(options, "max_wrong_answers", 0),
                counts.wrong_answers if counts.answers_checked else None,
                lambda v: f"{v:.0f}",
                "wrong answers to repeated inputs",
                "no answer to a repeated input was compared",
            )
        )
    if options.max_p95_ms > 0:
        gates.append(
            _gate(
                "max_p95_ms",
                options.max_p95_ms,
                p95_ms,
                lambda v: f"{v:.0f} ms",
                "p95 latency of valid requests",
                "no valid request was answered",
            )
        )
    if getattr(options, "rate", 0) and getattr(options, "min_rate_ratio", 0) > 0:
        gates.append(
            _at_least(
                "min_rate_ratio",
                options.min_rate_ratio,
                rate_held,
                lambda v: f"{v:.1%}",
                f"requests sent of those due at --rate {options.rate:g}",
                "no request was due",
            )
        )
    return gates


def exit_code(gates: list[Gate]) -> int:
    return 1 if any(g.state == FAILED for g in gates) else 0
