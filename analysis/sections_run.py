"""The report's record of the run: what was run, the two campaigns side by side, every trial."""

from __future__ import annotations

import json

import pandas as pd

from mmchaos.signatures import Signatures

from . import stats
from .document import Doc
from .formatting import by_config, ci, duration, integer, num
from .results import CampaignResults, fatal_lines, read_server_log

LOG_TAIL_LINES = 25


def distinct(values) -> str:
    return ", ".join(sorted({str(x) for x in values if x is not None and not pd.isna(x)})) or "—"


def what_was_run(doc: Doc, c: CampaignResults) -> None:
    doc.h(2, "What was run")
    rows = []
    for cfg in c.configs:
        t = c.trials[c.trials["config"] == cfg]
        first = t.iloc[0] if len(t) else None
        wl = json.loads(first["workload"]) if first is not None else {}
        rows.append(
            {
                "configuration": cfg,
                "vLLM": distinct(t["engine"]),
                "target": distinct(t["target"]),
                "flags": ", ".join(sorted(set(t["flags"]))) or "(none)",
                "env": distinct(t["env"]),
                "users": wl.get("users", "—"),
                "shape": wl.get("shape", "—"),
                "duration / trial": duration(t["duration_s"].mean()),
                "max requests": wl.get("max_requests") if wl.get("max_requests") is not None else "—",
                "trials": len(t),
                "git": distinct(t["git_rev"]),
            }
        )
    doc.table(pd.DataFrame(rows))
    machines = sorted({str(m) for m in c.trials["machine"].dropna()})
    if machines:
        doc.p("Machine: " + "; ".join(machines))
    swept: dict[str, set] = {}
    for point in c.trials["sweep"].map(json.loads):
        for k, v in point.items():
            swept.setdefault(k, set()).add(v)
    if swept:
        doc.p(
            "Sweep: "
            + "; ".join(f"{k} over {', '.join(map(str, sorted(v)))}" for k, v in swept.items())
            + " (every combination; the columns above show a configuration's first trial, the Trials section "
            "each trial's point in its folder name)."
        )
    mix = {
        json.dumps({k: v for k, v in (json.loads(w).get("mix") or {}).items() if k not in swept}, sort_keys=True)
        for w in c.trials["workload"]
    }
    if len(mix) == 1 and next(iter(mix)) != "{}":
        doc.p(
            "Request mix (weights"
            + (", swept kinds aside" if swept else "")
            + "): "
            + ", ".join(f"{k} {v}" for k, v in json.loads(next(iter(mix))).items())
        )


def side_by_side(doc, c, verdict, crash, lat, tput) -> None:
    doc.h(2, "Side by side: the two campaigns")
    camps = list(dict.fromkeys(cfg.split("/", 1)[0] for cfg in c.configs))
    names: dict[str, dict[str, str]] = {}
    for cfg in c.configs:
        camp, name = cfg.split("/", 1)
        names.setdefault(name, {})[camp] = cfg
    common = [n for n, d in names.items() if len(d) == len(camps)]
    if not common:
        doc.p("The two campaigns share no configuration name; compare them in the summary table above.")
        return
    v, cr, tp = by_config(verdict), by_config(crash), by_config(tput)
    pooled = lat[lat["kind"] == stats.ALL_VALID].set_index("config")
    rows = []
    for n in common:
        for label, f in (
            ("workaround verified", lambda k: v[k]["verdict"]),
            (
                "crashes per hour of uptime",
                lambda k: ci(cr[k]["per_hour_up"], cr[k]["per_hour_up_lo"], cr[k]["per_hour_up_hi"]),
            ),
            (
                "crashes / 1,000 requests",
                lambda k: ci(cr[k]["per_1k_requests"], cr[k]["per_1k_requests_lo"], cr[k]["per_1k_requests_hi"]),
            ),
            ("p50 ms (valid)", lambda k: ci(*pooled.loc[k, ["p50", "p50_lo", "p50_hi"]]) if k in pooled.index else "—"),
            ("p95 ms (valid)", lambda k: ci(*pooled.loc[k, ["p95", "p95_lo", "p95_hi"]]) if k in pooled.index else "—"),
            ("ok / s", lambda k: num(tp[k]["ok_per_s"])),
        ):
            rows.append({"configuration": n, "measure": label, **{camp: f(names[n][camp]) for camp in camps}})
    doc.table(pd.DataFrame(rows))


def trials(doc, c, durations) -> None:
    doc.h(2, "Trials")
    r = c.requests
    ok = r.loc[r["outcome"] == "ok", ["config", "trial"]].groupby(["config", "trial"], observed=True).size()
    ncrash = c.crashes.groupby(["config", "trial"], observed=True).size()
    ndrift = stats.drift_events(c).groupby(["config", "trial"], observed=True).size()
    t = c.trials
    key = pd.MultiIndex.from_arrays([t["config"], t["trial"]])
    doc.table(
        pd.DataFrame(
            {
                "configuration": t["config"].astype(str),
                "trial": t["trial"],
                "folder": t["trial_dir"],
                "status": t["status"],
                "started (UTC)": pd.to_datetime(t["t_start"], unit="s", utc=True).dt.strftime("%Y-%m-%d %H:%M:%S"),
                "duration": t["duration_s"].map(lambda x: num(x, " s")),
                "requests": t["n_requests"].map(integer),
                "ok": [integer(ok.get(k, 0)) for k in key],
                "crashes": [integer(ncrash.get(k, 0)) for k in key],
                "drift lines": [integer(ndrift.get(k, 0)) for k in key],
                "missing files": t["missing"].replace("", "—"),
            }
        )
    )
    crashed = t[[ncrash.get(k, 0) > 0 for k in key]].drop_duplicates("config")
    sigs = Signatures.default()
    for _, tr in crashed.iterrows():
        told = fatal_lines(tr["path"], sigs)
        if told is not None:  # the death as the server told it, not its teardown
            lines, first = told
            doc.h(3, f"How the server died: {tr['config']} trial {tr['trial']} (server.log from line {first})")
        else:
            lines = read_server_log(tr["path"], LOG_TAIL_LINES)
            if lines:
                doc.h(3, f"End of server.log: {tr['config']} trial {tr['trial']} (no line names its death)")
        if lines:
            doc.code("\n".join(line[:300] for line in lines))
