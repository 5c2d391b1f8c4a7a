"""Time and requests to the first crash on the report's version (vLLM 0.30.0, default flags), and the
deterministic probe's request count.

    .venv/bin/python bench/first_crash.py [--quick] [--trials 10] [--probe-trials 3] [--duration 60]

Uses the campaign runner (harness/campaign/runner.py) with a campaign file written to a temp folder: target
``engine`` 0.30.0 with no extra flags, the realistic mix (locustfiles/embeddings.py, default options) with 8
users, crash policy ``stop`` (a trial ends at its first crash), ``--trials`` trials (one server start each,
~35-40 s). Per trial: time to first crash = crashes.t_detected - manifest t_load_start (Locust's start-up
included); requests to first crash = request rows with t_start < t_detected. A trial without a crash within
``--duration`` s is censored at that time. Then the probe (locustfiles/probes.py, sequence poison_reuse
only, 1 user): requests until the crash (rows up to the first one answered 5xx or not answered at all).
Goal: median time to first crash <= 10 s. Everything runs on 127.0.0.1; one vLLM server at a time; the
runner stops each server by its recorded process group.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import campaign_toml, footer, header, phase_printer, ratio_line, trial_facts

GOAL_S = 10.0
ENGINE = "0.30.0"
PROBE_LOCUSTFILE = '''"""probes.py with only the poison_reuse sequence (for bench/first_crash.py)."""
from locust import events

from mmchaos.locustfiles.probes import ProbeUser  # noqa: F401


@events.init_command_line_parser.add_listener
def _only_poison_reuse(parser):
    parser.set_defaults(probe_sequences="poison_reuse")
'''


def run_campaign(path: Path, results: Path):
    from mmchaos.harness.campaign import plan as campaign_plan
    from mmchaos.harness.campaign import runner as campaign_runner

    camp = campaign_plan.load(path)
    campaign_runner.CampaignRunner(camp, results, progress=phase_printer()).run()
    return results / camp.name / camp.configs[0].name


def trigger_index(requests) -> int | None:
    """1-based position of the first request answered 5xx or not answered (the one the server died on)."""
    bad = (requests["status"].fillna(0) >= 500) | requests["outcome"].isin(["connection_error", "timeout"])
    idx = np.flatnonzero(bad.to_numpy())
    return int(idx[0]) + 1 if len(idx) else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 mix trials and 1 probe trial")
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--probe-trials", type=int, default=3)
    p.add_argument("--duration", type=int, default=60, help="load per trial at most (s): censoring time")
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--keep", type=Path, help="write the campaigns here and keep them (default: a temp folder)")
    a = p.parse_args()
    if a.quick:
        a.trials, a.probe_trials = 2, 1
    header(f"bench/first_crash.py: time and requests to first crash, vLLM {ENGINE} default flags")
    with tempfile.TemporaryDirectory(prefix="mmchaos-bench-crash-") as tmp:
        tmp = a.keep or Path(tmp)
        tmp.mkdir(parents=True, exist_ok=True)
        print(f"realistic mix: {a.trials} trials, {a.users} users, up to {a.duration} s of load each", flush=True)
        mix = run_campaign(
            campaign_toml(
                tmp,
                "bench-first-crash",
                trials=a.trials,
                users=a.users,
                duration=a.duration,
                configs=[{"name": "v0.30-default", "engine": ENGINE}],
            ),
            tmp / "results",
        )
        rows = []
        for t in sorted(mix.iterdir()):
            f = trial_facts(t)
            m, c, r = f["manifest"], f["first_crash"], f["requests"]
            t0 = m.get("t_load_start")
            first_req = float(r["t_start"].min()) - t0 if len(r) and t0 else math.nan
            lost = m["locust_requests"] - m["requests"] if m.get("locust_requests") is not None else None
            if c is not None and t0:
                ttc = float(c["t_detected"]) - t0
                n = int((r["t_start"] < c["t_detected"]).sum())
                rows.append(
                    {
                        "trial": t.name,
                        "crashed": True,
                        "t": ttc,
                        "n": n,
                        "sig": c["signature"],
                        "first_req": first_req,
                        "lost": lost,
                    }
                )
            else:
                rows.append(
                    {
                        "trial": t.name,
                        "crashed": False,
                        "t": a.duration,
                        "n": len(r),
                        "sig": "-",
                        "first_req": first_req,
                        "status": m.get("status"),
                        "error": m.get("error"),
                        "lost": lost,
                    }
                )
        print()
        print(
            "trial   crashed  time to crash (s)  requests before  first request after load start (s)  "
            "rows lost  signature"
        )
        for x in rows:
            t_txt = f"{x['t']:8.2f}" if x["crashed"] else f"   >{x['t']:.0f}  "
            print(
                f"{x['trial']:7s} {'yes' if x['crashed'] else 'NO ':7s}  {t_txt:17s}  {x['n']:15d}  "
                f"{x['first_req']:34.2f}  {x['lost']!s:>9s}  {x['sig']}"
                + ("" if x["crashed"] else f"  ({x.get('status')}: {x.get('error')})")
            )

        print(f"\nprobe poison_reuse: {a.probe_trials} trial(s), 1 user", flush=True)
        (tmp / "probe_poison_reuse.py").write_text(PROBE_LOCUSTFILE)
        probe = run_campaign(
            campaign_toml(
                tmp,
                "bench-probe",
                trials=a.probe_trials,
                users=1,
                duration=30,
                locustfile=tmp / "probe_poison_reuse.py",
                configs=[{"name": "v0.30-default", "engine": ENGINE}],
            ),
            tmp / "results",
        )
        probes = []
        for t in sorted(probe.iterdir()):
            f = trial_facts(t)
            c, r, m = f["first_crash"], f["requests"], f["manifest"]
            steps = " -> ".join(
                f"{s}:{int(st) if st == st else o}"
                for s, st, o in zip(r["case"].head(4), r["status"].head(4), r["outcome"].head(4))
            )
            probes.append(
                {
                    "trial": t.name,
                    "crashed": c is not None,
                    "trigger": trigger_index(r),
                    "before": int((r["t_start"] < c["t_detected"]).sum()) if c is not None else len(r),
                    "t": float(c["t_detected"]) - f["manifest"]["t_load_start"] if c is not None else None,
                    "sig": c["signature"] if c is not None else "-",
                    "steps": steps,
                    "lost": m["locust_requests"] - m["requests"] if m.get("locust_requests") is not None else None,
                }
            )
        for x in probes:
            print(
                f"{x['trial']}: crashed {'yes' if x['crashed'] else 'NO'}; request that killed it: #{x['trigger']} "
                f"({x['steps']}); rows with t_start < t_detected: {x['before']}; "
                f"time to crash {x['t'] if x['t'] is None else round(x['t'], 2)} s; signature {x['sig']}; "
                f"rows lost (Locust's count - rows) {x['lost']}"
            )

    times = [x["t"] for x in rows]
    crashed = [x for x in rows if x["crashed"]]
    med = statistics.median(times)  # censored trials sit at the duration: the median is exact while < half are
    within = sum(1 for x in crashed if x["t"] <= GOAL_S)
    from mmchaos.analysis.intervals import bootstrap_quantiles, wilson_ci

    _, lo, hi, _ = bootstrap_quantiles(times, [0.5])
    share, s_lo, s_hi = wilson_ci(within, len(rows))
    q1, q3 = np.quantile(times, [0.25, 0.75])
    n_med = statistics.median(x["n"] for x in rows)
    print()
    print(f"mix: {len(crashed)}/{len(rows)} trials crashed within {a.duration} s of load")
    print(
        f"time to first crash (s): median {med:.2f} (95% bootstrap {lo[0]:.2f}-{hi[0]:.2f}), IQR {q1:.2f}-{q3:.2f}, "
        f"min {min(times):.2f}, max {max(times):.2f}"
        + ("" if len(crashed) == len(rows) else f" (censored trials counted as {a.duration} s)")
    )
    print(
        f"requests to first crash: median {n_med:.0f}, min {min(x['n'] for x in rows)}, max {max(x['n'] for x in rows)}"
    )
    print(
        f"share of trials crashing within {GOAL_S:.0f} s of load: {within}/{len(rows)} = {share:.2f} "
        f"(95% Wilson {s_lo:.2f}-{s_hi:.2f})"
    )
    print(
        f"Locust start-up inside that time (load start -> first request): median "
        f"{statistics.median(x['first_req'] for x in rows):.2f} s"
    )
    trig = [x["trigger"] for x in probes if x["trigger"]]
    print(
        f"probe poison_reuse: the crash came at request #{', #'.join(map(str, trig)) or '-'} of {len(probes)} trial(s)"
    )
    print(ratio_line("median time to first crash", med, GOAL_S, "s"))
    footer()
    return 0 if med <= GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
