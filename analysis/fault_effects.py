"""What each injected fault did, as the user's system would see it: did the server exit (how long after), did
/health keep answering 200 while nothing was served (a liveness probe that would not fire), how long until a new
request was served again, the requests it failed, lost or the client's retries cured, and drift afterwards.

A fault's *outage* runs from its injection to the first request started after it was in effect (``t_effect``: an
operator action's answer, which comes late under load) that was answered 2xx (the end of its trial if none was).
Its verdict (the fault axis of a configuration's verdict):

- ``fails``: it *wedged* the server (/health answered 200 for ``wedge_s`` (``WEDGE_S``) or more of the outage:
  Kubernetes' default liveness probe, 10 s × 3 failures, would not have fired), or the server was not serving
  again ``recover_s`` (``DEFAULT_RECOVER_S``) after it, or data was lost without an error: a 2xx the client
  recorded with no body (``mmchaos report --max-wedge-s / --max-recovery-s`` set the two bounds);
- ``recovers``: the server served again within the bound (whether it restarted or rode it out);
- ``undecided``: the server had served no request before it nor after (its start, not the fault, stalled it);
  or not serving again when its trial ended, sooner than the bound after it (a longer load decides);
- ``not_injected``: its row says it was not (target gone, not reached, refused): it judges nothing.
"""

from __future__ import annotations

import pandas as pd

from mmchaos import schema as S
from mmchaos.faults import DEFAULT_RECOVER_S, WEDGE_S

from .results import CampaignResults
from .stats import drift_events

CRASH_WINDOW_S = 60.0
FAILS, RECOVERS, UNDECIDED, NOT_INJECTED = "fails", "recovers", "undecided", "not_injected"
_VALID = tuple(S.VALID_KINDS)


def _longest_ok_run(polls: pd.DataFrame, start: float, end: float) -> float:
    """Seconds of the longest run of consecutive 200 polls within [start, end] (the window's ends bound it)."""
    p = polls[(polls["t"] >= start) & (polls["t"] <= end)].sort_values("t")
    if p.empty:
        return 0.0
    ok = p["ok"].fillna(False).astype(bool).to_numpy()
    t = p["t"].to_numpy()
    best, run_start = 0.0, None
    for i, good in enumerate(ok):
        if good and run_start is None:
            run_start = start if i == 0 else t[i]
        if not good and run_start is not None:
            best, run_start = max(best, t[i] - run_start), None
    if run_start is not None:
        best = max(best, end - run_start)
    return float(best)


def fault_effects(c: CampaignResults, wedge_s: float = WEDGE_S, recover_s: float = DEFAULT_RECOVER_S) -> pd.DataFrame:
    """One row per fault row of every trial, with what followed it (see the module's docstring)."""
    f = c.faults
    if f is None or f.empty:
        return pd.DataFrame()
    trial_end = {(str(r.config), int(r.trial)): r.t_end for r in c.trials.itertuples()} if "t_end" in c.trials else {}
    drift = drift_events(c)
    rows = []
    f = f.sort_values("t_injected")
    for i, fr in enumerate(f.itertuples()):
        cfg, trial = str(fr.config), int(fr.trial)
        later = f.iloc[i + 1 :]
        later = later[(later["config"].astype(str) == cfg) & (later["trial"] == trial) & later["t_injected"].notna()]
        row = {
            "config": cfg,
            "trial": trial,
            "fault": fr.fault,
            "kind": fr.kind,
            "target": fr.target,
            "t_injected": fr.t_injected,
            "target_pid": fr.target_pid,
            "at_s": fr.t_rel,
            "outcome": fr.outcome,
        }
        if fr.outcome != S.FAULT_INJECTED or pd.isna(fr.t_injected):
            rows.append({**row, "verdict": NOT_INJECTED, "why": f"not injected: {fr.outcome} ({fr.detail})"})
            continue
        t0 = float(fr.t_injected)
        r = c.requests[(c.requests["config"] == cfg) & (c.requests["trial"] == trial)]
        h = c.health[(c.health["config"] == cfg) & (c.health["trial"] == trial)]
        end = trial_end.get((cfg, trial))
        end = float(end) if end is not None and not pd.isna(end) else float(max(r["t_start"].max(), h["t"].max()))
        if len(later):  # what follows the next fault is that fault's
            end = min(end, float(later["t_injected"].iloc[0]))
        done = r["t_start"] + r["latency_ms"].fillna(0) / 1000
        # a 2xx with no body is no answer (an embeddings answer is JSON): the client saw "ok" and got nothing
        empty = (r["outcome"] == S.OK) & (r["response_bytes"].fillna(1) == 0)
        ok_new = (r["outcome"] == S.OK) & r["kind"].isin(_VALID) & ~empty
        # a crash within CRASH_WINDOW_S of the fault (before the next one) is what the fault led to: a server going
        # down can answer a request or two first (one of two API servers killed: the other, for a moment)
        cut_off = min(end, t0 + CRASH_WINDOW_S)
        cr = c.crashes[
            (c.crashes["config"] == cfg)
            & (c.crashes["trial"] == trial)
            & (c.crashes["t_detected"] >= t0)
            & (c.crashes["t_detected"] <= cut_off)
        ]
        crash = cr.sort_values("t_detected").iloc[0] if len(cr) else None
        in_effect = t0 if pd.isna(getattr(fr, "t_effect", None)) else max(t0, float(fr.t_effect))
        # served again: by the restarted server, else after the fault was in effect (a request sent between a
        # pause's call and its answer can be served before the pause holds anything)
        since = float(crash["t_detected"]) if crash is not None else in_effect
        served = done[ok_new & (r["t_start"] >= since)].min()
        served = float(served) if not pd.isna(served) and served <= end else None
        # the server this fault hit had answered before it (else a stall is the server's start, not the fault)
        before = r[ok_new & (done <= t0)]
        outage_end = served if served is not None else end
        blind = _longest_ok_run(h, t0, outage_end)
        lasts = float(fr.t_cleared) if not pd.isna(fr.t_cleared) else outage_end
        # while it was on or the server was out, up to the next fault (whose effects are its own)
        empty_2xx = int((empty & (r["t_start"] >= t0) & (r["t_start"] <= min(max(lasts, outage_end), end))).sum())
        hit = r[((r["t_start"] >= t0) & (r["t_start"] <= outage_end)) | ((r["t_start"] < t0) & (done > t0))]
        final = hit["final"].fillna(True).astype(bool) if "final" in hit else pd.Series(True, index=hit.index)
        failed = hit[final & ~hit["outcome"].isin([S.OK, S.CUT, S.ABORTED]) & hit["kind"].isin(_VALID)]
        groups = hit.loc[~final & (hit["outcome"] != S.OK), "request_group"].dropna().unique()
        cured = r[r["request_group"].isin(groups) & (r["outcome"] == S.OK)]["request_group"].nunique()
        d = drift[(drift["config"] == cfg) & (drift["trial"] == trial) & (drift["t"] >= t0)] if len(drift) else drift
        bound = float(recover_s)
        row.update(
            {
                "outage_end": outage_end,
                "served_before": len(before) > 0,
                "exited_after_s": float(crash["t_detected"] - t0) if crash is not None else None,
                "exit": (
                    f"{crash['reason']}"
                    + (f" ({crash['signature']})" if crash["signature"] else "")
                    + (f", exit code {int(crash['exit_code'])}" if not pd.isna(crash["exit_code"]) else "")
                )
                if crash is not None
                else "",
                "served_again_after_s": served - t0 if served is not None else None,
                "health_200_without_service_s": blind,
                "empty_2xx": empty_2xx,
                "failed": len(failed),
                "cut": int((hit["outcome"] == S.CUT).sum()),
                "cured_by_retries": int(cured),
                "drift_after": len(d),
                "recover_within_s": bound,
                "wedge_bound_s": float(wedge_s),
            }
        )
        row["verdict"], row["why"] = _judge(row, bound, wedge_s, blind, end - t0)
        rows.append(row)
    return pd.DataFrame(rows)


