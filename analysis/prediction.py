"""What a fitted crash hazard means at a user's traffic: the mean time between crashes (MTBF) with its interval
and the caveats that go with it, and the check of the model on a sweep point it was not fitted on."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import intervals as I
from .exposure import exposure, knob_columns
from .formatting import num
from .hazard import ALL_CRASHED, NEGBIN, NO_DATA, POISSON, ROLE_KNOBS, ROLES, ConfigFit, HazardFit, fit_config, role_of
from .results import CampaignResults

FAR = 10.0  # a prediction this many times beyond the measured crash rates is called a far extrapolation


@dataclass
class Prediction:
    """Per configuration: p at the user's knobs, poison events and crashes per second, MTBF with its interval."""

    table: pd.DataFrame
    caveats: list[str]
    inputs: dict = field(default_factory=dict)

    def lines(self) -> list[str]:
        """What ``mmchaos predict`` prints: one line per configuration, then the caveats."""
        out = []
        for r in self.table.itertuples(index=False):
            if not np.isfinite(r.p):
                out.append(f"{r.config}: no estimate ({r.model})")
                continue
            mtbf = (
                f"at least {duration(r.mtbf_lo_s)}"
                if not np.isfinite(r.mtbf_s)
                else f"{duration(r.mtbf_s)} [{duration(r.mtbf_lo_s)}, {duration(r.mtbf_hi_s)}]"
            )
            at = f" at {r.at}" if r.at else ""
            out.append(
                f"{r.config}: mean time between crashes {mtbf} — {num(r.poison_per_s)} reused poison "
                f"events/s × p {num(r.p)} [{num(r.p_lo)}, {num(r.p_hi)}] per event ({r.model}{at})"
            )
        return out + [f"caveat: {c}" for c in self.caveats]


def predict(
    fit: HazardFit,
    rps: float,
    post_render_share: float,
    disconnect_share: float,
    reuse: float | None = None,
    knobs: dict | None = None,
) -> Prediction:
    """MTBF at a user's traffic, per configuration.

    ``rps``: the user's requests per second; ``post_render_share``: the share of them that fail after rendering
    (a post-render 400); ``disconnect_share``: the share the client abandons in flight; ``reuse``: the share of
    poisoned images sent again while still cached (default: each configuration's measured reuse_share);
    ``knobs``: the user's values of swept knobs (e.g. ``{"users": 32}``): p is taken at the measured value
    closest to each, the reference for the others. Poison events per second = rps × (post_render_share +
    disconnect_share) × reuse; crash rate = that × p; MTBF = 1 / crash rate.
    """
    check_traffic(rps, post_render_share, disconnect_share, reuse, knobs)
    knobs = dict(knobs or {})
    rows, caveats = [], []
    for cfg in fit.configs:
        f = fit[cfg]
        at, snapped = _snap(f, knobs)
        caveats += [f"{cfg}: {s}" for s in snapped]
        p, lo, hi = f.p_at(at) if f.model != NO_DATA else (np.nan,) * 3
        if hi > 1:  # a rate ratio's bound; a probability: at most every event crashes
            caveats.append(
                f"{cfg}: the fit's upper bound of p ({num(hi)}) is taken as 1 (at most every poison event crashes)"
            )
            p, lo, hi = min(p, 1.0), min(lo, 1.0), 1.0
        share = f.reuse_share if reuse is None else reuse
        ev = rps * (post_render_share + disconnect_share) * share
        rate = np.array([p, lo, hi]) * ev  # crashes per second
        with np.errstate(divide="ignore", invalid="ignore"):
            mtbf, mtbf_hi, mtbf_lo = 1.0 / rate
        measured = _measured_per_hour(fit.exposure, cfg)
        rows.append(
            {
                "config": cfg,
                "model": f.model,
                "at": ", ".join(f"{k}={v:g}" for k, v in at.items()),
                "reuse": share,
                "poison_per_s": ev,
                "p": p,
                "p_lo": lo,
                "p_hi": hi,
                "crashes_per_hour": rate[0] * 3600,
                "crashes_per_hour_lo": rate[1] * 3600,
                "crashes_per_hour_hi": rate[2] * 3600,
                "mtbf_s": mtbf,
                "mtbf_lo_s": mtbf_lo,
                "mtbf_hi_s": mtbf_hi,
                "measured_per_hour_min": measured[0],
                "measured_per_hour_max": measured[1],
            }
        )
    table = pd.DataFrame(rows)
    caveats = _caveats(fit, table, knobs, reuse, post_render_share, disconnect_share) + caveats
    inputs = {
        "rps": rps,
        "post_render_share": post_render_share,
        "disconnect_share": disconnect_share,
        "reuse": reuse,
        "knobs": knobs,
    }
    return Prediction(table, caveats, inputs)


