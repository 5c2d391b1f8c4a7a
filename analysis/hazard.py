"""Crash hazard: the chance that one poison event crashes a configuration, fitted from a campaign's trials.

Per trial the exposure (analysis.exposure: poison events while the server was up) and the crashes; per
configuration a Poisson regression with that exposure as offset::

    crashes_i ~ Poisson(poison_events_i * p(knobs_i)),   log p = b0 + b . (knobs_i - reference)

``p = exp(b0)`` is the chance that one poison event crashes the server at the reference knob values; a
negative binomial replaces the Poisson when trials vary more than chance allows (by AIC), and exact intervals
replace the fit where it has no finite answer (no crash, every event crashed). analysis.prediction turns p into a
mean time between crashes at a user's traffic and checks it on a held-out sweep point.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.discrete.discrete_model import NegativeBinomial

# the two modules used, not statsmodels.api: it imports all of statsmodels (twice the time of these)
from statsmodels.genmod import families
from statsmodels.genmod.generalized_linear_model import GLM

from . import intervals as I
from .exposure import exposure, knob_columns
from .formatting import num
from .results import CampaignResults

# Where a configuration's p comes from.
POISSON = "Poisson GLM"
NEGBIN = "negative binomial GLM"
NO_CRASH = "no crash: exact upper bound"
ALL_CRASHED = "every event crashed: exact binomial"
NO_DATA = "no poison event"

# Sweep knob names by what they change (the option names of mmchaos.options, with or without "weight_"), and
# how the caveats name them.
ROLES = {
    "concurrency": ("users",),
    "image reuse": ("pool_size", "fresh_fraction", "zipf"),
    "poison mix": ("malformed_post", "weight_malformed_post", "abort", "weight_abort", "abort_after_ms"),
}
ROLE_KNOBS = {
    "concurrency": "users",
    "image reuse": "pool_size, fresh_fraction, zipf",
    "poison mix": "the malformed_post and abort weights, abort_after_ms",
}


@dataclass
class ConfigFit:
    """One configuration's crash hazard. ``p``: crashes per poison event at ``reference`` knob values."""

    config: str
    model: str
    p: float
    p_lo: float
    p_hi: float
    confidence: float
    terms: list[str]  # knobs in the model, centred at ``reference``
    reference: dict[str, float]
    ranges: dict[str, tuple[float, float]]  # measured (min, max) of each knob that varied
    coefs: pd.DataFrame  # per term: rate ratios per unit and across the measured range, with intervals
    why: str  # the model chosen, and why, in one sentence
    notes: list[str]
    counts: dict[str, float]  # trials, trials_used, trials_no_poison, poison_requests, poison_events, crashes...
    rates: dict[str, float]  # per_hour(_lo/_hi) of uptime, per_1k(_lo/_hi) answered requests
    quality: dict[str, float]  # deviance_df, pearson_df, df_resid, aic_poisson, aic_nb, alpha
    points: pd.DataFrame  # per sweep point: measured crashes per event and the fitted p, with intervals
    params: np.ndarray | None = None  # chosen model's coefficients (log scale) and covariance, for predictions
    cov: np.ndarray | None = None
    alpha: float = 0.0  # negative binomial dispersion (0: Poisson)

    @property
    def reuse_share(self) -> float:
        return self.counts["reuse_share"]

    def p_at(self, values: dict | None = None) -> tuple[float, float, float]:
        """p with its interval at ``values`` (knob -> value; knobs not given: the reference)."""
        grid = pd.DataFrame([{k: (values or {}).get(k, self.reference[k]) for k in self.terms}])
        est, lo, hi = self.p_curve(grid)
        return float(est[0]), float(lo[0]), float(hi[0])

    def p_curve(self, grid: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """p and its pointwise interval at each row of ``grid`` (columns: the terms)."""
        n = len(grid)
        if not self.terms or self.params is None:
            return np.full(n, self.p), np.full(n, self.p_lo), np.full(n, self.p_hi)
        x = self._design(grid)
        eta = x @ self.params
        assert self.cov is not None  # fitted with its params
        se = np.sqrt(np.einsum("ij,jk,ik->i", x, self.cov, x))
        z = stats.norm.ppf(0.5 + self.confidence / 2)
        return np.exp(eta), np.exp(eta - z * se), np.exp(eta + z * se)

    def _design(self, grid: pd.DataFrame) -> np.ndarray:
        cols = [np.ones(len(grid))] + [grid[k].to_numpy(float) - self.reference[k] for k in self.terms]
        return np.column_stack(cols)


@dataclass
class HazardFit:
    configs: list[str]
    fits: dict[str, ConfigFit]
    exposure: pd.DataFrame
    confidence: float = I.CONFIDENCE

    def __getitem__(self, config: str) -> ConfigFit:
        return self.fits[config]

    def table(self) -> pd.DataFrame:
        """One row per configuration: model, counts, p, rates, fit quality."""
        rows = []
        for cfg in self.configs:
            f = self.fits[cfg]
            rows.append(
                {
                    "config": cfg,
                    "model": f.model,
                    **f.counts,
                    "p": f.p,
                    "p_lo": f.p_lo,
                    "p_hi": f.p_hi,
                    **f.rates,
                    **f.quality,
                    "terms": ", ".join(f.terms),
                    "why": f.why,
                }
            )
        return pd.DataFrame(rows)


def fit_hazard(c: CampaignResults, confidence: float = I.CONFIDENCE) -> HazardFit:
    """:func:`exposure` of the campaign and a model per configuration (see :func:`fit_exposure`)."""
    return fit_exposure(exposure(c), [str(x) for x in c.configs], confidence)


def fit_exposure(exp: pd.DataFrame, configs: list[str] | None = None, confidence: float = I.CONFIDENCE) -> HazardFit:
    """Fit every configuration of an exposure table (one row per trial, as :func:`exposure` returns)."""
    names = exp["config"].astype(str)
    configs = configs if configs is not None else list(dict.fromkeys(names))
    fits = {cfg: fit_config(exp[names == cfg], cfg, confidence) for cfg in configs}
    return HazardFit(list(configs), fits, exp, confidence)


def fit_config(rows: pd.DataFrame, config: str, confidence: float = I.CONFIDENCE) -> ConfigFit:
    """The crash hazard of one configuration from its trials (rows of an exposure table).

    Trials without a poison event carry no information about p (their offset is log 0) and are left out.
    No crash: the exact (Garwood) upper bound instead of a fit. Every event crashed: the exact binomial
    (Clopper-Pearson) interval. No knob varied: intercept only, with the exact Poisson interval. Otherwise a
    Poisson GLM on the knobs that varied, compared with a negative binomial GLM by AIC.
    """
    rows = rows.reset_index(drop=True)
    used = rows[rows["poison_events"] > 0].reset_index(drop=True)
    y, e = used["crashes"].to_numpy(float), used["poison_events"].to_numpy(float)
    K, E = float(y.sum()), float(e.sum())
    counts = _counts(rows, used)
    notes = []
    if counts["trials_no_poison"]:
        dropped = rows.loc[rows["poison_events"] <= 0, "crashes"].sum()
        notes.append(
            f"{counts['trials_no_poison']} of {len(rows)} trials had no poison event and are left "
            "out of the fit" + (f"; they crashed {int(dropped)} time(s) anyway (another cause)" if dropped else "")
        )
    varying = [k for k in _candidates(used) if used[k].nunique() > 1] if len(used) else []
    odd = [k for k in knob_columns(used) if k not in varying and used[k].nunique(dropna=False) > 1]
    if odd:
        notes.append(f"{', '.join(odd)} varied but is not a number in every trial: not modelled, pooled over it")
    ranges = {k: (float(used[k].min()), float(used[k].max())) for k in varying}
    base = {
        "config": config,
        "confidence": confidence,
        "ranges": ranges,
        "counts": counts,
        "rates": _rates(rows, confidence),
        "notes": notes,
    }

    if not len(used):
        return _finish(base, used, NO_DATA, np.nan, np.nan, np.nan, "no poison event was sent: nothing to estimate")
    if K == 0:
        _, _, hi = I.poisson_rate_ci(0, E, 1.0, confidence)
        return _finish(
            base,
            used,
            NO_CRASH,
            0.0,
            0.0,
            float(hi),
            f"no crash in {int(E):,} poison events: the exact (Garwood) upper bound instead of a "
            "fit (a Poisson fit has no finite estimate at zero)",
        )
    if np.all(y >= e):
        ci = stats.binomtest(int(E), int(E)).proportion_ci(confidence, method="exact")
        if K > E:
            notes.append(f"{int(K - E)} crash(es) more than poison events: something else crashes it too")
        return _finish(
            base,
            used,
            ALL_CRASHED,
            1.0,
            float(ci.low),
            1.0,
            f"every one of {int(E):,} poison events crashed the server: the exact binomial "
            "(Clopper-Pearson) interval, since a Poisson rate has no room to be checked below its data",
        )

    terms, reference = _terms(used, varying, notes)
    X = np.column_stack([np.ones(len(used))] + [used[k].to_numpy(float) - reference[k] for k in terms])
    offset = np.log(e)
    pois = _glm(y, X, offset, families.Poisson())
    if terms and not _stable(pois, terms, ranges):
        notes.append(
            f"the crashes did not allow a fit of their dependence on {', '.join(terms)} (they sit at one "
            "end of the range): pooled over it"
        )
        terms, reference, X = [], {}, X[:, :1]
        pois = _glm(y, X, offset, families.Poisson())
    quality = {**_quality(pois), "aic_poisson": float(pois.aic), "aic_nb": np.nan, "alpha": 0.0}
    model, res, alpha, why = _choose(y, X, offset, pois, quality, len(used))
    if model == NEGBIN:  # its deviance and Pearson χ² are the ones that judge it
        quality.update(_quality(res))
    params, cov = np.asarray(res.params, float), np.asarray(res.cov_params(), float)
    z = stats.norm.ppf(0.5 + confidence / 2)
    if not terms and model == POISSON:  # intercept only: the MLE is K/E, and its exact interval exists
        p, lo, hi = (float(v) for v in I.poisson_rate_ci(K, E, 1.0, confidence))
    else:
        p, se = float(np.exp(params[0])), float(np.sqrt(cov[0, 0]))
        lo, hi = float(np.exp(params[0] - z * se)), float(np.exp(params[0] + z * se))
    if quality["df_resid"] > 1 and quality["pearson_df"] < 0.5:
        notes.append(
            f"the crash counts vary less than a Poisson allows (Pearson χ²/df {quality['pearson_df']:.2f}): "
            "typical when p is high (each event crashes or not), so the interval is conservative"
        )
    if hi > 1:
        ci = stats.binomtest(int(min(K, E)), int(E)).proportion_ci(confidence, method="exact")
        notes.append(
            f"p is close to 1: the rate's interval reaches {num(hi)}, above any probability; as a share, "
            f"{int(min(K, E))} of {int(E)} poison events crashed it "
            f"(exact binomial {num(ci.low)}–{num(ci.high)})"
        )
    return _finish(
        base,
        used,
        model,
        p,
        lo,
        hi,
        why,
        terms=terms,
        reference=reference,
        params=params,
        cov=cov,
        alpha=alpha,
        quality=quality,
        coefs=_coefs(params, cov, terms, reference, ranges, z),
    )


def _counts(rows: pd.DataFrame, used: pd.DataFrame) -> dict[str, float]:
    pr, pe = float(rows["poison_requests"].sum()), float(rows["poison_events"].sum())
    return {
        "trials": len(rows),
        "trials_used": len(used),
        "trials_no_poison": len(rows) - len(used),
        "poison_requests": pr,
        "poison_events": pe,
        "reuse_share": pe / pr if pr > 0 else np.nan,
        "reused_poison": float(rows["reused_poison"].sum()) if "reused_poison" in rows else np.nan,
        "crashes": float(rows["crashes"].sum()),
        "crashes_in_fit": float(used["crashes"].sum()),
        "uptime_s": float(rows["uptime_s"].sum()),
        "answered": float(rows["answered"].sum()),
    }


def _rates(rows: pd.DataFrame, confidence: float) -> dict[str, float]:
    k = rows["crashes"].sum()
    out = {}
    for name, expo, scale in (
        ("per_hour", rows["uptime_s"].sum() / 3600.0, 1.0),
        ("per_1k", rows["answered"].sum(), 1000.0),
    ):
        est, lo, hi = I.poisson_rate_ci(k, expo, scale, confidence)
        out[name], out[name + "_lo"], out[name + "_hi"] = float(est), float(lo), float(hi)
    return out


def _candidates(rows: pd.DataFrame) -> list[str]:
    """Numeric knobs (and users, the concurrency) with a value in every trial: what a model can use."""
    cands = knob_columns(rows) + ["users"]
    return [k for k in cands if pd.api.types.is_numeric_dtype(rows[k]) and rows[k].notna().all()]


def _terms(used: pd.DataFrame, varying: list[str], notes: list[str]) -> tuple[list[str], dict[str, float]]:
    """The knobs to model (while the trials leave parameters to spare), each centred at the measured value
    closest to its median, so exp(intercept) is p at a point that was run."""
    terms = varying[: max(0, len(used) - 1)]  # one parameter per knob, plus the intercept
    if len(terms) < len(varying):
        notes.append(f"too few trials to model {', '.join(varying[len(terms) :])}: pooled over it")
    reference = {}
    for k in terms:
        vals = np.unique(used[k].to_numpy(float))
        reference[k] = float(vals[np.argmin(np.abs(vals - np.median(used[k])))])
    return terms, reference


def _glm(y, X, offset, family):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # separation and boundary warnings: judged by _stable
        return GLM(y, X, family=family, offset=offset).fit()


def _stable(res, terms, ranges) -> bool:
    """A finite fit whose knob effects stay within e^±20 over the measured range (else the MLE ran off)."""
    b, se = np.asarray(res.params), np.asarray(res.bse)
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(se))):
        return False
    span = np.array([ranges[k][1] - ranges[k][0] for k in terms])
    return bool(np.all(np.abs(b[1:]) * span < 20) and np.all(se[1:] * span < 20))


