"""Kaplan–Meier survival of trials until their first crash (censored at trial end)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy import stats

from .intervals import CONFIDENCE


def kaplan_meier(durations, observed, confidence: float = CONFIDENCE) -> pd.DataFrame:
    """The Kaplan–Meier estimate of S(t) = P(no crash by t) (``scipy.stats.ecdf`` on censored data).

    ``durations``: time (or requests) until the first crash, or until the trial ended when it did not crash;
    ``observed``: True when a crash ended the duration, False when it was censored.
    Returns one row per distinct time (plus t=0): t, at_risk, events, censored, survival, and a pointwise
    interval (Greenwood variance on the log(-log) scale, so it stays within [0, 1]; where S is 0 or 1 the
    interval is the point).
    """
    d = np.asarray(durations, dtype=float)
    e = np.asarray(observed, dtype=bool)
    keep = ~np.isnan(d)
    d, e = d[keep], e[keep]
    start = pd.DataFrame(
        {"t": [0.0], "at_risk": [len(d)], "events": [0], "censored": [0], "survival": [1.0], "lo": [1.0], "hi": [1.0]}
    )
    if not len(d):
        return start
    sf = stats.ecdf(stats.CensoredData(uncensored=d[e], right=d[~e])).sf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # undefined where S is 0 or 1: handled below
        ci = sf.confidence_interval(confidence, method="log-log")
    times, surv = sf.quantiles, sf.probabilities
    # the counts behind each step (the estimate and its interval are scipy's)
    removed = np.array([np.sum(d == t) for t in times], dtype=float)
    events = np.array([np.sum(e & (d == t)) for t in times], dtype=float)
    at_risk = len(d) - np.concatenate([[0.0], np.cumsum(removed)[:-1]])
    inside = (surv > 0) & (surv < 1)
    out = pd.DataFrame(
        {
            "t": times,
            "at_risk": at_risk.astype(int),
            "events": events.astype(int),
            "censored": (removed - events).astype(int),
            "survival": surv,
            "lo": np.where(inside, ci.low.probabilities, surv),
            "hi": np.where(inside, ci.high.probabilities, surv),
        }
    )
    return out if out["t"].iat[0] <= 0 else pd.concat([start, out], ignore_index=True)


def median_survival(km: pd.DataFrame) -> float:
    """First time S(t) <= 0.5; NaN when the curve never gets there (fewer than half crashed)."""
    below = km.loc[km["survival"] <= 0.5, "t"]
    return float(below.iloc[0]) if len(below) else np.nan


def first_crash_durations(trials: pd.DataFrame, requests: pd.DataFrame, crashes: pd.DataFrame) -> pd.DataFrame:
    """Per trial: seconds and requests until the first crash, or until the end (censored) without one.

    Requests until the crash count every request the trial sent before the crash was detected.
    """
    key = ["config", "trial"]
    first = crashes.groupby(key, observed=True)["t_detected"].min().rename("t_crash")
    out = trials[key + ["t_start", "duration_s", "n_requests"]].join(first, on=key)
    out["crashed"] = out["t_crash"].notna()
    out["time_s"] = np.where(out["crashed"], out["t_crash"] - out["t_start"], out["duration_s"])
    out["time_s"] = out["time_s"].clip(lower=0)
    # requests sent up to each trial's first crash
    r = requests[key + ["t_start"]].join(first, on=key, how="inner")
    sent = (r["t_start"] <= r["t_crash"]).groupby([r["config"], r["trial"]], observed=True).sum()
    out["requests"] = np.where(
        out["crashed"], out[key].join(sent.rename("n"), on=key)["n"].fillna(0), out["n_requests"]
    ).astype(float)
    return out[key + ["crashed", "time_s", "requests"]]
