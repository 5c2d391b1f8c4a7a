"""Per configuration: the three-level verdict (mmchaos.verdict_rule) from the recorded rows, with its evidence.

The rule is the one the web UI applies live; here its counts come from the tables of every trial of the
configuration. Requests cut by the end of a run are in no count.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mmchaos import schema as S
from mmchaos.outcomes import causes
from mmchaos.signatures import Signatures
from mmchaos.verdict_rule import CHECKS, FAILS, NOT_EXERCISED, Counts, attempt_counts, judge

from .fault_effects import FAILS as FAULT_FAILS
from .fault_effects import fault_axis, fault_effects, outside_faults
from .results import CampaignResults
from .stats import drift_events, status_label

_GROUP = ["config", "kind", "case", "status", "outcome", "expected_status", "final", "drift_answer", "consistent"]


def drift_answers(requests: pd.DataFrame) -> np.ndarray:
    """Rows the server answered with a cache miss (a 503 whose text a drift signature matches)."""
    is_503 = (requests["status"] == 503).to_numpy()
    out = np.zeros(len(requests), dtype=bool)
    if is_503.any():
        texts = requests.loc[is_503, "error"].astype(object).fillna("")
        drift = {t: Signatures.default().drift_answer(503, t) is not None for t in texts.unique()}
        out[is_503] = texts.map(drift).to_numpy(dtype=bool)
    return out


def counts_by_config(c: CampaignResults, effects: pd.DataFrame | None = None) -> dict[str, Counts]:
    """The verdict's counts per configuration, from all its trials (outside the outages of injected faults:
    ``effects``, analysis.fault_effects, judges those)."""
    effects = effects if effects is not None else pd.DataFrame()
    r = outside_faults(c.requests, effects, "t_start")
    final = r["final"].fillna(True) if "final" in r else pd.Series(True, index=r.index)
    rows = pd.DataFrame(
        {
            "config": r["config"].astype(str),
            "kind": r["kind"].astype(str),
            # the case matters to the rule only for probe steps
            "case": r["case"].astype(object).where(r["kind"] == "probe", None),
            "status": r["status"],
            "outcome": r["outcome"].astype(str),
            "expected_status": r["expected_status"],
            "final": final.astype(bool),
            "drift_answer": drift_answers(r),
            # results written before the oracle have no such column: nothing was compared
            "consistent": (r["consistent"] if "consistent" in r else pd.Series(None, index=r.index)).astype(object),
        }
    )
    out = {cfg: Counts() for cfg in c.configs}
    for key, n in rows.groupby(_GROUP, dropna=False, observed=True).size().items():
        cfg, kind, case, status, outcome, expected, fin, drift, same = key
        out[cfg] += attempt_counts(
            kind,
            None if pd.isna(case) else case,
            None if pd.isna(status) else int(status),
            outcome,
            None if pd.isna(expected) else int(expected),
            bool(fin),
            bool(drift),
            int(n),
            consistent=None if pd.isna(same) else bool(same),
        )
    h = outside_faults(c.health, effects, "t")
    h = h.assign(failed=~h["ok"].fillna(False).astype(bool))
    polls = h.groupby("config", observed=True)["failed"].agg(["size", "sum"])
    crashes = outside_faults(c.crashes, effects, "t_detected").groupby("config", observed=True).size()
    drift = drift_events(c).groupby("config", observed=True).size()
    for cfg in c.configs:
        n, failed = polls.loc[cfg] if cfg in polls.index else (0, 0)
        out[cfg] += Counts(
            crashes=int(crashes.get(cfg, 0)),
            health_polls=int(n),
            health_failed=int(failed),
            drift_lines=int(drift.get(cfg, 0)),
        )
    return out


def _breakdown(rows: pd.DataFrame) -> str:
    """'503 ×4, connection_error ×2' for requests that did not do what they should."""
    label = np.where(rows["status"].notna(), status_label(rows["status"]), rows["outcome"].astype(str))
    return ", ".join(f"{k} ×{v}" for k, v in pd.Series(label).value_counts().items())


def _details(c: CampaignResults, cfg: str) -> dict[str, str]:
    """What the failures of each check were, by status and case (added to the rule's sentence)."""
    r = c.requests[c.requests["config"] == cfg]
    server = r[causes(r) == S.SERVER]
    out = {}
    final = server["final"].fillna(True).astype(bool) if "final" in server else pd.Series(True, index=server.index)
    bad = server[final & server["expected_status"].notna()]
    if len(bad):
        cases = bad["case"].astype(object).fillna("(no case)").value_counts()
        out["fails_alone"] = (
            f"the others got {_breakdown(bad)} (cases: {', '.join(f'{k} ×{v}' for k, v in cases.items())})"
        )
    valid = server[final & server["kind"].isin(S.VALID_KINDS)]
    if len(valid):
        out["normal_ok"] = f"failures after the last retry: {_breakdown(valid)}"
    if len(server):
        out["first_try"] = f"failed attempts: {_breakdown(server)}"
    d = drift_events(c)
    d = d[d["config"] == cfg]
    if len(d):
        out["no_drift"] = "logged: " + ", ".join(
            f"{k} ×{v}" for k, v in d["signature"].astype(str).value_counts().items()
        )
    return out


def verdicts(c: CampaignResults, effects: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per config: ``verdict`` (fails / retryable / clean), ``title``, the state of each check (ok,
    failed, not exercised), ``evidence`` (a sentence per check) and ``not_exercised`` (their titles).

    With faults injected, ``faults`` is the fault axis (fails / recovers / not_exercised; analysis.fault_effects):
    the rule judges the load outside the faults' outages, and a configuration that fails a fault fails."""
    effects = fault_effects(c) if effects is None else effects
    axis = fault_axis(effects)
    rows = []
    for cfg, counts in counts_by_config(c, effects).items():
        v = judge(counts)
        details = _details(c, cfg)
        level, title = v.level, v.title
        fault_level, fault_lines = axis.get(str(cfg), ("", []))
        if fault_level == FAULT_FAILS:
            level, title = FAILS, "fails a fault"
        row: dict[str, object] = {
            "config": cfg,
            "verdict": level,
            "title": title,
            "faults": fault_level,
            **{n: st for n, (st, _) in v.checks.items()},
        }
        row["evidence"] = [
            f"{CHECKS[n].title}: {st} — {why}" + (f"; {details[n]}" if n in details else "")
            for n, (st, why) in v.checks.items()
        ] + [f"fault: {x}" for x in fault_lines]
        row["not_exercised"] = [CHECKS[n].title for n, (st, _) in v.checks.items() if st == NOT_EXERCISED]
        rows.append(row)
    return pd.DataFrame(rows)