def _choose(y, X, offset, pois, quality, n):
    """Poisson or negative binomial, by AIC; returns (model, fitted GLM, alpha, why) and records the negative
    binomial's AIC and alpha in ``quality``."""
    aic_p = quality["aic_poisson"]
    if n < 2:
        return (
            POISSON,
            pois,
            0.0,
            ("Poisson: one trial cannot show variation between trials, so there is no dispersion to estimate"),
        )
    nb = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            nb = NegativeBinomial(y, X, offset=offset).fit(start_params=np.r_[pois.params, 0.1], disp=0, maxiter=300)
        except (ValueError, np.linalg.LinAlgError):
            nb = None
    ok = nb is not None and nb.mle_retvals.get("converged", False) and np.all(np.isfinite(nb.params))
    if not ok:
        return (
            POISSON,
            pois,
            0.0,
            ("Poisson: the negative binomial fit did not converge (no extra variation between trials to estimate)"),
        )
    alpha, aic_nb = float(nb.params[-1]), float(nb.aic)
    quality.update(aic_nb=aic_nb, alpha=alpha)
    if aic_nb < aic_p and alpha > 1e-6:
        res = _glm(y, X, offset, families.NegativeBinomial(alpha=alpha))
        return (
            NEGBIN,
            res,
            alpha,
            (
                f"negative binomial: it lowers the AIC ({aic_nb:.1f} vs {aic_p:.1f}) because "
                "crash counts vary between trials more than a Poisson allows, so its wider "
                "interval is the honest one"
            ),
        )
    return (
        POISSON,
        pois,
        0.0,
        (
            f"Poisson: the negative binomial's extra dispersion parameter does not lower the "
            f"AIC ({aic_nb:.1f} vs {aic_p:.1f}): trials vary no more than chance allows"
        ),
    )


