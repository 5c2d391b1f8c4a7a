"""Per configuration: is the workaround verified, in the sense of the bug report's verification step?

"Send the poison request (expect 400), then the same image in a valid request: the server must not log the
cache assertion/drift, must not die, /health stays 200, normal embedding requests keep succeeding."

Four checks, all must hold for "yes"; each comes with its evidence as a sentence:
1. the bad request fails alone: every malformed request the server answered got its expected status (and
   no more of them went unanswered — timeout, refused — than the share normal requests may fail);
2. /health stays 200: no failed health poll and no crash;
3. normal requests keep succeeding: ok share of valid kinds sent after the first malformed_post request
   (per trial) is at least ``min_ok_share``;
4. no cache drift or cache-miss line in the server log.
A check that could not be made (nothing of the kind was sent or recorded) counts as failed: an untested
workaround is not a verified one.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mmchaos import schema as S
from mmchaos.schema import MALFORMED_KINDS, VALID_KINDS

from .results import CampaignResults
from .stats import drift_events, status_label

MIN_OK_SHARE = 0.99
CHECKS = ("fails_alone", "health_ok", "normal_ok", "no_drift")
CHECK_TITLES = {
    "fails_alone": "bad request fails alone",
    "health_ok": "/health stays 200",
    "normal_ok": "normal requests keep succeeding",
    "no_drift": "no cache drift logged",
}


def verdicts(c: CampaignResults, min_ok_share: float = MIN_OK_SHARE) -> pd.DataFrame:
    """One row per config: verdict ("yes"/"no"), one bool per check, and ``evidence`` (list of sentences)."""
    rows = []
    requests = c.requests[["config", "trial", "kind", "case", "expected_status", "status", "outcome", "t_start"]]
    for cfg in c.configs:
        r = requests[requests["config"] == cfg]
        checks = {
            "fails_alone": _fails_alone(r, min_ok_share),
            "health_ok": _health_ok(c, cfg),
            "normal_ok": _normal_ok(r, min_ok_share),
            "no_drift": _no_drift(c, cfg),
        }
        row = {"config": cfg, "verdict": "yes" if all(ok for ok, _ in checks.values()) else "no"}
        row.update({k: ok for k, (ok, _) in checks.items()})
        row["evidence"] = [f"{CHECK_TITLES[k]}: {'yes' if ok else 'no'} — {why}" for k, (ok, why) in checks.items()]
        rows.append(row)
    return pd.DataFrame(rows)


def _breakdown(status: pd.Series, outcome: pd.Series) -> str:
    """'503 ×4, connection_error ×2' for requests that did not do what they should."""
    label = np.where(status.notna(), status_label(status), outcome.astype(str))
    vc = pd.Series(label).value_counts()
    return ", ".join(f"{k} ×{v}" for k, v in vc.items())


def _fails_alone(r: pd.DataFrame, min_ok_share: float) -> tuple[bool, str]:
    """Every malformed request the server answered got its expected status; those it never answered (timeouts,
    refused) are tolerated at the rate normal requests are allowed to fail."""
    m = r[r["kind"].isin(MALFORMED_KINDS) & r["expected_status"].notna()]
    if not len(m):
        return False, "no malformed request with an expected status was sent, so this was not tested"
    good = m["status"] == m["expected_status"]
    answered = m["status"].notna()
    n, k = len(m), int(good.sum())
    wrong, unanswered = int((answered & ~good).sum()), int((~answered).sum())
    msg = f"{k:,} of {n:,} malformed requests got their expected status"
    if k < n:
        bad = m[~good]
        msg += f"; the others got {_breakdown(bad['status'], bad['outcome'])}"
        cases = bad["case"].astype(object).fillna("(no case)").value_counts()
        msg += f" (cases: {', '.join(f'{c} ×{v}' for c, v in cases.items())})"
    ok = wrong == 0 and unanswered <= (1 - min_ok_share) * n
    if wrong == 0 and unanswered and ok:
        msg += f"; {unanswered:,} unanswered is within the {1 - min_ok_share:.0%} allowed"
    return ok, msg


def _health_ok(c: CampaignResults, cfg: str) -> tuple[bool, str]:
    h = c.health[c.health["config"] == cfg]
    n_trials = int((c.trials["config"] == cfg).sum())
    no_health = n_trials - h["trial"].nunique()
    crashes = c.crashes[c.crashes["config"] == cfg]
    failed = h[~h["ok"].fillna(False).astype(bool) | (h["status"].notna() & (h["status"] != 200))]
    parts = [f"{len(failed):,} of {len(h):,} /health polls failed", f"{len(crashes):,} crash(es)"]
    if no_health:
        parts.append(f"{no_health} of {n_trials} trial(s) recorded no /health polls")
    ok = len(h) > 0 and len(failed) == 0 and len(crashes) == 0
    if not len(h):
        parts.append("nothing recorded, so this was not tested")
    return ok, "; ".join(parts)


def _normal_ok(r: pd.DataFrame, min_ok_share: float) -> tuple[bool, str]:
    first = r.loc[r["kind"] == "malformed_post"].groupby("trial")["t_start"].min()
    if not len(first):
        return False, "no malformed_post request was sent, so this was not tested"
    v = r[r["kind"].isin(VALID_KINDS)]
    after = v[v["t_start"].to_numpy() > v["trial"].map(first).to_numpy(dtype=float, na_value=np.inf)]
    if not len(after):
        return False, "no valid request was sent after the first malformed_post request"
    ok = after["outcome"] == S.OK
    share = ok.mean()
    msg = (f"{int(ok.sum()):,} of {len(after):,} valid requests sent after the first malformed_post request "
           f"succeeded ({share:.2%}; threshold {min_ok_share:.0%})")
    if not ok.all():
        bad = after[~ok]
        msg += f"; failures: {_breakdown(bad['status'], bad['outcome'])}"
    return bool(share >= min_ok_share), msg


def _no_drift(c: CampaignResults, cfg: str) -> tuple[bool, str]:
    d = drift_events(c)
    d = d[d["config"] == cfg]
    tr = c.trials[c.trials["config"] == cfg]
    no_log = int(tr["missing"].str.contains(S.SERVER_LOG, regex=False).sum())
    if len(d):
        sig = d["signature"].astype(str).value_counts()
        return False, f"{len(d):,} drift/cache-miss line(s) logged ({', '.join(f'{k} ×{v}' for k, v in sig.items())})"
    if no_log == len(tr):
        return False, "no server log was captured (attach mode?), so this was not tested"
    extra = f" ({no_log} of {len(tr)} trial(s) have no server log)" if no_log else ""
    return True, "the server logged no cache drift or cache-miss line" + extra