def check_traffic(
    rps: float, post_render_share: float, disconnect_share: float, reuse: float | None = None, knobs: dict | None = None
) -> None:
    """ValueError (one line) unless this is traffic a server could see."""
    if not (isinstance(rps, (int, float)) and np.isfinite(rps) and rps > 0):
        raise ValueError(f"rps must be above 0, not {rps!r}")
    for name, v in (("post_render_share", post_render_share), ("disconnect_share", disconnect_share), ("reuse", reuse)):
        if v is not None and not 0 <= v <= 1:
            raise ValueError(f"{name} must be a share between 0 and 1, not {v!r}")
    if post_render_share + disconnect_share > 1:
        raise ValueError("post_render_share + disconnect_share cannot exceed 1")
    for k, v in (knobs or {}).items():
        if not (isinstance(v, (int, float)) and np.isfinite(v)):
            raise ValueError(f"knob {k} must be a number, not {v!r}")


def _snap(f: ConfigFit, knobs: dict) -> tuple[dict[str, float], list[str]]:
    """The user's knob values moved to the closest measured value (no extrapolation in knob space)."""
    at, said = {}, []
    for k in f.terms:
        if k not in knobs:
            at[k] = f.reference[k]
            continue
        measured = np.unique(f.points[k].to_numpy(float))
        v = float(measured[np.argmin(np.abs(measured - float(knobs[k])))])
        at[k] = v
        if v != float(knobs[k]):
            said.append(
                f"{k}={float(knobs[k]):g} was not measured (measured {', '.join(f'{m:g}' for m in measured)}):"
                f" p taken at {k}={v:g}"
            )
    return at, said


def _measured_per_hour(exp: pd.DataFrame, cfg: str) -> tuple[float, float]:
    rows = exp[(exp["config"].astype(str) == cfg) & (exp["uptime_s"] > 0)]
    if not len(rows):
        return np.nan, np.nan
    per_hour = rows["crashes"] / rows["uptime_s"] * 3600
    return float(per_hour.min()), float(per_hour.max())


