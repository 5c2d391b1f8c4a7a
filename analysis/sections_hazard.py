"""The report's crash-hazard section: per configuration, the chance that one poison event crashes the
server (from analysis.hazard), crash rates per hour of uptime and per 1,000 answered requests, the fit and the
figure, and one plain sentence each."""

from __future__ import annotations

import numpy as np
import pandas as pd

from mmchaos.schema import sweep_label

from . import hazard as H
from .document import Doc
from .formatting import ci, integer, num, pct
from .prediction import Prediction, duration
from .results import CampaignResults

MAX_POINT_ROWS = 60


def hazard_section(
    doc: Doc,
    c: CampaignResults,
    fits: H.HazardFit,
    fig: bytes | None = None,
    held: pd.DataFrame | None = None,
    prediction: Prediction | None = None,
) -> None:
    """``fits``: :func:`analysis.hazard.fit_hazard` of ``c``; ``fig``: the figure, drawn here when not given;
    ``held``: analysis.prediction.held_out_table (the fit checked on points it did not see); ``prediction``: the
    MTBF at a user's traffic (``mmchaos report --rps ...``)."""
    doc.h(2, "Crash hazard per poison event")
    doc.p(
        "A poison event is what the bug needs: the first request on an image, in one server's life, that failed "
        "after the API server rendered and cached the image (a post-render 400, or a client abort) before the "
        "engine had got that image, and whose image a later request reaching the engine sent again before the "
        "next crash. Poison requests on images the engine already held are counted beside them ('reused poison "
        "requests'): on vLLM 0.30.0 they never crashed it. Per configuration, crashes are fitted as a Poisson "
        "count with the trial's poison events as exposure (a log offset), on the sweep knobs that varied within "
        "it: p is the chance that one poison event crashes the server at the reference knob values. Trials "
        "without a poison event say nothing about p and are left out. Rates per hour of uptime (load time while "
        "the server was up) and per 1,000 answered requests count every trial, with exact Poisson intervals."
    )
    doc.bullets([sentence(fits[cfg]) for cfg in fits.configs])
    doc.table(_main_table(fits), caption="Crash hazard per configuration, 95 % intervals")
    coefs = _coef_table(fits)
    if len(coefs):
        doc.table(
            coefs,
            caption="How p depends on the knobs that varied: ratio of p across the measured range "
            "(and per unit of the knob), 95 % intervals; 1 means no dependence",
        )
    if not swept(c):
        doc.note("Not a sweep: each configuration is one point, so p has no curve over knobs to draw.")
    else:
        if fig is None:
            from . import plots_hazard  # matplotlib is slow to import: only when the section is really drawn

            fig = plots_hazard.hazard_curves(fits)
        doc.image("crash_hazard.png", fig, "crashes per poison event per sweep point with the fitted curve")
    pts = _points_table(fits)
    if len(pts) and swept(c):
        doc.table(
            pts.head(MAX_POINT_ROWS),
            caption=f"Per sweep point: measured against fitted ({min(len(pts), MAX_POINT_ROWS)} of {len(pts)} shown)",
        )
    notes = [f"{cfg}: {fits[cfg].why}" for cfg in fits.configs]
    notes += [f"{cfg}: {n}" for cfg in fits.configs for n in fits[cfg].notes]
    doc.bullets(notes)
    if held is not None and len(held):
        _held_out(doc, held)
    if prediction is not None:
        _prediction(doc, prediction)


def swept(c: CampaignResults) -> bool:
    """Whether any trial ran at a sweep point (a knob varied): only then has p a curve over knobs."""
    return bool((~c.trials["sweep"].astype(str).isin(["", "{}"])).any())


def _held_out(doc: Doc, held: pd.DataFrame) -> None:
    inside = int(held["inside"].sum())
    doc.p(
        f"The model checked on data it was not fitted on: each sweep point's crashes predicted by the fit of the "
        f"other points of its configuration (95 % predictive interval: the fit's uncertainty and chance). "
        f"{inside} of {len(held)} measured counts fall inside their interval."
    )
    doc.table(
        pd.DataFrame(
            {
                "configuration": held["config"],
                "held-out point": held["point"].map(sweep_label),
                "trials": held["trials"].map(integer),
                "poison events": held["poison_events"].map(integer),
                "crashes measured": held["measured"].map(integer),
                "crashes predicted": [ci(p, lo, hi) for p, lo, hi in held[["predicted", "lo", "hi"]].to_numpy()],
                "inside": held["inside"].map({True: "yes", False: "no"}),
            }
        ),
        caption="Held-out sweep points: predicted against measured",
    )


def _prediction(doc: Doc, pr: Prediction) -> None:
    i = pr.inputs
    doc.h(3, "At your traffic")
    doc.p(
        f"Mean time between crashes at {num(i['rps'])} requests/s with {pct(i['post_render_share'])} post-render "
        f"4xx and {pct(i['disconnect_share'])} client disconnects"
        + (f", {pct(i['reuse'])} of their images sent again while cached" if i.get("reuse") is not None else "")
        + ": poison events per second × p per event, inverted; the interval is p's."
    )
    t = pr.table
    doc.table(
        pd.DataFrame(
            {
                "configuration": t["config"],
                "p per event": [
                    ci(p, lo, hi) if np.isfinite(p) else "—" for p, lo, hi in t[["p", "p_lo", "p_hi"]].to_numpy()
                ],
                "at": t["at"].replace("", "—"),
                "poison events/s": t["poison_per_s"].map(num),
                "crashes per hour": [
                    ci(p, lo, hi) if np.isfinite(p) else "—"
                    for p, lo, hi in t[["crashes_per_hour", "crashes_per_hour_lo", "crashes_per_hour_hi"]].to_numpy()
                ],
                "mean time between crashes": [_mtbf(r) for r in t.itertuples(index=False)],
            }
        ),
        caption="Predicted mean time between crashes, 95 % intervals",
    )
    doc.bullets([f"caveat: {c}" for c in pr.caveats])


