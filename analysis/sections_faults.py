"""The report's faults: per injected fault, what the user's probes and clients saw (analysis.fault_effects)."""

from __future__ import annotations

import pandas as pd

from .document import Doc
from .fault_effects import NOT_INJECTED, WEDGE_S
from .formatting import integer


def _s(x) -> str:
    return "—" if x is None or pd.isna(x) else f"{x:.1f} s"


def _n(x) -> int:
    return 0 if x is None or pd.isna(x) else int(x)


def in_words(e) -> str:
    """What the server did after one fault, as an operator would say it."""
    if e.verdict == NOT_INJECTED:
        return f"not injected ({e.outcome})"
    said = []
    if not pd.isna(e.exited_after_s):
        said.append(f"the server exited after {e.exited_after_s:.1f} s ({e.exit})")
    if e.health_200_without_service_s >= e.wedge_bound_s:
        said.append(f"it was wedged — /health 200 without service — for {e.health_200_without_service_s:.1f} s")
    elif e.health_200_without_service_s >= 1:
        said.append(f"/health answered 200 without service for {e.health_200_without_service_s:.1f} s")
    back = e.served_again_after_s
    said.append(
        f"it served again after {back:.1f} s" if not pd.isna(back) else "it had not served again when the trial ended"
    )
    counts = [
        f"{_n(x)} {what}"
        for x, what in (
            (e.failed, "requests failed"),
            (e.empty_2xx, "answers lost (2xx, no body)"),
            (e.cured_by_retries, "cured by retries"),
            (e.cut, "cut by the end of the run"),
        )
        if _n(x)
    ]
    quiet = "" if not pd.isna(e.exited_after_s) else "; no request failed"
    return "; ".join(said) + (f"; {', '.join(counts)}" if counts else quiet) + "."


def faults(doc: Doc, effects: pd.DataFrame) -> None:
    if effects.empty:
        return
    doc.h(2, "Faults")
    doc.bullets(
        [
            f"{e.config}, trial {integer(e.trial)}, {e.fault}: {in_words(e)} Verdict: {e.verdict}."
            for e in effects.itertuples()
        ]
    )
    doc.p(
        "Each fault injected into the server (a signal to a process mmchaos started, by the pid it recorded) or "
        "into the network between the load and the server (the fault proxy), and what followed it. Its outage runs "
        "from the injection to the first request started after it that was answered 2xx. 'Health 200 without "
        f"service' is the longest stretch of the outage /health answered 200: "
        f"{effects['wedge_bound_s'].max() if 'wedge_bound_s' in effects else WEDGE_S:g} s or more is a wedge "
        "(Kubernetes' default liveness probe, 10 s × 3, would not fire). Failed: valid requests whose last "
        "attempt failed; cured: requests a retry saved; cut: in flight at the end of the run; empty 2xx: answers "
        "the client recorded as 2xx with no body (data lost without an error; a fault fails on any). The "
        "client-side verdict judges the load outside these outages; a configuration that fails a fault fails."
    )
    doc.table(
        pd.DataFrame(
            {
                "configuration": effects["config"].astype(str),
                "trial": effects["trial"].map(integer),
                "fault": effects["fault"].astype(str),
                "pid": effects["target_pid"].map(lambda p: "—" if pd.isna(p) else str(int(p))),
                "at": effects["at_s"].map(lambda x: "—" if pd.isna(x) else f"{x:.1f} s"),
                "server exited after": effects.get("exited_after_s", pd.Series(dtype=float)).map(_s),
                "how": effects.get("exit", pd.Series(dtype=str)).fillna(""),
                "health 200 without service": effects.get("health_200_without_service_s", pd.Series(dtype=float)).map(
                    _s
                ),
                "served again after": effects.get("served_again_after_s", pd.Series(dtype=float)).map(_s),
                "failed": effects.get("failed", pd.Series(dtype=float)).map(
                    lambda x: "—" if pd.isna(x) else integer(x)
                ),
                "cured": effects.get("cured_by_retries", pd.Series(dtype=float)).map(
                    lambda x: "—" if pd.isna(x) else integer(x)
                ),
                "empty 2xx": effects.get("empty_2xx", pd.Series(dtype=float)).map(
                    lambda x: "—" if pd.isna(x) else integer(x)
                ),
                "cut": effects.get("cut", pd.Series(dtype=float)).map(lambda x: "—" if pd.isna(x) else integer(x)),
                "drift after": effects.get("drift_after", pd.Series(dtype=float)).map(
                    lambda x: "—" if pd.isna(x) else integer(x)
                ),
                "verdict": effects["verdict"].astype(str),
                "why": effects["why"].astype(str),
            }
        ),
        caption="Faults and what the user's probes and clients saw",
    )