def _quality(res) -> dict[str, float]:
    """Deviance and Pearson χ² over residual degrees of freedom (near 1: the model's variance fits)."""
    df = float(res.df_resid)
    return {
        "df_resid": df,
        "deviance_df": res.deviance / df if df > 0 else np.nan,
        "pearson_df": res.pearson_chi2 / df if df > 0 else np.nan,
    }


def _coefs(params, cov, terms, reference, ranges, z) -> pd.DataFrame:
    rows = []
    for j, k in enumerate(terms, start=1):
        b, se = params[j], np.sqrt(cov[j, j])
        span = ranges[k][1] - ranges[k][0]
        rows.append(
            {
                "term": k,
                "role": role_of(k),
                "reference": reference[k],
                "min": ranges[k][0],
                "max": ranges[k][1],
                "per_unit": np.exp(b),
                "per_unit_lo": np.exp(b - z * se),
                "per_unit_hi": np.exp(b + z * se),
                "over_range": np.exp(b * span),
                "over_range_lo": np.exp((b - z * se) * span),
                "over_range_hi": np.exp((b + z * se) * span),
                "p_value": float(2 * stats.norm.sf(abs(b / se))) if se > 0 else np.nan,
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "term",
            "role",
            "reference",
            "min",
            "max",
            "per_unit",
            "per_unit_lo",
            "per_unit_hi",
            "over_range",
            "over_range_lo",
            "over_range_hi",
            "p_value",
        ],
    )