def _mtbf(r) -> str:
    if not np.isfinite(r.p):
        return "no estimate"
    if not np.isfinite(r.mtbf_s):
        return f"at least {duration(r.mtbf_lo_s)}"
    return f"{duration(r.mtbf_s)} [{duration(r.mtbf_lo_s)}, {duration(r.mtbf_hi_s)}]"


def sentence(f: H.ConfigFit) -> str:
    """One plain sentence: what a poison event does to this configuration."""
    n = f.counts["poison_events"]
    if f.model == H.NO_DATA:
        return (
            f"{f.config}: no poison request on an image new to the server was sent again (no poison event), "
            "so its crash hazard was not measured."
        )
    if f.model == H.NO_CRASH:
        return (
            f"{f.config}: no crash in {integer(n)} poison events; the chance that one crashes the server "
            f"is at most {num(f.p_hi)} (95 % upper bound)."
        )
    if f.model == H.ALL_CRASHED:
        return (
            f"{f.config}: every one of the {integer(n)} poison events crashed the server (probability "
            f"at least {num(f.p_lo)}, 95 % lower bound)."
        )
    at = f" at {_at(f.reference)}" if f.terms else ""
    capped = " (interval capped at 1)" if f.p_hi > 1 else ""
    text = (
        f"{f.config}: each poison event crashed the server with probability {num(f.p)} "
        f"[{num(f.p_lo)}, {num(min(f.p_hi, 1.0))}]{capped}{at}"
    )
    for r in f.coefs.itertuples(index=False):
        change = (
            f"×{num(r.over_range)} [{num(r.over_range_lo)}, {num(r.over_range_hi)}] from {r.term} "
            f"{r.min:g} to {r.max:g}"
        )
        clear = r.over_range_lo > 1 or r.over_range_hi < 1
        text += f"; {change}" if clear else f"; no clear dependence on {r.term} ({change})"
    return text + "."


def _at(values: dict) -> str:
    return ", ".join(f"{k} = {v:g}" for k, v in values.items())


def _main_table(fits: H.HazardFit) -> pd.DataFrame:
    rows = []
    for cfg in fits.configs:
        f = fits[cfg]
        q, k, r = f.quality, f.counts, f.rates
        rows.append(
            {
                "configuration": cfg,
                "model": f.model,
                "trials used": f"{k['trials_used']}/{k['trials']}",
                "poison requests": integer(k["poison_requests"]),
                "reused poison requests": integer(k["reused_poison"]),
                "poison events": integer(k["poison_events"]),
                "events per poison request": pct(k["reuse_share"]),
                "crashes": integer(k["crashes"]),
                "p per poison event": _p(f),
                "at": _at(f.reference) if f.terms else "—",
                "per hour of uptime": ci(r["per_hour"], r["per_hour_lo"], r["per_hour_hi"]),
                "per 1,000 answered": ci(r["per_1k"], r["per_1k_lo"], r["per_1k_hi"]),
                "deviance/df": num(q["deviance_df"]),
                "Pearson χ²/df": num(q["pearson_df"]),
                "AIC Poisson / NB": f"{num(q['aic_poisson'])} / {num(q['aic_nb'])}",
            }
        )
    return pd.DataFrame(rows)


def _p(f: H.ConfigFit) -> str:
    if f.model == H.NO_DATA:
        return "—"
    if f.model == H.NO_CRASH:
        return f"0 [0, {num(f.p_hi)}]"
    return ci(f.p, f.p_lo, f.p_hi)


def _coef_table(fits: H.HazardFit) -> pd.DataFrame:
    rows = []
    for cfg in fits.configs:
        for r in fits[cfg].coefs.itertuples(index=False):
            rows.append(
                {
                    "configuration": cfg,
                    "knob": r.term,
                    "what it changes": r.role,
                    "measured": f"{r.min:g} to {r.max:g}",
                    "reference": f"{r.reference:g}",
                    "ratio across the range": ci(r.over_range, r.over_range_lo, r.over_range_hi),
                    "ratio per unit": ci(r.per_unit, r.per_unit_lo, r.per_unit_hi),
                    "p-value": num(r.p_value),
                }
            )
    return pd.DataFrame(rows)


def _points_table(fits: H.HazardFit) -> pd.DataFrame:
    rows = []
    for cfg in fits.configs:
        f = fits[cfg]
        if f.model == H.NO_DATA or not f.ranges:
            continue
        for r in f.points.to_dict("records"):
            rows.append(
                {
                    "configuration": cfg,
                    "point": _at({k: r[k] for k in f.ranges}),
                    "trials": integer(r["trials"]),
                    "poison events": integer(r["poison_events"]),
                    "crashes": integer(r["crashes"]),
                    "measured": ci(r["p"], r["p_lo"], r["p_hi"]),
                    "fitted": ci(r["fit"], r["fit_lo"], r["fit_hi"]) if np.isfinite(r["fit"]) else "—",
                }
            )
    return pd.DataFrame(rows)
