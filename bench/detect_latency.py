"""Crash-detection latency: the server dies at a known instant mid-load; how long until the campaign runner has
recorded the crash, and how many requests were left without an outcome row.

    .venv/bin/python bench/detect_latency.py [--quick] [--trials 5] [--engine-trials 0]

Two ways of dying, each through the campaign runner (a campaign file in a temp folder, crash policy ``stop``,
the realistic mix with 8 users):

- ``logged``: the stand-in server (tests/standin_server.py, target = "command") with ``--die-after-s 3``: 3 s
  after its first embedding request it prints the report's crash lines (drift warning, detokenizer assertion)
  and exits. The instant: the first embedding request's t_start + 3 s (the stand-in dies on the first request
  after that; under this load that is within milliseconds).
- ``sigkill``: the stand-in (or, with ``--engine-trials``, real vLLM 0.32.0) is SIGKILLed by this script,
  whole process group, at a known instant: 4 s after the trial manifest names Locust's process group. The
  group id is the one the runner recorded in the manifest (``server_pgids``): nothing is looked up by name.
  Nothing is logged: the process is just gone.

Per trial: detection latency = crashes.t_detected - the instant; rows lost = Locust's own request count (its
--json-file, manifest ``locust_requests``) - recorded request rows. Goals: <= 1 s, 0 rows lost.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PY, ROOT, campaign_toml, footer, header, load, phase_printer, ratio_line, trial_facts

GOAL_S = 1.0
DIE_AFTER_S = 3.0
KILL_AFTER_S = 4.0
STANDIN = f"{PY} {ROOT / 'tests' / 'standin_server.py'} --port {{port}}"


class Killer(threading.Thread):
    """SIGKILLs the server group of each trial of ``config_dir`` ``after`` s after Locust was launched."""

    def __init__(self, config_dir: Path, after: float):
        super().__init__(daemon=True)
        self.config_dir, self.after = config_dir, after
        self.kills: dict[str, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for m in sorted(self.config_dir.glob("t*/manifest.json")) if self.config_dir.is_dir() else []:
                trial = m.parent.name
                if trial in self.kills:
                    continue
                try:
                    manifest = json.loads(m.read_text())
                except (OSError, ValueError):
                    continue
                if (
                    manifest.get("status") != "running"
                    or not manifest.get("locust_pgids")
                    or not manifest.get("server_pgids")
                ):
                    continue
                seen = time.time()
                self.done.wait(self.after)
                pgid = manifest["server_pgids"][-1]  # the group the runner launched and recorded
                t_kill = time.time()
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.kills[trial] = t_kill
                print(f"  killed server group {pgid} of {trial} at +{t_kill - seen:.2f} s", flush=True)
            self.done.wait(0.02)


def measure(config_dir: Path, instants: dict[str, float] | None) -> list[dict]:
    out = []
    for t in sorted(config_dir.iterdir()):
        f = trial_facts(t)
        m, c, r = f["manifest"], f["first_crash"], f["requests"]
        if instants is None:
            emb = r[r["endpoint"] == "/v1/embeddings"]
            instant = float(emb["t_start"].min()) + DIE_AFTER_S if len(emb) else None
        else:
            instant = instants.get(t.name)
        answered = r[r["status"].notna()]
        last_answer = float((answered["t_start"] + answered["latency_ms"] / 1000).max()) if len(answered) else None
        lat = float(c["t_detected"]) - instant if c is not None and instant else None
        lost = (m.get("locust_requests") - m.get("requests")) if m.get("locust_requests") is not None else None
        out.append(
            {
                "trial": t.name,
                "latency": lat,
                "lost": lost,
                "rows": m.get("requests"),
                "locust": m.get("locust_requests"),
                "reason": c["reason"] if c is not None else None,
                "sig": c["signature"] if c is not None else None,
                "in_flight": int(c["in_flight"]) if c is not None and c["in_flight"] == c["in_flight"] else None,
                "last_answer": (last_answer - instant) if last_answer and instant else None,
                "load": load(),
            }
        )
    return out


def run(path: Path, results: Path, killer: Killer | None = None) -> Path:
    from mmchaos.harness.campaign import plan as campaign_plan
    from mmchaos.harness.campaign import runner as campaign_runner

    camp = campaign_plan.load(path)
    if killer:
        killer.start()
    try:
        campaign_runner.CampaignRunner(camp, results, progress=phase_printer()).run()
    finally:
        if killer:
            killer.done.set()
            killer.join(10)
    return results / camp.name / camp.configs[0].name


def show(name: str, rows: list[dict]) -> None:
    print(
        f"\n{name}: trial, detection latency (s), rows lost (Locust count - rows), rows, crash reason/signature, "
        "in flight, last answer relative to the instant (s)"
    )
    for x in rows:
        lat = "none" if x["latency"] is None else f"{x['latency']:.3f}"
        la = "-" if x["last_answer"] is None else f"{x['last_answer']:+.3f}"
        print(
            f"  {x['trial']}: {lat:>6s}  lost {x['lost']}  rows {x['rows']}  {x['reason']}/{x['sig']}  "
            f"in flight {x['in_flight']}  last answer {la}"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 trials of each stand-in scenario")
    p.add_argument("--trials", type=int, default=5, help="trials of each stand-in scenario")
    p.add_argument("--engine-trials", type=int, default=0, help="also SIGKILL real vLLM 0.32.0 this many times")
    p.add_argument("--users", type=int, default=8)
    a = p.parse_args()
    if a.quick:
        a.trials, a.engine_trials = 2, 0
    header("bench/detect_latency.py: crash-detection latency and rows lost")
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="mmchaos-bench-detect-") as tmp:
        tmp = Path(tmp)
        common = dict(trials=a.trials, target="command", command=STANDIN, users=a.users, duration=15)
        print(f"logged: stand-in exits {DIE_AFTER_S:.0f} s after its first embedding request ({a.trials} trials)")
        d = run(
            campaign_toml(
                tmp,
                "bench-detect-logged",
                configs=[{"name": "logged", "flags": ["--die-after-s", str(DIE_AFTER_S)]}],
                **common,
            ),
            tmp / "results",
        )
        results["logged (stand-in prints the crash lines, exits)"] = measure(d, None)

        print(f"sigkill: stand-in SIGKILLed {KILL_AFTER_S:.0f} s after Locust's launch ({a.trials} trials)")
        k = Killer(tmp / "results" / "bench-detect-kill" / "sigkill", KILL_AFTER_S)
        d = run(campaign_toml(tmp, "bench-detect-kill", configs=[{"name": "sigkill"}], **common), tmp / "results", k)
        results["sigkill (stand-in, no log line)"] = measure(d, k.kills)

        if a.engine_trials:
            print(
                f"sigkill: vLLM 0.32.0 SIGKILLed {KILL_AFTER_S:.0f} s after Locust's launch ({a.engine_trials} trials)"
            )
            k = Killer(tmp / "results" / "bench-detect-engine" / "vllm-sigkill", KILL_AFTER_S)
            d = run(
                campaign_toml(
                    tmp,
                    "bench-detect-engine",
                    trials=a.engine_trials,
                    users=a.users,
                    duration=20,
                    configs=[{"name": "vllm-sigkill", "engine": "0.32.0"}],
                ),
                tmp / "results",
                k,
            )
            results["sigkill (vLLM 0.32.0, no log line)"] = measure(d, k.kills)

    ok = True
    summary = []
    for name, rows in results.items():
        show(name, rows)
        lats = [x["latency"] for x in rows if x["latency"] is not None]
        lost = sum(x["lost"] or 0 for x in rows)
        unknown = sum(1 for x in rows if x["lost"] is None)
        missed = len(rows) - len(lats)
        med = statistics.median(lats) if lats else float("nan")
        summary.append((name, med, max(lats) if lats else float("nan"), lost, missed, unknown))
        ok &= bool(lats) and max(lats) <= GOAL_S and lost == 0 and not missed and not unknown
    print()
    for name, med, mx, lost, missed, unknown in summary:
        print(
            f"{name}: detection latency median {med:.3f} s, max {mx:.3f} s; rows lost {lost}"
            + (f"; {missed} trial(s) without a recorded crash" if missed else "")
            + (f"; {unknown} trial(s) without Locust's count" if unknown else "")
        )
        print("  " + ratio_line("max detection latency", mx, GOAL_S, "s"))
    footer()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
