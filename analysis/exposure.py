"""Exposure per trial: how much chance a server had to crash, counted only while it was up.

The bug needs three things in one server's life: an image the engine (P1) has not got yet, a request with it that
fails after the API server (P0) rendered and cached it (a post-render 400; or a client abort, if it comes after
rendering and before the engine gets the request), and a later request with that image that reaches the engine,
which then misses it. A *poison event* is such a failure: the first poison request on an image in a server's life,
sent before any request with that image had been answered by the engine, whose image a request reaching the engine
sent again before the next crash. A poison request on an image the engine already holds does no harm: P0 believes
P1 has it, and P1 has it (with the default 4 GiB cache nothing was evicted in our runs). Measured on vLLM 0.30.0
(docs: the sweep benchmark): the reused poison requests that crashed the server were all events; those on cached
images never did. A crash needs no poison event when two requests carry a new image at once (a race of its
first uses, mmchaos/cause_rule.py: measured at the sweep's calm point); the exposure does not count such races, and
the hazard fit says when trials without a poison event crashed anyway. Per trial also: the load window and how
much of it the server was up (with the ``restart`` crash policy most rows of a crash-prone configuration are
refusals while it restarts: they are no exposure), the requests it answered, and the crashes.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from mmchaos import schema as S
from mmchaos.verdict_rule import is_poison

from .results import CampaignResults, media_hashes

BASE_COLUMNS = (
    "config",
    "trial",
    "engine",
    "target",
    "users",
    "duration_s",
    "uptime_s",
    "answered",
    "valid_answered",
    "poison_requests",
    "abort_requests",
    "reused_poison",
    "poison_events",
    "reuse_share",
    "crashes",
)
NOT_TO_ENGINE = ("malformed_pre", "tokenize")  # kinds that never get their images to the engine (besides poison)


def exposure(c: CampaignResults) -> pd.DataFrame:
    """One row per trial: config, trial, the sweep knobs (a column per knob, NaN where a trial's sweep lacks it),
    engine, target, users, duration_s (the load window), uptime_s, answered, valid_answered, poison_requests
    (poison kinds, not cut, not failed by the server), abort_requests (of them, client disconnects),
    reused_poison (of them, those whose image a request reaching the engine sent again before the next crash,
    cached or not), poison_events (the model's exposure: see the module), reuse_share (poison_events per poison
    request) and crashes."""
    t = c.trials.reset_index(drop=True)
    keys = pd.MultiIndex.from_arrays([t["config"].astype(str), t["trial"].astype(np.int64)])
    start = t["t_start"].to_numpy(float)
    end = start + t["duration_s"].fillna(0).to_numpy(float)
    crash_trial = _trial_of(keys, c.crashes)
    crash_t = c.crashes["t_detected"].to_numpy(float)
    out = pd.DataFrame({"config": t["config"], "trial": t["trial"]})
    knobs = _knobs(t)
    users = pd.to_numeric(t.get("users"), errors="coerce") if "users" in t else pd.Series(np.nan, index=t.index)
    if "users" in knobs:  # a users sweep is the users column
        users = pd.to_numeric(knobs.pop("users"), errors="coerce").fillna(users)
    out = pd.concat([out, knobs], axis=1)
    out["engine"] = t.get("engine")
    out["target"] = t.get("target")
    out["users"] = users.astype(float)
    out["duration_s"] = end - start
    out["uptime_s"] = out["duration_s"] - _downtime(keys, start, end, crash_trial, crash_t, c.health)
    ti = _trial_of(keys, c.requests)
    sent = np.bincount(ti[ti >= 0], minlength=len(t))
    out.loc[sent == 0, "uptime_s"] = 0.0  # a trial that sent nothing (stopped before its load) exposed nothing
    out = out.assign(**_request_counts(keys, start, crash_trial, crash_t, c.requests))
    with np.errstate(divide="ignore", invalid="ignore"):
        out["reuse_share"] = out["poison_events"] / out["poison_requests"].where(out["poison_requests"] > 0)
    out["crashes"] = np.bincount(crash_trial[crash_trial >= 0], minlength=len(t))
    return out


def knob_columns(exp: pd.DataFrame) -> list[str]:
    """The sweep knob columns of an :func:`exposure` table."""
    return [col for col in exp.columns if col not in BASE_COLUMNS]


def _trial_of(keys: pd.MultiIndex, df: pd.DataFrame) -> np.ndarray:
    """Row -> position of its trial in ``keys`` (-1 when the trial is unknown)."""
    if not len(df):
        return np.zeros(0, dtype=np.int64)
    rows = pd.MultiIndex.from_arrays([df["config"].astype(str), df["trial"].astype(np.int64)])
    return keys.get_indexer(rows).astype(np.int64)


def _knobs(trials: pd.DataFrame) -> pd.DataFrame:
    raw = trials["sweep"] if "sweep" in trials else pd.Series("{}", index=trials.index)
    rows = []
    for s in raw:
        try:
            d = json.loads(s) if isinstance(s, str) and s else (s if isinstance(s, dict) else {})
        except ValueError:
            d = {}
        rows.append(d if isinstance(d, dict) else {})
    knobs = pd.DataFrame(rows, index=trials.index)
    for col in list(knobs.columns):
        vals = knobs[col].map(lambda v: float(v) if isinstance(v, (bool, int, float)) else v)
        as_num = pd.to_numeric(vals, errors="coerce")
        knobs[col] = as_num if as_num.notna().sum() == vals.notna().sum() else vals
        if col in BASE_COLUMNS and col != "users":  # cannot shadow a column of ours
            knobs = knobs.rename(columns={col: f"sweep.{col}"})
    return knobs


def _downtime(keys, start, end, crash_trial, crash_t, health: pd.DataFrame) -> np.ndarray:
    """Seconds of each trial's load window from a crash's detection to the next /health poll that answered ok
    (or the window's end)."""
    n = len(keys)
    keep = (crash_trial >= 0) & np.isfinite(crash_t)
    if not keep.any():
        return np.zeros(n)
    cr = pd.DataFrame({"i": crash_trial[keep], "t": crash_t[keep]}).sort_values("t")
    ok = health.loc[health["ok"].eq(True) & health["t"].notna()] if len(health) else health
    back = pd.DataFrame({"i": _trial_of(keys, ok), "t_back": ok["t"].to_numpy(float) if len(ok) else []})
    back = back.sort_values("t_back")
    m = pd.merge_asof(cr, back, left_on="t", right_on="t_back", by="i", direction="forward", allow_exact_matches=False)
    i = m["i"].to_numpy()
    lo = np.maximum(m["t"].to_numpy(), start[i])
    hi = np.minimum(m["t_back"].fillna(np.inf).to_numpy(), end[i])
    d = pd.DataFrame({"i": i, "lo": lo, "hi": hi}).sort_values(["i", "lo"])
    # a crash detected before the server came back (no ok poll between) must not count its downtime twice
    prev_hi = d.groupby("i")["hi"].cummax().groupby(d["i"]).shift(fill_value=-np.inf)
    length = (d["hi"] - np.maximum(d["lo"], prev_hi)).clip(lower=0)
    return np.bincount(d["i"], weights=length, minlength=n)


def _request_counts(keys, start, crash_trial, crash_t, r: pd.DataFrame) -> dict[str, np.ndarray]:
    n = len(keys)
    ti = _trial_of(keys, r)
    known = ti >= 0
    answered = r["status"].notna().to_numpy() & known
    valid = r["kind"].isin(S.VALID_KINDS).to_numpy() & answered
    poison = _poison_kind(r["kind"], r["case"]) & ~_is(r["outcome"], S.CUT) & ~_is(r["cause"], S.SERVER) & known
    reused, events = _events(ti, start, crash_trial, crash_t, r, poison)

    def count(m):
        return np.bincount(ti[m], minlength=n)

    aborts = poison & _is(r["kind"], "abort")  # of the poison, the client's disconnects (the rest: 400s, probes)
    return {
        "answered": count(answered),
        "valid_answered": count(valid),
        "poison_requests": count(poison),
        "abort_requests": count(aborts),
        "reused_poison": count(reused),
        "poison_events": count(events),
    }


def _is(col: pd.Series, value: str) -> np.ndarray:
    """``col == value`` as plain booleans, missing values False (whatever the column's dtype)."""
    return (col == value).to_numpy(dtype=bool, na_value=False)


def _poison_kind(kind: pd.Series, case: pd.Series) -> np.ndarray:
    """verdict_rule.is_poison per row, evaluated once per distinct (kind, case)."""
    kc, ku = pd.factorize(kind)
    cc, cu = pd.factorize(case)
    combo = (kc.astype(np.int64) + 1) * (len(cu) + 1) + (cc + 1)
    uniq, inverse = np.unique(combo, return_inverse=True)
    ku, cu = list(ku), list(cu)
    rule = np.array(
        [
            is_poison(ku[k] if k >= 0 else None, cu[c] if c >= 0 else None)
            for k, c in zip(uniq // (len(cu) + 1) - 1, uniq % (len(cu) + 1) - 1)
        ],
        dtype=bool,
    )
    return rule[inverse.ravel()] if len(kind) else np.zeros(0, bool)


def _reaches_engine(kind: pd.Series, case: pd.Series) -> np.ndarray:
    """Requests that reach the engine (EngineCore, P1) with their images: not a poison request (it fails before
    the engine gets it, or is abandoned), not one that never renders (malformed_pre) or never runs (/tokenize)."""
    return ~_poison_kind(kind, case) & ~kind.isin(NOT_TO_ENGINE).to_numpy(dtype=bool, na_value=False)


def _events(ti, start, crash_trial, crash_t, r: pd.DataFrame, poison: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(reused, events): poison rows whose image (any of image_hashes) a later request that reaches the engine
    sent to the same server (same trial, before the next crash: a crash ends the server's life and its caches);
    and, of those, the poison events: the first poison request on that image in that life, sent before any
    request with it had been answered 2xx by the engine (after one, P1 holds the image: a P0 hit finds it there,
    and a failure after rendering leaves no drift behind)."""
    reused, event = np.zeros(len(r), dtype=bool), np.zeros(len(r), dtype=bool)
    if not poison.any():
        return reused, event
    t = r["t_start"].to_numpy(float)
    life = _life(ti, t - start[np.maximum(ti, 0)], crash_trial, crash_t - start[np.maximum(crash_trial, 0)], len(start))
    hashes = pa.array(media_hashes(r), type=pa.string(), from_pandas=True)
    lists = pc.split_pattern(hashes, ",")
    parent = pc.list_parent_indices(lists).to_numpy()
    flat = pc.list_flatten(lists)
    code = pc.dictionary_encode(flat).indices.to_numpy(zero_copy_only=False).astype(np.int64)
    keep = pc.not_equal(flat, "").to_numpy(zero_copy_only=False) & (ti[parent] >= 0)
    parent, code = parent[keep], code[keep]
    # one integer per (trial, server life, image)
    key = (ti[parent] * (life.max() + 1) + life[parent]) * (code.max() + 1 if len(code) else 1) + code
    sel = np.isin(key, np.unique(key[poison[parent]]))  # only images some poison request carried
    key, parent = key[sel], parent[sel]
    tp = t[parent]
    engine = _reaches_engine(r["kind"], r["case"])[parent]
    answered_ok = engine & (r["status"].to_numpy(dtype=float, na_value=np.nan)[parent] // 100 == 2)

    def per_key(values: np.ndarray, how: str, fill: float) -> np.ndarray:
        return pd.Series(np.where(np.isnan(values), fill, values)).groupby(key).transform(how).to_numpy()

    last_reach = per_key(np.where(engine, tp, np.nan), "max", -np.inf)
    first_cached = per_key(np.where(answered_ok, tp, np.nan), "min", np.inf)
    first_poison = per_key(np.where(poison[parent], tp, np.nan), "min", np.inf)
    is_poison = poison[parent]
    hit = is_poison & (tp < last_reach)
    reused[parent[hit]] = True
    event[parent[hit & (tp == first_poison) & (tp <= first_cached)]] = True
    return reused, event


def _life(ti, t_rel, crash_trial, crash_rel, n_trials) -> np.ndarray:
    """Which server of its trial each row met: the number of crashes of that trial detected at or before it."""
    keep = crash_trial >= 0
    if not keep.any():
        return np.zeros(len(ti), dtype=np.int64)
    span = 2.0 * np.nanmax(np.abs(np.r_[t_rel, crash_rel[keep]])) + 2.0  # trials laid end to end on one axis
    order = np.argsort(crash_trial[keep] * span + crash_rel[keep])
    ckey = (crash_trial[keep] * span + crash_rel[keep])[order]
    first = np.searchsorted(np.sort(crash_trial[keep]), np.arange(n_trials))
    tis = np.maximum(ti, 0)
    return (np.searchsorted(ckey, tis * span + np.nan_to_num(t_rel), side="right") - first[tis]).astype(np.int64)
