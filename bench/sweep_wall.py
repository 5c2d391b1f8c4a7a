"""Wall time of a full sweep campaign on real vLLM, where it goes, and the hazard it measured.

    flock /tmp/mmchaos-engine.lock .venv/bin/python bench/sweep_wall.py [--campaign campaigns/sweep.toml]
        [--results DIR] [--quick]

Runs the campaign (default: the shipped ``campaigns/sweep.toml``, a [sweep] of the post-render 400's weight over
three values × 0.30.0 default and cache off × 1 trial, restart policy) through the campaign runner, then loads
the results, fits the crash hazard and writes the report. Prints per trial: server start-up (manifest t_start
to t_load_start), load window, crashes and the down time they cost (detection to the next healthy /health),
stop (t_load_end to t_end); then the totals, the analysis times and the fitted p per configuration. ``--quick``:
a two-point sweep of 20 s trials on 0.30.0 default only (its figures are not the ones in docs/benchmarks.md).
A measurement, no goal. All traffic to 127.0.0.1; one vLLM server at a time; every server stopped by the process
group the runner recorded.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, footer, header, phase_printer


def quick_campaign(folder: Path) -> Path:
    text = (ROOT / "campaigns" / "sweep.toml").read_text()
    text = text.replace("duration = 60", "duration = 20").replace(
        "malformed_post = [0, 2, 10]", "malformed_post = [0, 10]"
    )
    text = text.split('\n[[config]]\nname = "v0.30-cache-off"')[0]
    text = text.replace('name = "sweep"', 'name = "sweep-quick"').replace('locustfile = "../', f'locustfile = "{ROOT}/')
    path = folder / "sweep-quick.toml"
    path.write_text(text)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--campaign", default=str(ROOT / "campaigns" / "sweep.toml"))
    ap.add_argument("--results", help="results root (default: a temp folder, kept and printed)")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()

    from mmchaos.analysis import hazard, report
    from mmchaos.analysis.results import load_results
    from mmchaos.harness.campaign import plan as campaign_plan
    from mmchaos.harness.campaign import runner as campaign_runner

    header("sweep wall time")
    root = Path(a.results or tempfile.mkdtemp(prefix="mmchaos-bench-sweep-"))
    path = quick_campaign(root) if a.quick else Path(a.campaign)
    camp = campaign_plan.load(path)
    runs = camp.runs()
    print(
        f"campaign {path}: {len(camp.configs)} configurations × {len(camp.points)} points × {camp.trials} "
        f"trial(s) = {len(runs)} trials of {camp.workload.duration} s; results under {root}",
        flush=True,
    )
    t0 = time.perf_counter()
    done = campaign_runner.CampaignRunner(camp, root, progress=phase_printer()).run()
    wall = time.perf_counter() - t0

    c = load_results(root / camp.name)
    exp = hazard.exposure(c)
    print(
        f"\n{'config':18s} {'point':22s} {'start s':>8s} {'load s':>7s} {'crashes':>7s} {'down s':>7s} "
        f"{'stop s':>7s} {'rows':>7s} {'answered':>8s}"
    )
    totals = {"start": 0.0, "load": 0.0, "down": 0.0, "stop": 0.0}
    for r in runs:
        m = json.loads((campaign_runner.run_dir(root, camp, r) / "manifest.json").read_text())
        e = exp[(exp["config"].astype(str) == r.config.name) & (exp["trial"] == r.trial)].iloc[0]
        start = m["t_load_start"] - m["t_start"]
        load = m["t_load_end"] - m["t_load_start"]
        stop = m["t_end"] - m["t_load_end"]
        down = e["duration_s"] - e["uptime_s"]
        for k, v in (("start", start), ("load", load), ("down", down), ("stop", stop)):
            totals[k] += v
        label = ", ".join(f"{k}={v}" for k, v in r.point.items())
        print(
            f"{r.config.name:18s} {label:22s} {start:8.1f} {load:7.1f} {int(e['crashes']):7d} {down:7.1f} "
            f"{stop:7.1f} {m['requests']:7d} {int(e['answered']):8d}"
        )
    crashes = int(exp["crashes"].sum())
    print(
        f"\nwall time {wall:.0f} s ({wall / 60:.1f} min) for {len(runs)} trials and {crashes} crashes: server "
        f"start-ups {totals['start']:.0f} s, load {totals['load']:.0f} s (of which the server was down "
        f"{totals['down']:.0f} s, restarting after its crashes), stops {totals['stop']:.0f} s, the rest "
        f"{wall - totals['start'] - totals['load'] - totals['stop']:.0f} s"
    )
    if crashes:
        print(f"down time per crash: {totals['down'] / crashes:.1f} s")

    t1 = time.perf_counter()
    fit = hazard.fit_hazard(c)
    t2 = time.perf_counter()
    res = report.write_report(root / camp.name)
    t3 = time.perf_counter()
    print(f"analysis: fit {t2 - t1:.2f} s, report {t3 - t2:.1f} s ({res.html})")
    for cfg in fit.configs:
        f = fit[cfg]
        k = f.counts
        print(
            f"{cfg}: {f.model}; p {f.p:.3g} [{f.p_lo:.3g}, {f.p_hi:.3g}] per poison event; "
            f"{int(k['crashes'])} crashes, {int(k['poison_events'])} poison events, "
            f"{int(k['reused_poison'])} reused poison requests of {int(k['poison_requests'])}; "
            f"{f.rates['per_hour']:.3g} crashes per hour of uptime"
        )
    footer()
    return 0 if all(r.status == campaign_runner.COMPLETED for r in done) else 1


if __name__ == "__main__":
    sys.exit(main())