def _caveats(
    fit: HazardFit,
    table: pd.DataFrame,
    knobs: dict,
    reuse,
    post_render_share: float = 0.0,
    disconnect_share: float = 0.0,
) -> list[str]:
    exp = fit.exposure
    out = []
    targets = set(exp["target"].dropna().astype(str)) if "target" in exp else set()
    if targets <= {"engine"}:
        out.append(
            "measured on mmchaos's tiny random-weight model on CPU: p per event is a property of the cache "
            "bookkeeping and should carry over, but your GPU finishes requests far faster, so races that "
            "need overlap in time (client aborts mid-request, concurrent renders) may happen more or less "
            "often than here"
        )
    else:
        out.append(
            f"measured against {', '.join(sorted(targets))}: a different model, GPU or load balancer in "
            "front changes the timing of aborts and reuses"
        )
    fitted = {k for f in fit.fits.values() for k in f.ranges}
    swept = {k for k in [*knob_columns(exp), "users"] if exp[k].nunique() > 1}
    varied = fitted | swept
    for role in ROLES:
        hit = sorted(k for k in fitted if role_of(k) == role)
        idle = sorted(k for k in swept - fitted if role_of(k) == role)
        if hit:
            out.append(
                f"{role} was varied ({', '.join(hit)}): p depends on it as the fit says, within the measured range only"
            )
        elif idle:
            out.append(
                f"{role} was varied ({', '.join(idle)}), but poison events came at one of its values "
                "only: how p depends on it was not measured"
            )
        else:
            out.append(
                f"{role} ({ROLE_KNOBS[role]}) was not varied: p is assumed not to depend on it, "
                "which this campaign did not check"
            )
    unused = sorted(k for k in knobs if k not in varied)
    if unused:
        out.append(f"{', '.join(unused)} given but never varied in the campaign: ignored")
    if reuse is None:
        out.append(
            "reuse is each configuration's measured share of poisoned images sent again while cached "
            "(its image pool and Zipf hot set, and a server life cut short by crashes); give your traffic's "
            "(--reuse)"
        )
    if "abort_requests" in exp:  # one p for both poison kinds: say when one of them was never sent
        aborts = exp["abort_requests"].sum()
        for share, sent, yours in (
            (disconnect_share, aborts, "client disconnect"),
            (post_render_share, exp["poison_requests"].sum() - aborts, "post-render 4xx"),
        ):
            if share > 0 and sent == 0:
                out.append(
                    f"no {yours} was sent in this campaign: each of yours is taken to poison the cache as "
                    "the poison it did send does, which it did not check"
                )
    for r in table.itertuples(index=False):
        if not np.isfinite(r.p):
            continue
        if r.p == 0:
            out.append(f"{r.config}: no crash was seen, so the MTBF is only a lower bound")
            continue
        lo_m, hi_m = r.measured_per_hour_min, r.measured_per_hour_max
        pred = r.crashes_per_hour
        text = (
            f"{r.config}: measured {num(lo_m)}–{num(hi_m)} crashes per hour of uptime across trials; "
            f"predicted {num(pred)}"
        )
        if hi_m > 0 and pred > FAR * hi_m:
            text += (
                f", {num(pred / hi_m)}× the highest measured: a far extrapolation that assumes p per event "
                "holds at that rate"
            )
        elif lo_m > 0 and pred < lo_m / FAR:
            text += f", {num(lo_m / pred)}× below the lowest measured: a far extrapolation"
        out.append(text)
    return out


def duration(s: float) -> str:
    """Seconds as the largest sensible unit: 42 s, 3.5 min, 7.2 h, 12 days."""
    if s is None or not np.isfinite(s):
        return "∞" if s is not None and s > 0 else "—"
    for unit, size, from_ in (("days", 86400.0, 2 * 86400.0), ("h", 3600.0, 3600.0), ("min", 60.0, 60.0)):
        if s >= from_:
            return f"{num(s / size)} {unit}"
    return f"{num(s)} s"


# --- held-out check -----------------------------------------------------------------------------------


@dataclass
class HeldOut:
    config: str
    point: dict
    trials: int
    poison_events: float
    measured: int  # crashes seen at the point
    predicted: float  # expected crashes from the fit without the point
    lo: float  # predictive interval of the count (parameter uncertainty and chance)
    hi: float
    p: float  # the fit's p at the point (weighted by the trials' events), with its interval
    p_lo: float
    p_hi: float
    model: str

    @property
    def inside(self) -> bool:
        return self.lo <= self.measured <= self.hi