def _judge(row: dict, bound: float, wedge_s: float, blind: float, left: float) -> tuple[str, str]:
    if not row["served_before"] and row["served_again_after_s"] is None:
        return UNDECIDED, "the server had answered no request before it, nor after: the fault is not what stalled it"
    if blind >= wedge_s:
        return FAILS, (
            f"wedged: /health answered 200 for {blind:.1f} s while nothing was served (bound {wedge_s:g} s: a "
            "liveness probe would not fire)"
        )
    if row["empty_2xx"]:
        return FAILS, (f"{row['empty_2xx']} answers were 2xx with no body: data lost without an error the client saw")
    back = row["served_again_after_s"]
    if back is None and left < bound:
        return UNDECIDED, (
            f"not serving again when the trial ended {left:.0f} s after it, before the {bound:g} s "
            "bound: a longer load decides"
        )
    if back is None or back > bound:
        return FAILS, (
            "not serving again by the end of the trial"
            if back is None
            else f"served again only {back:.0f} s after it (bound {bound:g} s)"
        )
    how = f"exited after {row['exited_after_s']:.1f} s, " if row["exited_after_s"] is not None else ""
    return RECOVERS, f"{how}served again after {back:.1f} s"


def outside_faults(df: pd.DataFrame, effects: pd.DataFrame, time_col: str) -> pd.DataFrame:
    """The rows of ``df`` outside every injected fault's outage: the client-side verdict judges those, the fault
    axis the rest (a crash we caused by a SIGKILL is not the server's failure)."""
    if effects.empty or df.empty or "outage_end" not in effects:
        return df
    keep = pd.Series(True, index=df.index)
    for e in effects[effects["verdict"] != NOT_INJECTED].itertuples():
        t0 = e.t_injected
        inside = (
            (df["config"].astype(str) == e.config)
            & (df["trial"] == e.trial)
            & (df[time_col] >= t0)
            & (df[time_col] <= e.outage_end + 1)
        )
        if time_col == "t_start" and "latency_ms" in df:  # in flight when it was injected
            inside |= (
                (df["config"].astype(str) == e.config)
                & (df["trial"] == e.trial)
                & (df[time_col] < t0)
                & (df[time_col] + df["latency_ms"].fillna(0) / 1000 > t0)
            )
        keep &= ~inside
    return df[keep]


def fault_axis(effects: pd.DataFrame) -> dict[str, tuple[str, list[str]]]:
    """config -> (fails | recovers | not_exercised, one sentence per fault) for the verdict."""
    out: dict[str, tuple[str, list[str]]] = {}
    if effects.empty:
        return out
    for cfg, g in effects.groupby("config", sort=False):
        judged = g[~g["verdict"].isin([NOT_INJECTED, UNDECIDED])]
        level = "not_exercised" if judged.empty else FAILS if (judged["verdict"] == FAILS).any() else RECOVERS
        out[str(cfg)] = (level, [f"{x.fault} (trial {x.trial}): {x.verdict} — {x.why}" for x in g.itertuples()])
    return out


def n_failed_faults(effects: pd.DataFrame) -> int:
    return int((effects["verdict"] == FAILS).sum()) if not effects.empty else 0
