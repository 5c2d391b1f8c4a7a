"""Workaround cost on the real engine: throughput and p95 latency of the realistic mix with the multimodal
processor cache off (the report's workaround) vs on, on vLLM 0.32.0 (where the cache-on server survives).

    .venv/bin/python bench/workaround_cost.py [--quick] [--trials 3] [--duration 30]

A campaign file in a temp folder with two configurations of engine 0.32.0: ``cache-on`` (defaults) and
``cache-off`` (``--mm-processor-cache-gb 0``); the realistic mix (default options), 8 users, ``--duration`` s
of load per trial. Trials run interleaved (on, off, on, off, ...) through the campaign runner's run_trial, so
a burst of other load on this shared machine hits both alike; one vLLM server at a time.

Figures come from analysis.stats.workaround_cost (bootstrap intervals: latency over requests, throughput
over trials), with one change: each trial's duration is its load window (first request sent to last answer),
not the whole trial, which would count the server's ~35 s start-up as load time. The ratio reported is
cache-off / cache-on for ok requests per second and for the p95 latency of all valid kinds, with its 95 %
interval. There is no pass/fail goal: it is a measurement.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import campaign_toml, footer, header, load, phase_printer

ENGINE = "0.32.0"
ON, OFF = "cache-on", "cache-off"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 trial of each, 12 s of load (no throughput interval)")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--duration", type=int, default=30)
    p.add_argument("--users", type=int, default=8)
    a = p.parse_args()
    if a.quick:
        a.trials, a.duration = 1, 12
    header(f"bench/workaround_cost.py: cache off vs on, vLLM {ENGINE}")
    from mmchaos import schema
    from mmchaos.analysis import stats
    from mmchaos.analysis.results import load_results
    from mmchaos.harness.campaign import plan as campaign_plan
    from mmchaos.harness.campaign import runner as campaign_runner
    from mmchaos.tables import write_json_atomic

    with tempfile.TemporaryDirectory(prefix="mmchaos-bench-cost-") as tmp:
        tmp = Path(tmp)
        path = campaign_toml(
            tmp,
            "bench-cost",
            trials=a.trials,
            users=a.users,
            duration=a.duration,
            configs=[
                {"name": ON, "engine": ENGINE},
                {"name": OFF, "engine": ENGINE, "flags": ["--mm-processor-cache-gb", "0"]},
            ],
        )
        camp = campaign_plan.load(path)
        runner = campaign_runner.CampaignRunner(camp, tmp / "results", progress=phase_printer())
        runner.preflight()
        camp_dir = tmp / "results" / camp.name
        write_json_atomic(
            camp_dir / schema.CAMPAIGN_MANIFEST, {"name": camp.name, "configs": [ON, OFF], "trials": camp.trials}
        )
        loads = []
        for trial in range(camp.trials):
            for cfg in camp.configs:  # interleaved: on, off, on, off ...
                r = runner.run_trial(cfg, trial, campaign_runner.trial_dir(runner.root, camp, cfg, trial))
                loads.append(load())
                print(
                    f"  {cfg.name} t{trial}: {r.status}, {r.requests} requests, {r.errors} unexpected answers, "
                    f"{len(r.crashes)} crash(es); load average {loads[-1]}",
                    flush=True,
                )

        c = load_results(camp_dir)
        req = c.requests
        end = req["t_start"] + req["latency_ms"].fillna(0) / 1000
        key = ["config", "trial"]
        span = (
            end.groupby([req["config"], req["trial"]], observed=True).max()
            - req.groupby(key, observed=True)["t_start"].min()
        ).rename("load_s")
        trials = c.trials.join(span, on=key)
        whole = trials["duration_s"].copy()
        c.trials["duration_s"] = trials["load_s"].to_numpy()
        per = stats.throughput_per_trial(c)
        cost = stats.workaround_cost(c, baseline=ON)
        lat = stats.latency_table(c)

    print(
        "\nper trial: config, trial, status, load window (s) [whole trial incl. server start (s)], requests, "
        "ok, ok/s, crashes"
    )
    for (_, t), w in zip(per.iterrows(), whole):
        n_crash = int(((c.crashes["config"] == t["config"]) & (c.crashes["trial"] == t["trial"])).sum())
        print(
            f"  {t['config']:9s} t{t['trial']}  {t['status']:9s} {t['duration_s']:6.1f} [{w:5.1f}]  "
            f"{t['n_requests']:6d} {t['ok']:6d}  {t['ok_per_s']:6.2f}  {n_crash}"
        )
    print("\np95 latency of successful requests, all valid kinds pooled (ms) [95% interval]:")
    for _, r in lat[lat["kind"] == stats.ALL_VALID].iterrows():
        print(
            f"  {r['config']:9s} n={r['n']:6d}  p50 {r['p50']:8.1f}  p95 {r['p95']:8.1f} "
            f"[{r['p95_lo']:.1f}-{r['p95_hi']:.1f}]"
        )
    row = cost[(cost["config"] == OFF) & (cost["kind"] == stats.ALL_VALID)]
    if not len(row):
        print("no successful requests in one of the configurations: no ratio")
        footer()
        return 1
    r = row.iloc[0]
    print("\ncache-off / cache-on (95% bootstrap intervals):")
    print(
        f"  throughput (ok req/s)  ratio {r['throughput_ratio']:.3f}  [{r['throughput_ratio_lo']:.3f}-"
        f"{r['throughput_ratio_hi']:.3f}]" + ("  (1 trial each: no interval)" if a.trials < 2 else "")
    )
    print(f"  p95 latency            ratio {r['p95_ratio']:.3f}  [{r['p95_ratio_lo']:.3f}-{r['p95_ratio_hi']:.3f}]")
    print(f"  p50 latency            ratio {r['p50_ratio']:.3f}  [{r['p50_ratio_lo']:.3f}-{r['p50_ratio_hi']:.3f}]")
    by_kind = cost[(cost["config"] == OFF) & (cost["kind"] != stats.ALL_VALID)]
    print(
        "  p95 ratio by kind: "
        + ", ".join(
            f"{k} {v:.2f} [{lo:.2f}-{hi:.2f}]"
            for k, v, lo, hi in zip(
                by_kind["kind"], by_kind["p95_ratio"], by_kind["p95_ratio_lo"], by_kind["p95_ratio_hi"]
            )
        )
    )
    crashed = c.crashes.groupby("config", observed=False).size()
    print(f"  crashes: {', '.join(f'{k} {v}' for k, v in crashed.items())}")
    footer()
    return 0


if __name__ == "__main__":
    sys.exit(main())