def held_out(
    c: CampaignResults | pd.DataFrame,
    config: str,
    point: dict,
    confidence: float = I.CONFIDENCE,
    draws: int = 20000,
    seed: int = I.SEED,
) -> HeldOut:
    """Fit ``config`` without the trials of sweep ``point`` (knob -> value), predict that point's crash count.

    ``c``: a campaign, or an exposure table. Trials of the point without a poison event are left out (the
    model says nothing about them). The interval is predictive: p drawn from the fit's uncertainty, then
    crashes drawn given p (Poisson, or gamma-mixed for a negative binomial fit).
    """
    exp = c if isinstance(c, pd.DataFrame) else exposure(c)
    rows = exp[exp["config"].astype(str) == config]
    missing = [k for k in point if k not in rows]
    if missing:
        raise ValueError(f"{', '.join(missing)} is not a sweep knob of {config}")
    at = np.logical_and.reduce([np.isclose(rows[k].astype(float), float(v)) for k, v in point.items()])
    test, train = rows[at], rows[~at]
    if not len(test):
        raise ValueError(f"no trial of {config} ran at {point}")
    f = fit_config(train, config, confidence)
    if f.model == NO_DATA:
        raise ValueError(f"{config} has no poison event outside {point}: nothing to fit")
    test = test[test["poison_events"] > 0]
    e = test["poison_events"].to_numpy(float)
    p_trial = f.p_curve(test[f.terms])[0]  # each trial at its own knob values (the point's, and the others')
    rng = np.random.default_rng(seed)
    p_draws, counts = _draw(f, test[f.terms], e, draws, rng)
    a = (1 - confidence) / 2
    lo, hi = np.quantile(counts, [a, 1 - a])
    p_lo, p_hi = np.quantile(p_draws, [a, 1 - a]) if e.sum() > 0 else (np.nan, np.nan)
    expected = float(p_trial @ e)
    return HeldOut(
        config,
        dict(point),
        len(test),
        float(e.sum()),
        int(test["crashes"].sum()),
        expected,
        float(lo),
        float(hi),
        expected / e.sum() if e.sum() > 0 else np.nan,
        float(p_lo),
        float(p_hi),
        f.model,
    )