def role_of(knob: str) -> str:
    return next((role for role, names in ROLES.items() if knob.removeprefix("sweep.") in names), "other")


def _finish(
    base: dict,
    used: pd.DataFrame,
    model: str,
    p: float,
    lo: float,
    hi: float,
    why: str,
    terms=(),
    reference=None,
    params=None,
    cov=None,
    alpha=0.0,
    quality=None,
    coefs=None,
) -> ConfigFit:
    """The ConfigFit, with its per-point table. Without a fit (exact answers), no quality figures."""
    no_fit = {
        "df_resid": np.nan,
        "deviance_df": np.nan,
        "pearson_df": np.nan,
        "aic_poisson": np.nan,
        "aic_nb": np.nan,
        "alpha": 0.0,
    }
    f = ConfigFit(
        model=model,
        p=p,
        p_lo=lo,
        p_hi=hi,
        terms=list(terms),
        reference=dict(reference or {}),
        coefs=coefs if coefs is not None else _coefs([], [], [], {}, {}, 0),
        why=why,
        quality=quality or no_fit,
        points=pd.DataFrame(),
        params=params,
        cov=cov,
        alpha=alpha,
        **base,
    )
    f.points = _points(f, used)
    return f


def _points(f: ConfigFit, used: pd.DataFrame) -> pd.DataFrame:
    """Per sweep point (the knobs that varied): trials, events, crashes, measured p (exact) and the fitted p."""
    keys = list(f.ranges)
    if keys:
        g = used.groupby(keys, sort=True, dropna=False)
        pts = pd.DataFrame(
            {"trials": g.size(), "poison_events": g["poison_events"].sum(), "crashes": g["crashes"].sum()}
        ).reset_index()
    else:
        pts = pd.DataFrame(
            {"trials": [len(used)], "poison_events": [used["poison_events"].sum()], "crashes": [used["crashes"].sum()]}
        )
    est, lo, hi = I.poisson_rate_ci(pts["crashes"], pts["poison_events"], 1.0, f.confidence)
    if f.model == ALL_CRASHED:  # shares, as the model: exact binomial per point
        cis = [
            stats.binomtest(int(n), int(n)).proportion_ci(f.confidence, method="exact") if n > 0 else None
            for n in pts["poison_events"]
        ]
        lo = np.array([ci.low if ci else np.nan for ci in cis])
        hi = np.where(np.isnan(lo), np.nan, 1.0)
    pts["p"], pts["p_lo"], pts["p_hi"] = est, lo, hi
    grid = pd.DataFrame({k: pts[k] if k in pts else f.reference.get(k) for k in f.terms}, index=pts.index)
    pts["fit"], pts["fit_lo"], pts["fit_hi"] = f.p_curve(grid)
    return pts


def curves(f: ConfigFit, n: int = 60) -> pd.DataFrame:
    """The fitted p over the first term's measured range, one curve per measured value of the second term (the
    rest at their reference): columns x, group, p, lo, hi. Empty when nothing varied in the model."""
    if not f.terms:
        return pd.DataFrame(columns=["x", "group", "p", "lo", "hi"])
    k = f.terms[0]
    xs = np.linspace(*f.ranges[k], n)
    groups = sorted(f.points[f.terms[1]].unique()) if len(f.terms) > 1 else [None]
    out = []
    for gv in groups:
        grid = pd.DataFrame({t: f.reference[t] for t in f.terms}, index=range(n))
        grid[k] = xs
        if gv is not None:
            grid[f.terms[1]] = gv
        est, lo, hi = f.p_curve(grid)
        out.append(pd.DataFrame({"x": xs, "group": gv, "p": est, "lo": lo, "hi": hi}))
    return pd.concat(out, ignore_index=True)