def _draw(f: ConfigFit, grid: pd.DataFrame, e: np.ndarray, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Draws of the events-weighted p and of the crash count at trials ``grid`` (their knob values) with
    exposures ``e``: p from the fit's uncertainty, then crashes given p."""
    K, E = f.counts["crashes_in_fit"], f.counts["poison_events"]
    if f.model == ALL_CRASHED:  # Jeffreys posteriors: the Bayesian twins of the exact intervals
        p = np.repeat(rng.beta(K + 0.5, max(E - K, 0) + 0.5, n)[:, None], len(e), axis=1)
    elif f.params is None or (not f.terms and f.model == POISSON):
        p = np.repeat(rng.gamma(K + 0.5, 1 / E, n)[:, None], len(e), axis=1)
    else:  # the GLM's coefficients from their sampling distribution
        beta = rng.multivariate_normal(f.params, f.cov, n)
        p = np.exp(beta @ f._design(grid).T)
    mean = p * e[None, :]
    p_weighted = mean.sum(axis=1) / e.sum() if e.sum() > 0 else np.full(n, np.nan)
    if f.model == ALL_CRASHED:
        return p_weighted, rng.binomial(e.astype(np.int64)[None, :], np.minimum(p, 1)).sum(axis=1)
    if f.model == NEGBIN and f.alpha > 0:  # trials differ beyond chance: gamma-mixed Poisson per trial
        mean = rng.gamma(1 / f.alpha, f.alpha * np.maximum(mean, 1e-300))
    return p_weighted, rng.poisson(mean).sum(axis=1)


def held_out_table(exp: pd.DataFrame, fits: HazardFit, confidence: float = I.CONFIDENCE) -> pd.DataFrame:
    """Every sweep point of every configuration predicted by the fit without it (leave one point out): config,
    point (knob -> value), trials, poison_events, measured, predicted, lo, hi, inside. Points without a reused
    poison event (nothing to predict) and fits left with nothing to fit are skipped."""
    rows = []
    for cfg in fits.configs:
        f = fits[cfg]
        if f.model == NO_DATA or not f.ranges or len(f.points) < 2:
            continue
        for point in f.points[list(f.ranges)].to_dict("records"):
            try:
                h = held_out(exp, cfg, point, confidence)
            except ValueError:
                continue
            if h.poison_events > 0:
                rows.append(
                    {
                        "config": cfg,
                        "point": point,
                        "trials": h.trials,
                        "poison_events": h.poison_events,
                        "measured": h.measured,
                        "predicted": h.predicted,
                        "lo": h.lo,
                        "hi": h.hi,
                        "inside": h.inside,
                        "model": h.model,
                    }
                )
    return pd.DataFrame(
        rows,
        columns=["config", "point", "trials", "poison_events", "measured", "predicted", "lo", "hi", "inside", "model"],
    )


# --- checked against a measured rate ---------------------------------------------------------------------


def rate_check(
    fits: HazardFit, check: CampaignResults, confidence: float = I.CONFIDENCE, draws: int = 20000, seed: int = I.SEED
) -> pd.DataFrame:
    """The fit checked on a campaign it never saw, run open loop at a rate of its own (``[workload] rate``, the
    user's): per configuration of both, the crashes per hour of uptime it measured (with their exact interval)
    against those the fit predicts from the poison events that campaign measured (a predictive interval: p from
    the fit's uncertainty, then crashes given p), and the same as a count. Swept knobs the check campaign does not
    set are taken at the fit's reference. Columns: config, rate, trials, uptime_h, poison_events, measured,
    predicted, lo, hi, inside, per_hour, per_hour_lo, per_hour_hi, predicted_per_hour, predicted_per_hour_lo,
    predicted_per_hour_hi, model."""
    exp = exposure(check)
    rates = check.trials.set_index([check.trials["config"].astype(str), check.trials["trial"]])["workload"].map(
        lambda w: float(json.loads(w).get("rate") or 0)
    )
    rows = []
    rng = np.random.default_rng(seed)
    a = (1 - confidence) / 2
    for cfg in fits.configs:
        f = fits[cfg]
        t = exp[exp["config"].astype(str) == cfg]
        if f.model == NO_DATA or not len(t):
            continue
        rate = sorted({rates.get((cfg, tr), 0.0) for tr in t["trial"]})
        grid = pd.DataFrame(
            {k: t[k].astype(float).fillna(f.reference[k]) if k in t else f.reference[k] for k in f.terms}, index=t.index
        )
        e = t["poison_events"].to_numpy(float)
        uptime_h = float(t["uptime_s"].sum()) / 3600
        measured = int(t["crashes"].sum())
        expected = float(f.p_curve(grid)[0] @ e)
        _, counts = _draw(f, grid, e, draws, rng)
        lo, hi = np.quantile(counts, [a, 1 - a])
        per_hour, per_lo, per_hi = (float(x) for x in I.poisson_rate_ci(measured, uptime_h, confidence=confidence))
        hours = uptime_h if uptime_h > 0 else np.nan
        rows.append(
            {
                "config": cfg,
                "rate": ", ".join(f"{r:g}" for r in rate) if any(rate) else "closed loop",
                "trials": len(t),
                "uptime_h": uptime_h,
                "poison_events": float(e.sum()),
                "measured": measured,
                "predicted": expected,
                "lo": float(lo),
                "hi": float(hi),
                "inside": bool(lo <= measured <= hi),
                "per_hour": per_hour,
                "per_hour_lo": per_lo,
                "per_hour_hi": per_hi,
                "predicted_per_hour": expected / hours,
                "predicted_per_hour_lo": lo / hours,
                "predicted_per_hour_hi": hi / hours,
                "model": f.model,
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "config",
            "rate",
            "trials",
            "uptime_h",
            "poison_events",
            "measured",
            "predicted",
            "lo",
            "hi",
            "inside",
            "per_hour",
            "per_hour_lo",
            "per_hour_hi",
            "predicted_per_hour",
            "predicted_per_hour_lo",
            "predicted_per_hour_hi",
            "model",
        ],
    )


def parse_share(text: str) -> float:
    """A share as people write it: ``0.5%`` or ``0.005`` (a number above 1 without % is refused: 5 could mean
    5 % or 500 %)."""
    raw = str(text).strip()
    pct = raw.endswith("%")
    try:
        v = float(raw[:-1] if pct else raw)
    except ValueError:
        raise ValueError(f"{text!r} is not a share: write 0.5% or 0.005") from None
    v = v / 100 if pct else v
    if not (0 <= v <= 1) or not np.isfinite(v):
        raise ValueError(f"{text!r} is not a share between 0 and 100 % (write 0.5% or 0.005)")
    return v
